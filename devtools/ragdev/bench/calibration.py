"""What one calibration costs: an eval set indexed once through the real ingest path, then each
tenant's `fit_calibration` run `--rounds` times, with the process's CPU and wall time of each.

Each fit's stored calibration (the report's `seconds` left out, the clock fixed) is hashed, so
two trees' runs on the same data and seed can be compared result for result: a change meant to
make the calibration cheaper must print the same `sha256` (docs/decisions/abstention-threshold.md).
CPU is the whole process's (`time.process_time`: onnxruntime's threads included); the
embedding cache (`--cache-dir`) holds the passages' vectors, never the calibration queries'.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import sys
import time
from contextlib import ExitStack
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from prometheus_client import CollectorRegistry

from ragcore.embedders import build_embedder
from ragcore.embedders.cache import EmbeddingCacheConfig
from ragcore.embedders.local_onnx import LocalEmbedderConfig
from ragcore.kafka_config import KafkaSettings
from ragcore.settings import SorSettings, StoreSettings
from ragcore.sparse import Bm25Encoder
from ragcore.store.base import PayloadSchema
from ragcore.wiring import build_store
from ragdev.bench.machine import emit, machine_info, run_dir
from ragdev.eval.runner import EVAL_PLAN, _records, _sqlite_sor, evalset_tenants
from ragdev.eval.sets import load_named
from retrieval_api.calibration import CalibrationSettings, fit_calibration
from retrieval_api.candidates import CandidateSearch
from retrieval_api.pipeline_settings import RetrievalConfig
from streams.app import build_worker
from streams.settings import IngestSettings

#: the stored calibration's time, fixed so that equal fits hash alike
FITTED_AT = datetime(2026, 1, 1, tzinfo=UTC)


def run(
    dataset: str,
    *,
    rounds: int,
    seed: int,
    threshold_queries: int | None,
    cache_dir: Path | None,
    data_dir: Path | None,
) -> dict[str, Any]:
    """Index `dataset`, then fit each tenant's calibration `rounds` times (see the module)."""
    evalset = load_named(dataset)
    settings = CalibrationSettings.from_command(
        CalibrationSettings.positives,
        seed=seed,
        max_false_abstention=CalibrationSettings.max_false_abstention,
        threshold_queries=threshold_queries,
    )
    load_before = os.getloadavg()
    fits: list[dict[str, Any]] = []
    with ExitStack() as stack:
        root = run_dir(stack, data_dir, "calibration")
        _sqlite_sor(root / "sor.sqlite", evalset)
        store_settings = StoreSettings(data_dir=root / "store")
        store = build_store(store_settings, PayloadSchema())
        stack.callback(store.close)
        model = build_embedder(
            LocalEmbedderConfig(),
            cache=EmbeddingCacheConfig(path=(cache_dir or root) / "embedding-cache.sqlite"),
        )
        stack.callback(model.close)
        worker = build_worker(
            IngestSettings(
                kafka=KafkaSettings(bootstrap_servers="127.0.0.1:1"),  # never contacted
                store=store_settings,
                sor=SorSettings(kind="sqlite", sqlite_path=root / "sor.sqlite"),
                plan=EVAL_PLAN,
                embedding_cache=None,
            ),
            CollectorRegistry(),
            store=store,
            embedder=model,
        )
        stack.callback(worker.close)
        if worker.handler.handle(_records(evalset)):
            raise RuntimeError(f"{dataset}: entities were rejected")
        for tenant in evalset_tenants(evalset):
            version = worker.registry.active_version(tenant)
            if version is not None:
                store.optimize(worker.registry.manifest(tenant, version).index_name)
        search = CandidateSearch(
            config=RetrievalConfig(), encoder=Bm25Encoder(), store=store, registry=worker.registry
        )
        for n in range(rounds):
            for tenant in evalset_tenants(evalset):
                index = worker.registry.lookup(tenant, None)
                cpu, wall = time.process_time(), time.perf_counter()
                fitted = fit_calibration(
                    search, index, model, store, settings=settings, clock=lambda: FITTED_AT
                )
                cpu, wall = time.process_time() - cpu, time.perf_counter() - wall
                stored = json.loads(fitted.to_json())
                del stored["report"]["seconds"]
                text = json.dumps(stored, sort_keys=True)
                fits.append(
                    {
                        "round": n,
                        "tenant": tenant,
                        "cpu_s": round(cpu, 2),
                        "wall_s": round(wall, 2),
                        "load_average_1m": round(os.getloadavg()[0], 2),
                        "queries": stored["report"]["hard_threshold"]["queries"],
                        "fingerprint": fitted.fingerprint,
                        "sha256": hashlib.sha256(text.encode()).hexdigest(),
                    }
                )
                print(json.dumps(fits[-1]), file=sys.stderr, flush=True)
    return {
        "benchmark": "calibration",
        "dataset": dataset,
        "seed": seed,
        "threshold_queries": settings.threshold_queries,
        "fits": fits,
        "machine": machine_info(load_before, os.getloadavg(), ["onnxruntime", "numpy"]),
    }


def main(argv: list[str] | None = None, prog: str | None = None) -> int:
    """Command line entry: print the measurement as JSON."""
    parser = argparse.ArgumentParser(prog=prog, description=__doc__)
    parser.add_argument("--dataset", default="golden", help="an eval set (`ragstream eval`)")
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument(
        "--threshold-queries", type=int, default=None, help="default: the calibration's"
    )
    parser.add_argument("--cache-dir", type=Path, default=None, help="the passages' vectors")
    parser.add_argument("--data-dir", type=Path, default=None, help="kept (default: temporary)")
    args = parser.parse_args(argv)
    return emit(
        run(
            args.dataset,
            rounds=args.rounds,
            seed=args.seed,
            threshold_queries=args.threshold_queries,
            cache_dir=args.cache_dir,
            data_dir=args.data_dir,
        )
    )


if __name__ == "__main__":
    sys.exit(main())
