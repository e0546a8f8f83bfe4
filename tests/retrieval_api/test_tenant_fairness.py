"""Tenants cannot hurt each other, over real gRPC on loopback (issues 29 and 41): a flooding
tenant is shed with a retry hint while a quiet one is served, a client in another process that
ignores the hints has its refusals deferred, a refused call is neither validated nor audited,
and a token rotates under load without a failed call (PostgreSQL SoR, qdrant-edge, the real
local embedder and ingest path)."""

from __future__ import annotations

import hashlib
import json
import subprocess
import sys
import threading
import time
from collections import Counter
from collections.abc import Callable
from pathlib import Path

import grpc
import pytest

from ragcore.embedders.local_onnx import LocalOnnxEmbedder
from ragdev.services.postgres import PostgresCluster
from retrieval_api.admission import AdmissionSettings, QuotaBook, TenantQuota
from retrieval_api.settings import AuthSettings
from schemas.proto.ragstream.retrieval.v1 import retrieval_pb2 as pb
from tests.retrieval_api.stack import TOKENS, Stack, bearer

pytestmark = pytest.mark.integration

PUMP = "The centrifugal pump P-200 must be primed before start-up: open the vent valve first."
VPN = "To connect to the corporate VPN, install the client and sign in with your SSO account."


def sha(token: str) -> str:
    return hashlib.sha256(token.encode()).hexdigest()


def hammer(
    stack: Stack, metadata: Callable[[], tuple[tuple[str, str], ...]], stop: threading.Event
) -> tuple[Counter[str], list[tuple[tuple[str, str], ...]]]:
    """Call Retrieve back to back until `stop`; outcomes by status code, and the trailers of
    the refused calls."""
    outcomes: Counter[str] = Counter()
    trailers: list[tuple[tuple[str, str], ...]] = []
    while not stop.is_set():
        try:
            stack.client.Retrieve(
                pb.RetrieveRequest(query_text="how do I prime the pump?"),
                metadata=metadata(),
                timeout=30,
            )
        except grpc.RpcError as err:
            assert isinstance(err, grpc.Call)
            outcomes[err.code().name] += 1
            trailers.append(tuple(err.trailing_metadata() or ()))
        else:
            outcomes["OK"] += 1
    return outcomes, trailers


def test_a_flooding_tenant_is_shed_with_a_retry_hint_while_a_quiet_tenant_is_served(
    postgres: PostgresCluster, tmp_path: Path, embedder: LocalOnnxEmbedder
) -> None:
    quotas = QuotaBook(
        default=TenantQuota(concurrency=4),
        tenants={"acme": TenantQuota(concurrency=1, tenant_class="bulk")},
    )
    stack = Stack(
        postgres.dsn, tmp_path / "store", embedder, admission=AdmissionSettings(quotas=quotas)
    )
    try:
        stack.write("ent-a", "acme", PUMP)
        stack.write("ent-g", "globex", VPN)
        stop = threading.Event()
        results: list[tuple[Counter[str], list[tuple[tuple[str, str], ...]]]] = []
        lock = threading.Lock()

        def flood() -> None:
            outcome = hammer(stack, lambda: bearer("acme"), stop)
            with lock:
                results.append(outcome)

        threads = [threading.Thread(target=flood) for _ in range(6)]
        for thread in threads:
            thread.start()
        time.sleep(0.5)
        quiet = [stack.retrieve("globex", "how do I connect to the VPN?") for _ in range(10)]
        stop.set()
        for thread in threads:
            thread.join(30)
        assert all(p.status == pb.RETRIEVAL_STATUS_SUCCESS for p in quiet)
        flooded: Counter[str] = sum((r[0] for r in results), Counter())
        assert flooded["OK"] > 0 and flooded["RESOURCE_EXHAUSTED"] > 0, flooded
        assert set(flooded) == {"OK", "RESOURCE_EXHAUSTED"}
        trailer = dict(next(t for r in results for t in r[1]))
        assert trailer["ragstream-error-code"] == "RESOURCE_EXHAUSTED"
        assert int(trailer["grpc-retry-pushback-ms"]) >= 1
        assert trailer["retry-after-ms"] == trailer["grpc-retry-pushback-ms"]
        value = stack.registry.get_sample_value
        refused = {"tenant_class": "bulk", "outcome": "concurrency"}
        assert value("ragstream_retrieve_admission_total", refused) == flooded["RESOURCE_EXHAUSTED"]
        quiet_ok = {"tenant_class": "default", "outcome": "admitted"}
        assert value("ragstream_retrieve_admission_total", quiet_ok) == 10
        quiet_refused = {**quiet_ok, "outcome": "concurrency"}
        assert value("ragstream_retrieve_admission_total", quiet_refused) is None
        # shed calls are not audited (a flood would flood the audit topic)
        audited = [r for r in stack.publisher.on("ragstream.audit") if "status" in r]
        assert len(audited) == flooded["OK"] + 10 + 0
    finally:
        stack.close()


