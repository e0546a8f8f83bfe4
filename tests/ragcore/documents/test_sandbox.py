"""The extraction child's limits: a document that needs too much memory or time costs a reason
code and a fresh child, never the calling process."""

from __future__ import annotations

import os
import signal
import time
from pathlib import Path

import pytest

from ragcore.documents import ExtractionLimits, Extractor
from ragcore.errors import DocumentError
from ragdev.docgen import csv_bytes, pdf_bytes
from tests.processes import alive

pytestmark = pytest.mark.unit


def test_a_document_over_the_memory_cap_fails_and_the_next_one_extracts() -> None:
    # ~24 MB of CSV: its rows as Python lists need several times that, over a 64 MiB cap
    big = csv_bytes([["a", "b", "c"]] + [[f"r{n}", n, "x" * 20] for n in range(600_000)])
    extractor = Extractor(ExtractionLimits(memory_mb=64))
    try:
        with pytest.raises(DocumentError) as info:
            extractor.extract("csv", big)
        assert info.value.code == "EXTRACTION_MEMORY_LIMIT"
        document = extractor.extract("pdf", pdf_bytes([["after the failure"]]))
        assert "after the failure" in document.segments[0].text
    finally:
        extractor.close()


def test_a_document_over_the_time_limit_kills_the_child() -> None:
    # the first call also starts the child (imports take far longer than 50 ms)
    extractor = Extractor(ExtractionLimits(timeout_s=0.05))
    try:
        with pytest.raises(DocumentError) as info:
            extractor.extract("pdf", pdf_bytes([["slow"]]))
        assert info.value.code == "EXTRACTION_TIMEOUT"
        assert extractor.child_pid is None
    finally:
        extractor.close()


def test_a_child_that_died_is_replaced_on_the_next_document() -> None:
    extractor = Extractor()
    try:
        extractor.extract("pdf", pdf_bytes([["first"]]))
        pid = extractor.child_pid
        assert pid is not None
        os.kill(pid, 9)
        deadline = time.monotonic() + 5
        while alive(pid) and time.monotonic() < deadline:
            time.sleep(0.05)
        document = extractor.extract("pdf", pdf_bytes([["second"]]))
        assert "second" in document.segments[0].text
        assert extractor.child_pid not in (None, pid)
    finally:
        extractor.close()


def test_close_stops_the_child() -> None:
    extractor = Extractor()
    extractor.extract("pdf", pdf_bytes([["text"]]))
    pid = extractor.child_pid
    assert pid is not None and alive(pid)
    extractor.close()
    assert not os.path.exists(f"/proc/{pid}")


def test_a_module_in_the_working_directory_does_not_shadow_the_child(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # `python -m` puts the working directory first on sys.path unless told not to (-P): an
    # uploaded or stray `ragcore/` there would run instead of the extractor
    fake = tmp_path / "ragcore"
    fake.mkdir()
    (fake / "__init__.py").write_text("raise SystemExit('shadowed')\n")
    monkeypatch.chdir(tmp_path)
    extractor = Extractor()
    try:
        document = extractor.extract("pdf", pdf_bytes([["not shadowed"]]))
        assert "not shadowed" in document.segments[0].text
    finally:
        extractor.close()


def test_a_child_that_stops_reading_cannot_hold_the_sender_past_the_time_limit() -> None:
    # the limit covers a child's start too (imports of the extractors): 1 s was too short for
    # the first and the last call on a loaded 2-core machine (CI), so the bound is relative
    limit = 4.0
    extractor = Extractor(ExtractionLimits(timeout_s=limit))
    try:
        extractor.extract("pdf", pdf_bytes([["first"]]))  # the child is up
        pid = extractor.child_pid
        assert pid is not None
        os.kill(pid, signal.SIGSTOP)  # alive, reading nothing: the pipe fills at 64 KiB
        started = time.monotonic()
        with pytest.raises(DocumentError) as info:
            extractor.extract("csv", b"a,b\n" * 2_000_000)  # 8 MB to send
        assert info.value.code == "EXTRACTION_TIMEOUT"
        assert time.monotonic() - started < limit + 2.0
        assert extractor.child_pid is None and not alive(pid)
        document = extractor.extract("pdf", pdf_bytes([["after"]]))
        assert "after" in document.segments[0].text
    finally:
        extractor.close()
