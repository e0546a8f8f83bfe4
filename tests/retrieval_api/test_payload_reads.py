"""The payload keys Retrieve asks the store for (`retriever.payload_fields`) cover every key the
pipeline reads of a candidate: each stage runs on payloads that fail loudly when a key outside
the selection is read, so a stage reading a key its module does not declare (which would read
as absent in production, where the store returns only the selected keys) fails here."""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from dataclasses import replace
from datetime import UTC, datetime
from typing import Any

import pytest
from google.protobuf.timestamp_pb2 import Timestamp

from ragcore.embedders.local_onnx import MINILM_SPEC
from ragcore.sor.base import SorVerdict
from ragcore.sparse import LexicalMatch, LexicalQuery
from ragcore.tokenizers import load_token_counter
from retrieval_api.candidates import Pool, RawPool
from retrieval_api.context import context_of, plan_context
from retrieval_api.evidence import (
    IndexInfo,
    build_pack,
    entities_to_verify,
    result_chunks,
    verdicts_from_sor,
)
from retrieval_api.evidence_score import RankingChoice, Signals
from retrieval_api.pipeline_settings import RetrievalConfig
from retrieval_api.ranking import Candidate, ScoreKind, rank
from retrieval_api.retriever import PAYLOAD_FIELDS, payload_fields
from schemas.proto.ragstream.retrieval.v1 import retrieval_pb2 as pb
from tests.retrieval_api.helpers import cand, request

pytestmark = pytest.mark.unit

CONFIG = RetrievalConfig(keyword_filter_fields={"equipment_id": "keyword"})
ATTRIBUTES = ("equipment_id",)


class UndeclaredPayloadReadError(AssertionError):
    """A stage read a payload key Retrieve does not ask the store for."""


class SelectedPayload(Mapping[str, Any]):
    """A payload as the store returns it for a key selection: reading a selected key answers
    as a dict does; reading any other key, or the whole payload, raises."""

    def __init__(self, payload: Mapping[str, Any], selected: frozenset[str]) -> None:
        self._payload = payload
        self._selected = selected

    def __getitem__(self, key: str) -> Any:
        if key not in self._selected:
            raise UndeclaredPayloadReadError(f"payload key {key!r} read but not selected")
        return self._payload[key]

    def __iter__(self) -> Iterator[str]:
        raise UndeclaredPayloadReadError("the whole payload read (iterated)")

    def __len__(self) -> int:
        raise UndeclaredPayloadReadError("the whole payload read (len)")


def _guarded(item: Candidate, selected: frozenset[str]) -> Candidate:
    return replace(item, hit=replace(item.hit, payload=SelectedPayload(item.hit.payload, selected)))


def _pool() -> list[Candidate]:
    near = "P-1: pump vibration alarm; check the bearing and the coupling alignment first."
    return [
        cand("a:chunk:0", 0.81, equipment_id="P-1", source_reference="https://x/a", text=near),
        cand("b:chunk:2", 0.78, equipment_id="P-2", text=near),  # collapsed into a: also_in
        cand("c:chunk:0", 0.74, equipment_id="P-1", event_date="2030-01-01T00:00:00Z"),
        cand("d:chunk:1", 0.52, entity_type="SOP", equipment_id="P-1"),
        cand("e:chunk:0", 0.45, equipment_id="P-3"),
        cand("f:chunk:0", 0.10, equipment_id="P-1"),  # below threshold: excluded
    ]


def _filters(case: str) -> pb.Filters | None:
    if case == "none":
        return None
    if case == "entity":
        return pb.Filters(entity_types=["KNOWLEDGE_ARTIFACT", "SOP"], entity_ids=list("abcdef"))
    filters = pb.Filters(
        event_date_start=Timestamp(seconds=1_700_000_000),
        event_date_end=Timestamp(seconds=1_800_000_000),
    )
    filters.keywords["equipment_id"].values.extend(["P-1", "P-2"])
    return filters


def _pipeline(items: list[Candidate], filters: pb.Filters | None) -> pb.EvidencePack:
    """Ranking (filter re-check, dedup, near-duplicate collapse, diversity), verification (one
    entity stale), the context plan of the results and the pack, as `Retriever.retrieve` runs
    them."""
    req = request(CONFIG, top_k=3, filters=filters, max_context_tokens=512)
    ranking = rank(
        items,
        store_filter=req.store_filter,
        top_k=req.top_k,
        thresholds=req.thresholds(CONFIG, ScoreKind.COSINE),
        near_duplicate_similarity=0.9,
        diversity_lambda=0.7,
    )
    states = {e: SorVerdict(e, True, content_hash=f"hash-{e}") for e in entities_to_verify(ranking)}
    states["c"] = SorVerdict("c", True, content_hash="another hash")  # stale: excluded
    verdicts = verdicts_from_sor(ranking.to_verify, states)
    leads = result_chunks(ranking, verdicts)
    context = plan_context(
        [(c.chunk_id, str(c.payload.get("text", "")), context_of(c, {})) for c in leads],
        load_token_counter(MINILM_SPEC.tokenizer),
        512,
    )
    return build_pack(
        req,
        IndexInfo("rag__acme__v3", 3, "model@1"),
        ranking,
        verdicts,
        retrieved_at=datetime(2024, 7, 1, tzinfo=UTC),
        timings_ms={},
        attribute_fields=ATTRIBUTES,
        context=context,
    )


@pytest.mark.parametrize("case", ["none", "entity", "keyword_and_range"])
def test_every_stage_reads_only_the_payload_keys_retrieve_selects(case: str) -> None:
    filters = _filters(case)
    selected = frozenset(payload_fields(request(CONFIG, filters=filters).store_filter, ATTRIBUTES))
    pack = _pipeline([_guarded(c, selected) for c in _pool()], filters)
    # the same pack as from whole payloads, and the run exercised what reads payloads
    assert pack == _pipeline(_pool(), filters)
    assert pack.results and pack.results[0].also_in and pack.excluded


def test_the_candidates_read_only_the_selected_payload_keys() -> None:
    items = [_guarded(c, frozenset(PAYLOAD_FIELDS)) for c in _pool()]
    query = LexicalQuery(("pump",), (1.0,), ("P-1",), (), 0.0)
    match = LexicalMatch(score=1.0, normalized=1.0, coverage=1.0, identifiers=("P-1",))
    raw = RawPool(query, tuple(c.hit for c in items), tuple(Signals(0.5, match) for _ in items))
    pool = Pool(raw, raw.hits, tuple(0.5 for _ in items), RankingChoice())
    explained = [c.explained for c in pool.candidates()]
    assert explained[0] == ("P-1",) and explained[4] == ()


def test_a_read_of_an_undeclared_key_fails_loudly() -> None:
    # the guard itself: a stage reading a key outside the selection must fail this suite
    payload = SelectedPayload({"text": "x", "indexed_at": "2024-05-02"}, frozenset({"text"}))
    assert payload.get("text") == "x"
    with pytest.raises(UndeclaredPayloadReadError):
        payload.get("indexed_at")
    with pytest.raises(UndeclaredPayloadReadError):
        dict(payload)
