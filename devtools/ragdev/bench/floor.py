"""The floor of `ragstream bench retrieve`: what a user calling the engine directly would pay.

A `FloorServicer` answers `RetrievalService.Retrieve` with only the two steps nobody serving a
hybrid query can skip: embed the query with the same local model (`embed_query`), encode its
BM25 query vector and run the same engine hybrid query as Retrieve does (`search_hybrid`,
same collection, tenant filter, `candidate_k` and prefetch limit). No authentication,
validation, exact BM25, fusion, calibration, ranking, SoR verification, evidence pack or
metrics: the reply carries only a status (SUCCESS when the engine found anything) and the two
steps' wall times. It runs in the benchmark's process layouts, so its CPU per request is
measured beside Retrieve's in the same run:

- one process: a plain `grpc.server` on a thread pool, in the benchmark's process, searching
  the store directly (`serve_in_thread`);
- N processes: N `python -m ragdev.bench.floor` processes on one port (SO_REUSEPORT, as
  Retrieve's server processes), each searching the store through a `StoreHost` of the
  benchmark's process and embedding with Retrieve's onnxruntime threads (`FloorProcesses`).
"""

from __future__ import annotations

import pickle
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import grpc

from ragcore.embedders.base import Embedder
from ragcore.embedders.local_onnx import LocalEmbedderConfig, LocalOnnxEmbedder
from ragcore.errors import RagstreamError
from ragcore.sparse import Bm25Encoder
from ragcore.store.base import StoreFilter, VectorStore
from ragcore.store.host import HostedStore, StoreHost, new_host_key
from retrieval_api.grpc_server import server_options
from retrieval_api.processes import free_port, process_cpu_seconds
from retrieval_api.settings import GrpcSettings
from schemas.proto.ragstream.retrieval.v1 import retrieval_pb2 as pb
from schemas.proto.ragstream.retrieval.v1 import retrieval_pb2_grpc as pb_grpc

__all__ = ["FloorProcesses", "FloorServicer", "FloorSpec", "serve_in_thread"]

#: Threads of a floor server's pool: one blocking call per client thread at the highest
#: concurrency the benchmark drives, as Retrieve's own pool.
POOL_THREADS = 16


@dataclass(frozen=True)
class FloorSpec:
    """What a floor server needs: the index and how many candidates Retrieve asks for."""

    collection: str
    tenant: str
    candidate_k: int


class FloorServicer(pb_grpc.RetrievalServiceServicer):
    """Embed + one engine hybrid query per call; nothing else (see the module docstring)."""

    def __init__(
        self, spec: FloorSpec, embedder: Embedder, store: VectorStore, sparse: Bm25Encoder
    ) -> None:
        self._spec = spec
        self._embedder = embedder
        self._store = store
        self._sparse = sparse
        self._filter = StoreFilter(tenant_id=spec.tenant)

    def Retrieve(  # noqa: N802 - the generated base class names it
        self, request: pb.RetrieveRequest, context: grpc.ServicerContext
    ) -> pb.EvidencePack:
        """The engine's hits for the query; only the status and the step times come back."""
        began = time.perf_counter()
        vector = self._embedder.embed_query(request.query_text)
        embedded = time.perf_counter()
        result = self._store.search_hybrid(
            self._spec.collection,
            vector,
            self._sparse.encode_query(request.query_text),
            self._filter,
            limit=self._spec.candidate_k,
            prefetch_limit=self._spec.candidate_k,
        )
        searched = time.perf_counter()
        found = bool(result.dense or result.sparse)
        return pb.EvidencePack(
            status=pb.RETRIEVAL_STATUS_SUCCESS if found else pb.RETRIEVAL_STATUS_NO_EVIDENCE,
            timings_ms={
                "embed": (embedded - began) * 1000,
                "search": (searched - embedded) * 1000,
            },
        )


def _server(
    servicer: FloorServicer, port: int, options: Sequence[tuple[str, int]] = ()
) -> tuple[grpc.Server, int]:
    server = grpc.server(
        ThreadPoolExecutor(POOL_THREADS, thread_name_prefix="floor"), options=list(options)
    )
    pb_grpc.add_RetrievalServiceServicer_to_server(servicer, server)
    bound: int = server.add_insecure_port(f"127.0.0.1:{port}")
    if bound == 0:
        raise RagstreamError(f"the floor server cannot bind 127.0.0.1:{port}")
    return server, bound


