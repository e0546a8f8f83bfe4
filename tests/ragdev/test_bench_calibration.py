"""`ragdev.bench.calibration` on a small eval set: each tenant's fit timed, and equal fits of the
same index and seed hash alike (the check a cheaper calibration must pass)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from ragcore.quality.dataset import EvalEntity, EvalQuery, EvalSet, QueryKind, save_evalset
from ragdev.bench.calibration import run

pytestmark = [pytest.mark.integration, pytest.mark.slow]

FACTS = (
    "Annual subscriptions are refunded pro rata within thirty days of renewal.",
    "Grease the bearings of the GX-PMP-4200 every 2,000 operating hours.",
    "The staging VPN certificate expires every ninety days and is renewed by IT.",
    "A SEV1 incident needs a public postmortem within five business days.",
    "Only trained staff with a yellow badge may drive a forklift in the hall.",
)


def test_fits_are_timed_and_equal_fits_hash_alike(tmp_path: Path) -> None:
    entities = tuple(
        EvalEntity(
            entity_id=f"{tenant}-{n}",
            tenant=tenant,
            entity_type="KNOWLEDGE_ARTIFACT",
            title=f"{tenant.title()} policy {n}",
            content=f"# {tenant.title()} policy {n}\n\n{fact} " * (3 if tenant == "acme" else 2),
        )
        for tenant in ("acme", "globex")
        for n, fact in enumerate(FACTS)
    )
    query = EvalQuery(
        query_id="q",
        text="refund",
        tenant="acme",
        kind=QueryKind.KEYWORD,
        answerable=True,
        relevant={"acme-0": 3},
    )
    path = tmp_path / "small.json"
    save_evalset(EvalSet(name="small", version="1", entities=entities, queries=(query,)), path)
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
