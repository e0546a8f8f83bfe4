"""The ingest worker wired for tests: a real broker topic and DLQ, the real qdrant-edge engine,
`HashEmbedder`, workers run in threads (`Env`); the `env` and `preparer` fixtures are in
tests/streams/conftest.py."""

from __future__ import annotations

import threading
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from prometheus_client import CollectorRegistry

from ragcore.errors import RagstreamError, StoreUnavailableError
from ragcore.kafka_config import KafkaSettings
from ragcore.plan import PlanConfig
from ragcore.settings import StoreSettings
from ragcore.store.base import PointRecord, VectorStore
from ragcore.store.edge import EdgeStore
from ragdev.services.tansu import TansuBroker
from streams.app import IngestWorker, build_worker
from streams.consumer import ConsumerConfig
from streams.settings import IngestSettings
from tests.streams.support import (
    HashEmbedder,
    Record,
    entities_plan,
    index_snapshot,
    produce,
    wait_committed,
)


class FlakyStore:
    """Wraps a real store; while `down`, writes fail as an unreachable store's would."""

    def __init__(self, inner: VectorStore) -> None:
        self.inner = inner
        self.down = False
        self.failed_writes = 0

    def upsert(self, name: str, points: Sequence[PointRecord], wait: bool = True) -> None:
        if self.down:
            self.failed_writes += 1
            raise StoreUnavailableError("store down (test)")
        self.inner.upsert(name, points, wait)

    def __getattr__(self, name: str) -> Any:
        return getattr(self.inner, name)


@dataclass
class Env:
    """One test's topic, group, store and running workers."""

    broker: TansuBroker
    topic: str
    dlq: str
    group: str
    data_dir: Path
    store: EdgeStore
    embedder: HashEmbedder = field(default_factory=HashEmbedder)
    workers: list[tuple[IngestWorker, threading.Thread]] = field(default_factory=list)
    registry: CollectorRegistry = field(default_factory=CollectorRegistry)
    session_timeout_ms: int = 2000
    consumer_overrides: dict[str, Any] = field(default_factory=dict)
    #: what a worker's `loop.run` raised (its processing loop died)
    loop_errors: list[Exception] = field(default_factory=list)
    #: the mapped tables (default: `entities` on `topic`) and their topics besides `topic`
    plan: PlanConfig | None = None
    extra_topics: tuple[str, ...] = ()

    def settings(self, **consumer: Any) -> IngestSettings:
        return IngestSettings(
            kafka=KafkaSettings(bootstrap_servers=self.broker.bootstrap_servers),
            consumer=ConsumerConfig(
                topics=(self.topic, *self.extra_topics),
                dlq_topic=self.dlq,
                group_id=self.group,
                session_timeout_ms=self.session_timeout_ms,
                heartbeat_interval_ms=300,
                poll_timeout_s=0.2,
                max_batch_records=200,
                backoff_initial_s=0.2,
                backoff_max_s=1.0,
                **{**self.consumer_overrides, **consumer},
            ),
            store=StoreSettings(data_dir=self.data_dir),
            embedding_cache=None,
            plan=self.plan or entities_plan("public.entities", self.topic),
        )

    def start_worker(self, store: VectorStore | None = None) -> IngestWorker:
        worker = build_worker(
            self.settings(),
            self.registry if not self.workers else CollectorRegistry(),
            store=store or self.store,
            embedder=self.embedder,
        )
        worker.check()
        worker.loop.start()

        def run() -> None:
            try:
                worker.loop.run(worker.stop)
            except RagstreamError as exc:  # the loop died: the test asserts on it
                self.loop_errors.append(exc)

        thread = threading.Thread(target=run, daemon=True)
        thread.start()
        self.workers.append((worker, thread))
        return worker

    def stop_worker(self, worker: IngestWorker) -> None:
        for w, thread in self.workers:
            if w is worker:
                w.stop.set()
                thread.join(30)
                assert not thread.is_alive()

    def produce(self, records: Sequence[Record]) -> dict[int, int]:
        return produce(self.broker.bootstrap_servers, self.topic, records)

    def wait(self, last: dict[int, int], timeout: float = 60.0) -> None:
        wait_committed(self.broker.bootstrap_servers, self.group, self.topic, last, timeout)

    def snapshot(self, tenants: Sequence[str]) -> dict[str, dict[str, dict[str, str]]]:
        registry = self.workers[0][0].registry
        return index_snapshot(self.store, registry, tenants)

    def metric(self, name: str, labels: dict[str, str] | None = None) -> float:
        value = self.registry.get_sample_value(name, labels or {})
        return value or 0.0
