"""The extraction child process: `python -m ragcore.documents.child --memory-mb N`.

Reads requests from stdin and answers on stdout, one at a time, until stdin closes (so it ends
with its parent). Its address space is capped (RLIMIT_AS, the baseline after imports plus
`--memory-mb`): an allocation past it raises MemoryError, answered as EXTRACTION_MEMORY_LIMIT,
after which the child exits (the parent starts a fresh one). Wire format: a 4-byte big-endian
length and a JSON header, then (requests only) an 8-byte length and the file's bytes.
"""

from __future__ import annotations

import argparse
import json
import logging
import resource
import signal
import struct
import sys
from typing import IO, Any

from ragcore.documents.extract import ExtractionFailure, Limits, extract


def _read_exact(stream: IO[bytes], size: int) -> bytes | None:
    data = stream.read(size)
    if len(data) != size:
        return None
    return data


def read_message(stream: IO[bytes]) -> tuple[dict[str, Any], bytes] | None:
    """One request (header, payload), or None at end of input."""
    head = _read_exact(stream, 4)
    if head is None:
        return None
    header = _read_exact(stream, struct.unpack(">I", head)[0])
    size = _read_exact(stream, 8)
    if header is None or size is None:
        return None
    payload = _read_exact(stream, struct.unpack(">Q", size)[0])
    if payload is None:
        return None
    doc: dict[str, Any] = json.loads(header)
    return doc, payload


def write_message(stream: IO[bytes], doc: dict[str, Any]) -> None:
    """One answer."""
    body = json.dumps(doc).encode("utf-8")
    stream.write(struct.pack(">I", len(body)) + body)
    stream.flush()


def _address_space() -> int:
    with open("/proc/self/statm") as statm:
        pages = int(statm.read().split()[0])
    return pages * resource.getpagesize()


def _answer(header: dict[str, Any], payload: bytes) -> dict[str, Any]:
    limits = Limits(
        max_pages=int(header["max_pages"]),
        max_chars=int(header["max_chars"]),
        max_uncompressed_bytes=int(header["max_uncompressed_bytes"]),
    )
    try:
        document = extract(str(header["format"]), payload, limits)
    except ExtractionFailure as exc:
        return {"error": {"code": exc.code, "message": str(exc)}}
    except RecursionError as exc:
        return {"error": {"code": "DOCUMENT_CORRUPT", "message": f"nesting too deep: {exc}"}}
    except MemoryError:
        raise
    except Exception as exc:  # noqa: BLE001 - any parser failure on untrusted bytes is data
        message = f"{type(exc).__name__}: {exc}"[:500]
        return {"error": {"code": "DOCUMENT_CORRUPT", "message": message}}
    return {
        "ok": {
            "format": document.fmt,
            "pages": document.pages,
            "segments": [s.to_json() for s in document.segments],
        }
    }


def main(argv: list[str] | None = None) -> int:
    """Serve extraction requests until stdin closes."""
    parser = argparse.ArgumentParser(prog="ragcore.documents.child")
    parser.add_argument("--memory-mb", type=int, required=True)
    args = parser.parse_args(argv)
    # the parent stops this process (end of input, or a kill at its memory cap); a terminal's
    # Ctrl-C, sent to the whole process group, is the parent's to handle
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    # parsers warn loudly about every malformed object; the answer carries what matters
    logging.disable(logging.WARNING)
    # import the parsers before the cap, so the cap measures extraction, not imports
    import docx  # noqa: F401, PLC0415
    import openpyxl  # noqa: F401, PLC0415
    import pypdf  # noqa: F401, PLC0415

    cap = _address_space() + args.memory_mb * 1024 * 1024
    resource.setrlimit(resource.RLIMIT_AS, (cap, cap))
    stdin, stdout = sys.stdin.buffer, sys.stdout.buffer
    while True:
        message = read_message(stdin)
        if message is None:
            return 0
        try:
            answer = _answer(*message)
        except MemoryError:
            write_message(
                stdout,
                {
                    "error": {
                        "code": "EXTRACTION_MEMORY_LIMIT",
                        "message": f"extraction needed more than {args.memory_mb} MiB",
                    }
                },
            )
            return 3  # the heap may be fragmented past use: the parent starts a new child
        write_message(stdout, answer)


if __name__ == "__main__":
    sys.exit(main())
