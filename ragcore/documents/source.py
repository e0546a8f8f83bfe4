"""Where a document's bytes come from: a binary column or a reference to a file.

A binary column (`bytea`, BLOB) carries the file in the row: Debezium sends it base64-encoded
in JSON (decoded to bytes when the event has a schema), a SoR read returns bytes. A reference
column carries a path under `root` or an `http(s)://` URL whose host is in `allowed_hosts`;
the file is read when the row is mapped, and its SHA-256 (not the row's) is the entity's content
hash, so a row update that leaves the file alone re-embeds nothing.
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import os
from pathlib import Path, PurePosixPath
from typing import Literal
from urllib.parse import unquote, urlsplit

from pydantic import BaseModel, ConfigDict, Field, model_validator

from ragcore.documents.formats import format_from_mime, sniff
from ragcore.errors import DocumentError, MappingError
from schemas.entities import ContentFormat

#: The metadata key of a document entity's file name (its chunks cite it).
DOCUMENT_NAME = "document_name"

_FORMAT_NAMES: dict[str, ContentFormat] = {
    "pdf": ContentFormat.PDF,
    "docx": ContentFormat.DOCX,
    "xlsx": ContentFormat.XLSX,
    "xlsm": ContentFormat.XLSX,
    "csv": ContentFormat.CSV,
}


class DocumentSource(BaseModel):
    """A table's document column: what it holds and how to read it (README: Documents)."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    #: The column holding the file (binary) or its path/URL (reference).
    column: str
    kind: Literal["binary", "reference"] = "binary"
    #: A column naming the format (`pdf`, `docx`, `xlsx`, `csv`, or a file extension).
    format_column: str | None = None
    #: A column holding the MIME type (`application/pdf`, ...). Without either, the bytes say.
    mime_type_column: str | None = None
    #: A column with the file name shown in citations (default: the reference's last path
    #: segment, else the row's title).
    name_column: str | None = None
    #: reference: the directory paths are resolved under (nothing outside it is read).
    root: Path | None = None
    #: reference: hosts `http(s)://` references may name (exact, case-insensitive).
    allowed_hosts: tuple[str, ...] = ()
    max_bytes: int = Field(default=50 * 1024 * 1024, gt=0)
    fetch_timeout_s: float = Field(default=10.0, gt=0)

    @model_validator(mode="after")
    def _check(self) -> DocumentSource:
        if self.kind == "binary" and (self.root is not None or self.allowed_hosts):
            raise ValueError("root and allowed_hosts apply to reference columns only")
        if self.kind == "reference" and self.root is None and not self.allowed_hosts:
            raise ValueError("a reference column needs a root directory or allowed_hosts")
        return self

    def columns(self) -> list[str]:
        """The columns this source reads."""
        named = [self.column, self.format_column, self.mime_type_column, self.name_column]
        return [c for c in named if c is not None]


def document_bytes(source: DocumentSource, value: object, where: str) -> tuple[bytes, str | None]:
    """The file's bytes and, for a reference, its file name. DocumentError with a reason
    (DOCUMENT_TOO_LARGE, DOCUMENT_UNAVAILABLE, DOCUMENT_REFERENCE_REFUSED) when it cannot be
    had; MappingError when the column holds no file at all."""
    if value is None:
        raise MappingError(f"{where}: document column {source.column!r} is null")
    if source.kind == "binary":
        data = _binary(value, source.column, where)
        _check_size(len(data), source, where)
        return data, None
    if not isinstance(value, str) or not value.strip():
        raise MappingError(f"{where}: reference column {source.column!r} must be a non-empty path")
    reference = value.strip()
    if reference.lower().startswith(("http://", "https://")):
        return _fetch(source, reference, where), _url_name(reference)
    return _read_file(source, reference, where), PurePosixPath(reference).name or None


