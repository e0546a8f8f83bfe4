"""Where a document's bytes come from: a binary column or a reference to a file.

A binary column (`bytea`, BLOB) carries the file in the row: Debezium sends it base64-encoded
in JSON (decoded to bytes when the event has a schema), a SoR read returns bytes. A reference
column carries a path under `root` or an `http(s)://` URL whose host is in `allowed_hosts`;
the file is read when the row is mapped, and its SHA-256 (not the row's) is the entity's content
hash, so a row update that leaves the file alone re-embeds nothing.

A reference is row data: whatever it holds (a NUL byte, a malformed URL, a scheme other than
http, https and file, a name the file system refuses) is a `DocumentError` with a reason code,
never an exception of the worker. An HTTP download is bounded as a whole (`fetch_deadline_s`),
not only per phase, and every message naming a URL shows it without userinfo, query and
fragment (`ragcore.redact`).
"""

from __future__ import annotations

import base64
import binascii
import errno
import hashlib
import os
import re
import stat
import threading
from dataclasses import dataclass
from pathlib import Path, PurePosixPath
from typing import TYPE_CHECKING, Literal
from urllib.parse import unquote, urlsplit

from pydantic import BaseModel, ConfigDict, Field, model_validator

from ragcore.documents.formats import format_from_mime, sniff
from ragcore.errors import DocumentError, MappingError
from ragcore.redact import redact_text, redact_url
from schemas.entities import ContentFormat

if TYPE_CHECKING:
    import httpx

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
    #: reference: the timeout of each phase of an HTTP download (connect, each read, ...).
    fetch_timeout_s: float = Field(default=10.0, gt=0)
    #: reference: the time a whole HTTP download may take, however the server paces it.
    fetch_deadline_s: float = Field(default=60.0, gt=0)

    @model_validator(mode="after")
    def _check(self) -> DocumentSource:
        if self.kind == "binary" and (self.root is not None or self.allowed_hosts):
            raise ValueError("root and allowed_hosts apply to reference columns only")
        if self.kind == "reference" and self.root is None and not self.allowed_hosts:
            raise ValueError("a reference column needs a root directory or allowed_hosts")
        if self.fetch_deadline_s < self.fetch_timeout_s:
            raise ValueError(
                f"fetch_deadline_s ({self.fetch_deadline_s:g}) must be at least "
                f"fetch_timeout_s ({self.fetch_timeout_s:g})"
            )
        return self

    def columns(self) -> list[str]:
        """The columns this source reads."""
        named = [self.column, self.format_column, self.mime_type_column, self.name_column]
        return [c for c in named if c is not None]


#: The longest reference read (a path or URL; Linux's PATH_MAX, and far past any real URL).
MAX_REFERENCE_CHARS = 4096
_SCHEME = re.compile(r"[A-Za-z][A-Za-z0-9+.\-]{0,31}")


def document_bytes(source: DocumentSource, value: object, where: str) -> tuple[bytes, str | None]:
    """The file's bytes and, for a reference, its file name. DocumentError with a reason
    (DOCUMENT_TOO_LARGE, DOCUMENT_UNAVAILABLE, DOCUMENT_FETCH_TIMEOUT,
    DOCUMENT_REFERENCE_REFUSED, DOCUMENT_REFERENCE_INVALID) when it cannot be had;
    MappingError when the column holds no file at all. Nothing else, whatever the value."""
    if value is None:
        raise MappingError(f"{where}: document column {source.column!r} is null")
    if source.kind == "binary":
        data = _binary(value, source.column, where)
        _check_size(len(data), source, where)
        return data, None
    if not isinstance(value, str) or not value.strip():
        raise MappingError(f"{where}: reference column {source.column!r} must be a non-empty path")
    reference = value.strip()
    _check_reference(reference, where)
    scheme, separator, _ = reference.partition("://")
    if not _SCHEME.fullmatch(scheme):
        separator = ""  # `a/b://c` is a path, however odd
    if separator and scheme.lower() in ("http", "https"):
        url = _parse_url(reference, where)
        return _fetch(source, url, where), _url_name(url)
    if separator and scheme.lower() != "file":
        raise DocumentError(
            "DOCUMENT_REFERENCE_INVALID",
            f"{where}: reference {_shown(reference)} has the scheme {scheme[:32]!r}; only "
            "http, https and file references (or paths) are read",
        )
    path_text = unquote(reference[7:]) if separator else reference
    _check_path(path_text, reference, where)
    return _read_file(source, path_text, reference, where), PurePosixPath(path_text).name or None