def test_a_client_ignoring_the_retry_hints_has_its_refusals_deferred_while_a_quiet_tenant_is_served(
    postgres: PostgresCluster, tmp_path: Path, embedder: LocalOnnxEmbedder
) -> None:
    callers, defer_s = 40, 0.5
    quotas = QuotaBook(
        default=TenantQuota(concurrency=4),
        tenants={"acme": TenantQuota(concurrency=1, requests_per_s=5, tenant_class="bulk")},
    )
    admission = AdmissionSettings(quotas=quotas, defer_s=defer_s, defer_grace=2)
    stack = Stack(postgres.dsn, tmp_path / "store", embedder, admission=admission)
    try:
        stack.write("ent-a", "acme", PUMP)
        stack.write("ent-g", "globex", VPN)
        queries = tmp_path / "flood.json"
        queries.write_text(json.dumps(["how do I prime the pump?", "P-200 vent valve"]))
        # the flooder: another process, an asyncio client retrying every refusal at once
        flooder = subprocess.Popen(
            [
                sys.executable,
                "-m",
                "ragdev.bench.loadgen",
                "--flood",
                "--asyncio",
                "--ignore-retry-hint",
                "--target",
                stack.target,
                "--token",
                TOKENS["acme"],
                "--concurrency",
                str(callers),
                "--connections",
                "4",
                str(queries),
            ],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )

        def deferred_so_far() -> float:
            labels = {"tenant_class": "bulk", "outcome": "deferred"}
            found = stack.registry.get_sample_value(
                "ragstream_retrieve_deferred_refusals_total", labels
            )
            return found or 0.0

        def waiting_for(count: float) -> None:
            # the flood's progress, not a fixed time: on a loaded machine the flooder process
            # took so long to start that a fixed 1.5 s left it 3 finished refusals (CI)
            deadline = time.monotonic() + 60
            while deferred_so_far() < count:
                assert flooder.poll() is None, flooder.communicate()[1][-2000:]
                assert time.monotonic() < deadline, f"the flood is stuck at {deferred_so_far()}"
                time.sleep(0.05)

        try:
            waiting_for(callers)  # under way, its callers deferred
            quiet = [stack.retrieve("globex", "how do I connect to the VPN?") for _ in range(10)]
            waiting_for(deferred_so_far() + 2 * callers)  # two more rounds finished after them
            out, err = flooder.communicate("", timeout=60)
        finally:
            if flooder.poll() is None:
                flooder.kill()
                flooder.wait()
        assert flooder.returncode == 0, err[-2000:]
        flood = json.loads(out)
        assert all(p.status == pb.RETRIEVAL_STATUS_SUCCESS for p in quiet)
        statuses = flood["statuses"]
        assert set(statuses) <= {"OK", "GRPC_RESOURCE_EXHAUSTED"}, statuses
        value = stack.registry.get_sample_value

        def admitted(tenant_class: str, outcome: str) -> float:
            labels = {"tenant_class": tenant_class, "outcome": outcome}
            return value("ragstream_retrieve_admission_total", labels) or 0.0

        def deferrals(tenant_class: str, outcome: str) -> float:
            labels = {"tenant_class": tenant_class, "outcome": outcome}
            return value("ragstream_retrieve_deferred_refusals_total", labels) or 0.0

        refused = sum(admitted("bulk", r) for r in ("rate", "concurrency", "overload"))
        deferred = deferrals("bulk", "deferred")
        # nearly every refusal was deferred: only the grace at the start of a bout (and
        # after a caller happened to wait out its hint) was answered at once
        assert refused >= callers and deferred >= 0.7 * refused, (refused, deferred)
        assert deferrals("bulk", "bound") == 0
        # so each caller made about one refused call per deferral (0.5-1.5 x defer_s), not
        # one per round trip: the refused calls are bounded by what the callers could make
        wall = flood["wall_s"]
        assert statuses.get("GRPC_RESOURCE_EXHAUSTED", 0) <= callers * (wall / (0.5 * defer_s) + 1)
        slow = [s for s in flood["refused_latency_s"] if s >= 0.5 * defer_s]
        assert len(slow) >= 0.5 * len(flood["refused_latency_s"])
        # the quiet tenant was never refused nor deferred
        assert admitted("default", "admitted") == 10
        assert sum(admitted("default", r) for r in ("rate", "concurrency", "overload")) == 0
        assert deferrals("default", "deferred") == 0
        # refused calls are not audited; every record names its tenant for the publisher
        audited = [r for r in stack.publisher.on("ragstream.audit") if "status" in r]
        assert len(audited) == admitted("bulk", "admitted") + 10
        assert {r["tenant"] for r in audited} == {"acme", "globex"}
        for (_, _, record), tenant in zip(
            stack.publisher.records, stack.publisher.tenants, strict=True
        ):
            assert record["tenant"] == tenant
    finally:
        stack.close()


