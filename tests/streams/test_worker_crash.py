"""Crash safety: the worker process is killed with SIGKILL at random points, restarted, and the
final index must equal the expected state exactly (every entity's chunk set and hashes).

The worker runs as `python -m streams` with its settings from the environment, the OpenAI-
compatible HTTP embedder pointed at a loopback stub (fast deterministic vectors), the embedding
cache on disk and qdrant-edge shards on disk: all the state a crash can tear.
"""

from __future__ import annotations

import json
import os
import random
import signal
import subprocess
import sys
import time
import uuid
from pathlib import Path

import pytest

from ragcore.prepare import Preparer
from ragcore.settings import StoreSettings
from ragcore.store.base import PayloadSchema
from ragcore.store.registry import FileIndexRegistry
from ragcore.wiring import build_store
from ragdev.services.tansu import TansuBroker
from tests.conftest import REPO_ROOT
from tests.streams.support import (
    HASH_SPEC,
    EmbeddingStubServer,
    SorModel,
    committed,
    create_topics,
    fast_consumer,
    index_snapshot,
    iter_chunks,
    produce,
    stub_embedder,
)

TENANTS = ["acme", "globex", "initech"]


def worker_env(
    broker: TansuBroker, stub: EmbeddingStubServer, tmp: Path, topic: str
) -> dict[str, str]:
    consumer = fast_consumer(
        f"{topic}.dlq", f"crash-{topic}", topic, max_batch_records=100
    ).model_dump(mode="json")
    embedder = stub_embedder(stub.base_url, max_retries=2)
    return {
        **os.environ,
        "PYTHONPATH": str(REPO_ROOT),
        "RAGSTREAM_CACHE_DIR": str(tmp / "cache"),
        "RAGSTREAM_KAFKA__BOOTSTRAP_SERVERS": broker.bootstrap_servers,
        "RAGSTREAM_CONSUMER": json.dumps(consumer),
        "RAGSTREAM_PLAN__TABLES": json.dumps([{"table": "public.entities", "topic": topic}]),
        "RAGSTREAM_EMBEDDER": json.dumps(embedder),
        "RAGSTREAM_STORE__DATA_DIR": str(tmp / "store"),
        "RAGSTREAM_EMBEDDING_CACHE__PATH": str(tmp / "embedding-cache.sqlite"),
        "RAGSTREAM_METRICS_PORT": "0",
    }


@pytest.mark.integration
@pytest.mark.slow
def test_worker_killed_at_random_points_converges_to_the_exact_expected_index(
    kafka_broker: TansuBroker, tmp_path: Path
) -> None:
    topic = f"sor.public.entities.{uuid.uuid4().hex[:8]}"
    create_topics(kafka_broker.bootstrap_servers, topic, f"{topic}.dlq")
    sor = SorModel(seed=2026)
    records = sor.random_stream(6000, TENANTS, 300)
    last = produce(kafka_broker.bootstrap_servers, topic, records)
    total = sum(off + 1 for off in last.values())
    group = f"crash-{topic}"
    rng = random.Random(99)
    log_path = tmp_path / "worker.log"
    log = log_path.open("ab")

    def done() -> int:
        got = committed(kafka_broker.bootstrap_servers, group, topic, list(last))
        return sum(max(0, o) for o in got.values())

    with EmbeddingStubServer() as stub:
        env = worker_env(kafka_broker, stub, tmp_path, topic)
        cmd = [sys.executable, "-m", "streams"]
        progress: list[int] = []
        while len(progress) < 12:
            proc = subprocess.Popen(cmd, env=env, stdout=log, stderr=subprocess.STDOUT)
            # Kill mid-work whatever the start-up time: wait for this incarnation's first
            # commit (or the end of the stream), then SIGKILL at a random point after it.
            before, deadline = done(), time.monotonic() + 90
            while done() == before and before < total:
                assert proc.poll() is None, f"worker exited early (code {proc.returncode})"
                assert time.monotonic() < deadline, "the worker made no progress"
                time.sleep(0.05)
            # within half a second: the whole stream takes a few seconds, and a later kill
            # often found it finished (4 of 12 mid-stream once the batches filled up)
            time.sleep(rng.uniform(0.0, 0.5))
            proc.send_signal(signal.SIGKILL)
            proc.wait(10)
            progress.append(done())
        # a final run to completion, then a graceful stop (SIGTERM) once it is consuming (a
        # signal before the interpreter reached the worker's handlers would kill it outright)
        started = log_path.read_text(errors="replace").count("consuming [")
        proc = subprocess.Popen(cmd, env=env, stdout=log, stderr=subprocess.STDOUT)
        deadline = time.monotonic() + 120
        while log_path.read_text(errors="replace").count("consuming [") == started:
            assert time.monotonic() < deadline, "the final worker never started consuming"
            assert proc.poll() is None, f"worker died (code {proc.returncode})"
            time.sleep(0.2)
        while done() < total:
            assert time.monotonic() < deadline, f"not finished: {done()} of {total}"
            assert proc.poll() is None, f"worker died (code {proc.returncode})"
            time.sleep(0.5)
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(30) == 0
    log.close()
    mid_stream = [p for p in progress if p < total]
    assert len(mid_stream) >= 5, f"too few kills landed mid-stream: {progress} of {total}"

    # the worker ran on the store `ragstream` builds: every tenant a partition of the pool
    store = build_store(StoreSettings(data_dir=tmp_path / "store"), PayloadSchema())
    try:
        registry = FileIndexRegistry(tmp_path / "store", store)
        actual = index_snapshot(store, registry, TENANTS)
    finally:
        store.close()
    expected = sor.expected_index(Preparer(HASH_SPEC))
    assert actual == expected
    assert sum(1 for _ in iter_chunks(expected)) > 400  # a few hundred entities, many chunks
