"""From scored candidates to the ordered results of a request (pure;
docs/decisions/retrieval-contract.md).

Thresholds apply to a *calibrated* score only: the evidence score (`retrieval_api.evidence_score`:
an estimate in [0, 1] that the chunk answers the query, fitted per index), or in the legacy
kinds the cosine or a reranker's score. The score that orders candidates (a fusion of the cosine
and exact BM25, or the evidence score itself, chosen per index) is never compared to a threshold:
an RRF value says where a hit ranked, not how relevant it is.

Steps, over candidates sorted by (matched query identifiers desc, order score desc, chunk_id asc,
point id asc):
1. re-check the request's filters on each payload (defence in depth; a tenant mismatch raises);
2. threshold on the final score -> BELOW_THRESHOLD: when no candidate reaches the hard threshold
   every candidate is below it (NO_EVIDENCE); when one does, others are kept down to the
   supporting floor (`Thresholds.floor`). A chunk that contains an identifier of the query (an
   error code, ticket or part number that occurs in the tenant's corpus) is never excluded as
   below threshold in favour of chunks without it, and it ranks before them;
3. the same chunk twice -> DUPLICATE; (when enabled) one passage per entity: the entity keeps
   its place in the order and its chunk with the most of the query's identifiers, then the
   best calibrated score, fills it; a further chunk is a result of its own when it cites another
   part of a document (page, DOCX section, row block) or reaches the hard threshold by itself,
   else DUPLICATE (`_passages`);
4. (when enabled) near-duplicates are collapsed: a survivor whose text is the same or nearly the
   same as a better one's (`ragcore.textsim`: the same ticket filed by many customers) is not a
   result of its own but one of that result's `similar` chunks (the pack lists them as
   `also_in`);
5. (when enabled) a diversity step (maximal marginal relevance, `diversity_lambda`) reorders the
   best survivors so the top k do not repeat one fact: each next result maximises
   λ · relevance - (1 - λ) · its highest text similarity to the results already chosen, within
   the identifier tiers (an identifier rule is never traded for diversity);
6. the first `top_k` survivors are the results; the rest stay in `reserve`, so the evidence stage
   can backfill when the SoR check excludes a result.

An answer above a mention: with `explanations_first`, among chunks holding the same number of
the query's identifiers, one that *explains* an identifier (it opens a line, list item, table
cell or heading, or is followed by `:`, `=` or "means": a definition, an error-code
table, a release note's fix) ranks before chunks that only repeat it (a ticket quoting the code).
"""

from __future__ import annotations

import math
import re
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from enum import StrEnum
from typing import Any, Literal, TypeVar

from ragcore.errors import StoreError
from ragcore.fusion import FusedHit
from ragcore.store.base import (
    CHUNK_ID,
    ENTITY_ID,
    ENTITY_TYPE,
    TENANT_ID,
    PayloadValue,
    Range,
    StoreFilter,
    datetime_bounds,
    numeric_bounds,
)
from ragcore.textsim import SIGNATURE_WORDS, Signature, payload_signature, similarity

#: The payload keys this module reads of a candidate (the filter re-check, the entity, the
#: words of near-duplicates, or their text); the request's own filter fields come on top
#: (`retriever.payload_fields`). Retrieve asks the store for these keys only: a key read here
#: and not declared would read as absent (tests/retrieval_api/test_payload_reads.py).
PAYLOAD_KEYS: tuple[str, ...] = (
    TENANT_ID,
    CHUNK_ID,
    ENTITY_TYPE,
    ENTITY_ID,
    "text",
    SIGNATURE_WORDS,
    "locator",  # a document's page, section or rows: distinct passages of one entity
)


class ScoreKind(StrEnum):
    """Which calibrated score is the final score."""

    COSINE = "cosine"
    RERANK = "rerank"
    EVIDENCE = "evidence"


class Confidence(StrEnum):
    """Soft-threshold class of the best result; NONE when there is no evidence."""

    HIGH = "high"
    MEDIUM = "medium"
    LOW = "low"
    NONE = "none"


