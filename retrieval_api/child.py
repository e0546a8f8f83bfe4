"""One of several Retrieve server processes (`retrieval_api.processes`); not run by hand.

Reads its `ChildSpec` pickled on stdin, builds the app (the store through the parent's store
host when there is one), binds the shared port (SO_REUSEPORT, gRPC's default on Linux),
writes `{"ready": port}` (or `{"error": code, "message": text}`) as one line on stdout, and
serves until SIGTERM, or until its stdin reaches EOF: the parent went away.
"""

from __future__ import annotations

import asyncio
import json
import logging
import os
import pickle
import signal
import sys
import threading
from pathlib import Path
from typing import Any

from prometheus_client import CollectorRegistry

from ragcore.errors import RagstreamError
from ragcore.store.host import HostedStore
from retrieval_api.app import build_app, serve
from retrieval_api.processes import ChildSpec

log = logging.getLogger("retrieval_api.child")


def _read_spec() -> bytes:
    """The parent's message on stdin: an 8-byte big-endian length, then the pickle."""
    head = _read_exactly(8)
    return _read_exactly(int.from_bytes(head, "big"))


def _read_exactly(size: int) -> bytes:
    data = bytearray()
    while len(data) < size:
        part = os.read(0, size - len(data))
        if not part:
            raise SystemExit("retrieval_api.child: stdin closed before the spec was read")
        data += part
    return bytes(data)


def _say(doc: dict[str, Any]) -> None:
    sys.stdout.write(json.dumps(doc) + "\n")
    sys.stdout.flush()


def _stop_when_orphaned() -> None:
    """SIGTERM this process once stdin reaches EOF: the parent closed the pipe or died."""
    # the raw descriptor, not sys.stdin: a daemon thread blocked in a buffered read holds its
    # lock at interpreter shutdown, which aborts the process
    while os.read(0, 4096):
        pass  # nothing more is sent after the spec
    os.kill(os.getpid(), signal.SIGTERM)


def main() -> int:
    """Serve as one process of a group (see the module docstring)."""
    logging.basicConfig(
        level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s[%(process)d]: %(message)s"
    )
    spec = pickle.loads(_read_spec())
    if not isinstance(spec, ChildSpec):
        _say({"error": "CONFIG_ERROR", "message": "stdin did not carry a ChildSpec"})
        return 2
    store = None
    if spec.store_address is not None and spec.store_key is not None:
        store = HostedStore(Path(spec.store_address), authkey=spec.store_key)
    try:
        app = build_app(spec.settings, CollectorRegistry(), store=store, sor=spec.sor)
    except RagstreamError as exc:
        log.error("cannot start: [%s] %s", exc.code, exc)
        _say({"error": exc.code, "message": str(exc)})
        return 2
    threading.Thread(target=_stop_when_orphaned, name="parent-watch", daemon=True).start()
    try:
        asyncio.run(serve(app, on_start=lambda port: _say({"ready": port})))
    finally:
        app.close()
        if store is not None:
            store.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
