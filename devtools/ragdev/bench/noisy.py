"""Noisy-neighbour benchmark (issues 29 and 41): does a quiet tenant keep its latency while
another tenant floods the Retrieve server?

Two tenants, `quiet` and `noisy`, each with an index of `points` chunks built as `ragstream
bench retrieve` builds one (real prose, synthetic chunk vectors around REAL sentence
embeddings, BM25, qdrant-edge, HNSW; every entity in the SQLite SoR, which every call verifies
against), served by the product's gRPC server (`retrieval_api.app.build_app`: auth, per-tenant
admission, the whole pipeline with the real local ONNX embedder) on a loopback port of this
process. The noisy tenant's share is its quota (`RAGSTREAM_ADMISSION__QUOTAS`): `--share` calls in
flight (1) and `--share-rps` calls per second (10; 0: none).

Two floods (`ragdev.bench.loadgen --flood`, a process of its own):

- **honouring the retry hint** (default, issue 29): `--flood-factor` (10) x `--share` client
  threads, each calling back to back and waiting the server's retry hint after a refusal, so
  each offers about 1 / hint calls per second; with the rate quota that is 10x its rate.
  Compared with a second server on the same store with admission off (`flood_no_admission`).
- **ignoring the retry hint** (`--ignore-retry-hint`, issue 41): one asyncio client with
  `--flood-concurrency` (300) calls in flight over `--flood-connections` channels, each
  refused call retried at once, at most `--flood-rate` calls/s (0: as fast as answered).
  Compared with a second server on the same store with admission on but refusals never
  deferred (`flood_no_deferral`, `RAGSTREAM_ADMISSION__DEFER_S=0`).

The quiet tenant probes with one call at a time (`ragdev.bench.loadgen`), in rounds of three
phases run back to back, so background load on the shared machine weighs on all alike:
`alone` (no flood: its unloaded figures), `flood` (the noisy tenant floods the product's
server) and the comparison phase above. The report gives the quiet tenant's p50/p95 and error
share per phase, their ratios to `alone`, the flood's offered, answered and refused rates, the
load average at each phase, and the goal: quiet p95 <= 2x its unloaded p95 and none of its
calls refused.

Run: `ragstream bench noisy [--points 20000] [--calls 100] [--rounds 2] [--ignore-retry-hint]`
(prints JSON).
"""

from __future__ import annotations

import argparse
import hashlib
import json
import logging
import os
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

from ragcore.embedders.local_onnx import MINILM_SPEC, LocalEmbedderConfig, LocalOnnxEmbedder
from ragcore.errors import ConfigError, RagstreamError
from ragcore.plan import PlanConfig
from ragcore.settings import SorSettings, StoreSettings
from ragcore.sparse import Bm25Encoder
from ragcore.store.base import PointRecord
from ragcore.store.edge import EdgeStore
from ragcore.store.registry import FileIndexRegistry
from ragcore.wiring import payload_schema
from ragdev.bench.machine import emit, machine_info, percentiles, run_dir
from ragdev.bench.retrieve import (
    BATCH,
    WINDOW,
    _Builder,
    _content_words,
    _create_sor,
    _in_process,
    _Prose,
    _questions,
    _sentences,
)
from ragstream.cli import HelpFormatter
from retrieval_api.admission import AdmissionSettings, QuotaBook, TenantQuota
from retrieval_api.app import build_app
from retrieval_api.settings import AuthSettings, GrpcSettings, RetrieveSettings

__all__ = ["GOAL_P95_RATIO", "run"]

log = logging.getLogger(__name__)

QUIET, NOISY = "quiet", "noisy"
TOKENS = {QUIET: "bench-quiet-token", NOISY: "bench-noisy-token"}
GOAL_P95_RATIO = 2.0
GOAL_TEXT = (
    "while the noisy tenant floods at 10x its share: the quiet tenant's p95 <= 2x its unloaded "
    "p95, and 0 of its calls refused"
)
GOAL_TEXT_IGNORING = (
    "while the noisy tenant floods ignoring the retry hints: the quiet tenant's p95 <= 2x its "
    "unloaded p95, and 0 of its calls refused"
)
PHASES = ("alone", "flood", "flood_no_admission")
PHASES_IGNORING = ("alone", "flood", "flood_no_deferral")


