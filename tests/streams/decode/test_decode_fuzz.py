"""Property tests: whatever bytes arrive, the decoder returns a ChangeEvent or raises DecodeError.

Any other exception (KeyError, TypeError, OverflowError, ValueError...) fails these tests: the
worker routes `DecodeError`s to the DLQ, so anything else would stop the partition.
"""

from __future__ import annotations

import base64
import json
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from ragcore.errors import DecodeError
from schemas.events import TOAST_PLACEHOLDER, ChangeEvent, Op, RawRecord, RecordKind
from streams.decode import ColumnType, DecodeOptions, LogicalType, decode_record

FUZZ = settings(
    max_examples=300,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
)

COLUMNS = ["id", "title", "body", "price", "updated_at", "dob", "tags", "__deleted", "__op"]

json_scalars = (
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False) | st.text(max_size=20)
)
json_values = st.recursive(
    json_scalars,
    lambda children: (
        st.lists(children, max_size=4) | st.dictionaries(st.text(max_size=8), children, max_size=4)
    ),
    max_leaves=15,
)

# Values a logical-type converter might meet: plausible, extreme and wrong.
edge_ints = (
    st.sampled_from(
        [
            0,
            -1,
            1369579858951000,
            -1257206400000000,
            9223372036825200000,
            -9223372036832400000,
            9223371331199999999,
            -210831897600000001,
            2146033979,
            -2147472691,
            86_400_000_000,
            2**63,
            -(2**63),
            10**30,
        ]
    )
    | st.integers()
)
b64_text = st.binary(max_size=12).map(lambda b: base64.b64encode(b).decode())
edge_strings = st.sampled_from(
    [
        "AfM=",
        "",
        "=",
        "infinity",
        "-infinity",
        "NAN",
        "10.1111",
        "2016-11-04T11:51:30.123456Z",
        "+21016-11-04T06:51:30.123456Z",
        "-4713-12-31T23:59:59.999999Z",
        "9999-12-31T23:59:59-23:59",
        "0001-01-01T00:00:00+23:59",
        "11:51:30.123789Z",
        "24:00:00Z",
        "a0eebc99-9c0b-4ef8-bb6d-6bb9bd380a11",
        "a,b,",
        '{"a": [1, 2]}',
        TOAST_PLACEHOLDER,
        "X19kZWJleml1bV91bmF2YWlsYWJsZV92YWx1ZQ==",
    ]
) | st.text(max_size=30)
column_values = (
    json_values
    | edge_ints
    | edge_strings
    | b64_text
    | st.lists(edge_strings, max_size=3)
    | st.fixed_dictionaries({"scale": st.integers(-5, 40) | json_scalars, "value": b64_text})
)
rows = st.dictionaries(st.sampled_from(COLUMNS) | st.text(max_size=6), column_values, max_size=6)

logical_names = st.sampled_from([t.value for t in LogicalType]) | st.text(max_size=12)
field_schemas = st.fixed_dictionaries(
    {
        "field": st.sampled_from(COLUMNS),
        "type": st.sampled_from(["int32", "int64", "string", "bytes", "struct", "array", "map"]),
    },
    optional={
        "name": logical_names,
        "parameters": st.dictionaries(
            st.sampled_from(["scale", "allowed", "connect.decimal.precision"]),
            st.text(max_size=4) | st.sampled_from(["2", "-3", "99999999999", "0"]),
            max_size=2,
        ),
        "items": st.fixed_dictionaries(
            {"type": st.sampled_from(["int64", "string", "bytes"])},
            optional={"name": logical_names},
        ),
    },
)
struct_schemas = st.fixed_dictionaries(
    {"type": st.just("struct"), "fields": st.lists(field_schemas, max_size=5)}
)


def _field_name(field_schema: Any) -> str:
    return str(field_schema["field"])


