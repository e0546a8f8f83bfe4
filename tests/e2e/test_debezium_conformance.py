"""Decoder conformance on real output: records captured here from Debezium 3.6.3's PostgreSQL
connector under different connector settings decode and plan without a single DLQ entry, and
their typed values come out as PostgreSQL holds them.

Each variant runs real Debezium (Kafka Connect standalone, the shipped connector configuration
plus the settings below) over a table with one column of each common PostgreSQL type, captures
its snapshot and change records (and, where switched on, heartbeats and transaction
boundaries) from the broker, and feeds every one of them through `decode_record` and
`plan_event` with the table's mapping.

| variant    | schemas | decimal.handling.mode | time.precision.mode        | extras              |
|------------|---------|-----------------------|----------------------------|---------------------|
| schemas    | on      | precise               | adaptive                   |                     |
| schemaless | off     | string                | adaptive_time_microseconds | heartbeats (200 ms) |
| connect    | on      | double                | connect                    | transaction topic   |

(schemas: JsonConverter `schemas.enable` for key and value; heartbeats:
`heartbeat.interval.ms=200`; transaction topic: `provide.transaction.metadata=true`.)
"""

from __future__ import annotations

import json
import uuid
from collections.abc import Iterator
from datetime import UTC, date, datetime
from decimal import Decimal
from pathlib import Path

import psycopg
import pytest

from ragcore.errors import RagstreamError
from ragcore.mapping import TableMapping, to_datetime
from ragcore.plan import Action, PlanConfig, plan_event
from ragdev.services.debezium import DebeziumConnect, PostgresSource
from ragdev.services.postgres import PostgresCluster
from ragdev.services.tansu import TansuBroker
from schemas.entities import ContentFormat
from schemas.events import RawRecord, RecordKind
from streams.decode import decode_record
from tests.e2e.test_real_cdc import wait_for_topics
from tests.streams.support import read_all

pytestmark = [pytest.mark.integration, pytest.mark.slow]

VARIANTS: dict[str, dict[str, str]] = {
    "schemas": {
        "key.converter.schemas.enable": "true",
        "value.converter.schemas.enable": "true",
        "decimal.handling.mode": "precise",
        "time.precision.mode": "adaptive",
    },
    "schemaless": {
        "key.converter.schemas.enable": "false",
        "value.converter.schemas.enable": "false",
        "decimal.handling.mode": "string",
        "time.precision.mode": "adaptive_time_microseconds",
        "heartbeat.interval.ms": "200",
    },
    "connect": {
        "key.converter.schemas.enable": "true",
        "value.converter.schemas.enable": "true",
        "decimal.handling.mode": "double",
        "time.precision.mode": "connect",
        "provide.transaction.metadata": "true",
    },
}
CREATED = datetime(2026, 11, 24, 10, 30, 15, 123456, tzinfo=UTC)
DDL = """
CREATE TYPE mood AS ENUM ('calm', 'busy');
CREATE TABLE kinds (
  id int PRIMARY KEY, tenant text NOT NULL, label text, amount numeric(10, 2), ratio numeric,
  price double precision, big bigint, flag boolean, created timestamptz, local_ts timestamp,
  day date, at_time time, payload jsonb, uid uuid, blob bytea, tags text[], state mood,
  updated_at timestamptz DEFAULT now(), deleted_at timestamptz);
"""
INSERT = (
    "INSERT INTO kinds (id, tenant, label, amount, ratio, price, big, flag, created, local_ts,"
    " day, at_time, payload, uid, blob, tags, state) VALUES (%s, 'acme', %s, 12.34, 10.1111,"
    " 2.5, 9007199254740993, true, %s, '2026-11-24 10:30:15.123456', '2026-01-02',"
    " '13:14:15.5', '{\"a\": [1, 2], \"b\": \"x\"}', 'a0eebc99-9c0b-4ef8-bb6d-6bb9bd380a11',"
    " '\\x0102ff', ARRAY['red', 'blue'], 'busy')"
)
KINDS = TableMapping(
    table="public.kinds",  # the schema is set per variant
    key_columns=("id",),
    tenant_column="tenant",
    type_column=None,
    title_column="label",
    content_columns=("label", "payload"),
    json_columns=("payload",),
    metadata_column=None,
    metadata_columns=("amount", "ratio", "price", "big", "flag", "created", "day", "uid", "state"),
    content_hash_column=None,
    created_at_column="created",
)


def _hash(text: str, fmt: ContentFormat) -> str:
    return f"{fmt}:{len(text)}"


