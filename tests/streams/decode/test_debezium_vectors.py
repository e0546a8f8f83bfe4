"""Conformance: every valid Debezium event under shared/vectors/debezium, decoded field by field.

Those files are third-party copies kept beside the checkout, not in it: the tests that read them
are marked `external` and skip with the reason when they are absent. What our own real-Debezium
runs can produce (snapshot and change events, TOAST placeholders, deletes and tombstones, key
changes, truncates, decimals and timestamps as the connector encodes them) is covered by our own
captures too (tests/streams/decode/test_debezium_real.py, tests/e2e/test_debezium_conformance.py).

Expected values come from the vectors' README (and, for the doc-excerpt shapes and the Java
excerpt, from Debezium's documented/expected values), never from running the decoder.
"""

from __future__ import annotations

import base64
import json
from datetime import UTC, datetime
from decimal import Decimal
from typing import Any

import pytest

from ragcore.errors import (
    ConfigError,
    DecodeError,
    LogicalTypeError,
    RecordTooLargeError,
    UnsupportedOperationError,
)
from schemas.events import (
    TOAST_PLACEHOLDER,
    ChangeEvent,
    Op,
    RawRecord,
    RecordKind,
    RecordPosition,
    SnapshotMarker,
    SourceInfo,
)
from streams.decode import (
    NEGATIVE_INFINITY,
    POSITIVE_INFINITY,
    ColumnType,
    DecodeOptions,
    LogicalType,
    RecordTooLargeDecodeError,
    decode_record,
)
from tests.conftest import require_vectors

TOPIC = "fullfillment.inventory.products"


def _record(
    value: bytes | None,
    key: bytes | None = None,
    *,
    topic: str = TOPIC,
    offset: int = 0,
    headers: tuple[tuple[str, bytes | None], ...] = (),
) -> RawRecord:
    return RawRecord(topic=topic, partition=0, offset=offset, key=key, value=value, headers=headers)


def _read(relative: str) -> bytes:
    """A third-party vector (the tests that read one are marked `external`)."""
    return (require_vectors() / "debezium" / relative).read_bytes()


def _lines(relative: str) -> list[bytes]:
    return [line for line in _read(relative).splitlines() if line.strip()]


def _json(obj: Any) -> bytes:
    return json.dumps(obj).encode()


# --- flink-json: the PostgreSQL connector's inventory.products stream ---------------------------

_PRODUCTS_SOURCE = {
    "connector": "postgresql",
    "name": "fullfillment",
    "db": "postgres",
    "schema": "inventory",
    "table": "products",
}


def _product(pid: int, name: str, description: str, weight: float) -> dict[str, Any]:
    return {"id": pid, "name": name, "description": description, "weight": weight}


_SNAPSHOT_ROWS = [
    (_product(101, "scooter", "Small 2-wheel scooter", 3.14), 1596001099434, 1596001099434),
    (_product(102, "car battery", "12V car battery", 8.1), 1596001099435, 1596001099435),
    (
        _product(
            103,
            "12-pack drill bits",
            "12-pack of drill bits with sizes ranging from #40 to #3",
            0.8,
        ),
        1596001099435,
        1596001099435,
    ),
    (_product(104, "hammer", "12oz carpenter's hammer", 0.75), 1596001099436, 1596001099436),
    (_product(105, "hammer", "14oz carpenter's hammer", 0.875), 1596001099436, 1596001099436),
    (_product(106, "hammer", "16oz carpenter's hammer", 1.0), 1596001099436, 1596001099436),
    (_product(107, "rocks", "box of assorted rocks", 5.3), 1596001099437, 1596001099437),
    (
        _product(108, "jacket", "water resistent black wind breaker", 0.1),
        1596001099437,
        1596001099437,
    ),
    (_product(109, "spare tire", "24 inch spare tire", 22.2), 1596001099437, 1596001099438),
]

# (op, before, after, source ts_ms, ts_ms, txId, lsn) of lines 10-16 of schema-exclude.
_STREAM_ROWS: list[tuple[Op, dict[str, Any] | None, dict[str, Any] | None, int, int, int, int]] = [
    (
        Op.UPDATE,
        _product(106, "hammer", "16oz carpenter's hammer", 1.0),
        _product(106, "hammer", "18oz carpenter hammer", 1.0),
        1596010889629,
        1596010890411,
        602,
        34131104,
    ),
    (
        Op.UPDATE,
        _product(107, "rocks", "box of assorted rocks", 5.3),
        _product(107, "rocks", "box of assorted rocks", 5.1),
        1596010930407,
        1596010930623,
        603,
        34132200,
    ),
    (
        Op.CREATE,
        None,
        _product(110, "jacket", "water resistent white wind breaker", 0.2),
        1596010946488,
        1596010946870,
        604,
        34132560,
    ),
    (
        Op.CREATE,
        None,
        _product(111, "scooter", "Big 2-wheel scooter ", 5.18),
        1596010976756,
        1596010976880,
        605,
        34133072,
    ),
    (
        Op.UPDATE,
        _product(110, "jacket", "water resistent white wind breaker", 0.2),
        _product(110, "jacket", "new water resistent white wind breaker", 0.5),
        1596010982228,
        1596010982481,
        606,
        34133344,
    ),
    (
        Op.UPDATE,
        _product(111, "scooter", "Big 2-wheel scooter ", 5.18),
        _product(111, "scooter", "Big 2-wheel scooter ", 5.17),
        1596010985627,
        1596010986047,
        607,
        34133584,
    ),
    (
        Op.DELETE,
        _product(111, "scooter", "Big 2-wheel scooter ", 5.17),
        None,
        1596010988168,
        1596010988596,
        608,
        34133800,
    ),
]


