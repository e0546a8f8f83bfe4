"""The evidence pack: ranked, SoR-verified results as the `EvidencePack` proto (pure).

The caller checks the ranking's survivors against the SoR in one batched query (the ids of
`entities_to_verify`); `verdicts_from_sor` turns the entity states into one `Verdict` per
chunk. Walking the survivors best first, OK chunks become results until `top_k` are found (of
a survivor and the near-duplicates collapsed into it, the best OK chunk is the result and the
other OK ones its `also_in`);
DELETED / STALE / MISSING ones are excluded with their reason (the caller publishes a reindex
request for each, see `reindex_requests`); UNVERIFIABLE ones (a table the reader cannot read)
and SOR_ROW_UNREADABLE ones (a row whose content cannot be judged) are excluded without one.
Results are never fabricated: with no OK chunk the status is NO_EVIDENCE. SUCCESS means some
result reaches the hard threshold; results that are there only because they hold an
identifier of the query (none reaching it) are IDENTIFIER_MATCH, with confidence NONE.

A pack with results always holds a chunk at or above the hard threshold (or one holding an
identifier of the query): when the SoR check leaves only supporting chunks (kept down to the
ranking's floor), they are excluded as below threshold and the status is NO_EVIDENCE.

Determinism: the pack depends only on its inputs (the clock is an input: `retrieved_at`), and
`serialize_pack` writes maps in key order, so identical inputs give identical bytes.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from enum import StrEnum
from typing import Any, Protocol

from google.protobuf.timestamp_pb2 import Timestamp

from ragcore.store.base import (
    ENTITY_ID,
    ENTITY_TYPE,
    EVENT_DATE,
    SOURCE_HASH,
    StoreFilter,
    datetime_bounds,
)
from ragcore.textsim import SIGNATURE_WORDS, Signature, payload_signature, similarity
from retrieval_api.context import BudgetAction, ContextPlan
from retrieval_api.ranking import (
    Confidence,
    Excluded,
    ExclusionReason,
    RankedChunk,
    Ranking,
    ScoreKind,
    payload_datetime,
)
from retrieval_api.validate import ValidatedRequest
from schemas.proto.ragstream.retrieval.v1 import retrieval_pb2 as pb

#: The payload keys this module reads of a chunk: verification (source hash), the result and
#: the excluded items of the pack (`_result`, `_locator`, `source_reference`, `_similar`); the
#: attribute fields come on top (`retriever.payload_fields`); see `ranking.PAYLOAD_KEYS`.
PAYLOAD_KEYS: tuple[str, ...] = (
    ENTITY_TYPE,
    ENTITY_ID,
    SOURCE_HASH,
    EVENT_DATE,
    "title",
    "text",
    SIGNATURE_WORDS,  # the near-duplicates' similarity to their result
    "locator",
    "chunk_index",
    "source_reference",
)


class Verdict(StrEnum):
    """Outcome of checking one chunk against the system of record."""

    OK = "ok"  # entity exists, not deleted, content hash equals the chunk's source hash
    DELETED = "deleted"
    STALE = "stale"
    MISSING = "missing"
    UNVERIFIABLE = "unverifiable"  # the SoR reader cannot read the entity's table
    UNREADABLE = "sor_row_unreadable"  # the entity's row is there but cannot be judged


class EntityState(Protocol):
    """What the SoR says about one entity (ragcore.sor.base.SorVerdict satisfies it)."""

    @property
    def exists(self) -> bool:
        """The tenant has a row with this id."""
        ...

    @property
    def deleted(self) -> bool:
        """The row is soft-deleted."""
        ...

    @property
    def content_hash(self) -> str | None:
        """The row's current content hash."""
        ...

    @property
    def mapped(self) -> bool:
        """The SoR reader can read the entity's table (else nothing is known of it)."""
        ...

    @property
    def row_error(self) -> str | None:
        """Why the entity's row cannot be judged (None: it can); validated by the reader."""
        ...


def entities_to_verify(ranking: Ranking) -> list[str]:
    """The entity ids of every survivor and of the near-duplicates collapsed into it, sorted
    and unique: one batched SoR query."""
    return sorted({chunk.entity_id for chunk in ranking.to_verify})


