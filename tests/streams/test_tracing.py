"""The worker's span per batch, against the tansu broker and qdrant-edge, recorded by the SDK's
in-memory exporter."""

from __future__ import annotations

import threading
import uuid
from pathlib import Path

import pytest
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from prometheus_client import CollectorRegistry

from ragcore.kafka_config import KafkaSettings
from ragcore.settings import StoreSettings
from ragcore.store.edge import EdgeStore
from ragcore.tracing import Tracing
from ragdev.services.tansu import TansuBroker
from streams.app import build_worker
from streams.settings import IngestSettings
from tests.streams.support import (
    HashEmbedder,
    SorModel,
    content,
    create_topics,
    entities_plan,
    fast_consumer,
    produce,
    wait_committed,
)

pytestmark = pytest.mark.integration


def test_each_handled_batch_is_one_ingest_span(kafka_broker: TansuBroker, tmp_path: Path) -> None:
    suffix = uuid.uuid4().hex[:8]
    topic, dlq, group = f"sor.public.entities.{suffix}", f"dlq.{suffix}", f"ingest-{suffix}"
    bootstrap = kafka_broker.bootstrap_servers
    create_topics(bootstrap, topic, dlq)
    exporter = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    store = EdgeStore(tmp_path / "store")
    settings = IngestSettings(
        kafka=KafkaSettings(bootstrap_servers=bootstrap),
        consumer=fast_consumer(dlq, group, topic, max_batch_records=200),
        store=StoreSettings(data_dir=tmp_path / "store"),
        embedding_cache=None,
        plan=entities_plan("public.entities", topic),
    )
    worker = build_worker(
        settings,
        CollectorRegistry(),
        store=store,
        embedder=HashEmbedder(),
        tracing=Tracing(provider),
    )
    sor = SorModel()
    records = [sor.put(f"ent-{i}", "acme", content(sor.rng, 2)) for i in range(6)]
    last = produce(bootstrap, topic, records)
    worker.loop.start()
    thread = threading.Thread(target=worker.loop.run, args=(worker.stop,), daemon=True)
    thread.start()
    try:
        wait_committed(bootstrap, group, topic, last, 60)
    finally:
        worker.stop.set()
        thread.join(30)
        worker.close()
        store.close()
        provider.shutdown()
    spans = [s for s in exporter.get_finished_spans() if s.name == "ingest.batch"]
    assert spans and all(s.parent is None for s in spans)
    attributes = [dict(s.attributes or {}) for s in spans]
    counts = [a["messaging.batch.message_count"] for a in attributes]
    assert sum(c for c in counts if isinstance(c, int)) == len(records)
    assert all(isinstance(c, int) and c > 0 for c in counts)
    for a in attributes:
        assert a["messaging.system"] == "kafka"
        assert a["messaging.consumer.group.name"] == group
        assert a["ragstream.outcome"] == "applied"