def _expected_product_events(
    replica_identity: bool,
) -> list[tuple[Op, dict[str, Any] | None, dict[str, Any] | None, SourceInfo, int]]:
    expected: list[tuple[Op, dict[str, Any] | None, dict[str, Any] | None, SourceInfo, int]] = []
    for row, source_ts, ts in _SNAPSHOT_ROWS:
        source = SourceInfo(
            **_PRODUCTS_SOURCE,
            ts_ms=source_ts,
            snapshot=SnapshotMarker.TRUE,
            lsn=34078720,
            tx_id=601,
        )
        expected.append((Op.READ, None, row, source, ts))
    for op, before, after, source_ts, ts, tx_id, lsn in _STREAM_ROWS:
        source = SourceInfo(
            **_PRODUCTS_SOURCE,
            ts_ms=source_ts,
            snapshot=SnapshotMarker.FALSE,
            lsn=lsn,
            tx_id=tx_id,
        )
        # REPLICA IDENTITY DEFAULT/NOTHING without a primary key: no before image at all.
        expected.append((op, None if replica_identity else before, after, source, ts))
    return expected


@pytest.mark.external
@pytest.mark.parametrize(
    ("vector", "replica_identity"),
    [
        ("flink-json/debezium-postgres-data-schema-exclude.txt", False),
        ("flink-json/debezium-postgres-data-replica-identity.txt", True),
    ],
)
def test_flink_products_stream_decodes_every_line_field_by_field(
    vector: str, replica_identity: bool
) -> None:
    lines = _lines(vector)
    expected = _expected_product_events(replica_identity)
    assert len(lines) == len(expected) == 16
    for offset, (line, (op, before, after, source, ts_ms)) in enumerate(
        zip(lines, expected, strict=True)
    ):
        event = decode_record(_record(line, offset=offset))
        assert event.kind is RecordKind.CHANGE
        assert event.position == RecordPosition(TOPIC, 0, offset)
        assert event.op is op
        assert event.before == before
        assert event.after == after
        assert event.source == source
        assert event.ts_ms == ts_ms
        assert event.key is None
        assert event.unavailable_columns == frozenset()
        assert event.old_key is None and event.new_key is None
        assert event.is_snapshot is (op is Op.READ)


@pytest.mark.external
def test_snapshot_string_true_is_snapshot_marker_true() -> None:
    event = decode_record(
        _record(_lines("flink-json/debezium-postgres-data-schema-exclude.txt")[0])
    )
    assert event.source is not None
    assert event.source.snapshot is SnapshotMarker.TRUE


@pytest.mark.external
def test_replica_identity_delete_with_null_before_and_after_takes_its_id_from_the_key() -> None:
    line = _lines("flink-json/debezium-postgres-data-replica-identity.txt")[-1]
    key = _json(
        {
            "schema": {
                "type": "struct",
                "fields": [{"type": "int32", "optional": False, "field": "id"}],
                "optional": False,
                "name": "fullfillment.inventory.products.Key",
            },
            "payload": {"id": 111},
        }
    )
    event = decode_record(_record(line, key))
    assert event.kind is RecordKind.CHANGE
    assert event.op is Op.DELETE
    assert event.before is None
    assert event.after is None
    assert event.key == {"id": 111}


@pytest.mark.external
def test_schema_include_line_decodes_like_its_schemaless_twin() -> None:
    with_schema = decode_record(
        _record(_read("flink-json/debezium-postgres-data-schema-include.line1.json"))
    )
    schemaless = decode_record(
        _record(_lines("flink-json/debezium-postgres-data-schema-exclude.txt")[0])
    )
    assert with_schema == schemaless
    assert with_schema.op is Op.READ
    assert with_schema.after == _product(101, "scooter", "Small 2-wheel scooter", 3.14)
    assert with_schema.source == SourceInfo(
        **_PRODUCTS_SOURCE,
        ts_ms=1596001099434,
        snapshot=SnapshotMarker.TRUE,
        lsn=34078720,
        tx_id=601,
    )
    assert with_schema.ts_ms == 1596001099434


# --- floodplain: dvdrental snapshot, Decimal bytes, composite-key delete ------------------------


