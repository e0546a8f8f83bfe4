"""Text extraction from PDF, DOCX, XLSX and CSV bytes into located segments.

Runs inside the extraction child process (`ragcore.documents.sandbox`): it parses untrusted
files with third-party parsers, so every failure becomes an `ExtractionFailure` with a reason
code, never a crash of the worker. Formats are plain strings here (`"pdf"`, ...).

Segments: a PDF page, a DOCX section (the paragraphs and tables under one heading path), or a
block of spreadsheet rows (one line per row, `header: value` pairs). A chunk never spans two
segments, so each chunk cites exactly one page, section or row range.
"""

from __future__ import annotations

import csv
import io
import zipfile
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from typing import Any

#: Reason codes of documents that cannot be indexed (DLQ code and metric label).
REASONS: dict[str, str] = {
    "PDF_ENCRYPTED": "the PDF is encrypted with a password",
    "NO_TEXT_LAYER": "no extractable text (a scan without OCR, or an empty document)",
    "DOCUMENT_TOO_LARGE": "over a size limit (bytes, pages, uncompressed size or text)",
    "DOCUMENT_CORRUPT": "the file cannot be parsed as its format",
    "DOCUMENT_FORMAT_UNKNOWN": "no supported format declared or recognisable in the bytes",
    "EXTRACTION_TIMEOUT": "extraction took longer than its time limit",
    "EXTRACTION_MEMORY_LIMIT": "extraction needed more memory than its limit",
    "EXTRACTION_CRASHED": "the extraction process died",
    "DOCUMENT_UNAVAILABLE": "a referenced file cannot be read (missing, refused, HTTP error)",
    "DOCUMENT_FETCH_TIMEOUT": "a referenced file's download took longer than fetch_deadline_s",
    "DOCUMENT_REFERENCE_REFUSED": "a reference outside the configured root or allow-list",
    "DOCUMENT_REFERENCE_INVALID": (
        "a reference that names no file (control characters, a malformed URL, an unsupported "
        "scheme, a name the file system refuses, over 4096 characters)"
    ),
}

#: Spreadsheet rows per segment (a segment is chunked on its own; rows are lines in it).
ROWS_PER_SEGMENT = 40


class ExtractionFailure(Exception):  # noqa: N818 - a result sent back to the parent, not a bug
    """Why a document yields no text; `code` is one of `REASONS`."""

    def __init__(self, code: str, message: str) -> None:
        super().__init__(message)
        self.code = code


@dataclass(frozen=True)
class Segment:
    """One located piece of a document's text.

    `path` is the citation after the file name: `("p. 3",)`, a DOCX heading path, or
    `(sheet, "rows 2-41")`. `rows` holds the spreadsheet row number of each line of `text`.
    """

    text: str
    path: tuple[str, ...] = ()
    page: int | None = None
    sheet: str | None = None
    rows: tuple[int, ...] = ()

    def to_json(self) -> dict[str, Any]:
        """A JSON-ready dict (the child sends segments to the parent as JSON)."""
        return {
            "text": self.text,
            "path": list(self.path),
            "page": self.page,
            "sheet": self.sheet,
            "rows": list(self.rows),
        }

    @staticmethod
    def from_json(doc: dict[str, Any]) -> Segment:
        """The inverse of `to_json`."""
        return Segment(
            text=str(doc["text"]),
            path=tuple(str(p) for p in doc["path"]),
            page=int(doc["page"]) if doc["page"] is not None else None,
            sheet=str(doc["sheet"]) if doc["sheet"] is not None else None,
            rows=tuple(int(r) for r in doc["rows"]),
        )


@dataclass(frozen=True)
class ExtractedDocument:
    """A document's text as located segments, and how many pages (PDF pages, DOCX sections,
    spreadsheet row blocks) it had."""

    fmt: str
    segments: tuple[Segment, ...]
    pages: int


@dataclass(frozen=True)
class Limits:
    """What one extraction may produce (the process limits are the sandbox's)."""

    max_pages: int = 2000
    max_chars: int = 2_000_000
    max_uncompressed_bytes: int = 200 * 1024 * 1024


