"""Audit records (docs/decisions/retrieval-contract.md) as JSON-able dicts (pure; the adapter
appends them to Kafka).

- `retrieval_requests_v1`: one record per request, whatever its status.
- `retrieval_results_v1`: one record per returned result.

The raw query text is never part of a record: only a hash of its normalized form (NFC, trimmed)
and its length. With a deployment key the hash is an HMAC-SHA256, so short queries cannot be
recovered by hashing guesses; without one it is a plain SHA-256. Chunk text is not recorded
either (it lives in the SoR; the record points at it by chunk id and source hash).
"""

from __future__ import annotations

import hashlib
import hmac
import json
import math
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

from google.protobuf.timestamp_pb2 import Timestamp

from retrieval_api.validate import normalize_query
from schemas.proto.ragstream.retrieval.v1 import retrieval_pb2 as pb

REQUESTS_SCHEMA = "retrieval_requests_v1"
RESULTS_SCHEMA = "retrieval_results_v1"


@dataclass(frozen=True, slots=True)
class QueryFingerprint:
    """What the audit keeps of a query: a hash of its normalized form and its length."""

    digest: str  # hex
    algorithm: str  # "sha256" or "hmac-sha256"
    chars: int


def fingerprint_query(text: str, *, key: bytes | None = None) -> QueryFingerprint:
    """Hash the normalized query (the same normalization validation applies)."""
    normalized = normalize_query(text)
    # surrogatepass: a str that did not come off the wire may hold lone surrogates.
    data = normalized.encode("utf-8", errors="surrogatepass")
    if key:
        return QueryFingerprint(
            hmac.new(key, data, hashlib.sha256).hexdigest(), "hmac-sha256", len(normalized)
        )
    return QueryFingerprint(hashlib.sha256(data).hexdigest(), "sha256", len(normalized))


def _rfc3339(moment: datetime) -> str:
    if moment.utcoffset() is None:
        raise ValueError(f"datetime {moment!r} has no timezone")
    return moment.astimezone(UTC).isoformat(timespec="microseconds").replace("+00:00", "Z")


def _ts(ts: Timestamp) -> str:
    return _rfc3339(ts.ToDatetime(tzinfo=UTC))


def _number(value: float) -> float | None:
    # JSON has no NaN or infinity.
    return value if math.isfinite(value) else None


def _enum_name(name: str, prefix: str) -> str:
    return name.removeprefix(prefix).lower()


def filters_json(filters: pb.Filters) -> str:
    """Canonical JSON of the applied filters (sorted keys, compact)."""
    data: dict[str, Any] = {
        "entity_types": list(filters.entity_types),
        "entity_ids": list(filters.entity_ids),
        "keywords": {k: list(filters.keywords[k].values) for k in sorted(filters.keywords)},
        "event_date_start": (
            _ts(filters.event_date_start) if filters.HasField("event_date_start") else None
        ),
        "event_date_end": (
            _ts(filters.event_date_end) if filters.HasField("event_date_end") else None
        ),
    }
    return json.dumps(data, sort_keys=True, separators=(",", ":"), ensure_ascii=False)


def request_record(
    pack: pb.EvidencePack, *, query: QueryFingerprint, requested_at: datetime
) -> dict[str, Any]:
    """The `retrieval_requests_v1` record of one request (any status)."""
    timings = {k: _number(pack.timings_ms[k]) for k in sorted(pack.timings_ms)}
    top = pack.results[0].scores if pack.results else None
    debug = pack.debug
    return {
        "schema": REQUESTS_SCHEMA,
        "request_id": pack.request_id,
        "requested_at": _rfc3339(requested_at),
        "tenant": pack.tenant,
        "index_name": pack.index_name,
        "index_version": pack.index_version if pack.HasField("index_version") else None,
        "embedding_model_version": pack.embedding_model_version,
        "query_text_hash": query.digest,
        "query_hash_algorithm": query.algorithm,
        "query_chars": query.chars,
        "top_k_requested": pack.top_k_requested,
        "candidate_k": debug.candidate_k,
        "filters_json": filters_json(pack.filters_applied),
        "min_similarity_hard": _number(pack.min_score) if pack.HasField("min_score") else None,
        "score_kind": _enum_name(pb.ScoreKind.Name(pack.score_kind), "SCORE_KIND_"),
        "status": _enum_name(pb.RetrievalStatus.Name(pack.status), "RETRIEVAL_STATUS_"),
        "confidence": _enum_name(pb.Confidence.Name(pack.confidence), "CONFIDENCE_"),
        "results_returned": pack.results_returned,
        "top_similarity": _number(top.similarity) if top is not None else None,
        "top_score": _number(top.final) if top is not None else None,
        "candidates_returned": debug.candidates_returned,
        "rejected_by_filter": debug.rejected_by_filter,
        "rejected_by_threshold": debug.rejected_by_threshold,
        "excluded_stale": debug.excluded_stale,
        "excluded_deleted": debug.excluded_deleted,
        "excluded_missing": debug.excluded_missing,
        "deduplicated": debug.deduplicated,
        "timings_ms": timings,
        "total_ms": timings.get("total"),
        "error_code": pack.error.code if pack.HasField("error") else None,
        "trace_id": pack.trace_id or None,
    }


def result_records(pack: pb.EvidencePack, *, requested_at: datetime) -> list[dict[str, Any]]:
    """The `retrieval_results_v1` records: one per returned result, in rank order."""
    version = pack.index_version if pack.HasField("index_version") else None
    records: list[dict[str, Any]] = []
    for result in pack.results:
        scores = result.scores
        records.append(
            {
                "schema": RESULTS_SCHEMA,
                "request_id": pack.request_id,
                "requested_at": _rfc3339(requested_at),
                "tenant": pack.tenant,
                "index_name": pack.index_name,
                "index_version": version,
                "rank": result.rank,
                "chunk_id": result.chunk_id,
                "entity_id": result.entity_id,
                "entity_type": result.entity_type,
                "source_hash": result.source_hash,
                "similarity": _number(scores.similarity),
                "dense": _number(scores.dense) if scores.HasField("dense") else None,
                "sparse": _number(scores.sparse) if scores.HasField("sparse") else None,
                "fused": _number(scores.fused),
                "rerank": _number(scores.rerank) if scores.HasField("rerank") else None,
                "final": _number(scores.final),
                "event_date": _ts(result.event_date) if result.HasField("event_date") else None,
                "attributes": dict(sorted(result.attributes.items())),
            }
        )
    return records