def verdicts_from_sor(
    chunks: Iterable[RankedChunk], states: Mapping[str, EntityState]
) -> dict[str, Verdict]:
    """chunk_id -> Verdict from the SoR's entity states (keyed by entity id).

    Entity of a table the SoR reader cannot read -> UNVERIFIABLE; absent or non-existent
    entity -> MISSING; soft-deleted -> DELETED; a row whose content cannot be judged ->
    UNREADABLE; content hash other than the chunk's source hash (or either one unknown) ->
    STALE; else OK.
    """
    verdicts: dict[str, Verdict] = {}
    for chunk in chunks:
        state = states.get(chunk.entity_id)
        source_hash = _str(chunk.payload, SOURCE_HASH).strip().lower()
        if state is not None and not state.mapped:
            verdicts[chunk.chunk_id] = Verdict.UNVERIFIABLE
        elif state is None or not state.exists:
            verdicts[chunk.chunk_id] = Verdict.MISSING
        elif state.deleted:
            verdicts[chunk.chunk_id] = Verdict.DELETED
        elif state.row_error is not None:
            verdicts[chunk.chunk_id] = Verdict.UNREADABLE
        elif not source_hash or (state.content_hash or "").strip().lower() != source_hash:
            verdicts[chunk.chunk_id] = Verdict.STALE
        else:
            verdicts[chunk.chunk_id] = Verdict.OK
    return verdicts


@dataclass(frozen=True, slots=True)
class CalibrationInfo:
    """Which evidence calibration scored the request (`EvidencePack.calibration`)."""

    source: str  # "fitted" or "prior"
    fingerprint: str
    fitted_at: datetime


@dataclass(frozen=True, slots=True)
class IndexInfo:
    """The resolved index version and its manifest's identity."""

    name: str
    version: int
    embedding_model_version: str
    similarity_metric: str = "cosine"


_REASONS: Mapping[ExclusionReason, pb.ExclusionReason.ValueType] = {
    ExclusionReason.DELETED: pb.EXCLUSION_REASON_DELETED,
    ExclusionReason.STALE: pb.EXCLUSION_REASON_STALE,
    ExclusionReason.MISSING: pb.EXCLUSION_REASON_MISSING,
    ExclusionReason.FILTERED: pb.EXCLUSION_REASON_FILTERED,
    ExclusionReason.BELOW_THRESHOLD: pb.EXCLUSION_REASON_BELOW_THRESHOLD,
    ExclusionReason.DUPLICATE: pb.EXCLUSION_REASON_DUPLICATE,
    ExclusionReason.UNVERIFIABLE: pb.EXCLUSION_REASON_UNVERIFIABLE,
    ExclusionReason.SOR_ROW_UNREADABLE: pb.EXCLUSION_REASON_SOR_ROW_UNREADABLE,
}
_CONFIDENCE: Mapping[Confidence, pb.Confidence.ValueType] = {
    Confidence.HIGH: pb.CONFIDENCE_HIGH,
    Confidence.MEDIUM: pb.CONFIDENCE_MEDIUM,
    Confidence.LOW: pb.CONFIDENCE_LOW,
    Confidence.NONE: pb.CONFIDENCE_NONE,
}
_SCORE_KIND: Mapping[ScoreKind, pb.ScoreKind.ValueType] = {
    ScoreKind.COSINE: pb.SCORE_KIND_COSINE,
    ScoreKind.RERANK: pb.SCORE_KIND_RERANK,
    ScoreKind.EVIDENCE: pb.SCORE_KIND_EVIDENCE,
}
_BUDGET_ACTIONS: Mapping[BudgetAction, pb.BudgetAction.ValueType] = {
    BudgetAction.TEXT_TRUNCATED: pb.BUDGET_ACTION_TEXT_TRUNCATED,
    BudgetAction.RESULT_DROPPED: pb.BUDGET_ACTION_RESULT_DROPPED,
    BudgetAction.CONTEXT_TRUNCATED: pb.BUDGET_ACTION_CONTEXT_TRUNCATED,
    BudgetAction.CONTEXT_DROPPED: pb.BUDGET_ACTION_CONTEXT_DROPPED,
}
_VERDICT_REASON: Mapping[Verdict, ExclusionReason] = {
    Verdict.DELETED: ExclusionReason.DELETED,
    Verdict.STALE: ExclusionReason.STALE,
    Verdict.MISSING: ExclusionReason.MISSING,
    Verdict.UNVERIFIABLE: ExclusionReason.UNVERIFIABLE,
    Verdict.UNREADABLE: ExclusionReason.SOR_ROW_UNREADABLE,
}
#: Exclusions the worker can heal by re-reading the entity from the SoR.
_REINDEXABLE = frozenset({ExclusionReason.DELETED, ExclusionReason.STALE, ExclusionReason.MISSING})
_REASON_OF: Mapping[pb.ExclusionReason.ValueType, ExclusionReason] = {
    v: k for k, v in _REASONS.items()
}