envelope_schemas = st.fixed_dictionaries(
    {
        "type": st.just("struct"),
        "fields": st.lists(
            st.fixed_dictionaries(
                {"type": st.just("struct"), "field": st.sampled_from(["before", "after"])},
                optional={"fields": st.lists(field_schemas, max_size=5)},
            ),
            max_size=2,
            unique_by=_field_name,
        ),
    }
)
sources = st.fixed_dictionaries(
    {},
    optional={
        "connector": st.just("postgresql") | json_scalars,
        "schema": st.just("public") | json_scalars,
        "table": st.just("docs") | json_scalars,
        "ts_ms": edge_ints | json_scalars,
        "lsn": edge_ints | json_scalars,
        "txId": edge_ints | json_scalars,
        "sequence": st.just('["1","2"]') | json_scalars,
        "snapshot": st.sampled_from(
            ["true", "false", "last", "LAST", "bogus", True, False, None, 3]
        ),
        "xmin": json_scalars,
    },
)
envelopes = st.fixed_dictionaries(
    {},
    optional={
        "op": st.sampled_from(["c", "u", "d", "r", "t", "m", "x", "", None, 1, ["c"]]),
        "before": st.none() | rows | json_values,
        "after": st.none() | rows | json_values,
        "source": st.none() | sources | json_values,
        "ts_ms": edge_ints | json_scalars,
        "ts_us": json_scalars,
        "message": st.fixed_dictionaries(
            {"prefix": st.text(max_size=5) | json_scalars, "content": b64_text | json_scalars}
        )
        | json_values,
        "transaction": json_values,
    },
)


def _wrap(schema_strategy: st.SearchStrategy[Any], payload: st.SearchStrategy[Any]) -> Any:
    """Payload alone, or inside a `{schema, payload}` envelope with a random schema."""
    return payload | st.builds(
        lambda schema, body: {"schema": schema, "payload": body},
        st.none() | schema_strategy,
        payload,
    )


column_types = st.sampled_from(list(LogicalType)).flatmap(
    lambda logical: (
        st.builds(ColumnType, st.just(logical), st.integers(-5, 40))
        if logical is LogicalType.DECIMAL
        else st.just(ColumnType(logical))
    )
)
options = st.builds(
    DecodeOptions,
    envelope=st.sampled_from(["debezium", "unwrapped"]),
    column_types=st.dictionaries(
        st.sampled_from([*COLUMNS, "docs.price", "public.docs.updated_at"]),
        column_types,
        max_size=4,
    ),
    max_record_bytes=st.none() | st.integers(1, 4096),
    clamp_out_of_range=st.booleans(),
    unwrapped_default_op=st.sampled_from([Op.CREATE, Op.UPDATE, Op.READ]),
)
topics = st.sampled_from(
    ["app.public.docs", "__debezium-heartbeat.app", "app", "a.b.c.d"]
) | st.text(max_size=12)
key_docs = _wrap(struct_schemas, st.none() | rows | json_values)
header_values = st.none() | st.binary(max_size=16) | key_docs.map(lambda d: json.dumps(d).encode())
headers = st.lists(
    st.tuples(
        st.sampled_from(["__debezium.oldkey", "__debezium.newkey", "other"]) | st.text(max_size=6),
        header_values,
    ),
    max_size=3,
).map(tuple)


def _decode_or_refuse(raw: RawRecord, opts: DecodeOptions | None) -> ChangeEvent | None:
    """The event, or None when the decoder refused with a DecodeError (anything else escapes)."""
    try:
        event = decode_record(raw, opts)
    except DecodeError as exc:
        assert exc.code  # every refusal carries a stable code for the DLQ header
        return None
    assert isinstance(event, ChangeEvent)
    return event


def _check_invariants(event: ChangeEvent) -> None:
    assert event.kind in RecordKind
    if event.kind is RecordKind.CHANGE:
        assert event.op in (Op.CREATE, Op.UPDATE, Op.DELETE, Op.READ)
        assert (event.after is None) is (event.op is Op.DELETE)
    for row in (event.before, event.after):
        if row is not None:
            for value in row.values():
                assert value != TOAST_PLACEHOLDER
                if isinstance(value, list):
                    assert TOAST_PLACEHOLDER not in value
    if event.after is not None:
        assert not event.unavailable_columns & set(event.after)
    else:
        assert event.unavailable_columns == frozenset()


