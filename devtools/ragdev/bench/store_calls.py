"""CPU of Retrieve's hybrid search through a store host, by side (issue 28, fourth round).

With several Retrieve server processes, the process that opens the embedded store serves their
searches (`ragcore.store.host`): it unpickles the request, runs the engine, converts the hits
to Python and pickles them back; the caller unpickles them. This tool measures that one call
apart from the rest of a request: it opens a data dir built by `ragstream bench retrieve
--data-dir DIR`, serves its store with a `StoreHost` on a private socket and calls
`search_hybrid` through a `HostedStore` from this process's main thread, the benchmark's
questions encoded as Retrieve encodes them (unit random dense vectors: the engine's work does
not depend on where they come from). It reports the CPU per call of the calling thread (pickle
the request, unpickle the reply), of the host's Python threads (the serving), and of
qdrant-edge's search threads, read from `/proc` per thread; the median of `--rounds` rounds.

`--call retrieve` asks what Retrieve asks (`candidate_k + 1` hits a branch, the sparse hits'
cosine, the payload keys the pipeline reads), `--call floor` what the floor asks
(`ragdev.bench.floor`: `candidate_k`, whole payloads), `--call-kwargs JSON` any other keyword
arguments (e.g. an older checkout's). Run: `python -m ragdev.bench.store_calls --data-dir DIR
--call retrieve`.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np

from ragcore.errors import ConfigError
from ragcore.plan import PlanConfig
from ragcore.sparse import Bm25Encoder
from ragcore.store.base import StoreFilter
from ragcore.store.edge import EdgeStore
from ragcore.store.host import HostedStore, StoreHost, new_host_key
from ragcore.store.registry import FileIndexRegistry
from ragcore.wiring import payload_schema
from ragdev.bench.machine import machine_info
from ragdev.bench.retrieve import TENANT, WINDOW, _content_words, _Prose, _questions, _sentences
from ragdev.bench.retrieve_threads import EXITED, cpu_used, thread_cpu
from retrieval_api.settings import RetrieveSettings

__all__ = ["main", "run"]

DIMENSION = 384


def _kwargs(call: str, candidate_k: int) -> dict[str, Any]:
    if call == "retrieve":  # retrieval_api.candidates.CandidateSearch._search, no filter
        # imported here: an older checkout (`--call floor --call-kwargs ...`) has no selection
        from retrieval_api.retriever import PAYLOAD_FIELDS  # noqa: PLC0415

        return {
            "limit": candidate_k + 1,
            "prefetch_limit": candidate_k + 1,
            "sparse_dense_scores": True,
            "fields": list(PAYLOAD_FIELDS),
        }
    if call == "floor":  # ragdev.bench.floor.FloorServicer
        return {"limit": candidate_k, "prefetch_limit": candidate_k}
    raise ConfigError(f"unknown call {call!r}")


def run(
    data_dir: Path, *, call: str, call_kwargs: dict[str, Any], queries: int, rounds: int
) -> dict[str, Any]:
    """Measure (see the module docstring); a JSON-able report."""
    if not (data_dir / "store").exists():
        raise ConfigError(f"{data_dir} holds no benchmark index (`ragstream bench retrieve`)")
    load_before = os.getloadavg()
    retrieval = RetrieveSettings().retrieval
    kwargs = {**_kwargs(call, retrieval.candidate_k(retrieval.default_top_k)), **call_kwargs}
    sentences = _sentences(50 * WINDOW)
    prose = _Prose(
        tuple(sentences),
        tuple(_content_words(s) for s in sentences),
        np.empty((0, 0), dtype=np.float32),
    )
    texts = _questions(prose, queries, np.random.default_rng(7))
    encoder = Bm25Encoder()
    sparse = [encoder.encode_query(t) for t in texts]
    rng = np.random.default_rng(0)
    dense = [
        (v / np.linalg.norm(v)).astype(np.float32)
        for v in rng.standard_normal((queries, DIMENSION))
    ]
    scope = StoreFilter(tenant_id=TENANT)
    store = EdgeStore(data_dir / "store", schema=payload_schema(PlanConfig()))
    rows: list[tuple[float, float, float]] = []
    try:
        collection = FileIndexRegistry(data_dir / "store", store).lookup(TENANT, None).collection
        with tempfile.TemporaryDirectory(prefix="ragstream-calls-") as tmp:
            key = new_host_key()
            host = StoreHost(store, Path(tmp) / "store.sock", authkey=key)
            host.start()
            hosted = HostedStore(Path(tmp) / "store.sock", authkey=key)
            try:

                def calls() -> None:
                    for d, s in zip(dense, sparse, strict=True):
                        hosted.search_hybrid(collection, d, s, scope, **kwargs)

                calls()  # warm-up: connection, caches
                me = os.getpid()
                for _ in range(rounds):
                    before = thread_cpu(me)
                    mine = time.thread_time()
                    calls()
                    mine = time.thread_time() - mine
                    used = cpu_used(before, thread_cpu(me))
                    # the threads that ended meanwhile are the engine's (its search pool's
                    # threads come and go; this process starts no others during the calls)
                    engine = {k for k in used if k.startswith("edge-search") or k == EXITED}
                    edge = sum(v for k, v in used.items() if k in engine)
                    python = sum(v for k, v in used.items() if k not in engine)
                    rows.append((mine, python - mine, edge))
            finally:
                hosted.close()
                host.close()
    finally:
        store.close()

    def per_call(i: int) -> float:
        return round(statistics.median(r[i] for r in rows) / queries * 1000, 3)

    return {
        "what": "CPU per search_hybrid through a store host, by side (median of the rounds); "
        "host Python from /proc (10 ms ticks), the calling thread from thread_time",
        "machine": machine_info(load_before, os.getloadavg(), ("qdrant-edge-py",)),
        "call": call,
        "kwargs": kwargs,
        "queries": queries,
        "rounds": rounds,
        "calling_thread_ms": per_call(0),
        "host_python_ms": per_call(1),
        "host_engine_threads_ms": per_call(2),
    }


def main(argv: Sequence[str] | None = None) -> int:
    """Command line: print the report as JSON."""
    parser = argparse.ArgumentParser(description=(__doc__ or "").split("\n\n")[0])
    parser.add_argument("--data-dir", type=Path, required=True)
    parser.add_argument("--call", choices=("retrieve", "floor"), default="retrieve")
    parser.add_argument("--call-kwargs", type=json.loads, default={})
    parser.add_argument("--queries", type=int, default=400)
    parser.add_argument("--rounds", type=int, default=5)
    args = parser.parse_args(argv)
    report = run(
        args.data_dir,
        call=args.call,
        call_kwargs=args.call_kwargs,
        queries=args.queries,
        rounds=args.rounds,
    )
    json.dump(report, sys.stdout, indent=2)
    sys.stdout.write("\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
