"""Where a document's bytes come from: binary columns (bytes or Debezium's base64) and
references (a path under the root, an allow-listed URL), and the refusals."""

from __future__ import annotations

import base64
import contextlib
import os
import threading
import time
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from ragcore.documents import REASONS, DocumentSource, document_bytes, document_format
from ragcore.errors import DocumentError, MappingError
from ragdev.docgen import pdf_bytes
from schemas.entities import ContentFormat

pytestmark = pytest.mark.unit

PDF = pdf_bytes([["Seal kit SK-9"]])


def test_binary_column_takes_bytes_and_debeziums_base64() -> None:
    source = DocumentSource(column="body")
    assert document_bytes(source, PDF, "row") == (PDF, None)
    assert document_bytes(source, memoryview(PDF), "row") == (PDF, None)
    assert document_bytes(source, base64.b64encode(PDF).decode(), "row") == (PDF, None)
    with pytest.raises(MappingError, match="neither bytes nor base64"):
        document_bytes(source, "not base64!", "row")


def test_a_file_over_max_bytes_is_document_too_large() -> None:
    with pytest.raises(DocumentError) as info:
        document_bytes(DocumentSource(column="body", max_bytes=100), PDF, "row")
    assert info.value.code == "DOCUMENT_TOO_LARGE"


def test_reference_reads_a_file_under_the_root_and_names_it(tmp_path: Path) -> None:
    (tmp_path / "sheets").mkdir()
    (tmp_path / "sheets" / "p100.pdf").write_bytes(PDF)
    source = DocumentSource(column="path", kind="reference", root=tmp_path)
    assert document_bytes(source, "sheets/p100.pdf", "row") == (PDF, "p100.pdf")
    assert document_bytes(source, str(tmp_path / "sheets/p100.pdf"), "row")[0] == PDF


@pytest.mark.parametrize("reference", ["../secret.pdf", "/etc/passwd", "sheets/../../x.pdf"])
def test_references_outside_the_root_are_refused(tmp_path: Path, reference: str) -> None:
    root = tmp_path / "docs"
    root.mkdir()
    (tmp_path / "secret.pdf").write_bytes(PDF)
    source = DocumentSource(column="path", kind="reference", root=root)
    with pytest.raises(DocumentError) as info:
        document_bytes(source, reference, "row")
    assert info.value.code == "DOCUMENT_REFERENCE_REFUSED"


def test_a_symlink_out_of_the_root_is_refused(tmp_path: Path) -> None:
    root = tmp_path / "docs"
    root.mkdir()
    (tmp_path / "secret.pdf").write_bytes(PDF)
    (root / "link.pdf").symlink_to(tmp_path / "secret.pdf")
    source = DocumentSource(column="path", kind="reference", root=root)
    with pytest.raises(DocumentError) as info:
        document_bytes(source, "link.pdf", "row")
    assert info.value.code == "DOCUMENT_REFERENCE_REFUSED"


def test_a_missing_file_is_document_unavailable(tmp_path: Path) -> None:
    source = DocumentSource(column="path", kind="reference", root=tmp_path)
    with pytest.raises(DocumentError) as info:
        document_bytes(source, "gone.pdf", "row")
    assert info.value.code == "DOCUMENT_UNAVAILABLE"


@pytest.fixture
def file_server() -> Iterator[str]:
    class Handler(BaseHTTPRequestHandler):
        def log_message(self, format: str, *args: Any) -> None:
            pass

        def do_GET(self) -> None:
            if self.path == "/docs/p100.pdf":
                self.send_response(200)
                self.send_header("Content-Length", str(len(PDF)))
                self.end_headers()
                self.wfile.write(PDF)
            elif self.path == "/moved.pdf":
                self.send_response(302)
                self.send_header("Location", "http://example.invalid/p100.pdf")
                self.end_headers()
            else:
                self.send_error(404)

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}"
    finally:
        server.shutdown()
        server.server_close()


def test_an_allow_listed_url_is_fetched(file_server: str) -> None:
    source = DocumentSource(column="url", kind="reference", allowed_hosts=("127.0.0.1",))
    assert document_bytes(source, f"{file_server}/docs/p100.pdf", "row") == (PDF, "p100.pdf")


@pytest.mark.parametrize(("path", "code"), [("/nope.pdf", "404"), ("/moved.pdf", "302")])
def test_http_errors_and_redirects_are_document_unavailable(
    file_server: str, path: str, code: str
) -> None:
    source = DocumentSource(column="url", kind="reference", allowed_hosts=("127.0.0.1",))
    with pytest.raises(DocumentError, match=code) as info:
        document_bytes(source, file_server + path, "row")
    assert info.value.code == "DOCUMENT_UNAVAILABLE"


