"""Candidates of one query and every signal about them (the Retrieve pipeline's search stage).

1. *Search*: the dense and the sparse branch of the index (one hybrid round trip), and, for
   each identifier-like word of the query (`ragcore.sparse.is_identifier`), the chunks that
   contain it (a sparse search for that token alone), so a chunk holding the error code the
   question names is always a candidate.
2. *Pool*: the union of those hits. Every candidate gets the cosine of query and chunk (the
   dense branch's score; the sparse branch's hits carry the engine's cosine; the identifier
   searches' hits are read for their stored vector) and exact BM25 with the index's own
   statistics (`ragcore.sparse.Bm25Scorer`), so no candidate lacks a channel.
3. *Score* (`finish`): the evidence score of every candidate (`EvidenceCalibration.evidence`)
   and the score that orders them (a fusion of cosine and BM25 over the pool, or the evidence
   score: `RankingChoice`).

The calibration of an index version is read from the registry (`IndexRegistry.load_calibration`)
and kept for `calibration_reload_s` (an expired one keeps serving while one background thread
reloads it); a version that was never calibrated is scored with the
built-in prior model (`retrieval_api.prior`) over lexical statistics counted from the index
itself, and the pack says so (`calibration.source = "prior"`).
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Collection, Mapping, Sequence
from dataclasses import dataclass, replace
from typing import Any

import numpy as np
from numpy.typing import NDArray

from ragcore.errors import ManifestMismatchError, RagstreamError
from ragcore.fusion import FusedHit
from ragcore.sparse import (
    Bm25Encoder,
    Bm25Scorer,
    LexicalQuery,
    LexiconStats,
    TermCounts,
)
from ragcore.store.base import (
    CHUNK_ID,
    TERM_COUNTS,
    Placement,
    ScoredHit,
    SparseVector,
    StoreFilter,
    VectorStore,
)
from ragcore.store.registry import IndexRegistry, ResolvedIndex
from retrieval_api.evidence_score import (
    CalibrationError,
    EvidenceCalibration,
    RankingChoice,
    Signals,
)
from retrieval_api.pipeline_settings import RetrievalConfig
from retrieval_api.prior import prior_calibration
from retrieval_api.ranking import Candidate, explains

log = logging.getLogger(__name__)

#: The payload keys this module reads of a candidate (exact BM25 and identifier matches read
#: its stored term counts, or count its text); see `ranking.PAYLOAD_KEYS`.
PAYLOAD_KEYS: tuple[str, ...] = ("text", TERM_COUNTS)

#: A never-calibrated index's lexical statistics are recounted after this long.
PRIOR_LEXICON_TTL_S = 300.0


#: `settled` searches a branch again for at most this many times its limit to close a tie.
MAX_TIE_FETCH = 16


def settled(
    hits: Sequence[ScoredHit], limit: int, fetch: Callable[[int], Sequence[ScoredHit]]
) -> tuple[ScoredHit, ...]:
    """The best `limit` hits of a branch, ordered by score and then point id.

    The engine returns equal scores in its storage order, which depends on how the points were
    written and merged: two builds of the same index would cut a tie at the limit differently
    (chunks of one template tie exactly in BM25, copies of one text in cosine), and so pick
    other candidates, other evidence and another calibration. `hits` is the branch searched
    for `limit + 1`: while the hit past the cut ties with the last one kept, the branch is
    searched again for twice as many (up to `MAX_TIE_FETCH` x `limit`), so the whole tie is
    seen and cut by point id. Ties rarely straddle the cut; then it costs one search more."""
    if len(hits) > limit and hits[limit].score == hits[limit - 1].score:
        tie = hits[limit - 1].score
        want = len(hits)
        while len(hits) == want and hits[-1].score == tie and want < MAX_TIE_FETCH * limit:
            want = min(2 * want, MAX_TIE_FETCH * limit)
            hits = fetch(want)
    return tuple(sorted(hits, key=lambda h: (-h.score, h.point_id))[:limit])


def term_counts(encoder: Bm25Encoder, hits: Sequence[FusedHit]) -> tuple[list[TermCounts], int]:
    """Each hit's term counts (`payload_term_counts`), and how many were counted from their
    text."""
    out: list[TermCounts] = []
    from_text = 0
    for h in hits:
        counts, counted = payload_term_counts(encoder, h.payload)
        out.append(counts)
        from_text += counted
    return out, from_text


def payload_term_counts(
    encoder: Bm25Encoder, payload: Mapping[str, Any], *, cached: bool = True
) -> tuple[TermCounts, bool]:
    """A chunk's term counts as stored with it (`TERM_COUNTS`), else counted from its text
    (chunks written before the counts were stored, or by another tokenization; `cached`: through
    the encoder's cache), and whether they were counted. A stored value that cannot be read
    is logged and the text counted."""
    try:
        stored = encoder.read_counts(payload.get(TERM_COUNTS))
    except ValueError as exc:
        log.warning("chunk %s: stored term counts unreadable: %s", payload.get(CHUNK_ID), exc)
        stored = None
    if stored is not None:
        return stored, False
    value = payload.get("text")
    text = value if isinstance(value, str) else ""
    return (encoder.term_counts(text) if cached else encoder.count_terms(text)), True


class CalibrationMismatchError(ManifestMismatchError):
    """The index's calibration cannot score this pipeline (another reranker set-up, another
    feature set or sparse encoder): run `ragstream calibrate`."""

    code = "CALIBRATION_MISMATCH"


RerankFn = Callable[[str, Sequence[str]], list[float]]


@dataclass(frozen=True)
class RawPool:
    """The candidates of one query with their signals, before any model scored them."""

    query: LexicalQuery
    hits: tuple[FusedHit, ...]  # engine scores and ranks of each branch; score unset (0)
    signals: tuple[Signals, ...]
    #: hits whose term counts were counted from their text (none stored with the chunk)
    counted_from_text: int = 0

    def __len__(self) -> int:
        return len(self.hits)


@dataclass(frozen=True)
class Pool:
    """Scored candidates: evidence and ordering score of each (`hits[i].score`)."""

    raw: RawPool
    hits: tuple[FusedHit, ...]
    evidence: tuple[float, ...]
    choice: RankingChoice

    def candidates(self) -> list[Candidate]:
        """The ranking stage's input (with the query identifiers each chunk explains)."""
        return [
            Candidate(
                hit,
                signal.cosine,
                rerank=signal.rerank,
                evidence=evidence,
                lexical=signal.lexical.score,
                identifiers=signal.lexical.identifiers,
                explained=tuple(
                    t
                    for t in signal.lexical.identifiers
                    if explains(str(hit.payload.get("text", "")), t)
                ),
            )
            for hit, signal, evidence in zip(
                self.hits, self.raw.signals, self.evidence, strict=True
            )
        ]