@pytest.mark.external
def test_floodplain_film_snapshot_decodes_decimals_enum_timestamp_and_array() -> None:
    event = decode_record(
        _record(
            _read("floodplain/film-snapshot-r.value.json"),
            _read("floodplain/film-snapshot-r.key.json"),
            topic="instance-mypostgres.public.film",
        )
    )
    assert event.kind is RecordKind.CHANGE
    assert event.op is Op.READ
    # The key and the value come from different rows in the source (see the README).
    assert event.key == {"film_id": 965}
    assert event.before is None
    assert event.after == {
        "film_id": 778,
        "title": "Secrets Paradise",
        "description": (
            "A Fateful Saga of a Cat And a Frisbee who must Kill a Girl in A Manhattan Penthouse"
        ),
        "release_year": 2006,
        "language_id": 1,
        "rental_duration": 3,
        "rental_rate": Decimal("4.99"),
        "length": 109,
        "replacement_cost": Decimal("24.99"),
        "rating": "G",
        "last_update": datetime(2013, 5, 26, 14, 50, 58, 951000, tzinfo=UTC),
        "special_features": ["Trailers", "Commentaries"],
    }
    assert event.after is not None
    assert isinstance(event.after["rental_rate"], Decimal)
    assert event.after["rental_rate"].as_tuple().exponent == -2
    assert event.source == SourceInfo(
        connector="postgresql",
        name="instance-mypostgres",
        db="dvdrental",
        schema="public",
        table="film",
        ts_ms=1594564042739,
        snapshot=SnapshotMarker.TRUE,
        lsn=30998528,
        tx_id=751,
    )
    assert event.ts_ms == 1594564042739
    assert event.unavailable_columns == frozenset()


@pytest.mark.external
def test_floodplain_payment_decimal_and_last_snapshot_marker() -> None:
    event = decode_record(
        _record(_read("floodplain/decimalwithscale.json"), topic="Generic-test-dvd.public.payment")
    )
    assert event.op is Op.READ
    assert event.after == {
        "payment_id": 32098,
        "customer_id": 264,
        "staff_id": 2,
        "rental_id": 14243,
        "amount": Decimal("2.99"),
        "payment_date": datetime(2007, 5, 14, 13, 44, 29, 996577, tzinfo=UTC),
    }
    assert event.before is None
    assert event.source == SourceInfo(
        connector="postgresql",
        name="Generic-test-dvd",
        db="dvdrental",
        schema="public",
        table="payment",
        ts_ms=1582920002719,
        snapshot=SnapshotMarker.LAST,
        lsn=31227904,
        tx_id=765,
    )
    assert event.ts_ms == 1582920002719
    assert event.is_snapshot


@pytest.mark.external
def test_floodplain_composite_key_delete_keeps_both_key_columns() -> None:
    key = _json(
        {
            "schema": {
                "type": "struct",
                "fields": [
                    {"type": "int16", "optional": False, "field": "actor_id"},
                    {"type": "int16", "optional": False, "field": "film_id"},
                ],
                "optional": False,
                "name": "instance_mypostgres.public.film_actor.Key",
            },
            "payload": {"actor_id": 1, "film_id": 23},
        }
    )
    event = decode_record(
        _record(_read("floodplain/delete_film_actor.json"), key, topic="i.public.film_actor")
    )
    assert event.kind is RecordKind.CHANGE
    assert event.op is Op.DELETE
    assert event.key == {"actor_id": 1, "film_id": 23}
    assert event.before == {
        "actor_id": 1,
        "film_id": 23,
        "last_update": datetime(1970, 1, 1, tzinfo=UTC),
    }
    assert event.after is None
    assert event.source == SourceInfo(
        connector="postgresql",
        name="instance-mypostgres",
        db="dvdrental",
        schema="public",
        table="film_actor",
        ts_ms=1595113586918,
        snapshot=SnapshotMarker.FALSE,
        lsn=31246736,
        tx_id=767,
    )
    assert event.ts_ms == 1595113586976


# --- toast: an unchanged TOASTed column ---------------------------------------------------------


def _toast_event(options: DecodeOptions | None = None) -> ChangeEvent:
    return decode_record(
        _record(
            _read("toast/authors-update-toast.value.json"),
            _read("toast/authors-update-toast.key.json"),
            topic="dbserver2.inventory.authors",
        ),
        options,
    )


@pytest.mark.external
def test_toast_placeholder_column_is_absent_from_after_and_listed_unavailable() -> None:
    event = _toast_event()
    assert event.op is Op.UPDATE
    assert event.key == {"id": 1001}
    assert event.before is None
    assert event.after == {
        "id": 1001,
        "first_name": "Tom",
        "last_name": "Wolfe",
        "dob": -1257206400000000,  # schemaless and no hint: the int as written
    }
    assert event.unavailable_columns == frozenset({"biography"})
    assert TOAST_PLACEHOLDER not in event.after.values()
    assert event.source == SourceInfo(
        connector="postgresql",
        name="dbserver2",
        db="postgres",
        schema="inventory",
        table="authors",
        ts_ms=1746440315942,
        snapshot=SnapshotMarker.FALSE,
        lsn=34415840,
        tx_id=777,
        sequence='[null,"34415840"]',
    )
    assert event.ts_ms == 1746440316214  # ts_us / ts_ns are ignored


@pytest.mark.external
@pytest.mark.parametrize("hint_key", ["dob", "authors.dob", "inventory.authors.dob"])
def test_toast_negative_epoch_dob_with_micro_timestamp_hint_is_1930(hint_key: str) -> None:
    options = DecodeOptions(column_types={hint_key: ColumnType(LogicalType.MICRO_TIMESTAMP)})
    event = _toast_event(options)
    assert event.after is not None
    assert event.after["dob"] == datetime(1930, 3, 1, tzinfo=UTC)