def _shown(reference: str) -> str:
    """A reference as an error message shows it: URLs redacted, at most 200 characters."""
    shown = redact_text(reference)
    return repr(shown if len(shown) <= 200 else shown[:200] + "…")


def _check_reference(reference: str, where: str) -> None:
    if len(reference) > MAX_REFERENCE_CHARS:
        raise DocumentError(
            "DOCUMENT_REFERENCE_INVALID",
            f"{where}: the reference has {len(reference)} characters, over the limit of "
            f"{MAX_REFERENCE_CHARS}",
        )
    _check_characters(reference, reference, where)


def _check_characters(text: str, reference: str, where: str) -> None:
    """No control character (NUL included) and no lone surrogate: neither names a file nor
    belongs in a URL."""
    for offset, char in enumerate(text):
        code = ord(char)
        if code < 0x20 or 0x7F <= code <= 0x9F or 0xD800 <= code <= 0xDFFF:
            raise DocumentError(
                "DOCUMENT_REFERENCE_INVALID",
                f"{where}: reference {_shown(reference)} holds U+{code:04X} at offset {offset}",
            )


def _check_path(path_text: str, reference: str, where: str) -> None:
    # a file URL's percent-escapes may decode to what the reference itself could not hold
    _check_characters(path_text, reference, where)
    if not path_text:
        raise DocumentError(
            "DOCUMENT_REFERENCE_INVALID", f"{where}: {_shown(reference)} is no path"
        )
    try:
        os.fsencode(path_text)
    except UnicodeError as exc:
        raise DocumentError(
            "DOCUMENT_REFERENCE_INVALID",
            f"{where}: reference {_shown(reference)} cannot be a file name here: {exc}",
        ) from exc


def _parse_url(reference: str, where: str) -> httpx.URL:
    """The URL httpx would request: parsed by it and by the standard library alike (a
    malformed one is DOCUMENT_REFERENCE_INVALID, not the parser's ValueError)."""
    import httpx  # noqa: PLC0415 - only reference columns with URLs need it

    try:
        parts = urlsplit(reference)
        parts.port  # noqa: B018 - raises ValueError for a port that is no number or out of range
        url = httpx.URL(reference)
    except (ValueError, httpx.InvalidURL) as exc:
        raise DocumentError(
            "DOCUMENT_REFERENCE_INVALID",
            f"{where}: {_shown(reference)} is not a valid URL: {redact_text(str(exc))}",
        ) from exc
    if not url.host:
        raise DocumentError(
            "DOCUMENT_REFERENCE_INVALID", f"{where}: {_shown(reference)} names no host"
        )
    return url


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