def pool_evidence(raw: RawPool, calibration: EvidenceCalibration) -> list[float]:
    """The evidence score of every candidate of `raw`: the higher of its score among all the
    candidates and its score among the candidates of each channel that found it.

    Several features are relative to the pool (rank by BM25, gap to the best BM25 or cosine),
    so an answer only the dense branch found scored lower in the hybrid pool than in a
    dense-only pool, where the lexical channel's best match is not beside it: the hybrid
    default abstained on questions its own dense-only configuration answered (issue 26 item 5;
    docs/decisions/fusion-weights-from-held-out-evidence.md). Taking the higher score means a
    hybrid search never has less evidence for a candidate than the search of the channel that
    found it; the calibration chooses its threshold with this same score.
    """
    evidence = calibration.evidence(raw.query, raw.signals)
    for found in channel_pools(raw):
        alone = calibration.evidence(raw.query, [raw.signals[i] for i in found])
        for i, p in zip(found, alone, strict=True):
            evidence[i] = max(evidence[i], p)
    return evidence


def channel_pools(raw: RawPool) -> list[list[int]]:
    """The candidates (indexes into `raw`) of each channel whose pool `pool_evidence` scores
    apart: the dense and the sparse branch's, unless a channel found nothing or everything."""
    pools = (
        [i for i, h in enumerate(raw.hits) if h.dense_rank is not None],
        [i for i, h in enumerate(raw.hits) if h.sparse_rank is not None],
    )
    # a channel whose pool is the whole pool (or that found nothing) adds nothing
    return [found for found in pools if found and len(found) != len(raw.hits)]


def finish(raw: RawPool, calibration: EvidenceCalibration, choice: RankingChoice) -> Pool:
    """Evidence (`pool_evidence`) and ordering score of every candidate of `raw`."""
    evidence = pool_evidence(raw, calibration)
    order = choice.scores(
        [s.cosine for s in raw.signals], [s.lexical.score for s in raw.signals], evidence
    )
    hits = tuple(hit.with_score(score) for hit, score in zip(raw.hits, order, strict=True))
    return Pool(raw, hits, tuple(evidence), choice)


