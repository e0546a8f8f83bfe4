"""Text extraction of PDF, DOCX, XLSX and CSV files through the sandboxed child: located
segments, and a reason code for every file that yields no text."""

from __future__ import annotations

import pytest

from ragcore.documents import ExtractionLimits, Extractor, sniff
from ragcore.documents.extract import ROWS_PER_SEGMENT
from ragcore.documents.text import document_text
from ragcore.errors import DocumentError, MappingError
from ragcore.normalize import NormalizeOptions
from ragdev.docgen import csv_bytes, docx_bytes, encrypted_pdf_bytes, pdf_bytes, xlsx_bytes
from schemas.entities import ContentFormat

pytestmark = pytest.mark.unit

DATASHEET = [
    ["P-100 centrifugal pump", "Flow up to 40 m3/h at 32 m head."],
    [],  # a drawing page: no text layer
    ["Seal kit SK-9 fits every P-100 built after 2021.", "Torque the gland nuts to 12 Nm."],
]


def test_pdf_pages_become_segments_with_their_page_numbers(extractor: Extractor) -> None:
    document = extractor.extract("pdf", pdf_bytes(DATASHEET))
    assert [(s.page, s.path) for s in document.segments] == [(1, ("p. 1",)), (3, ("p. 3",))]
    assert "Seal kit SK-9" in document.segments[1].text
    assert "Seal kit" not in document.segments[0].text
    assert document.pages == 3  # the blank page was read too


def test_uncompressed_pdf_streams_extract_alike(extractor: Extractor) -> None:
    document = extractor.extract("pdf", pdf_bytes(DATASHEET, compress=False))
    assert [s.page for s in document.segments] == [1, 3]


def test_a_password_protected_pdf_is_pdf_encrypted(extractor: Extractor) -> None:
    with pytest.raises(DocumentError) as info:
        extractor.extract("pdf", encrypted_pdf_bytes(DATASHEET))
    assert info.value.code == "PDF_ENCRYPTED"
    assert isinstance(info.value, MappingError)  # the worker DLQs it like any mapping error


def test_a_pdf_without_text_is_no_text_layer(extractor: Extractor) -> None:
    with pytest.raises(DocumentError) as info:
        extractor.extract("pdf", pdf_bytes([[], []]))
    assert info.value.code == "NO_TEXT_LAYER"


@pytest.mark.parametrize("data", [b"\x01\n", b"\x7f\x1b\n"])
def test_a_document_whose_text_is_only_control_characters_is_no_text_layer(
    extractor: Extractor, data: bytes
) -> None:
    # extraction keeps the segment (`\x01` is no whitespace), the normalizer removes every
    # character of it: no text, like a scan (it used to yield no chunks and no dead letter)
    with pytest.raises(DocumentError) as info:
        document_text(extractor, data, ContentFormat.CSV, NormalizeOptions())
    assert info.value.code == "NO_TEXT_LAYER"


def test_a_truncated_pdf_is_document_corrupt(extractor: Extractor) -> None:
    with pytest.raises(DocumentError) as info:
        extractor.extract("pdf", pdf_bytes(DATASHEET)[:300])
    assert info.value.code == "DOCUMENT_CORRUPT"


def test_more_pages_than_the_limit_is_document_too_large() -> None:
    small = Extractor(ExtractionLimits(max_pages=2))
    try:
        with pytest.raises(DocumentError) as info:
            small.extract("pdf", pdf_bytes([["one"], ["two"], ["three"]]))
        assert info.value.code == "DOCUMENT_TOO_LARGE"
    finally:
        small.close()


def test_docx_sections_carry_their_heading_path_and_tables_their_rows(
    extractor: Extractor,
) -> None:
    data = docx_bytes(
        [
            ("h1", "Pump maintenance"),
            ("p", "Read the whole procedure first."),
            ("h2", "Lockout"),
            ("p", "Isolate the motor at the breaker."),
            ("table", "Step | Action\n1 | Close suction valve V1"),
            ("h2", "Seal change"),
            ("p", "Fit seal kit SK-9."),
        ]
    )
    document = extractor.extract("docx", data)
    assert [s.path for s in document.segments] == [
        ("Pump maintenance",),
        ("Pump maintenance", "Lockout"),
        ("Pump maintenance", "Seal change"),
    ]
    assert "1 | Close suction valve V1" in document.segments[1].text
    assert document.segments[2].text.startswith("Seal change")


def test_spreadsheet_rows_are_header_value_lines_numbered_as_in_the_sheet(
    extractor: Extractor,
) -> None:
    rows: list[list[object]] = [["sku", "description", "price"]]
    rows += [[f"SK-{n}", f"seal kit {n}", n * 1.5] for n in range(1, ROWS_PER_SEGMENT + 6)]
    data = xlsx_bytes([("Prices", rows), ("Empty", [])])
    document = extractor.extract("xlsx", data)
    first, second = document.segments
    assert first.sheet == "Prices" and first.path == ("Prices", f"rows 2-{ROWS_PER_SEGMENT + 1}")
    assert first.text.splitlines()[0] == "sku: SK-1; description: seal kit 1; price: 1.5"
    assert first.rows == tuple(range(2, ROWS_PER_SEGMENT + 2))
    assert second.rows[-1] == ROWS_PER_SEGMENT + 6
    assert len(first.text.splitlines()) == len(first.rows)


def test_csv_rows_are_segments_without_a_sheet(extractor: Extractor) -> None:
    data = csv_bytes([["part", "stock"], ["SK-9", 14], ["", ""], ["SK-10", 3]])
    (segment,) = extractor.extract("csv", data).segments
    assert segment.sheet is None and segment.path == ("rows 2-4",)
    assert segment.text == "part: SK-9; stock: 14\npart: SK-10; stock: 3"
    assert segment.rows == (2, 4)


def test_a_package_declaring_more_than_the_inflated_limit_is_refused_before_inflating() -> None:
    rows = [["text"]] + [["x" * 1000] for _ in range(2000)]  # ~2 MB of sheet XML
    small = Extractor(ExtractionLimits(max_uncompressed_mb=1))
    try:
        with pytest.raises(DocumentError) as info:
            small.extract("xlsx", xlsx_bytes([("Big", rows)]))
        assert info.value.code == "DOCUMENT_TOO_LARGE"
        assert "inflates to" in str(info.value)
    finally:
        small.close()


@pytest.mark.parametrize(
    ("data", "expected"),
    [
        (pdf_bytes([["a"]]), ContentFormat.PDF),
        (docx_bytes([("p", "a")]), ContentFormat.DOCX),
        (xlsx_bytes([("S", [["a"], [1]])]), ContentFormat.XLSX),
        (csv_bytes([["a", "b"], [1, 2], [3, 4]]), ContentFormat.CSV),
        (b"just a sentence, nothing more", None),
        (b"PK\x03\x04 not really a zip", None),
        (b"\x89PNG\r\n\x1a\n\x00\x00", None),
    ],
)
def test_the_bytes_tell_the_format(data: bytes, expected: ContentFormat | None) -> None:
    assert sniff(data) is expected
