"""The Retrieve pipeline: resolve index -> embed -> search (hybrid + identifiers) -> rerank ->
score (cosine, exact BM25, evidence score, order) -> rank -> verify against the SoR -> evidence
pack; then reindex requests and audit records.

Every stage here is blocking (ONNX, store, SoR); the gRPC servicer runs `retrieve` in a thread
pool. Domain failures raise typed `RagstreamError`s that the servicer maps to status codes.
"""

from __future__ import annotations

import threading
import time
from collections import OrderedDict
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from datetime import UTC, datetime
from typing import Protocol

from ragcore.embedders.base import Embedder
from ragcore.embedding_models import EmbeddingModels
from ragcore.errors import IndexNotFoundError, ManifestMismatchError, RagstreamError
from ragcore.publish import Publisher
from ragcore.sor.base import SystemOfRecord
from ragcore.sparse import Bm25Encoder
from ragcore.store.base import (
    CHUNK_ID,
    StoreFilter,
    VectorStore,
)
from ragcore.store.ids import point_id
from ragcore.store.registry import IndexRegistry, ResolvedIndex
from ragcore.tokenizers import load_token_counter
from ragcore.tracing import Tracing
from retrieval_api.audit import fingerprint_query, request_record, result_records
from retrieval_api.candidates import PAYLOAD_KEYS as CANDIDATE_KEYS
from retrieval_api.candidates import CalibrationMismatchError, CandidateSearch, finish
from retrieval_api.context import PAYLOAD_KEYS as CONTEXT_KEYS
from retrieval_api.context import ContextPlan, context_of, neighbour_ids, plan_context
from retrieval_api.evidence import PAYLOAD_KEYS as PACK_KEYS
from retrieval_api.evidence import (
    CalibrationInfo,
    IndexInfo,
    Verdict,
    build_pack,
    entities_to_verify,
    reindex_requests,
    result_chunks,
    verdicts_from_sor,
)
from retrieval_api.evidence_score import EvidenceCalibration
from retrieval_api.metrics import RetrieveMetrics
from retrieval_api.pipeline_settings import RetrievalConfig
from retrieval_api.query_cache import QueryVectorCache
from retrieval_api.ranking import PAYLOAD_KEYS as RANKING_KEYS
from retrieval_api.ranking import Ranking, ScoreKind, Thresholds, rank
from retrieval_api.validate import ValidatedRequest
from schemas.proto.ragstream.retrieval.v1 import retrieval_pb2 as pb


class DeadlineExceededError(RagstreamError):
    """The caller's deadline passed before the pipeline finished."""

    code = "DEADLINE_EXCEEDED"


class Reranker(Protocol):
    """Scores (query, passage) pairs; relevance probabilities in [0, 1]."""

    def score(self, query: str, passages: Sequence[str]) -> list[float]:
        """One score per passage, in order."""
        ...


_STATUS = {
    pb.RETRIEVAL_STATUS_SUCCESS: "SUCCESS",
    pb.RETRIEVAL_STATUS_NO_EVIDENCE: "NO_EVIDENCE",
    pb.RETRIEVAL_STATUS_FAILED: "FAILED",
    pb.RETRIEVAL_STATUS_IDENTIFIER_MATCH: "IDENTIFIER_MATCH",
}


