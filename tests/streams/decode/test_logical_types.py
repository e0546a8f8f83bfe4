"""Unit tests: one Debezium / Kafka Connect logical type at a time."""

from __future__ import annotations

import base64
import uuid
from datetime import UTC, date, datetime, time, timedelta, timezone
from decimal import Decimal, localcontext
from typing import Any

import pytest

from ragcore.errors import ConfigError, DecodeError, LogicalTypeError
from streams.decode import (
    DATE_NEGATIVE_INFINITY,
    DATE_POSITIVE_INFINITY,
    NEGATIVE_INFINITY,
    POSITIVE_INFINITY,
    ColumnType,
    ConnectSchema,
    JsonText,
    LogicalType,
    convert_logical,
    convert_value,
    is_infinity,
    to_epoch_micros,
)

L = LogicalType


def _conv(
    value: Any, logical: LogicalType, *, scale: int | None = None, clamp: bool = False
) -> Any:
    params = {} if scale is None else {"scale": str(scale)}
    return convert_logical(value, logical, parameters=params, where="after.col", clamp=clamp)


def _b64_int(number: int, length: int) -> str:
    return base64.b64encode(number.to_bytes(length, "big", signed=True)).decode()


# --- Decimal -------------------------------------------------------------------------------------


@pytest.mark.unit
@pytest.mark.parametrize(
    ("text", "expected"), [("AfM=", "4.99"), ("CcM=", "24.99"), ("ASs=", "2.99")]
)
def test_decimal_base64_unscaled_with_scale_2(text: str, expected: str) -> None:
    result = _conv(text, L.DECIMAL, scale=2)
    assert result == Decimal(expected)
    assert result.as_tuple().exponent == -2


@pytest.mark.unit
def test_decimal_negative_two_complement() -> None:
    assert _conv(_b64_int(-499, 2), L.DECIMAL, scale=2) == Decimal("-4.99")


@pytest.mark.unit
def test_decimal_keeps_every_digit_regardless_of_context_precision() -> None:
    unscaled = 12345678901234567890123456789012345678
    with localcontext() as ctx:
        ctx.prec = 5
        result = _conv(_b64_int(unscaled, 16), L.DECIMAL, scale=10)
    assert result == Decimal("1234567890123456789012345678.9012345678")


@pytest.mark.unit
def test_decimal_without_scale_parameter_is_refused() -> None:
    with pytest.raises(LogicalTypeError, match=r"after\.col.*scale"):
        _conv("AfM=", L.DECIMAL)


@pytest.mark.unit
@pytest.mark.parametrize("value", ["not base64!", "AfM", 499, ""])
def test_decimal_malformed_values_are_refused(value: Any) -> None:
    with pytest.raises(LogicalTypeError, match=r"after\.col"):
        _conv(value, L.DECIMAL, scale=2)


@pytest.mark.unit
def test_decimal_scale_parameter_must_be_an_int32_string() -> None:
    schema = ConnectSchema(name=L.DECIMAL.value, parameters={"scale": "two"})
    with pytest.raises(LogicalTypeError, match="scale"):
        convert_value("AfM=", schema, where="after.col")


@pytest.mark.unit
@pytest.mark.parametrize("logical", list(LogicalType))
def test_null_stays_null_for_every_logical_type(logical: LogicalType) -> None:
    assert _conv(None, logical, scale=2 if logical is L.DECIMAL else None) is None


# --- VariableScaleDecimal and string-mode decimals ---------------------------------------------


@pytest.mark.unit
@pytest.mark.parametrize(
    ("value", "expected"),
    [
        ({"scale": 4, "value": "AYr3"}, Decimal("10.1111")),
        ({"scale": 4, "value": "A2QO"}, Decimal("22.2222")),
        ({"scale": 0, "value": "Cg=="}, Decimal("10")),
        ("10.1111", Decimal("10.1111")),
        ("22.2200", Decimal("22.2200")),
        ("-Infinity", Decimal("-Infinity")),
        ("Infinity", Decimal("Infinity")),
    ],
)
def test_variable_scale_decimal_struct_and_string_forms(value: Any, expected: Decimal) -> None:
    result = _conv(value, L.VARIABLE_SCALE_DECIMAL)
    assert result == expected
    assert str(result) == str(expected)


@pytest.mark.unit
@pytest.mark.parametrize("text", ["NAN", "NaN", "nan"])
def test_decimal_string_nan_is_a_quiet_decimal_nan(text: str) -> None:
    for logical in (L.VARIABLE_SCALE_DECIMAL, L.DECIMAL_STRING):
        result = _conv(text, logical)
        assert isinstance(result, Decimal)
        assert result.is_nan()
        assert not result.is_snan()


