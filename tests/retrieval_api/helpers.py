"""Builders of fused hits, requests and rankings shared by the retrieval_api tests."""

from __future__ import annotations

from typing import Any

from ragcore.fusion import FusedHit
from retrieval_api.pipeline_settings import RetrievalConfig
from retrieval_api.ranking import Candidate
from retrieval_api.validate import ValidatedRequest, validate_request
from schemas.proto.ragstream.retrieval.v1 import retrieval_pb2 as pb

TENANT = "acme"
REQUEST_ID = "req-1"


def payload(chunk_id: str, entity_id: str, **extra: Any) -> dict[str, Any]:
    """A payload shaped like the one ingest writes (streams.ingest)."""
    index = int(chunk_id.rsplit(":", 1)[-1]) if ":chunk:" in chunk_id else 0
    data: dict[str, Any] = {
        "tenant_id": TENANT,
        "source_entity_id": entity_id,
        "chunk_id": chunk_id,
        "source_hash": f"hash-{entity_id}",
        "entity_type": "KNOWLEDGE_ARTIFACT",
        "chunk_index": index,
        "locator": {
            "chunk_index": index,
            "char_start": 100 * index,
            "char_end": 100 * index + 90,
            "section_path": ["Setup", "Install"],
            "extracted_from": "markdown",
        },
        "title": f"Title of {entity_id}",
        "text": f"Text of {chunk_id}",
        "event_date": "2024-05-01T12:00:00.000000Z",
    }
    data.update(extra)
    return data


def fused(
    chunk_id: str,
    *,
    entity_id: str | None = None,
    dense: float | None = None,
    sparse: float | None = None,
    score: float = 0.0,
    dense_rank: int | None = None,
    sparse_rank: int | None = None,
    **extra: Any,
) -> FusedHit:
    """A fused hit; `entity_id` defaults to the part of `chunk_id` before ':chunk:'."""
    entity = entity_id or chunk_id.split(":chunk:", maxsplit=1)[0]
    return FusedHit(
        point_id=f"pt-{chunk_id}",
        chunk_id=chunk_id,
        score=score,
        dense_score=dense,
        dense_rank=dense_rank if dense_rank is not None else (1 if dense is not None else None),
        sparse_score=sparse,
        sparse_rank=sparse_rank if sparse_rank is not None else (1 if sparse is not None else None),
        payload=payload(chunk_id, entity, **extra),
    )


def cand(chunk_id: str, similarity: float, *, rerank: float | None = None, **kw: Any) -> Candidate:
    """A candidate found by the dense branch with cosine `similarity`."""
    return Candidate(fused(chunk_id, dense=similarity, **kw), similarity, rerank)


def request(
    config: RetrievalConfig | None = None, *, query: str = "pump vibration alarm", **fields: Any
) -> ValidatedRequest:
    """A validated request for TENANT with a fixed request id."""
    req = pb.RetrieveRequest(query_text=query, request_id=REQUEST_ID, **fields)
    return validate_request(req, config or RetrievalConfig(), TENANT)
