"""The worker with the real local ONNX embedder (all-MiniLM-L6-v2), end to end: Debezium events
over tansu, the embedder built from settings exactly as `ragstream ingest` builds it (persistent
cache included), qdrant-edge. A dense search for a paraphrase that shares almost no words with
its entity must find that entity first: only a real sentence encoder can do that (the
`HashEmbedder` double of the other suites matches words, not meaning).
"""

from __future__ import annotations

import threading
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest
from prometheus_client import CollectorRegistry

from ragcore.embedders.cache import EmbeddingCacheConfig
from ragcore.embedders.local_onnx import MINILM_SPEC, LocalEmbedderConfig
from ragcore.kafka_config import KafkaSettings
from ragcore.settings import StoreSettings
from ragcore.store.base import StoreFilter
from ragcore.store.edge import EdgeStore
from ragdev.services.tansu import TansuBroker
from streams.app import IngestWorker, build_worker
from streams.settings import IngestSettings
from tests.streams.support import (
    SorModel,
    create_topics,
    eid,
    entities_plan,
    fast_consumer,
    produce,
    wait_committed,
)

pytestmark = [pytest.mark.integration, pytest.mark.slow]

TENANT = "acme"
DOCS = {
    "ent-refund": (
        "Customers may return a product within thirty days of purchase. The full price is "
        "credited to the original payment method once the warehouse has received the item."
    ),
    "ent-pump": (
        "The centrifugal pump in building B is calibrated every month. Technicians record the "
        "measured pressure and replace worn seals before they leak."
    ),
    "ent-cert": (
        "TLS certificates of the public API are rotated automatically ninety days after "
        "issuance. An alert fires when a certificate expires in less than a week."
    ),
    "ent-backup": (
        "Nightly backups of the billing database are kept for ninety days. A restore drill "
        "runs every quarter to prove that the backups can actually be read."
    ),
    "ent-onboarding": (
        "New employees receive a laptop, a security badge and an onboarding checklist on "
        "their first day, and meet their mentor during the first week."
    ),
}
#: Paraphrases with (almost) no content word in common with their entity.
PARAPHRASES = {
    "how long do I have to get my money back after buying something": "ent-refund",
    "what do newcomers get when they join the company": "ent-onboarding",
}


@pytest.fixture
def running(
    kafka_broker: TansuBroker, tmp_path: Path
) -> Iterator[tuple[IngestWorker, CollectorRegistry, str, str]]:
    """A worker with the real local embedder, consuming a fresh topic in a thread."""
    suffix = uuid.uuid4().hex[:8]
    topic, dlq, group = f"sor.public.entities.{suffix}", f"ragstream.dlq.{suffix}", suffix
    create_topics(kafka_broker.bootstrap_servers, topic, dlq)
    settings = IngestSettings(
        kafka=KafkaSettings(bootstrap_servers=kafka_broker.bootstrap_servers),
        consumer=fast_consumer(dlq, group, topic),
        embedder=LocalEmbedderConfig(),
        embedding_cache=EmbeddingCacheConfig(path=tmp_path / "cache.sqlite"),
        store=StoreSettings(data_dir=tmp_path / "store"),
        plan=entities_plan("public.entities", topic),
    )
    store = EdgeStore(settings.store.data_dir)
    registry = CollectorRegistry()
    worker = build_worker(settings, registry, store=store)  # the embedder comes from settings
    try:
        worker.check()
        worker.loop.start()
        thread = threading.Thread(target=worker.loop.run, args=(worker.stop,), daemon=True)
        thread.start()
        try:
            yield worker, registry, topic, group
        finally:
            worker.stop.set()
            thread.join(30)
            assert not thread.is_alive()
    finally:
        worker.close()  # the embedder (ONNX session, cache) and the store


def test_real_minilm_worker_indexes_entities_and_a_paraphrase_finds_its_entity_first(
    running: tuple[IngestWorker, CollectorRegistry, str, str], kafka_broker: TansuBroker
) -> None:
    worker, registry, topic, group = running
    sor = SorModel()
    records = [sor.put(entity_id, TENANT, text) for entity_id, text in DOCS.items()]
    last = produce(kafka_broker.bootstrap_servers, topic, records)
    wait_committed(kafka_broker.bootstrap_servers, group, topic, last, timeout=90)

    assert worker.embedder.spec == MINILM_SPEC
    version = worker.registry.active_version(TENANT)
    assert version is not None
    manifest = worker.registry.manifest(TENANT, version)
    assert manifest.embedding_model == "all-MiniLM-L6-v2"
    assert manifest.embedding_model_version == MINILM_SPEC.model_version
    assert manifest.dimension == 384

    points = list(worker.store.scroll(manifest.index_name, StoreFilter(tenant_id=TENANT)))
    indexed = sorted(p.payload["source_entity_id"] for p in points)
    assert indexed == sorted(eid(key) for key in DOCS)  # 1 chunk each
    assert {p.payload["embedding_version"] for p in points} == {MINILM_SPEC.model_version}
    assert registry.get_sample_value("ragstream_embedding_cache_misses_total") == len(DOCS)

    for query, expected in PARAPHRASES.items():
        hits = worker.store.search_dense(
            manifest.index_name,
            worker.embedder.embed_query(query),
            StoreFilter(tenant_id=TENANT),
            limit=len(DOCS),
        )
        ranking = [h.payload["source_entity_id"] for h in hits]  # measured margins: >= 0.35
        assert ranking[0] == eid(expected), (query, ranking, [round(h.score, 3) for h in hits])
        assert hits[0].score > hits[1].score + 0.2, (query, [h.score for h in hits])
