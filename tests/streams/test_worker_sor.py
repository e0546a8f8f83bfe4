"""The worker with a real PostgreSQL system of record, and its startup checks.

Debezium writes `__debezium_unavailable_value` for a TOASTed column an UPDATE did not touch
(REPLICA IDENTITY without the old value): the event then carries no content. The worker must
re-read the row from the SoR and index what the SoR holds now, and when the row is gone, remove
the entity's chunks. The SoR is a throwaway PostgreSQL cluster (the `postgres` fixture) with the
table of schemas/sql/entities.postgres.sql in a schema of its own per test. The embedder is the
`HashEmbedder` double: these tests are about what gets indexed, not about vectors.
"""

from __future__ import annotations

import json
import random
import threading
import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import psycopg
import pytest
from prometheus_client import CollectorRegistry
from psycopg.rows import dict_row
from pydantic import SecretStr

from ragcore.errors import ConfigError
from ragcore.kafka_config import KafkaSettings
from ragcore.mapping import TableMapping
from ragcore.plan import PlanConfig
from ragcore.prepare import Preparer
from ragcore.settings import SorSettings, StoreSettings
from ragcore.sparse import Bm25Encoder
from ragcore.store.base import TERM_COUNTS, StoredPoint, StoreFilter
from ragcore.store.edge import EdgeStore
from ragdev.services.postgres import PostgresCluster
from ragdev.services.tansu import TansuBroker
from ragdev.sor.debezium_format import change_event, encode_key, encode_value
from schemas.entities import ContentFormat, Entity
from schemas.events import TOAST_PLACEHOLDER, Op
from streams.app import IngestWorker, build_worker
from streams.consumer import ConsumerConfig
from streams.settings import IngestSettings
from tests.conftest import REPO_ROOT
from tests.streams.support import (
    HASH_SPEC,
    HashEmbedder,
    Record,
    content,
    create_topics,
    eid,
    entities_plan,
    fast_consumer,
    produce,
    wait_committed,
)

pytestmark = pytest.mark.integration

TABLE_SQL = REPO_ROOT / "schemas" / "sql" / "entities.postgres.sql"
TENANT = "acme"
ENTITY = "ent-toast"
T0 = datetime(2026, 3, 1, 12, 0, tzinfo=UTC)


@dataclass
class SorEnv:
    """One test's SoR schema, topic, store and running worker."""

    broker: TansuBroker
    dsn: str
    schema: str
    topic: str
    group: str
    worker: IngestWorker
    registry: CollectorRegistry
    lsn: int = 5000

    def sql(self, statement: str, params: tuple[Any, ...] = ()) -> list[tuple[Any, ...]]:
        with psycopg.connect(self.dsn, autocommit=True) as conn:
            conn.execute(f'SET search_path TO "{self.schema}"'.encode())
            cur = conn.execute(statement.encode(), params)
            return cur.fetchall() if cur.description else []

    def row(self, entity_id: str) -> dict[str, Any]:
        with psycopg.connect(self.dsn, autocommit=True) as conn:
            cur = conn.cursor(row_factory=dict_row)
            query = f'SELECT * FROM "{self.schema}".entities WHERE id = %s'
            cur.execute(query.encode(), (entity_id,))
            found = cur.fetchone()
        assert found is not None
        return found

    def event(self, op: Op, before: dict[str, Any] | None, after: dict[str, Any]) -> Record:
        self.lsn += 8
        value = change_event(op, before=before, after=after, lsn=self.lsn)
        return Record(encode_key({"id": after["id"]}), encode_value(value))

    def deliver(self, *records: Record) -> None:
        last = produce(self.broker.bootstrap_servers, self.topic, records)
        wait_committed(self.broker.bootstrap_servers, self.group, self.topic, last, 60)

    def points(self) -> list[StoredPoint]:
        version = self.worker.registry.active_version(TENANT)
        assert version is not None
        name = self.worker.registry.manifest(TENANT, version).index_name
        return list(self.worker.store.scroll(name, StoreFilter(tenant_id=TENANT)))

    def outcome(self, outcome: str) -> float:
        labels = {"topic": self.topic, "op": "u", "outcome": outcome}
        return self.registry.get_sample_value("ragstream_ingest_events_total", labels) or 0.0