class ExclusionReason(StrEnum):
    """Why a candidate is not in the evidence pack."""

    DELETED = "deleted"
    STALE = "stale"
    MISSING = "missing"
    FILTERED = "filtered"
    BELOW_THRESHOLD = "below_threshold"
    DUPLICATE = "duplicate"
    UNVERIFIABLE = "unverifiable"
    SOR_ROW_UNREADABLE = "sor_row_unreadable"


@dataclass(frozen=True, slots=True)
class Thresholds:
    """Hard threshold (a pack needs a chunk at or above it, else NO_EVIDENCE), soft ones
    (confidence classes) and `floor`: once some chunk reaches `hard`, further chunks are kept
    down to `floor` (supporting evidence: a second relevant document scores lower than the best
    one). `floor` None means `hard`: every chunk below `hard` is excluded."""

    hard: float
    medium: float
    high: float
    floor: float | None = None

    def __post_init__(self) -> None:
        for name in ("hard", "medium", "high"):
            if not math.isfinite(getattr(self, name)):
                raise ValueError(f"threshold {name} must be finite")
        if not self.hard <= self.medium <= self.high:
            raise ValueError(
                f"thresholds must satisfy hard <= medium <= high, got "
                f"{self.hard} / {self.medium} / {self.high}"
            )
        if self.floor is not None and not (math.isfinite(self.floor) and self.floor <= self.hard):
            raise ValueError(f"floor must be finite and <= hard, got {self.floor}")

    @property
    def supporting(self) -> float:
        """The cut for chunks after the pack has a chunk at or above `hard`."""
        return self.hard if self.floor is None else self.floor

    def classify(self, score: float) -> Confidence:
        """The confidence class of a final score."""
        if score >= self.high:
            return Confidence.HIGH
        if score >= self.medium:
            return Confidence.MEDIUM
        if score >= self.hard:
            return Confidence.LOW
        return Confidence.NONE


@dataclass(frozen=True, slots=True)
class Candidate:
    """A fused hit with its calibrated scores.

    `similarity` is the cosine similarity of query and chunk: the dense branch's score when that
    branch returned the hit, otherwise computed by the caller from the stored vector (see
    `calibrate`). `rerank` is the reranker's score when a reranker ran, `evidence` the evidence
    score, `lexical` the exact BM25 score. `identifiers` are the query's identifiers the chunk
    contains, `explained` those of them it explains (`explains`); `hit.score` is the score
    that orders candidates.
    """

    hit: FusedHit
    similarity: float
    rerank: float | None = None
    evidence: float | None = None
    lexical: float | None = None
    identifiers: tuple[str, ...] = ()
    explained: tuple[str, ...] = ()

    def __post_init__(self) -> None:
        for label, value in (
            ("similarity", self.similarity),
            ("rerank score", self.rerank),
            ("evidence score", self.evidence),
            ("lexical score", self.lexical),
        ):
            if value is not None and not math.isfinite(value):
                raise ValueError(f"candidate {self.hit.chunk_id}: {label} is not finite")

    @property
    def chunk_id(self) -> str:
        """The chunk id."""
        return self.hit.chunk_id

    @property
    def point_id(self) -> str:
        """The point id."""
        return self.hit.point_id

    @property
    def entity_id(self) -> str:
        """The source entity id (the chunk id when the payload lacks one)."""
        value = self.hit.payload.get(ENTITY_ID)
        return value if isinstance(value, str) and value else self.hit.chunk_id

    def final(self, kind: ScoreKind) -> float:
        """The score thresholds and order use."""
        if kind is ScoreKind.COSINE:
            return self.similarity
        if kind is ScoreKind.EVIDENCE:
            if self.evidence is None:
                raise ValueError(f"candidate {self.chunk_id} has no evidence score")
            return self.evidence
        if self.rerank is None:
            raise ValueError(f"candidate {self.chunk_id} has no rerank score")
        return self.rerank


def needs_similarity(fused: Sequence[FusedHit]) -> list[FusedHit]:
    """The hits only the sparse branch returned: their cosine must be computed by the caller."""
    return [hit for hit in fused if hit.dense_score is None]


