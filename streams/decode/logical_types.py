"""Debezium and Kafka Connect logical types, converted to Python values.

A field is converted only where its Connect schema names a logical type (the `name` and
`parameters` of the field schema in a `{schema, payload}` envelope) or, for schemaless records,
where a column hint (`ColumnType`) says so. Every other value keeps its JSON type.

What each logical type becomes:

- `org.apache.kafka.connect.data.Decimal` (base64 big-endian two's complement unscaled value,
  `scale` parameter) and `io.debezium.data.VariableScaleDecimal` (`{"scale": n, "value": base64}`)
  -> `decimal.Decimal`, exact (no context rounding). The `decimal.handling.mode=string` form
  (`"10.1111"`) is accepted for VariableScaleDecimal and for the `DECIMAL_STRING` hint.
  PostgreSQL's `NaN` (`"NAN"`/`"NaN"`) -> `Decimal("NaN")`; `"Infinity"`/`"-Infinity"` ->
  `Decimal("Infinity")`/`Decimal("-Infinity")`. Test them with `is_nan()`/`is_infinite()`.
- `io.debezium.time.{Timestamp, MicroTimestamp, NanoTimestamp}`, `org.apache.kafka.connect.data.
  Timestamp` (epoch ms/µs/ns) and `io.debezium.time.ZonedTimestamp` (ISO-8601 string) -> an aware
  `datetime` in UTC. A TIMESTAMP WITHOUT TIME ZONE is encoded by Debezium as if it were UTC, and
  is reported that way. Nanoseconds are floored to microseconds (`datetime` holds no more).
- `io.debezium.time.Date`, `org.apache.kafka.connect.data.Date` (epoch days) -> `date`.
- `io.debezium.time.{Time, MicroTime, NanoTime}`, `org.apache.kafka.connect.data.Time` (since
  midnight) -> naive `time`; `io.debezium.time.ZonedTime` -> `time` with its offset as `tzinfo`.
- `io.debezium.time.MicroDuration` -> `timedelta`.
- `io.debezium.data.Json` -> `JsonText` (a `str`; `.parse()` gives the parsed value),
  `io.debezium.data.Uuid` -> `uuid.UUID`, `io.debezium.data.Enum` -> `str`,
  `io.debezium.data.EnumSet` -> `list[str]`, fields of Connect type `bytes` (base64) -> `bytes`.

Policy for values Python cannot hold:

- Infinity. PostgreSQL's `infinity`/`-infinity` (the PgJDBC sentinels 9223372036825200000 and
  -9223372036832400000 in MicroTimestamp, and their millisecond form in Timestamp; the strings
  `"infinity"`/`"-infinity"` in ZonedTimestamp; Debezium's epoch-day sentinels in Date) become
  `POSITIVE_INFINITY`/`NEGATIVE_INFINITY` (`datetime.max`/`datetime.min` in UTC) or
  `DATE_POSITIVE_INFINITY`/`DATE_NEGATIVE_INFINITY` (`date.max`/`date.min`). They sort after/before
  every finite value, which is what version ordering needs. `is_infinity()` recognises them (the
  real instant 9999-12-31T23:59:59.999999Z is indistinguishable from infinity, by design).
- Out of range (a year outside 1..9999 such as `+21016-…`, `+294247-…`, `-4713-…`; a time of day
  outside [00:00, 24:00), including PostgreSQL's `24:00:00`; a duration beyond `timedelta`):
  `LogicalTypeError` naming the column and the value. With `clamp=True` the value is clamped to
  the same bounds as infinity (`time.min`/`time.max` for times, `timedelta.min`/`max` for
  durations) instead, i.e. it becomes indistinguishable from infinity.
- Malformed values (wrong JSON type for the logical type, bad base64, a month 13, a missing
  `scale`) always raise `LogicalTypeError`; `clamp` never hides them.
"""

from __future__ import annotations

import base64
import binascii
import json
import re
import uuid
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from datetime import UTC, date, datetime, time, timedelta, timezone
from decimal import Decimal, InvalidOperation
from enum import StrEnum
from typing import Any, Final

