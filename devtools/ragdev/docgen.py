"""Documents the project generates itself: PDF, DOCX, XLSX and CSV files for the sample corpus,
the tests and the ingest benchmark.

PDFs are written directly (a minimal PDF 1.4 writer: one Helvetica text object per page, a
correct cross-reference table), so the tests need no PDF-writing dependency; DOCX and XLSX use
the readers' own libraries (python-docx, openpyxl). The same arguments give the same text (and,
for PDF and CSV, the same bytes; ZIP packages carry their write time).
"""

from __future__ import annotations

import csv
import io
import zlib
from collections.abc import Sequence
from datetime import UTC, datetime

_PAGE_W, _PAGE_H = 612, 792  # US Letter in points
_LINE_H = 14
_MARGIN = 72


def _escape(text: str) -> str:
    return text.replace("\\", "\\\\").replace("(", "\\(").replace(")", "\\)")


def pdf_bytes(pages: Sequence[Sequence[str]], *, title: str = "", compress: bool = True) -> bytes:
    """A PDF with one page per item of `pages`, each a list of text lines (latin-1 text).
    A page with no lines gets a drawn rectangle only: no text layer, like a scan."""
    objects: list[bytes] = []

    def add(body: bytes) -> int:
        objects.append(body)
        return len(objects)

    catalog = add(b"")  # filled in below, once the page tree's number is known
    pages_id = add(b"")
    font = add(b"<< /Type /Font /Subtype /Type1 /BaseFont /Helvetica /Encoding /WinAnsiEncoding >>")
    kids: list[int] = []
    for lines in pages:
        if lines:
            ops = [f"BT /F1 11 Tf {_LINE_H} TL {_MARGIN} {_PAGE_H - _MARGIN} Td"]
            ops += [f"({_escape(line)}) Tj T*" for line in lines]
            ops.append("ET")
        else:
            ops = ["0.5 g 72 72 468 648 re f"]
        stream = "\n".join(ops).encode("latin-1")
        if compress:
            data = zlib.compress(stream)
            content = add(
                b"<< /Length %d /Filter /FlateDecode >>\nstream\n" % len(data)
                + data
                + b"\nendstream"
            )
        else:
            content = add(b"<< /Length %d >>\nstream\n" % len(stream) + stream + b"\nendstream")
        kids.append(
            add(
                b"<< /Type /Page /Parent %d 0 R /MediaBox [0 0 %d %d] "
                b"/Resources << /Font << /F1 %d 0 R >> >> /Contents %d 0 R >>"
                % (pages_id, _PAGE_W, _PAGE_H, font, content)
            )
        )
    objects[catalog - 1] = b"<< /Type /Catalog /Pages %d 0 R >>" % pages_id
    objects[pages_id - 1] = b"<< /Type /Pages /Kids [%s] /Count %d >>" % (
        b" ".join(b"%d 0 R" % k for k in kids),
        len(kids),
    )
    info = add(b"<< /Title (%s) /Producer (ragdev.docgen) >>" % _escape(title).encode("latin-1"))
    out = bytearray(b"%PDF-1.4\n%\xe2\xe3\xcf\xd3\n")
    offsets = []
    for number, body in enumerate(objects, start=1):
        offsets.append(len(out))
        out += b"%d 0 obj\n" % number + body + b"\nendobj\n"
    xref = len(out)
    out += b"xref\n0 %d\n0000000000 65535 f \n" % (len(objects) + 1)
    out += b"".join(b"%010d 00000 n \n" % o for o in offsets)
    out += b"trailer\n<< /Size %d /Root %d 0 R /Info %d 0 R >>\nstartxref\n%d\n%%%%EOF\n" % (
        len(objects) + 1,
        catalog,
        info,
        xref,
    )
    return bytes(out)


def encrypted_pdf_bytes(pages: Sequence[Sequence[str]], password: str = "secret") -> bytes:
    """The same PDF encrypted with a user password (RC4-128: no crypto library needed)."""
    # here: `ragstream sor` imports this module and must answer at once
    from pypdf import PdfReader, PdfWriter  # noqa: PLC0415

    writer = PdfWriter(clone_from=PdfReader(io.BytesIO(pdf_bytes(pages))))
    writer.encrypt(user_password=password, owner_password=password + "-owner", algorithm="RC4-128")
    out = io.BytesIO()
    writer.write(out)
    return out.getvalue()


def docx_bytes(blocks: Sequence[tuple[str, str]]) -> bytes:
    """A DOCX from `(kind, text)` blocks: kind `h1`..`h3` for headings, `p` for paragraphs,
    `table` for a table given as rows joined by newlines and cells by ` | `."""
    import docx  # noqa: PLC0415 - `ragstream sor` imports this module

    document = docx.Document()
    document.core_properties.created = datetime(2026, 1, 1, tzinfo=UTC)
    for kind, text in blocks:
        if kind.startswith("h") and kind[1:].isdigit():
            document.add_heading(text, level=int(kind[1:]))
        elif kind == "table":
            rows = [row.split(" | ") for row in text.split("\n")]
            table = document.add_table(rows=len(rows), cols=max(len(r) for r in rows))
            for r, cells in enumerate(rows):
                for c, cell in enumerate(cells):
                    table.cell(r, c).text = cell
        else:
            document.add_paragraph(text)
    out = io.BytesIO()
    document.save(out)
    return out.getvalue()


def xlsx_bytes(sheets: Sequence[tuple[str, Sequence[Sequence[object]]]]) -> bytes:
    """An XLSX with one sheet per `(title, rows)`; the first row is the header."""
    import openpyxl  # noqa: PLC0415 - it imports numpy, which `ragstream sor` must not pay for

    workbook = openpyxl.Workbook()
    workbook.remove(workbook.worksheets[0])
    for title, rows in sheets:
        sheet = workbook.create_sheet(title)
        for row in rows:
            sheet.append(list(row))
    out = io.BytesIO()
    workbook.save(out)
    return out.getvalue()


def csv_bytes(rows: Sequence[Sequence[object]]) -> bytes:
    """A UTF-8 CSV of `rows` (the first row is the header)."""
    out = io.StringIO()
    csv.writer(out, lineterminator="\n").writerows(rows)
    return out.getvalue().encode("utf-8")
