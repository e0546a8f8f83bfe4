"""`ragstream dev` (the embedded stack a newcomer runs, on free ports) under a real Prometheus
with the shipped rules: every rule evaluates, the worker's own lag and backlog age are scraped,
and a scripted healthy workload plus a burst of bad client requests fire nothing.

The fault scenarios run against the real-CDC stack (tests/deploy/test_live_prometheus.py),
where the dependencies can be broken one by one; here the point is the stack people start
first. It is this package's shared stack (`running_dev`: one start, not one more for this
module); Prometheus starts beside it here, and its start-up alerts are waited out all the same.
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import grpc
import pytest

from ragcore.grpc_codes import SERVER_ERROR_CODES
from schemas.proto.ragstream.retrieval.v1 import retrieval_pb2 as pb
from schemas.proto.ragstream.retrieval.v1 import retrieval_pb2_grpc as pb_grpc
from tests.deploy.prometheus_live import LivePrometheus, alert_names
from tests.deploy.support import require_tool
from tests.ragdev.test_dev_stack import DevProcess
from tests.ragstream.conftest import RunningDev

pytestmark = [pytest.mark.integration, pytest.mark.slow]

CLIENT_CODES = ("INVALID_ARGUMENT", "UNAUTHENTICATED", "PERMISSION_DENIED")
QUESTIONS = (
    ("acme", "If a client cancels a yearly plan after a few weeks, do they get money back?"),
    ("globex", "how often should the seal of the GX-300 be checked?"),
    ("acme", "what does error E-2113 mean?"),
)


@pytest.fixture(scope="module")
def dev(
    running_dev: RunningDev, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[tuple[DevProcess, LivePrometheus]]:
    process = running_dev.dev
    prometheus = LivePrometheus(
        require_tool("prometheus"),
        tmp_path_factory.mktemp("prometheus-dev"),
        {"ragstream-dev": [f"127.0.0.1:{process.metrics}"]},
    )
    try:
        prometheus.wait_ready()
        # the stack was up before Prometheus: the queries below need its first scrape
        deadline = time.monotonic() + 30
        while not prometheus.query('up{job="ragstream-dev"} == 1'):
            assert time.monotonic() < deadline, prometheus.query("up")
            time.sleep(0.5)
        yield process, prometheus
        _until_this_peer_is_accepted(process)
    finally:
        prometheus.stop()


def _until_this_peer_is_accepted(process: DevProcess, timeout: float = 60.0) -> None:
    """The stack is the package's shared one: the burst of bad clients may have it refuse
    every call from this peer (the failed-authentication throttle, 30 s); the next test must
    not get RESOURCE_EXHAUSTED where it expects its own call's answer."""
    tokens = json.loads(Path(process.data_dir, "dev-tokens.json").read_text())
    tenant, text = QUESTIONS[0]
    deadline = time.monotonic() + timeout
    with grpc.insecure_channel(f"127.0.0.1:{process.grpc}") as channel:
        client = pb_grpc.RetrievalServiceStub(channel)
        while True:
            try:
                _call(client, tenant, text, tokens[tenant])
                return
            except grpc.RpcError as exc:
                if exc.code() != grpc.StatusCode.RESOURCE_EXHAUSTED:
                    raise
                assert time.monotonic() < deadline, f"still throttled after {timeout}s"
                time.sleep(1)


def _call(
    client: pb_grpc.RetrievalServiceStub, tenant: str, text: str, token: str
) -> pb.EvidencePack:
    request = pb.RetrieveRequest(query_text=text, top_k=5, tenant=tenant)
    pack: pb.EvidencePack = client.Retrieve(
        request, metadata=(("authorization", f"Bearer {token}"),), timeout=30
    )
    return pack


def _no_alerts_for(prometheus: LivePrometheus, seconds: float, work: Callable[[], None]) -> None:
    """Run `work` repeatedly for `seconds`, checking that no alert fires."""
    seen: list[dict[str, object]] = []
    began = time.monotonic()
    while time.monotonic() - began < seconds:
        work()
        seen += prometheus.firing()
        time.sleep(0.2)
    assert not seen, seen


def test_dev_stack_under_prometheus_fires_nothing_healthy_or_under_bad_clients(
    dev: tuple[DevProcess, LivePrometheus],
) -> None:
    process, prometheus = dev
    tokens = json.loads(Path(process.data_dir, "dev-tokens.json").read_text())
    channel = grpc.insecure_channel(f"127.0.0.1:{process.grpc}")
    client = pb_grpc.RetrievalServiceStub(channel)
    try:
        # every rule evaluates against the dev stack's series
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            health = prometheus.rule_health()
            if set(health) == set(alert_names()) and set(health.values()) == {"ok"}:
                break
            time.sleep(0.5)
        assert set(health.values()) == {"ok"}, health
        # the worker's own lag and backlog age are scraped, per partition, at 0 when idle
        lag = prometheus.query("ragstream_ingest_consumer_lag_records")
        age = prometheus.query("ragstream_ingest_backlog_age_seconds")
        assert lag and age
        assert {r["metric"]["partition"] for r in lag} >= {"0"}

        # the start-up snapshot is a backfill (the freshness SLO counts it, by design): let it
        # leave the rules' windows before the healthy workload starts
        deadline = time.monotonic() + 90
        while prometheus.alerts():
            assert time.monotonic() < deadline, prometheus.alerts()
            time.sleep(1)

        # healthy: questions and SoR writes through the CLI
        process.cli("sor", "put", "--tenant", "acme", "--id", "sre-1", "--text", "Pager duty.")
        process.cli("sor", "delete", "--tenant", "acme", "--id", "sre-1")

        def questions() -> None:
            for tenant, text in QUESTIONS:
                assert _call(client, tenant, text, tokens[tenant]).status in (
                    pb.RETRIEVAL_STATUS_SUCCESS,
                    pb.RETRIEVAL_STATUS_NO_EVIDENCE,
                    pb.RETRIEVAL_STATUS_IDENTIFIER_MATCH,  # E-2113 below the threshold
                )

        _no_alerts_for(prometheus, 20, questions)

        # a burst of bad client requests: client errors only, no alert
        codes: dict[str, int] = {}

        def bad_clients() -> None:
            for tenant, text, token in (
                ("acme", "", tokens["acme"]),
                ("acme", "refund", "not-a-token"),
                ("globex", "refund", tokens["acme"]),
            ):
                try:
                    _call(client, tenant, text, token)
                except grpc.RpcError as exc:
                    codes[exc.code().name] = codes.get(exc.code().name, 0) + 1

        _no_alerts_for(prometheus, 15, bad_clients)
        # the failed-authentication throttle may shed the rest with RESOURCE_EXHAUSTED
        assert {"INVALID_ARGUMENT", "UNAUTHENTICATED", "PERMISSION_DENIED"} <= set(codes), codes
        assert set(codes) <= {*CLIENT_CODES, "RESOURCE_EXHAUSTED"}, codes
        failed = prometheus.query(
            'sum by (code) (ragstream_retrieve_requests_total{status="FAILED"}) > 0'
        )
        recorded = {r["metric"]["code"] for r in failed}
        assert {"InvalidArgument", "PermissionDenied"} <= recorded
        assert not recorded & set(SERVER_ERROR_CODES), recorded
    finally:
        channel.close()
