"""What Retrieve's gRPC layer costs, asyncio server against a synchronous one (issue 28).

Retrieve serves with `grpc.aio` (`retrieval_api.grpc_server.RetrieveServer`): the call is
authenticated, admitted and validated on the event loop, then the pipeline runs in a worker
thread (`run_in_executor`) and the answer goes back through the loop. A plain `grpc.server`
runs each call start to end in one pool thread, as the benchmark's floor does. This tool
measures the difference with a stand-in pipeline that burns `--work-ms` of CPU and returns a
fixed evidence pack (5 results, 7 exclusions, timings: the size of a real one), so nothing
but the serving layer differs:

- `aio`: the real `RetrieveServer` (metrics and tracing interceptors, authentication,
  validation, admission, the thread hop, health and reflection registered);
- `sync`: a `grpc.server` on a thread pool whose handler authenticates, validates and admits
  the call with the same classes, then runs the stand-in in the same thread (no interceptors:
  a lower bound of a synchronous server's cost).

Each variant runs in its own process; the benchmark's load generator (`ragdev.bench.loadgen`)
sends `--calls` calls per round at `--concurrency`, rounds alternate between the variants (a
first round warms up), and the server process's CPU (user + system) per call is reported for
every round.

Run: `python -m ragdev.bench.grpc_overhead --calls 300 --concurrency 1 --work-ms 10`.
"""

from __future__ import annotations

import argparse
import asyncio
import hashlib
import json
import os
import subprocess
import sys
import tempfile
import time
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import grpc
from prometheus_client import CollectorRegistry

from ragcore.tracing import Tracing
from ragdev.bench.machine import machine_info
from retrieval_api.admission import AdmissionSettings, QuotaBook, TenantAdmission, TenantQuota
from retrieval_api.auth import Authenticator
from retrieval_api.grpc_server import RetrieveServer
from retrieval_api.pipeline_settings import RetrievalConfig
from retrieval_api.processes import process_cpu_seconds
from retrieval_api.settings import AuthSettings, GrpcSettings
from retrieval_api.validate import ValidatedRequest, validate_request
from schemas.proto.ragstream.retrieval.v1 import retrieval_pb2 as pb
from schemas.proto.ragstream.retrieval.v1 import retrieval_pb2_grpc as pb_grpc

__all__ = ["VARIANTS", "main", "stand_in_pack"]

TOKEN = "overhead-token"
TENANT = "overhead"
VARIANTS = ("aio", "sync")
_TEXT = " ".join(["the pump's seal is replaced when the pressure drops below the limit"] * 5)


def stand_in_pack() -> pb.EvidencePack:
    """An evidence pack of a real one's size: 5 results with scores, 5 sources, 7 exclusions."""
    pack = pb.EvidencePack(
        request_id="00000000-0000-4000-8000-000000000000",
        tenant=TENANT,
        index_name="rag__overhead__v1",
        index_version=1,
        embedding_model_version="all-MiniLM-L6-v2@onnx-int8-1.0.0",
        similarity_metric="cosine",
        top_k_requested=5,
        results_returned=5,
        order_by="fused",
        status=pb.RETRIEVAL_STATUS_SUCCESS,
    )
    for i in range(5):
        result = pack.results.add(
            rank=i + 1,
            chunk_id=f"e{i}:chunk:0",
            entity_id=f"e{i}",
            entity_type="doc",
            title=f"Title {i}",
            text=_TEXT,
            source_hash="ab" * 32,
            source_reference=f"entities/e{i}",
            text_tokens=80,
        )
        scores = result.scores
        scores.dense, scores.sparse, scores.fused = 0.5, 3.2, 0.03
        scores.final = scores.similarity = scores.evidence = scores.order = 0.7
        result.locator.char_end = len(_TEXT)
        pack.sources.add(
            entity_id=f"e{i}", entity_type="doc", source_hash="ab" * 32, chunk_id=result.chunk_id
        )
    for i in range(7):
        pack.excluded.add(chunk_id=f"x{i}:chunk:0", entity_id=f"x{i}", score=0.1)
    for stage in ("resolve", "embed", "search", "rank", "verify", "evidence", "total"):
        pack.timings_ms[stage] = 1.0
    return pack


class _StandIn:
    """What the servicer uses of a `Retriever`: burns `work_s` of CPU, returns the pack."""

    def __init__(self, work_s: float) -> None:
        self.config = RetrievalConfig()
        self.tracing = Tracing.off()
        self._work_s = work_s
        self._pack = stand_in_pack()

    def retrieve(self, request: ValidatedRequest, deadline: float | None = None) -> pb.EvidencePack:
        end = time.thread_time() + self._work_s
        while time.thread_time() < end:
            sum(range(200))
        out = pb.EvidencePack()
        out.CopyFrom(self._pack)
        return out

    def record_failure(self, *args: Any, **kwargs: Any) -> None:
        raise AssertionError("the stand-in's calls all succeed")


def _auth(registry: CollectorRegistry) -> Authenticator:
    digest = hashlib.sha256(TOKEN.encode()).hexdigest()
    return Authenticator(AuthSettings(tokens={TENANT: digest}), registry)


def _admission(registry: CollectorRegistry) -> TenantAdmission:
    quotas = QuotaBook(default=TenantQuota(concurrency=None))
    return TenantAdmission(AdmissionSettings(quotas=quotas), registry)


