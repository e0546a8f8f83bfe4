"""`ragdev.bench.reconcile` on a small index: qdrant-edge, the file registry and the SQLite
SoR built consistently, every variant measured in its own process; the report adds up."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from ragcore.errors import ConfigError
from ragdev.bench.reconcile import RECONCILE_FIELDS, VARIANTS, main, run

pytestmark = pytest.mark.integration

POINTS = 2000
PER_ENTITY = 10


def test_small_run_finds_no_drift_and_scans_every_point(tmp_path: Path) -> None:
    report = run(POINTS, chunks_per_entity=PER_ENTITY, repeats=1, data_dir=tmp_path / "run")

    json.dumps(report)  # JSON-able as is
    assert report["consistent"] is True
    assert report["machine"]["cpu_count"] >= 1
    assert report["machine"]["packages"]["qdrant-edge-py"]
    data = report["data"]
    assert data["points"] == POINTS
    assert data["entities"] == POINTS // PER_ENTITY
    assert data["expected_drift"] == 0
    index = report["index"]
    assert index["collection"] == "rag__bench__v1"
    assert {"generate", "upsert", "sor_insert", "total"} <= set(index["build_seconds"])
    assert report["config"]["selected_fields"] == [*RECONCILE_FIELDS, "tenant_id"]

    results = {r["variant"]: r for r in report["results"]}
    assert set(results) == {v.name for v in VARIANTS}
    for result in results.values():
        assert result["consistent"] is True
        assert result["counted_points"] == POINTS
        assert result["peak_rss_mib"] > 0
        [only] = result["runs"]
        assert only == result["best_run"]
        assert only["drift"] == 0
        assert only["points_scanned"] == POINTS
        assert only["indexed_entities"] == only["sor_entities"] == POINTS // PER_ENTITY
        # each figure is rounded to 1 ms on its own: allow the rounding of the two parts
        parts = only["index_scroll_seconds"] + only["sor_scan_seconds"]
        assert only["total_seconds"] >= parts - 0.001
        assert only["points_per_s"] > 0

    # The selector reaches the engine: only the compared keys come back...
    selected = sorted([*RECONCILE_FIELDS, "tenant_id"])
    assert results["selector"]["payload_keys_per_point"] == selected
    assert results["selector_computed_hash"]["payload_keys_per_point"] == selected
    # ...while the comparison variant reads whole payloads, texts included.
    full = set(results["full_payload"]["payload_keys_per_point"])
    assert {"text", "title", "locator", *selected} <= full


def test_main_writes_the_report_and_refuses_bad_arguments(tmp_path: Path) -> None:
    out = tmp_path / "report.json"
    code = main(["--points", "120", "--repeats", "1", "--variants", "selector", "--out", str(out)])
    assert code == 0
    report = json.loads(out.read_text(encoding="utf-8"))
    assert [r["variant"] for r in report["results"]] == ["selector"]
    assert report["results"][0]["best_run"]["points_scanned"] == 120
    with pytest.raises(ConfigError):
        run(0)
    with pytest.raises(ConfigError):
        run(10, variants=["nope"])
