"""`retrieval_api.retriever`: the cooldown that keeps stale hits from re-requests in a loop;
the payload keys the pipeline reads of its candidates."""

from __future__ import annotations

from dataclasses import replace
from datetime import UTC, datetime
from typing import Any

import pytest
from google.protobuf.timestamp_pb2 import Timestamp

from ragcore.sor.base import SorVerdict
from retrieval_api.evidence import (
    IndexInfo,
    build_pack,
    entities_to_verify,
    serialize_pack,
    verdicts_from_sor,
)
from retrieval_api.pipeline_settings import RetrievalConfig
from retrieval_api.ranking import Candidate, ScoreKind, rank
from retrieval_api.retriever import Cooldown, payload_fields
from schemas.proto.ragstream.retrieval.v1 import retrieval_pb2 as pb
from tests.retrieval_api.helpers import TENANT, cand, request

pytestmark = pytest.mark.unit


def test_a_key_passes_once_per_cooldown_and_the_memo_stays_bounded() -> None:
    now = [0.0]
    cooldown = Cooldown(60.0, 2, clock=lambda: now[0])
    assert cooldown.first("a") and not cooldown.first("a")
    now[0] = 59.9
    assert not cooldown.first("a")
    now[0] = 60.0
    assert cooldown.first("a")
    assert cooldown.first("b") and cooldown.first("c")  # "a" is forgotten: at most 2 keys
    assert cooldown.first("a") and not cooldown.first("c")


# --- the payload keys the pipeline reads --------------------------------------------------

SELECTION_CONFIG = RetrievalConfig(keyword_filter_fields={"equipment_id": "keyword"})
ATTRIBUTES = ("equipment_id",)
#: keys ingest writes that no stage reads (they must not change a pack when absent)
UNREAD: dict[str, Any] = {
    "indexed_at": "2024-05-02T00:00:00Z",
    "source_lsn": 42,
    "content_format": "text",
}


def _filters(case: str) -> pb.Filters | None:
    if case == "none":
        return None
    if case == "entity":
        return pb.Filters(entity_types=["KNOWLEDGE_ARTIFACT"], entity_ids=["a", "b", "c"])
    filters = pb.Filters(
        event_date_start=Timestamp(seconds=1_700_000_000),
        event_date_end=Timestamp(seconds=1_800_000_000),
    )
    filters.keywords["equipment_id"].values.extend(["P-1", "P-2"])
    return filters


def _pool() -> list[Candidate]:
    return [
        cand("a:chunk:0", 0.81, equipment_id="P-1", source_reference="https://x/a", **UNREAD),
        cand("b:chunk:2", 0.74, equipment_id="P-2", **UNREAD),
        cand("c:chunk:0", 0.66, equipment_id="P-3", event_date="2030-01-01T00:00:00Z"),
        cand("d:chunk:1", 0.52, entity_type="SOP", **UNREAD),
        cand("e:chunk:0", 0.45, equipment_id="P-1", tenant_id=TENANT, **UNREAD),
    ]


def _selected(item: Candidate, fields: set[str]) -> Candidate:
    payload = {k: v for k, v in item.hit.payload.items() if k in fields}
    return replace(item, hit=replace(item.hit, payload=payload))


@pytest.mark.parametrize("case", ["none", "entity", "keyword_and_range"])
def test_a_pack_from_the_selected_payload_keys_equals_the_whole_payloads(case: str) -> None:
    req = request(SELECTION_CONFIG, top_k=4, filters=_filters(case))
    fields = set(payload_fields(req.store_filter, ATTRIBUTES))
    assert not fields & UNREAD.keys()

    def pack(items: list[Candidate]) -> bytes:
        ranking = rank(
            items,
            store_filter=req.store_filter,
            top_k=req.top_k,
            thresholds=req.thresholds(SELECTION_CONFIG, ScoreKind.COSINE),
        )
        states = {
            e: SorVerdict(e, True, content_hash=f"hash-{e}") for e in entities_to_verify(ranking)
        }
        states["b"] = SorVerdict("b", True, content_hash="another hash")  # stale: excluded
        return serialize_pack(
            build_pack(
                req,
                IndexInfo("rag__acme__v3", 3, "model@1"),
                ranking,
                verdicts_from_sor(ranking.to_verify, states),
                retrieved_at=datetime(2024, 7, 1, tzinfo=UTC),
                timings_ms={},
                attribute_fields=ATTRIBUTES,
            )
        )

    whole = pack(_pool())
    assert whole == pack([_selected(c, fields) for c in _pool()])
    # the selection matters: without the keys it keeps, the pack would differ
    assert whole != pack([_selected(c, fields - {"source_hash"}) for c in _pool()])