def calibrate(
    fused: Sequence[FusedHit],
    *,
    similarity_for_sparse_only: Mapping[str, float] | None = None,
    rerank_scores: Mapping[str, float] | None = None,
) -> list[Candidate]:
    """Attach calibrated scores to fused hits (mappings are keyed by point id).

    A hit from the dense branch uses its dense score (cosine); a sparse-only hit must have an
    entry in `similarity_for_sparse_only` (cosine of the query vector and the stored vector;
    see `needs_similarity`), else ValueError: its fused score must never stand in for one.
    When `rerank_scores` is given, every hit must have one.
    """
    recomputed = similarity_for_sparse_only or {}
    out: list[Candidate] = []
    for hit in fused:
        similarity = hit.dense_score
        if similarity is None:
            similarity = recomputed.get(hit.point_id)
        if similarity is None:
            raise ValueError(
                f"hit {hit.chunk_id} (point {hit.point_id}) came from the sparse branch only: "
                "supply its cosine similarity in similarity_for_sparse_only"
            )
        rerank: float | None = None
        if rerank_scores is not None:
            if hit.point_id not in rerank_scores:
                raise ValueError(f"no rerank score for hit {hit.chunk_id} (point {hit.point_id})")
            rerank = float(rerank_scores[hit.point_id])
        out.append(Candidate(hit, float(similarity), rerank))
    return out


@dataclass(frozen=True, slots=True)
class RankedChunk:
    """A candidate that survived filters, threshold and dedup, with its final score;
    `similar` are the near-duplicates collapsed into it (best first)."""

    candidate: Candidate
    final: float
    similar: tuple[RankedChunk, ...] = ()

    @property
    def chunk_id(self) -> str:
        """The chunk id."""
        return self.candidate.chunk_id

    @property
    def entity_id(self) -> str:
        """The source entity id."""
        return self.candidate.entity_id

    @property
    def payload(self) -> Mapping[str, Any]:
        """The point's payload."""
        return self.candidate.hit.payload


@dataclass(frozen=True, slots=True)
class Excluded:
    """A candidate left out of the pack, and why."""

    chunk_id: str
    entity_id: str
    reason: ExclusionReason
    score: float


@dataclass(frozen=True, slots=True)
class RankingCounters:
    """What the ranking stage did, for the pack's debug counters and metrics."""

    candidates: int
    rejected_by_filter: int
    rejected_by_threshold: int
    deduplicated: int
    collapsed: int = 0


@dataclass(frozen=True, slots=True)
class Ranking:
    """The ordered outcome of ranking one request's candidates.

    `results` are the first `top_k` survivors, `reserve` the remaining survivors (same order),
    used to backfill results the SoR check excludes. Verify `survivors` in one batch.
    """

    results: tuple[RankedChunk, ...]
    reserve: tuple[RankedChunk, ...]
    excluded: tuple[Excluded, ...]
    counters: RankingCounters
    score_kind: ScoreKind
    thresholds: Thresholds
    top_k: int
    order_by: str = ""

    @property
    def survivors(self) -> tuple[RankedChunk, ...]:
        """Results then reserve, best first."""
        return self.results + self.reserve

    @property
    def to_verify(self) -> tuple[RankedChunk, ...]:
        """Every survivor and the near-duplicates collapsed into it: what the SoR checks."""
        return tuple(c for s in self.survivors for c in (s, *s.similar))

    @property
    def no_evidence(self) -> bool:
        """True when nothing survived: the request's status is NO_EVIDENCE."""
        return not self.results


def payload_datetime(value: object) -> datetime | None:
    """A payload's RFC 3339 datetime (e.g. `event_date`) as an aware datetime, else None."""
    if not isinstance(value, str):
        return None
    try:
        moment = datetime.fromisoformat(value)
    except ValueError:
        return None
    # The engines read a datetime without offset as UTC; so do we.
    return moment if moment.tzinfo is not None else moment.replace(tzinfo=UTC)


_C = TypeVar("_C", datetime, float)


