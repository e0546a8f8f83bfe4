"""Capture the records real Debezium writes for a scripted change set, as test data.

    .venv/bin/python devtools/capture_debezium.py [OUT]

OUT defaults to tests/data/debezium/entities-changeset.jsonl. The script starts its own
PostgreSQL 15 cluster (logical decoding), tansu broker and Debezium 3.6.3 (Kafka Connect
standalone with the shipped connector configuration, JsonConverter schemas on, `ragdev.services`)
on loopback ports in temp dirs, runs the change set below and writes every record of the table's
topic (key, value, headers) as one JSON line. tests/streams/decode/test_debezium_real.py reads
the file; rerun this script when the connector version or configuration changes.

The change set: inserts (one with a 24 kB body that PostgreSQL stores out of line), a title-only
update under REPLICA IDENTITY FULL, another under DEFAULT (the body arrives as
`__debezium_unavailable_value`), a soft delete, a delete + tombstone, a primary-key change (d with
`__debezium.newkey`, tombstone, c with `__debezium.oldkey`), a TRUNCATE, an insert.
"""

from __future__ import annotations

import json
import random
import sys
import time
from pathlib import Path
from typing import Any, cast

import psycopg
from confluent_kafka import Consumer
from confluent_kafka.admin import AdminClient

from ragdev.services.debezium import DebeziumConnect, PostgresSource
from ragdev.services.postgres import PostgresCluster
from ragdev.services.tansu import TansuBroker

REPO_ROOT = Path(__file__).resolve().parents[1]
DEFAULT_OUT = REPO_ROOT / "tests" / "data" / "debezium" / "entities-changeset.jsonl"
TABLE_SQL = """
CREATE TABLE public.entities (
  id text PRIMARY KEY, tenant_id text, title text, body text,
  updated_at timestamptz, deleted_at timestamptz);
ALTER TABLE public.entities REPLICA IDENTITY FULL;
"""
#: 24,000 hex characters from a fixed seed: pglz cannot shrink them, so the body is TOASTed.
BIG_BODY = random.Random(24).randbytes(12_000).hex()
CHANGES: list[tuple[str, tuple[Any, ...]]] = [
    ("INSERT INTO entities VALUES ('e1','t1','first','small body', now(), NULL)", ()),
    ("INSERT INTO entities VALUES ('e2','t1','second',%s, now(), NULL)", (BIG_BODY,)),
    ("INSERT INTO entities VALUES ('e3','t2','third','body three', now(), NULL)", ()),
    ("UPDATE entities SET title='second v2', updated_at=now() WHERE id='e2'", ()),
    ("ALTER TABLE entities REPLICA IDENTITY DEFAULT", ()),
    ("UPDATE entities SET title='second v3', updated_at=now() WHERE id='e2'", ()),
    ("ALTER TABLE entities REPLICA IDENTITY FULL", ()),
    ("UPDATE entities SET deleted_at=now(), updated_at=now() WHERE id='e1'", ()),
    ("DELETE FROM entities WHERE id='e1'", ()),
    ("UPDATE entities SET id='e3b', updated_at=now() WHERE id='e3'", ()),
    ("TRUNCATE entities", ()),
    ("INSERT INTO entities VALUES ('e4','t1','fourth','after truncate', now(), NULL)", ()),
]
#: Records the change set produces (13: the pk change is d + tombstone + c, a delete adds a
#: tombstone, the ALTERs produce none).
EXPECTED_RECORDS = 13


def _json(data: bytes | None) -> Any:
    return None if data is None else json.loads(data)


def _wait_for_topic(bootstrap: str, topic: str, timeout: float = 120.0) -> None:
    admin = AdminClient({"bootstrap.servers": bootstrap})
    deadline = time.monotonic() + timeout
    while topic not in admin.list_topics(timeout=5).topics:
        if time.monotonic() > deadline:
            raise TimeoutError(f"Debezium did not create {topic} in {timeout}s")
        time.sleep(0.5)


def _read(bootstrap: str, topic: str, count: int, timeout: float = 120.0) -> list[dict[str, Any]]:
    consumer = Consumer(
        {
            "bootstrap.servers": bootstrap,
            "group.id": "capture",
            "auto.offset.reset": "earliest",
            "enable.auto.commit": False,
            "session.timeout.ms": 6000,
            "heartbeat.interval.ms": 1000,
        }
    )
    out: list[dict[str, Any]] = []
    try:
        consumer.subscribe([topic])
        deadline = time.monotonic() + timeout
        while len(out) < count:
            if time.monotonic() > deadline:
                raise TimeoutError(f"{len(out)} of {count} records on {topic} in {timeout}s")
            msg = consumer.poll(0.2)
            if msg is None or msg.error() is not None:
                continue
            pairs = cast(list[tuple[str, bytes | None]], msg.headers() or [])
            headers = {k: None if v is None else v.decode() for k, v in pairs}
            out.append(
                {
                    "topic": msg.topic(),
                    "partition": msg.partition(),
                    "offset": msg.offset(),
                    "timestamp": msg.timestamp()[1],
                    "key": _json(msg.key()),
                    "value": _json(msg.value()),
                    "headers": headers,
                }
            )
    finally:
        consumer.close()
    return out


def capture(out: Path) -> int:
    """Run the change set through real Debezium and write its records to `out`; their count."""
    with PostgresCluster(logical=True) as postgres, TansuBroker() as broker:
        with psycopg.connect(postgres.dsn, autocommit=True) as conn:
            conn.execute(TABLE_SQL.encode())
        dbz = DebeziumConnect(
            bootstrap_servers=broker.bootstrap_servers,
            source=PostgresSource("127.0.0.1", postgres.port, "postgres", "postgres"),
            tables=["public.entities"],
            topic_prefix="sor",
            name="capture",
            schemas=True,
            connector={"poll.interval.ms": "50"},
        )
        with dbz:
            topic = dbz.topics()[0]
            with psycopg.connect(postgres.dsn, autocommit=True) as conn:
                for statement, args in CHANGES:
                    conn.execute(statement.encode(), args or None)
            _wait_for_topic(broker.bootstrap_servers, topic)
            records = _read(broker.bootstrap_servers, topic, EXPECTED_RECORDS)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text("".join(json.dumps(r, sort_keys=True) + "\n" for r in records))
    return len(records)


if __name__ == "__main__":
    target = Path(sys.argv[1]) if len(sys.argv) > 1 else DEFAULT_OUT
    print(f"{capture(target)} records -> {target}")