def extract(fmt: str, data: bytes, limits: Limits) -> ExtractedDocument:
    """The text of `data` in `fmt` ("pdf", "docx", "xlsx", "csv") as segments.

    Raises ExtractionFailure with a reason code (NO_TEXT_LAYER when no segment holds text).
    """
    if fmt == "pdf":
        segments = _pdf(data, limits)
    elif fmt in ("docx", "xlsx"):
        _check_zip(data, limits)
        segments = _docx(data) if fmt == "docx" else _xlsx(data, limits)
    elif fmt == "csv":
        segments = _csv(data)
    else:
        raise ExtractionFailure("DOCUMENT_FORMAT_UNKNOWN", f"cannot extract format {fmt!r}")
    kept: list[Segment] = []
    chars = 0
    for segment in segments:
        if not segment.text.strip():
            continue
        chars += len(segment.text)
        if chars > limits.max_chars:
            raise ExtractionFailure(
                "DOCUMENT_TOO_LARGE", f"extracted text is over {limits.max_chars} characters"
            )
        kept.append(segment)
        if len(kept) > limits.max_pages:
            raise ExtractionFailure(
                "DOCUMENT_TOO_LARGE", f"more than {limits.max_pages} pages or row blocks"
            )
    if not kept:
        raise ExtractionFailure(
            "NO_TEXT_LAYER", f"the {fmt} has no extractable text (scanned or empty)"
        )
    # a PDF counts every page read (blank ones too); other formats their sections or row blocks
    pages = len(segments) if fmt == "pdf" else len(kept)
    return ExtractedDocument(fmt=fmt, segments=tuple(kept), pages=pages)


# --- PDF ---------------------------------------------------------------------------------------


def _pdf(data: bytes, limits: Limits) -> list[Segment]:
    from pypdf.errors import LimitReachedError  # noqa: PLC0415

    try:
        return _pdf_pages(data, limits)
    except LimitReachedError as exc:
        # pypdf's own decompression limits: a stream that would inflate past them
        raise ExtractionFailure("DOCUMENT_TOO_LARGE", f"PDF stream too large: {exc}") from exc


def _pdf_pages(data: bytes, limits: Limits) -> list[Segment]:
    # the parsers load in the extraction child only (the worker imports this module's types)
    from pypdf import PdfReader  # noqa: PLC0415
    from pypdf.errors import DependencyError, FileNotDecryptedError  # noqa: PLC0415

    reader = PdfReader(io.BytesIO(data))
    if reader.is_encrypted:
        # An owner-password-only PDF opens with the empty user password; others cannot.
        try:
            opened = reader.decrypt("")
        except (DependencyError, NotImplementedError) as exc:
            raise ExtractionFailure("PDF_ENCRYPTED", f"encrypted PDF: {exc}") from exc
        if not opened:
            raise ExtractionFailure("PDF_ENCRYPTED", "the PDF needs a password to open")
    try:
        count = len(reader.pages)
    except FileNotDecryptedError as exc:
        raise ExtractionFailure("PDF_ENCRYPTED", str(exc)) from exc
    if count > limits.max_pages:
        raise ExtractionFailure(
            "DOCUMENT_TOO_LARGE", f"the PDF has {count} pages, over the limit of {limits.max_pages}"
        )
    return [
        Segment(text=page.extract_text() or "", path=(f"p. {n}",), page=n)
        for n, page in enumerate(reader.pages, start=1)
    ]


# --- ZIP packages (DOCX, XLSX) ----------------------------------------------------------------


def _check_zip(data: bytes, limits: Limits) -> None:
    """Refuse a package whose parts would inflate past the limit, before anything inflates
    them (zipfile stops reading a member at its declared size, so the sum is an upper bound)."""
    try:
        infos = zipfile.ZipFile(io.BytesIO(data)).infolist()
    except (zipfile.BadZipFile, ValueError, OSError) as exc:
        raise ExtractionFailure("DOCUMENT_CORRUPT", f"not a ZIP package: {exc}") from exc
    total = sum(info.file_size for info in infos)
    if total > limits.max_uncompressed_bytes:
        raise ExtractionFailure(
            "DOCUMENT_TOO_LARGE",
            f"the package inflates to {total} bytes, over the limit of "
            f"{limits.max_uncompressed_bytes}",
        )