def _within(point: _C, gte: _C | None, gt: _C | None, lte: _C | None, lt: _C | None) -> bool:
    return (
        (gte is None or point >= gte)
        and (gt is None or point > gt)
        and (lte is None or point <= lte)
        and (lt is None or point < lt)
    )


def _in_range(value: object, bounds: Range) -> bool:
    # A chunk without the field never satisfies a range (a NULL event_date is excluded).
    if bounds.is_datetime:
        moment = payload_datetime(value)
        return moment is not None and _within(moment, *datetime_bounds(bounds))
    if isinstance(value, int | float) and not isinstance(value, bool):
        return _within(float(value), *numeric_bounds(bounds))
    return False


def _keyword_match(value: object, allowed: tuple[PayloadValue, ...]) -> bool:
    # Type-exact: True == 1 in Python, but not to a keyword index.
    return any(type(value) is type(a) and value == a for a in allowed)


def matches_filter(payload: Mapping[str, Any], store_filter: StoreFilter) -> bool:
    """True when a payload satisfies every criterion of the filter.

    Raises StoreError when the payload belongs to another tenant: the store's own tenant filter
    was lost, and returning the chunk would leak data (docs/decisions/tenancy-and-access.md).
    """
    if payload.get(TENANT_ID) != store_filter.tenant_id:
        raise StoreError(
            f"tenant isolation violated: chunk {payload.get(CHUNK_ID)!r} is not tenant "
            f"{store_filter.tenant_id!r}"
        )
    if store_filter.entity_types and payload.get(ENTITY_TYPE) not in store_filter.entity_types:
        return False
    if store_filter.entity_ids and payload.get(ENTITY_ID) not in store_filter.entity_ids:
        return False
    for name, allowed in store_filter.keywords.items():
        if not _keyword_match(payload.get(name), allowed):
            return False
    return all(_in_range(payload.get(name), b) for name, b in store_filter.ranges.items())


#: Result orders: by the calibrated (final) score (`final`, or `evidence`), or by the hits'
#: ordering score (`fused`; `calibrated` is a fused order the index's calibration chose).
Order = Literal["final", "evidence", "fused", "calibrated"]


# Markup that may open a line before the word it is about: list bullets, quote and table
# bars, heading marks, numbered items, bold/code delimiters.
_LINE_LEAD = r"(?:^|\n)[ \t]*(?:(?:[-*+>|#]|[0-9]{1,3}[.)])[ \t]*)*(?:\*\*|__|`)?"
# A dash is left out: "migration guide v1 to v2 — 15 July" is prose, not a definition.
_DEFINES = r"(?:\*\*|__|`)?[ \t]*(?:[:=]|(?:means|indicates|stands for)\b)"


def explains(text: str, identifier: str) -> bool:
    """True when `text` explains `identifier` rather than only mentioning it: the identifier
    opens a line, list item, table cell or heading, sits in a heading, or is followed by `:`,
    `=` or "means" / "indicates" / "stands for" (case-insensitive)."""
    word = re.escape(identifier)
    end = r"(?![\w-])"
    pattern = (
        rf"{_LINE_LEAD}{word}{end}"
        rf"|(?:^|\n)[ \t]*#{{1,6}}[^\n]*(?<![\w-]){word}{end}"
        rf"|\|[ \t]*(?:\*\*|`)?{word}{end}"
        rf"|(?<![\w-]){word}{end}{_DEFINES}"
    )
    return re.search(pattern, text, flags=re.IGNORECASE) is not None