_EPOCH = datetime(1970, 1, 1, tzinfo=UTC)


def _timestamp(moment: datetime) -> Timestamp:
    if moment.utcoffset() is None:
        raise ValueError(f"datetime {moment!r} has no timezone")
    # what `Timestamp.FromDatetime` computes (whole seconds since the epoch in UTC, the
    # microseconds as nanos), in integers: its `utctimetuple` + `timegm` cost ~6 us a call
    # and a pack has one per result
    since = moment - _EPOCH
    return Timestamp(seconds=since.days * 86_400 + since.seconds, nanos=since.microseconds * 1_000)


def _str(payload: Mapping[str, Any], key: str) -> str:
    value = payload.get(key)
    return value if isinstance(value, str) else ""


def _count(value: object) -> int:
    # Offsets and indexes from the payload; anything else (absent, negative, bool) reads as 0.
    return value if isinstance(value, int) and not isinstance(value, bool) and value >= 0 else 0


def _attribute(value: object) -> str | None:
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, str | int):
        return str(value)
    return None


def source_reference(payload: Mapping[str, Any], tenant: str) -> str:
    """Where the chunk's entity lives: the payload's `source_reference`, else a `sor://` URI."""
    explicit = payload.get("source_reference")
    if isinstance(explicit, str) and explicit:
        return explicit
    return f"sor://{tenant}/{_str(payload, ENTITY_TYPE)}/{_str(payload, ENTITY_ID)}"


def _locator(payload: Mapping[str, Any]) -> pb.Locator:
    raw = payload.get("locator")
    data: Mapping[str, Any] = raw if isinstance(raw, Mapping) else {}
    locator = pb.Locator(
        chunk_index=_count(data.get("chunk_index", payload.get("chunk_index"))),
        char_start=_count(data.get("char_start")),
        char_end=_count(data.get("char_end")),
        section_path=[s for s in data.get("section_path") or () if isinstance(s, str)],
    )
    extracted_from = data.get("extracted_from")
    if isinstance(extracted_from, str):
        locator.extracted_from = extracted_from
    return locator


def _scores(chunk: RankedChunk) -> pb.Scores:
    cand = chunk.candidate
    hit = cand.hit
    scores = pb.Scores(
        fused=hit.score, order=hit.score, final=chunk.final, similarity=cand.similarity
    )
    if cand.evidence is not None:
        scores.evidence = cand.evidence
    if cand.lexical is not None:
        scores.lexical = cand.lexical
    if hit.dense_score is not None:
        scores.dense = hit.dense_score
    if hit.sparse_score is not None:
        scores.sparse = hit.sparse_score
    if cand.rerank is not None:
        scores.rerank = cand.rerank
    if hit.dense_rank is not None:
        scores.dense_rank = hit.dense_rank
    if hit.sparse_rank is not None:
        scores.sparse_rank = hit.sparse_rank
    return scores


def _result(
    rank: int, chunk: RankedChunk, tenant: str, attribute_fields: Sequence[str]
) -> pb.Result:
    payload = chunk.payload
    result = pb.Result(
        rank=rank,
        chunk_id=chunk.chunk_id,
        scores=_scores(chunk),
        entity_id=chunk.entity_id,
        entity_type=_str(payload, ENTITY_TYPE),
        title=_str(payload, "title"),
        text=_str(payload, "text"),
        locator=_locator(payload),
        source_hash=_str(payload, SOURCE_HASH),
        source_reference=source_reference(payload, tenant),
        matched_identifiers=list(chunk.candidate.identifiers),
    )
    event_date = payload_datetime(payload.get(EVENT_DATE))
    if event_date is not None:
        result.event_date.CopyFrom(_timestamp(event_date))
    for name in sorted(attribute_fields):
        value = _attribute(payload.get(name))
        if value is not None:
            result.attributes[name] = value
    return result


