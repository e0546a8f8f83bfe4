"""Where a Retrieve server process spends its CPU: py-spy over the server of `ragstream bench
retrieve` (one process: the gRPC server, the pipeline and the qdrant-edge store in this
process; SoR verification on, the real SQLite SoR) while the load generator drives it.

The first run builds the benchmark's index and SoR in `--data-dir` (as `bench retrieve` does,
seed 0); later runs reuse them, so profiles before and after a change see the same data. The
process samples itself with py-spy (`--nonblocking`, so sampling does not stop it), writes the
flame graph (SVG) and the collapsed stacks, and prints a text summary: CPU per request of this
process over the measured calls (without and with py-spy attached), and the share of the
samples in each stage of a request (by the frames the stacks contain) and in the functions that
are most often on the CPU (self) or on the stack (inclusive). py-spy's samples of all threads
count a thread waiting for the GIL as busy (it shows up at the line it resumes at); a third
recording with `--gil` samples only the thread holding the GIL (Python's own work; onnxruntime
runs without it). The server's query embedder is configured as Retrieve configures it.

Run: `python -m ragdev.bench.profile_retrieve --points 100000 --data-dir DIR --out PREFIX`
(py-spy must be on PATH or beside the interpreter; `pip install py-spy`).
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import shutil
import subprocess
import sys
import tempfile
import time
from collections import Counter
from collections.abc import Sequence
from contextlib import ExitStack
from pathlib import Path
from typing import Any

import numpy as np
from prometheus_client import CollectorRegistry

from ragcore.embedders.local_onnx import LocalEmbedderConfig, LocalOnnxEmbedder
from ragcore.errors import ConfigError
from ragcore.plan import PlanConfig
from ragcore.store.edge import EdgeStore
from ragcore.wiring import payload_schema
from ragdev.bench.machine import machine_info
from ragdev.bench.retrieve import (
    WARMUP_TIMEOUT_S,
    WINDOW,
    _build,
    _content_words,
    _drive,
    _in_process,
    _Prose,
    _questions,
    server_settings,
)
from ragdev.bench.retrieve import _sentences as prose_sentences
from ragdev.bench.retrieve import _Server as Server
from retrieval_api.app import build_app
from retrieval_api.processes import serving_settings

log = logging.getLogger(__name__)

#: A stage of a request and the frames (substrings of `function (file)`) that mark it, first
#: match wins, innermost frame first (see `_stage_of`).
STAGES: tuple[tuple[str, tuple[str, ...]], ...] = (
    ("embed (onnxruntime + tokenizer)", ("embed_query", "_embed (")),
    ("engine search (qdrant-edge)", ("search_hybrid", "search_sparse", "search_dense")),
    ("vectors of sparse-only hits", ("retrieve (ragcore/store",)),
    ("exact BM25 (match_all, query)", ("match_all", "scorer.query", "Bm25Scorer")),
    ("SoR verification", ("verify (ragcore/sor", "verdicts_from_sor", "entities_to_verify")),
    ("evidence score + fusion (finish)", ("finish (retrieval_api",)),
    ("ranking (rank, candidates)", ("rank (retrieval_api", "candidates (retrieval_api")),
    ("evidence pack (build_pack)", ("build_pack",)),
    ("metrics (prometheus_client)", ("prometheus_client",)),
    ("validate + auth", ("validate_request", "tenant_of")),
    ("gRPC + asyncio (server, protobuf)", ("grpc", "asyncio", "cygrpc")),
)


def _stage_of(frames: Sequence[str]) -> str:
    for frame in reversed(frames):
        for name, marks in STAGES:
            if any(m in frame for m in marks):
                return name
    return "other"


def summarize(collapsed: Path, top: int = 30) -> dict[str, Any]:
    """Shares of the samples by stage, and the top functions by self and inclusive samples."""
    stages: Counter[str] = Counter()
    own: Counter[str] = Counter()
    inclusive: Counter[str] = Counter()
    total = 0
    for line in collapsed.read_text(encoding="utf-8").splitlines():
        stack, _, count_text = line.rpartition(" ")
        if not stack:
            continue
        count = int(count_text)
        frames = stack.split(";")
        total += count
        stages[_stage_of(frames)] += count
        own[frames[-1]] += count
        for frame in set(frames):
            inclusive[frame] += count

    def share(counter: Counter[str], n: int | None = None) -> list[tuple[str, float]]:
        return [(k, round(v / total, 4)) for k, v in counter.most_common(n)]

    return {
        "samples": total,
        "by_stage": share(stages),
        "top_self": share(own, top),
        "top_inclusive": share(inclusive, top),
    }


def _py_spy() -> str:
    found = shutil.which("py-spy") or str(Path(sys.executable).with_name("py-spy"))
    if not Path(found).exists():
        raise ConfigError("py-spy is not installed (pip install py-spy)")
    return found


def _record(out: Path, fmt: str, seconds: int, *, gil: bool = False) -> subprocess.Popen[bytes]:
    return subprocess.Popen(
        [
            _py_spy(),
            "record",
            "--pid",
            str(os.getpid()),
            "--nonblocking",
            *(["--gil"] if gil else []),
            "--rate",
            "200",
            "--duration",
            str(seconds),
            "--format",
            fmt,
            "--output",
            str(out),
        ],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
    )


def run(
    *,
    points: int,
    data_dir: Path,
    out: Path,
    queries: int = 400,
    concurrency: int = 1,
    seed: int = 0,
) -> dict[str, Any]:
    """Build (or reuse) the index in `data_dir`, measure, profile; writes `out`.svg and
    `out`.txt (collapsed stacks) and returns the summary."""
    load_before = os.getloadavg()
    rng = np.random.default_rng(seed)
    n_sentences = max(50 * WINDOW, points // 4)
    plan = PlanConfig()
    with ExitStack() as stack:
        built = (data_dir / "store").exists()
        data_dir.mkdir(parents=True, exist_ok=True)
        store = EdgeStore(data_dir / "store", schema=payload_schema(plan))
        stack.callback(store.close)
        embedder = LocalOnnxEmbedder(LocalEmbedderConfig())
        stack.callback(embedder.close)
        if built:
            sentences = prose_sentences(n_sentences)
            prose = _Prose(
                tuple(sentences),
                tuple(_content_words(s) for s in sentences),
                np.empty((0, embedder.spec.dimension), dtype=np.float32),
            )
        else:
            prose = _build(
                data_dir, store, embedder, points=points, n_sentences=n_sentences, rng=rng
            ).prose
        settings = server_settings(data_dir, plan)
        # the server's query embedder as a Retrieve server configures it
        served = serving_settings(settings).embedder
        if not isinstance(served, LocalEmbedderConfig):
            raise ConfigError("the benchmark's server embeds with the local model")
        query_embedder = LocalOnnxEmbedder(served)
        stack.callback(query_embedder.close)
        registry = CollectorRegistry()
        app = build_app(settings, registry, store=store, embedder=query_embedder)
        target, cpu, by_process = stack.enter_context(_in_process(app))
        server = Server("sor_verification", True, 1, target, registry, cpu, by_process)
        tmp = Path(stack.enter_context(tempfile.TemporaryDirectory(prefix="ragstream-prof-")))
        _drive(server, _questions(prose, 40, rng), 1, tmp, WARMUP_TIMEOUT_S)  # warm-up
        plain = _drive(server, _questions(prose, queries, rng), concurrency, tmp)
        profiled_queries = _questions(prose, queries, rng)
        seconds = max(5, int(plain.wall_s * 1.5) + 5)
        svg, collapsed = out.with_suffix(".svg"), out.with_suffix(".txt")
        under_gil = out.with_name(out.name + "-gil.txt")
        out.parent.mkdir(parents=True, exist_ok=True)
        recorders = [
            _record(svg, "flamegraph", seconds),
            _record(collapsed, "raw", seconds),
            _record(under_gil, "raw", seconds, gil=True),
        ]
        time.sleep(1.0)  # py-spy attached
        profiled = _drive(server, profiled_queries, concurrency, tmp)
        for recorder in recorders:
            _, err = recorder.communicate(timeout=seconds + 60)
            if recorder.returncode != 0:
                raise ConfigError(f"py-spy failed: {err.decode(errors='replace')[-2000:]}")
    statuses = Counter(s.status for s in [*plain.samples, *profiled.samples])
    return {
        "what": "py-spy samples of the Retrieve server process (one process: gRPC, pipeline, "
        "qdrant-edge store), SoR verification on (SQLite), the load generator in its own process",
        "machine": machine_info(load_before, os.getloadavg(), ("onnxruntime", "qdrant-edge-py")),
        "points": points,
        "queries": queries,
        "concurrency": concurrency,
        "statuses": dict(statuses),
        "cpu_ms_per_request": round(plain.server_cpu_s / len(plain.samples) * 1000, 3),
        "cpu_ms_per_request_while_profiled": round(
            profiled.server_cpu_s / len(profiled.samples) * 1000, 3
        ),
        "stage_cpu_ms_per_request": {
            k: round(v / len(plain.samples) * 1000, 3) for k, v in sorted(plain.stage_cpu_s.items())
        },
        "flamegraph": str(svg),
        "collapsed_stacks": str(collapsed),
        **summarize(collapsed),
        # only the thread holding the GIL: Python's own work (onnxruntime runs without it)
        "collapsed_stacks_gil": str(under_gil),
        "gil": summarize(under_gil),
    }


def main(argv: Sequence[str] | None = None) -> int:
    """Command line: print the summary as JSON."""
    parser = argparse.ArgumentParser(description=(__doc__ or "").split("\n\n")[0])
    parser.add_argument("--points", type=int, default=100_000)
    parser.add_argument("--data-dir", type=Path, required=True)
    parser.add_argument("--out", type=Path, required=True, help="output prefix (.svg, .txt)")
    parser.add_argument("--queries", type=int, default=400)
    parser.add_argument("--concurrency", type=int, default=1)
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(message)s")
    report = run(
        points=args.points,
        data_dir=args.data_dir,
        out=args.out,
        queries=args.queries,
        concurrency=args.concurrency,
    )
    json.dump(report, sys.stdout, indent=2)
    sys.stdout.write("\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
