"""Retrieve end to end over real gRPC on loopback: a PostgreSQL SoR, qdrant-edge, the real
local ONNX embedder and the real ingest path. Seed 000 tests 2 (stale detection), 3 (tenant
isolation) and 4 (provenance chain), determinism, status codes, audit and metrics."""

from __future__ import annotations

import hashlib
import time
from pathlib import Path

import grpc
import pytest

from ragcore.embedders.local_onnx import LocalOnnxEmbedder
from ragcore.grpc_codes import SERVER_ERROR_CODES
from ragcore.store.base import Placement
from ragcore.store.tiered import TieredStore
from ragdev.services.postgres import PostgresCluster
from retrieval_api.app import warm_calibrations
from retrieval_api.pipeline_settings import RetrievalConfig
from schemas.entities import ContentFormat
from schemas.proto.ragstream.retrieval.v1 import retrieval_pb2 as pb
from tests.retrieval_api.stack import Stack, bearer
from tests.streams.support import eid

pytestmark = pytest.mark.integration

REFUND = (
    "Refunds are issued to the original payment method within 14 days of the return being "
    "received at our warehouse. Items must be unused and in their original packaging."
)
PUMP = (
    "The centrifugal pump P-200 must be primed before start-up. Open the vent valve, fill the "
    "casing with water until it flows from the vent, then close the valve and start the motor."
)
VPN = (
    "To connect to the corporate VPN, install the client, sign in with your SSO account and "
    "approve the push notification on your phone. Error E-1042 means your token expired."
)


def sor_hash(stack: Stack, entity_id: str) -> str:
    row = stack.row(entity_id)
    assert row is not None
    return stack.preparer.content_hash(row["content"], ContentFormat.TEXT)


def test_provenance_chain_leads_from_result_to_the_same_sor_row(stack: Stack) -> None:
    stack.write("ent-refund", "acme", REFUND, title="Refund policy")
    stack.write("ent-pump", "acme", PUMP, title="Priming the P-200")
    pack = stack.retrieve("acme", "how long until I get my money back after returning an item?")
    assert pack.status == pb.RETRIEVAL_STATUS_SUCCESS
    top = pack.results[0]
    assert (top.entity_id, top.chunk_id, top.title) == (
        eid("ent-refund"),
        eid("ent-refund:chunk:0"),
        "Refund policy",
    )
    assert top.source_hash == sor_hash(stack, "ent-refund")
    assert top.locator.char_end > top.locator.char_start
    source = pack.sources[0]
    assert (source.entity_id, source.source_hash) == (eid("ent-refund"), top.source_hash)
    assert source.retrieved_at.seconds > 0
    assert pack.embedding_model_version == "all-MiniLM-L6-v2@onnx-int8-1.0.0"
    assert pack.index_name == "rag__acme__v1" and pack.index_version == 1
    # thresholds use the evidence score, reported beside the channel scores
    assert pack.score_kind == pb.SCORE_KIND_EVIDENCE
    assert top.scores.evidence == top.scores.final
    assert top.scores.similarity == top.scores.dense and top.scores.HasField("lexical")
    assert pack.calibration.source == "prior"  # the stack never calibrated this index
    stages = {"resolve", "embed", "search", "rank", "verify", "evidence", "total"}
    assert stages <= set(pack.timings_ms)
    assert pack.timings_ms["total"] >= pack.timings_ms["evidence"]


def test_sor_update_after_indexing_excludes_the_stale_chunk_and_requests_reindex(
    stack: Stack,
) -> None:
    stack.write("ent-b", "acme", PUMP)
    stack.write("ent-b", "acme", PUMP.replace("water", "clean water"), ingest=False)
    pack = stack.retrieve("acme", "how do I prime the centrifugal pump before starting it?")
    assert pack.status == pb.RETRIEVAL_STATUS_NO_EVIDENCE
    assert len(pack.sources) == 0
    assert [(e.entity_id, e.reason) for e in pack.excluded] == [
        (eid("ent-b"), pb.EXCLUSION_REASON_STALE)
    ]
    assert pack.debug.excluded_stale == 1
    requests = stack.publisher.on("ragstream.reindex-requests")
    assert [(r["tenant"], r["entity_id"], r["reason"]) for r in requests] == [
        ("acme", eid("ent-b"), "stale")
    ]


