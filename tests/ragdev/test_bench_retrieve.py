"""`ragstream bench retrieve` end to end on a small index: the real gRPC server, the real local
embedder, qdrant-edge and the SQLite SoR; the report has the documented structure."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from ragdev.bench.retrieve import FLOOR, FLOOR_GOAL_RATIO, GOAL_P95_MS, run

pytestmark = [pytest.mark.integration, pytest.mark.slow]

STATUSES = {"SUCCESS", "NO_EVIDENCE"}


def test_small_run_reports_both_variants_and_the_floor_at_each_concurrency(
    tmp_path: Path,
) -> None:
    report = run(
        points=2000, queries=20, concurrency=(1, 2), data_dir=tmp_path / "run", processes=(1, 2)
    )

    json.dumps(report)  # JSON-able as is
    machine = report["machine"]
    assert machine["cpu_count"] >= 1
    assert len(machine["load_average_before"]) == 3
    assert len(machine["load_average_after"]) == 3

    data = report["data"]
    assert data["vectors"].startswith("synthetic")
    assert data["query_embedding"].startswith("real local ONNX embedder")

    index = report["index"]
    assert index["points"] == 2000
    assert index["dimension"] == 384
    assert 2000 / 3 <= index["entities"] <= 2000
    assert {"upsert", "optimize", "embed_sentences"} <= set(index["build_seconds"])

    config = report["config"]
    assert config["top_k"] >= 1
    assert config["candidate_k"] >= config["top_k"]
    from ragcore.fusion import FUSION_METHODS

    assert config["fusion"] in FUSION_METHODS
    assert config["reranker"] is None
    assert config["workers"] >= 1

    results = report["results"]
    assert {
        (r["variant"], r["sor_verification"], r["concurrency"], r["processes"]) for r in results
    } == {
        (variant, variant == "sor_verification", level, processes)
        for variant in ("sor_verification", "no_verification", FLOOR)
        for level in (1, 2)
        for processes in (1, 2)
    }
    floors = [r for r in results if r["variant"] == FLOOR]
    for r in floors:
        assert r["n"] == 20
        # the floor answers every call from the engine's hits: it never fails
        assert set(r["statuses"]) <= STATUSES, r["statuses"]
        assert r["cpu_ms_per_request"]["server_process"] > 0
        assert r["query_cache"] == {}  # no pipeline, no cache
        assert len(r["server_process_cpu_shares"]) == r["processes"]
    results = [r for r in results if r["variant"] != FLOOR]
    for r in results:
        floor = next(
            f
            for f in floors
            if (f["processes"], f["concurrency"]) == (r["processes"], r["concurrency"])
        )
        assert (
            r["floor"]["floor_cpu_ms_per_request"]
            == (floor["cpu_ms_per_request"]["server_process"])
        )
        assert r["floor"]["cpu_over_floor"] == pytest.approx(
            r["cpu_ms_per_request"]["server_process"]
            / floor["cpu_ms_per_request"]["server_process"],
            abs=1e-3,
        )
        assert sum(r["server_process_cpu_shares"]) == pytest.approx(1.0, abs=0.01)
    for r in results:
        assert r["n"] == 20
        assert sum(r["statuses"].values()) == 20
        # never FAILED, never a gRPC error: every call ran the whole pipeline
        assert set(r["statuses"]) <= STATUSES, r["statuses"]
        # every query was embedded or came from the query-vector cache, once
        assert sum(r["query_cache"].values()) == 20
        latency = r["latency_ms"]
        assert 0 < latency["p50"] <= latency["p95"] <= latency["p99"] <= latency["max"]
        assert r["qps"] > 0
        assert r["cpu_ms_per_request"]["server_process"] > 0
        assert r["cpu_limit"]["implied_limit_qps"] > 0
        stages = r["server_stage_ms_mean"]
        assert {"resolve", "embed", "search", "rank", "verify", "total"} <= set(stages)
        # the index and the SoR agree: the SoR check never excludes a result
        assert not {"STALE", "MISSING", "DELETED"} & set(r["excluded_by_reason"])
    # real query embeddings find the synthetic neighbourhoods: most calls return evidence
    assert all(r["statuses"].get("SUCCESS", 0) >= 10 for r in results)
    # several server processes answer exactly as one does (same index, same queries)
    for variant in ("sor_verification", "no_verification"):
        for level in (1, 2):
            one, two = (
                next(
                    r
                    for r in results
                    if (r["variant"], r["concurrency"], r["processes"]) == (variant, level, p)
                )
                for p in (1, 2)
            )
            assert one["statuses"] == two["statuses"] and one["mean_results"] == two["mean_results"]

    goals = report["goals"]
    latency_goals = [g for g in goals if "target_p95_ms" in g and g["concurrency"] == 1]
    assert {(g["variant"], g["processes"]) for g in latency_goals} == {
        (v, p) for v in ("sor_verification", "no_verification") for p in (1, 2)
    }
    floor_goals = [g for g in goals if "target_cpu_over_floor" in g]
    # one per SoR-verified row: 2 process counts x 2 concurrencies
    assert {(g["processes"], g["concurrency"]) for g in floor_goals} == {
        (p, c) for p in (1, 2) for c in (1, 2)
    }
    for g in floor_goals:
        assert g["variant"] == "sor_verification"
        assert g["met"] == (g["measured_cpu_over_floor"] <= FLOOR_GOAL_RATIO)
    for g in latency_goals:
        assert g["concurrency"] == 1
        assert g["target_p95_ms"] == GOAL_P95_MS
        assert g["met"] == (g["measured_p95_ms"] <= GOAL_P95_MS)