def _docx(data: bytes) -> list[Segment]:
    import docx  # noqa: PLC0415
    from docx.table import Table  # noqa: PLC0415

    document = docx.Document(io.BytesIO(data))
    segments: list[Segment] = []
    headings: list[str] = []
    lines: list[str] = []

    def flush() -> None:
        if lines:
            segments.append(Segment(text="\n\n".join(lines), path=tuple(headings)))
            lines.clear()

    for block in document.iter_inner_content():
        if isinstance(block, Table):
            lines.extend(_table_lines(block))
            continue
        text = block.text.strip()
        if not text:
            continue
        level = _heading_level(block.style.name if block.style is not None else "")
        if level is not None:
            flush()
            del headings[level - 1 :]
            headings.extend([""] * (level - 1 - len(headings)))
            headings.append(text)
            headings[:] = [h for h in headings if h]
        lines.append(text)
    flush()
    return segments


def _heading_level(style: str) -> int | None:
    if style == "Title":
        return 1
    if style.startswith("Heading "):
        number = style.removeprefix("Heading ").strip()
        if number.isdigit() and 1 <= int(number) <= 9:
            return int(number)
    return None


def _table_lines(table: Any) -> list[str]:
    out: list[str] = []
    for row in table.rows:
        cells = [" ".join(cell.text.split()) for cell in row.cells]
        # merged cells repeat their text in every grid cell they span
        unique = [c for n, c in enumerate(cells) if c and (n == 0 or c != cells[n - 1])]
        if unique:
            out.append(" | ".join(unique))
    return out


# --- spreadsheets ------------------------------------------------------------------------------


def _xlsx(data: bytes, limits: Limits) -> list[Segment]:
    import openpyxl  # noqa: PLC0415

    workbook = openpyxl.load_workbook(io.BytesIO(data), read_only=True, data_only=True)
    try:
        segments: list[Segment] = []
        for sheet in workbook.worksheets:
            rows = (
                (n, list(values))
                for n, values in enumerate(sheet.iter_rows(values_only=True), start=1)
            )
            segments.extend(_row_segments(rows, sheet.title, limits))
        return segments
    finally:
        workbook.close()


def _csv(data: bytes) -> list[Segment]:
    try:
        text = data.decode("utf-8-sig")
    except UnicodeDecodeError as exc:
        raise ExtractionFailure("DOCUMENT_CORRUPT", f"the CSV is not UTF-8: {exc}") from exc
    try:
        dialect: Any = csv.Sniffer().sniff(text[:8192], delimiters=",;\t")
    except csv.Error:
        dialect = csv.excel
    try:
        rows = [(n, list(r)) for n, r in enumerate(csv.reader(io.StringIO(text), dialect), 1)]
    except csv.Error as exc:
        raise ExtractionFailure("DOCUMENT_CORRUPT", f"the CSV cannot be parsed: {exc}") from exc
    return list(_row_segments(rows, None, Limits()))


def _row_segments(
    rows: Iterable[tuple[int, list[Any]]], sheet: str | None, limits: Limits
) -> Iterator[Segment]:
    """Rows as `header: value; ...` lines (the first non-empty row is the header), grouped
    into blocks of ROWS_PER_SEGMENT."""
    header: list[str] | None = None
    header_row: int | None = None
    block: list[tuple[int, str]] = []
    for number, values in rows:
        cells = [_cell(v) for v in values]
        if not any(cells):
            continue
        if header is None:
            header, header_row = cells, number
            continue
        pairs = [
            f"{header[i]}: {c}" if i < len(header) and header[i] else c
            for i, c in enumerate(cells)
            if c
        ]
        block.append((number, "; ".join(pairs)))
        if len(block) == ROWS_PER_SEGMENT:
            yield _rows_segment(block, sheet)
            block = []
    if block:
        yield _rows_segment(block, sheet)
    elif header is not None and header_row is not None:
        # a sheet of one row: index it as it stands
        yield _rows_segment([(header_row, "; ".join(c for c in header if c))], sheet)


def _rows_segment(block: list[tuple[int, str]], sheet: str | None) -> Segment:
    first, last = block[0][0], block[-1][0]
    return Segment(
        text="\n".join(line for _, line in block),
        path=_sheet_path(sheet, first, last),
        sheet=sheet,
        rows=tuple(n for n, _ in block),
    )


def _sheet_path(sheet: str | None, first: int, last: int) -> tuple[str, ...]:
    rows = f"row {first}" if first == last else f"rows {first}-{last}"
    return (sheet, rows) if sheet else (rows,)


def _cell(value: object) -> str:
    if value is None:
        return ""
    if isinstance(value, float) and value.is_integer():
        value = int(value)
    return " ".join(str(value).split())