def test_a_stale_hit_is_not_re_requested_in_a_loop(stack: Stack) -> None:
    """The same stale entity found by query after query is requested once per cooldown; the
    requests left out are counted."""
    stack.write("ent-b", "acme", PUMP)
    stack.write("ent-b", "acme", PUMP.replace("water", "clean water"), ingest=False)
    for _ in range(3):
        pack = stack.retrieve("acme", "how do I prime the centrifugal pump before starting it?")
        assert [e.entity_id for e in pack.excluded] == [eid("ent-b")]
    requests = stack.publisher.on("ragstream.reindex-requests")
    assert [r["entity_id"] for r in requests] == [eid("ent-b")]
    get = stack.registry.get_sample_value
    assert get("ragstream_retrieve_reindex_requests_total") == 1
    assert get("ragstream_retrieve_reindex_requests_suppressed_total") == 2


def test_deleted_and_soft_deleted_entities_are_excluded_with_their_reason(stack: Stack) -> None:
    stack.write("ent-b", "acme", PUMP)
    stack.write("ent-b2", "acme", PUMP.replace("P-200", "P-300"))
    stack.write("ent-c", "acme", VPN)
    stack.delete("ent-b", ingest=False)  # the index has not caught up yet
    stack.soft_delete("ent-b2")
    pack = stack.retrieve("acme", "priming the centrifugal pump", top_k=3)
    assert {eid("ent-b"), eid("ent-b2")}.isdisjoint(r.entity_id for r in pack.results)
    excluded = {(e.entity_id, e.reason) for e in pack.excluded}
    assert (eid("ent-b"), pb.EXCLUSION_REASON_MISSING) in excluded  # gone from the SoR
    assert (eid("ent-b2"), pb.EXCLUSION_REASON_DELETED) in excluded  # deleted_at set
    reasons = {
        r["entity_id"]: r["reason"] for r in stack.publisher.on("ragstream.reindex-requests")
    }
    assert reasons == {eid("ent-b"): "missing", eid("ent-b2"): "deleted"}


def test_other_tenant_gets_nothing_even_with_a_matching_query_or_a_forged_tenant(
    stack: Stack,
) -> None:
    stack.write("ent-c", "acme", VPN)
    stack.write("ent-g", "globex", PUMP)
    pack = stack.retrieve("globex", "VPN error E-1042 token expired")
    assert all(r.entity_id != eid("ent-c") for r in pack.results)
    assert all(e.entity_id != eid("ent-c") for e in pack.excluded)
    with pytest.raises(grpc.RpcError) as err:
        stack.retrieve("globex", "VPN error E-1042", tenant="acme")
    assert err.value.code() == grpc.StatusCode.PERMISSION_DENIED
    with pytest.raises(grpc.RpcError) as err:
        stack.retrieve("initech", "VPN error E-1042")  # a tenant with no index at all
    assert err.value.code() == grpc.StatusCode.NOT_FOUND
    assert ("ragstream-error-code", "INDEX_NOT_FOUND") in err.value.trailing_metadata()


@pytest.mark.parametrize("placement", ["shared", "dedicated"])
def test_tenants_stay_apart_over_grpc_in_either_placement(
    placement: Placement, postgres: PostgresCluster, tmp_path: Path, embedder: LocalOnnxEmbedder
) -> None:
    """Issue 16: the same isolation through gRPC whether both tenants are partitions of one
    shared collection or each has its own; the other tenant's exact text and identifier,
    pinned versions and a forged tenant all find nothing of it."""
    stack = Stack(postgres.dsn, tmp_path / "store", embedder, placement=placement)
    try:
        stack.write("ent-c", "acme", VPN)
        stack.write("ent-r", "acme", REFUND)
        stack.write("ent-g", "globex", PUMP)
        store = stack.store
        assert isinstance(store, TieredStore)
        assert {store.placement_of(f"rag__{t}__v1") for t in ("acme", "globex")} == {placement}
        engine_collections = store.engine.list_collections()
        assert len(engine_collections) == (1 if placement == "shared" else 2)
        for query in (VPN, "E-1042", REFUND):
            for pinned in ({}, {"index_version": "1"}):
                pack = stack.retrieve("globex", query, **pinned)
                seen = {r.entity_id for r in pack.results} | {e.entity_id for e in pack.excluded}
                assert seen <= {eid("ent-g")}, (query, pinned, seen)
                assert pack.index_name == "rag__globex__v1"
        mine = stack.retrieve("acme", "E-1042")
        assert mine.results and mine.results[0].entity_id == eid("ent-c")
        with pytest.raises(grpc.RpcError) as err:
            stack.retrieve("globex", "E-1042", tenant="acme")
        assert err.value.code() == grpc.StatusCode.PERMISSION_DENIED
    finally:
        stack.close()