def _build(
    root: Path, store: EdgeStore, embedder: LocalOnnxEmbedder, points: int, seed: int
) -> tuple[_Prose, dict[str, int]]:
    """Both tenants' indexes (registered, optimized, active) and their SoR rows."""
    rng = np.random.default_rng(seed)
    sentences = _sentences(max(50 * WINDOW, points // 4))
    vectors = np.asarray(embedder.embed_documents(sentences), dtype=np.float32)
    prose = _Prose(tuple(sentences), tuple(_content_words(s) for s in sentences), vectors)
    registry = FileIndexRegistry(root / "store", store)
    sor = _create_sor(root / "sor.sqlite")
    entities: dict[str, int] = {}
    try:
        for number_base, tenant in enumerate((QUIET, NOISY)):
            manifest = registry.create_version(
                tenant, MINILM_SPEC, sparse_encoder=Bm25Encoder().model_version
            )
            builder = _Builder(prose, rng, tenant)
            made = count = 0
            while made < points:
                batch: list[PointRecord] = []
                rows: list[tuple[Any, ...]] = []
                while made < points and len(batch) < BATCH:
                    n_chunks = min(points - made, int(rng.integers(1, 4)))
                    number = number_base * 10_000_000 + count
                    entity_points, row = builder.entity(number, n_chunks, manifest.version)
                    batch.extend(entity_points)
                    rows.append(row)
                    made += n_chunks
                    count += 1
                store.upsert(manifest.index_name, batch, wait=True)
                with sor:
                    sor.executemany(
                        "INSERT INTO entities (id, company_id, entity_type, name, content, "
                        "metadata, content_hash, created_at, updated_at) "
                        "VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?)",
                        rows,
                    )
            store.optimize(manifest.index_name)
            registry.mark_ready(tenant, manifest.version, total_vectors=points)
            registry.activate(tenant, manifest.version)
            entities[tenant] = count
            log.info("tenant %s: %d points, %d entities", tenant, points, count)
    finally:
        sor.close()
    return prose, entities


@dataclass
class _Flood:
    """A running flood (the load generator in `--flood` mode)."""

    process: subprocess.Popen[str]

    def stop(self) -> dict[str, Any]:
        assert self.process.stdin is not None
        out, err = self.process.communicate(input="", timeout=120)
        if self.process.returncode != 0:
            raise RagstreamError(f"the flood failed: {err[-2000:]}")
        doc: dict[str, Any] = json.loads(out)
        return doc


@dataclass(frozen=True)
class FloodSpec:
    """How the noisy tenant floods (module docstring)."""

    honor_retry_hint: bool = True
    #: client threads (honouring) or asyncio callers (ignoring)
    concurrency: int = 10
    #: calls/s cap of the asyncio flood (None: as fast as answered)
    rate: float | None = None
    connections: int = 8


@contextmanager
def _flooding(target: str, queries: Path, spec: FloodSpec) -> Iterator[_Flood]:
    command = [
        sys.executable,
        "-m",
        "ragdev.bench.loadgen",
        "--flood",
        "--target",
        target,
        "--token",
        TOKENS[NOISY],
        "--concurrency",
        str(spec.concurrency),
        str(queries),
    ]
    if not spec.honor_retry_hint:
        command += ["--ignore-retry-hint", "--asyncio", "--connections", str(spec.connections)]
        command += ["--rate", str(spec.rate or 0)]
    process = subprocess.Popen(
        command, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
    )
    flood = _Flood(process)
    try:
        yield flood
    finally:
        if process.poll() is None:
            process.kill()
            process.wait()


def _probe(target: str, queries: Sequence[str], tmp: Path) -> list[dict[str, Any]]:
    """The quiet tenant's calls, one at a time (the load generator's samples)."""
    path = tmp / "quiet.json"
    path.write_text(json.dumps(list(queries)), encoding="utf-8")
    done = subprocess.run(
        [
            sys.executable,
            "-m",
            "ragdev.bench.loadgen",
            "--target",
            target,
            "--token",
            TOKENS[QUIET],
            "--concurrency",
            "1",
            str(path),
        ],
        capture_output=True,
        text=True,
        timeout=60 + 30 * len(queries),
        check=False,
    )
    if done.returncode != 0:
        raise RagstreamError(f"the quiet probe failed: {done.stderr[-2000:]}")
    samples: list[dict[str, Any]] = json.loads(done.stdout)["samples"]
    return samples


def _quiet_summary(samples: Sequence[dict[str, Any]]) -> dict[str, Any]:
    statuses = Counter(s["status"] for s in samples)
    errors = sum(n for status, n in statuses.items() if status.startswith("GRPC_"))
    excluded: Counter[str] = Counter()
    for s in samples:
        excluded.update(s.get("excluded", {}))
    return {
        "calls": len(samples),
        "latency_ms": percentiles([s["latency_s"] for s in samples], scale=1000.0, digits=2),
        "statuses": dict(statuses),
        "excluded_by_reason": dict(excluded),
        "error_share": round(errors / len(samples), 4),
        "refused": statuses.get("GRPC_RESOURCE_EXHAUSTED", 0),
    }


def _flood_summary(parts: Sequence[dict[str, Any]]) -> dict[str, Any]:
    statuses: Counter[str] = Counter()
    answered: list[float] = []
    refused: list[float] = []
    wall = cpu = waited = 0.0
    started = 0
    for part in parts:
        started += part.get("started", sum(part["statuses"].values()))
        statuses.update(part["statuses"])
        answered.extend(part["answered_latency_s"])
        refused.extend(part.get("refused_latency_s", ()))
        wall += part["wall_s"]
        cpu += part["cpu_s"]
        waited += part["retry_wait_s"]
    total = sum(statuses.values())
    exhausted = statuses.get("GRPC_RESOURCE_EXHAUSTED", 0)
    summary: dict[str, Any] = {
        "statuses": dict(statuses),
        # offered: calls made (those still in flight when the flood stopped included)
        "calls_per_s": round(started / wall, 1) if wall else 0.0,
        "answered_per_s": round(statuses.get("OK", 0) / wall, 1) if wall else 0.0,
        "refused_per_s": round(exhausted / wall, 1) if wall else 0.0,
        "refused_share": round(exhausted / total, 4) if total else 0.0,
        "answered_latency_ms": percentiles(answered, scale=1000.0, digits=2) if answered else {},
        "retry_hint_wait_s": round(waited, 2),
        "load_generator_cores_busy": round(cpu / wall, 3) if wall else 0.0,
    }
    if refused:
        summary["refused_latency_ms"] = percentiles(refused, scale=1000.0, digits=2)
    return summary


def _noisy_counts(registry: CollectorRegistry) -> dict[str, int]:
    """The server's admission counters of the noisy tenant's class: refused (all reasons),
    deferred refusals, and those not deferred because the deferral bounds were reached."""
    value = registry.get_sample_value
    refused = sum(
        value("ragstream_retrieve_admission_total", {"tenant_class": "noisy", "outcome": o}) or 0
        for o in ("rate", "concurrency", "overload")
    )
    deferrals = {
        outcome: value(
            "ragstream_retrieve_deferred_refusals_total",
            {"tenant_class": "noisy", "outcome": outcome},
        )
        or 0
        for outcome in ("deferred", "bound")
    }
    return {
        "refused": int(refused),
        "deferred": int(deferrals["deferred"]),
        "deferral_bound": int(deferrals["bound"]),
    }


def run(
    *,
    points: int = 20_000,
    calls: int = 100,
    rounds: int = 2,
    share: int = 1,
    share_rps: float | None = 10.0,
    flood_factor: int = 10,
    honor_retry_hint: bool = True,
    flood_concurrency: int = 300,
    flood_rate: float | None = None,
    flood_connections: int = 8,
    defer_s: float | None = None,
    defer_refusals_per_s: float | None = None,
    data_dir: Path | None = None,
    seed: int = 0,
) -> dict[str, Any]:
    """Build both tenants, then `rounds` x (alone, flood, comparison flood) with `calls` quiet
    calls per phase; a JSON-able report. Honouring the retry hint, the flood is `share` x
    `flood_factor` threads and the comparison is admission off; ignoring it, the flood is
    `flood_concurrency` asyncio callers (at most `flood_rate` calls/s) and the comparison is
    deferral off. `defer_s`, `defer_refusals_per_s`: the product server's admission settings
    of those names (None: their defaults)."""
    if min(points, calls, rounds, share, flood_factor, flood_concurrency, flood_connections) < 1:
        raise ConfigError(
            "points, calls, rounds, share, flood factor, flood concurrency and flood "
            "connections must all be >= 1"
        )
    ignoring = not honor_retry_hint
    phases = PHASES_IGNORING if ignoring else PHASES
    spec = (
        FloodSpec(False, flood_concurrency, flood_rate, min(flood_connections, flood_concurrency))
        if ignoring
        else FloodSpec(True, share * flood_factor)
    )
    load_before = os.getloadavg()
    with ExitStack() as stack:
        root = run_dir(stack, data_dir, "noisy")
        tmp = Path(stack.enter_context(tempfile.TemporaryDirectory(prefix="ragstream-noisy-")))
        plan = PlanConfig()
        store = EdgeStore(root / "store", schema=payload_schema(plan))
        stack.callback(store.close)
        embedder = LocalOnnxEmbedder(LocalEmbedderConfig())
        stack.callback(embedder.close)
        began = time.perf_counter()
        prose, entities = _build(root, store, embedder, points, seed)
        build_s = time.perf_counter() - began
        rng = np.random.default_rng(seed + 1)
        flood_queries = tmp / "flood.json"
        flood_queries.write_text(json.dumps(_questions(prose, 500, rng)), encoding="utf-8")
        quotas = QuotaBook(
            default=TenantQuota(concurrency=8),
            tenants={
                NOISY: TenantQuota(
                    concurrency=share, requests_per_s=share_rps, tenant_class="noisy"
                )
            },
        )
        base = RetrieveSettings(
            grpc=GrpcSettings(port=0),
            auth=AuthSettings(
                tokens={t: hashlib.sha256(v.encode()).hexdigest() for t, v in TOKENS.items()}
            ),
            store=StoreSettings(data_dir=root / "store"),
            sor=SorSettings(kind="sqlite", sqlite_path=root / "sor.sqlite"),
            plan=plan,
            publish_enabled=False,
            metrics_port=0,
        )
        # the product's server (True), and the one of the comparison phase (False)
        overrides = {"defer_s": defer_s, "defer_refusals_per_s": defer_refusals_per_s}
        deferring = AdmissionSettings.model_validate(
            {"quotas": quotas, **{k: v for k, v in overrides.items() if v is not None}}
        )
        admissions = {
            True: deferring,
            False: AdmissionSettings(quotas=quotas, defer_s=0)
            if ignoring
            else AdmissionSettings(enabled=False, quotas=quotas),
        }
        targets: dict[bool, str] = {}
        registries: dict[bool, CollectorRegistry] = {}
        for product, admission in admissions.items():
            settings = base.model_copy(update={"admission": admission})
            registries[product] = CollectorRegistry()
            app = build_app(settings, registries[product], store=store, embedder=embedder)
            targets[product] = stack.enter_context(_in_process(app))[0]
            _probe(targets[product], _questions(prose, 10, rng), tmp)  # warm-up
        quiet: dict[str, list[dict[str, Any]]] = {p: [] for p in phases}
        floods: dict[str, list[dict[str, Any]]] = {p: [] for p in phases[1:]}
        loads: dict[str, list[list[float]]] = {p: [] for p in phases}
        # this process's CPU (the servers, the store) over each phase's wall time
        server_cpu: dict[str, list[float]] = {p: [0.0, 0.0] for p in phases}
        for n in range(rounds):
            for phase in phases:
                queries = _questions(prose, calls, rng)
                loads[phase].append([round(x, 2) for x in os.getloadavg()])
                log.info("round %d, phase %s: %d quiet calls", n + 1, phase, calls)
                if phase == "alone":
                    cpu, wall = time.process_time(), time.perf_counter()
                    quiet[phase] += _probe(targets[True], queries, tmp)
                else:
                    target = targets[phase == "flood"]
                    with _flooding(target, flood_queries, spec) as flood:
                        time.sleep(1.0)  # the flood is under way before the first probe
                        cpu, wall = time.process_time(), time.perf_counter()
                        quiet[phase] += _probe(target, queries, tmp)
                        floods[phase].append(flood.stop())
                server_cpu[phase][0] += time.process_time() - cpu
                server_cpu[phase][1] += time.perf_counter() - wall
    load_after = os.getloadavg()

    summaries = {phase: _quiet_summary(samples) for phase, samples in quiet.items()}
    for phase, (cpu_s, wall_s) in server_cpu.items():
        summaries[phase]["server_cores_busy"] = round(cpu_s / wall_s, 3) if wall_s else 0.0
    alone = summaries["alone"]["latency_ms"]
    for phase in phases[1:]:
        mine = summaries[phase]["latency_ms"]
        summaries[phase]["p50_over_alone"] = round(mine["p50"] / alone["p50"], 2)
        summaries[phase]["p95_over_alone"] = round(mine["p95"] / alone["p95"], 2)
    flooded = summaries["flood"]
    # what admission did with the noisy tenant's calls on each phase's server (a honouring
    # flood is never deferred: its callers wait out their hints)
    counts = {phase: _noisy_counts(registries[phase == "flood"]) for phase in phases[1:]}
    refused_noisy = _noisy_counts(registries[True])["refused"]
    if ignoring:
        flood_what = (
            f"one asyncio client with {spec.concurrency} calls in flight over "
            f"{spec.connections} connections, "
            + (f"at most {spec.rate:g} calls/s, " if spec.rate else "")
            + "retrying a refused call at once (ignoring the retry hint); the comparison "
            "phase runs the same flood against a second server on the same store with "
            "admission on and refusals never deferred (admission.defer_s = 0)"
        )
    else:
        flood_what = (
            f"{spec.concurrency} client threads ({flood_factor}x the noisy tenant's share "
            f"of {share} calls in flight"
            + (f" and {share_rps:g} calls/s" if share_rps else "")
            + "), each calling back to back, waiting the server's retry hint "
            "(grpc-retry-pushback-ms) after a refusal; the comparison phase runs the same "
            "flood against a second server on the same store with admission off"
        )
    return {
        "benchmark": "ragstream bench noisy: a quiet tenant's latency while another floods",
        "what": (
            "client-side latency of the quiet tenant's Retrieve calls (one at a time, "
            "ragdev.bench.loadgen in a process of its own) in rounds of three phases run back "
            f"to back: {', '.join(phases)}. The flood (a process of its own): {flood_what}. "
            "Both servers run in this process (1 server process each)."
        ),
        "machine": machine_info(
            load_before, load_after, ("onnxruntime", "qdrant-edge-py", "grpcio")
        ),
        "load_average_at_phase_starts": loads,
        "data": {
            "points_per_tenant": points,
            "entities": entities,
            "build_seconds": round(build_s, 1),
            "vectors": "as ragstream bench retrieve: synthetic chunk vectors around REAL "
            "sentence embeddings",
            "sor": "SQLite, every call verified against it",
        },
        "config": {
            "quotas": quotas.model_dump(mode="json"),
            "max_in_flight": admissions[True].max_in_flight,
            "deferral": admissions[True].model_dump(
                include={
                    "defer_s",
                    "defer_max_s",
                    "defer_refusals_per_s",
                    "defer_grace",
                    "defer_max_per_tenant",
                    "defer_max_total",
                }
            ),
            "workers": base.grpc.workers,
            "flood_threads": 0 if ignoring else spec.concurrency,
            "flood_concurrency": spec.concurrency,
            "flood_rate": spec.rate,
            "flood_connections": spec.connections if ignoring else spec.concurrency,
            "honor_retry_hint": honor_retry_hint,
            "calls_per_phase_per_round": calls,
            "rounds": rounds,
            "seed": seed,
        },
        "quiet": summaries,
        "flood": {phase: _flood_summary(parts) for phase, parts in floods.items()},
        "noisy_refused_by_admission": refused_noisy,
        "noisy_admission_by_phase": counts,
        "goal": {
            "goal": GOAL_TEXT_IGNORING if ignoring else GOAL_TEXT,
            "unloaded_p95_ms": alone["p95"],
            "flooded_p95_ms": flooded["latency_ms"]["p95"],
            "p95_ratio": flooded["p95_over_alone"],
            "target_ratio": GOAL_P95_RATIO,
            "quiet_refused": flooded["refused"],
            "met": flooded["p95_over_alone"] <= GOAL_P95_RATIO and flooded["refused"] == 0,
        },
    }


def main(argv: Sequence[str] | None = None, prog: str | None = None) -> int:
    """Command line entry: print the report as JSON."""
    parser = argparse.ArgumentParser(
        prog=prog, formatter_class=HelpFormatter, description=(__doc__ or "").split("\n\n")[0]
    )
    parser.add_argument("--points", type=int, default=20_000, help="chunks per tenant")
    parser.add_argument("--calls", type=int, default=100, help="quiet calls per phase and round")
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--share", type=int, default=1, help="the noisy tenant's concurrency")
    parser.add_argument(
        "--share-rps",
        type=float,
        default=10.0,
        help="the noisy tenant's calls/s (0: no rate quota, its share is its concurrency)",
    )
    parser.add_argument(
        "--flood-factor",
        type=int,
        default=10,
        help="honouring flood: client threads per call of the noisy tenant's share",
    )
    parser.add_argument(
        "--ignore-retry-hint",
        action="store_true",
        help="the flood ignores the retry hints (an asyncio client); compared with deferral off",
    )
    parser.add_argument(
        "--flood-concurrency",
        type=int,
        default=300,
        help="ignoring flood: calls in flight",
    )
    parser.add_argument(
        "--flood-rate",
        type=float,
        default=0.0,
        help="ignoring flood: calls/s cap (0: as fast as answered)",
    )
    parser.add_argument(
        "--flood-connections", type=int, default=8, help="ignoring flood: gRPC channels"
    )
    parser.add_argument(
        "--defer-s",
        type=float,
        default=None,
        help="the server's admission.defer_s (default: the setting's default)",
    )
    parser.add_argument(
        "--defer-refusals-per-s",
        type=float,
        default=None,
        help="the server's admission.defer_refusals_per_s (default: the setting's default)",
    )
    parser.add_argument("--data-dir", type=Path, default=None)
    args = parser.parse_args(argv)
    logging.basicConfig(
        level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s"
    )
    report = run(
        points=args.points,
        calls=args.calls,
        rounds=args.rounds,
        share=args.share,
        share_rps=args.share_rps or None,
        flood_factor=args.flood_factor,
        honor_retry_hint=not args.ignore_retry_hint,
        flood_concurrency=args.flood_concurrency,
        flood_rate=args.flood_rate or None,
        flood_connections=args.flood_connections,
        defer_s=args.defer_s,
        defer_refusals_per_s=args.defer_refusals_per_s,
        data_dir=args.data_dir,
    )
    return emit(report)


if __name__ == "__main__":
    sys.exit(main())
