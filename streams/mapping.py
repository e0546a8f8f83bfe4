"""Map a decoded SoR row to an `Entity`: which column is the tenant, the id, the content...

The default mapping fits the seed `entities` table:
`id, company_id, entity_type, name, content, metadata, content_hash, created_at, updated_at,
deleted_at`. Every deployment can override it per table (`TableMapping`), so other schemas work
without code. A row that cannot be mapped raises `MappingError` with the reason: the worker
sends such a record to the DLQ and keeps the partition moving.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from datetime import UTC, date, datetime, timedelta
from decimal import Decimal
from typing import Any

from pydantic import BaseModel, ConfigDict, Field

from ragstream.errors import MappingError
from schemas.entities import ContentFormat, EntityVersion

_EPOCH = datetime(1970, 1, 1, tzinfo=UTC)

_FORMAT_ALIASES: dict[str, ContentFormat] = {
    "text": ContentFormat.TEXT,
    "txt": ContentFormat.TEXT,
    "plain": ContentFormat.TEXT,
    "text/plain": ContentFormat.TEXT,
    "html": ContentFormat.HTML,
    "htm": ContentFormat.HTML,
    "text/html": ContentFormat.HTML,
    "markdown": ContentFormat.MARKDOWN,
    "md": ContentFormat.MARKDOWN,
    "text/markdown": ContentFormat.MARKDOWN,
}


class TableMapping(BaseModel):
    """How one SoR table's columns become an entity. Column names are the table's."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    tenant_column: str = "company_id"
    id_column: str = "id"
    type_column: str | None = "entity_type"
    default_entity_type: str = "ENTITY"
    title_column: str | None = "name"
    content_columns: tuple[str, ...] = ("content",)
    metadata_column: str | None = "metadata"
    #: Where the content's format is named: a column, else this key of the metadata object.
    format_column: str | None = None
    format_metadata_key: str | None = "format"
    default_format: ContentFormat = ContentFormat.TEXT
    content_hash_column: str | None = "content_hash"
    created_at_column: str | None = "created_at"
    updated_at_column: str | None = "updated_at"
    deleted_at_column: str | None = "deleted_at"
    #: Metadata keys copied to the index payload as filterable keyword fields.
    keyword_fields: tuple[str, ...] = ()
    #: Column or metadata key holding the event date used by date-range filters.
    event_date_field: str | None = None
    max_content_chars: int = Field(default=2_000_000, gt=0)


class RowView:
    """Typed accessors over one decoded row, raising `MappingError` with the column name."""

    def __init__(self, row: Mapping[str, Any], where: str) -> None:
        self._row = row
        self._where = where

    def has(self, column: str) -> bool:
        """True when the row carries the column (even if its value is null)."""
        return column in self._row

    def required_text(self, column: str) -> str:
        """A non-empty string (ints are accepted for id-like columns)."""
        if column not in self._row:
            raise MappingError(f"{self._where}: column {column!r} is missing")
        value = self._row[column]
        if isinstance(value, bool) or value is None:
            raise MappingError(f"{self._where}: column {column!r} is null or not text")
        if isinstance(value, int | str):
            text = str(value).strip()
            if text:
                return text
        raise MappingError(f"{self._where}: column {column!r} must be a non-empty string or int")

    def optional_text(self, column: str | None) -> str | None:
        """A string, or None when the column is absent or null."""
        if column is None or self._row.get(column) is None:
            return None
        value = self._row[column]
        if isinstance(value, str):
            return value
        if isinstance(value, int | float | Decimal) and not isinstance(value, bool):
            return str(value)
        raise MappingError(f"{self._where}: column {column!r} must be text, got {_kind(value)}")

    def optional_time(self, column: str | None) -> datetime | None:
        """A UTC datetime from a datetime, an ISO string or epoch microseconds (MicroTimestamp)."""
        if column is None or self._row.get(column) is None:
            return None
        return to_datetime(self._row[column], f"{self._where}: column {column!r}")

    def value(self, column: str | None) -> Any:
        """The raw decoded value, or None."""
        if column is None:
            return None
        return self._row.get(column)


def _kind(value: object) -> str:
    return type(value).__name__


def to_datetime(value: object, where: str) -> datetime:
    """Interpret a decoded temporal value as an aware UTC datetime.

    Accepts what the decoder produces for TIMESTAMP(TZ) columns: `datetime`, `date`, ISO-8601
    strings (schemaless ZonedTimestamp), and ints as epoch microseconds (schemaless
    MicroTimestamp, Debezium's default `time.precision.mode=adaptive`).
    """
    if isinstance(value, datetime):
        return value if value.tzinfo is not None else value.replace(tzinfo=UTC)
    if isinstance(value, date):
        return datetime(value.year, value.month, value.day, tzinfo=UTC)
    if isinstance(value, int) and not isinstance(value, bool):
        try:
            # integer arithmetic: a float division would round away microseconds
            return _EPOCH + timedelta(microseconds=value)
        except OverflowError as exc:
            raise MappingError(f"{where}: epoch microseconds {value} out of range") from exc
    if isinstance(value, str):
        text = value.strip().replace("Z", "+00:00") if value.strip().endswith("Z") else value
        try:
            parsed = datetime.fromisoformat(text)
        except ValueError as exc:
            raise MappingError(f"{where}: {value!r} is not an ISO-8601 timestamp") from exc
        return parsed if parsed.tzinfo is not None else parsed.replace(tzinfo=UTC)
    raise MappingError(f"{where}: {_kind(value)} is not a timestamp")


def epoch_us(moment: datetime) -> int:
    """Microseconds since the epoch, exact (no float rounding)."""
    delta = moment - _EPOCH
    return (delta.days * 86_400 + delta.seconds) * 1_000_000 + delta.microseconds


def parse_metadata(value: object, where: str) -> dict[str, Any]:
    """The metadata column as a dict: JSON/JSONB arrives as a string (io.debezium.data.Json)."""
    if value is None:
        return {}
    if isinstance(value, Mapping):
        return dict(value)
    if isinstance(value, str):
        if not value.strip():
            return {}
        try:
            parsed = json.loads(value)
        except json.JSONDecodeError as exc:
            raise MappingError(f"{where}: metadata is not valid JSON ({exc.msg})") from exc
        if isinstance(parsed, dict):
            return parsed
        raise MappingError(f"{where}: metadata must be a JSON object, got {_kind(parsed)}")
    raise MappingError(f"{where}: metadata must be a JSON object, got {_kind(value)}")


def parse_format(value: object, default: ContentFormat, where: str) -> ContentFormat:
    """A content format name (html, markdown/md, text...) to `ContentFormat`."""
    if value is None or value == "":
        return default
    if not isinstance(value, str):
        raise MappingError(f"{where}: format must be a string, got {_kind(value)}")
    try:
        return _FORMAT_ALIASES[value.strip().lower()]
    except KeyError:
        raise MappingError(
            f"{where}: unknown content format {value!r} (known: {sorted(_FORMAT_ALIASES)})"
        ) from None


def version_of(
    row: RowView, mapping: TableMapping, *, lsn: int | None, snapshot: bool
) -> EntityVersion:
    """The entity's SoR version: `updated_at` in µs when mapped, the LSN, the snapshot flag."""
    updated = row.optional_time(mapping.updated_at_column)
    return EntityVersion(
        updated_at_us=epoch_us(updated) if updated is not None else None,
        lsn=lsn,
        snapshot=snapshot,
    )
