"""Several Retrieve server processes on one port, sharing one store.

Why: a Python process runs its Retrieve pipeline under one GIL, and qdrant-edge holds it while
it searches, so one server process uses about one core however many the machine has
(docs/decisions/retrieve-processes.md). `RAGSTREAM_GRPC__PROCESSES=N` runs N server processes
(`retrieval_api.child`) that bind the same port with SO_REUSEPORT: the kernel spreads incoming
connections over them, and each answers its connections' calls from start to end.

The parent process:
- opens the embedded store (qdrant-edge has one opener per data dir) and serves it to the
  children through a `StoreHost` on a private Unix socket; with a Qdrant server each child is
  a client of its own;
- exports the children's metrics on one `/metrics` (prometheus_client's multiprocess mode: each
  child writes its samples to files in a private directory, the parent sums them);
- starts the children, stops them on SIGTERM (each drains like a single server), and stops
  all of them when one dies, so an orchestrator sees the failure and restarts the whole.

Children exit when the parent goes away (their stdin, a pipe from the parent, reaches EOF).
"""

from __future__ import annotations

import glob
import json
import logging
import os
import pickle
import selectors
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import IO

from prometheus_client import CollectorRegistry
from prometheus_client.core import GaugeMetricFamily
from prometheus_client.metrics_core import Metric
from prometheus_client.multiprocess import MultiProcessCollector, mark_process_dead

from ragcore.embedders.local_onnx import LocalEmbedderConfig
from ragcore.errors import ConfigError, RagstreamError
from ragcore.sor.base import SystemOfRecord
from ragcore.store.base import VectorStore
from ragcore.store.host import StoreHost, new_host_key
from ragcore.wiring import build_store, payload_schema
from retrieval_api.settings import RetrieveSettings

__all__ = [
    "ChildSpec",
    "RetrieveProcesses",
    "free_port",
    "process_cpu_seconds",
    "serving_settings",
]

log = logging.getLogger(__name__)

_TICKS = os.sysconf("SC_CLK_TCK")


@dataclass(frozen=True)
class ChildSpec:
    """What a server process needs, handed to it pickled on its stdin (never in its
    environment or on its command line: the store key is a secret)."""

    settings: RetrieveSettings
    #: the store host's socket and key; None: the child builds its store from `settings`
    store_address: str | None
    store_key: bytes | None
    #: a SoR reader to use instead of the one `settings` describe (benchmarks)
    sor: SystemOfRecord | None = None


@dataclass
class _Child:
    process: subprocess.Popen[bytes]
    ready: bool = False