def serve_in_thread(
    spec: FloorSpec, embedder: Embedder, store: VectorStore, sparse: Bm25Encoder
) -> tuple[grpc.Server, int]:
    """A started floor server in this process on a free loopback port (stop it when done)."""
    server, port = _server(FloorServicer(spec, embedder, store, sparse), 0)
    server.start()
    return server, port


@dataclass(frozen=True)
class _ChildSpec:
    spec: FloorSpec
    port: int
    store_address: str
    store_key: bytes
    embedder: LocalEmbedderConfig
    options: tuple[tuple[str, int], ...]


class FloorProcesses:
    """`processes` floor servers on one loopback port, searching `store` through a host."""

    def __init__(
        self,
        spec: FloorSpec,
        store: VectorStore,
        *,
        processes: int,
        socket_dir: Path,
        embedder: LocalEmbedderConfig,
        grpc_settings: GrpcSettings,
    ) -> None:
        """`socket_dir`: a private directory for the host's socket; `embedder`: each
        process's local embedder (as Retrieve's: `retrieval_api.processes.serving_settings`);
        `grpc_settings`: Retrieve's, whose connection ageing the processes apply as Retrieve's
        `processes` servers do (without it, a few long-lived clients would load the floor's
        processes unevenly while Retrieve's are evened out)."""
        self._spec = spec
        self._store = store
        self._count = processes
        self._socket = socket_dir / "floor-store.sock"
        self.port = free_port("127.0.0.1")
        self._embedder = embedder
        self._options = tuple(
            server_options(grpc_settings.model_copy(update={"processes": processes}))
        )
        self._host: StoreHost | None = None
        self._children: list[subprocess.Popen[bytes]] = []

    @property
    def options(self) -> tuple[tuple[str, int], ...]:
        """The gRPC channel arguments of every floor server process (Retrieve's ageing)."""
        return self._options

    @property
    def pids(self) -> list[int]:
        """The floor server processes' pids."""
        return [p.pid for p in self._children]

    def cpu_seconds_by_process(self) -> dict[int, float]:
        """User + system CPU seconds of each floor server process so far."""
        return {pid: process_cpu_seconds(pid) for pid in self.pids}

    def start(self) -> None:
        """Host the store, start the processes, wait until each one serves."""
        key = new_host_key()
        self._host = StoreHost(self._store, self._socket, authkey=key)
        self._host.start()
        message = pickle.dumps(
            _ChildSpec(self._spec, self.port, str(self._socket), key, self._embedder, self._options)
        )
        for _ in range(self._count):
            child = subprocess.Popen(
                [sys.executable, "-m", "ragdev.bench.floor"],
                stdin=subprocess.PIPE,
                stdout=subprocess.PIPE,
            )
            assert child.stdin is not None
            child.stdin.write(len(message).to_bytes(8, "big") + message)
            child.stdin.flush()
            self._children.append(child)
        for child in self._children:
            assert child.stdout is not None
            line = child.stdout.readline().strip()
            if line != b"ready":
                self.stop()
                raise RagstreamError(f"a floor server process did not start: {line!r}")

    def stop(self) -> None:
        """Stop the processes and the host (idempotent)."""
        for child in self._children:
            if child.poll() is None:
                child.send_signal(signal.SIGTERM)
        for child in self._children:
            try:
                child.wait(30)
            except subprocess.TimeoutExpired:
                child.kill()
                child.wait()
            for stream in (child.stdin, child.stdout):
                if stream is not None:
                    stream.close()
        self._children.clear()
        if self._host is not None:
            self._host.close()
            self._host = None


def _read_message() -> Any:
    head = sys.stdin.buffer.read(8)
    return pickle.loads(sys.stdin.buffer.read(int.from_bytes(head, "big")))


def main(argv: Sequence[str] | None = None) -> int:
    """One floor server process of `FloorProcesses` (reads its spec on stdin)."""
    child = _read_message()
    if not isinstance(child, _ChildSpec):
        raise SystemExit("ragdev.bench.floor: stdin did not carry a floor spec")
    store = HostedStore(Path(child.store_address), authkey=child.store_key)
    embedder = LocalOnnxEmbedder(child.embedder)
    servicer = FloorServicer(child.spec, embedder, store, Bm25Encoder())
    server, _ = _server(servicer, child.port, child.options)
    stop = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: stop.set())
    server.start()
    sys.stdout.write("ready\n")
    sys.stdout.flush()
    stop.wait()
    server.stop(5).wait()
    store.close()
    embedder.close()
    return 0


if __name__ == "__main__":
    # the imported module's `main`: the spec's class is unpickled by its module name
    import importlib

    sys.exit(importlib.import_module("ragdev.bench.floor").main())