class Retriever:
    """Runs one validated request through the pipeline (thread-safe)."""

    def __init__(
        self,
        *,
        config: RetrievalConfig,
        embedder: Embedder,
        sparse: Bm25Encoder,
        store: VectorStore,
        registry: IndexRegistry,
        sor: SystemOfRecord,
        metrics: RetrieveMetrics,
        publisher: Publisher | None = None,
        audit_topic: str = "ragstream.audit",
        reindex_topic: str = "ragstream.reindex-requests",
        audit_key: bytes | None = None,
        reranker: Reranker | None = None,
        attribute_fields: Sequence[str] = (),
        other_embedders: Sequence[Embedder] = (),
        clock: Callable[[], datetime] = lambda: datetime.now(UTC),
        tracing: Tracing | None = None,
    ) -> None:
        """`embedder` is the primary model; `other_embedders` (e.g. the next model during a
        model change) let versions built with them be searched too; `tracing` gives each stage
        a span (off by default)."""
        if config.rerank_enabled and reranker is None:
            raise RagstreamError("retrieval.rerank_enabled is set but no reranker is configured")
        self.config = config
        self._models = EmbeddingModels(embedder, other_embedders)
        self._query_vectors = QueryVectorCache(
            config.query_cache_entries, lambda outcome: metrics.query_cache_of(outcome).inc()
        )
        self._sparse = sparse
        self._store = store
        self._registry = registry
        self._sor = sor
        self._metrics = metrics
        self._publisher = publisher
        self._audit_topic = audit_topic
        self._reindex_topic = reindex_topic
        self._reindex_due = Cooldown(REINDEX_REQUEST_COOLDOWN_S, REINDEX_REQUEST_MEMO)
        self._audit_key = audit_key
        self._reranker = reranker if config.rerank_enabled else None
        self._attribute_fields = tuple(attribute_fields)
        self._clock = clock
        self.tracing = tracing or Tracing.off()
        self.search = CandidateSearch(
            config=config,
            encoder=sparse,
            store=store,
            registry=registry,
            rerank=self._reranker.score if self._reranker is not None else None,
        )

    @property
    def registry(self) -> IndexRegistry:
        """The index registry the pipeline resolves versions (and calibrations) in."""
        return self._registry

    @property
    def store(self) -> VectorStore:
        """The vector store the pipeline searches."""
        return self._store

    @property
    def reranks(self) -> bool:
        """A reranker runs (its score is an input of the evidence score)."""
        return self._reranker is not None

    def resolve(self, tenant: str, version: int | None) -> tuple[ResolvedIndex, Embedder]:
        """The index to search and the embedder its manifest names; INDEX_NOT_FOUND /
        MANIFEST_MISMATCH as typed errors. The active version is read per request, so a switch
        takes effect at once and each request sees one version only."""
        index = self._registry.lookup(tenant, version)
        return index, self._models.for_manifest(index.manifest, self._sparse.model_version)

    def check_models(self) -> None:
        """Raise ManifestMismatchError naming every tenant whose active index version was built
        with a model this server does not hold (it could only answer MANIFEST_MISMATCH there):
        part of the health check, so a server missing `RAGSTREAM_NEXT_EMBEDDER` after a model
        switch is NOT_SERVING instead of failing that tenant's requests."""
        missing = []
        for tenant in self._registry.list_tenants():
            try:
                index = self._registry.lookup(tenant, None)
            except IndexNotFoundError:
                continue  # no active version yet: nothing to serve
            try:
                self._models.for_manifest(index.manifest, self._sparse.model_version)
            except ManifestMismatchError:
                missing.append(f"{tenant} ({index.manifest.embedding_model_version})")
        if missing:
            raise ManifestMismatchError(
                f"no configured model can search the active index of {len(missing)} tenant(s): "
                f"{', '.join(missing[:10])}; this server holds "
                f"{', '.join(self._models.versions())} (set RAGSTREAM_EMBEDDER or "
                f"RAGSTREAM_NEXT_EMBEDDER)"
            )

    def calibration(self, index: ResolvedIndex) -> EvidenceCalibration:
        """The evidence calibration the index version is scored with (cached; the prior model
        over the index's own statistics when it was never calibrated)."""
        calibration = self.search.calibration(index)
        if self._reranker is not None and not calibration.uses_rerank:
            raise CalibrationMismatchError(
                f"{index.collection} was calibrated without the reranker this server runs: run "
                f"`ragstream calibrate --tenant {index.tenant}` with the reranker configured"
            )
        if self._reranker is None and calibration.uses_rerank:
            raise CalibrationMismatchError(
                f"{index.collection} was calibrated with a reranker this server does not run"
            )
        return calibration

    def thresholds(self, calibration: EvidenceCalibration, override: float | None) -> Thresholds:
        """The evidence thresholds of a request: configured, else the calibration's; the hard
        one replaced by the request's (validated) override."""
        t = calibration.thresholds
        return self.config.thresholds(
            ScoreKind.EVIDENCE, override, calibrated=Thresholds(t.hard, t.medium, t.high)
        )

    def retrieve(self, request: ValidatedRequest, deadline: float | None = None) -> pb.EvidencePack:
        """The evidence pack of one request; `deadline` is a `time.monotonic()` instant."""
        timings: dict[str, float] = {}
        started = time.perf_counter()
        requested_at = self._clock()
        stage = _Stages(timings, self._metrics, deadline, self.tracing)

        with stage("resolve"):
            index, embedder = self.resolve(request.tenant, request.index_version)
            calibration = self.calibration(index)
        with stage("embed"):
            query_vector = self._query_vectors.vector(
                request.tenant, embedder.spec.model_version, request.query, embedder.embed_query
            )
        with stage("search"):
            raw = self.search.gather(
                index.collection,
                request.query,
                query_vector,
                request.store_filter,
                limit=request.candidate_k,
                lexicon=calibration.lexicon,
                with_rerank=self._reranker is not None,
                fields=payload_fields(request.store_filter, self._attribute_fields),
            )
        self._metrics.candidates.observe(len(raw))
        if raw.counted_from_text:
            self._metrics.term_counts_text.inc(raw.counted_from_text)
        if len(raw) > raw.counted_from_text:
            self._metrics.term_counts_stored.inc(len(raw) - raw.counted_from_text)
        with stage("rank"):
            choice = self.search.choice(calibration)
            pool = finish(raw, calibration, choice)
            ranking = rank(
                pool.candidates(),
                store_filter=request.store_filter,
                top_k=request.top_k,
                thresholds=self.thresholds(calibration, request.min_similarity_override),
                score_kind=ScoreKind.EVIDENCE,
                dedup_per_entity=self.config.dedup_per_entity,
                order="fused",
                protect_identifiers=self.config.identifier_priority,
                order_by=choice.label,
                explanations_first=self.config.explanations_first,
                near_duplicate_similarity=(
                    self.config.near_duplicate_similarity
                    if self.config.near_duplicate_collapse
                    else None
                ),
                diversity_lambda=self.config.diversity_lambda if self.config.diversity else None,
                distinct_parts=self.config.distinct_document_parts,
                answering_chunks=self.config.answering_chunks,
                lead_by=self.config.passage_lead,
            )
        with stage("verify"):
            ids = entities_to_verify(ranking)
            states = self._sor.verify(request.tenant, ids) if ids else {}
            checked_at = self._clock()
            verdicts = verdicts_from_sor(ranking.to_verify, states)
        context: ContextPlan | None = None
        if request.max_context_tokens is not None:
            with stage("context"):
                context = self.context_plan(index, embedder, request, ranking, verdicts)
        with stage("evidence"):
            info = IndexInfo(
                name=index.collection,
                version=index.version,
                embedding_model_version=index.manifest.embedding_model_version,
            )
            pack = build_pack(
                request,
                info,
                ranking,
                verdicts,
                retrieved_at=checked_at,
                timings_ms=timings,
                attribute_fields=self._attribute_fields,
                calibration=CalibrationInfo(
                    source=calibration.source,
                    fingerprint=calibration.fingerprint,
                    fitted_at=calibration.fitted_at,
                ),
                lexical_details={
                    h.chunk_id: (s.lexical.normalized, s.lexical.coverage)
                    for h, s in zip(raw.hits, raw.signals, strict=True)
                },
                context=context,
            )
        # the evidence stage ends after the pack copied the timings: record it and the total
        pack.timings_ms["evidence"] = timings["evidence"]
        pack.timings_ms["total"] = (time.perf_counter() - started) * 1000
        pack.trace_id = self.tracing.current_trace_id()
        self._after(pack, request, requested_at)
        return pack

    def context_plan(
        self,
        index: ResolvedIndex,
        embedder: Embedder,
        request: ValidatedRequest,
        ranking: Ranking,
        verdicts: Mapping[str, Verdict],
    ) -> ContextPlan:
        """The token budget's plan for the results `build_pack` will return: their neighbouring
        chunks read in one batch, everything counted with the index's model tokenizer."""
        if request.max_context_tokens is None:
            raise ValueError("the request sets no max_context_tokens")
        leads = result_chunks(ranking, verdicts)
        wanted = sorted({n for c in leads for n in neighbour_ids(c.chunk_id) if n is not None})
        points = self._store.retrieve(
            index.collection,
            [point_id(request.tenant, c, index.version) for c in wanted],
            request.tenant,
            fields=[CHUNK_ID, *CONTEXT_KEYS],
        )
        neighbours = {str(p.payload.get(CHUNK_ID)): p.payload for p in points}
        counter = load_token_counter(embedder.spec.tokenizer)
        return plan_context(
            [
                (c.chunk_id, str(c.payload.get("text", "")), context_of(c, neighbours))
                for c in leads
            ],
            counter,
            request.max_context_tokens,
        )

    def _after(self, pack: pb.EvidencePack, request: ValidatedRequest, at: datetime) -> None:
        """Count, request reindexing of what the SoR check excluded, and audit."""
        self._metrics.requests_of(_STATUS[pack.status], "OK").inc()
        for item in pack.excluded:
            reason = pb.ExclusionReason.Name(item.reason).removeprefix("EXCLUSION_REASON_")
            self._metrics.excluded_of(reason.lower()).inc()
        stale = reindex_requests(pack)
        if self._publisher is None:
            return
        for entity_id, reason in stale:
            if not self._reindex_due.first(f"{request.tenant}:{entity_id}:{reason.value}"):
                # requested within the cooldown: its re-read is queued or changed nothing
                self._metrics.reindex_requests_suppressed.inc()
                continue
            self._metrics.reindex_requests.inc()
            self._publisher.publish(
                self._reindex_topic,
                f"{request.tenant}:{entity_id}",
                {
                    "tenant": request.tenant,
                    "entity_id": entity_id,
                    "reason": reason.value,
                    "request_id": request.request_id,
                    "index_name": pack.index_name,
                    "requested_at": at.isoformat(),
                },
                tenant=request.tenant,
            )
        self.audit(pack, request.query, at)

    def record_failure(self, pack: pb.EvidencePack, query: str, at: datetime, *, code: str) -> None:
        """Count and audit a request that failed before or during the pipeline; `code` is the
        gRPC status it ends with (go-grpc-prometheus spelling, e.g. `InvalidArgument`), which
        separates client errors from server failures in the metric."""
        pack.trace_id = self.tracing.current_trace_id()
        self._metrics.requests_of(_STATUS[pack.status], code).inc()
        self.audit(pack, query, at)

    def audit(self, pack: pb.EvidencePack, query: str, at: datetime) -> None:
        """One request record and one record per result (hashed query only)."""
        if self._publisher is None:
            return
        fingerprint = fingerprint_query(query, key=self._audit_key)
        record = request_record(pack, query=fingerprint, requested_at=at)
        self._publisher.publish(self._audit_topic, pack.request_id, record, tenant=pack.tenant)
        for row in result_records(pack, requested_at=at):
            self._publisher.publish(self._audit_topic, pack.request_id, row, tenant=pack.tenant)


