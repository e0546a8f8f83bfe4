"""Extraction in a child process with a memory cap and a wall-clock timeout
(docs/decisions/document-extraction.md).

Parsers of untrusted files can be made to inflate gigabytes (a decompression-bomb stream or
sheet) or loop for minutes. The worker never runs them itself: `Extractor` keeps one child
process (`ragcore.documents.child`) whose address space is capped, sends it one document at a
time and waits at most `timeout_s`. A child that overruns is killed and replaced; the document
gets a reason code (EXTRACTION_TIMEOUT, EXTRACTION_MEMORY_LIMIT, EXTRACTION_CRASHED) and the
worker goes on with the rest of its batch. The time limit covers the whole exchange: starting a
child, sending it the file (a child that stops reading cannot block the sender), its work and
its answer.
"""

from __future__ import annotations

import json
import os
import selectors
import struct
import subprocess
import sys
import threading
import time
from typing import Any

from pydantic import BaseModel, ConfigDict, Field

from ragcore.documents.extract import ExtractedDocument, Segment
from ragcore.errors import DocumentError


class ExtractionLimits(BaseModel):
    """Limits of one document's text extraction."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    timeout_s: float = Field(
        default=30.0, gt=0, description="Wall-clock time one document may take to extract."
    )
    memory_mb: int = Field(
        default=512,
        ge=64,
        description="Memory the extraction process may allocate beyond its baseline (MiB).",
    )
    max_pages: int = Field(
        default=2000, gt=0, description="Pages (PDF), sections (DOCX) or row blocks per document."
    )
    max_chars: int = Field(
        default=2_000_000, gt=0, description="Characters of text one document may yield."
    )
    max_uncompressed_mb: int = Field(
        default=200, gt=0, description="Declared inflated size of a DOCX/XLSX package (MiB)."
    )


class Extractor:
    """Text extraction through one sandboxed child process (thread-safe: one at a time)."""

    def __init__(self, limits: ExtractionLimits | None = None) -> None:
        self.limits = limits or ExtractionLimits()
        self._proc: subprocess.Popen[bytes] | None = None
        self._lock = threading.Lock()

    def extract(self, fmt: str, data: bytes) -> ExtractedDocument:
        """The document's located text; DocumentError with the reason when there is none."""
        header = {
            "format": fmt,
            "max_pages": self.limits.max_pages,
            "max_chars": self.limits.max_chars,
            "max_uncompressed_bytes": self.limits.max_uncompressed_mb * 1024 * 1024,
        }
        with self._lock:
            answer = self._call(header, data)
        error = answer.get("error")
        if error is not None:
            raise DocumentError(str(error["code"]), f"{fmt}: {error['message']}")
        ok = answer["ok"]
        return ExtractedDocument(
            fmt=str(ok["format"]),
            segments=tuple(Segment.from_json(s) for s in ok["segments"]),
            pages=int(ok["pages"]),
        )

    def close(self) -> None:
        """Stop the child (it also ends by itself when this process goes)."""
        with self._lock:
            self._stop()

    @property
    def child_pid(self) -> int | None:
        """The running child's pid (None before the first document or after a failure)."""
        return self._proc.pid if self._proc is not None else None

    def _start(self) -> tuple[subprocess.Popen[bytes], bool]:
        """The running child, or a new one; and whether it is new."""
        if self._proc is not None and self._proc.poll() is None:
            return self._proc, False
        self._stop()
        self._proc = subprocess.Popen(
            [
                sys.executable,
                "-P",  # not the working directory first on sys.path: no shadowing modules
                "-m",
                "ragcore.documents.child",
                "--memory-mb",
                str(self.limits.memory_mb),
            ],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
        )
        return self._proc, True

    def _stop(self) -> None:
        proc, self._proc = self._proc, None
        if proc is None:
            return
        if proc.poll() is None:
            proc.kill()
        proc.wait()
        for stream in (proc.stdin, proc.stdout):
            if stream is not None:
                stream.close()

    def _call(self, header: dict[str, Any], data: bytes) -> dict[str, Any]:
        deadline = time.monotonic() + self.limits.timeout_s
        while True:
            proc, fresh = self._start()
            answer = self._exchange(proc, header, data, deadline)
            if answer is not None:
                break
            self._stop()
            if time.monotonic() >= deadline:
                return _failure(
                    "EXTRACTION_TIMEOUT",
                    f"extraction did not finish within {self.limits.timeout_s:g} s",
                )
            if fresh:
                return _failure("EXTRACTION_CRASHED", "the extraction process died")
            # a child that had died before this document arrived: not the document's fault
        error = answer.get("error")
        if proc.poll() is not None or (error is not None and error.get("code") in _CHILD_EXITS):
            self._stop()  # the child exits after a MemoryError: start a new one next time
        return answer

    def _exchange(
        self,
        proc: subprocess.Popen[bytes],
        header: dict[str, Any],
        data: bytes,
        deadline: float,
    ) -> dict[str, Any] | None:
        assert proc.stdin is not None
        body = json.dumps(header).encode("utf-8")
        head = struct.pack(">I", len(body)) + body + struct.pack(">Q", len(data))
        if not _send(proc.stdin.fileno(), (head, data), deadline):
            return None
        return self._receive(proc, deadline)

    @staticmethod
    def _receive(proc: subprocess.Popen[bytes], deadline: float) -> dict[str, Any] | None:
        assert proc.stdout is not None
        fd = proc.stdout.fileno()
        buffer = bytearray()
        need = 4
        with selectors.DefaultSelector() as selector:
            selector.register(fd, selectors.EVENT_READ)
            while True:
                if len(buffer) >= need:
                    if need == 4:
                        need = 4 + struct.unpack(">I", buffer[:4])[0]
                        continue
                    doc: dict[str, Any] = json.loads(bytes(buffer[4:need]))
                    return doc
                left = deadline - time.monotonic()
                if left <= 0 or not selector.select(left):
                    return None
                chunk = os.read(fd, max(need - len(buffer), 65536))
                if not chunk:
                    return None  # the child died
                buffer += chunk


#: Answers after which the child exits by itself.
_CHILD_EXITS = frozenset({"EXTRACTION_MEMORY_LIMIT"})


def _send(fd: int, buffers: tuple[bytes, ...], deadline: float) -> bool:
    """Write `buffers` to the child's stdin by `deadline`; False when it passed or the child
    is gone. Non-blocking: a child that stops reading (hung, stopped) fills the pipe, and a
    blocking write would wait past the time limit, for ever."""
    os.set_blocking(fd, False)
    with selectors.DefaultSelector() as selector:
        selector.register(fd, selectors.EVENT_WRITE)
        for buffer in buffers:
            view = memoryview(buffer)
            while view:
                left = deadline - time.monotonic()
                if left <= 0 or not selector.select(left):
                    return False
                try:
                    view = view[os.write(fd, view) :]
                except BlockingIOError:
                    continue
                except (BrokenPipeError, ConnectionResetError):
                    return False
    return True


def _failure(code: str, message: str) -> dict[str, Any]:
    return {"error": {"code": code, "message": message}}