def _source(result: pb.Result, retrieved_at: Timestamp) -> pb.SourceRef:
    return pb.SourceRef(
        entity_id=result.entity_id,
        entity_type=result.entity_type,
        source_hash=result.source_hash,
        locator=result.locator,
        retrieved_at=retrieved_at,
        scores=result.scores,
        chunk_id=result.chunk_id,
        source_reference=result.source_reference,
    )


def filters_message(store_filter: StoreFilter) -> pb.Filters:
    """The filters a store query applied (the tenant is reported separately)."""
    message = pb.Filters(
        entity_types=list(store_filter.entity_types),
        entity_ids=list(store_filter.entity_ids),
    )
    for name in sorted(store_filter.keywords):
        values = [_attribute(v) for v in store_filter.keywords[name]]
        message.keywords[name].values.extend(v for v in values if v is not None)
    bounds = store_filter.ranges.get(EVENT_DATE)
    if bounds is not None:
        gte, gt, lte, lt = datetime_bounds(bounds)
        start, end = gte or gt, lte or lt
        if start is not None:
            message.event_date_start.CopyFrom(_timestamp(start))
        if end is not None:
            message.event_date_end.CopyFrom(_timestamp(end))
    return message


def _exclusion(item: Excluded) -> pb.Exclusion:
    return pb.Exclusion(
        chunk_id=item.chunk_id,
        entity_id=item.entity_id,
        reason=_REASONS[item.reason],
        score=item.score,
    )


def _set_timings(pack: pb.EvidencePack, timings_ms: Mapping[str, float]) -> None:
    for stage in sorted(timings_ms):
        value = float(timings_ms[stage])
        if not math.isfinite(value) or value < 0:
            raise ValueError(f"timing {stage!r} must be a finite number >= 0, got {value!r}")
        pack.timings_ms[stage] = value


@dataclass
class _Walk:
    """The survivors in rank order after the SoR check: per result (up to top_k) its verified
    chunks (the result first, then its verified near-duplicates), the chunks the check
    excluded, counts per exclusion reason, and how many verdicts were read."""

    groups: list[list[RankedChunk]] = field(default_factory=list)
    excluded: list[Excluded] = field(default_factory=list)
    verification: dict[ExclusionReason, int] = field(
        default_factory=lambda: dict.fromkeys(_VERDICT_REASON.values(), 0)
    )
    verified: int = 0


def _verify_walk(ranking: Ranking, verdicts: Mapping[str, Verdict]) -> _Walk:
    """Walk the survivors in order until top_k pass the SoR check; a chunk without a verdict
    raises ValueError (an unchecked chunk must never be returned)."""
    walk = _Walk()
    for survivor in ranking.survivors:
        if len(walk.groups) == ranking.top_k:
            break
        verified: list[RankedChunk] = []
        for chunk in (survivor, *survivor.similar):
            verdict = verdicts.get(chunk.chunk_id)
            if verdict is None:
                raise ValueError(f"no SoR verdict for chunk {chunk.chunk_id!r}")
            walk.verified += 1
            if verdict is Verdict.OK:
                verified.append(chunk)
                continue
            reason = _VERDICT_REASON[verdict]
            walk.verification[reason] += 1
            walk.excluded.append(Excluded(chunk.chunk_id, chunk.entity_id, reason, chunk.final))
        if verified:
            # the best verified chunk of a near-duplicate group is the result
            walk.groups.append(verified)
    return walk


def result_chunks(ranking: Ranking, verdicts: Mapping[str, Verdict]) -> list[RankedChunk]:
    """The chunks `build_pack` will return as results, in order (before a token budget):
    what the context stage fetches neighbours for and counts."""
    return [group[0] for group in _verify_walk(ranking, verdicts).groups]