@dataclass
class _Cached:
    calibration: EvidenceCalibration
    loaded_at: float
    ttl: float


class CandidateSearch:
    """Searches an index version and scores its candidates (thread-safe)."""

    def __init__(
        self,
        *,
        config: RetrievalConfig,
        encoder: Bm25Encoder,
        store: VectorStore,
        registry: IndexRegistry,
        rerank: RerankFn | None = None,
        monotonic: Callable[[], float] = time.monotonic,
    ) -> None:
        """`rerank` scores (query, passages) when a reranker runs."""
        self.config = config
        self.encoder = encoder
        self._store = store
        self._registry = registry
        self._rerank = rerank
        self._monotonic = monotonic
        self._cache: dict[str, _Cached] = {}
        self._loading: dict[str, threading.Lock] = {}
        #: collections whose expired entry is being reloaded in the background
        self._refreshing: set[str] = set()
        #: bumped by `forget`: a load that began before it is not cached
        self._generation: dict[str, int] = {}
        self._lock = threading.Lock()

    # --- calibration ------------------------------------------------------------------------

    def calibration(self, index: ResolvedIndex) -> EvidenceCalibration:
        """The index version's calibration (cached), or the prior over its own statistics.

        One load per collection at a time: concurrent requests for a collection that has no
        entry wait for the one load in flight (the prior scans every chunk text of the index;
        a burst of cold requests each scanning it missed their deadlines). An expired entry
        is served while one background thread loads its successor: a request never waits for
        a reload (at 100k chunks the prior's rescan takes tens of seconds).
        """
        collection = index.collection
        with self._lock:
            cached = self._cache.get(collection)
            if cached is not None:
                if self._monotonic() - cached.loaded_at >= cached.ttl:
                    self._refresh_in_background(index)
                return cached.calibration
            loading = self._loading.setdefault(collection, threading.Lock())
        with loading:
            with self._lock:
                cached = self._cache.get(collection)  # loaded while this one waited
                generation = self._generation.get(collection, 0)
            if cached is not None:
                return cached.calibration
            now = self._monotonic()
            calibration, ttl = self._load(index)
            self._keep(collection, generation, _Cached(calibration, now, ttl))
            return calibration

    def warm(self, placements: Collection[Placement], stop: threading.Event) -> int:
        """Load the calibration of every tenant's active index version placed as one of
        `placements`, until `stop` is set, so its first request does not wait for the load (a
        never-calibrated index's prior counts all its texts); returns how many were loaded.
        An index that cannot be loaded is logged and left to its requests, which fail as they
        would have without this."""
        warmed = 0
        for tenant in self._registry.list_tenants():
            if stop.is_set():
                break
            try:
                if self._registry.active_version(tenant) is None:
                    continue
                index = self._registry.lookup(tenant, None)
                if index.manifest.placement not in placements:
                    continue
                self.calibration(index)
            except RagstreamError as exc:
                if stop.is_set():
                    break  # shutting down: the store may be closing under the scan
                log.warning(
                    "calibration of tenant %s not loaded ahead of its requests: [%s] %s",
                    tenant,
                    exc.code,
                    exc,
                )
                continue
            warmed += 1
        return warmed

    def _refresh_in_background(self, index: ResolvedIndex) -> None:
        """Start the one reload of an expired entry (the caller holds `_lock`)."""
        if index.collection in self._refreshing:
            return
        self._refreshing.add(index.collection)
        generation = self._generation.get(index.collection, 0)
        threading.Thread(
            target=self._refresh,
            args=(index, generation),
            name=f"calibration-{index.collection}",
            daemon=True,
        ).start()

    def _refresh(self, index: ResolvedIndex, generation: int) -> None:
        collection = index.collection
        try:
            now = self._monotonic()
            calibration, ttl = self._load(index)
        except RagstreamError as exc:
            # Dropped, not kept: the next request loads it in the foreground, and a calibration
            # that became unusable fails that request with its reason instead of hiding.
            log.warning("reloading the calibration of %s failed: %s", collection, exc)
            with self._lock:
                if self._generation.get(collection, 0) == generation:
                    self._cache.pop(collection, None)
        else:
            self._keep(collection, generation, _Cached(calibration, now, ttl))
        finally:
            with self._lock:
                self._refreshing.discard(collection)

    def _keep(self, collection: str, generation: int, entry: _Cached) -> None:
        """Cache `entry` unless the collection was forgotten since its load began (it would be
        older than what `forget` asked for)."""
        with self._lock:
            if self._generation.get(collection, 0) == generation:
                self._cache[collection] = entry

    def forget(self, collection: str) -> None:
        """Drop a cached calibration (e.g. right after `save_calibration`); a load in flight
        does not bring the old one back."""
        with self._lock:
            self._cache.pop(collection, None)
            self._generation[collection] = self._generation.get(collection, 0) + 1

    def _load(self, index: ResolvedIndex) -> tuple[EvidenceCalibration, float]:
        text = self._registry.load_calibration(index.tenant, index.version)
        if text is None:
            log.info(
                "%s was never calibrated: scoring with the prior model (run `ragstream "
                "calibrate --tenant %s`)",
                index.collection,
                index.tenant,
            )
            lexicon = self.lexicon(index.collection, index.tenant)
            return prior_calibration(lexicon), PRIOR_LEXICON_TTL_S
        try:
            calibration = EvidenceCalibration.from_json(text)
        except CalibrationError as exc:
            raise CalibrationMismatchError(
                f"calibration of {index.collection} is unusable: {exc}"
            ) from exc
        if calibration.lexicon.encoder_version != self.encoder.model_version:
            raise CalibrationMismatchError(
                f"calibration of {index.collection} counted its statistics with "
                f"{calibration.lexicon.encoder_version}, this server encodes with "
                f"{self.encoder.model_version}: run `ragstream calibrate`"
            )
        return calibration, self.config.calibration_reload_s

    def lexicon(self, collection: str, tenant: str) -> LexiconStats:
        """Count the lexical statistics of a collection's chunks (one scan of their stored
        term counts, or of the texts of chunks stored without them)."""
        points = self._store.scroll(
            collection,
            StoreFilter(tenant_id=tenant),
            batch=512,
            fields=["text", TERM_COUNTS, CHUNK_ID],
        )
        counts = (payload_term_counts(self.encoder, p.payload, cached=False)[0] for p in points)

        return LexiconStats.of_counts(counts, self.encoder)

    def choice(self, calibration: EvidenceCalibration) -> RankingChoice:
        """The result order the configuration asks for (`order`): `calibrated` is the order
        the index's own calibration chose, or the configured fusion for an index scored by
        the prior (whose order was chosen on another corpus)."""
        c = self.config
        if c.order == "calibrated":
            return calibration.ranking if calibration.source == "fitted" else self.fused_choice()
        if c.order in ("evidence", "final"):
            return RankingChoice(order="evidence")
        return self.fused_choice()

    def fused_choice(self) -> RankingChoice:
        """The configured fusion (`fusion_method`, `dense_weight`, `sparse_weight`, `rrf_k`)."""
        c = self.config
        return RankingChoice(
            order="fused",
            method=c.fusion_method,
            dense_weight=c.dense_weight,
            sparse_weight=c.sparse_weight,
            k=c.rrf_k,
        )

    # --- search -----------------------------------------------------------------------------

    def gather(
        self,
        collection: str,
        text: str,
        vector: NDArray[np.float32],
        store_filter: StoreFilter,
        *,
        limit: int,
        lexicon: LexiconStats,
        with_rerank: bool,
        fields: Sequence[str] | None = None,
    ) -> RawPool:
        """Search and measure every candidate (see the module docstring); `fields`: the payload
        keys the caller reads of the candidates (None: the whole payload)."""
        scorer = Bm25Scorer(self.encoder, lexicon)
        query = scorer.query(text)
        dense, sparse = self._search(collection, text, vector, store_filter, limit, fields=fields)
        extra = self._identifier_hits(collection, query, store_filter, limit, fields=fields)
        hits, cosines = self._pool(dense, sparse, extra)
        # the sparse branch's hits came with their cosine (computed by the engine, as the
        # dense branch's scores are): no read of their vectors
        for h in sparse:
            if h.dense_score is not None and h.point_id not in cosines:
                cosines[h.point_id] = h.dense_score
        missing = [h.point_id for h in hits if h.point_id not in cosines]
        if missing:
            tenant = store_filter.tenant_id
            # only the dense vectors are needed: the payload is already in the hits
            for point in self._store.retrieve(
                collection, missing, tenant, with_vectors=True, fields=(), sparse=False
            ):
                if point.dense is not None:
                    cosines[point.point_id] = float(np.dot(point.dense, vector))
            # a hit whose point is gone by the time its vector is read was deleted by a
            # concurrent write: it is no evidence any more (found by the live-reindex test)
            hits = [h for h in hits if h.point_id in cosines]
        counts, from_text = term_counts(self.encoder, hits)
        matches = scorer.match_counts(query, counts)
        found = {t for m in matches for t in m.identifiers}
        unknown = tuple(t for t in query.unknown_identifiers if t not in found)
        query = replace(query, unknown_identifiers=unknown)
        reranks: list[float | None] = [None] * len(hits)
        if with_rerank:
            if self._rerank is None:
                raise CalibrationMismatchError("a reranker score was asked for without one")
            texts = [str(h.payload.get("text", "")) for h in hits]
            reranks = list(self._rerank(text, texts)) if texts else []
        signals = tuple(
            Signals(cosines[h.point_id], m, r)
            for h, m, r in zip(hits, matches, reranks, strict=True)
        )
        return RawPool(query, tuple(hits), signals, counted_from_text=from_text)

    def _search(
        self,
        collection: str,
        text: str,
        vector: NDArray[np.float32],
        store_filter: StoreFilter,
        limit: int,
        *,
        fields: Sequence[str] | None,
    ) -> tuple[Sequence[ScoredHit], Sequence[ScoredHit]]:
        c = self.config
        store = self._store

        def dense_branch(k: int) -> Sequence[ScoredHit]:
            return store.search_dense(collection, vector, store_filter, limit=k, fields=fields)

        # one hit past the cut tells whether a tie straddles it (`settled`)
        if not c.hybrid:
            return settled(dense_branch(limit + 1), limit, dense_branch), ()
        encoded = self.encoder.encode_query(text)
        result = store.search_hybrid(
            collection,
            vector,
            encoded,
            store_filter,
            limit=limit + 1,
            prefetch_limit=limit + 1,
            sparse_dense_scores=True,
            fields=fields,
        )

        def sparse_branch(k: int) -> Sequence[ScoredHit]:
            return store.search_sparse(collection, encoded, store_filter, limit=k, fields=fields)

        # a zero-weight channel supplies no candidates (its score is still computed)
        dense = settled(result.dense, limit, dense_branch) if c.dense_weight > 0 else ()
        sparse = settled(result.sparse, limit, sparse_branch) if c.sparse_weight > 0 else ()
        return dense, sparse

    def _identifier_hits(
        self,
        collection: str,
        query: LexicalQuery,
        store_filter: StoreFilter,
        limit: int,
        *,
        fields: Sequence[str] | None,
    ) -> list[ScoredHit]:
        if not self.config.identifier_search:
            return []
        out: list[ScoredHit] = []
        for token in query.identifiers:
            vector = self.encoder.encode_tokens([token])

            def branch(k: int, vector: SparseVector = vector) -> Sequence[ScoredHit]:
                return self._store.search_sparse(
                    collection, vector, store_filter, limit=k, fields=fields
                )

            out.extend(settled(branch(limit + 1), limit, branch))
        return out

    @staticmethod
    def _pool(
        dense: Sequence[ScoredHit], sparse: Sequence[ScoredHit], extra: Sequence[ScoredHit]
    ) -> tuple[list[FusedHit], dict[str, float]]:
        """Union of the hits (first occurrence keeps its place) with engine scores and ranks."""
        d_rank: dict[str, tuple[int, ScoredHit]] = {}
        for rank, h in enumerate(dense, start=1):
            d_rank.setdefault(h.point_id, (rank, h))
        s_rank: dict[str, tuple[int, ScoredHit]] = {}
        for rank, h in enumerate(sparse, start=1):
            s_rank.setdefault(h.point_id, (rank, h))
        order: dict[str, ScoredHit] = {}
        for h in (*dense, *sparse, *extra):
            order.setdefault(h.point_id, h)
        hits: list[FusedHit] = []
        cosines: dict[str, float] = {}
        for pid, h in order.items():
            dr = d_rank.get(pid)
            sr = s_rank.get(pid)
            if dr is not None:
                cosines[pid] = float(dr[1].score)
            hits.append(
                FusedHit(
                    point_id=pid,
                    chunk_id=h.chunk_id,
                    score=0.0,
                    dense_score=float(dr[1].score) if dr else None,
                    dense_rank=dr[0] if dr else None,
                    sparse_score=float(sr[1].score) if sr else None,
                    sparse_rank=sr[0] if sr else None,
                    payload=h.payload,
                )
            )
        return hits, cosines