def _raw(
    topic: str,
    key: bytes | None,
    value: bytes | None,
    hdrs: tuple[tuple[str, bytes | None], ...] = (),
) -> RawRecord:
    return RawRecord(topic=topic, partition=0, offset=0, key=key, value=value, headers=hdrs)


@pytest.mark.unit
@FUZZ
@given(
    topic=topics,
    key=st.none() | st.binary(max_size=64),
    value=st.none() | st.binary(max_size=256),
    hdrs=headers,
    opts=st.none() | options,
)
def test_arbitrary_bytes_never_raise_anything_but_decode_error(
    topic: str,
    key: bytes | None,
    value: bytes | None,
    hdrs: tuple[tuple[str, bytes | None], ...],
    opts: DecodeOptions | None,
) -> None:
    event = _decode_or_refuse(_raw(topic, key, value, hdrs), opts)
    if event is not None:
        _check_invariants(event)


@pytest.mark.unit
@FUZZ
@given(key=st.none() | json_values, value=json_values, opts=st.none() | options)
def test_arbitrary_json_never_raises_anything_but_decode_error(
    key: Any, value: Any, opts: DecodeOptions | None
) -> None:
    key_bytes = None if key is None else json.dumps(key).encode()
    event = _decode_or_refuse(_raw("app.public.docs", key_bytes, json.dumps(value).encode()), opts)
    if event is not None:
        _check_invariants(event)


@pytest.mark.unit
@FUZZ
@given(
    topic=topics,
    key=key_docs,
    value=_wrap(envelope_schemas, envelopes),
    hdrs=headers,
    opts=st.none() | options,
)
def test_envelope_shaped_json_never_raises_anything_but_decode_error(
    topic: str,
    key: Any,
    value: Any,
    hdrs: tuple[tuple[str, bytes | None], ...],
    opts: DecodeOptions | None,
) -> None:
    raw = _raw(topic, json.dumps(key).encode(), json.dumps(value).encode(), hdrs)
    event = _decode_or_refuse(raw, opts)
    if event is not None:
        _check_invariants(event)


@pytest.mark.unit
@FUZZ
@given(
    row=_wrap(struct_schemas, rows),
    opts=options.map(
        lambda o: DecodeOptions(
            envelope="unwrapped",
            column_types=o.column_types,
            clamp_out_of_range=o.clamp_out_of_range,
        )
    ),
)
def test_unwrapped_rows_never_raise_anything_but_decode_error(
    row: Any, opts: DecodeOptions
) -> None:
    event = _decode_or_refuse(_raw("app.public.docs", None, json.dumps(row).encode()), opts)
    if event is not None:
        _check_invariants(event)


@pytest.mark.unit
@FUZZ
@given(
    op=st.sampled_from(["c", "u", "r"]),
    after=st.dictionaries(st.sampled_from(COLUMNS), column_values, max_size=6),
    hints=st.dictionaries(st.sampled_from(COLUMNS), column_types, max_size=6),
    clamp=st.booleans(),
)
def test_valid_envelopes_with_hinted_columns_decode_or_refuse_per_column(
    op: str, after: dict[str, Any], hints: dict[str, ColumnType], clamp: bool
) -> None:
    opts = DecodeOptions(column_types=hints, clamp_out_of_range=clamp)
    value = json.dumps({"op": op, "after": after, "source": {"snapshot": "false"}}).encode()
    event = _decode_or_refuse(_raw("app.public.docs", None, value), opts)
    if event is not None:
        _check_invariants(event)
        assert event.op is Op(op)
        assert event.after is not None
        assert set(event.after) | event.unavailable_columns == set(after)
        for column in set(after) - set(hints) - event.unavailable_columns:
            assert event.after[column] == after[column]  # unhinted columns keep their JSON value
