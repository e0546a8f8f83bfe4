"""The connector discover writes for the mapped tables (Kafka Connect JSON and Debezium Server
properties, read back alike), and every disagreement check finds between a connector, the
mappings and the broker's topics."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from ragcore.documents.source import DocumentSource
from ragcore.mapping import TableMapping
from ragcore.sor.mapcheck import Problem, Severity
from ragcore.sor.pgcatalog import ColumnKind
from ragstream.connector import (
    ConnectorTarget,
    LoadedConnector,
    check_connector,
    check_topics,
    debezium_server_properties,
    kafka_connect_config,
    load_connector,
    routing_partitions,
    shipped_config,
)
from tests.ragcore.sor.catalogs import col, database, table

pytestmark = pytest.mark.unit

TICKETS = TableMapping(
    table="support.tickets",
    key_columns=("org_id", "ticket_no"),
    tenant_column="org_id",
    type_column=None,
    title_column="subject",
    content_columns=("subject", "body"),
    metadata_column=None,
    content_hash_column=None,
    created_at_column=None,
    updated_at_column="modified_at",
    deleted_at_column=None,
)
FILES = TableMapping(
    table="docs.files",
    tenant_column="workspace",
    type_column=None,
    title_column=None,
    metadata_column=None,
    content_hash_column=None,
    created_at_column=None,
    updated_at_column=None,
    deleted_at_column=None,
    document=DocumentSource(column="file"),
)
TARGET = ConnectorTarget(
    name="shop",
    topic_prefix="shop",
    publication="ragstream",
    slot="ragstream_shop",
    database={"host": "db.internal", "port": "5432", "dbname": "shop", "user": "cdc"},
)


def loaded(config: dict[str, str]) -> LoadedConnector:
    return LoadedConnector(Path("connector.json"), config)


def codes(found: list[Problem]) -> dict[str, Severity]:
    return {p.code: p.severity for p in found}


def check(config: dict[str, str], *mappings: TableMapping, **kwargs: object) -> list[Problem]:
    return check_connector(
        loaded(config),
        list(mappings) or [TICKETS, FILES],
        topic_prefix="shop",
        heartbeat_prefix="__debezium-heartbeat",
        **kwargs,  # type: ignore[arg-type]
    )


def test_the_connector_is_the_shipped_one_with_the_tables_and_the_database() -> None:
    config = kafka_connect_config([TICKETS, FILES], TARGET)
    shipped = shipped_config()
    for key in ("skipped.operations", "heartbeat.interval.ms", "value.converter.schemas.enable"):
        assert config[key] == shipped[key]
    assert config["table.include.list"] == "support.tickets,docs.files"
    assert (config["topic.prefix"], config["slot.name"], config["publication.name"]) == (
        "shop",
        "ragstream_shop",
        "ragstream",
    )
    assert config["database.hostname"] == "db.internal"
    # Debezium's own role (REPLICATION) and password: never in the file
    assert config["database.user"].startswith("${file:")
    assert config["database.password"].startswith("${file:")
    assert "transforms" not in config
    assert check(config) == []  # the written connector agrees with the mappings


def test_several_partitions_route_each_table_by_its_own_tenant_column() -> None:
    config = kafka_connect_config(
        [TICKETS, FILES], ConnectorTarget(topic_prefix="shop", partitions=4)
    )
    assert config["topic.creation.default.partitions"] == "4"
    assert config["transforms"] == "routeByTenant0,routeByTenant1"
    assert routing_partitions(config, "shop.support.tickets") == (4, "change.org_id")
    assert routing_partitions(config, "shop.docs.files") == (4, "change.workspace")
    assert routing_partitions(config, "shop.support.ticketsX") is None
    assert check(config) == []


def test_debezium_server_properties_read_back_as_the_same_connector(tmp_path: Path) -> None:
    config = kafka_connect_config([TICKETS], ConnectorTarget(topic_prefix="shop", partitions=2))
    text = debezium_server_properties(config, "kafka:9092")
    assert "debezium.sink.kafka.producer.bootstrap.servers=kafka:9092" in text
    assert "database.password" not in text
    assert "database.user" not in text
    path = tmp_path / "application.properties"
    path.write_text(text)
    back = load_connector(path)
    expected = {
        k: v
        for k, v in config.items()
        if not k.startswith(
            ("name", "tasks.max", "key.converter", "value.converter", "topic.creation.")
        )
        and k not in ("database.user", "database.password")
    }
    # Debezium Server's own offset store is a source property too
    offsets = {
        "offset.storage.file.filename": "data/offsets.dat",
        "offset.flush.interval.ms": "1000",
    }
    assert dict(back.config) == {**expected, **offsets}
    pattern = back.config["predicates.routedTopics.pattern"]
    assert re.fullmatch(pattern, "shop.support.tickets")  # the regex's backslashes survive
    assert back.server is not None and back.server["format.value.schemas.enable"] == "false"
    assert (
        check_connector(
            back, [TICKETS], topic_prefix="shop", heartbeat_prefix="__debezium-heartbeat"
        )
        == []
    )


def test_kafka_connect_json_is_read_flat_or_as_posted(tmp_path: Path) -> None:
    config = kafka_connect_config([TICKETS], TARGET)
    flat, posted = tmp_path / "flat.json", tmp_path / "posted.json"
    flat.write_text(json.dumps(config))
    posted.write_text(json.dumps({"name": "shop", "config": config}))
    assert load_connector(flat).config == load_connector(posted).config == config


def test_a_mysql_connector_is_not_supported_yet_and_says_why() -> None:
    found = check({"connector.class": "io.debezium.connector.mysql.MySqlConnector"})
    assert codes(found) == {"CONNECTOR_UNSUPPORTED": Severity.ERROR}
    assert "LSN" in found[0].message


def test_every_disagreement_of_a_connector_is_named_with_its_fix() -> None:
    base = kafka_connect_config([TICKETS, FILES], TARGET)
    cases: dict[str, tuple[dict[str, str], str, Severity]] = {
        "other prefix": ({"topic.prefix": "sor"}, "TOPIC_PREFIX", Severity.ERROR),
        "table left out": (
            {"table.include.list": "support.tickets"},
            "NOT_CAPTURED",
            Severity.ERROR,
        ),
        "column left out": (
            {"column.exclude.list": "support\\.tickets\\.body"},
            "COLUMN_NOT_CAPTURED",
            Severity.ERROR,
        ),
        "deletes skipped": ({"skipped.operations": "d"}, "SKIPPED_OPERATIONS", Severity.ERROR),
        "truncate skipped": ({"skipped.operations": "t"}, "SKIPPED_OPERATIONS", Severity.WARNING),
        "no heartbeats": ({"heartbeat.interval.ms": "0"}, "HEARTBEATS", Severity.WARNING),
        "other heartbeat topic": (
            {"topic.heartbeat.prefix": "hb"},
            "HEARTBEATS",
            Severity.WARNING,
        ),
        "avro": (
            {"value.converter": "io.confluent.connect.avro.AvroConverter"},
            "CONVERTER",
            Severity.ERROR,
        ),
        "hex bytes": ({"binary.handling.mode": "hex"}, "BINARY_HANDLING", Severity.ERROR),
        "no snapshot": ({"snapshot.mode": "no_data"}, "SNAPSHOT_MODE", Severity.NOTE),
        "decoderbufs": ({"plugin.name": "decoderbufs"}, "PLUGIN", Severity.NOTE),
    }
    for name, (change, code, severity) in cases.items():
        found = check({**base, **change})
        assert codes(found) == {code: severity}, (name, [p.line() for p in found])
        assert all(p.fix for p in found)
    without = {k: v for k, v in base.items() if k != "skipped.operations"}
    assert codes(check(without)) == {"SKIPPED_OPERATIONS": Severity.WARNING}  # Debezium: t


def test_schemaless_numbers_and_times_must_arrive_in_forms_the_worker_reads() -> None:
    db = database(
        table(
            "support.tickets",
            [
                col("org_id", ColumnKind.TEXT),
                col("ticket_no", ColumnKind.NUMERIC),
                col("subject", ColumnKind.TEXT),
                col("body", ColumnKind.TEXT),
                col("modified_at", ColumnKind.TIMESTAMP),
            ],
            pk=("org_id", "ticket_no"),
        )
    )
    base = kafka_connect_config([TICKETS], TARGET)
    precise = {**base, "decimal.handling.mode": "precise"}
    assert codes(check(precise, TICKETS, db=db)) == {"DECIMAL_HANDLING": Severity.WARNING}
    connect = {**base, "time.precision.mode": "connect"}
    assert codes(check(connect, TICKETS, db=db)) == {"TIME_PRECISION": Severity.ERROR}
    with_schemas = {**connect, "value.converter.schemas.enable": "true"}
    assert check(with_schemas, TICKETS, db=db) == []


def test_routing_by_another_field_than_the_tenant_is_a_warning() -> None:
    config = kafka_connect_config([TICKETS], ConnectorTarget(topic_prefix="shop", partitions=3))
    config["transforms.routeByTenant.partition.payload.fields"] = "change.status"
    found = check(config, TICKETS)
    assert codes(found) == {"ROUTING_FIELD": Severity.WARNING}
    assert found[0].fix == "route by change.org_id"


def test_debezium_server_must_write_json_to_kafka(tmp_path: Path) -> None:
    text = debezium_server_properties(kafka_connect_config([TICKETS], TARGET), "k:9092")
    path = tmp_path / "application.properties"
    path.write_text(text.replace("debezium.sink.type=kafka", "debezium.sink.type=pulsar"))
    found = check_connector(
        load_connector(path),
        [TICKETS],
        topic_prefix="shop",
        heartbeat_prefix="__debezium-heartbeat",
    )
    assert codes(found) == {"SINK": Severity.ERROR}


def test_topics_exist_with_the_expected_partitions_and_the_dlq_exists() -> None:
    topics = {"shop.support.tickets": 1, "shop.docs.files": 3, "ragstream.dlq": 1}
    found = check_topics(
        topics,
        [TICKETS, FILES],
        topic_prefix="shop",
        required=("ragstream.dlq", "ragstream.reindex"),
        connector=None,
        expected_partitions=None,
    )
    by_field = {p.field: p for p in found}
    assert set(by_field) == {"shop.docs.files", "ragstream.reindex"}
    assert by_field["shop.docs.files"].code == "TOPIC_PARTITIONS"
    assert "3 partition(s), 1 expected" in by_field["shop.docs.files"].message
    assert by_field["ragstream.reindex"].code == "TOPIC_MISSING"
    routed = kafka_connect_config(
        [TICKETS, FILES], ConnectorTarget(topic_prefix="shop", partitions=3)
    )
    found = check_topics(
        topics,
        [TICKETS, FILES],
        topic_prefix="shop",
        required=(),
        connector=routed,
        expected_partitions=None,
    )
    assert [(p.field, p.code) for p in found] == [("shop.support.tickets", "TOPIC_PARTITIONS")]
    missing = check_topics(
        {}, [TICKETS], topic_prefix="shop", required=(), connector=None, expected_partitions=2
    )
    assert missing[0].code == "TOPIC_MISSING"
    assert "--partitions 2" in missing[0].fix