def _results(
    walk: _Walk,
    tenant: str,
    attribute_fields: Sequence[str],
    lexical_details: Mapping[str, tuple[float, float]] | None,
) -> list[pb.Result]:
    results: list[pb.Result] = []
    for lead, *others in walk.groups:
        result = _result(len(results) + 1, lead, tenant, attribute_fields)
        detail = (lexical_details or {}).get(lead.chunk_id)
        if detail is not None:
            result.scores.lexical_normalized, result.scores.coverage = detail
        if others:
            lead_signature = payload_signature(lead.payload)
            result.also_in.extend(_similar(c, lead_signature, tenant) for c in others)
        results.append(result)
    return results


def _fit(results: list[pb.Result], plan: ContextPlan) -> list[pb.Result]:
    """Apply the token budget's decisions: drop, cut texts, attach contexts, renumber."""
    kept: list[pb.Result] = []
    for result in results:
        placed = plan.placed.get(result.chunk_id)
        if placed is None:
            continue
        result.rank = len(kept) + 1
        result.text = placed.text
        result.text_tokens = placed.text_tokens
        result.context.CopyFrom(
            pb.Context(
                before=placed.context.before,
                after=placed.context.after,
                chunk_ids=list(placed.context.chunk_ids),
                tokens=placed.context_tokens,
                truncated=placed.context_truncated,
            )
        )
        kept.append(result)
    return kept


def _budget(plan: ContextPlan) -> pb.ContextBudget:
    return pb.ContextBudget(
        max_context_tokens=plan.max_tokens,
        token_budget_used=plan.used,
        tokenizer=plan.tokenizer,
        cuts=[
            pb.BudgetCut(
                chunk_id=c.chunk_id,
                action=_BUDGET_ACTIONS[c.action],
                tokens_before=c.tokens_before,
                tokens_after=c.tokens_after,
            )
            for c in plan.cuts
        ],
    )


def _similar(chunk: RankedChunk, lead: Signature, tenant: str) -> pb.SimilarChunk:
    return pb.SimilarChunk(
        chunk_id=chunk.chunk_id,
        entity_id=chunk.entity_id,
        entity_type=_str(chunk.payload, ENTITY_TYPE),
        source_reference=source_reference(chunk.payload, tenant),
        similarity=similarity(lead, payload_signature(chunk.payload)),
    )