def rank(
    candidates: Sequence[Candidate],
    *,
    store_filter: StoreFilter,
    top_k: int,
    thresholds: Thresholds,
    score_kind: ScoreKind = ScoreKind.COSINE,
    dedup_per_entity: bool = True,
    order: Order = "final",
    protect_identifiers: bool = True,
    order_by: str = "",
    explanations_first: bool = False,
    near_duplicate_similarity: float | None = None,
    diversity_lambda: float | None = None,
    distinct_parts: bool = True,
    answering_chunks: bool = True,
    lead_by: Literal["evidence", "order"] = "evidence",
) -> Ranking:
    """Order, filter, threshold, dedup, collapse and diversify candidates; see the module
    docstring.

    `order="final"` (or `"evidence"`) sorts by the calibrated score; `order="fused"` (or
    `"calibrated"`) keeps the hits' ordering score (`hit.score` desc) so both channels shape the
    ranking, while thresholds and confidence still apply to the calibrated score; a reranker's
    score always orders. With `protect_identifiers`, chunks holding more of the query's
    identifiers come first and are never below threshold; with `explanations_first` too, among
    those holding as many, chunks that explain one come first. Ties break on chunk id, then
    point id. `near_duplicate_similarity` (a Jaccard cut of `ragcore.textsim`) collapses
    near-duplicates, None: never; `diversity_lambda` in [0, 1) turns the diversity step on
    (1 or None: off).
    """
    if top_k < 1:
        raise ValueError(f"top_k must be >= 1, got {top_k}")
    if diversity_lambda is not None and not 0.0 <= diversity_lambda <= 1.0:
        raise ValueError(f"diversity_lambda must be within [0, 1], got {diversity_lambda}")
    scored = [(c.final(score_kind), c) for c in candidates]
    by_hit = order in ("fused", "calibrated") and score_kind is not ScoreKind.RERANK

    def tier(cand: Candidate) -> tuple[int, int]:
        if not protect_identifiers:
            return (0, 0)
        return (-len(cand.identifiers), -len(cand.explained) if explanations_first else 0)

    def key(sc: tuple[float, Candidate]) -> tuple[int, int, float, str, str]:
        final, cand = sc
        return (*tier(cand), -(cand.hit.score if by_hit else final), cand.chunk_id, cand.point_id)

    scored.sort(key=key)

    excluded: list[tuple[int, Excluded]] = []  # with their place in the order
    seen_chunks: set[str] = set()
    filtered = below = duplicates = 0
    allowed = [matches_filter(cand.hit.payload, store_filter) for _, cand in scored]
    has_evidence = any(
        ok and (final >= thresholds.hard or (protect_identifiers and bool(cand.identifiers)))
        for ok, (final, cand) in zip(allowed, scored, strict=True)
    )
    cut = thresholds.supporting if has_evidence else thresholds.hard
    eligible: list[RankedChunk] = []
    at: list[int] = []  # the place of each eligible chunk in the order
    for n, (ok, (final, cand)) in enumerate(zip(allowed, scored, strict=True)):
        reason: ExclusionReason | None = None
        if not ok:
            reason, filtered = ExclusionReason.FILTERED, filtered + 1
        elif final < cut and not (protect_identifiers and cand.identifiers):
            reason, below = ExclusionReason.BELOW_THRESHOLD, below + 1
        elif cand.chunk_id in seen_chunks:
            reason, duplicates = ExclusionReason.DUPLICATE, duplicates + 1
        if reason is not None:
            excluded.append((n, Excluded(cand.chunk_id, cand.entity_id, reason, final)))
            continue
        seen_chunks.add(cand.chunk_id)
        eligible.append(RankedChunk(cand, final))
        at.append(n)

    # the place each survivor took: its own, or that of the chunk of its entity (or of its
    # near-duplicate group) it displaced; MMR reads the tier and relevance of the place, so
    # choosing the passage that answers never moves its entity
    place: dict[str, Candidate] = {}
    if dedup_per_entity:
        survivors, repeats = _passages(
            eligible,
            place,
            hard=thresholds.hard,
            distinct_parts=distinct_parts,
            answering_chunks=answering_chunks,
            identifiers_first=protect_identifiers,
            lead_by=lead_by,
        )
        duplicates += len(repeats)
        excluded += [
            (at[i], Excluded(r.chunk_id, r.entity_id, ExclusionReason.DUPLICATE, r.final))
            for i, r in repeats
        ]
        excluded.sort(key=lambda item: item[0])
    else:
        survivors = eligible

    collapsed = 0
    signatures: list[Signature] = []
    if near_duplicate_similarity is not None or diversity_lambda not in (None, 1.0):
        signatures = [payload_signature(s.payload) for s in survivors]
    if near_duplicate_similarity is not None:
        before = len(survivors)
        survivors, signatures = _collapse(survivors, signatures, near_duplicate_similarity, place)
        collapsed = before - len(survivors)
    if diversity_lambda is not None and diversity_lambda < 1.0:
        survivors = _diversify(
            survivors,
            signatures,
            lam=diversity_lambda,
            top_k=top_k,
            relevance=lambda r: _placed(r, place).hit.score if by_hit else r.final,
            tier=lambda r: tier(_placed(r, place)),
        )

    return Ranking(
        results=tuple(survivors[:top_k]),
        reserve=tuple(survivors[top_k:]),
        excluded=tuple(x for _, x in excluded),
        counters=RankingCounters(
            candidates=len(candidates),
            rejected_by_filter=filtered,
            rejected_by_threshold=below,
            deduplicated=duplicates,
            collapsed=collapsed,
        ),
        score_kind=score_kind,
        thresholds=thresholds,
        top_k=top_k,
        order_by=order_by,
    )


