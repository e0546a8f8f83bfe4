"""Tenants cannot hurt each other, over real gRPC on loopback (issue 29): a flooding tenant is
shed with a retry hint while a quiet one is served, and a token rotates under load without a
failed call (PostgreSQL SoR, qdrant-edge, the real local embedder and ingest path)."""

from __future__ import annotations

import hashlib
import json
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
