"""Where a document's bytes come from: binary columns (bytes or Debezium's base64) and
references (a path under the root, an allow-listed URL), and the refusals."""

from __future__ import annotations

import base64
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import pytest

from ragcore.documents import DocumentSource, document_bytes, document_format
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