def _placed(chunk: RankedChunk, place: Mapping[str, Candidate]) -> Candidate:
    """The candidate whose place in the order `chunk` took (itself when it took none)."""
    return place.get(chunk.chunk_id, chunk.candidate)


def document_part(payload: Mapping[str, Any]) -> tuple[str, ...] | None:
    """The part of its document a chunk cites: the locator's `section_path` (file name, then
    the PDF page, the DOCX heading path, or the sheet and rows) when the locator names a
    document; None for a chunk of any other entity."""
    locator = payload.get("locator")
    if not isinstance(locator, Mapping) or not isinstance(locator.get("document"), str):
        return None
    path = locator.get("section_path")
    if not isinstance(path, list | tuple) or not path:
        return None
    return tuple(str(p) for p in path)


def _passages(
    eligible: list[RankedChunk],
    place: dict[str, Candidate],
    *,
    hard: float,
    distinct_parts: bool,
    answering_chunks: bool,
    identifiers_first: bool,
    lead_by: Literal["evidence", "order"] = "evidence",
) -> tuple[list[RankedChunk], list[tuple[int, RankedChunk]]]:
    """Per-entity dedup that keeps the passage which answers (best first, and the repeats).

    The entities keep their places in the order (`eligible`'s), but which of an entity's chunks
    fills its first place is decided by the chunks themselves: the one holding the most of the
    query's identifiers, then the best calibrated (evidence) score, not the best ordering score.
    A further chunk of the entity is a result of its own when it cites another part of a
    document (a page, a DOCX section, a block of rows; `distinct_parts`) or, with
    `answering_chunks`, when it reaches the hard threshold by itself; the others are repeats
    (DUPLICATE). The kept chunks of an entity fill its places best first: the entity's first
    place and the places of its other kept chunks. `place` records, per kept chunk, the
    candidate whose place it took; the repeats come with their index in `eligible`.
    `lead_by="order"` leads with the entity's first chunk in the
    order instead (dedup before issue 43; kept to measure against).
    """
    members: dict[str, list[int]] = {}
    for i, chunk in enumerate(eligible):
        members.setdefault(chunk.entity_id, []).append(i)
    slots: dict[int, RankedChunk] = {}
    repeats: list[tuple[int, RankedChunk]] = []

    def best(i: int) -> tuple[int, float, str, str]:
        if lead_by == "order":  # the entity's first chunk in the order (before issue 43)
            return (0, float(i), "", "")
        c = eligible[i]
        held = -len(c.candidate.identifiers) if identifiers_first else 0
        return (held, -c.final, c.chunk_id, c.candidate.point_id)

    for indexes in members.values():
        kept: list[int] = []
        parts: set[tuple[str, ...]] = set()
        for n, i in enumerate(sorted(indexes, key=best)):
            chunk = eligible[i]
            part = document_part(chunk.payload) if distinct_parts else None
            if n == 0 or (part is not None and part not in parts):
                keep = True
            else:
                keep = answering_chunks and part is None and chunk.final >= hard
            if keep:
                kept.append(i)
                if part is not None:
                    parts.add(part)
            else:
                repeats.append((i, chunk))
        # the lead takes the entity's first place; the others keep theirs
        taken = {indexes[0], *kept[1:]}
        if len(taken) < len(kept):  # the entity's first chunk is kept too: the lead's place
            taken.add(kept[0])
        for at, i in zip(sorted(taken), kept, strict=True):
            slots[at] = eligible[i]
            if at != i:
                place[eligible[i].chunk_id] = eligible[at].candidate
    repeats.sort(key=lambda r: r[0])
    return [slots[at] for at in sorted(slots)], repeats


