"""Retrieve's spans over real gRPC on loopback, recorded by the SDK's in-memory exporter: one
server span per call continuing the caller's `traceparent`, a child per stage, and the trace
id in the evidence pack and the audit record."""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path

import grpc
import pytest
from opentelemetry.sdk.trace import ReadableSpan, TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.trace import SpanKind, StatusCode

from ragcore.embedders.local_onnx import LocalOnnxEmbedder
from ragcore.tracing import Tracing
from ragdev.services.postgres import PostgresCluster
from schemas.proto.ragstream.retrieval.v1 import retrieval_pb2 as pb
from tests.retrieval_api.stack import Stack, bearer

pytestmark = pytest.mark.integration

TRACE = "4bf92f3577b34da6a3ce929d0e0e4736"
PARENT = "00f067aa0ba902b7"
METHOD = "ragstream.retrieval.v1.RetrievalService/Retrieve"
STAGES = ["validate", "resolve", "embed", "search", "rank", "verify", "evidence"]
VPN = (
    "To connect to the corporate VPN, install the client, sign in with your SSO account and "
    "approve the push notification on your phone. Error E-1042 means your token expired."
)


@pytest.fixture
def exporter() -> InMemorySpanExporter:
    return InMemorySpanExporter()


@pytest.fixture
def traced(
    postgres: PostgresCluster,
    tmp_path: Path,
    embedder: LocalOnnxEmbedder,
    exporter: InMemorySpanExporter,
) -> Iterator[Stack]:
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    stack = Stack(postgres.dsn, tmp_path / "store", embedder, tracing=Tracing(provider))
    yield stack
    stack.close()
    provider.shutdown()


def server_spans(exporter: InMemorySpanExporter, count: int) -> list[ReadableSpan]:
    """The finished server spans, once `count` of them ended (the interceptor ends a span
    after the client already has its answer)."""
    deadline = time.monotonic() + 5
    while True:
        spans = [s for s in exporter.get_finished_spans() if s.name == METHOD]
        if len(spans) >= count or time.monotonic() > deadline:
            return spans
        time.sleep(0.02)


def children(exporter: InMemorySpanExporter, parent: ReadableSpan) -> list[ReadableSpan]:
    assert parent.context is not None
    return sorted(
        (
            s
            for s in exporter.get_finished_spans()
            if s.parent is not None and s.parent.span_id == parent.context.span_id
        ),
        key=lambda s: s.start_time or 0,
    )


def test_a_callers_traceparent_is_continued_with_a_span_per_stage(
    traced: Stack, exporter: InMemorySpanExporter
) -> None:
    traced.write("ent-vpn", "acme", VPN)
    metadata = (*bearer("acme"), ("traceparent", f"00-{TRACE}-{PARENT}-01"))
    request = pb.RetrieveRequest(query_text="how do I connect to the VPN?", request_id="tr-1")
    pack = traced.client.Retrieve(request, metadata=metadata, timeout=30)
    assert pack.status == pb.RETRIEVAL_STATUS_SUCCESS
    assert pack.trace_id == TRACE

    (root,) = server_spans(exporter, 1)
    assert root.kind == SpanKind.SERVER
    assert root.context is not None and format(root.context.trace_id, "032x") == TRACE
    assert root.parent is not None and format(root.parent.span_id, "016x") == PARENT
    assert root.parent.is_remote
    assert root.attributes is not None
    assert dict(root.attributes) == {
        "rpc.system": "grpc",
        "rpc.service": "ragstream.retrieval.v1.RetrievalService",
        "rpc.method": "Retrieve",
        "rpc.grpc.status_code": 0,
    }
    assert root.status.status_code == StatusCode.UNSET
    stages = children(exporter, root)
    assert [s.name for s in stages] == [f"retrieve.{name}" for name in STAGES]
    for stage in stages:  # each inside its parent's time
        assert root.start_time is not None and root.end_time is not None
        assert stage.start_time is not None and stage.end_time is not None
        assert root.start_time <= stage.start_time <= stage.end_time <= root.end_time

    (record,) = [r for r in traced.publisher.on("ragstream.audit") if "status" in r]
    assert (record["request_id"], record["trace_id"]) == ("tr-1", TRACE)


def test_without_a_traceparent_the_call_starts_a_trace_and_reports_its_id(
    traced: Stack, exporter: InMemorySpanExporter
) -> None:
    traced.write("ent-vpn", "acme", VPN)
    first = traced.retrieve("acme", "VPN error E-1042")
    second = traced.retrieve("acme", "VPN error E-1042")
    spans = server_spans(exporter, 2)
    assert [s.parent for s in spans] == [None, None]
    ids = [format(s.context.trace_id, "032x") for s in spans if s.context is not None]
    assert [first.trace_id, second.trace_id] == ids
    assert first.trace_id != second.trace_id


def test_a_client_error_is_traced_and_audited_but_is_no_server_error(
    traced: Stack, exporter: InMemorySpanExporter
) -> None:
    traced.write("ent-vpn", "acme", VPN)
    metadata = (*bearer("acme"), ("traceparent", f"00-{TRACE}-{PARENT}-01"))
    with pytest.raises(grpc.RpcError) as err:
        traced.client.Retrieve(pb.RetrieveRequest(query_text="VPN", top_k=999), metadata=metadata)
    assert err.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    (root,) = server_spans(exporter, 1)
    assert root.attributes is not None
    assert root.attributes["rpc.grpc.status_code"] == grpc.StatusCode.INVALID_ARGUMENT.value[0]
    assert root.status.status_code == StatusCode.UNSET
    assert [s.name for s in children(exporter, root)] == ["retrieve.validate"]
    (record,) = [r for r in traced.publisher.on("ragstream.audit") if "status" in r]
    assert (record["status"], record["trace_id"]) == ("failed", TRACE)


def test_a_server_failure_marks_the_call_span_as_an_error(
    traced: Stack, exporter: InMemorySpanExporter
) -> None:
    traced.write("ent-vpn", "acme", VPN)
    traced.store.close()  # the store is gone: UNAVAILABLE
    with pytest.raises(grpc.RpcError) as err:
        traced.retrieve("acme", "VPN")
    assert err.value.code() in (grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.INTERNAL)
    (root,) = server_spans(exporter, 1)
    assert root.status.status_code == StatusCode.ERROR
    failed = [s for s in children(exporter, root) if s.status.status_code == StatusCode.ERROR]
    assert [s.name for s in failed] == ["retrieve.resolve"]


def test_with_tracing_off_the_callers_trace_id_still_reaches_pack_and_audit(
    stack: Stack,
) -> None:
    stack.write("ent-vpn", "acme", VPN)
    metadata = (*bearer("acme"), ("traceparent", f"00-{TRACE}-{PARENT}-01"))
    pack = stack.client.Retrieve(pb.RetrieveRequest(query_text="VPN"), metadata=metadata)
    assert pack.trace_id == TRACE
    assert stack.retrieve("acme", "VPN").trace_id == ""  # no caller trace, no spans
    records = [r for r in stack.publisher.on("ragstream.audit") if "status" in r]
    assert [r["trace_id"] for r in records] == [TRACE, None]