from ragcore.errors import ConfigError, DecodeError, LogicalTypeError

__all__ = [
    "DATE_NEGATIVE_INFINITY",
    "DATE_POSITIVE_INFINITY",
    "NEGATIVE_INFINITY",
    "PG_NEGATIVE_INFINITY_MICROS",
    "PG_POSITIVE_INFINITY_MICROS",
    "POSITIVE_INFINITY",
    "ColumnType",
    "ConnectSchema",
    "JsonText",
    "LogicalType",
    "convert_logical",
    "convert_value",
    "decode_base64",
    "is_infinity",
    "to_epoch_micros",
]


class LogicalType(StrEnum):
    """Logical type names, as they appear in a Connect field schema's `name`.

    `DECIMAL_STRING` and `BYTES` exist only as column hints: with a schema, a string-mode decimal
    is a plain `string` field and binary data is a `bytes` field with no name.
    """

    DECIMAL = "org.apache.kafka.connect.data.Decimal"
    VARIABLE_SCALE_DECIMAL = "io.debezium.data.VariableScaleDecimal"
    DECIMAL_STRING = "ragstream.DecimalString"
    TIMESTAMP = "io.debezium.time.Timestamp"
    MICRO_TIMESTAMP = "io.debezium.time.MicroTimestamp"
    NANO_TIMESTAMP = "io.debezium.time.NanoTimestamp"
    ZONED_TIMESTAMP = "io.debezium.time.ZonedTimestamp"
    DATE = "io.debezium.time.Date"
    TIME = "io.debezium.time.Time"
    MICRO_TIME = "io.debezium.time.MicroTime"
    NANO_TIME = "io.debezium.time.NanoTime"
    ZONED_TIME = "io.debezium.time.ZonedTime"
    MICRO_DURATION = "io.debezium.time.MicroDuration"
    CONNECT_TIMESTAMP = "org.apache.kafka.connect.data.Timestamp"
    CONNECT_DATE = "org.apache.kafka.connect.data.Date"
    CONNECT_TIME = "org.apache.kafka.connect.data.Time"
    JSON = "io.debezium.data.Json"
    UUID = "io.debezium.data.Uuid"
    ENUM = "io.debezium.data.Enum"
    ENUM_SET = "io.debezium.data.EnumSet"
    BYTES = "ragstream.Bytes"


#: PostgreSQL `infinity` / `-infinity` as PgJDBC encodes them (PGStatement.DATE_*_INFINITY).
PG_POSITIVE_INFINITY_MICROS: Final = 9223372036825200000
PG_NEGATIVE_INFINITY_MICROS: Final = -9223372036832400000

POSITIVE_INFINITY: Final = datetime.max.replace(tzinfo=UTC)
NEGATIVE_INFINITY: Final = datetime.min.replace(tzinfo=UTC)
DATE_POSITIVE_INFINITY: Final = date.max
DATE_NEGATIVE_INFINITY: Final = date.min

_EPOCH: Final = datetime(1970, 1, 1, tzinfo=UTC)
_EPOCH_DATE: Final = date(1970, 1, 1)
_MAX_MICROS: Final = 253402300799999999  # datetime.max, UTC, in epoch µs
_MIN_MICROS: Final = -62135596800000000  # datetime.min, UTC
_MAX_DAYS: Final = (date.max - _EPOCH_DATE).days
_MIN_DAYS: Final = (date.min - _EPOCH_DATE).days
_MICROS_PER_DAY: Final = 86_400_000_000
_INT32_MIN, _INT32_MAX = -(2**31), 2**31 - 1

# Epoch days Debezium writes for DATE 'infinity'/'-infinity' (PostgresValueConverter):
# +5877611-06-21 and -5877611-06-22. Before dbz#2524 'infinity' came out as -5877611-06-21
# (an int overflow); PostgreSQL cannot store that date, so it can only mean +infinity.
_DATE_POSITIVE_SENTINELS: Final = frozenset({2146033979, -2147472692})
_DATE_NEGATIVE_SENTINELS: Final = frozenset({-2147472691})