def test_a_host_not_on_the_allow_list_is_refused_without_a_request(file_server: str) -> None:
    source = DocumentSource(column="url", kind="reference", allowed_hosts=("files.example.com",))
    with pytest.raises(DocumentError) as info:
        document_bytes(source, f"{file_server}/docs/p100.pdf", "row")
    assert info.value.code == "DOCUMENT_REFERENCE_REFUSED"


def test_a_reference_column_needs_a_root_or_hosts() -> None:
    with pytest.raises(ValueError, match="root directory or allowed_hosts"):
        DocumentSource(column="path", kind="reference")


def test_format_declared_then_mime_then_sniffed() -> None:
    source = DocumentSource(column="body")
    assert document_format(source, "XLSX", None, PDF, "row") is ContentFormat.XLSX
    assert document_format(source, ".docx", None, PDF, "row") is ContentFormat.DOCX
    assert document_format(source, None, "application/pdf; x=1", b"", "row") is ContentFormat.PDF
    assert document_format(source, None, None, PDF, "row") is ContentFormat.PDF
    for declared, mime in (("odt", None), (None, "image/png")):
        with pytest.raises(DocumentError) as info:
            document_format(source, declared, mime, PDF, "row")
        assert info.value.code == "DOCUMENT_FORMAT_UNKNOWN"
    with pytest.raises(DocumentError) as info:
        document_format(source, None, None, b"\x00\x01binary", "row")
    assert info.value.code == "DOCUMENT_FORMAT_UNKNOWN"


# --- malformed references, deadlines, secrets --------------------------------------------------


@pytest.mark.parametrize(
    "reference",
    [
        "file://a%00b",  # the NUL a file URL decodes to
        "a\x00b.pdf",
        "sheets/\x1fp.pdf",
        "p\x85.pdf",
        "a\udc80b.pdf",  # a lone surrogate: no file name encodes it
        "file://",
        "http://[x",  # urlsplit: ValueError
        "http://h:99999/x.pdf",
        "http://h:abc/x.pdf",
        "http:///x.pdf",
        "ftp://files.example.com/x.pdf",
        "s3://bucket/x.pdf",
        "x" * 5000,
    ],
)
def test_a_malformed_reference_is_document_reference_invalid(
    tmp_path: Path, reference: str
) -> None:
    source = DocumentSource(
        column="ref", kind="reference", root=tmp_path, allowed_hosts=("h", "127.0.0.1")
    )
    with pytest.raises(DocumentError) as info:
        document_bytes(source, reference, "row")
    assert info.value.code == "DOCUMENT_REFERENCE_INVALID"


def test_a_name_the_file_system_refuses_is_document_reference_invalid(tmp_path: Path) -> None:
    source = DocumentSource(column="ref", kind="reference", root=tmp_path)
    with pytest.raises(DocumentError) as info:
        document_bytes(source, "a" * 300 + ".pdf", "row")  # a component over NAME_MAX
    assert info.value.code == "DOCUMENT_REFERENCE_INVALID"


def test_what_is_no_regular_file_is_unavailable_without_waiting(tmp_path: Path) -> None:
    os.mkfifo(tmp_path / "pipe.pdf")  # opening it for reading would wait for a writer
    (tmp_path / "dir.pdf").mkdir()
    (tmp_path / "loop").symlink_to(tmp_path / "loop")
    source = DocumentSource(column="ref", kind="reference", root=tmp_path)
    for reference in ("pipe.pdf", "dir.pdf", "loop/x.pdf"):
        with pytest.raises(DocumentError) as info:
            document_bytes(source, reference, "row")
        assert info.value.code == "DOCUMENT_UNAVAILABLE", reference


def test_the_download_deadline_is_at_least_the_phase_timeout() -> None:
    with pytest.raises(ValueError, match="fetch_deadline_s"):
        DocumentSource(
            column="url",
            kind="reference",
            allowed_hosts=("h",),
            fetch_timeout_s=5,
            fetch_deadline_s=2,
        )
    assert (
        DocumentSource(column="url", kind="reference", allowed_hosts=("h",)).fetch_deadline_s == 60
    )