@pytest.mark.unit
@pytest.mark.parametrize(
    "value",
    [
        {"value": "AYr3"},
        {"scale": True, "value": "AYr3"},
        {"scale": 4, "value": 5},
        {"scale": 4},
        "1_000",
        " 1",
        "sNaN",
        4.2,
    ],
)
def test_variable_scale_decimal_malformed_values_are_refused(value: Any) -> None:
    with pytest.raises(LogicalTypeError, match=r"after\.col"):
        _conv(value, L.VARIABLE_SCALE_DECIMAL)


# --- timestamps ----------------------------------------------------------------------------------


@pytest.mark.unit
@pytest.mark.parametrize(
    ("micros", "expected"),
    [
        (1369579858951000, datetime(2013, 5, 26, 14, 50, 58, 951000, tzinfo=UTC)),
        (-1257206400000000, datetime(1930, 3, 1, tzinfo=UTC)),
        (0, datetime(1970, 1, 1, tzinfo=UTC)),
        (-1, datetime(1969, 12, 31, 23, 59, 59, 999999, tzinfo=UTC)),
    ],
)
def test_micro_timestamp_is_an_aware_utc_datetime(micros: int, expected: datetime) -> None:
    result = _conv(micros, L.MICRO_TIMESTAMP)
    assert result == expected
    assert result.tzinfo is UTC


@pytest.mark.unit
def test_micro_timestamp_infinity_sentinels() -> None:
    assert _conv(9223372036825200000, L.MICRO_TIMESTAMP) is POSITIVE_INFINITY
    assert _conv(-9223372036832400000, L.MICRO_TIMESTAMP) is NEGATIVE_INFINITY
    assert datetime.max.replace(tzinfo=UTC) == POSITIVE_INFINITY
    assert datetime.min.replace(tzinfo=UTC) == NEGATIVE_INFINITY


@pytest.mark.unit
@pytest.mark.parametrize(
    ("micros", "clamped"),
    [
        (9223371331200000000 - 1, POSITIVE_INFINITY),  # ts_max: 294247-01-01T23:59:59.999999
        (-210831897600000001, NEGATIVE_INFINITY),  # ts_min: 4713-12-31T23:59:59.999999 BC
        (253402300800000000, POSITIVE_INFINITY),  # one µs past datetime.max
    ],
)
def test_micro_timestamp_out_of_range_raises_unless_clamped(micros: int, clamped: datetime) -> None:
    with pytest.raises(LogicalTypeError) as caught:
        _conv(micros, L.MICRO_TIMESTAMP)
    assert "after.col" in str(caught.value)
    assert str(micros) in str(caught.value)
    assert _conv(micros, L.MICRO_TIMESTAMP, clamp=True) is clamped


@pytest.mark.unit
@pytest.mark.parametrize("value", [True, 1.5, "1369579858951000", [1]])
def test_micro_timestamp_non_integer_is_refused_even_with_clamp(value: Any) -> None:
    with pytest.raises(LogicalTypeError, match="integer"):
        _conv(value, L.MICRO_TIMESTAMP, clamp=True)


@pytest.mark.unit
@pytest.mark.parametrize("logical", [L.TIMESTAMP, L.CONNECT_TIMESTAMP])
def test_millisecond_timestamps(logical: LogicalType) -> None:
    assert _conv(1478267490123, logical) == datetime(2016, 11, 4, 13, 51, 30, 123000, tzinfo=UTC)
    assert _conv(9223372036825200, logical) is POSITIVE_INFINITY
    assert _conv(-9223372036832400, logical) is NEGATIVE_INFINITY


@pytest.mark.unit
def test_nano_timestamp_floors_to_microseconds() -> None:
    assert _conv(1478267490123456789, L.NANO_TIMESTAMP) == datetime(
        2016, 11, 4, 13, 51, 30, 123456, tzinfo=UTC
    )
    assert _conv(-1, L.NANO_TIMESTAMP) == datetime(1969, 12, 31, 23, 59, 59, 999999, tzinfo=UTC)


# --- ZonedTimestamp ------------------------------------------------------------------------------


