"""Changes lost to Kafka retention: a worker whose group's committed offset, or whose fetch
position while it runs, is out of range must say so (ERROR naming the lost offsets,
`ragstream_ingest_offset_gaps_total`) and close the gap by reconciling with the SoR, instead of
letting `auto.offset.reset` jump silently.

The tansu dev broker implements neither DeleteRecords (the admin call drops the connection) nor
retention, and it forgets a deleted topic's committed offsets, so its low watermark is always 0.
The stopped-worker test on tansu therefore makes the committed offset out of range from the
other side: the group's offset is moved past the log end while the worker is stopped (the
changes in between never reach the worker, as when they expire). The running-worker test uses
librdkafka's mock cluster, whose retention by size deletes records for real (`MockKafka`;
consumer-level cases in `test_retention.py`).
"""

from __future__ import annotations

import logging
import threading
import time
import uuid
from collections.abc import Iterator
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import psycopg
import pytest
from confluent_kafka import Consumer, TopicPartition
from prometheus_client import CollectorRegistry
from pydantic import SecretStr

from ragcore.errors import EmbeddingUnavailableError
from ragcore.kafka_config import KafkaSettings
from ragcore.settings import SorSettings, StoreSettings
from ragcore.store.edge import EdgeStore
from ragdev.services.postgres import PostgresCluster
from ragdev.services.tansu import TansuBroker
from ragdev.sor.debezium_format import change_event, encode_key, encode_value
from schemas.events import Op
from streams.app import IngestWorker, LostTables, build_worker
from streams.consumer import SchedulerSettings, offset_gap
from streams.liveness import LivenessSettings
from streams.reconcile import reconcile
from streams.settings import IngestSettings, ReconcileSettings
from tests.conftest import REPO_ROOT
from tests.streams.support import (
    HashEmbedder,
    MockKafka,
    Record,
    create_topics,
    entities_plan,
    fast_consumer,
    gap_logged,
    produce,
    wait_committed,
)

TABLE_SQL = REPO_ROOT / "schemas" / "sql" / "entities.postgres.sql"
TENANT = "acme"
T0 = datetime(2026, 3, 1, 12, 0, tzinfo=UTC)


@pytest.mark.unit
def test_a_committed_offset_below_the_low_watermark_names_the_expired_offsets() -> None:
    gap = offset_gap("sor.public.entities", 2, offset=40, low=100, high=250)
    assert gap is not None
    assert gap.describe() == (
        "sor.public.entities[2]: committed offset 40 < low watermark 100, offsets 40..99 (60) lost"
    )


@pytest.mark.unit
def test_an_offset_gap_names_the_tables_to_reconcile_and_heartbeats_none() -> None:
    heartbeat = offset_gap("__debezium-heartbeat.sor", 0, offset=5, low=90, high=100)
    entities = offset_gap("sor.public.entities", 0, offset=5, low=90, high=100)
    tickets = offset_gap("sor.public.tickets", 3, offset=5, low=90, high=100)
    unknown = offset_gap("elsewhere", 0, offset=5, low=90, high=100)
    assert heartbeat is not None and entities is not None
    assert tickets is not None and unknown is not None
    tables = {
        "sor.public.entities": "entities",
        "sor.public.tickets": "tickets",
        "sor.public.documents": "documents",
    }
    lost = LostTables(tables.get, "__debezium-heartbeat", tables.values())
    lost.add([heartbeat])
    assert not lost.pending()  # a heartbeat topic carries no change
    assert lost.take() == frozenset()
    lost.add([heartbeat, entities])
    lost.add([tickets])
    assert lost.pending()
    assert lost.take() == frozenset({"entities", "tickets"})
    assert not lost.pending()
    lost.restore(frozenset({"tickets"}))  # a failed reconciliation is retried
    assert lost.take() == frozenset({"tickets"})
    lost.add([entities, unknown])  # a topic of no known table: every table, to be safe
    assert lost.take() is None
    documents = offset_gap("sor.public.documents", 0, offset=5, low=90, high=100)
    assert documents is not None
    lost.add([entities, tickets, documents])
    assert lost.take() is None  # every table: one full run (its drift gauges are exported)
    lost.restore(None)
    assert lost.take() is None and lost.take() == frozenset()


