"""Mutated documents (bit flips, truncation, spliced bytes) either extract or fail with a known
reason code; the child keeps answering either way."""

from __future__ import annotations

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from ragcore.documents import REASONS, Extractor
from ragcore.errors import DocumentError
from ragdev.docgen import csv_bytes, docx_bytes, pdf_bytes, xlsx_bytes

pytestmark = pytest.mark.unit

SEEDS = {
    "pdf": pdf_bytes([["Pump P-100", "Flow 40 m3/h"], ["Seal kit SK-9"]]),
    "pdf-raw": pdf_bytes([["Pump P-100", "Flow 40 m3/h"], ["Seal kit SK-9"]], compress=False),
    "docx": docx_bytes([("h1", "Lockout"), ("p", "Isolate the motor."), ("table", "a | b")]),
    "xlsx": xlsx_bytes([("Prices", [["sku", "price"], ["SK-9", 12.5]])]),
    "csv": csv_bytes([["sku", "price"], ["SK-9", 12.5]]),
}


@st.composite
def mutated(draw: st.DrawFn) -> tuple[str, bytes]:
    seed = draw(st.sampled_from(sorted(SEEDS)))
    data = bytearray(SEEDS[seed])
    for _ in range(draw(st.integers(1, 8))):
        kind = draw(st.sampled_from(["flip", "truncate", "insert", "delete", "duplicate"]))
        at = draw(st.integers(0, max(0, len(data) - 1)))
        if kind == "flip" and data:
            data[at] ^= 1 << draw(st.integers(0, 7))
        elif kind == "truncate":
            del data[at:]
        elif kind == "insert":
            data[at:at] = draw(st.binary(min_size=1, max_size=64))
        elif kind == "delete":
            del data[at : at + draw(st.integers(1, 256))]
        else:
            data[at:at] = data[at : at + draw(st.integers(1, 512))]
    return seed.split("-")[0], bytes(data)


@settings(
    max_examples=150,
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)
@given(case=mutated())
def test_mutated_files_extract_or_fail_with_a_reason(
    extractor: Extractor, case: tuple[str, bytes]
) -> None:
    fmt, data = case
    try:
        document = extractor.extract(fmt, data)
    except DocumentError as exc:
        assert exc.code in REASONS
        assert exc.code not in ("EXTRACTION_CRASHED", "EXTRACTION_TIMEOUT"), exc
    else:
        assert document.segments and all(s.text.strip() for s in document.segments)
