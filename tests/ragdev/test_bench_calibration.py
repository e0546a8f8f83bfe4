"""`ragdev.bench.calibration` on a small eval set: each tenant's fit timed, and equal fits of the
same index and seed hash alike (the check a cheaper calibration must pass)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from ragcore.quality.dataset import save_evalset
from ragdev.bench.calibration import run
from tests.retrieval_api.test_calibration import small_set

pytestmark = [pytest.mark.integration, pytest.mark.slow]


def test_fits_are_timed_and_equal_fits_hash_alike(tmp_path: Path) -> None:
    acme = small_set()
    # a second tenant with another corpus: part of the same topics, shorter
    globex = tuple(
        entity.model_copy(
            update={
                "entity_id": f"globex-{entity.entity_id}",
                "tenant": "globex",
                "content": entity.content[: len(entity.content) * 2 // 3],
            }
        )
        for entity in acme.entities[:6]
    )
    path = tmp_path / "small.json"
    save_evalset(acme.model_copy(update={"entities": (*acme.entities, *globex)}), path)
    report = run(
        str(path), rounds=2, seed=1, threshold_queries=2, cache_dir=None, data_dir=tmp_path / "run"
    )

    json.dumps(report)  # JSON-able as is
    assert report["threshold_queries"] == 2
    fits = report["fits"]
    assert [(f["round"], f["tenant"]) for f in fits] == [
        (0, "acme"),
        (0, "globex"),
        (1, "acme"),
        (1, "globex"),
    ]
    assert all(f["cpu_s"] > 0 and f["wall_s"] > 0 and f["queries"] > 0 for f in fits)
    first, second = fits[:2], fits[2:]
    # the same index and seed fit the same calibration; two indexes fit two
    assert [f["sha256"] for f in first] == [f["sha256"] for f in second]
    assert first[0]["sha256"] != first[1]["sha256"]