def document_format(
    source: DocumentSource, declared: object, mime: object, data: bytes, where: str
) -> ContentFormat:
    """The document's format: the format column, else the MIME type column, else the bytes."""
    if isinstance(declared, str) and declared.strip():
        name = declared.strip().lower().lstrip(".")
        fmt = _FORMAT_NAMES.get(name) or format_from_mime(name)
        if fmt is None:
            raise DocumentError(
                "DOCUMENT_FORMAT_UNKNOWN",
                f"{where}: format {declared!r} is not one of {sorted(_FORMAT_NAMES)}",
            )
        return fmt
    if isinstance(mime, str) and mime.strip():
        fmt = format_from_mime(mime)
        if fmt is not None:
            return fmt
        raise DocumentError(
            "DOCUMENT_FORMAT_UNKNOWN", f"{where}: MIME type {mime!r} is not a supported document"
        )
    sniffed = sniff(data)
    if sniffed is None:
        raise DocumentError(
            "DOCUMENT_FORMAT_UNKNOWN",
            f"{where}: no format declared and the bytes are not PDF, DOCX, XLSX or CSV",
        )
    return sniffed


def encode_document(data: bytes) -> str:
    """A document's bytes as entity content (base64)."""
    return base64.b64encode(data).decode("ascii")


def decode_document(content: str) -> bytes:
    """The bytes of a document entity's content."""
    try:
        return base64.b64decode(content, validate=True)
    except (binascii.Error, ValueError) as exc:
        raise DocumentError("DOCUMENT_CORRUPT", f"document content is not base64: {exc}") from exc


def document_sha256(content: str) -> str:
    """The content hash of a document entity: SHA-256 hex of the file's bytes."""
    return hashlib.sha256(decode_document(content)).hexdigest()


def _binary(value: object, column: str, where: str) -> bytes:
    if isinstance(value, bytes | bytearray | memoryview):
        return bytes(value)
    if isinstance(value, str):
        # schemaless JSON: Debezium's `binary.handling.mode=base64` (its default for JSON)
        try:
            return base64.b64decode(value, validate=True)
        except (binascii.Error, ValueError) as exc:
            raise MappingError(
                f"{where}: binary column {column!r} is neither bytes nor base64 ({exc})"
            ) from exc
    raise MappingError(f"{where}: binary column {column!r} holds {type(value).__name__}")


def _check_size(size: int, source: DocumentSource, where: str) -> None:
    if size > source.max_bytes:
        raise DocumentError(
            "DOCUMENT_TOO_LARGE",
            f"{where}: the document has {size} bytes, over the limit of {source.max_bytes}",
        )


def _read_file(source: DocumentSource, reference: str, where: str) -> bytes:
    if source.root is None:
        raise DocumentError(
            "DOCUMENT_REFERENCE_REFUSED", f"{where}: file references need a configured root"
        )
    path_text = unquote(reference[7:]) if reference.startswith("file://") else reference
    root = source.root.resolve()
    path = (root / path_text).resolve()  # an absolute path_text replaces root; checked below
    if not path.is_relative_to(root):
        raise DocumentError(
            "DOCUMENT_REFERENCE_REFUSED", f"{where}: {reference!r} is outside the document root"
        )
    try:
        with path.open("rb") as handle:
            size = os.fstat(handle.fileno()).st_size
            _check_size(size, source, where)
            data = handle.read(source.max_bytes + 1)
    except OSError as exc:
        raise DocumentError(
            "DOCUMENT_UNAVAILABLE", f"{where}: cannot read {reference!r}: {exc.strerror}"
        ) from exc
    _check_size(len(data), source, where)
    return data


def _fetch(source: DocumentSource, url: str, where: str) -> bytes:
    import httpx  # noqa: PLC0415 - only reference columns with URLs need it

    host = (urlsplit(url).hostname or "").lower()
    if host not in {h.lower() for h in source.allowed_hosts}:
        raise DocumentError(
            "DOCUMENT_REFERENCE_REFUSED", f"{where}: host {host!r} is not in allowed_hosts"
        )
    data = bytearray()
    try:
        # no redirects: a redirect could leave the allow-list
        with httpx.stream("GET", url, timeout=source.fetch_timeout_s) as response:
            if response.status_code != 200:
                raise DocumentError(
                    "DOCUMENT_UNAVAILABLE", f"{where}: GET {url} answered {response.status_code}"
                )
            for part in response.iter_bytes():
                data += part
                _check_size(len(data), source, where)
    except httpx.HTTPError as exc:
        raise DocumentError("DOCUMENT_UNAVAILABLE", f"{where}: GET {url} failed: {exc}") from exc
    return bytes(data)


def _url_name(url: str) -> str | None:
    return PurePosixPath(unquote(urlsplit(url).path)).name or None
