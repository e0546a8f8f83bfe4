"""The Retrieve benchmark's load generator, in a process of its own (so it does not share the
server's GIL or CPU accounting): N client threads, each with a loopback gRPC channel (and so a
TCP connection) of its own, like N independent callers, one blocking call in flight per
thread, each query of a file sent once. Own connections matter with several server processes
on one port: the kernel spreads connections, not calls, over them.

`python -m ragdev.bench.loadgen --target 127.0.0.1:PORT --token T --concurrency 8 FILE` reads
a JSON list of queries from FILE and prints one JSON document: per-call samples (latency,
status, server stage timings, result and exclusion counts), the wall time, and this process's
own CPU seconds (user + system).

With `--flood` it is a noisy neighbour instead (`ragdev.bench.noisy`): the threads cycle
through the queries back to back until stdin reaches EOF (the parent closes it), a refused call
(RESOURCE_EXHAUSTED) waiting the server's retry hint first unless `--ignore-retry-hint`, and it
prints counts by status and the latency of the answered calls. With `--asyncio` the flood is
one asyncio client instead of threads: `--concurrency` calls in flight over `--connections`
channels, at most `--rate` calls per second in all (0: as fast as they are answered). That is
the cheap way to keep hundreds of calls in flight from one process (issue 41: a client with
300 callers ignoring the hints).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import resource
import sys
import threading
import time
from collections import Counter
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import grpc

from schemas.proto.ragstream.retrieval.v1 import retrieval_pb2 as pb
from schemas.proto.ragstream.retrieval.v1 import retrieval_pb2_grpc as pb_grpc

CALL_TIMEOUT_S = 30.0


def call(stub: Any, token: str, query: str, timeout_s: float = CALL_TIMEOUT_S) -> dict[str, Any]:
    """One Retrieve call, measured from the request built to the evidence pack decoded."""
    request = pb.RetrieveRequest(query_text=query)
    metadata = (("authorization", f"Bearer {token}"),)
    began = time.perf_counter()
    try:
        pack = stub.Retrieve(request, metadata=metadata, timeout=timeout_s)
    except grpc.RpcError as err:
        code = err.code().name if isinstance(err, grpc.Call) else "UNKNOWN"
        return {"latency_s": time.perf_counter() - began, "status": f"GRPC_{code}"}
    latency = time.perf_counter() - began
    excluded = Counter(
        pb.ExclusionReason.Name(e.reason).removeprefix("EXCLUSION_REASON_") for e in pack.excluded
    )
    return {
        "latency_s": latency,
        "status": pb.RetrievalStatus.Name(pack.status).removeprefix("RETRIEVAL_STATUS_"),
        "timings_ms": dict(pack.timings_ms),
        "results": len(pack.results),
        "excluded": dict(excluded),
    }


def _cpu_s() -> float:
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_utime + usage.ru_stime


def drive(
    target: str,
    token: str,
    queries: Sequence[str],
    concurrency: int,
    timeout_s: float = CALL_TIMEOUT_S,
) -> dict[str, Any]:
    """Every query once with at most `concurrency` calls in flight; samples, wall and CPU."""
    local = threading.local()
    channels: list[grpc.Channel] = []
    lock = threading.Lock()

    def stub() -> Any:
        found = getattr(local, "stub", None)
        if found is None:
            # a subchannel pool of its own: a connection of its own, not one shared by all
            channel = grpc.insecure_channel(target, options=[("grpc.use_local_subchannel_pool", 1)])
            grpc.channel_ready_future(channel).result(timeout=30)
            with lock:
                channels.append(channel)
            found = local.stub = pb_grpc.RetrievalServiceStub(channel)
        return found

    try:
        with ThreadPoolExecutor(concurrency, thread_name_prefix="loadgen") as pool:
            # connect every client thread before the clock starts
            barrier = threading.Barrier(concurrency)
            list(pool.map(lambda _: (stub(), barrier.wait()), range(concurrency)))
            cpu = _cpu_s()
            began = time.perf_counter()
            samples = list(pool.map(lambda q: call(stub(), token, q, timeout_s), queries))
            wall = time.perf_counter() - began
            return {"samples": samples, "wall_s": wall, "cpu_s": _cpu_s() - cpu}
    finally:
        for channel in channels:
            channel.close()


def _pushback_s(err: grpc.RpcError) -> float:
    """The server's retry hint of a refused call (seconds; 0 without one)."""
    if not isinstance(err, grpc.Call):
        return 0.0
    return _hint_s(err.trailing_metadata())