@pytest.mark.external
def test_column_hint_for_another_table_does_not_apply() -> None:
    options = DecodeOptions(column_types={"books.dob": ColumnType(LogicalType.MICRO_TIMESTAMP)})
    event = _toast_event(options)
    assert event.after is not None
    assert event.after["dob"] == -1257206400000000


# --- debezium-core-serde: envelope parsing (MySQL source block) --------------------------------

_CUSTOMER_AFTER = {
    "id": 1004,
    "first_name": "Anne",
    "last_name": "Kretchmar",
    "email": "annek@noanswer.org",
}
_CUSTOMER_BEFORE = {**_CUSTOMER_AFTER, "first_name": "Anne-Marie"}
_MYSQL_SOURCE = SourceInfo(
    connector="mysql",
    name="mysql-server-1",
    db="inventory",
    table="customers",
    ts_ms=0,
    snapshot=SnapshotMarker.FALSE,  # a boolean false in these fixtures
)


@pytest.mark.external
@pytest.mark.parametrize("vector", ["serde-with-schema.json", "serde-without-schema.json"])
def test_serde_create_decodes_with_and_without_schema(vector: str) -> None:
    event = decode_record(_record(_read(f"debezium-core-serde/{vector}")))
    assert event.kind is RecordKind.CHANGE
    assert event.op is Op.CREATE
    assert event.before is None
    assert event.after == _CUSTOMER_AFTER
    assert event.source == _MYSQL_SOURCE
    assert event.ts_ms == 1465491411815


@pytest.mark.external
def test_serde_update_has_before_and_after() -> None:
    event = decode_record(_record(_read("debezium-core-serde/serde-update.json")))
    assert event.op is Op.UPDATE
    assert event.before == _CUSTOMER_BEFORE
    assert event.after == _CUSTOMER_AFTER
    assert event.source == _MYSQL_SOURCE
    assert event.ts_ms == 1465491411815


@pytest.mark.external
def test_serde_unknown_property_is_ignored_and_rows_keep_their_columns() -> None:
    event = decode_record(_record(_read("debezium-core-serde/serde-unknown-property.json")))
    assert event.op is Op.UPDATE
    # Rows are plain column maps: the extra column stays, nothing fails.
    assert event.before == {**_CUSTOMER_BEFORE, "middle_name": "L"}
    assert event.after == {**_CUSTOMER_AFTER, "middle_name": "L"}
    # MySQL-only source fields (server_id, file, pos, row, thread, query) are ignored.
    assert event.source == _MYSQL_SOURCE
    assert event.ts_ms == 1465491411815


@pytest.mark.external
def test_serde_unwrapped_row_decodes_as_an_upsert_with_envelope_unwrapped() -> None:
    event = decode_record(
        _record(_read("debezium-core-serde/serde-unwrapped.json")),
        DecodeOptions(envelope="unwrapped"),
    )
    assert event.kind is RecordKind.CHANGE
    assert event.op is Op.UPDATE
    assert event.before is None
    assert event.after == _CUSTOMER_AFTER
    assert event.source is None
    assert event.ts_ms is None


@pytest.mark.external
def test_serde_unwrapped_row_in_debezium_mode_is_refused_with_what_was_found() -> None:
    with pytest.raises(DecodeError, match=r"no 'op' and no 'before'/'after'.*'first_name'"):
        decode_record(_record(_read("debezium-core-serde/serde-unwrapped.json")))


# --- docs: the documented create event (snapshot as a boolean) ----------------------------------


@pytest.mark.external
def test_docs_create_event_with_boolean_snapshot_true() -> None:
    event = decode_record(
        _record(
            _read("docs/create-event.with-schema.docs.json"), topic="PostgreSQL_server.public.c"
        )
    )
    assert event.kind is RecordKind.CHANGE
    assert event.op is Op.CREATE
    assert event.before is None
    assert event.after == {
        "id": 1,
        "first_name": "Anne",
        "last_name": "Kretchmar",
        "email": "annek@noanswer.org",
    }
    assert event.source == SourceInfo(
        connector="postgresql",
        name="PostgreSQL_server",
        db="postgres",
        schema="public",
        table="customers",
        ts_ms=1559033904863,
        snapshot=SnapshotMarker.TRUE,
        lsn=24023128,
        tx_id=555,
        sequence='["24023119","24023128"]',
    )
    assert event.ts_ms == 1559033904863


# --- shapes from postgresql.adoc (spec, rebuilt as valid JSON) ----------------------------------

_DOC_SOURCE = {
    "version": "3.x",
    "connector": "postgresql",
    "name": "PostgreSQL_server",
    "ts_ms": 1559033904863,
    "ts_us": 1559033904863112,
    "ts_ns": 1559033904863112000,
    "snapshot": False,
    "db": "postgres",
    "schema": "public",
    "table": "customers",
    "txId": 556,
    "lsn": 46523128,
    "xmin": None,
}


@pytest.mark.unit
def test_docs_truncate_shape_decodes_to_truncate() -> None:
    value = {"source": _DOC_SOURCE, "op": "t", "ts_ms": 1559033904961, "ts_us": 1, "ts_ns": 2}
    event = decode_record(_record(_json(value)))
    assert event.kind is RecordKind.TRUNCATE
    assert event.op is Op.TRUNCATE
    assert event.source is not None
    assert event.source.table == "customers"
    assert event.source.lsn == 46523128
    assert event.ts_ms == 1559033904961
    assert event.before is None and event.after is None