def _serve_aio(work_s: float) -> None:
    registry = CollectorRegistry()
    stand_in = _StandIn(work_s)
    server = RetrieveServer(
        GrpcSettings(host="127.0.0.1", port=0),
        retriever=stand_in,  # type: ignore[arg-type]  # the servicer's use of a Retriever
        auth=_auth(registry),
        registry=registry,
        health_check=lambda: None,
        admission=_admission(registry),
    )

    async def serve() -> None:
        await server.start()
        _ready(server.port)
        await asyncio.get_running_loop().run_in_executor(None, sys.stdin.read)
        await server.stop()

    asyncio.run(serve())


class _SyncServicer(pb_grpc.RetrievalServiceServicer):
    def __init__(self, work_s: float) -> None:
        registry = CollectorRegistry()
        self._stand_in = _StandIn(work_s)
        self._auth = _auth(registry)
        self._admission = _admission(registry)

    def Retrieve(  # noqa: N802 - the generated base class names it
        self, request: pb.RetrieveRequest, context: grpc.ServicerContext
    ) -> pb.EvidencePack:
        tenant = self._auth.tenant_of(context)
        validated = validate_request(request, self._stand_in.config, tenant)
        remaining = context.time_remaining()
        deadline = time.monotonic() + remaining if remaining is not None else None
        with self._admission.admit(tenant):
            return self._stand_in.retrieve(validated, deadline)


def _serve_sync(work_s: float) -> None:
    server = grpc.server(ThreadPoolExecutor(16, thread_name_prefix="retrieve"))
    pb_grpc.add_RetrievalServiceServicer_to_server(_SyncServicer(work_s), server)
    port: int = server.add_insecure_port("127.0.0.1:0")
    server.start()
    _ready(port)
    sys.stdin.read()
    server.stop(1).wait()


def _ready(port: int) -> None:
    sys.stdout.write(f"{port}\n")
    sys.stdout.flush()


def _drive(port: int, path: Path, concurrency: int) -> dict[str, Any]:
    done = subprocess.run(
        [
            sys.executable,
            "-m",
            "ragdev.bench.loadgen",
            "--target",
            f"127.0.0.1:{port}",
            "--token",
            TOKEN,
            "--concurrency",
            str(concurrency),
            str(path),
        ],
        capture_output=True,
        text=True,
        check=True,
    )
    doc: dict[str, Any] = json.loads(done.stdout)
    return doc


def run(*, calls: int, concurrency: int, work_ms: float, rounds: int) -> dict[str, Any]:
    """Server CPU per call of each variant, `rounds` measured rounds each (see the docstring)."""
    load_before = os.getloadavg()
    servers: dict[str, tuple[subprocess.Popen[str], int]] = {}
    cpu_ms: dict[str, list[float]] = {v: [] for v in VARIANTS}
    with tempfile.TemporaryDirectory(prefix="ragstream-overhead-") as tmp:
        path = Path(tmp) / "queries.json"
        path.write_text(json.dumps([f"how is seal {i} replaced" for i in range(calls)]))
        try:
            for variant in VARIANTS:
                process = subprocess.Popen(
                    [
                        sys.executable,
                        "-m",
                        "ragdev.bench.grpc_overhead",
                        "--serve",
                        variant,
                        "--work-ms",
                        str(work_ms),
                    ],
                    stdin=subprocess.PIPE,
                    stdout=subprocess.PIPE,
                    text=True,
                )
                assert process.stdout is not None
                servers[variant] = (process, int(process.stdout.readline()))
            for n in range(rounds + 1):
                for variant in VARIANTS if n % 2 == 0 else reversed(VARIANTS):
                    process, port = servers[variant]
                    before = process_cpu_seconds(process.pid)
                    doc = _drive(port, path, concurrency)
                    used = process_cpu_seconds(process.pid) - before
                    statuses = {s["status"] for s in doc["samples"]}
                    if statuses != {"SUCCESS"}:
                        raise RuntimeError(f"{variant}: calls failed: {statuses}")
                    if n > 0:  # the first round warms up
                        cpu_ms[variant].append(round(used / calls * 1000, 3))
        finally:
            for process, _ in servers.values():
                if process.stdin is not None:
                    process.stdin.close()
                process.wait(30)
    return {
        "what": "server CPU per call (ms) of the gRPC layer around a stand-in pipeline that "
        f"burns {work_ms:g} ms of CPU: aio = RetrieveServer, sync = grpc.server + thread pool "
        "with authentication, validation and admission (see ragdev.bench.grpc_overhead)",
        "machine": machine_info(load_before, os.getloadavg(), ("grpcio",)),
        "calls_per_round": calls,
        "concurrency": concurrency,
        "cpu_ms_per_call": cpu_ms,
        "mean_aio_minus_sync_ms": round(
            sum(cpu_ms["aio"]) / rounds - sum(cpu_ms["sync"]) / rounds, 3
        ),
    }


def main(argv: Sequence[str] | None = None) -> int:
    """Command line: print the report as JSON (or serve one variant, for `run`)."""
    parser = argparse.ArgumentParser(description=(__doc__ or "").split("\n\n")[0])
    parser.add_argument("--calls", type=int, default=300)
    parser.add_argument("--concurrency", type=int, default=1)
    parser.add_argument("--work-ms", type=float, default=10.0)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--serve", choices=VARIANTS, default=None, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.serve == "aio":
        _serve_aio(args.work_ms / 1000)
        return 0
    if args.serve == "sync":
        _serve_sync(args.work_ms / 1000)
        return 0
    report = run(
        calls=args.calls, concurrency=args.concurrency, work_ms=args.work_ms, rounds=args.rounds
    )
    json.dump(report, sys.stdout, indent=2)
    sys.stdout.write("\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