def _hint_s(trailers: Any) -> float:
    """The retry hint among a call's trailers (seconds; 0 without one)."""
    for key, value in trailers or ():
        if key == "grpc-retry-pushback-ms":
            return int(value) / 1000
    return 0.0


def flood(
    target: str,
    token: str,
    queries: Sequence[str],
    concurrency: int,
    stop: threading.Event,
    *,
    honor_retry_hint: bool = True,
) -> dict[str, Any]:
    """`concurrency` callers sending `queries` round and round until `stop` is set."""
    lock = threading.Lock()
    statuses: Counter[str] = Counter()
    answered: list[float] = []
    waited = [0.0]
    metadata = (("authorization", f"Bearer {token}"),)

    def caller(offset: int) -> None:
        channel = grpc.insecure_channel(target, options=[("grpc.use_local_subchannel_pool", 1)])
        stub = pb_grpc.RetrievalServiceStub(channel)
        i = offset
        try:
            while not stop.is_set():
                request = pb.RetrieveRequest(query_text=queries[i % len(queries)])
                i += concurrency
                began = time.perf_counter()
                try:
                    stub.Retrieve(request, metadata=metadata, timeout=CALL_TIMEOUT_S)
                except grpc.RpcError as err:
                    code = err.code().name if isinstance(err, grpc.Call) else "UNKNOWN"
                    pause = _pushback_s(err) if honor_retry_hint else 0.0
                    with lock:
                        statuses[f"GRPC_{code}"] += 1
                        waited[0] += pause
                    if pause:
                        stop.wait(pause)
                else:
                    with lock:
                        statuses["OK"] += 1
                        answered.append(time.perf_counter() - began)
        finally:
            channel.close()

    cpu = _cpu_s()
    began = time.perf_counter()
    threads = [threading.Thread(target=caller, args=(n,)) for n in range(concurrency)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    return {
        "statuses": dict(statuses),
        "answered_latency_s": answered,
        "retry_wait_s": waited[0],
        "wall_s": time.perf_counter() - began,
        "cpu_s": _cpu_s() - cpu,
    }


async def flood_async(
    target: str,
    token: str,
    queries: Sequence[str],
    concurrency: int,
    stop: threading.Event,
    *,
    honor_retry_hint: bool = True,
    rate: float | None = None,
    connections: int = 8,
) -> dict[str, Any]:
    """`concurrency` asyncio callers over `connections` channels sending `queries` round and
    round, at most `rate` calls per second in all, until `stop` is set; the calls still in
    flight then are cancelled (counted in `started` only)."""
    statuses: Counter[str] = Counter()
    started = [0]
    answered: list[float] = []
    refused: list[float] = []
    waited = [0.0]
    metadata = (("authorization", f"Bearer {token}"),)
    options = [("grpc.use_local_subchannel_pool", 1)]
    channels = [grpc.aio.insecure_channel(target, options=options) for _ in range(connections)]
    stubs = [pb_grpc.RetrievalServiceStub(channel) for channel in channels]
    next_slot = [time.perf_counter()]
    interval = 1.0 / rate if rate else 0.0

    async def caller(n: int) -> None:
        stub = stubs[n % len(stubs)]
        i = n
        while not stop.is_set():
            if interval:  # pace the whole flood: each call takes the next free slot
                now = time.perf_counter()
                slot = next_slot[0] = max(now, next_slot[0] + interval)
                if slot > now:
                    await asyncio.sleep(slot - now)
            request = pb.RetrieveRequest(query_text=queries[i % len(queries)])
            i += concurrency
            began = time.perf_counter()
            started[0] += 1
            try:
                await stub.Retrieve(request, metadata=metadata, timeout=CALL_TIMEOUT_S)
            except grpc.aio.AioRpcError as err:
                statuses[f"GRPC_{err.code().name}"] += 1
                if err.code() == grpc.StatusCode.RESOURCE_EXHAUSTED:
                    refused.append(time.perf_counter() - began)
                pause = _hint_s(err.trailing_metadata()) if honor_retry_hint else 0.0
                if pause:
                    waited[0] += pause
                    await asyncio.sleep(pause)
            else:
                statuses["OK"] += 1
                answered.append(time.perf_counter() - began)

    for channel in channels:
        await asyncio.wait_for(channel.channel_ready(), 30)
    cpu = _cpu_s()
    began = time.perf_counter()
    tasks = [asyncio.create_task(caller(n)) for n in range(concurrency)]
    await asyncio.to_thread(stop.wait)
    wall = time.perf_counter() - began
    cpu = _cpu_s() - cpu
    for task in tasks:
        task.cancel()
    for task in tasks:
        with contextlib.suppress(asyncio.CancelledError):
            await task
    for channel in channels:
        await channel.close()
    return {
        "started": started[0],
        "statuses": dict(statuses),
        "answered_latency_s": answered,
        "refused_latency_s": refused,
        "retry_wait_s": waited[0],
        "wall_s": wall,
        "cpu_s": cpu,
    }


def _stop_on_eof(stop: threading.Event) -> None:
    while sys.stdin.buffer.read(4096):
        pass
    stop.set()


def main(argv: Sequence[str] | None = None) -> int:
    """Command line: print the samples of one run as JSON."""
    parser = argparse.ArgumentParser(description=(__doc__ or "").split("\n\n")[0])
    parser.add_argument("--target", required=True, help="host:port of the Retrieve server")
    parser.add_argument("--token", required=True, help="bearer token of the benchmark tenant")
    parser.add_argument("--concurrency", type=int, required=True)
    parser.add_argument("queries", type=Path, help="JSON list of query texts")
    parser.add_argument("--flood", action="store_true", help="flood until stdin closes")
    parser.add_argument("--ignore-retry-hint", action="store_true")
    parser.add_argument("--timeout", type=float, default=CALL_TIMEOUT_S, help="seconds per call")
    parser.add_argument("--asyncio", action="store_true", help="flood from one asyncio client")
    parser.add_argument("--rate", type=float, default=0.0, help="asyncio flood: calls/s cap")
    parser.add_argument("--connections", type=int, default=8, help="asyncio flood: channels")
    args = parser.parse_args(argv)
    queries = json.loads(args.queries.read_text(encoding="utf-8"))
    if args.flood:
        stop = threading.Event()
        threading.Thread(target=_stop_on_eof, args=(stop,), daemon=True).start()
        if args.asyncio:
            report = asyncio.run(
                flood_async(
                    args.target,
                    args.token,
                    queries,
                    args.concurrency,
                    stop,
                    honor_retry_hint=not args.ignore_retry_hint,
                    rate=args.rate or None,
                    connections=args.connections,
                )
            )
            json.dump(report, sys.stdout)
            return 0
        report = flood(
            args.target,
            args.token,
            queries,
            args.concurrency,
            stop,
            honor_retry_hint=not args.ignore_retry_hint,
        )
        json.dump(report, sys.stdout)
        return 0
    json.dump(drive(args.target, args.token, queries, args.concurrency, args.timeout), sys.stdout)
    return 0


if __name__ == "__main__":
    sys.exit(main())
