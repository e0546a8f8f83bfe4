"""Which document format a file is: from a declared name, a MIME type, or its bytes."""

from __future__ import annotations

import csv
import io
import zipfile

from schemas.entities import ContentFormat

#: The formats `ragcore.documents` extracts text from.
DOCUMENT_FORMATS: tuple[ContentFormat, ...] = (
    ContentFormat.PDF,
    ContentFormat.DOCX,
    ContentFormat.XLSX,
    ContentFormat.CSV,
)

_MIME: dict[str, ContentFormat] = {
    "application/pdf": ContentFormat.PDF,
    "application/x-pdf": ContentFormat.PDF,
    "application/vnd.openxmlformats-officedocument.wordprocessingml.document": ContentFormat.DOCX,
    "application/vnd.openxmlformats-officedocument.spreadsheetml.sheet": ContentFormat.XLSX,
    "text/csv": ContentFormat.CSV,
    "application/csv": ContentFormat.CSV,
}

#: How far into a file the sniffer looks for a PDF header (the spec allows leading junk).
_PDF_HEADER_WINDOW = 1024


def format_from_mime(mime: str) -> ContentFormat | None:
    """The document format of a MIME type (parameters such as `; charset=` ignored)."""
    return _MIME.get(mime.split(";", 1)[0].strip().lower())


def sniff(data: bytes) -> ContentFormat | None:
    """The document format of `data` by its content, or None when it is none of them.

    PDF by its `%PDF-` header; DOCX and XLSX are ZIP packages told apart by their main part
    (`word/document.xml`, `xl/workbook.xml`); CSV is UTF-8 text the csv sniffer finds a
    delimiter in (`,`, `;` or tab) on more than one line.
    """
    if b"%PDF-" in data[:_PDF_HEADER_WINDOW]:
        return ContentFormat.PDF
    if data.startswith(b"PK\x03\x04"):
        try:
            names = set(zipfile.ZipFile(io.BytesIO(data)).namelist())
        except (zipfile.BadZipFile, ValueError, OSError):
            return None
        if "word/document.xml" in names:
            return ContentFormat.DOCX
        if "xl/workbook.xml" in names:
            return ContentFormat.XLSX
        return None
    return ContentFormat.CSV if _looks_like_csv(data) else None


def _looks_like_csv(data: bytes) -> bool:
    sample_bytes = data[:8192]
    try:
        sample = sample_bytes.decode("utf-8-sig")
    except UnicodeDecodeError:
        # the window may cut a multi-byte character: retry without the last few bytes
        try:
            sample = sample_bytes[:-3].decode("utf-8-sig")
        except UnicodeDecodeError:
            return False
    lines = [line for line in sample.splitlines() if line.strip()]
    if len(lines) < 2 or "\x00" in sample:
        return False
    try:
        dialect = csv.Sniffer().sniff("\n".join(lines[:20]), delimiters=",;\t")
    except csv.Error:
        return False
    return all(dialect.delimiter in line for line in lines[:5])