@pytest.mark.unit
def test_docs_message_shape_decodes_prefix_and_base64_content() -> None:
    source = {**_DOC_SOURCE, "schema": "", "table": ""}
    value = {
        "source": source,
        "op": "m",
        "ts_ms": 1559033904961,
        "message": {"prefix": "foo", "content": "YmFy"},
    }
    event = decode_record(_record(_json(value)))
    assert event.kind is RecordKind.MESSAGE
    assert event.op is Op.MESSAGE
    assert event.message_prefix == "foo"
    assert event.message_content == b"bar"


@pytest.mark.unit
def test_docs_update_shape_with_key_only_before() -> None:
    value = {
        "before": {"id": 1},
        "after": {
            "id": 1,
            "first_name": "Anne Marie",
            "last_name": "Kretchmar",
            "email": "annek@noanswer.org",
        },
        "source": _DOC_SOURCE,
        "op": "u",
        "ts_ms": 1465584025523,
    }
    event = decode_record(_record(_json(value), _json({"id": 1})))
    assert event.op is Op.UPDATE
    assert event.key == {"id": 1}
    assert event.before == {"id": 1}
    assert event.after is not None
    assert event.after["first_name"] == "Anne Marie"


# --- edge values derived from AbstractRecordsProducerTest (Debezium's expected values) ----------


def _typed_row_event(fields: list[tuple[str, str, str | None]], row: dict[str, Any]) -> ChangeEvent:
    """Decode a `c` event whose after-schema gives each column (name, type, logical name)."""
    columns = []
    for name, type_, logical in fields:
        column: dict[str, Any] = {"type": type_, "optional": True, "field": name}
        if logical is not None:
            column["name"] = logical
        columns.append(column)
    value = {
        "schema": {
            "type": "struct",
            "fields": [
                {"type": "struct", "fields": columns, "optional": True, "field": "after"},
            ],
        },
        "payload": {"before": None, "after": row, "op": "c", "source": None},
    }
    return decode_record(_record(_json(value)))


@pytest.mark.unit
def test_variable_scale_decimals_from_the_java_expected_values() -> None:
    vsd = "io.debezium.data.VariableScaleDecimal"
    event = _typed_row_event(
        [("dvs", "struct", vsd), ("nvs", "struct", vsd), ("dvs_int", "struct", vsd)],
        {
            "dvs": {"scale": 4, "value": "AYr3"},
            "nvs": {"scale": 4, "value": "A2QO"},
            "dvs_int": {"scale": 0, "value": base64.b64encode(bytes([10])).decode()},
        },
    )
    assert event.after == {
        "dvs": Decimal("10.1111"),
        "nvs": Decimal("22.2222"),
        "dvs_int": Decimal("10"),
    }


@pytest.mark.unit
def test_zoned_timestamps_from_the_java_expected_values() -> None:
    zt = "io.debezium.time.ZonedTimestamp"
    event = _typed_row_event(
        [("tz", "string", zt), ("tz_pinf", "string", zt), ("tz_ninf", "string", zt)],
        {"tz": "2016-11-04T11:51:30.123456Z", "tz_pinf": "infinity", "tz_ninf": "-infinity"},
    )
    assert event.after == {
        "tz": datetime(2016, 11, 4, 11, 51, 30, 123456, tzinfo=UTC),
        "tz_pinf": POSITIVE_INFINITY,
        "tz_ninf": NEGATIVE_INFINITY,
    }


@pytest.mark.unit
@pytest.mark.parametrize(
    ("column", "value"),
    [
        ("tz_large", "+21016-11-04T06:51:30.123456Z"),
        ("tz_max", "+294247-01-01T23:59:59.999999Z"),
        ("tz_min", "-4713-12-31T23:59:59.999999Z"),
    ],
)
def test_zoned_timestamps_python_cannot_hold_raise_with_column_and_value(
    column: str, value: str
) -> None:
    with pytest.raises(LogicalTypeError) as caught:
        _typed_row_event([(column, "string", "io.debezium.time.ZonedTimestamp")], {column: value})
    assert f"after.{column}" in str(caught.value)
    assert value in str(caught.value)


@pytest.mark.unit
def test_micro_timestamp_infinity_sentinels_from_the_java_expected_values() -> None:
    mt = "io.debezium.time.MicroTimestamp"
    event = _typed_row_event(
        [
            ("ts", "int64", mt),
            ("tsneg", "int64", mt),
            ("ts_pinf", "int64", mt),
            ("ts_ninf", "int64", mt),
        ],
        {
            "ts": 1478267490123456,  # 2016-11-04T13:51:30.123456 as epoch µs
            "tsneg": -1047174587392000,  # 1936-10-25T22:10:12.608
            "ts_pinf": 9223372036825200000,
            "ts_ninf": -9223372036832400000,
        },
    )
    assert event.after == {
        "ts": datetime(2016, 11, 4, 13, 51, 30, 123456, tzinfo=UTC),
        "tsneg": datetime(1936, 10, 25, 22, 10, 12, 608000, tzinfo=UTC),
        "ts_pinf": POSITIVE_INFINITY,
        "ts_ninf": NEGATIVE_INFINITY,
    }


