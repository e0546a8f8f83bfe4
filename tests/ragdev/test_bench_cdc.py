"""`ragstream bench cdc` as a user runs it (small sizes): one JSON document on stdout with what
was measured through real Debezium, on what data, with what configuration."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from tests.conftest import REPO_ROOT

pytestmark = [pytest.mark.integration, pytest.mark.slow]


def test_bench_cdc_prints_one_json_report_of_freshness_and_snapshot() -> None:
    done = subprocess.run(
        [
            sys.executable,
            "-m",
            "ragstream.cli",
            "bench",
            "cdc",
            "--changes",
            "12",
            "--rate",
            "10",
            "--snapshot-rows",
            "60",
            "--bulk-rows",
            "40",
            "--bulk-probe-rate",
            "5",
        ],
        capture_output=True,
        text=True,
        timeout=600,
        check=False,
        env={**os.environ, "PYTHONPATH": str(REPO_ROOT)},
    )
    assert done.returncode == 0, done.stderr[-3000:]
    report = json.loads(done.stdout)  # exactly one document
    snapshot = report["measured"]["snapshot"]
    (freshness,) = report["measured"]["freshness"]
    assert snapshot["rows"] == 60 and snapshot["end_to_end_rows_per_s"] > 0
    assert snapshot["end_to_end_vs_embedder_alone"] > 0
    # the drain leaves out Kafka Connect's start: faster than end to end
    assert snapshot["drain_rows_per_s"] > snapshot["end_to_end_rows_per_s"]
    assert len(snapshot["embedder_alone_before_after_rows_per_s"]) == 2
    assert freshness["changes"] == 12 and freshness["rate_per_s"] == 10
    # every change timed by the worker; the sample (every 5th at 10/s, 2/s) through Retrieve
    acked = freshness["commit_to_acknowledged_s"]
    assert 0 < acked["p50"] <= acked["p95"] <= acked["p99"] <= acked["max"]
    searchable = freshness["commit_to_searchable_s"]
    assert searchable["changes"] == 3
    assert 0 < searchable["p50"] <= searchable["max"]
    # a row cannot be returned before its write was acknowledged; probed once acknowledged
    assert freshness["acknowledged_to_searchable_s"]["p50"] >= 0
    assert 3 <= freshness["retrieve_calls"] < 12
    stages = freshness["stages_s"]
    assert set(stages) == {"debezium", "fetch", "to_handler", "handle"}
    assert all(stages[s]["p50"] >= 0 for s in stages)
    per_batch = freshness["handle_ms_per_batch"]
    assert per_batch["handle"] >= per_batch["embed"] > 0
    assert freshness["cores_used"]["debezium (Kafka Connect JVM)"] > 0
    assert snapshot["bench_process_cpu_ms_per_row"] >= snapshot["worker_cpu_ms_per_row"] > 0
    # like with like: the snapshot's rows and the steady changes have the same text form
    assert abs(freshness["tokens_per_change"] - snapshot["tokens_per_row"]) < 3
    cpu = freshness["cpu_ms_per_change"]
    assert (
        cpu["bench process (worker + Retrieve + prober)"]
        > cpu["worker (bench process minus the bench's threads)"]
        > 0
    )
    assert freshness["cpu_bound_rate_vs_snapshot"] > 0
    assert report["configuration"]["debezium"]["poll.interval.ms"] == 100  # the shipped value
    assert report["configuration"]["embedder"].endswith("(float execution)")  # the default
    goal = report["goals"]["freshness_p95_s"]
    assert goal["measured"] == [acked["p95"], searchable["p95"]]
    assert set(report["legend"]) >= {"commit_to_acknowledged_s", "stages_s.handle"}
    # (c): the quiet tenant alone, then the bulk with fairness on and off, side by side
    bulk = report["bulk"]
    assert bulk["unloaded"]["quiet_changes"] == 20
    for phase, fair in (("fairness_on", True), ("fairness_off", False)):
        assert bulk[phase]["fair"] is fair and bulk[phase]["bulk_rows"] == 40
        assert bulk[phase]["bulk_rows_per_s"] > 0 and bulk[phase]["quiet_changes"] >= 1
        memory = bulk[phase]["memory"]
        assert memory["rss_peak_mb"] >= memory["rss_start_mb"] > 0
        assert 0 < memory["read_ahead_peak_records"] <= bulk["read_ahead_budget"]["records"]
    assert set(bulk["goals"]) == {
        "quiet_p95_s",
        "quiet_p95_vs_unloaded",
        "worker_share_broker_to_searchable_p95_vs_unloaded",
        "bulk_drain_vs_fairness_off",
    }
    fair = bulk["fairness_on"]
    assert fair["quiet_broker_to_searchable_s"]["p50"] > 0 and fair["bulk_on_broker_s"] >= 0