#: The payload keys the pipeline reads of a candidate: the union of what each stage's module
#: declares beside the code that reads them (ranking: filter re-check, entity, text; the
#: candidates: text; verification and the pack: `evidence.PAYLOAD_KEYS`; the context budget).
#: Only these cross from the store (its host, with several server processes) per candidate;
#: `payload_fields` adds the request's filter fields and the attribute fields. A stage reading
#: a key its module does not declare fails tests/retrieval_api/test_payload_reads.py.
PAYLOAD_FIELDS: tuple[str, ...] = tuple(
    dict.fromkeys(
        (
            *RANKING_KEYS,
            *CANDIDATE_KEYS,
            *PACK_KEYS,
            *CONTEXT_KEYS,
        )
    )
)


def payload_fields(store_filter: StoreFilter, attribute_fields: Sequence[str]) -> list[str]:
    """The payload keys a request reads of its candidates: `PAYLOAD_FIELDS`, the attribute
    fields the pack carries and every field the request filters on (`ranking.matches_filter`
    checks each candidate's payload against the filter again)."""
    return list(
        dict.fromkeys(
            (
                *PAYLOAD_FIELDS,
                *attribute_fields,
                *store_filter.keywords,
                *store_filter.ranges,
            )
        )
    )


#: A stale hit is re-requested at most once per this many seconds per entity and reason: a
#: re-read that changed nothing (what the SoR holds is indexed; the check disagrees for another
#: reason) must not loop through the worker on every query (docs/decisions/change-ordering.md).
REINDEX_REQUEST_COOLDOWN_S = 300.0
#: The entities remembered for the cooldown (the oldest are forgotten first).
REINDEX_REQUEST_MEMO = 10_000


