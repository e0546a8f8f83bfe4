"""Where Retrieve's CPU goes outside its stages, by process and thread (issue 28).

`ragstream bench retrieve` reports a Retrieve server's CPU per request and the CPU of each
stage's thread (`ragstream_retrieve_stage_cpu_seconds_total`); the rest ("outside the stages")
mixes the gRPC server, the thread hop, interceptors, admission and, with several server
processes, the process hosting the store (searches and pickling). This tool splits it: it
serves a data dir built by `ragstream bench retrieve --data-dir DIR` (or
`ragdev.bench.profile_retrieve`) with `RetrieveProcesses` (2 server processes, this process
hosting the store, as the benchmark does), or with the floor's servers (`--floor`), drives
`--queries` calls through the benchmark's load generator, and reads each thread's CPU
(user + system, `/proc/PID/task/TID/stat`, by thread id; what threads that ended meanwhile
used is the process total less its live threads, `EXITED`) before and after: CPU per request
by process role
(server process, store host) and thread (the asyncio loop is the main thread of a server
process; pool threads run the pipeline; qdrant-edge's search threads are `edge-search-N`).
With `--py-spy PREFIX` it also records each server process with py-spy (the thread holding
the GIL only, per thread; 200 Hz): a flame graph (`PREFIX-pN.svg`) and the collapsed stacks
(`PREFIX-pN.txt`, summarized in the report as `ragdev.bench.profile_retrieve` does).

Run: `python -m ragdev.bench.retrieve_threads --data-dir DIR --queries 300 [--floor]`.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import signal
import subprocess
import sys
import tempfile
import time
from collections import Counter
from collections.abc import Iterator, Sequence
from contextlib import ExitStack, contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
from prometheus_client import CollectorRegistry

from ragcore.errors import ConfigError
from ragcore.plan import PlanConfig
from ragcore.store.edge import EdgeStore
from ragcore.store.registry import FileIndexRegistry
from ragcore.wiring import payload_schema
from ragdev.bench.floor import FloorProcesses, FloorSpec
from ragdev.bench.machine import machine_info
from ragdev.bench.profile_retrieve import _py_spy, summarize
from ragdev.bench.retrieve import (
    TENANT,
    WINDOW,
    _content_words,
    _drive,
    _local,
    _Prose,
    _questions,
    _sentences,
    _Server,
    server_settings,
)
from retrieval_api.processes import RetrieveProcesses, process_cpu_seconds, serving_settings

__all__ = ["EXITED", "ThreadCpu", "cpu_used", "main", "thread_cpu"]

log = logging.getLogger(__name__)

_TICKS = os.sysconf("SC_CLK_TCK")


#: The key of the CPU of threads that ended between two readings (`cpu_used`).
EXITED = "(exited threads)"


@dataclass(frozen=True)
class ThreadCpu:
    """One reading of a process's CPU: its total (user + system, threads that ended
    included, as the kernel keeps it) and each live thread's, by thread id."""

    total: float
    threads: dict[int, tuple[str, float]]


def thread_cpu(pid: int) -> ThreadCpu:
    """User + system CPU seconds of process `pid` and of each of its live threads (the main
    thread is named `main`)."""
    threads: dict[int, tuple[str, float]] = {}
    total = process_cpu_seconds(pid)
    for tid in os.listdir(f"/proc/{pid}/task"):
        try:
            name = Path(f"/proc/{pid}/task/{tid}/comm").read_text(encoding="utf-8").strip()
            stat = Path(f"/proc/{pid}/task/{tid}/stat").read_text(encoding="utf-8")
        except OSError:
            continue  # the thread ended between the listing and the read
        # fields after the name (which may hold spaces): utime and stime are the 12th/13th
        fields = stat[stat.rindex(")") + 2 :].split()
        seconds = (int(fields[11]) + int(fields[12])) / _TICKS
        threads[int(tid)] = ("main" if int(tid) == pid else name, seconds)
    return ThreadCpu(total, threads)