@pytest.fixture(params=list(VARIANTS))
def capture(
    request: pytest.FixtureRequest,
    postgres: PostgresCluster,
    kafka_broker: TansuBroker,
    tmp_path: Path,
) -> Iterator[tuple[str, str, list[RawRecord]]]:
    variant: str = request.param
    schema = f"conf_{variant}_{uuid.uuid4().hex[:6]}"
    prefix = f"conf{uuid.uuid4().hex[:8]}"
    with psycopg.connect(postgres.dsn, autocommit=True) as conn:
        conn.execute(f'CREATE SCHEMA "{schema}"'.encode())
        conn.execute(f'SET search_path TO "{schema}"'.encode())
        conn.execute(DDL.encode())
        conn.execute(INSERT.encode(), (1, "snapshot row", CREATED))  # for the snapshot
    dbz = DebeziumConnect(
        bootstrap_servers=kafka_broker.bootstrap_servers,
        source=PostgresSource("127.0.0.1", postgres.port, "postgres", "postgres"),
        tables=[f"{schema}.kinds"],
        topic_prefix=prefix,
        name=prefix,
        work_dir=tmp_path / "connect",
        connector={"poll.interval.ms": "50", **VARIANTS[variant]},
    )
    dbz.start()
    try:
        topic = f"{prefix}.{schema}.kinds"
        wait_for_topics(kafka_broker.bootstrap_servers, [topic])
        with psycopg.connect(postgres.dsn, autocommit=True) as conn:
            conn.execute(f'SET search_path TO "{schema}"'.encode())
            conn.execute(INSERT.encode(), (2, "inserted row", CREATED))
            conn.execute("UPDATE kinds SET label = 'updated row', amount = 99.5 WHERE id = 2")
            conn.execute("UPDATE kinds SET deleted_at = now() WHERE id = 1")
            conn.execute("DELETE FROM kinds WHERE id = 1")
            conn.execute("TRUNCATE kinds")
        topics = [topic]
        if VARIANTS[variant].get("provide.transaction.metadata") == "true":
            topics.append(f"{prefix}.transaction")
        heartbeats = []
        if "heartbeat.interval.ms" in VARIANTS[variant]:
            heartbeats.append(f"__debezium-heartbeat.{prefix}")
        wait_for_topics(kafka_broker.bootstrap_servers, topics + heartbeats)
        # the change and transaction topics at once: one idle wait at the end, not one each
        messages = read_all(kafka_broker.bootstrap_servers, topics, timeout=15)
        for name in heartbeats:
            # a heartbeat topic never goes quiet (one every 200 ms), so its read lasts until
            # the timeout: a few seconds of heartbeats are as many kinds of record as fifteen
            messages += read_all(kafka_broker.bootstrap_servers, name, timeout=3)
        records = [
            RawRecord(
                msg.topic(),
                msg.partition(),
                msg.offset(),
                msg.key(),
                msg.value(),
                tuple((k, v) for k, v in (msg.headers() or [])),
            )
            for name in topics + heartbeats  # the change topic's records first
            for msg in messages
            if msg.topic() == name
        ]
        yield variant, schema, records
    finally:
        dbz.stop()
        with psycopg.connect(postgres.dsn, autocommit=True) as conn:
            conn.execute(f'DROP SCHEMA "{schema}" CASCADE'.encode())


def test_captured_records_decode_and_plan_without_a_dlq_entry(
    capture: tuple[str, str, list[RawRecord]],
) -> None:
    variant, schema, records = capture
    plan_config = PlanConfig(
        tables=(KINDS.model_copy(update={"table": f"{schema}.kinds"}),),
        topic_prefix=records[0].topic.split(".")[0],
    )
    plans = []
    for raw in records:
        try:
            event = decode_record(raw)
            plan = plan_event(event, plan_config, _hash)
        except RagstreamError as exc:  # a DLQ entry: the test fails naming the record
            pytest.fail(f"{variant}: {raw.topic}@{raw.offset} would go to the DLQ: {exc}")
        plans.append((event, plan))
    actions = [(p.action, p.reason) for e, p in plans if e.kind is RecordKind.CHANGE]
    assert actions == [
        (Action.UPSERT, "upsert"),  # snapshot row 1
        (Action.UPSERT, "upsert"),  # insert row 2
        (Action.UPSERT, "upsert"),  # update row 2
        (Action.DELETE, "soft_delete"),  # row 1
        (Action.DELETE, "delete"),  # row 1
    ], variant
    kinds = {e.kind for e, _ in plans}
    assert RecordKind.TRUNCATE in kinds and RecordKind.TOMBSTONE in kinds
    if "heartbeat.interval.ms" in VARIANTS[variant]:
        assert RecordKind.HEARTBEAT in kinds
    if VARIANTS[variant].get("provide.transaction.metadata") == "true":
        assert RecordKind.TRANSACTION in kinds
    for _event, plan in plans:
        if plan.action is Action.SKIP:
            assert plan.reason in {"tombstone", "heartbeat", "transaction"}, plan
    # typed values as PostgreSQL holds them
    snapshot = next(p.entity for _, p in plans if p.entity is not None)
    assert snapshot.entity_id == "kinds:1" and snapshot.tenant_id == "acme"
    meta = snapshot.metadata
    assert Decimal(str(meta["amount"])) == Decimal("12.34")
    assert Decimal(str(meta["ratio"])).quantize(Decimal("0.0001")) == Decimal("10.1111")
    assert meta["price"] == 2.5 and meta["flag"] is True
    assert meta["big"] == 9007199254740993  # beyond a double's precision, exact
    assert to_datetime(meta["created"], "created") == CREATED
    assert snapshot.created_at == CREATED
    assert meta["uid"] == "a0eebc99-9c0b-4ef8-bb6d-6bb9bd380a11"
    assert meta["state"] == "busy"
    day = meta["day"]
    # with a schema the date is a date; schemaless it is days since the epoch
    assert day == date(2026, 1, 2).isoformat() or day == (date(2026, 1, 2) - date(1970, 1, 1)).days
    assert "a: 1, 2" in snapshot.content and "b: x" in snapshot.content
    print(f"{variant}: {len(records)} records, kinds {sorted(k.value for k in kinds)}")
    assert json.dumps(meta)  # the metadata is JSON (it goes into payloads)