@pytest.mark.unit
def test_a_committed_offset_past_the_log_end_is_a_gap_of_unknown_size() -> None:
    gap = offset_gap("t", 0, offset=12, low=0, high=3)
    assert gap is not None
    assert "committed offset 12 > high watermark 3" in gap.describe()


@pytest.mark.unit
def test_a_slack_tolerates_a_broker_that_under_reports_its_high_watermark() -> None:
    # tansu reports the base offset of the last record batch + 1: after a batch of 40 records
    # at offsets 0..39 the group commits 40 while the high watermark reads 1
    assert offset_gap("t", 0, offset=40, low=0, high=1) is not None
    assert offset_gap("t", 0, offset=40, low=0, high=1, slack=1_000) is None
    assert offset_gap("t", 0, offset=5_001, low=0, high=1, slack=1_000) is not None
    # the slack never hides offsets expired below the log start
    assert offset_gap("t", 0, offset=40, low=100, high=250, slack=1_000) is not None


@pytest.mark.unit
@pytest.mark.parametrize(
    ("committed", "low", "high"),
    [(-1001, 100, 250), (100, 100, 250), (180, 100, 250), (250, 100, 250), (0, 0, 0)],
)
def test_an_offset_within_the_log_or_never_committed_is_no_gap(
    committed: int, low: int, high: int
) -> None:
    assert offset_gap("t", 0, committed, low, high) is None


def _row(entity: str, text: str) -> dict[str, object]:
    return {
        "id": entity,
        "company_id": TENANT,
        "entity_type": "KNOWLEDGE_ARTIFACT",
        "name": entity,
        "content": text,
        "metadata": {"format": "text"},
        "content_hash": None,
        "created_at": T0,
        "updated_at": T0,
        "deleted_at": None,
    }


class GapEnv:
    """A SoR schema, a topic and a store that outlive the worker's restarts, on tansu (a
    one-partition topic) or librdkafka's mock cluster (`MockKafka`: topics auto-created with
    4 partitions; the changes go to partition 0)."""

    def __init__(
        self,
        kafka: TansuBroker | MockKafka,
        dsn: str,
        data_dir: Path,
        read_ahead_records: int | None = None,
        **settings: Any,
    ) -> None:
        suffix = uuid.uuid4().hex[:8]
        self.bootstrap, self.dsn = kafka.bootstrap_servers, dsn
        self.schema, self.topic, self.group = f"t_{suffix}", f"sor.gap.{suffix}", suffix
        self.dlq = f"dlq.{suffix}"
        self.embedder = HashEmbedder()
        with psycopg.connect(dsn, autocommit=True) as conn:
            conn.execute(f'CREATE SCHEMA "{self.schema}"'.encode())
            conn.execute(f'SET search_path TO "{self.schema}"'.encode())
            conn.execute(TABLE_SQL.read_text().encode())
        consumer = fast_consumer(self.dlq, self.group, self.topic)
        if read_ahead_records is not None:
            schedule = SchedulerSettings(read_ahead_records=read_ahead_records, tenant_share=1.0)
            consumer = consumer.model_copy(update={"scheduler": schedule})
        if isinstance(kafka, MockKafka):
            kafka.create(self.topic, self.dlq)
            # the mock delays a group's first join by 3 s: a shorter session expires the member
            consumer = consumer.model_copy(
                update={"session_timeout_ms": 6000, "heartbeat_interval_ms": 500}
            )
        else:
            create_topics(self.bootstrap, self.topic, self.dlq, partitions=1)
        self.store = EdgeStore(data_dir)
        self.settings = IngestSettings(
            kafka=KafkaSettings(bootstrap_servers=self.bootstrap),
            consumer=consumer,
            store=StoreSettings(data_dir=data_dir),
            embedding_cache=None,
            sor=SorSettings(kind="postgres", dsn=SecretStr(dsn)),
            plan=entities_plan(f"{self.schema}.entities", self.topic),
            liveness=LivenessSettings(heartbeats=False, check_interval_s=0.2),
            **settings,
        )

    def insert(self, entity: str, text: str) -> None:
        with psycopg.connect(self.dsn, autocommit=True) as conn:
            conn.execute(f'SET search_path TO "{self.schema}"'.encode())
            conn.execute(
                b"INSERT INTO entities (id, company_id, entity_type, name, content, metadata, "
                b"created_at, updated_at) VALUES (%s, %s, 'KNOWLEDGE_ARTIFACT', %s, %s, "
                b'\'{"format": "text"}\', %s, %s)',
                (entity, TENANT, entity, text, T0, T0),
            )

    def change(self, entity: str, text: str, lsn: int) -> Record:
        """The Debezium create event of a row `insert` wrote."""
        value = change_event(Op.CREATE, before=None, after=_row(entity, text), lsn=lsn)
        return Record(encode_key({"id": entity}), encode_value(value))

    def start(self, registry: CollectorRegistry) -> tuple[IngestWorker, threading.Thread]:
        worker = build_worker(self.settings, registry, store=self.store, embedder=self.embedder)
        thread = threading.Thread(target=worker.run, daemon=True)
        thread.start()
        return worker, thread

    def close(self) -> None:
        self.store.close()
        with psycopg.connect(self.dsn, autocommit=True) as conn:
            conn.execute(f'DROP SCHEMA "{self.schema}" CASCADE'.encode())