def cpu_used(before: ThreadCpu, after: ThreadCpu) -> dict[str, float]:
    """CPU seconds used between two readings, summed by thread name, by thread id: a thread
    that started in between counts from zero, and what threads that ended in between used
    (the process total less its live threads) is `EXITED`. qdrant-edge's search threads come
    and go: summing by name alone lost the CPU of a thread that ended, and a new thread of an
    old name was set against the old one's time."""
    out: dict[str, float] = {}
    for tid, (name, seconds) in after.threads.items():
        start = before.threads.get(tid)
        used = seconds - (start[1] if start is not None and start[0] == name else 0.0)
        out[name] = out.get(name, 0.0) + used
    # read the process total first and its threads after: a thread may gain a tick
    # between the two reads, so a negative remainder within a tick per thread is noise
    exited = (after.total - before.total) - sum(out.values())
    if exited > 0:
        out[EXITED] = exited
    return out


@contextmanager
def _servers(
    root: Path, floor: bool, tmp: Path
) -> Iterator[tuple[int, list[int], CollectorRegistry | None]]:
    """The port, the server processes' pids and their metrics (None for the floor) of 2
    Retrieve (or floor) server processes over the data dir, this process hosting the store."""
    plan = PlanConfig()
    settings = server_settings(root, plan)
    store = EdgeStore(root / "store", schema=payload_schema(plan))
    try:
        servers: FloorProcesses | RetrieveProcesses
        if floor:
            index = FileIndexRegistry(root / "store", store).lookup(TENANT, None)
            retrieval = settings.retrieval
            spec = FloorSpec(
                index.collection, TENANT, retrieval.candidate_k(retrieval.default_top_k)
            )
            servers = FloorProcesses(
                spec,
                store,
                processes=2,
                socket_dir=tmp,
                embedder=_local(serving_settings(settings)),
                grpc_settings=settings.grpc,
            )
        else:
            servers = RetrieveProcesses(settings, processes=2, store=store)
        servers.start()
        try:
            # the server processes' metrics (the directory they write exists once started)
            registry = (
                servers.metrics_registry() if isinstance(servers, RetrieveProcesses) else None
            )
            yield servers.port, servers.pids, registry
        finally:
            servers.stop()
    finally:
        store.close()


