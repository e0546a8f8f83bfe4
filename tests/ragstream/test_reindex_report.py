"""The reindex report's JSON form (what `ragstream reindex` prints)."""

from __future__ import annotations

import json

import pytest

from ragstream.reindex import ReindexReport
from streams.ingest import Rejection

pytestmark = pytest.mark.unit


def test_the_report_serializes_its_rejections_and_counts_them() -> None:
    report = ReindexReport(tenant="acme", model="m@1", old_version=1, new_version=2, resumed=False)
    report.rejected = [Rejection(f"e{n}", "EMPTY_CONTENT", "no text") for n in range(60)]
    doc = json.loads(json.dumps(report.to_dict()))
    assert doc["rejected_count"] == 60 and len(doc["rejected"]) == 50
    assert doc["rejected"][0] == {"entity_id": "e0", "code": "EMPTY_CONTENT", "reason": "no text"}
    assert (doc["outcome"], doc["old_version"], doc["new_version"]) == ("built", 1, 2)
