"""Several Retrieve server processes on one port (`RAGSTREAM_GRPC__PROCESSES`): they answer
exactly as one server does, keep tenants apart, serve changes written after they started
(through the parent's store host), export their metrics summed on one registry, and never
outlive their parent.

Real parts: PostgreSQL SoR, qdrant-edge in the parent, the local embedder in every server
process, gRPC over loopback with a connection per client (the kernel spreads connections over
the processes).
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import signal
import socket
import sqlite3
import subprocess
import sys
import threading
import time
import urllib.request
from pathlib import Path
from typing import Any

import grpc
import pytest
from grpc_health.v1 import health_pb2, health_pb2_grpc
from prometheus_client import CollectorRegistry

from ragcore.embedders.local_onnx import LocalOnnxEmbedder
from ragcore.resources import package_dir
from ragdev.services.postgres import PostgresCluster
from retrieval_api.processes import RetrieveProcesses
from schemas.proto.ragstream.retrieval.v1 import retrieval_pb2 as pb
from schemas.proto.ragstream.retrieval.v1 import retrieval_pb2_grpc as pb_grpc
from tests.processes import alive
from tests.retrieval_api.stack import TOKENS, Stack, bearer
from tests.retrieval_api.test_external_clients import run_grpcurl
from tests.retrieval_api.test_grpc_server import PUMP, REFUND, VPN
from tests.streams.support import eid

pytestmark = pytest.mark.integration

BADGE = (
    "The badge reader B-77 at the loading dock is reset by holding its red button for ten seconds."
)


def _comparable(pack: pb.EvidencePack) -> bytes:
    pack.ClearField("timings_ms")
    for source in pack.sources:
        source.ClearField("retrieved_at")
    return pack.SerializeToString(deterministic=True)


def _channel(target: str) -> grpc.Channel:
    # a subchannel pool of its own: a connection of its own
    return grpc.insecure_channel(target, options=[("grpc.use_local_subchannel_pool", 1)])


def _requests(registry: CollectorRegistry) -> float:
    return sum(
        s.value
        for family in registry.collect()
        if family.name == "ragstream_retrieve_requests"
        for s in family.samples
        if s.name.endswith("_total")
    )


def test_server_processes_answer_as_one_server_does_and_keep_tenants_apart(
    postgres: PostgresCluster,
    tmp_path: Path,
    embedder: LocalOnnxEmbedder,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # started from a directory holding a module named like ours: the children must not import it
    (tmp_path / "retrieval_api").mkdir()
    (tmp_path / "retrieval_api" / "__init__.py").write_text("raise SystemExit('shadowed')\n")
    monkeypatch.chdir(tmp_path)
    stack = Stack(postgres.dsn, tmp_path / "store", embedder, placement="shared")
    group = RetrieveProcesses(stack.app.settings, processes=2, store=stack.store)
    channels: list[grpc.Channel] = []
    try:
        stack.write("ent-c", "acme", VPN)
        stack.write("ent-r", "acme", REFUND)
        stack.write("ent-g", "globex", PUMP)
        # the parent's /metrics registry exists before the processes do (it is served first)
        early = group.metrics_registry()
        assert [(f.name, f.samples[0].value) for f in early.collect()] == [
            ("ragstream_retrieve_server_processes_ready", 0)
        ]
        group.start()
        assert len(set(group.pids)) == 2 and os.getpid() not in group.pids
        target = f"127.0.0.1:{group.port}"
        calls = 0
        for i in range(8):
            channels.append(_channel(target))
            stub = pb_grpc.RetrievalServiceStub(channels[-1])
            for query in (VPN, "E-1042", REFUND, PUMP):
                for caller in ("acme", "globex"):
                    request = pb.RetrieveRequest(query_text=query, request_id=f"r{i}")
                    pack = stub.Retrieve(request, metadata=bearer(caller), timeout=30)
                    calls += 1
                    alone = stack.retrieve(caller, query, request_id=f"r{i}")
                    assert _comparable(pack) == _comparable(alone), (caller, query)
                    seen = {r.entity_id for r in pack.results} | {
                        e.entity_id for e in pack.excluded
                    }
                    mine = {eid("ent-g")} if caller == "globex" else {eid("ent-c"), eid("ent-r")}
                    assert seen <= mine, (caller, query, seen)
        with pytest.raises(grpc.RpcError) as err:
            stub.Retrieve(
                pb.RetrieveRequest(query_text="E-1042", tenant="acme"),
                metadata=bearer("globex"),
                timeout=30,
            )
        assert err.value.code() == grpc.StatusCode.PERMISSION_DENIED
        calls += 1

        # written after the processes started: every one of them finds it through the host
        stack.write("ent-b", "globex", BADGE)
        for channel in channels:
            pack = pb_grpc.RetrievalServiceStub(channel).Retrieve(
                pb.RetrieveRequest(query_text="badge reader B-77"),
                metadata=bearer("globex"),
                timeout=30,
            )
            calls += 1
            assert pack.results and pack.results[0].entity_id == eid("ent-b")

        # one registry sums every process's counters (the refused call is a FAILED request)
        assert _requests(group.metrics_registry()) == calls
        # the registry made before start sums the same files
        assert _requests(early) == calls
    finally:
        for channel in channels:
            channel.close()
        group.stop()
        stack.close()


def _free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port: int = probe.getsockname()[1]
        return port


def _children_of(pid: int) -> list[int]:
    out = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                stat = (entry / "stat").read_text()
            except OSError:
                continue  # exited meanwhile
            if int(stat.rpartition(")")[2].split()[1]) == pid:
                out.append(int(entry.name))
    return out


def _serve(tmp_path: Path, **extra: str) -> tuple[subprocess.Popen[bytes], int, int]:
    """`python -m retrieval_api` with two server processes on an empty embedded store
    (`extra`: more environment)."""
    sor = tmp_path / "sor.sqlite"
    ddl = (package_dir("schemas") / "sql" / "entities.sqlite.sql").read_text(encoding="utf-8")
    with sqlite3.connect(sor) as conn:
        conn.executescript(ddl)
    port, metrics = _free_port(), _free_port()
    env = {
        **os.environ,
        "RAGSTREAM_GRPC__PORT": str(port),
        "RAGSTREAM_GRPC__PROCESSES": "2",
        "RAGSTREAM_METRICS_PORT": str(metrics),
        "RAGSTREAM_STORE__DATA_DIR": str(tmp_path / "data"),
        "RAGSTREAM_SOR__KIND": "sqlite",
        "RAGSTREAM_SOR__SQLITE_PATH": str(sor),
        "RAGSTREAM_PUBLISH_ENABLED": "false",
        "RAGSTREAM_AUTH__TOKENS": json.dumps({"acme": hashlib.sha256(b"t").hexdigest()}),
        **extra,
    }
    parent = subprocess.Popen([sys.executable, "-m", "retrieval_api"], env=env)
    with grpc.insecure_channel(f"127.0.0.1:{port}") as channel:
        health = health_pb2_grpc.HealthStub(channel)
        deadline = time.monotonic() + 90
        while True:
            try:
                answer = health.Check(health_pb2.HealthCheckRequest(), timeout=5)
                if answer.status == health_pb2.HealthCheckResponse.SERVING:
                    break
            except grpc.RpcError:
                pass  # not bound yet
            assert parent.poll() is None, "the server exited"
            assert time.monotonic() < deadline, "not serving in 90 s"
            time.sleep(0.3)
    # health answers SERVING once the first process serves; the other may still be reading
    # its settings (a file the test rewrites next would be read only by that one)
    while _ready_processes(metrics) < 2:
        assert parent.poll() is None, "the server exited"
        assert time.monotonic() < deadline, "not every process ready in 90 s"
        time.sleep(0.2)
    return parent, port, metrics


def _ready_processes(metrics_port: int) -> float:
    """`ragstream_retrieve_server_processes_ready` of the parent's /metrics."""
    text = urllib.request.urlopen(f"http://127.0.0.1:{metrics_port}/metrics", timeout=10).read()
    found = re.search(rb"^ragstream_retrieve_server_processes_ready (\S+)$", text, re.M)
    assert found is not None, "the parent exports no ready-process count"
    return float(found.group(1))