# --- decoder behaviour beyond the vectors ------------------------------------------------------

_SOURCE = {"connector": "postgresql", "db": "app", "schema": "public", "table": "docs", "lsn": 7}


def _event(**payload: Any) -> bytes:
    return _json({"source": _SOURCE, "ts_ms": 1, **payload})


def _key_envelope(payload: Any) -> bytes:
    schema = {"type": "struct", "fields": [{"type": "int32", "field": "id"}]}
    return _json({"schema": schema, "payload": payload})


@pytest.mark.unit
def test_null_value_is_a_tombstone_with_its_key_decoded() -> None:
    event = decode_record(_record(None, _key_envelope({"id": 7}), offset=3))
    assert event.kind is RecordKind.TOMBSTONE
    assert event.key == {"id": 7}
    assert event.op is None
    assert event.position == RecordPosition(TOPIC, 0, 3)


@pytest.mark.unit
def test_envelope_with_null_payload_is_a_tombstone() -> None:
    event = decode_record(_record(_json({"schema": None, "payload": None}), _json({"id": 7})))
    assert event.kind is RecordKind.TOMBSTONE
    assert event.key == {"id": 7}


@pytest.mark.unit
def test_heartbeat_topic_is_recognised_without_reading_the_value() -> None:
    event = decode_record(
        _record(b"\xff not json", b"?", topic="__debezium-heartbeat.fullfillment")
    )
    assert event.kind is RecordKind.HEARTBEAT
    assert event.key is None


@pytest.mark.unit
@pytest.mark.parametrize(
    ("payload", "error", "message"),
    [
        (
            {"op": "x", "after": {}},
            UnsupportedOperationError,
            r"value\.op: unsupported operation 'x'",
        ),
        ({"op": 1, "after": {}}, DecodeError, r"value\.op: expected a string, found number"),
        ({"before": {"id": 1}}, DecodeError, r"value\.op: missing"),
        ({"status": "BEGIN", "id": "571"}, DecodeError, r"no 'op'.*found keys \['id', 'source'"),
        ({"op": "c", "after": None}, DecodeError, r"value\.after: op 'c' needs an 'after' row"),
        (
            {"op": "d", "before": {"id": 1}, "after": {"id": 1}},
            DecodeError,
            r"value\.after: op 'd'",
        ),
        (
            {"op": "c", "after": [1]},
            DecodeError,
            r"value\.after: expected an object or null, found array",
        ),
        (
            {"op": "u", "before": "x", "after": {}},
            DecodeError,
            r"value\.before: expected an object",
        ),
        ({"op": "m", "message": {"prefix": "p"}}, DecodeError, r"value\.message\.content"),
        (
            {"op": "m", "message": {"prefix": "p", "content": "%%"}},
            DecodeError,
            r"message\.content",
        ),
    ],
)
def test_malformed_events_are_refused_with_the_field_path(
    payload: dict[str, Any], error: type[DecodeError], message: str
) -> None:
    with pytest.raises(error, match=message):
        decode_record(_record(_event(**payload)))


@pytest.mark.unit
@pytest.mark.parametrize(
    ("source", "message"),
    [
        ([], r"value\.source: expected an object or null, found array"),
        ({"lsn": "34078720"}, r"value\.source\.lsn: expected an integer"),
        ({"txId": True}, r"value\.source\.txId: expected an integer"),
        ({"table": 5}, r"value\.source\.table: expected a string"),
        ({"snapshot": "maybe"}, r"value\.source\.snapshot: unknown snapshot marker 'maybe'"),
        ({"snapshot": 1}, r"value\.source\.snapshot: expected a string or boolean"),
    ],
)
def test_malformed_source_fields_are_refused_with_the_field_path(source: Any, message: str) -> None:
    value = _json({"op": "c", "after": {"id": 1}, "source": source})
    with pytest.raises(DecodeError, match=message):
        decode_record(_record(value))


@pytest.mark.unit
@pytest.mark.parametrize(
    ("snapshot", "expected"),
    [
        (None, SnapshotMarker.FALSE),
        (False, SnapshotMarker.FALSE),
        (True, SnapshotMarker.TRUE),
        ("true", SnapshotMarker.TRUE),
        ("last", SnapshotMarker.LAST),
        ("first", SnapshotMarker.FIRST),
        ("incremental", SnapshotMarker.INCREMENTAL),
        ("last_in_data_collection", SnapshotMarker.LAST_IN_DATA_COLLECTION),
    ],
)
def test_snapshot_marker_accepts_strings_booleans_and_absence(
    snapshot: Any, expected: SnapshotMarker
) -> None:
    source = dict(_SOURCE) if snapshot is None else {**_SOURCE, "snapshot": snapshot}
    event = decode_record(_record(_json({"op": "r", "after": {"id": 1}, "source": source})))
    assert event.source is not None
    assert event.source.snapshot is expected


@pytest.mark.unit
@pytest.mark.parametrize(
    ("value", "message"),
    [
        (b"\xff\xfe{}", r"value: not UTF-8"),
        (b"{not json", r"value: not JSON"),
        (b"", r"value: empty"),
        (b"[1, 2]", r"value: expected a JSON object, found array"),
        (b"42", r"value: expected a JSON object, found number"),
        (b"[" * 100_000, r"nested too deeply"),
        (_json({"schema": {"fields": 3}, "payload": {}}), r"value\.schema\.fields"),
        (_json({"schema": {}, "payload": []}), r"value\.payload: expected a JSON object"),
    ],
)
def test_undecodable_values_are_refused_precisely(value: bytes, message: str) -> None:
    with pytest.raises(DecodeError, match=message):
        decode_record(_record(value))