def _read_file(source: DocumentSource, path_text: str, reference: str, where: str) -> bytes:
    if source.root is None:
        raise DocumentError(
            "DOCUMENT_REFERENCE_REFUSED", f"{where}: file references need a configured root"
        )
    try:
        root = source.root.resolve()
        path = (root / path_text).resolve()  # an absolute path_text replaces root; checked below
    except (OSError, RuntimeError) as exc:  # RuntimeError: a symlink loop (Python 3.11)
        raise DocumentError(
            "DOCUMENT_UNAVAILABLE", f"{where}: cannot resolve {_shown(reference)}: {exc}"
        ) from exc
    if not path.is_relative_to(root):
        raise DocumentError(
            "DOCUMENT_REFERENCE_REFUSED",
            f"{where}: {_shown(reference)} is outside the document root",
        )
    try:
        # non-blocking: opening a FIFO for reading would wait for a writer; refused below
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | getattr(os, "O_CLOEXEC", 0))
        with os.fdopen(fd, "rb") as handle:
            info = os.fstat(handle.fileno())
            if not stat.S_ISREG(info.st_mode):
                raise DocumentError(
                    "DOCUMENT_UNAVAILABLE", f"{where}: {_shown(reference)} is not a regular file"
                )
            _check_size(info.st_size, source, where)
            data = handle.read(source.max_bytes + 1)
    except OSError as exc:
        code = (
            "DOCUMENT_REFERENCE_INVALID"
            if exc.errno in (errno.ENAMETOOLONG, errno.EILSEQ)
            else "DOCUMENT_UNAVAILABLE"
        )
        raise DocumentError(
            code, f"{where}: cannot read {_shown(reference)}: {exc.strerror}"
        ) from exc
    _check_size(len(data), source, where)
    return data


@dataclass
class _Download:
    """One download's outcome, filled in by the thread that runs it."""

    data: bytes | None = None
    error: BaseException | None = None


def _fetch(source: DocumentSource, url: httpx.URL, where: str) -> bytes:
    """The body of a GET of `url`, within `fetch_deadline_s` as a whole.

    httpx bounds each phase (connect, each read) by `fetch_timeout_s`, not the download: a
    server sending a byte every few seconds keeps it going for as long as it likes. So the
    download runs in a thread the caller waits for until the deadline; past it, the client is
    closed (its connection with it) and the thread ends at its next read, within
    `fetch_timeout_s`.
    """
    import httpx  # noqa: PLC0415 - only reference columns with URLs need it

    shown = redact_url(str(url))
    if url.host.lower() not in {h.lower() for h in source.allowed_hosts}:
        raise DocumentError(
            "DOCUMENT_REFERENCE_REFUSED", f"{where}: host {url.host!r} is not in allowed_hosts"
        )
    # no redirects: a redirect could leave the allow-list
    client = httpx.Client(timeout=source.fetch_timeout_s, follow_redirects=False)
    outcome = _Download()

    def download() -> None:
        try:
            outcome.data = _download(client, url, source, shown, where)
        except BaseException as exc:  # noqa: BLE001 - handed to the waiting caller
            outcome.error = exc

    thread = threading.Thread(target=download, name="document-fetch", daemon=True)
    thread.start()
    thread.join(source.fetch_deadline_s)
    client.close()
    if thread.is_alive():
        raise DocumentError(
            "DOCUMENT_FETCH_TIMEOUT",
            f"{where}: GET {shown} did not finish within fetch_deadline_s="
            f"{source.fetch_deadline_s:g} s",
        )
    error = outcome.error
    if error is None:
        assert outcome.data is not None
        return outcome.data
    if isinstance(error, DocumentError) or not isinstance(error, Exception):
        raise error
    # What the URL, the server or the network make httpx raise is this document's failure:
    # transport and protocol errors, a host name IDNA cannot encode, a URL it refuses late.
    code = (
        "DOCUMENT_REFERENCE_INVALID" if isinstance(error, UnicodeError) else "DOCUMENT_UNAVAILABLE"
    )
    reason = (
        str(error) if isinstance(error, httpx.HTTPError) else f"{type(error).__name__}: {error}"
    )
    raise DocumentError(code, f"{where}: GET {shown} failed: {redact_text(reason)}") from error


def _download(
    client: httpx.Client, url: httpx.URL, source: DocumentSource, shown: str, where: str
) -> bytes:
    data = bytearray()
    with client.stream("GET", url) as response:
        if response.status_code != 200:
            raise DocumentError(
                "DOCUMENT_UNAVAILABLE", f"{where}: GET {shown} answered {response.status_code}"
            )
        for part in response.iter_bytes():
            data += part
            _check_size(len(data), source, where)
    return bytes(data)


def _url_name(url: httpx.URL) -> str | None:
    return PurePosixPath(unquote(url.path)).name or None