class _Trickle(BaseHTTPRequestHandler):
    """Answers every GET slowly: `/body` sends its headers, then a byte every 50 ms;
    `/headers` sends its status line, then a header byte every 50 ms."""

    stop = threading.Event()

    def log_message(self, format: str, *args: Any) -> None:
        pass

    def do_GET(self) -> None:
        with contextlib.suppress(BrokenPipeError, ConnectionResetError):
            if self.path == "/body":
                self.send_response(200)
                self.send_header("Content-Length", str(10**6))
                self.end_headers()
                self.wfile.flush()
                trickle = b"x"
            else:
                self.wfile.write(b"HTTP/1.1 200 OK\r\n")
                trickle = b"X-Slow: y\r\n"
            while not self.stop.wait(0.05):
                self.wfile.write(trickle[:1])
                self.wfile.flush()
                trickle = trickle[1:] + trickle[:1]


@pytest.fixture(scope="module")
def trickle_server() -> Iterator[str]:
    _Trickle.stop.clear()
    server = ThreadingHTTPServer(("127.0.0.1", 0), _Trickle)
    server.daemon_threads = True
    thread = threading.Thread(target=server.serve_forever, args=(0.05,), daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}"
    finally:
        _Trickle.stop.set()
        server.shutdown()
        server.server_close()


@pytest.mark.parametrize("path", ["/body", "/headers"])
def test_a_trickling_server_is_cut_off_at_the_download_deadline(
    trickle_server: str, path: str
) -> None:
    source = DocumentSource(
        column="url",
        kind="reference",
        allowed_hosts=("127.0.0.1",),
        fetch_timeout_s=1.0,  # never reached: a byte comes every 50 ms
        fetch_deadline_s=1.5,
    )
    started = time.monotonic()
    with pytest.raises(DocumentError) as info:
        document_bytes(source, trickle_server + path, "row")
    elapsed = time.monotonic() - started
    assert info.value.code == "DOCUMENT_FETCH_TIMEOUT"
    assert "fetch_deadline_s=1.5" in str(info.value)
    assert 1.5 <= elapsed < 3.0, elapsed
    # the abandoned download ends at its next read (its connection was closed)
    until = time.monotonic() + source.fetch_timeout_s + 2
    while any(t.name == "document-fetch" for t in threading.enumerate()):
        assert time.monotonic() < until, "the download thread outlived its connection"
        time.sleep(0.05)


def test_messages_never_show_a_urls_userinfo_or_query(file_server: str, tmp_path: Path) -> None:
    source = DocumentSource(
        column="url", kind="reference", root=tmp_path, allowed_hosts=("127.0.0.1", "h")
    )
    host = file_server.removeprefix("http://")
    secrets = ("hunter2", "SIGNATURE42", "frag9")
    for reference in (
        f"http://user:hunter2@{host}/nope.pdf?X-Amz-Signature=SIGNATURE42#frag9",
        "https://user:hunter2@h:99999/x.pdf?X-Amz-Signature=SIGNATURE42",
        "s3://user:hunter2@bucket/x.pdf?X-Amz-Signature=SIGNATURE42#frag9",
        "http://user:hunter2@elsewhere.example/x.pdf?sig=SIGNATURE42",
        "http://user:hunter2@[x/?sig=SIGNATURE42",
    ):
        with pytest.raises(DocumentError) as info:
            document_bytes(source, reference, "row")
        message = str(info.value)
        assert not [s for s in secrets if s in message], message
        assert "…" in message or "elsewhere.example" in message


_REFERENCE_HEADS = [
    "", "/", "../", "sheets/", "file://", "file:///", "http://", "https://", "HTTP://",
    "http://127.0.0.1:1/", "http://[", "ftp://", "s3://", "a://", "http://u:p@", "%00", "~/",
]  # fmt: skip


@settings(
    max_examples=300,
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)
@given(head=st.sampled_from(_REFERENCE_HEADS), rest=st.text(max_size=40))
def test_any_reference_gives_bytes_or_a_document_or_mapping_error(
    file_server: str, tmp_path: Path, head: str, rest: str
) -> None:
    (tmp_path / "p.pdf").write_bytes(PDF)
    source = DocumentSource(
        column="ref",
        kind="reference",
        root=tmp_path,
        allowed_hosts=("127.0.0.1",),
        fetch_timeout_s=2,
        fetch_deadline_s=2,
    )
    for reference in (head + rest, f"{file_server}/{rest}"):
        try:
            data, _ = document_bytes(source, reference, "row")
        except MappingError as exc:  # DocumentError is one
            assert not isinstance(exc, DocumentError) or exc.code in REASONS
        else:
            assert data == PDF