def test_admission_comes_before_validation_and_a_refused_call_is_not_audited(
    postgres: PostgresCluster, tmp_path: Path, embedder: LocalOnnxEmbedder
) -> None:
    # one call per 100 s: the first call takes the token, the others are refused
    quotas = QuotaBook(tenants={"acme": TenantQuota(requests_per_s=0.01, burst=1)})
    stack = Stack(
        postgres.dsn, tmp_path / "store", embedder, admission=AdmissionSettings(quotas=quotas)
    )
    try:
        stack.write("ent-a", "acme", PUMP)
        invalid = pb.RetrieveRequest(query_text="pump", top_k=999)
        codes = []
        for request in (invalid, pb.RetrieveRequest(query_text="pump"), invalid):
            with pytest.raises(grpc.RpcError) as err:
                stack.client.Retrieve(request, metadata=bearer("acme"), timeout=30)
            codes.append(err.value.code())
        # the invalid call was admitted (it spent the token) and refused by validation; the
        # next invalid one is refused by admission before anything looks at it
        assert codes == [
            grpc.StatusCode.INVALID_ARGUMENT,
            grpc.StatusCode.RESOURCE_EXHAUSTED,
            grpc.StatusCode.RESOURCE_EXHAUSTED,
        ]
        value = stack.registry.get_sample_value
        labels = {"tenant_class": "default", "outcome": "admitted"}
        assert value("ragstream_retrieve_admission_total", labels) == 1
        assert value("ragstream_retrieve_admission_total", {**labels, "outcome": "rate"}) == 2
        (audited,) = [r for r in stack.publisher.on("ragstream.audit") if "status" in r]
        assert (audited["status"], audited["error_code"]) == ("failed", "TOP_K_OUT_OF_RANGE")
    finally:
        stack.close()


def test_a_token_rotates_under_load_without_a_failed_call(
    postgres: PostgresCluster, tmp_path: Path, embedder: LocalOnnxEmbedder
) -> None:
    tokens = tmp_path / "tokens.json"
    tokens.write_text(json.dumps({"acme": sha("acme-old"), "globex": sha(TOKENS["globex"])}))
    auth = AuthSettings(tokens_file=tokens, reload_interval_s=0.1)
    stack = Stack(postgres.dsn, tmp_path / "store", embedder, auth=auth)
    try:
        stack.write("ent-a", "acme", PUMP)
        current = ["acme-old"]
        stop = threading.Event()
        outcomes: list[Counter[str]] = []

        def load() -> None:
            metadata = lambda: (("authorization", f"Bearer {current[0]}"),)  # noqa: E731
            outcomes.append(hammer(stack, metadata, stop)[0])

        threads = [threading.Thread(target=load) for _ in range(3)]
        for thread in threads:
            thread.start()
        reloads = stack.registry.get_sample_value
        ok = {"source": "credentials", "outcome": "ok"}

        def rewrite(content: dict[str, object]) -> None:
            before = reloads("ragstream_retrieve_config_reloads_total", ok) or 0
            tokens.write_text(json.dumps(content))
            deadline = time.monotonic() + 10
            while (reloads("ragstream_retrieve_config_reloads_total", ok) or 0) <= before:
                assert time.monotonic() < deadline, "the tokens file was not reloaded"
                time.sleep(0.05)

        time.sleep(0.5)
        # 1. both tokens valid; 2. the clients move to the new one; 3. the old one is dropped
        rewrite({"acme": [sha("acme-old"), sha("acme-new")], "globex": sha(TOKENS["globex"])})
        time.sleep(0.5)
        current[0] = "acme-new"
        time.sleep(0.5)
        rewrite({"acme": sha("acme-new"), "globex": sha(TOKENS["globex"])})
        time.sleep(0.5)
        stop.set()
        for thread in threads:
            thread.join(30)
        total: Counter[str] = sum(outcomes, Counter())
        assert set(total) == {"OK"} and total["OK"] >= 10, total
        with pytest.raises(grpc.RpcError) as err:
            stack.client.Retrieve(
                pb.RetrieveRequest(query_text="pump"),
                metadata=(("authorization", "Bearer acme-old"),),
                timeout=10,
            )
        assert err.value.code() == grpc.StatusCode.UNAUTHENTICATED
    finally:
        stack.close()