@pytest.mark.unit
@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("2016-11-04T11:51:30.123456Z", datetime(2016, 11, 4, 11, 51, 30, 123456, tzinfo=UTC)),
        ("2016-11-04T13:51:30.123456+02:00", datetime(2016, 11, 4, 11, 51, 30, 123456, tzinfo=UTC)),
        ("2016-11-04T11:51:30.123456789Z", datetime(2016, 11, 4, 11, 51, 30, 123456, tzinfo=UTC)),
        ("2016-11-04T11:51:30Z", datetime(2016, 11, 4, 11, 51, 30, tzinfo=UTC)),
        ("2020-04-01T11:51:02.000000Z", datetime(2020, 4, 1, 11, 51, 2, tzinfo=UTC)),
        ("0001-01-01T00:00:00Z", datetime(1, 1, 1, tzinfo=UTC)),
    ],
)
def test_zoned_timestamp_parses_to_utc(text: str, expected: datetime) -> None:
    result = _conv(text, L.ZONED_TIMESTAMP)
    assert result == expected
    assert result.utcoffset() == timedelta(0)


@pytest.mark.unit
def test_zoned_timestamp_infinity_strings() -> None:
    assert _conv("infinity", L.ZONED_TIMESTAMP) is POSITIVE_INFINITY
    assert _conv("-infinity", L.ZONED_TIMESTAMP) is NEGATIVE_INFINITY


@pytest.mark.unit
@pytest.mark.parametrize(
    ("text", "clamped"),
    [
        ("+21016-11-04T06:51:30.123456Z", POSITIVE_INFINITY),
        ("+21016-11-04T06:51:30.000000Z", POSITIVE_INFINITY),
        ("+294247-01-01T23:59:59.999999Z", POSITIVE_INFINITY),
        ("-4713-12-31T23:59:59.999999Z", NEGATIVE_INFINITY),
        ("9999-12-31T23:00:00-05:00", POSITIVE_INFINITY),  # past datetime.max once in UTC
        ("0001-01-01T00:00:00+05:00", NEGATIVE_INFINITY),
    ],
)
def test_zoned_timestamp_years_python_cannot_hold_raise_unless_clamped(
    text: str, clamped: datetime
) -> None:
    with pytest.raises(LogicalTypeError) as caught:
        _conv(text, L.ZONED_TIMESTAMP)
    assert "after.col" in str(caught.value) and text in str(caught.value)
    assert _conv(text, L.ZONED_TIMESTAMP, clamp=True) is clamped


@pytest.mark.unit
@pytest.mark.parametrize(
    "text",
    [
        "2016-13-04T11:51:30Z",
        "+21016-02-30T00:00:00Z",
        "2016-11-04 11:51:30Z",
        "2016-11-04T11:51:30",
        "2016-11-04T24:00:00Z",
        "2016-11-04T11:51:30+24:00",
        "Infinity",
        "",
    ],
)
def test_zoned_timestamp_malformed_is_refused_even_with_clamp(text: str) -> None:
    with pytest.raises(LogicalTypeError, match=r"after\.col"):
        _conv(text, L.ZONED_TIMESTAMP, clamp=True)


# --- dates, times, durations ---------------------------------------------------------------------


@pytest.mark.unit
@pytest.mark.parametrize("logical", [L.DATE, L.CONNECT_DATE])
def test_date_from_epoch_days(logical: LogicalType) -> None:
    assert _conv(17109, logical) == date(2016, 11, 4)
    assert _conv(-1, logical) == date(1969, 12, 31)


@pytest.mark.unit
def test_date_infinity_sentinels_including_the_pre_fix_positive_value() -> None:
    assert _conv(2146033979, L.DATE) is DATE_POSITIVE_INFINITY  # +5877611-06-21
    assert _conv(-2147472691, L.DATE) is DATE_NEGATIVE_INFINITY  # -5877611-06-22
    assert _conv(-2147472692, L.DATE) is DATE_POSITIVE_INFINITY  # -5877611-06-21, dbz#2524


@pytest.mark.unit
def test_date_out_of_range_raises_unless_clamped() -> None:
    with pytest.raises(LogicalTypeError, match=r"after\.col.*3000000"):
        _conv(3_000_000, L.DATE)
    assert _conv(3_000_000, L.DATE, clamp=True) is DATE_POSITIVE_INFINITY
    assert _conv(-3_000_000, L.DATE, clamp=True) is DATE_NEGATIVE_INFINITY


@pytest.mark.unit
@pytest.mark.parametrize(
    ("logical", "value", "expected"),
    [
        (L.MICRO_TIME, 49_890_000_000, time(13, 51, 30)),
        (L.TIME, 49_890_123, time(13, 51, 30, 123000)),
        (L.CONNECT_TIME, 49_890_123, time(13, 51, 30, 123000)),
        (L.NANO_TIME, 49_890_123_456_789, time(13, 51, 30, 123456)),
        (L.MICRO_TIME, 0, time(0, 0)),
    ],
)
def test_times_since_midnight(logical: LogicalType, value: int, expected: time) -> None:
    assert _conv(value, logical) == expected