def test_the_entry_point_serves_in_processes_and_stops_them_all_on_sigterm(
    tmp_path: Path,
) -> None:
    parent, _, metrics = _serve(tmp_path)
    try:
        children = _children_of(parent.pid)
        assert len(children) == 2
        text = urllib.request.urlopen(f"http://127.0.0.1:{metrics}/metrics", timeout=10).read()
        assert b'grpc_server_started_total{grpc_method="Check"' in text
        parent.send_signal(signal.SIGTERM)
        assert parent.wait(60) == 0
        assert not any(alive(c) for c in children)
    finally:
        if parent.poll() is None:
            parent.kill()
            parent.wait()


def test_server_processes_do_not_outlive_a_killed_parent(tmp_path: Path) -> None:
    parent, _, _ = _serve(tmp_path)
    children = _children_of(parent.pid)
    assert len(children) == 2
    parent.kill()  # no chance to stop them: their stdin pipe closes with it
    parent.wait()
    deadline = time.monotonic() + 30
    while any(alive(c) for c in children):
        assert time.monotonic() < deadline, "server processes outlived their parent"
        time.sleep(0.2)


def _calls_by_process(group: RetrieveProcesses) -> dict[int, float]:
    return {
        pid: sum(
            s.value
            for family in group.process_metrics(pid)
            if family.name == "ragstream_retrieve_requests"
            for s in family.samples
            if s.name.endswith("_total")
        )
        for pid in group.pids
    }