def row(text: str, updated_at: datetime) -> dict[str, Any]:
    """A row of the entities table as Debezium's `after` carries it."""
    return {
        "id": ENTITY,
        "company_id": TENANT,
        "entity_type": "KNOWLEDGE_ARTIFACT",
        "name": "Pump manual",
        "content": text,
        "metadata": {"format": "text"},
        "content_hash": None,
        "created_at": T0,
        "updated_at": updated_at,
        "deleted_at": None,
    }


def settings_for(
    broker: TansuBroker,
    topic: str,
    dlq: str,
    *,
    group: str,
    data_dir: Path,
    sor: SorSettings,
    table: str = "public.entities",
) -> IngestSettings:
    return IngestSettings(
        kafka=KafkaSettings(bootstrap_servers=broker.bootstrap_servers),
        consumer=fast_consumer(dlq, group, topic, reindex_topic=f"{topic}.reindex"),
        store=StoreSettings(data_dir=data_dir),
        embedding_cache=None,
        sor=sor,
        plan=entities_plan(table, topic),
    )


@pytest.fixture
def sor_env(
    kafka_broker: TansuBroker, postgres: PostgresCluster, tmp_path: Path
) -> Iterator[SorEnv]:
    suffix = uuid.uuid4().hex[:8]
    schema, topic, dlq = f"t_{suffix}", f"sor.public.entities.{suffix}", f"dlq.{suffix}"
    with psycopg.connect(postgres.dsn, autocommit=True) as conn:
        conn.execute(f'CREATE SCHEMA "{schema}"'.encode())
        conn.execute(f'SET search_path TO "{schema}"'.encode())
        conn.execute(TABLE_SQL.read_text().encode())
    create_topics(kafka_broker.bootstrap_servers, topic, dlq, f"{topic}.reindex")
    sor = SorSettings(kind="postgres", dsn=SecretStr(postgres.dsn))
    settings = settings_for(
        kafka_broker,
        topic,
        dlq,
        group=suffix,
        data_dir=tmp_path / "store",
        sor=sor,
        table=f"{schema}.entities",
    )
    registry = CollectorRegistry()
    store = EdgeStore(settings.store.data_dir)
    worker = build_worker(settings, registry, store=store, embedder=HashEmbedder())
    try:
        worker.check()  # includes the SoR round trip
        worker.loop.start()
        thread = threading.Thread(target=worker.loop.run, args=(worker.stop,), daemon=True)
        thread.start()
        try:
            yield SorEnv(kafka_broker, postgres.dsn, schema, topic, suffix, worker, registry)
        finally:
            worker.stop.set()
            thread.join(30)
            assert not thread.is_alive()
    finally:
        worker.close()  # store and SoR pool
        with psycopg.connect(postgres.dsn, autocommit=True) as conn:
            conn.execute(f'DROP SCHEMA "{schema}" CASCADE'.encode())


def insert(env: SorEnv, text: str, updated_at: datetime) -> None:
    env.sql(
        "INSERT INTO entities (id, company_id, entity_type, name, content, metadata, "
        "created_at, updated_at) VALUES (%s, %s, 'KNOWLEDGE_ARTIFACT', 'Pump manual', %s, "
        '\'{"format": "text"}\', %s, %s)',
        (ENTITY, TENANT, text, T0, updated_at),
    )


def test_toast_placeholder_makes_the_worker_index_the_sor_row_as_it_is_now(
    sor_env: SorEnv,
) -> None:
    rng = random.Random(3)
    preparer = Preparer(HASH_SPEC)
    old_text = "The pump needs calibration every month."
    insert(sor_env, old_text, T0)
    sor_env.deliver(sor_env.event(Op.CREATE, None, row(old_text, T0)))
    assert [p.payload["text"] for p in sor_env.points()] == [old_text]

    # The content changes in the SoR; the change event that arrives does not carry it.
    new_text = content(rng, 12)
    t1 = T0 + timedelta(minutes=5)
    sor_env.sql(
        "UPDATE entities SET content = %s, name = 'Pump manual v2', updated_at = %s WHERE id = %s",
        (new_text, t1, ENTITY),
    )
    toasted = row(TOAST_PLACEHOLDER, t1) | {"name": "Pump manual v2"}
    sor_env.deliver(sor_env.event(Op.UPDATE, row(old_text, T0), toasted))

    pg = sor_env.row(ENTITY)
    assert pg["content"] == new_text
    digest = preparer.content_hash(pg["content"], ContentFormat.TEXT)
    expected = preparer.chunks(
        Entity(
            tenant_id=pg["company_id"],
            entity_id=eid(pg["id"]),
            entity_type=pg["entity_type"],
            content=pg["content"],
            content_hash=digest,
        )
    )
    assert len(expected) >= 2  # a multi-chunk entity: the whole set must match
    indexed = {p.payload["chunk_id"]: p.payload for p in sor_env.points()}
    assert {cid: p["text"] for cid, p in indexed.items()} == {c.chunk_id: c.text for c in expected}
    assert {p["source_hash"] for p in indexed.values()} == {digest}
    assert {p["title"] for p in indexed.values()} == {"Pump manual v2"}
    assert all(TOAST_PLACEHOLDER not in p["text"] for p in indexed.values())
    assert sor_env.outcome("refetched") == 1


