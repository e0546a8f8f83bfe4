"""Decoding of Debezium change events (PostgreSQL connector, JSON converter) into `ChangeEvent`s."""

from streams.decode.debezium import (
    NEW_KEY_HEADER,
    OLD_KEY_HEADER,
    DecodeOptions,
    RecordTooLargeDecodeError,
    decode_record,
)
from streams.decode.logical_types import (
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

__all__ = [
    "DATE_NEGATIVE_INFINITY",
    "DATE_POSITIVE_INFINITY",
    "NEGATIVE_INFINITY",
    "NEW_KEY_HEADER",
    "OLD_KEY_HEADER",
    "POSITIVE_INFINITY",
    "ColumnType",
    "ConnectSchema",
    "DecodeOptions",
    "JsonText",
    "LogicalType",
    "RecordTooLargeDecodeError",
    "convert_logical",
    "convert_value",
    "decode_record",
    "is_infinity",
    "to_epoch_micros",
]
