"""Documents from the system of record: PDF, DOCX, XLSX and CSV files as indexable text.

A table mapping names a document column (`DocumentSource`): the file's bytes in a binary column
(`bytea`/BLOB; Debezium sends them base64-encoded) or a reference to it (a path under a root
directory, or an allow-listed `http(s)://` URL). Its format comes from a format column, a MIME
type column or the bytes themselves (`sniff`).

The entity's content is then the file itself (base64) and its content hash the SHA-256 of the
file's bytes, so a row update that leaves the file alone re-embeds nothing. Text is extracted
only when chunks are needed, in a separate process with time and memory limits
(`Extractor`, docs/decisions/document-extraction.md), into segments that know where they came
from (PDF page, DOCX heading path, sheet and rows); every chunk carries that locator.

A document that cannot be indexed raises `DocumentError` with a reason code from `REASONS`;
the worker sends its record to the DLQ under that code (and counts it per code).
"""

from __future__ import annotations

from ragcore.documents.extract import REASONS, ExtractedDocument, Segment
from ragcore.documents.formats import DOCUMENT_FORMATS, format_from_mime, sniff
from ragcore.documents.sandbox import ExtractionLimits, Extractor
from ragcore.documents.source import (
    DOCUMENT_NAME,
    DocumentSource,
    decode_document,
    document_bytes,
    document_format,
    document_sha256,
    encode_document,
)

__all__ = [
    "DOCUMENT_FORMATS",
    "DOCUMENT_NAME",
    "REASONS",
    "DocumentSource",
    "ExtractedDocument",
    "ExtractionLimits",
    "Extractor",
    "Segment",
    "decode_document",
    "document_bytes",
    "document_format",
    "document_sha256",
    "encode_document",
    "format_from_mime",
    "sniff",
]
