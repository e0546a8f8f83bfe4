"""Fixtures of the ingest worker suites."""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

from ragcore.prepare import Preparer
from ragcore.store.edge import EdgeStore
from ragdev.services.tansu import TansuBroker
from tests.streams.support import HASH_SPEC, create_topics
from tests.streams.worker_env import Env


@pytest.fixture
def env(kafka_broker: TansuBroker, tmp_path: Path) -> Iterator[Env]:
    suffix = uuid.uuid4().hex[:8]
    topic, dlq = f"sor.public.entities.{suffix}", f"ragstream.dlq.{suffix}"
    create_topics(kafka_broker.bootstrap_servers, topic, dlq)
    store = EdgeStore(tmp_path / "store")
    environment = Env(kafka_broker, topic, dlq, f"ingest-{suffix}", tmp_path / "store", store)
    yield environment
    for worker, thread in environment.workers:
        worker.stop.set()
        thread.join(30)
    store.close()


@pytest.fixture
def preparer() -> Preparer:
    return Preparer(HASH_SPEC)