@pytest.mark.unit
def test_time_2400_raises_unless_clamped() -> None:
    with pytest.raises(LogicalTypeError, match=r"after\.col"):
        _conv(86_400_000_000, L.MICRO_TIME)
    assert _conv(86_400_000_000, L.MICRO_TIME, clamp=True) == time.max
    assert _conv(-1, L.MICRO_TIME, clamp=True) == time.min


@pytest.mark.unit
def test_zoned_time_keeps_its_offset() -> None:
    assert _conv("11:51:30.123789Z", L.ZONED_TIME) == time(11, 51, 30, 123789, tzinfo=UTC)
    result = _conv("13:51:30+02:00", L.ZONED_TIME)
    assert result == time(13, 51, 30, tzinfo=timezone(timedelta(hours=2)))
    assert result.utcoffset() == timedelta(hours=2)


@pytest.mark.unit
@pytest.mark.parametrize("text", ["11:61:00Z", "11:51:30", "1:02:03Z", "noon"])
def test_zoned_time_malformed_is_refused(text: str) -> None:
    with pytest.raises(LogicalTypeError, match=r"after\.col"):
        _conv(text, L.ZONED_TIME)


@pytest.mark.unit
def test_micro_duration_is_a_timedelta_and_overflow_raises_unless_clamped() -> None:
    assert _conv(3_723_000_004, L.MICRO_DURATION) == timedelta(
        hours=1, minutes=2, seconds=3, microseconds=4
    )
    huge = 10**20
    with pytest.raises(LogicalTypeError, match=r"after\.col"):
        _conv(huge, L.MICRO_DURATION)
    assert _conv(huge, L.MICRO_DURATION, clamp=True) == timedelta.max


# --- strings with meaning ------------------------------------------------------------------------


@pytest.mark.unit
def test_json_keeps_the_text_and_parses_on_demand() -> None:
    result = _conv('{"bar": "baz"}', L.JSON)
    assert isinstance(result, JsonText)
    assert result == '{"bar": "baz"}'
    assert result.parse() == {"bar": "baz"}
    with pytest.raises(LogicalTypeError):
        JsonText("{not json").parse()


@pytest.mark.unit
def test_uuid_enum_and_enum_set() -> None:
    text = "a0eebc99-9c0b-4ef8-bb6d-6bb9bd380a11"
    assert _conv(text, L.UUID) == uuid.UUID(text)
    assert _conv("PG-13", L.ENUM) == "PG-13"
    assert _conv("a,b", L.ENUM_SET) == ["a", "b"]
    assert _conv("", L.ENUM_SET) == []


@pytest.mark.unit
@pytest.mark.parametrize(
    ("logical", "value"),
    [
        (L.UUID, "{a0eebc99-9c0b-4ef8-bb6d-6bb9bd380a11}"),
        (L.UUID, "a0eebc99_9c0b_4ef8_bb6d_6bb9bd380a11"),
        (L.UUID, 12),
        (L.ENUM, 3),
        (L.JSON, {"bar": "baz"}),
        (L.BYTES, "AQ=?"),
    ],
)
def test_string_types_with_wrong_values_are_refused(logical: LogicalType, value: Any) -> None:
    with pytest.raises(LogicalTypeError, match=r"after\.col"):
        _conv(value, logical)


@pytest.mark.unit
def test_bytes_fields_are_base64_decoded_by_hint_and_by_schema_type() -> None:
    assert _conv("AQID", L.BYTES) == b"\x01\x02\x03"
    assert convert_value("AQID", ConnectSchema(type="bytes"), where="c") == b"\x01\x02\x03"


# --- schemas, nesting, unknown names -------------------------------------------------------------


@pytest.mark.unit
def test_arrays_structs_and_maps_are_converted_along_the_schema() -> None:
    micro_time = ConnectSchema(type="int64", name=L.MICRO_TIME.value)
    schema = ConnectSchema.from_json(
        {
            "type": "struct",
            "fields": [
                {
                    "type": "array",
                    "items": {"type": "int64", "name": L.MICRO_TIME.value},
                    "field": "a",
                },
                {
                    "type": "map",
                    "keys": {"type": "string"},
                    "values": {"type": "bytes"},
                    "field": "m",
                },
                {"type": "string", "name": "io.debezium.data.Unknown", "field": "u"},
            ],
        },
        "schema",
    )
    assert schema.fields is not None
    assert schema.fields["a"].items == micro_time
    value = {"a": [62_000_000, None], "m": {"k": "AQ=="}, "u": "kept", "extra": 1}
    assert convert_value(value, schema, where="after") == {
        "a": [time(0, 1, 2), None],
        "m": {"k": b"\x01"},
        "u": "kept",
        "extra": 1,
    }