# Timestamp infinity per unit (units per second -> (positive, negative) sentinel sets). The raw
# PgJDBC values are accepted in every unit; Debezium's adaptive ms mode writes them divided by 1000.
_TS_SENTINELS: Final[Mapping[int, tuple[frozenset[int], frozenset[int]]]] = {
    1_000: (
        frozenset({PG_POSITIVE_INFINITY_MICROS, PG_POSITIVE_INFINITY_MICROS // 1000}),
        frozenset({PG_NEGATIVE_INFINITY_MICROS, PG_NEGATIVE_INFINITY_MICROS // 1000}),
    ),
    1_000_000: (
        frozenset({PG_POSITIVE_INFINITY_MICROS}),
        frozenset({PG_NEGATIVE_INFINITY_MICROS}),
    ),
    1_000_000_000: (
        frozenset({PG_POSITIVE_INFINITY_MICROS}),
        frozenset({PG_NEGATIVE_INFINITY_MICROS}),
    ),
}

_MAX_SCHEMA_DEPTH: Final = 64
_INT_PARAM = re.compile(r"-?[0-9]{1,10}", re.ASCII)
_DECIMAL_STRING = re.compile(
    r"[+-]?(?:[0-9]+(?:\.[0-9]*)?|\.[0-9]+)(?:[eE][+-]?[0-9]{1,9})?", re.ASCII
)
_DECIMAL_SPECIAL: Final = {
    "nan": Decimal("NaN"),
    "infinity": Decimal("Infinity"),
    "+infinity": Decimal("Infinity"),
    "-infinity": Decimal("-Infinity"),
}
_UUID = re.compile(
    r"[0-9a-f]{8}-?[0-9a-f]{4}-?[0-9a-f]{4}-?[0-9a-f]{4}-?[0-9a-f]{12}", re.ASCII | re.I
)
_OFFSET = r"(?P<tz>Z|[+-][0-9]{2}(?::?[0-9]{2}(?::?[0-9]{2})?)?)"
_ZONED_TIMESTAMP = re.compile(
    r"(?P<year>[+-]?[0-9]{4,18})-(?P<month>[0-9]{2})-(?P<day>[0-9]{2})"
    r"T(?P<hour>[0-9]{2}):(?P<minute>[0-9]{2})(?::(?P<second>[0-9]{2})(?:[.,](?P<frac>[0-9]{1,9}))?)?"
    + _OFFSET,
    re.ASCII,
)
_ZONED_TIME = re.compile(
    r"(?P<hour>[0-9]{2}):(?P<minute>[0-9]{2})(?::(?P<second>[0-9]{2})(?:[.,](?P<frac>[0-9]{1,9}))?)?"
    + _OFFSET,
    re.ASCII,
)


class JsonText(str):
    """The text of an `io.debezium.data.Json` column: a `str`, parsed only when asked."""

    __slots__ = ()

    def parse(self) -> Any:
        """The parsed JSON value; `LogicalTypeError` when the text is not JSON."""
        try:
            return json.loads(self)
        except (ValueError, RecursionError) as exc:
            raise LogicalTypeError(f"Json value is not valid JSON: {exc}") from exc


@dataclass(frozen=True, slots=True)
class ConnectSchema:
    """A Kafka Connect field schema as the JsonConverter writes it (only what decoding needs)."""

    type: str | None = None
    name: str | None = None
    parameters: Mapping[str, str] = field(default_factory=dict)
    fields: Mapping[str, ConnectSchema] | None = None  # struct
    items: ConnectSchema | None = None  # array
    values: ConnectSchema | None = None  # map

    @classmethod
    def from_json(cls, obj: object, path: str) -> ConnectSchema:
        """Read a schema object; `DecodeError` naming `path` when it is malformed."""
        return _schema_from_json(obj, path, 0)


def _schema_from_json(obj: object, path: str, depth: int) -> ConnectSchema:
    if depth > _MAX_SCHEMA_DEPTH:
        raise DecodeError(f"{path}: schema nested deeper than {_MAX_SCHEMA_DEPTH} levels")
    if not isinstance(obj, dict):
        raise DecodeError(f"{path}: expected a schema object, found {json_type(obj)}")
    type_ = obj.get("type")
    name = obj.get("name")
    if type_ is not None and not isinstance(type_, str):
        raise DecodeError(f"{path}.type: expected a string, found {json_type(type_)}")
    if name is not None and not isinstance(name, str):
        raise DecodeError(f"{path}.name: expected a string, found {json_type(name)}")
    raw_params = obj.get("parameters")
    params: dict[str, str] = {}
    if raw_params is not None:
        if not isinstance(raw_params, dict):
            raise DecodeError(
                f"{path}.parameters: expected an object, found {json_type(raw_params)}"
            )
        for key, value in raw_params.items():
            if not isinstance(value, str):
                raise DecodeError(
                    f"{path}.parameters.{key}: expected a string, found {json_type(value)}"
                )
            params[key] = value
    fields: dict[str, ConnectSchema] | None = None
    raw_fields = obj.get("fields")
    if raw_fields is not None:
        if not isinstance(raw_fields, list):
            raise DecodeError(f"{path}.fields: expected an array, found {json_type(raw_fields)}")
        fields = {}
        for index, raw_field in enumerate(raw_fields):
            where = f"{path}.fields[{index}]"
            if not isinstance(raw_field, dict):
                raise DecodeError(f"{where}: expected an object, found {json_type(raw_field)}")
            field_name = raw_field.get("field")
            if not isinstance(field_name, str):
                raise DecodeError(
                    f"{where}.field: expected a string, found {json_type(field_name)}"
                )
            if field_name in fields:
                raise DecodeError(f"{where}.field: duplicate field {field_name!r}")
            fields[field_name] = _schema_from_json(raw_field, where, depth + 1)
    items = obj.get("items")
    values = obj.get("values")
    return ConnectSchema(
        type=type_,
        name=name,
        parameters=params,
        fields=fields,
        items=None if items is None else _schema_from_json(items, f"{path}.items", depth + 1),
        values=None if values is None else _schema_from_json(values, f"{path}.values", depth + 1),
    )


@dataclass(frozen=True, slots=True)
class ColumnType:
    """A logical-type hint for one column of a schemaless topic (`schemas.enable=false`).

    `logical_type` may be given as a `LogicalType` or its string value (e.g. from a config file).
    `scale` is required for `DECIMAL` and refused for every other type.
    """

    logical_type: LogicalType
    scale: int | None = None

    def __post_init__(self) -> None:
        try:
            logical = LogicalType(self.logical_type)
        except ValueError as exc:
            raise ConfigError(f"unknown logical type {self.logical_type!r}") from exc
        object.__setattr__(self, "logical_type", logical)
        if logical is LogicalType.DECIMAL:
            if self.scale is None or isinstance(self.scale, bool):
                raise ConfigError("a DECIMAL column hint needs an integer scale")
            if not _INT32_MIN <= self.scale <= _INT32_MAX:
                raise ConfigError(f"DECIMAL scale {self.scale} is outside int32")
        elif self.scale is not None:
            raise ConfigError(f"scale applies to DECIMAL only, not to {logical.name}")

    def to_schema(self) -> ConnectSchema:
        """The field schema this hint stands for."""
        if self.logical_type is LogicalType.BYTES:
            return ConnectSchema(type="bytes")
        params = {} if self.scale is None else {"scale": str(self.scale)}
        return ConnectSchema(name=self.logical_type.value, parameters=params)


# --- public conversion entry points ------------------------------------------------------------


def convert_value(value: Any, schema: ConnectSchema, *, where: str, clamp: bool = False) -> Any:
    """Convert one JSON value as its field schema says; `where` names the column in errors.

    Structs, arrays and maps are walked along the schema; values with no logical type are
    returned unchanged (bytes fields are base64-decoded).
    """
    if value is None:
        return None
    if schema.name is not None:
        converter = _CONVERTERS.get(schema.name)
        if converter is not None:
            return converter(value, schema.parameters, where, clamp)
    if schema.type == "bytes":
        return _bytes(value, schema.parameters, where, clamp)
    if schema.type == "array" and schema.items is not None:
        if not isinstance(value, list):
            raise DecodeError(f"{where}: schema says array, found {json_type(value)}")
        items = schema.items
        return [
            convert_value(item, items, where=f"{where}[{i}]", clamp=clamp)
            for i, item in enumerate(value)
        ]
    if schema.type == "struct" and schema.fields is not None:
        if not isinstance(value, dict):
            raise DecodeError(f"{where}: schema says struct, found {json_type(value)}")
        fields = schema.fields
        return {
            key: (
                convert_value(item, fields[key], where=f"{where}.{key}", clamp=clamp)
                if key in fields
                else item
            )
            for key, item in value.items()
        }
    if schema.type == "map" and schema.values is not None and isinstance(value, dict):
        # The JsonConverter writes string-keyed maps as objects (others as [key, value] pairs,
        # which we leave alone: they carry no logical values in PostgreSQL's type mapping).
        values = schema.values
        return {
            key: convert_value(item, values, where=f"{where}.{key}", clamp=clamp)
            for key, item in value.items()
        }
    return value


def convert_logical(
    value: Any,
    logical_type: LogicalType | str,
    *,
    parameters: Mapping[str, str] | None = None,
    where: str = "value",
    clamp: bool = False,
) -> Any:
    """Convert one value of a named logical type (a name Debezium writes, or a `LogicalType`)."""
    name = logical_type.value if isinstance(logical_type, LogicalType) else logical_type
    if name == LogicalType.BYTES.value:
        schema = ConnectSchema(type="bytes")
    else:
        if name not in _CONVERTERS:
            raise LogicalTypeError(f"{where}: unknown logical type {name!r}")
        schema = ConnectSchema(name=name, parameters=dict(parameters or {}))
    return convert_value(value, schema, where=where, clamp=clamp)


def decode_base64(value: Any, *, where: str) -> bytes:
    """Bytes from the standard base64 text the JsonConverter writes for a `bytes` field."""
    return _b64(value, where, "bytes")


def is_infinity(value: object) -> bool:
    """True for the values that stand for PostgreSQL's `infinity` / `-infinity`."""
    if isinstance(value, datetime):
        return value in (POSITIVE_INFINITY, NEGATIVE_INFINITY)
    if isinstance(value, date):
        return value in (DATE_POSITIVE_INFINITY, DATE_NEGATIVE_INFINITY)
    return False


def to_epoch_micros(value: datetime | date | int) -> int:
    """Microseconds since the Unix epoch (UTC) of a decoded timestamp, a date, or an int.

    An int is taken to be epoch µs already (a schemaless MicroTimestamp). Naive datetimes are
    refused: the decoder never produces them and guessing their zone would be silently wrong.
    Used for `schemas.entities.EntityVersion.updated_at_us`; infinity maps to the extreme µs.
    """
    if isinstance(value, bool):
        raise LogicalTypeError(f"cannot read {value!r} as epoch microseconds")
    if isinstance(value, int):
        return value
    if isinstance(value, datetime):
        if value.tzinfo is None or value.utcoffset() is None:
            raise LogicalTypeError(f"naive datetime {value.isoformat()} has no time zone")
        delta = value - _EPOCH
    elif isinstance(value, date):
        delta = datetime(value.year, value.month, value.day, tzinfo=UTC) - _EPOCH
    else:
        raise LogicalTypeError(f"cannot read {json_type(value)} as epoch microseconds")
    return (delta.days * 86_400 + delta.seconds) * 1_000_000 + delta.microseconds


# --- converters --------------------------------------------------------------------------------

_Converter = Callable[[Any, Mapping[str, str], str, bool], Any]


def _short(value: object) -> str:
    text = repr(value)
    return text if len(text) <= 80 else text[:77] + "..."


def json_type(value: object) -> str:
    """The JSON type name of a decoded value, for error messages."""
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "boolean"
    if isinstance(value, int | float):
        return "number"
    if isinstance(value, str):
        return "string"
    if isinstance(value, list):
        return "array"
    if isinstance(value, dict):
        return "object"
    return type(value).__name__


def _fail(where: str, kind: str, value: object, reason: str) -> LogicalTypeError:
    return LogicalTypeError(f"{where}: {kind} value {_short(value)} {reason}")


def _require_int(value: Any, where: str, kind: str) -> int:
    if isinstance(value, bool) or not isinstance(value, int):
        raise _fail(where, kind, value, f"must be an integer, found {json_type(value)}")
    return value


def _require_str(value: Any, where: str, kind: str) -> str:
    if not isinstance(value, str):
        raise _fail(where, kind, value, f"must be a string, found {json_type(value)}")
    return value


def _b64(value: Any, where: str, kind: str) -> bytes:
    text = _require_str(value, where, kind)
    try:
        return base64.b64decode(text, validate=True)
    except (binascii.Error, ValueError) as exc:
        raise _fail(where, kind, value, f"is not valid base64 ({exc})") from exc


def _bytes(value: Any, params: Mapping[str, str], where: str, clamp: bool) -> bytes:
    return _b64(value, where, "bytes")


def _decimal_from_unscaled(raw: bytes, scale: int, where: str, kind: str, value: Any) -> Decimal:
    if not raw:
        raise _fail(where, kind, value, "has no bytes (an unscaled value needs at least one)")
    unscaled = int.from_bytes(raw, "big", signed=True)
    sign, digits, _ = Decimal(unscaled).as_tuple()
    # Built from the digit tuple: exact, whatever the current decimal context's precision.
    return Decimal((sign, digits, -scale))


def _scale(text: str | None, where: str, kind: str) -> int:
    if text is None:
        raise LogicalTypeError(f"{where}: {kind} field has no 'scale' parameter")
    if not _INT_PARAM.fullmatch(text) or not _INT32_MIN <= int(text) <= _INT32_MAX:
        raise LogicalTypeError(f"{where}: {kind} 'scale' parameter {_short(text)} is not an int32")
    return int(text)


def _decimal(value: Any, params: Mapping[str, str], where: str, clamp: bool) -> Decimal:
    kind = "Decimal"
    scale = _scale(params.get("scale"), where, kind)
    return _decimal_from_unscaled(_b64(value, where, kind), scale, where, kind, value)


def _decimal_string(value: Any, params: Mapping[str, str], where: str, clamp: bool) -> Decimal:
    kind = "decimal string"
    text = _require_str(value, where, kind)
    special = _DECIMAL_SPECIAL.get(text.lower())
    if special is not None:
        return special
    if not _DECIMAL_STRING.fullmatch(text):
        raise _fail(where, kind, value, "is not a decimal number")
    try:
        return Decimal(text)
    except InvalidOperation as exc:
        raise _fail(where, kind, value, "is not a representable decimal") from exc


def _variable_scale_decimal(
    value: Any, params: Mapping[str, str], where: str, clamp: bool
) -> Decimal:
    kind = "VariableScaleDecimal"
    if isinstance(value, str):  # decimal.handling.mode=string
        return _decimal_string(value, params, where, clamp)
    if not isinstance(value, dict):
        raise _fail(where, kind, value, f"must be an object or a string, found {json_type(value)}")
    scale = value.get("scale")
    if (
        isinstance(scale, bool)
        or not isinstance(scale, int)
        or not _INT32_MIN <= scale <= _INT32_MAX
    ):
        raise _fail(where, kind, value, "needs an int32 'scale'")
    raw = _b64(value.get("value"), f"{where}.value", kind)
    return _decimal_from_unscaled(raw, scale, where, kind, value)


def _timestamp(units_per_second: int, kind: str) -> _Converter:
    positive, negative = _TS_SENTINELS[units_per_second]

    def convert(value: Any, params: Mapping[str, str], where: str, clamp: bool) -> datetime:
        number = _require_int(value, where, kind)
        if number in positive:
            return POSITIVE_INFINITY
        if number in negative:
            return NEGATIVE_INFINITY
        micros = number * 1_000_000 // units_per_second  # floors: ns are truncated toward -inf
        if micros > _MAX_MICROS or micros < _MIN_MICROS:
            if clamp:
                return POSITIVE_INFINITY if micros > 0 else NEGATIVE_INFINITY
            raise _fail(where, kind, value, "is outside the years 1..9999 Python can hold")
        return _EPOCH + timedelta(microseconds=micros)

    return convert


def _offset(text: str, where: str, kind: str, value: Any) -> timezone:
    if text == "Z":
        return UTC
    digits = text[1:].replace(":", "")
    hours, minutes, seconds = int(digits[0:2]), int(digits[2:4] or 0), int(digits[4:6] or 0)
    delta = timedelta(hours=hours, minutes=minutes, seconds=seconds)
    if delta >= timedelta(hours=24) or minutes > 59 or seconds > 59:
        raise _fail(where, kind, value, "has an invalid UTC offset")
    return timezone(-delta if text[0] == "-" else delta)


def _micros_of_fraction(frac: str | None) -> int:
    # Up to 9 digits are written; datetime holds 6, so the rest is truncated.
    return int((frac or "0")[:6].ljust(6, "0"))


def _zoned_timestamp(value: Any, params: Mapping[str, str], where: str, clamp: bool) -> datetime:
    kind = "ZonedTimestamp"
    text = _require_str(value, where, kind)
    if text == "infinity":
        return POSITIVE_INFINITY
    if text == "-infinity":
        return NEGATIVE_INFINITY
    match = _ZONED_TIMESTAMP.fullmatch(text)
    if match is None:
        raise _fail(where, kind, value, "is not an ISO-8601 timestamp with offset")
    year = int(match["year"])
    month, day = int(match["month"]), int(match["day"])
    hour, minute = int(match["hour"]), int(match["minute"])
    second = int(match["second"] or 0)
    micro = _micros_of_fraction(match["frac"])
    tz = _offset(match["tz"], where, kind, value)
    # Validate the calendar fields on a year of the same 400-year cycle, so that an impossible
    # date is reported as malformed even when its year is also out of range.
    try:
        datetime(2000 + year % 400, month, day, hour, minute, second, micro)
    except ValueError as exc:
        raise _fail(where, kind, value, f"is not a valid timestamp ({exc})") from exc
    if not 1 <= year <= 9999:
        return _out_of_range_timestamp(year > 0, value, where, kind, clamp)
    try:
        return datetime(year, month, day, hour, minute, second, micro, tzinfo=tz).astimezone(UTC)
    except OverflowError:  # e.g. 9999-12-31T23:00-05:00, past datetime.max in UTC
        return _out_of_range_timestamp(year > 5000, value, where, kind, clamp)


def _out_of_range_timestamp(
    positive: bool, value: Any, where: str, kind: str, clamp: bool
) -> datetime:
    if clamp:
        return POSITIVE_INFINITY if positive else NEGATIVE_INFINITY
    raise _fail(where, kind, value, "is outside the years 1..9999 Python can hold")


def _date(value: Any, params: Mapping[str, str], where: str, clamp: bool) -> date:
    kind = "Date"
    days = _require_int(value, where, kind)
    if days in _DATE_POSITIVE_SENTINELS:
        return DATE_POSITIVE_INFINITY
    if days in _DATE_NEGATIVE_SENTINELS:
        return DATE_NEGATIVE_INFINITY
    if days > _MAX_DAYS or days < _MIN_DAYS:
        if clamp:
            return DATE_POSITIVE_INFINITY if days > 0 else DATE_NEGATIVE_INFINITY
        raise _fail(where, kind, value, "(epoch days) is outside the years 1..9999")
    return _EPOCH_DATE + timedelta(days=days)


def _time_of_micros(micros: int, value: Any, where: str, kind: str, clamp: bool) -> time:
    if not 0 <= micros < _MICROS_PER_DAY:
        if clamp:
            return time.max if micros > 0 else time.min
        raise _fail(where, kind, value, "is outside 00:00..24:00 (exclusive)")
    seconds, micro = divmod(micros, 1_000_000)
    minutes, second = divmod(seconds, 60)
    hour, minute = divmod(minutes, 60)
    return time(hour, minute, second, micro)


def _time(units_per_second: int, kind: str) -> _Converter:
    def convert(value: Any, params: Mapping[str, str], where: str, clamp: bool) -> time:
        number = _require_int(value, where, kind)
        return _time_of_micros(number * 1_000_000 // units_per_second, value, where, kind, clamp)

    return convert


def _zoned_time(value: Any, params: Mapping[str, str], where: str, clamp: bool) -> time:
    kind = "ZonedTime"
    text = _require_str(value, where, kind)
    match = _ZONED_TIME.fullmatch(text)
    if match is None:
        raise _fail(where, kind, value, "is not an ISO-8601 time with offset")
    hour, minute = int(match["hour"]), int(match["minute"])
    second = int(match["second"] or 0)
    micro = _micros_of_fraction(match["frac"])
    tz = _offset(match["tz"], where, kind, value)
    if minute > 59 or second > 59:
        raise _fail(where, kind, value, "is not a valid time of day")
    micros = ((hour * 60 + minute) * 60 + second) * 1_000_000 + micro
    return _time_of_micros(micros, value, where, kind, clamp).replace(tzinfo=tz)


def _micro_duration(value: Any, params: Mapping[str, str], where: str, clamp: bool) -> timedelta:
    kind = "MicroDuration"
    micros = _require_int(value, where, kind)
    try:
        return timedelta(microseconds=micros)
    except OverflowError as exc:
        if clamp:
            return timedelta.max if micros > 0 else timedelta.min
        raise _fail(where, kind, value, "is beyond what timedelta can hold") from exc


def _json(value: Any, params: Mapping[str, str], where: str, clamp: bool) -> JsonText:
    return JsonText(_require_str(value, where, "Json"))


def _uuid(value: Any, params: Mapping[str, str], where: str, clamp: bool) -> uuid.UUID:
    text = _require_str(value, where, "Uuid")
    # uuid.UUID alone would also take braces, a urn: prefix, underscores and non-ASCII digits.
    if not _UUID.fullmatch(text):
        raise _fail(where, "Uuid", value, "is not a UUID")
    return uuid.UUID(text)


def _enum(value: Any, params: Mapping[str, str], where: str, clamp: bool) -> str:
    return _require_str(value, where, "Enum")


def _enum_set(value: Any, params: Mapping[str, str], where: str, clamp: bool) -> list[str]:
    text = _require_str(value, where, "EnumSet")
    return text.split(",") if text else []


_CONVERTERS: Final[Mapping[str, _Converter]] = {
    LogicalType.DECIMAL.value: _decimal,
    LogicalType.VARIABLE_SCALE_DECIMAL.value: _variable_scale_decimal,
    LogicalType.DECIMAL_STRING.value: _decimal_string,
    LogicalType.TIMESTAMP.value: _timestamp(1_000, "Timestamp"),
    LogicalType.MICRO_TIMESTAMP.value: _timestamp(1_000_000, "MicroTimestamp"),
    LogicalType.NANO_TIMESTAMP.value: _timestamp(1_000_000_000, "NanoTimestamp"),
    LogicalType.CONNECT_TIMESTAMP.value: _timestamp(1_000, "Timestamp"),
    LogicalType.ZONED_TIMESTAMP.value: _zoned_timestamp,
    LogicalType.DATE.value: _date,
    LogicalType.CONNECT_DATE.value: _date,
    LogicalType.TIME.value: _time(1_000, "Time"),
    LogicalType.CONNECT_TIME.value: _time(1_000, "Time"),
    LogicalType.MICRO_TIME.value: _time(1_000_000, "MicroTime"),
    LogicalType.NANO_TIME.value: _time(1_000_000_000, "NanoTime"),
    LogicalType.ZONED_TIME.value: _zoned_time,
    LogicalType.MICRO_DURATION.value: _micro_duration,
    LogicalType.JSON.value: _json,
    LogicalType.UUID.value: _uuid,
    LogicalType.ENUM.value: _enum,
    LogicalType.ENUM_SET.value: _enum_set,
}