@pytest.fixture
def gap_env(
    kafka_broker: TansuBroker, postgres: PostgresCluster, tmp_path: Path
) -> Iterator[GapEnv]:
    env = GapEnv(kafka_broker, postgres.dsn, tmp_path / "store")
    try:
        yield env
    finally:
        env.close()


def stop(worker: IngestWorker, thread: threading.Thread) -> None:
    worker.stop.set()
    thread.join(30)
    assert not thread.is_alive()


@pytest.mark.integration
def test_offsets_lost_while_the_worker_was_stopped_are_named_counted_and_reconciled(
    gap_env: GapEnv, caplog: pytest.LogCaptureFixture
) -> None:
    env = gap_env
    bootstrap = env.bootstrap
    # the worker indexes one entity through the stream, then stops
    text = "The pump needs calibration every month."
    env.insert("ent-1", text)
    worker, thread = env.start(CollectorRegistry())
    last = produce(bootstrap, env.topic, [env.change("ent-1", text, 5000)])
    wait_committed(bootstrap, env.group, env.topic, last, 60)
    stop(worker, thread)

    # while it is down, two rows change in the SoR and their changes never reach it: the group's
    # offset moves past the log end (tansu cannot delete records; see the module docstring)
    env.insert("ent-2", "Replace the filter after 500 hours of operation.")
    env.insert("ent-3", "The valve must be closed before maintenance.")
    mover = Consumer({"bootstrap.servers": bootstrap, "group.id": env.group})
    try:
        mover.commit(offsets=[TopicPartition(env.topic, 0, 7)], asynchronous=False)
    finally:
        mover.close()

    registry = CollectorRegistry()
    labels = {"topic": env.topic, "partition": "0"}
    with caplog.at_level(logging.INFO):
        worker, thread = env.start(registry)
        try:
            deadline = time.monotonic() + 60
            while time.monotonic() < deadline and not any(
                r.getMessage().startswith("reconcile acme:") for r in caplog.records
            ):
                time.sleep(0.2)
            assert registry.get_sample_value("ragstream_ingest_offset_gaps_total", labels) == 1
            errors = [r.getMessage() for r in caplog.records if r.levelno == logging.ERROR]
            assert any(
                f"{env.topic}[0]: committed offset 7 > high watermark 1" in m for m in errors
            ), errors
            assert any(
                m.startswith("reconcile acme:") for m in (r.getMessage() for r in caplog.records)
            )
            assert worker.sor is not None
            report = reconcile(TENANT, sor=worker.sor, store=worker.store, registry=worker.registry)
        finally:
            stop(worker, thread)
    assert report.sor_entities == 3
    assert (report.missing, report.extra, report.stale) == ([], [], [])


