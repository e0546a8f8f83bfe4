"""The extraction phase of `ragstream bench ingest`: pages/s beside chunks/s, per format."""

from __future__ import annotations

import pytest

from ragcore.embedders.local_onnx import MINILM_SPEC
from ragcore.prepare import Preparer
from ragdev.bench.ingest import documents_throughput

pytestmark = pytest.mark.unit


def test_documents_throughput_counts_pages_and_chunks_per_format() -> None:
    preparer = Preparer(MINILM_SPEC)
    try:
        report = documents_throughput(preparer, 2)
    finally:
        preparer.close()
    assert report["files"] == 6
    by_format = report["by_format"]
    assert set(by_format) == {"pdf", "docx", "xlsx"}
    assert by_format["pdf"]["pages"] == 12  # six pages per datasheet copy
    assert by_format["docx"]["pages"] == 4  # two heading sections per procedure
    assert by_format["xlsx"]["pages"] == 6  # 60 rows in blocks of 40, and a 4-row sheet
    assert report["pages"] == 22
    assert report["chunks"] == sum(f["chunks"] for f in by_format.values())
    assert report["pages_per_s"] > 0 and report["chunks_per_s"] > 0
