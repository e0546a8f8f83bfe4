"""Every benchmark, run as a user runs it (`ragstream bench TARGET ...` in a subprocess),
prints exactly one JSON document on stdout; its logs go to stderr. Small sizes: these runs
check the output contract, they measure nothing."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = [pytest.mark.integration, pytest.mark.slow]

RAGSTREAM = Path(sys.executable).with_name("ragstream")

SMALL = {
    "store": ["--sizes", "300", "--queries", "5"],
    "embedder": ["--n", "8", "--batch-size", "4", "--rounds", "1"],
    "ingest": [
        "--entities",
        "6",
        "--cached-entities",
        "10",
        "--steady-seconds",
        "1",
        "--steady-rate",
        "2",
        "--documents",
        "1",
    ],
    "retrieve": ["--points", "600", "--queries", "4", "--concurrency", "1,2"],
    "reconcile": ["--points", "60", "--repeats", "1", "--variants", "selector"],
    "tenants": ["--tenants", "3", "--docs", "2", "--queries", "5"],
}


@pytest.mark.parametrize("target", sorted(SMALL))
def test_the_benchmark_prints_exactly_one_json_document(target: str, tmp_path: Path) -> None:
    done = subprocess.run(
        [str(RAGSTREAM), "bench", target, *SMALL[target]],
        capture_output=True,
        text=True,
        timeout=600,
        env={**os.environ, "RAGSTREAM_CACHE_DIR": str(tmp_path / "cache")},
        check=False,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    report = json.loads(done.stdout)  # raises on a second document or any stray output
    assert isinstance(report, dict) and report
    # what was measured, on what data and configuration, on which machine
    text = json.dumps(report)
    assert "cpu_count" in text, f"{target}: the report does not describe the machine"


def test_a_benchmark_s_own_help_is_reachable() -> None:
    done = subprocess.run(
        [str(RAGSTREAM), "bench", "store", "--help"],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert done.returncode == 0 and "--sizes" in done.stdout