@pytest.mark.unit
@pytest.mark.parametrize(
    ("key", "message"),
    [
        (b"\x80", r"key: not UTF-8"),
        (b"[1]", r"key: expected an object of key columns, found array"),
        (_key_envelope(5), r"key\.payload: expected an object of key columns, found number"),
    ],
)
def test_undecodable_keys_are_refused_precisely(key: bytes, message: str) -> None:
    with pytest.raises(DecodeError, match=message):
        decode_record(_record(_event(op="c", after={"id": 1}), key))


@pytest.mark.unit
def test_toast_placeholder_in_array_and_binary_columns_is_removed() -> None:
    b64_placeholder = base64.b64encode(TOAST_PLACEHOLDER.encode()).decode()
    value = _event(
        op="u",
        before={"id": 1, "body": TOAST_PLACEHOLDER, "tags": ["a"]},
        after={"id": 1, "tags": [TOAST_PLACEHOLDER], "blob": b64_placeholder, "title": "t"},
    )
    event = decode_record(_record(value))
    assert event.after == {"id": 1, "title": "t"}
    assert event.unavailable_columns == frozenset({"tags", "blob"})
    # before loses its placeholder too, but only after's columns are listed.
    assert event.before == {"id": 1, "tags": ["a"]}


@pytest.mark.unit
def test_custom_toast_placeholder_is_honoured() -> None:
    value = _event(op="u", after={"id": 1, "body": "<<gone>>"})
    event = decode_record(_record(value), DecodeOptions(toast_placeholder="<<gone>>"))
    assert event.after == {"id": 1}
    assert event.unavailable_columns == frozenset({"body"})


@pytest.mark.unit
def test_old_and_new_key_headers_are_decoded_with_or_without_envelope() -> None:
    headers = (
        ("__debezium.oldkey", _key_envelope({"id": 1})),
        ("__debezium.newkey", _json({"id": 2})),
        ("other", b"\xff"),
    )
    value = _event(op="c", after={"id": 2})
    event = decode_record(_record(value, _json({"id": 2}), headers=headers))
    assert event.old_key == {"id": 1}
    assert event.new_key == {"id": 2}


@pytest.mark.unit
def test_null_key_headers_mean_no_key_change() -> None:
    headers = (("__debezium.oldkey", None),)
    event = decode_record(_record(_event(op="c", after={"id": 2}), headers=headers))
    assert event.old_key is None
    assert event.new_key is None


@pytest.mark.unit
def test_bad_key_header_is_refused_with_its_name() -> None:
    headers = (("__debezium.newkey", b"[1]"),)
    with pytest.raises(DecodeError, match=r"headers\['__debezium\.newkey'\]"):
        decode_record(_record(_event(op="c", after={"id": 2}), headers=headers))
    twice = (("__debezium.oldkey", b'{"id":1}'), ("__debezium.oldkey", b'{"id":2}'))
    with pytest.raises(DecodeError, match="different values"):
        decode_record(_record(_event(op="c", after={"id": 2}), headers=twice))


@pytest.mark.unit
def test_record_over_max_record_bytes_is_a_decode_error_and_a_too_large_error() -> None:
    value = _event(op="c", after={"id": 1, "body": "x" * 200})
    with pytest.raises(RecordTooLargeDecodeError) as caught:
        decode_record(_record(value), DecodeOptions(max_record_bytes=100))
    assert isinstance(caught.value, DecodeError)
    assert isinstance(caught.value, RecordTooLargeError)
    assert caught.value.code == "RECORD_TOO_LARGE"
    assert caught.value.size == len(value)
    event = decode_record(_record(value), DecodeOptions(max_record_bytes=len(value)))
    assert event.after is not None


@pytest.mark.unit
def test_schemaless_decimal_and_timestamp_hints_convert_columns() -> None:
    options = DecodeOptions(
        column_types={
            "price": ColumnType(LogicalType.DECIMAL, scale=2),
            "updated_at": ColumnType(LogicalType.MICRO_TIMESTAMP),
        }
    )
    value = _event(op="c", after={"id": 1, "price": "AfM=", "updated_at": 1369579858951000})
    event = decode_record(_record(value), options)
    assert event.after == {
        "id": 1,
        "price": Decimal("4.99"),
        "updated_at": datetime(2013, 5, 26, 14, 50, 58, 951000, tzinfo=UTC),
    }


@pytest.mark.external
def test_hints_are_ignored_when_the_record_has_a_schema() -> None:
    options = DecodeOptions(column_types={"id": ColumnType(LogicalType.MICRO_TIMESTAMP)})
    event = decode_record(
        _record(_read("flink-json/debezium-postgres-data-schema-include.line1.json")), options
    )
    assert event.after is not None
    assert event.after["id"] == 101