def run(
    data_dir: Path, *, queries: int, concurrency: int, floor: bool, py_spy: Path | None
) -> dict[str, Any]:
    """Measure (see the module docstring); a JSON-able report."""
    if not (data_dir / "store").exists():
        raise ConfigError(
            f"{data_dir} holds no benchmark index: build it with `ragstream bench "
            "retrieve --data-dir DIR` first"
        )
    load_before = os.getloadavg()
    rng = np.random.default_rng(7)
    sentences = _sentences(50 * WINDOW)
    prose = _Prose(
        tuple(sentences),
        tuple(_content_words(s) for s in sentences),
        np.empty((0, 0), dtype=np.float32),
    )
    with ExitStack() as stack:
        tmp = Path(stack.enter_context(tempfile.TemporaryDirectory(prefix="ragstream-thr-")))
        port, pids, registry = stack.enter_context(_servers(data_dir, floor, tmp))
        # the load generator of `bench retrieve`; the CPU is read per thread below instead
        server = _Server(
            "floor" if floor else "sor_verification",
            not floor,
            2,
            f"127.0.0.1:{port}",
            registry,
            lambda: 0.0,
            dict,
        )
        _drive(server, _questions(prose, 64, rng), 16, tmp)  # warm-up: 16 connections
        measured = _questions(prose, queries, rng)
        me = os.getpid()
        before = {pid: thread_cpu(pid) for pid in [*pids, me]}
        spies = []
        if py_spy is not None:
            py_spy.parent.mkdir(parents=True, exist_ok=True)
            for i, pid in enumerate(pids):
                prefix = py_spy.with_name(f"{py_spy.name}-p{i}")
                spies += [_spy(pid, prefix, "flamegraph"), _spy(pid, prefix, "raw")]
            time.sleep(1.0)  # attached
        began = time.perf_counter()
        done = _drive(server, measured, concurrency, tmp)
        wall = time.perf_counter() - began
        after = {pid: thread_cpu(pid) for pid in [*pids, me]}
        for spy in spies:
            spy.send_signal(signal.SIGINT)
            spy.wait(60)
    n = len(measured)
    rows: list[dict[str, Any]] = []
    for pid in [*pids, me]:
        role = "store host" if pid == me else "server process"
        for name, used in sorted(cpu_used(before[pid], after[pid]).items()):
            if used > 0:
                rows.append(
                    {
                        "role": role,
                        "pid": pid,
                        "thread": name,
                        "cpu_ms_per_request": round(used / n * 1000, 3),
                    }
                )
    by_role: dict[str, float] = {}
    for row in rows:
        by_role[row["role"]] = by_role.get(row["role"], 0.0) + row["cpu_ms_per_request"]
    return {
        "what": "CPU per request by process and thread: 2 server processes "
        + ("of the floor (ragdev.bench.floor)" if floor else "of Retrieve (RetrieveProcesses)")
        + ", this process hosting the store; thread CPU from /proc (10 ms ticks)",
        "machine": machine_info(load_before, os.getloadavg(), ("grpcio", "qdrant-edge-py")),
        "queries": n,
        "concurrency": concurrency,
        "wall_s": round(wall, 3),
        "statuses": dict(Counter(s.status for s in done.samples)),
        "cpu_ms_per_request": round(sum(by_role.values()), 3),
        "by_role": {k: round(v, 3) for k, v in sorted(by_role.items())},
        "threads": rows,
        # the CPU of the thread running each stage (ragstream_retrieve_stage_cpu_seconds_total)
        "stage_cpu_ms_per_request": {
            k: round(v / n * 1000, 3) for k, v in sorted(done.stage_cpu_s.items())
        },
        "py_spy": _profiles(py_spy, len(pids)) if py_spy is not None else None,
    }


def _profiles(prefix: Path, processes: int) -> dict[str, Any]:
    """The summary of each server process's collapsed stacks (those that were sampled)."""
    out: dict[str, Any] = {}
    for i in range(processes):
        stacks = prefix.with_name(f"{prefix.name}-p{i}").with_suffix(".txt")
        if stacks.exists() and stacks.stat().st_size > 0:
            out[stacks.name] = summarize(stacks)
    return out


def _spy(pid: int, prefix: Path, fmt: str) -> subprocess.Popen[bytes]:
    return subprocess.Popen(
        [
            _py_spy(),
            "record",
            "--pid",
            str(pid),
            "--nonblocking",
            "--gil",
            "--threads",
            "--rate",
            "200",
            "--format",
            fmt,
            "--output",
            str(prefix.with_suffix(".svg" if fmt == "flamegraph" else ".txt")),
        ],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )


def main(argv: Sequence[str] | None = None) -> int:
    """Command line: print the report as JSON."""
    parser = argparse.ArgumentParser(description=(__doc__ or "").split("\n\n")[0])
    parser.add_argument("--data-dir", type=Path, required=True)
    parser.add_argument("--queries", type=int, default=300)
    parser.add_argument("--concurrency", type=int, default=1)
    parser.add_argument("--floor", action="store_true", help="the floor's servers instead")
    parser.add_argument(
        "--py-spy", type=Path, default=None, help="output prefix of per-process py-spy stacks"
    )
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.WARNING, format="%(asctime)s %(levelname)s %(message)s")
    report = run(
        args.data_dir,
        queries=args.queries,
        concurrency=args.concurrency,
        floor=args.floor,
        py_spy=args.py_spy,
    )
    json.dump(report, sys.stdout, indent=2)
    sys.stdout.write("\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
