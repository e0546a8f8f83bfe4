"""A system-of-record outage never stops the worker: PostgreSQL is stopped while TOAST refetches,
a reindex request and the scheduled reconciliation need it; the worker pauses and retries with
backoff (`ragstream_ingest_backpressure_total{dependency="sor"}`), commits nothing it has not
applied, and once PostgreSQL is back the index converges to the SoR, nothing lost or doubled.

The PostgreSQL cluster is this test's own (it is stopped and restarted in place on its port).
"""

from __future__ import annotations

import json
import random
import threading
import time
import uuid
from collections.abc import Iterator
from datetime import timedelta
from pathlib import Path

import psycopg
import pytest
from prometheus_client import CollectorRegistry
from pydantic import SecretStr

from ragcore.settings import SorSettings
from ragcore.store.edge import EdgeStore
from ragdev.services.postgres import PostgresCluster
from ragdev.services.tansu import TansuBroker
from schemas.events import TOAST_PLACEHOLDER, Op
from streams.app import build_worker
from streams.reconcile import reconcile
from streams.settings import ReconcileSettings
from tests.conftest import REPO_ROOT
from tests.streams.support import (
    HashEmbedder,
    Record,
    committed,
    content,
    create_topics,
    produce,
    wait_committed,
)
from tests.streams.test_worker_sor import T0, TENANT, SorEnv, settings_for

pytestmark = [pytest.mark.integration, pytest.mark.slow]


@pytest.fixture
def outage_env(
    kafka_broker: TansuBroker, tmp_path: Path
) -> Iterator[tuple[SorEnv, PostgresCluster]]:
    cluster = PostgresCluster().start()
    suffix = uuid.uuid4().hex[:8]
    schema, topic, dlq = f"o_{suffix}", f"sor.public.entities.{suffix}", f"dlq.{suffix}"
    with psycopg.connect(cluster.dsn, autocommit=True) as conn:
        conn.execute(f'CREATE SCHEMA "{schema}"'.encode())
        conn.execute(f'SET search_path TO "{schema}"'.encode())
        conn.execute((REPO_ROOT / "schemas" / "sql" / "entities.postgres.sql").read_bytes())
    create_topics(kafka_broker.bootstrap_servers, topic, dlq, f"{topic}.reindex")
    settings = settings_for(
        kafka_broker,
        topic,
        dlq,
        group=suffix,
        data_dir=tmp_path / "store",
        sor=SorSettings(kind="postgres", dsn=SecretStr(cluster.dsn)),
        table=f"{schema}.entities",
    ).model_copy(update={"reconcile": ReconcileSettings(interval_s=0.5)})
    registry = CollectorRegistry()
    store = EdgeStore(settings.store.data_dir)
    worker = build_worker(settings, registry, store=store, embedder=HashEmbedder())
    worker.check()
    worker.loop.start()
    consumer = threading.Thread(target=worker.loop.run, args=(worker.stop,), daemon=True)
    scheduled = threading.Thread(target=worker.reconcile_forever, daemon=True)
    consumer.start()
    scheduled.start()
    env = SorEnv(kafka_broker, cluster.dsn, schema, topic, suffix, worker, registry)
    try:
        yield env, cluster
    finally:
        worker.stop.set()
        for thread in (consumer, scheduled):
            thread.join(30)
        worker.close()
        store.close()
        cluster.stop()


def _row(key: str, text: str, minute: int) -> dict[str, object]:
    return {
        "id": key,
        "company_id": TENANT,
        "entity_type": "KNOWLEDGE_ARTIFACT",
        "name": f"Doc {key}",
        "content": text,
        "metadata": {"format": "text"},
        "content_hash": None,
        "created_at": T0,
        "updated_at": T0 + timedelta(minutes=minute),
        "deleted_at": None,
    }


def test_postgres_stopped_mid_stream_pauses_the_worker_and_the_index_converges_after(
    outage_env: tuple[SorEnv, PostgresCluster],
) -> None:
    env, cluster = outage_env
    rng = random.Random(17)
    keys = [f"doc-{n:02d}" for n in range(20)]
    for key in keys:
        env.sql(
            "INSERT INTO entities (id, company_id, name, content, metadata, created_at,"
            ' updated_at) VALUES (%s, %s, %s, %s, \'{"format": "text"}\', %s, %s)',
            (key, TENANT, f"Doc {key}", content(rng, 1), T0, T0),
        )
    env.deliver(*(env.event(Op.CREATE, None, env.row(k)) for k in keys))
    # the SoR changes; the change events that will arrive carry the TOAST placeholder
    for key in keys:
        env.sql(
            "UPDATE entities SET content = %s, updated_at = %s WHERE id = %s",
            (content(rng, 1), T0 + timedelta(minutes=5), key),
        )
    cluster.stop(keep_data=True)  # PostgreSQL goes away
    placeholders = [env.event(Op.UPDATE, None, _row(k, TOAST_PLACEHOLDER, 5)) for k in keys]
    last = produce(env.broker.bootstrap_servers, env.topic, placeholders)
    request = {"tenant": TENANT, "entity_id": "entities:doc-00", "reason": "stale"}
    reindex_last = produce(
        env.broker.bootstrap_servers,
        f"{env.topic}.reindex",
        [Record(b"k", json.dumps(request).encode())],
    )

    def backpressure() -> float:
        return (
            env.registry.get_sample_value(
                "ragstream_ingest_backpressure_total", {"dependency": "sor"}
            )
            or 0.0
        )

    deadline = time.monotonic() + 30
    while backpressure() < 3:  # refetch batches and the scheduled reconcile, retried
        assert time.monotonic() < deadline, "the SoR outage was never reported"
        time.sleep(0.1)
    during = committed(env.broker.bootstrap_servers, env.group, env.topic, list(last))
    assert all(during.get(p, -1) <= off for p, off in last.items())  # nothing committed past
    assert env.worker.loop is not None and not env.worker.stop.is_set()  # still running

    cluster.start()  # PostgreSQL is back on the same port
    wait_committed(env.broker.bootstrap_servers, env.group, env.topic, last, 60)
    wait_committed(
        env.broker.bootstrap_servers, env.group, f"{env.topic}.reindex", reindex_last, 60
    )
    sor = env.worker.sor
    assert sor is not None
    report = reconcile(TENANT, sor=sor, store=env.worker.store, registry=env.worker.registry)
    assert (report.drift, report.sor_entities) == (0, 20), report.to_dict()
    texts = {p.payload["source_entity_id"]: p.payload["text"] for p in env.points()}
    for key in keys:
        # the new content (as normalized: whitespace collapsed), once
        assert texts[f"entities:{key}"] == " ".join(env.row(key)["content"].split())
    assert len(env.points()) == 20
    assert env.registry.get_sample_value("ragstream_ingest_paused_partitions") == 0