@pytest.mark.unit
def test_out_of_range_timestamp_error_names_the_column_and_clamp_option_avoids_it() -> None:
    options = DecodeOptions(column_types={"updated_at": ColumnType(LogicalType.MICRO_TIMESTAMP)})
    value = _event(op="c", after={"id": 1, "updated_at": 9223371331199999999})
    with pytest.raises(LogicalTypeError, match=r"value\.after\.updated_at.*9223371331199999999"):
        decode_record(_record(value), options)
    clamped = DecodeOptions(column_types=options.column_types, clamp_out_of_range=True)
    event = decode_record(_record(value), clamped)
    assert event.after is not None
    assert event.after["updated_at"] is POSITIVE_INFINITY


_UNWRAPPED = DecodeOptions(envelope="unwrapped")


@pytest.mark.unit
@pytest.mark.parametrize("deleted", ["true", True])
def test_unwrapped_deleted_row_is_a_delete_with_the_row_as_before(deleted: Any) -> None:
    row = {"id": 1, "title": "t", "__deleted": deleted, "__op": "d", "__table": "docs"}
    event = decode_record(_record(_json(row), _json({"id": 1})), _UNWRAPPED)
    assert event.op is Op.DELETE
    assert event.before == {"id": 1, "title": "t"}
    assert event.after is None
    assert event.key == {"id": 1}
    assert event.source == SourceInfo(table="docs")


@pytest.mark.unit
def test_unwrapped_metadata_fields_fill_source_and_ts_and_leave_the_row() -> None:
    row = {
        "id": 1,
        "body": TOAST_PLACEHOLDER,
        "__op": "c",
        "__deleted": "false",
        "__table": "docs",
        "__schema": "public",
        "__lsn": 42,
        "__source_ts_ms": 5,
        "__ts_ms": 6,
        "__snapshot": "false",
    }
    event = decode_record(_record(_json(row)), _UNWRAPPED)
    assert event.op is Op.CREATE
    assert event.after == {"id": 1}
    assert event.unavailable_columns == frozenset({"body"})
    assert event.source == SourceInfo(schema="public", table="docs", lsn=42, ts_ms=5)
    assert event.ts_ms == 6


@pytest.mark.unit
def test_unwrapped_row_with_schema_applies_logical_types() -> None:
    schema = {
        "type": "struct",
        "fields": [
            {"type": "int32", "field": "id"},
            {
                "type": "bytes",
                "name": "org.apache.kafka.connect.data.Decimal",
                "parameters": {"scale": "2"},
                "field": "price",
            },
        ],
    }
    value = _json({"schema": schema, "payload": {"id": 1, "price": "CcM="}})
    event = decode_record(_record(value), _UNWRAPPED)
    assert event.after == {"id": 1, "price": Decimal("24.99")}


@pytest.mark.unit
def test_unwrapped_default_op_is_configurable() -> None:
    options = DecodeOptions(envelope="unwrapped", unwrapped_default_op=Op.READ)
    event = decode_record(_record(_json({"id": 1})), options)
    assert event.op is Op.READ


@pytest.mark.unit
@pytest.mark.parametrize(
    ("row", "error", "message"),
    [
        (
            {"id": 1, "__deleted": "true", "__op": "u"},
            DecodeError,
            "__deleted is true but __op is 'u'",
        ),
        ({"id": 1, "__deleted": "yes"}, DecodeError, r"value\.__deleted"),
        ({"id": 1, "__op": "t"}, UnsupportedOperationError, "cannot be carried by a flattened row"),
        ({"id": 1, "__op": "z"}, UnsupportedOperationError, "unsupported operation 'z'"),
        ({"id": 1, "__lsn": "x"}, DecodeError, r"value\.__lsn: expected an integer"),
    ],
)
def test_unwrapped_inconsistent_metadata_is_refused(
    row: dict[str, Any], error: type[DecodeError], message: str
) -> None:
    with pytest.raises(error, match=message):
        decode_record(_record(_json(row)), _UNWRAPPED)


@pytest.mark.external
def test_full_envelope_in_unwrapped_mode_is_refused() -> None:
    with pytest.raises(DecodeError, match="use envelope='debezium'"):
        decode_record(_record(_read("debezium-core-serde/serde-update.json")), _UNWRAPPED)


@pytest.mark.unit
@pytest.mark.parametrize(
    "kwargs",
    [
        {"envelope": "flat"},
        {"heartbeat_topic_prefix": ""},
        {"max_record_bytes": 0},
        {"unwrapped_default_op": Op.DELETE},
        {"column_types": {"a.b.c.d": ColumnType(LogicalType.DATE)}},
        {"column_types": {"a..b": ColumnType(LogicalType.DATE)}},
    ],
)
def test_inconsistent_decode_options_are_a_config_error(kwargs: dict[str, Any]) -> None:
    with pytest.raises(ConfigError):
        DecodeOptions(**kwargs)


@pytest.mark.unit
def test_a_transaction_boundary_record_is_recognised_not_refused() -> None:
    # what provide.transaction.metadata=true writes to `<prefix>.transaction`
    value = {
        "status": "END",
        "id": "571:53195832",
        "event_count": 2,
        "ts_ms": 1,
        "data_collections": [{"data_collection": "public.entities", "event_count": 2}],
    }
    event = decode_record(_record(_json(value), topic="sor.transaction"))
    assert event.kind is RecordKind.TRANSACTION