def _collapse(
    survivors: list[RankedChunk],
    signatures: list[Signature],
    cut: float,
    place: dict[str, Candidate] | None = None,
) -> tuple[list[RankedChunk], list[Signature]]:
    """Fold each survivor into the best earlier one whose text it nearly repeats; of a group,
    the chunk with the best calibrated score leads it (in the group's place: `place` records
    whose), the others are its `similar` chunks in order."""
    keep: list[RankedChunk] = []
    kept: list[Signature] = []
    members: list[list[tuple[RankedChunk, Signature]]] = []
    for chunk, sig in zip(survivors, signatures, strict=True):
        n = len(sig)
        for i, other in enumerate(kept):
            m = len(other)
            # Jaccard >= cut needs the smaller set to hold >= cut of the larger: skip the rest
            # (the smaller of the two sizes against the larger, without sorting each pair)
            if (n >= cut * m if n <= m else m >= cut * n) and similarity(sig, other) >= cut:
                members[i].append((chunk, sig))
                break
        else:
            keep.append(chunk)
            kept.append(sig)
            members.append([])
    out: list[RankedChunk] = []
    lead_signatures: list[Signature] = []
    for first, sig, rest in zip(keep, kept, members, strict=True):
        if not rest:
            out.append(first)
            lead_signatures.append(sig)
            continue
        group = [(first, sig), *rest]
        lead = max(range(len(group)), key=lambda j: (group[j][0].final, -j))
        chunk, lead_sig = group[lead]
        if lead and place is not None:
            place[chunk.chunk_id] = _placed(first, place)
        others = tuple(c for j, (c, _) in enumerate(group) if j != lead)
        out.append(RankedChunk(chunk.candidate, chunk.final, others))
        lead_signatures.append(lead_sig)
    return out, lead_signatures


def _diversify(
    survivors: list[RankedChunk],
    signatures: list[Signature],
    *,
    lam: float,
    top_k: int,
    relevance: Callable[[RankedChunk], float],
    tier: Callable[[RankedChunk], tuple[int, int]],
) -> list[RankedChunk]:
    """Maximal marginal relevance over a window of the best survivors (2 x top_k): the first
    top_k places are chosen greedily, within the best remaining identifier tier; everything
    after keeps its order. Relevance is the ordering score over the window's best (min-max
    scaled when it can be negative); similarity that of `ragcore.textsim`."""
    window = min(len(survivors), 2 * top_k)
    if window < 2:
        return survivors
    pool = list(range(window))
    scores = [relevance(survivors[i]) for i in pool]
    low, high = min(scores), max(scores)
    if low >= 0 and high > 0:
        rel = [s / high for s in scores]  # a ratio keeps how close the scores are
    else:
        spread = high - low  # a score that can be negative (dbsf): min-max
        rel = [(s - low) / spread if spread > 0 else 1.0 for s in scores]
    redundancy = [0.0] * window
    tiers = [tier(survivors[i]) for i in range(window)]  # once, not twice a pass per place
    chosen: list[int] = []
    while pool and len(chosen) < top_k:
        best_tier = min(tiers[i] for i in pool)
        best = max(
            (i for i in pool if tiers[i] == best_tier),
            key=lambda i: (lam * rel[i] - (1 - lam) * redundancy[i], -i),
        )
        chosen.append(best)
        pool.remove(best)
        for i in pool:
            redundancy[i] = max(redundancy[i], similarity(signatures[i], signatures[best]))
    order = chosen + pool + list(range(window, len(survivors)))
    return [survivors[i] for i in order]