def test_toast_placeholder_for_a_row_gone_from_the_sor_deletes_the_entity(
    sor_env: SorEnv,
) -> None:
    text = "The valve is replaced every year. Spare valves are kept in the east store room."
    insert(sor_env, text, T0)
    sor_env.deliver(sor_env.event(Op.CREATE, None, row(text, T0)))
    assert len(sor_env.points()) == 1

    # An update whose content is a TOAST placeholder arrives after the row was deleted in the
    # SoR (its `d` event still in flight): the refetch finds no row.
    sor_env.sql("DELETE FROM entities WHERE id = %s", (ENTITY,))
    t1 = T0 + timedelta(minutes=1)
    sor_env.deliver(sor_env.event(Op.UPDATE, row(text, T0), row(TOAST_PLACEHOLDER, t1)))

    assert sor_env.points() == []
    assert sor_env.outcome("deleted") == 1
    assert (sor_env.registry.get_sample_value("ragstream_ingest_chunks_deleted_total") or 0) == 1


def test_a_reindex_request_from_retrieve_makes_the_worker_reread_the_sor_row(
    sor_env: SorEnv,
) -> None:
    old_text = "The pump needs calibration every month."
    insert(sor_env, old_text, T0)
    sor_env.deliver(sor_env.event(Op.CREATE, None, row(old_text, T0)))
    # The SoR changes and its change event is lost: Retrieve finds the hit stale and asks.
    new_text = "The pump needs calibration every week since the 2026 firmware update."
    sor_env.sql(
        "UPDATE entities SET content = %s, updated_at = %s WHERE id = %s",
        (new_text, T0 + timedelta(minutes=3), ENTITY),
    )
    reindex = f"{sor_env.topic}.reindex"
    request = {"tenant": TENANT, "entity_id": eid(ENTITY), "reason": "stale", "request_id": "r1"}
    bad = b"{not json"
    bad_tenant = json.dumps({**request, "tenant": "Not A Tenant"}).encode()
    last = produce(
        sor_env.broker.bootstrap_servers,
        reindex,
        [Record(b"k", json.dumps(request).encode()), Record(b"k", bad), Record(b"k", bad_tenant)],
    )
    wait_committed(sor_env.broker.bootstrap_servers, sor_env.group, reindex, last, 60)
    points = sor_env.points()
    assert [p.payload["text"] for p in points] == [new_text]
    # the worker stores the text's term counts with the chunk (Retrieve's exact BM25 reads them)
    encoder = Bm25Encoder()
    stored = encoder.read_counts(points[0].payload[TERM_COUNTS])
    assert stored is not None
    assert stored.to_mapping() == encoder.term_counts(new_text).to_mapping()
    dlq = sor_env.registry.get_sample_value(
        "ragstream_ingest_dlq_records_total", {"code": "BAD_REINDEX_REQUEST"}
    )
    assert dlq == 2  # the worker kept going past both


def test_a_worker_started_with_a_missing_topic_fails_fast_with_a_clear_message(
    kafka_broker: TansuBroker, tmp_path: Path
) -> None:
    suffix = uuid.uuid4().hex[:8]
    present, missing = f"sor.public.entities.{suffix}", f"sor.public.absent.{suffix}"
    dlq = f"dlq.{suffix}"
    create_topics(kafka_broker.bootstrap_servers, present, dlq)
    settings = settings_for(
        kafka_broker, present, dlq, group=suffix, data_dir=tmp_path / "store", sor=SorSettings()
    ).model_copy(
        update={
            "consumer": ConsumerConfig(
                topics=(present, missing), dlq_topic=dlq, group_id=suffix, poll_timeout_s=0.2
            ),
            "plan": PlanConfig(
                tables=(
                    TableMapping(topic=present),
                    TableMapping(table="public.absent", topic=missing),
                )
            ),
        }
    )
    worker = build_worker(settings, CollectorRegistry(), embedder=HashEmbedder())
    started = time.monotonic()
    with pytest.raises(ConfigError) as raised:
        worker.run()  # check, connect, consume: must refuse at connect, not hang
    elapsed = time.monotonic() - started
    assert elapsed < 15, f"took {elapsed:.1f}s to fail"
    message = str(raised.value)
    assert "do not exist" in message
    assert missing in message
    assert present not in message  # only the missing topic is named


