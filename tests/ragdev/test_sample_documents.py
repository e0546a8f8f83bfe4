"""The sample corpus's files are the project's own: regenerated, they are byte for byte the
golden set's PDF, and each extracts with the locators the demo and the golden queries cite."""

from __future__ import annotations

import pytest

from ragcore.documents import Extractor, decode_document
from ragcore.quality.dataset import load_evalset
from ragdev.docgen import pdf_bytes
from ragdev.eval import GOLDEN_PATH
from ragdev.sample_documents import DPA_PAGES, sample_files

pytestmark = pytest.mark.unit


def test_the_golden_pdf_is_the_generated_dpa() -> None:
    entity = load_evalset(GOLDEN_PATH).entity("acme-dpa")
    assert decode_document(entity.content) == pdf_bytes(DPA_PAGES, title="Acme DPA")


def test_every_sample_file_extracts_with_locators() -> None:
    extractor = Extractor()
    try:
        found = {}
        for row in sample_files():
            fmt = row["file_name"].rsplit(".", 1)[1]
            found[row["file_name"]] = [s.path for s in extractor.extract(fmt, row["body"]).segments]
    finally:
        extractor.close()
    assert found["gx950-datasheet.pdf"] == [(f"p. {n}",) for n in range(1, 6)]
    assert found["acme-dpa.pdf"] == [("p. 1",), ("p. 2",), ("p. 3",)]
    assert ("Mechanical seal change on GX pumps", "Lockout") in found["seal-change.docx"]
    assert found["spare-parts.xlsx"] == [("Seal kits", "rows 2-4"), ("Impellers", "row 2")]
    assert found["on-call.csv"] == [("rows 2-4",)]
