"""`ragstream bench noisy` end to end on small indexes: the real gRPC server with per-tenant
admission, the real local embedder, qdrant-edge and the SQLite SoR; a quiet tenant probes
while the other floods, honouring the retry hints or ignoring them. The report holds every
phase side by side; admission refuses only the flooding tenant, and only while it is on; a
flood ignoring the hints is deferred, and compared with the same flood with deferral off."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from ragdev.bench.noisy import GOAL_P95_RATIO, run

pytestmark = [pytest.mark.integration, pytest.mark.slow]


def test_small_run_reports_the_quiet_tenant_beside_its_unloaded_figures(tmp_path: Path) -> None:
    report = run(points=1500, calls=10, rounds=1, data_dir=tmp_path / "run")

    json.dumps(report)  # JSON-able as is
    assert report["machine"]["cpu_count"] >= 1
    quiet = report["quiet"]
    assert set(quiet) == {"alone", "flood", "flood_no_admission"}
    for phase in quiet.values():
        assert phase["calls"] == 10
        latency = phase["latency_ms"]
        assert 0 < latency["p50"] <= latency["p95"] <= latency["max"]
        # the quiet tenant is within its share: never refused, never failed
        assert phase["refused"] == 0 and phase["error_share"] == 0.0
        assert set(phase["statuses"]) <= {"SUCCESS", "NO_EVIDENCE"}
    for phase in ("flood", "flood_no_admission"):
        assert quiet[phase]["p95_over_alone"] == round(
            quiet[phase]["latency_ms"]["p95"] / quiet["alone"]["latency_ms"]["p95"], 2
        )
    flood = report["flood"]
    # with admission the flood (10 threads, a share of 1 call in flight) is shed ...
    refused = flood["flood"]["statuses"].get("GRPC_RESOURCE_EXHAUSTED", 0)
    assert refused > 0 and flood["flood"]["statuses"].get("OK", 0) > 0
    assert report["noisy_refused_by_admission"] == refused
    # the threads honour the hints: none of their refusals was deferred
    assert report["noisy_admission_by_phase"]["flood"]["deferred"] == 0
    assert flood["flood"]["retry_hint_wait_s"] > 0  # the clients waited the hints
    # ... and without it every flood call runs
    assert set(flood["flood_no_admission"]["statuses"]) == {"OK"}
    assert report["config"]["flood_threads"] == 10
    goal = report["goal"]
    assert goal["target_ratio"] == GOAL_P95_RATIO
    assert goal["met"] == (goal["p95_ratio"] <= GOAL_P95_RATIO and goal["quiet_refused"] == 0)


def test_a_flood_ignoring_the_retry_hints_is_compared_with_deferral_off(tmp_path: Path) -> None:
    report = run(
        points=1500,
        calls=10,
        rounds=1,
        honor_retry_hint=False,
        flood_concurrency=60,
        flood_connections=4,
        data_dir=tmp_path / "run",
    )

    json.dumps(report)
    quiet = report["quiet"]
    assert set(quiet) == {"alone", "flood", "flood_no_deferral"}
    for phase in quiet.values():
        assert phase["calls"] == 10 and phase["refused"] == 0 and phase["error_share"] == 0.0
        assert phase["server_cores_busy"] > 0
    assert set(report["load_average_at_phase_starts"]) == set(quiet)
    flood = report["flood"]
    for phase in ("flood", "flood_no_deferral"):
        assert set(flood[phase]["statuses"]) <= {"OK", "GRPC_RESOURCE_EXHAUSTED"}
        assert flood[phase]["retry_hint_wait_s"] == 0  # the hints were ignored
        assert flood[phase]["calls_per_s"] >= flood[phase]["answered_per_s"] > 0
    counts = report["noisy_admission_by_phase"]
    # the product's server deferred the flood's refusals; the comparison server never did
    assert counts["flood"]["deferred"] > 0
    assert counts["flood_no_deferral"]["deferred"] == 0
    assert counts["flood_no_deferral"]["refused"] > 0
    # held back, the same flood was refused far fewer times per second
    assert flood["flood"]["refused_per_s"] < flood["flood_no_deferral"]["refused_per_s"]
    assert report["config"]["flood_concurrency"] == 60
    assert report["goal"]["met"] == (
        report["goal"]["p95_ratio"] <= GOAL_P95_RATIO and report["goal"]["quiet_refused"] == 0
    )