@pytest.mark.unit
def test_array_schema_with_a_non_array_value_names_the_path() -> None:
    schema = ConnectSchema(type="array", items=ConnectSchema(type="int64"))
    with pytest.raises(DecodeError, match=r"after\.tags: schema says array"):
        convert_value("x", schema, where="after.tags")


@pytest.mark.unit
def test_unknown_logical_type_name_for_convert_logical_is_refused() -> None:
    with pytest.raises(LogicalTypeError, match="unknown logical type"):
        convert_logical(1, "io.debezium.time.Whatever")


@pytest.mark.unit
@pytest.mark.parametrize(
    ("schema", "message"),
    [
        ({"fields": {}}, r"schema\.fields: expected an array"),
        ({"fields": [{"field": "a"}, {"field": "a"}]}, "duplicate field 'a'"),
        ({"fields": [{"type": "int32"}]}, r"fields\[0\]\.field"),
        ({"parameters": {"scale": 2}}, r"parameters\.scale: expected a string"),
        ({"name": 5}, r"schema\.name"),
        ([], "expected a schema object"),
    ],
)
def test_malformed_schemas_are_refused_with_their_path(schema: Any, message: str) -> None:
    with pytest.raises(DecodeError, match=message):
        ConnectSchema.from_json(schema, "schema")


@pytest.mark.unit
def test_absurdly_deep_schema_is_refused() -> None:
    schema: dict[str, Any] = {"type": "int64"}
    for _ in range(100):
        schema = {"type": "array", "items": schema}
    with pytest.raises(DecodeError, match="nested deeper"):
        ConnectSchema.from_json(schema, "schema")


# --- column hints --------------------------------------------------------------------------------


@pytest.mark.unit
def test_column_type_validates_scale_and_accepts_the_debezium_name() -> None:
    assert ColumnType("io.debezium.time.MicroTimestamp").logical_type is L.MICRO_TIMESTAMP  # type: ignore[arg-type]
    assert ColumnType(L.DECIMAL, scale=2).to_schema() == ConnectSchema(
        name=L.DECIMAL.value, parameters={"scale": "2"}
    )
    with pytest.raises(ConfigError, match="scale"):
        ColumnType(L.DECIMAL)
    with pytest.raises(ConfigError, match="scale"):
        ColumnType(L.DATE, scale=1)
    with pytest.raises(ConfigError, match="unknown logical type"):
        ColumnType("io.debezium.time.Nope")  # type: ignore[arg-type]


# --- epoch microseconds and infinity -------------------------------------------------------------


@pytest.mark.unit
@pytest.mark.parametrize("micros", [1369579858951000, -1257206400000000, 0, -1, 253402300799999999])
def test_to_epoch_micros_round_trips_micro_timestamps(micros: int) -> None:
    assert to_epoch_micros(_conv(micros, L.MICRO_TIMESTAMP)) == micros


@pytest.mark.unit
def test_to_epoch_micros_of_dates_ints_and_offsets() -> None:
    assert to_epoch_micros(date(1970, 1, 2)) == 86_400_000_000
    assert to_epoch_micros(42) == 42
    plus_two = datetime(1970, 1, 1, 2, tzinfo=timezone(timedelta(hours=2)))
    assert to_epoch_micros(plus_two) == 0
    assert to_epoch_micros(POSITIVE_INFINITY) > to_epoch_micros(datetime(9999, 1, 1, tzinfo=UTC))
    assert to_epoch_micros(NEGATIVE_INFINITY) < to_epoch_micros(datetime(1, 1, 2, tzinfo=UTC))


@pytest.mark.unit
@pytest.mark.parametrize("value", [datetime(2020, 1, 1), True])
def test_to_epoch_micros_refuses_naive_datetimes_and_booleans(value: Any) -> None:
    with pytest.raises(LogicalTypeError):
        to_epoch_micros(value)


@pytest.mark.unit
def test_is_infinity_recognises_only_the_documented_values() -> None:
    assert is_infinity(POSITIVE_INFINITY) and is_infinity(NEGATIVE_INFINITY)
    assert is_infinity(DATE_POSITIVE_INFINITY) and is_infinity(DATE_NEGATIVE_INFINITY)
    assert not is_infinity(datetime(2020, 1, 1, tzinfo=UTC))
    assert not is_infinity(date(2020, 1, 1))
    assert not is_infinity(9223372036825200000)