def test_a_topic_that_maps_to_no_table_is_refused_before_the_model_loads(tmp_path: Path) -> None:
    settings = IngestSettings(
        consumer=ConsumerConfig(topics=("sor.public.entities", "sor.public.invoices")),
        store=StoreSettings(data_dir=tmp_path),
        embedding_cache=None,
    )
    with pytest.raises(ConfigError, match=r"\['sor\.public\.invoices'\] map to no SoR table"):
        build_worker(settings, CollectorRegistry(), embedder=HashEmbedder())


def test_a_worker_with_only_per_table_mappings_starts_and_consumes_their_topics(
    tmp_path: Path,
) -> None:
    plan = PlanConfig(tables=(TableMapping(table="crm.tickets"), TableMapping(table="kb.articles")))
    settings = IngestSettings(
        store=StoreSettings(data_dir=tmp_path), embedding_cache=None, plan=plan
    )
    worker = build_worker(settings, CollectorRegistry(), embedder=HashEmbedder())
    try:
        assert worker.loop.subscriptions() == [
            "sor.crm.tickets",
            "sor.kb.articles",
            r"^__debezium\-heartbeat\.sor$",
        ]
    finally:
        worker.close()


def test_a_worker_refuses_a_mapping_that_cannot_work_naming_table_and_field(
    kafka_broker: TansuBroker, postgres: PostgresCluster, tmp_path: Path
) -> None:
    """The start-up check reads the SoR's catalog: a misspelt column and REPLICA IDENTITY
    NOTHING are refused before anything is consumed; REPLICA IDENTITY DEFAULT (a tenant move
    seen only by reconcile) is logged and the worker starts."""
    suffix = uuid.uuid4().hex[:8]
    schema, topic, dlq = f"t_{suffix}", f"sor.public.entities.{suffix}", f"dlq.{suffix}"
    with psycopg.connect(postgres.dsn, autocommit=True) as conn:
        conn.execute(f'CREATE SCHEMA "{schema}"'.encode())
        conn.execute(f'SET search_path TO "{schema}"'.encode())
        conn.execute(TABLE_SQL.read_text().encode())
    sor = SorSettings(kind="postgres", dsn=SecretStr(postgres.dsn))
    settings = settings_for(
        kafka_broker,
        topic,
        dlq,
        group=suffix,
        data_dir=tmp_path / "store",
        sor=sor,
        table=f"{schema}.entities",
    )

    def started(plan: PlanConfig) -> None:
        worker = build_worker(
            settings.model_copy(update={"plan": plan}),
            CollectorRegistry(),
            store=EdgeStore(tmp_path / "store"),
            embedder=HashEmbedder(),
        )
        try:
            worker.check()
        finally:
            worker.close()

    mapping = settings.plan.tables[0]
    try:
        misspelt = mapping.model_copy(update={"title_column": "nmae"})
        with pytest.raises(ConfigError) as refused:
            started(PlanConfig(tables=(misspelt,)))
        assert f"{schema}.entities title_column: column 'nmae' does not exist" in str(refused.value)
        assert "did you mean 'name'?" in str(refused.value)
        with psycopg.connect(postgres.dsn, autocommit=True) as conn:
            conn.execute(f'ALTER TABLE "{schema}".entities REPLICA IDENTITY NOTHING'.encode())
        with pytest.raises(ConfigError, match="REPLICA IDENTITY NOTHING"):
            started(settings.plan)
        with psycopg.connect(postgres.dsn, autocommit=True) as conn:
            conn.execute(f'ALTER TABLE "{schema}".entities REPLICA IDENTITY DEFAULT'.encode())
        started(settings.plan)  # a warning, not a refusal
    finally:
        with psycopg.connect(postgres.dsn, autocommit=True) as conn:
            conn.execute(f'DROP SCHEMA "{schema}" CASCADE'.encode())