class RetrieveProcesses:
    """`processes` Retrieve server processes on `settings.grpc.port`, and the store they share.

    `store` (an open store of the embedded backend) is hosted for the children as it is and
    stays its owner's; without it the parent opens the embedded store of `settings` itself (a
    Qdrant server needs no host). `sor` replaces the children's SoR reader (it is pickled).
    """

    def __init__(
        self,
        settings: RetrieveSettings,
        *,
        processes: int | None = None,
        store: VectorStore | None = None,
        sor: SystemOfRecord | None = None,
        ready_timeout_s: float = 120.0,
    ) -> None:
        """Prepare (nothing starts before `start`)."""
        self.processes = processes or settings.grpc.processes
        if self.processes < 1:
            raise ConfigError("grpc.processes must be >= 1")
        self._settings = settings
        self._given_store = store
        self._sor = sor
        self._ready_timeout_s = ready_timeout_s
        self._children: list[_Child] = []
        self._owned_store: VectorStore | None = None
        self._host: StoreHost | None = None
        self._dir: Path | None = None
        self.port = 0

    # --- start ------------------------------------------------------------------------------

    def start(self) -> None:
        """Open and host the store (embedded backend), start the children, wait until every
        one serves; on failure everything started is stopped and the error raised."""
        try:
            self._start()
        except BaseException:
            self.stop()
            raise

    def _start(self) -> None:
        self._dir = Path(tempfile.mkdtemp(prefix="ragstream-retrieve-"))  # mode 0700
        Path(self.metrics_dir).mkdir()
        address: str | None = None
        key: bytes | None = None
        store = self._given_store
        if store is None and self._settings.store.backend == "edge":
            store = self._owned_store = build_store(
                self._settings.store, payload_schema(self._settings.plan)
            )
        if store is not None:
            key = new_host_key()
            self._host = StoreHost(store, self._dir / "store.sock", authkey=key)
            self._host.start()
            address = str(self._host.address)
        self.port = self._settings.grpc.port or free_port(self._settings.grpc.host)
        settings = child_settings(self._settings, self.port, self.processes)
        spec = pickle.dumps(ChildSpec(settings, address, key, self._sor))
        env = {**os.environ, "PROMETHEUS_MULTIPROC_DIR": self.metrics_dir}
        for _ in range(self.processes):
            process = subprocess.Popen(
                # -P: the working directory is not put first on sys.path, so a file there
                # named like a module cannot shadow ours
                [sys.executable, "-P", "-m", "retrieval_api.child"],
                stdin=subprocess.PIPE,
                stdout=subprocess.PIPE,
                env=env,
            )
            assert process.stdin is not None
            process.stdin.write(len(spec).to_bytes(8, "big") + spec)
            process.stdin.flush()
            self._children.append(_Child(process))
        self._await_ready()
        log.info(
            "Retrieve serving on %s:%d in %d processes (pids %s)",
            self._settings.grpc.host,
            self.port,
            self.processes,
            ", ".join(str(p) for p in self.pids),
        )

    def _await_ready(self) -> None:
        deadline = time.monotonic() + self._ready_timeout_s
        with selectors.DefaultSelector() as waiting:
            for started in self._children:
                assert started.process.stdout is not None
                waiting.register(started.process.stdout, selectors.EVENT_READ, started)
            while any(not c.ready for c in self._children):
                remaining = deadline - time.monotonic()
                if remaining <= 0:
                    raise RagstreamError(
                        f"Retrieve server processes not ready in {self._ready_timeout_s:g} s"
                    )
                for key, _ in waiting.select(remaining):
                    child: _Child = key.data
                    stdout: IO[bytes] = key.fileobj  # type: ignore[assignment]
                    line = stdout.readline()
                    waiting.unregister(stdout)
                    child.ready = _ready(child, line)

    # --- running ----------------------------------------------------------------------------

    @property
    def ready_processes(self) -> int:
        """Server processes that reported ready (each serves from then on)."""
        return sum(1 for c in self._children if c.ready)

    @property
    def started(self) -> bool:
        """`start` has made the group's private directory (its children may still start)."""
        return self._dir is not None

    @property
    def metrics_dir(self) -> str:
        """Where the server processes write their metrics (prometheus multiprocess mode)."""
        if self._dir is None:
            raise RagstreamError("the Retrieve processes were not started")
        return str(self._dir / "metrics")

    @property
    def pids(self) -> list[int]:
        """The server processes' pids."""
        return [c.process.pid for c in self._children]

    def metrics_registry(self) -> CollectorRegistry:
        """A registry summing every server process's metrics (for the parent's /metrics).

        It may be made and served before `start`: it then exports only that no process is
        ready, so /metrics answers before the processes serve (a probe or a scrape never meets
        a closed port while gRPC already serves)."""
        registry = CollectorRegistry()
        registry.register(_ChildrenCollector(self))
        return registry

    def process_metrics(self, pid: int) -> list[Metric]:
        """The metrics server process `pid` wrote (its share of `metrics_registry`: which
        process answered how many calls)."""
        files = glob.glob(os.path.join(self.metrics_dir, f"*_{pid}.db"))
        return list(MultiProcessCollector.merge(files, accumulate=True))  # type: ignore[no-untyped-call]

    def cpu_seconds(self) -> float:
        """User + system CPU seconds the server processes used so far (Linux /proc)."""
        return sum(process_cpu_seconds(pid) for pid in self.pids)

    def cpu_seconds_by_process(self) -> dict[int, float]:
        """User + system CPU seconds of each server process so far (how evenly the kernel
        spread the connections shows here)."""
        return {pid: process_cpu_seconds(pid) for pid in self.pids}

    def signal(self, sig: signal.Signals) -> None:
        """Send `sig` to every running server process (SIGHUP: reload credentials, quotas)."""
        for child in self._children:
            if child.process.poll() is None:
                child.process.send_signal(sig)

    def wait(self, stop: threading.Event, poll_s: float = 0.5) -> int | None:
        """Block until `stop` is set (None) or a server process exits (its exit code)."""
        while not stop.wait(poll_s):
            for child in self._children:
                code = child.process.poll()
                if code is not None:
                    log.error("Retrieve server process %d exited with %d", child.process.pid, code)
                    return code
        return None

    # --- stop -------------------------------------------------------------------------------

    def stop(self) -> None:
        """SIGTERM every server process (each drains within grpc.grace_s), then close the
        store host and the store the parent opened (idempotent)."""
        for child in self._children:
            if child.process.poll() is None:
                child.process.send_signal(signal.SIGTERM)
        deadline = time.monotonic() + self._settings.grpc.grace_s + 10
        for child in self._children:
            try:
                child.process.wait(max(0.1, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                log.error("Retrieve server process %d did not stop: killed", child.process.pid)
                child.process.kill()
                child.process.wait()
            for stream in (child.process.stdin, child.process.stdout):
                if stream is not None:
                    stream.close()
            if self._dir is not None:
                mark_process_dead(child.process.pid, self.metrics_dir)  # type: ignore[no-untyped-call]
        self._children.clear()
        if self._host is not None:
            self._host.close()
            self._host = None
        if self._owned_store is not None:
            self._owned_store.close()
            self._owned_store = None
        if self._dir is not None:
            shutil.rmtree(self._dir, ignore_errors=True)
            self._dir = None


def process_cpu_seconds(pid: int) -> float:
    """User + system CPU seconds process `pid` used so far (Linux /proc)."""
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rpartition(")")[2].split()
    except OSError as exc:
        raise RagstreamError(f"cannot read the CPU time of process {pid}: {exc}") from exc
    return (int(fields[11]) + int(fields[12])) / _TICKS  # utime, stime


def child_settings(settings: RetrieveSettings, port: int, processes: int) -> RetrieveSettings:
    """A server process's settings: the shared port, the number of processes (it decides the
    default connection age), and, unless configured, local embedders with one onnxruntime
    thread (`serving_settings`)."""
    grpc_settings = settings.grpc.model_copy(update={"port": port, "processes": processes})
    update = {"grpc": grpc_settings}
    return serving_settings(settings.model_copy(update=update))


#: onnxruntime intra-op threads of a Retrieve server's local embedders unless configured.
QUERY_EMBEDDER_THREADS = 1


def serving_settings(settings: RetrieveSettings) -> RetrieveSettings:
    """The settings a Retrieve server runs with: a local embedder without configured
    intra-op threads gets `QUERY_EMBEDDER_THREADS` (one). A query is a few tokens: a second
    thread hands work back and forth instead of sharing it, and concurrent requests (or
    server processes) already keep the cores busy. Measured on 2 cores, 13-token queries:
    4.9 ms of CPU per embedding with one thread against 7.1 ms with one per core
    (docs/decisions/cpu-on-the-hot-paths.md)."""
    update: dict[str, object] = {}
    for field in ("embedder", "next_embedder"):
        config = getattr(settings, field)
        if isinstance(config, LocalEmbedderConfig) and config.intra_op_threads is None:
            update[field] = config.model_copy(update={"intra_op_threads": QUERY_EMBEDDER_THREADS})
    return settings.model_copy(update=update) if update else settings


def _ready(child: _Child, line: bytes) -> bool:
    """The child's first line: {"ready": port} or {"error": code, "message": text}."""
    try:
        doc = json.loads(line) if line else {}
    except json.JSONDecodeError:
        doc = {}
    if "ready" in doc:
        return True
    child.process.wait(10)
    if "error" in doc:
        raise RagstreamError(
            f"a Retrieve server process could not start: {doc['message']}", code=str(doc["error"])
        )
    raise RagstreamError(
        f"a Retrieve server process exited with {child.process.returncode} before serving"
        " (its log is above)"
    )


def free_port(host: str) -> int:
    """A port free on `host` now (for port 0: the children must all bind the same one)."""
    with socket.socket(socket.AF_INET6 if ":" in host else socket.AF_INET) as probe:
        probe.bind((host, 0))
        port: int = probe.getsockname()[1]
        return port


class _ChildrenCollector:
    """The server processes' metric files summed at each collection (none before `start`),
    and how many of them are ready."""

    def __init__(self, group: RetrieveProcesses) -> None:
        self._group = group

    def collect(self) -> Iterator[Metric]:
        """`ragstream_retrieve_server_processes_ready`, then every metric the server processes
        wrote, summed over them."""
        yield GaugeMetricFamily(
            "ragstream_retrieve_server_processes_ready",
            "Server processes of this Retrieve that answer calls (gRPC health answers SERVING "
            "as soon as the first one does).",
            value=self._group.ready_processes,
        )
        if not self._group.started:
            return
        files = glob.glob(os.path.join(self._group.metrics_dir, "*.db"))
        yield from MultiProcessCollector.merge(files, accumulate=True)  # type: ignore[no-untyped-call]