def build_pack(
    request: ValidatedRequest,
    index: IndexInfo,
    ranking: Ranking,
    verdicts: Mapping[str, Verdict],
    *,
    retrieved_at: datetime,
    timings_ms: Mapping[str, float],
    candidate_k: int | None = None,
    attribute_fields: Sequence[str] = (),
    calibration: CalibrationInfo | None = None,
    lexical_details: Mapping[str, tuple[float, float]] | None = None,
    context: ContextPlan | None = None,
) -> pb.EvidencePack:
    """Assemble the pack of a search that ran (status SUCCESS or NO_EVIDENCE).

    `verdicts` maps chunk_id -> Verdict for (at least) every survivor the walk reaches; a
    missing verdict raises ValueError, since an unchecked chunk must never be returned.
    `retrieved_at` is when the SoR was read; `candidate_k` defaults to the request's (pass
    what was actually asked of the store if it differs). `attribute_fields` are the payload
    fields copied into `Result.attributes` (e.g. the configured keyword filter fields).
    `calibration` names the evidence calibration that scored the candidates; `lexical_details`
    maps chunk_id -> (normalised BM25, coverage) for the results' scores. `context` is the
    token budget's plan (`retrieval_api.context.plan_context` over `result_chunks`): results it
    dropped are left out, texts it cut are cut, each result carries its context and the pack
    its `context_budget`.
    """
    checked_at = _timestamp(retrieved_at)
    walk = _verify_walk(ranking, verdicts)
    results = _results(walk, request.tenant, attribute_fields, lexical_details)
    if context is not None:
        results = _fit(results, context)
    excluded = [_exclusion(item) for item in [*ranking.excluded, *walk.excluded]]
    if results and not any(
        r.scores.final >= ranking.thresholds.hard or r.matched_identifiers for r in results
    ):
        # only supporting chunks survived the SoR check: no chunk carries the evidence
        excluded += [
            _exclusion(
                Excluded(r.chunk_id, r.entity_id, ExclusionReason.BELOW_THRESHOLD, r.scores.final)
            )
            for r in results
        ]
        results = []
    verification = walk.verification
    verified = walk.verified
    status = pack_status([r.scores.final for r in results], ranking.thresholds.hard)
    # the class of the best score among the results: the first result may be an identifier's
    # chunk under the threshold ranked above the one that answers (SUCCESS is never NONE)
    confidence = (
        ranking.thresholds.classify(max(r.scores.final for r in results))
        if results
        else Confidence.NONE
    )
    pack = pb.EvidencePack(
        request_id=request.request_id,
        status=status,
        tenant=request.tenant,
        index_name=index.name,
        index_version=index.version,
        embedding_model_version=index.embedding_model_version,
        similarity_metric=index.similarity_metric,
        filters_applied=filters_message(request.store_filter),
        top_k_requested=request.top_k,
        results_returned=len(results),
        score_kind=_SCORE_KIND[ranking.score_kind],
        min_score=ranking.thresholds.hard,
        confidence=_CONFIDENCE[confidence],
        order_by=ranking.order_by,
        results=results,
        sources=[_source(r, checked_at) for r in results],
        excluded=excluded,
        debug=pb.DebugCounters(
            candidate_k=request.candidate_k if candidate_k is None else candidate_k,
            candidates_returned=ranking.counters.candidates,
            rejected_by_filter=ranking.counters.rejected_by_filter,
            rejected_by_threshold=ranking.counters.rejected_by_threshold,
            excluded_stale=verification[ExclusionReason.STALE],
            excluded_deleted=verification[ExclusionReason.DELETED],
            excluded_missing=verification[ExclusionReason.MISSING],
            deduplicated=ranking.counters.deduplicated,
            verified=verified,
            collapsed=ranking.counters.collapsed,
        ),
    )
    if calibration is not None:
        pack.calibration.CopyFrom(
            pb.Calibration(
                source=calibration.source,
                fingerprint=calibration.fingerprint,
                fitted_at=_timestamp(calibration.fitted_at),
            )
        )
    if context is not None:
        pack.context_budget.CopyFrom(_budget(context))
    _set_timings(pack, timings_ms)
    return pack


def pack_status(finals: Sequence[float], hard: float) -> pb.RetrievalStatus.ValueType:
    """SUCCESS when some result reaches the hard threshold; IDENTIFIER_MATCH when there are
    results but each is only there for an identifier of the query it holds; else
    NO_EVIDENCE. A SUCCESS always promises a passage estimated to answer (issue 43)."""
    if any(final >= hard for final in finals):
        return pb.RETRIEVAL_STATUS_SUCCESS
    return pb.RETRIEVAL_STATUS_IDENTIFIER_MATCH if finals else pb.RETRIEVAL_STATUS_NO_EVIDENCE


def error_pack(
    request_id: str,
    code: str,
    message: str,
    *,
    tenant: str = "",
    timings_ms: Mapping[str, float] | None = None,
) -> pb.EvidencePack:
    """The pack of a request that could not run: status FAILED with a stable error code."""
    pack = pb.EvidencePack(
        request_id=request_id,
        status=pb.RETRIEVAL_STATUS_FAILED,
        error=pb.Error(code=code, message=message),
        tenant=tenant,
        confidence=pb.CONFIDENCE_NONE,
    )
    _set_timings(pack, timings_ms or {})
    return pack


def reindex_requests(pack: pb.EvidencePack) -> list[tuple[str, ExclusionReason]]:
    """(entity_id, reason) for each entity the SoR check excluded: what to reindex.

    One entry per entity, with the reason of its best-ranked exclusion, sorted by entity id.
    """
    first: dict[str, ExclusionReason] = {}
    for item in pack.excluded:
        reason = _REASON_OF.get(item.reason)
        if reason is not None and reason in _REINDEXABLE:
            first.setdefault(item.entity_id, reason)
    return sorted(first.items())


def serialize_pack(pack: pb.EvidencePack) -> bytes:
    """Wire bytes with maps in key order: identical packs give identical bytes."""
    return pack.SerializeToString(deterministic=True)
