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
    freshness = report["measured"]["freshness"]
    assert snapshot["rows"] == 60 and snapshot["end_to_end_rows_per_s"] > 0
    assert snapshot["end_to_end_vs_embedder_alone"] > 0
    latency = freshness["commit_to_searchable_s"]
    assert freshness["changes"] == 12
    assert 0 < latency["p50"] <= latency["p95"] <= latency["p99"] <= latency["max"]
    stages = freshness["stages_s"]
    assert set(stages) == {
        "debezium (commit -> broker timestamp)",
        "broker (-> a consumer receives it)",
        "ragstream (-> Retrieve returns it)",
    }
    assert {"embed", "write", "decode"} <= set(freshness["worker_stage_means"])
    assert report["configuration"]["debezium"]["poll.interval.ms"] == 100  # the shipped value
    assert report["goals"]["freshness_p95_s"]["measured"] == latency["p95"]