def test_same_request_twice_returns_identical_results_in_identical_order(stack: Stack) -> None:
    for i, text in enumerate([REFUND, PUMP, VPN, REFUND + " Store credit is instant."]):
        stack.write(f"ent-{i}", "acme", text)
    first = stack.retrieve("acme", "refund", top_k=4, request_id="req-1")
    second = stack.retrieve("acme", "refund", top_k=4, request_id="req-1")
    for pack in (first, second):
        pack.ClearField("timings_ms")
        for source in pack.sources:
            source.ClearField("retrieved_at")
    assert first.SerializeToString(deterministic=True) == second.SerializeToString(
        deterministic=True
    )
    fused = [r.scores.fused for r in first.results]  # default order: the fusion's
    assert fused == sorted(fused, reverse=True)


def test_exact_identifier_is_found_through_the_sparse_branch(stack: Stack) -> None:
    stack.write("ent-c", "acme", VPN)
    stack.write("ent-pump", "acme", PUMP)
    pack = stack.retrieve("acme", "E-1042")
    assert pack.results and pack.results[0].entity_id == eid("ent-c")


def test_unrelated_question_gets_no_evidence_not_a_fabricated_answer(stack: Stack) -> None:
    stack.write("ent-pump", "acme", PUMP)
    pack = stack.retrieve("acme", "what is the dress code for the annual gala dinner?")
    assert pack.status == pb.RETRIEVAL_STATUS_NO_EVIDENCE
    assert len(pack.results) == 0
    assert pack.debug.rejected_by_threshold >= 1


@pytest.mark.parametrize(
    ("metadata", "request_fields", "code"),
    [
        ((), {"query_text": "hello"}, grpc.StatusCode.UNAUTHENTICATED),
        (
            (("authorization", "Bearer wrong"),),
            {"query_text": "hi"},
            grpc.StatusCode.UNAUTHENTICATED,
        ),
        (bearer("acme"), {"query_text": "   "}, grpc.StatusCode.INVALID_ARGUMENT),
        (bearer("acme"), {"query_text": "hi", "top_k": 1000}, grpc.StatusCode.INVALID_ARGUMENT),
        (bearer("acme"), {"query_text": "a\x00b"}, grpc.StatusCode.INVALID_ARGUMENT),
        (
            bearer("acme"),
            {"query_text": "hi", "index_version": "latest"},
            grpc.StatusCode.INVALID_ARGUMENT,
        ),
    ],
)
def test_bad_calls_get_precise_status_codes(
    stack: Stack,
    metadata: tuple[tuple[str, str], ...],
    request_fields: dict[str, object],
    code: grpc.StatusCode,
) -> None:
    stack.write("ent-c", "acme", VPN)
    with pytest.raises(grpc.RpcError) as err:
        stack.client.Retrieve(pb.RetrieveRequest(**request_fields), metadata=metadata, timeout=10)  # type: ignore[arg-type]
    assert err.value.code() == code
    assert err.value.details()  # a useful message


def test_audit_records_hash_the_query_and_never_store_it(stack: Stack) -> None:
    stack.write("ent-c", "acme", VPN)
    query = "secret project falcon VPN E-1042"
    stack.retrieve("acme", query, request_id="audit-1")
    with pytest.raises(grpc.RpcError):
        stack.retrieve("acme", query, top_k=999)
    records = stack.publisher.on("ragstream.audit")
    assert records, "no audit records"
    blob = repr(records)
    assert "falcon" not in blob and "secret" not in blob
    digest = hashlib.sha256(query.encode()).hexdigest()
    assert any(digest in repr(r) for r in records)
    assert {r["status"] for r in records if "status" in r} == {"success", "failed"}