def _aged_group(stack: Stack, age_s: float) -> RetrieveProcesses:
    grpc_settings = stack.app.settings.grpc.model_copy(
        update={"processes": 2, "max_connection_age_s": age_s, "max_connection_age_grace_s": 5.0}
    )
    settings = stack.app.settings.model_copy(update={"grpc": grpc_settings})
    return RetrieveProcesses(settings, store=stack.store)


def test_aged_connections_spread_a_long_lived_clients_calls_over_the_processes_without_errors(
    postgres: PostgresCluster, tmp_path: Path, embedder: LocalOnnxEmbedder
) -> None:
    """The kernel spreads connections, not calls: with connection ageing (GOAWAY after
    `grpc.max_connection_age_s`) a client's channel reconnects transparently and its calls
    reach both processes; without it, one channel's calls all reach one process."""
    stack = Stack(postgres.dsn, tmp_path / "store", embedder, placement="shared")
    stack.write("ent-c", "acme", VPN)
    aged = _aged_group(stack, 0.3)
    never = _aged_group(stack, 0)
    channels: list[grpc.Channel] = []
    try:
        aged.start()
        never.start()

        # control: one connection for ever -> one process answers every call
        channels.append(_channel(f"127.0.0.1:{never.port}"))
        stub = pb_grpc.RetrievalServiceStub(channels[-1])
        for _ in range(20):
            stub.Retrieve(pb.RetrieveRequest(query_text=VPN), metadata=bearer("acme"), timeout=30)
            time.sleep(0.05)
        assert sorted(_calls_by_process(never).values()) == [0, 20]

        # one long-lived channel, three threads calling over it at once, for ~20 connection
        # ages: every call answered (an aged connection's calls in flight finish, new ones go
        # to the next connection), and both processes answered some
        channels.append(_channel(f"127.0.0.1:{aged.port}"))
        shared = pb_grpc.RetrievalServiceStub(channels[-1])
        errors: list[grpc.RpcError] = []
        answered = [0]
        lock = threading.Lock()

        def caller(client: Any) -> None:
            deadline = time.monotonic() + 6.0  # ~20 connection ages
            while time.monotonic() < deadline:
                try:
                    pack = client.Retrieve(
                        pb.RetrieveRequest(query_text=VPN), metadata=bearer("acme"), timeout=30
                    )
                except grpc.RpcError as exc:
                    with lock:
                        errors.append(exc)
                    continue
                assert pack.results and pack.results[0].entity_id == eid("ent-c")
                with lock:
                    answered[0] += 1

        threads = [threading.Thread(target=caller, args=(shared,)) for _ in range(3)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
        assert [e.code() for e in errors] == []
        by_process = _calls_by_process(aged)
        assert sum(by_process.values()) == answered[0] >= 30
        assert min(by_process.values()) > 0, by_process

        # grpcurl (Go's gRPC client) on a connection that ages between its reflection
        # requests and its call: it reconnects without failing
        fast = _aged_group(stack, 0.02)
        try:
            fast.start()
            for _ in range(3):
                done = run_grpcurl(
                    "-H",
                    f"authorization: Bearer {TOKENS['acme']}",
                    "-d",
                    json.dumps({"query_text": VPN}),
                    f"127.0.0.1:{fast.port}",
                    "ragstream.retrieval.v1.RetrievalService/Retrieve",
                )
                assert done.returncode == 0, done.stderr
                top = json.loads(done.stdout)["results"][0]
                assert top.get("entityId", top.get("entity_id")) == eid("ent-c"), top
        finally:
            fast.stop()
    finally:
        for channel in channels:
            channel.close()
        aged.stop()
        never.stop()
        stack.close()