@pytest.mark.integration
def test_changes_expired_under_a_running_worker_paused_by_an_outage_are_reconciled(
    mock_kafka: MockKafka,
    postgres: PostgresCluster,
    tmp_path: Path,
    caplog: pytest.LogCaptureFixture,
) -> None:
    """The embedder is down for longer than the topic's retention: the running worker keeps
    retrying the change it could not embed, retention deletes it and the next one, and the
    worker must notice (not jump), restart at the log start and reconcile, with repair even
    though scheduled repairs are off. librdkafka's mock cluster is the broker: the only one
    here with retention (see `MockKafka`)."""
    env = GapEnv(
        mock_kafka,
        postgres.dsn,
        tmp_path / "store",
        # the worker reads ahead during an outage: a budget of two records (ent-2, ent-3)
        # pauses its fetching, so that retention overtakes it
        read_ahead_records=2,
        reconcile=ReconcileSettings(interval_s=0, repair=False),
    )
    try:
        text = "The pump needs calibration every month."
        env.insert("ent-1", text)
        mock_kafka.produce(env.topic, [env.change("ent-1", text, 5000)])
        registry = CollectorRegistry()
        labels = {"topic": env.topic, "partition": "0"}
        with caplog.at_level(logging.INFO):
            worker, thread = env.start(registry)
            try:
                wait_committed(env.bootstrap, env.group, env.topic, {0: 0}, 60)
                env.embedder.fail_with = EmbeddingUnavailableError("embedder down (test)")
                later = [
                    ("ent-2", "Replace the filter after 500 hours of operation.", 5100),
                    ("ent-3", "The valve must be closed before maintenance.", 5200),
                ]
                for entity, body, lsn in later:
                    env.insert(entity, body)
                    mock_kafka.produce(env.topic, [env.change(entity, body, lsn)])
                deadline = time.monotonic() + 30
                while "embedder unavailable" not in caplog.text:
                    assert time.monotonic() < deadline, "the worker never hit the outage"
                    time.sleep(0.1)
                # ent-2 and ent-3 expire unread (the filler is dead-lettered: no envelope)
                filler = b"{%s}" % (b" " * 200_000)
                low, _high = mock_kafka.expire(env.topic, past=2, filler=filler)
                env.embedder.fail_with = None
                deadline = time.monotonic() + 60
                while not any(r.getMessage().startswith("reconcile acme:") for r in caplog.records):
                    assert time.monotonic() < deadline, "no reconcile after the offset gap"
                    time.sleep(0.2)
                assert registry.get_sample_value("ragstream_ingest_offset_gaps_total", labels) == 1
                # the worker held what fitted its budget of two (ent-2, and ent-3 unless ent-1
                # still held room) and applies it after the outage; the gap starts where its
                # fetch stood: at the first record it dropped for want of room (ent-3 or the
                # filler after it), or past what it held; reconcile repairs what it names
                held = [p for p in (2, 3, 4) if gap_logged(caplog.records, env.topic, p, low)]
                assert held, [r.getMessage() for r in caplog.records if r.levelno >= logging.ERROR]
                assert worker.sor is not None
                report = reconcile(
                    TENANT, sor=worker.sor, store=worker.store, registry=worker.registry
                )
            finally:
                stop(worker, thread)
    finally:
        env.close()
    assert report.sor_entities == 3
    assert (report.missing, report.extra, report.stale) == ([], [], [])
