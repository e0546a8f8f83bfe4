"""The processes of the e2e stacks that run ingest workers as processes of their own:

- `python -m tests.e2e.processes services`: the services every worker shares, in a process of
  their own: the vector store (qdrant-edge opened on `RAGSTREAM_STORE__DATA_DIR`, served to
  other processes by a `ragcore.store.host.StoreHost` advertised in that directory, as
  `ragstream dev` serves it to its admin commands) and an OpenAI-compatible embedding stub
  serving `hash_vectors`, which answers after `EMBED_MS_PER_TEXT` (environment) milliseconds
  per text: the cost of a model, without its CPU. It writes `services.json` (the embedder's
  URL) beside the data dir once both serve, and stops on SIGTERM. This is the production
  topology with a Qdrant server and an embedding service: workers come and go (SIGKILL
  included) while the store and what it acknowledged stay, and neither the workers nor the
  test's observers share a process (and a GIL) with the store. Unlike a Qdrant server, the
  host serves every call of every worker from one Python process and one qdrant-edge shard
  per collection: under a bulk load the other workers' store calls wait longer (measured in
  tests/e2e/test_real_cdc_scale.py).
- `python -m tests.e2e.processes worker`: the ingest worker of `python -m streams` (settings
  from `RAGSTREAM_*`, signal handling, /metrics), with the store of the services process
  (qdrant-edge has one opener per shard: several workers of a group cannot open one embedded
  store themselves) instead of opening it. Everything else is `streams.app.main`.
"""

from __future__ import annotations

import json
import logging
import os
import signal
import sys
import tempfile
import threading
import time
from collections.abc import Callable
from pathlib import Path
from types import FrameType
from typing import Any

from prometheus_client import CollectorRegistry, start_http_server

from ragcore.errors import ConfigError, RagstreamError
from ragcore.store.host import StoreHost, advertise, advertised_store, new_host_key, withdraw
from ragcore.wiring import build_store, payload_schema
from streams.app import build_worker
from streams.consumer import install_signal_handlers
from streams.settings import IngestSettings
from tests.http_stub import Response, serve_json
from tests.streams.support import hash_vectors

log = logging.getLogger("tests.e2e.processes")

#: What the services process writes beside the store's data dir once it serves.
SERVICES_FILE = "services.json"
#: The environment variable with the embedding stub's milliseconds per text.
EMBED_MS_PER_TEXT = "EMBED_MS_PER_TEXT"


def slow_embeddings(ms_per_text: float) -> Callable[[str, dict[str, str], Any], Response]:
    """An OpenAI-compatible `/embeddings` answer of `hash_vectors` that takes `ms_per_text`
    per text (a sleep: other requests are served meanwhile)."""

    def answer(path: str, headers: dict[str, str], body: Any) -> Response:
        texts = body["input"] if isinstance(body["input"], list) else [body["input"]]
        time.sleep(ms_per_text * len(texts) / 1000)
        data = [
            {"object": "embedding", "index": i, "embedding": v.tolist()}
            for i, v in enumerate(hash_vectors(texts))
        ]
        usage = {"prompt_tokens": 0, "total_tokens": 0}
        payload = {"object": "list", "model": body.get("model"), "data": data, "usage": usage}
        return 200, json.dumps(payload).encode(), {}

    return answer


def worker() -> int:
    """Run one worker until SIGTERM (exit 0), a fatal error (1) or a configuration error (2)."""
    settings = IngestSettings()
    stop = threading.Event()
    install_signal_handlers(stop)
    store = advertised_store(settings.store.data_dir)
    if store is None:
        log.error("no live process advertises the store in %s", settings.store.data_dir)
        return 2
    registry = CollectorRegistry()
    try:
        built = build_worker(settings, registry, store=store)
        built.stop = stop
        if settings.metrics_port:
            start_http_server(settings.metrics_port, settings.metrics_host, registry=registry)
        built.run()
    except ConfigError as exc:
        log.error("cannot start: %s", exc)
        return 2
    except RagstreamError as exc:
        log.critical("the ingest worker stopped: %s", exc)
        return 1
    finally:
        store.close()
    return 0


def services() -> int:
    """Serve the store and the embedding stub until SIGTERM."""
    settings = IngestSettings()
    data_dir = settings.store.data_dir
    stop = threading.Event()

    def on_signal(_signum: int, _frame: FrameType | None) -> None:
        stop.set()

    signal.signal(signal.SIGTERM, on_signal)
    signal.signal(signal.SIGINT, on_signal)
    store = build_store(settings.store, payload_schema(settings.plan))
    # a short socket path (AF_UNIX allows ~100 bytes; test temp paths are long)
    with tempfile.TemporaryDirectory(prefix="rs-host-") as host_dir:
        key = new_host_key()
        host = StoreHost(store, Path(host_dir) / "store.sock", authkey=key)
        host.start()
        try:
            advertise(data_dir, host, key)
            ms_per_text = float(os.environ.get(EMBED_MS_PER_TEXT, "0"))
            with serve_json(slow_embeddings(ms_per_text)) as url:
                ready = data_dir.parent / SERVICES_FILE
                partial = ready.with_name(f".{SERVICES_FILE}.{os.getpid()}")
                partial.write_text(json.dumps({"embedder_url": f"{url}/v1"}))
                partial.replace(ready)
                log.info("serving the store of %s and the embedder at %s", data_dir, url)
                stop.wait()
        finally:
            withdraw(data_dir)
            host.close()
            store.close()
    return 0


def main() -> int:
    logging.basicConfig(
        level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s"
    )
    commands = {"worker": worker, "services": services}
    if len(sys.argv) != 2 or sys.argv[1] not in commands:
        log.error("usage: python -m tests.e2e.processes {worker|services}")
        return 2
    return commands[sys.argv[1]]()


if __name__ == "__main__":
    sys.exit(main())