def test_grpc_server_metrics_count_calls_by_status_code(stack: Stack) -> None:
    stack.write("ent-c", "acme", VPN)
    stack.retrieve("acme", "VPN")
    with pytest.raises(grpc.RpcError):
        stack.retrieve("acme", "")
    labels = {
        "grpc_type": "unary",
        "grpc_service": "ragstream.retrieval.v1.RetrievalService",
        "grpc_method": "Retrieve",
    }
    handled = stack.registry.get_sample_value
    # the client sees an aborted call before the server-side interceptor has counted it
    deadline = time.monotonic() + 5
    while handled("grpc_server_handled_total", {**labels, "grpc_code": "InvalidArgument"}) is None:
        assert time.monotonic() < deadline
        time.sleep(0.05)
    assert handled("grpc_server_handled_total", {**labels, "grpc_code": "OK"}) == 1
    assert handled("grpc_server_handled_total", {**labels, "grpc_code": "InvalidArgument"}) == 1
    assert handled("grpc_server_started_total", labels) == 2
    requests = "ragstream_retrieve_requests_total"
    assert handled(requests, {"status": "SUCCESS", "code": "OK"}) == 1
    # a client error is a FAILED pack labelled with its code, never a server-side code
    assert handled(requests, {"status": "FAILED", "code": "InvalidArgument"}) == 1
    for code in SERVER_ERROR_CODES:  # exported at 0 from the start, never counted here
        assert handled(requests, {"status": "FAILED", "code": code}) == 0


def test_near_duplicates_collapse_and_context_fits_the_token_budget(stack: Stack) -> None:
    ticket = "Login fails with E-2113 (#{n})\n\nThe login page shows error E-2113. Account {n}."
    for n in range(3):
        stack.write(f"ent-ticket-{n}", "acme", ticket.format(n=100 + n), title=f"Ticket {n}")
    filler = " ".join(
        f"Step {i}: check the pump casing, the valves and the gauges." for i in range(60)
    )
    manual = f"{filler} The seal of the P-200 must be checked every 500 hours. {filler}"
    stack.write("ent-manual", "acme", manual, title="P-200 manual")

    pack = stack.retrieve("acme", "login error E-2113")
    top = pack.results[0]
    assert len(top.also_in) == 2 and pack.debug.collapsed == 2
    tickets = {eid(f"ent-ticket-{n}") for n in range(3)}
    assert {top.entity_id, *(s.entity_id for s in top.also_in)} == tickets
    assert all(s.similarity == 1.0 for s in top.also_in)
    assert not top.HasField("context") and not pack.HasField("context_budget")  # not asked

    pack = stack.retrieve("acme", "how often is the P-200 seal checked?", max_context_tokens=400)
    assert pack.status == pb.RETRIEVAL_STATUS_SUCCESS
    top = pack.results[0]
    assert top.entity_id == eid("ent-manual") and "500 hours" in top.text
    budget = pack.context_budget
    assert budget.max_context_tokens == 400 and 0 < budget.token_budget_used <= 400
    assert budget.tokenizer.startswith("hf-package:")
    assert top.context.chunk_ids and top.context.tokens > 0
    # a chunk of <= 256 tokens and two neighbours of as many cannot fit in 400
    assert top.context.truncated and top.text_tokens <= 256
    used = sum(r.text_tokens + r.context.tokens for r in pack.results)
    assert used == budget.token_budget_used
    assert any(c.action == pb.BUDGET_ACTION_CONTEXT_TRUNCATED for c in budget.cuts)
    assert "context" in pack.timings_ms


@pytest.mark.parametrize(
    "case", [("dedicated", "dedicated", 2), ("shared", "dedicated", 0), ("shared", "all", 2)]
)
def test_retrieve_loads_the_calibrations_asked_for_ahead_of_their_requests(
    case: tuple[Placement, str, int],
    postgres: PostgresCluster,
    tmp_path: Path,
    embedder: LocalOnnxEmbedder,
    caplog: pytest.LogCaptureFixture,
) -> None:
    """`retrieval.warm_calibrations` (default: dedicated): after the server starts, a
    background thread loads the calibrations of the large tenants' indexes (a never-calibrated
    one's prior scans all its texts), while requests are served."""
    placement, mode, warmed = case
    stack = Stack(
        postgres.dsn,
        tmp_path / "store",
        embedder,
        placement=placement,
        retrieval=RetrievalConfig(warm_calibrations=mode),  # type: ignore[arg-type]
    )
    try:
        stack.write("ent-c", "acme", VPN)
        stack.write("ent-g", "globex", PUMP)
        with caplog.at_level("INFO", logger="retrieval_api.app"):
            warming = warm_calibrations(stack.app)
            mine = stack.retrieve("acme", "E-1042")  # served while it warms
            deadline = time.monotonic() + 60
            while "loaded ahead of their requests" not in caplog.text:
                assert time.monotonic() < deadline, "the warm-up never finished"
                time.sleep(0.05)
        warming.set()
        assert f"calibrations of {warmed} {mode} index version(s) loaded" in caplog.text
        assert mine.results and mine.results[0].entity_id == eid("ent-c")
    finally:
        stack.close()