class Cooldown:
    """Remembers when a key was last let through; `first` is True at most once per `seconds`
    per key (at most `size` keys remembered, the oldest forgotten first)."""

    def __init__(
        self, seconds: float, size: int, clock: Callable[[], float] = time.monotonic
    ) -> None:
        self._seconds = seconds
        self._size = size
        self._clock = clock
        self._last: OrderedDict[str, float] = OrderedDict()
        self._lock = threading.Lock()

    def first(self, key: str) -> bool:
        """True when `key` was not let through within the cooldown (and lets it through)."""
        now = self._clock()
        with self._lock:
            last = self._last.get(key)
            if last is not None and now - last < self._seconds:
                return False
            self._last[key] = now
            self._last.move_to_end(key)
            while len(self._last) > self._size:
                self._last.popitem(last=False)
            return True


class _Stages:
    """Times named stages into `timings` (ms) and the stage histogram, each in a span of its
    own; enforces the deadline."""

    def __init__(
        self,
        timings: dict[str, float],
        metrics: RetrieveMetrics,
        deadline: float | None,
        tracing: Tracing,
    ) -> None:
        self._timings = timings
        self._metrics = metrics
        self._deadline = deadline
        self._tracing = tracing

    @contextmanager
    def __call__(self, name: str) -> Iterator[None]:
        if self._deadline is not None and time.monotonic() > self._deadline:
            raise DeadlineExceededError(f"deadline exceeded before stage {name!r}")
        started = time.perf_counter()
        cpu = time.thread_time()
        try:
            with self._tracing.span(f"retrieve.{name}"):
                yield
        finally:
            elapsed = time.perf_counter() - started
            self._timings[name] = elapsed * 1000
            self._metrics.stage_seconds_of(name).observe(elapsed)
            self._metrics.stage_cpu_seconds_of(name).inc(time.thread_time() - cpu)
