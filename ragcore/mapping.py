"""Map a decoded SoR row to an `Entity`: which column is the tenant, the id, the content...

A system of record has many tables; each gets one declarative `TableMapping` (key columns,
tenant column or constant, content columns and how they combine, title, type, metadata,
soft-delete column). The default mapping fits the seed `entities` table:
`id, company_id, entity_type, name, content, metadata, content_hash, created_at, updated_at,
deleted_at`. `TableCatalog` finds a table by event source, topic or entity id. A row that cannot
be mapped raises `MappingError` with the reason: the worker sends such a record to the DLQ and
keeps the partition moving.
"""

from __future__ import annotations

import base64
import difflib
import json
import re
import string
from collections.abc import Iterator, Mapping, Sequence
from datetime import UTC, date, datetime, time, timedelta
from decimal import Decimal
from typing import Any, TypeVar
from urllib.parse import unquote
from uuid import UUID

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator, model_validator

from ragcore.documents.source import DocumentSource
from ragcore.errors import ConfigError, InvalidTenantError, MappingError
from ragcore.store.ids import TenantId
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
    """How one SoR table's rows become entities. Column names are the table's.

    One mapping per source table: decode, plan, TOAST refetch, Retrieve's verification,
    reconcile, reindex snapshots and `ragstream sor` all read the table through it. The defaults
    fit the seed `entities` table.

    Identity: an entity id is `<name>:<key>` (`entity_id`), so ids are unique across tables;
    a composite key's values are joined with commas (each value percent-encoded).
    """

    model_config = ConfigDict(frozen=True, extra="forbid")

    #: `schema.table` in the SoR (Debezium's `source.schema` and `source.table`).
    table: str = "public.entities"
    #: The table's name in entity ids and the `source_table` payload field (default: the table
    #: name without its schema).
    name: str | None = Field(default=None, pattern=r"^[A-Za-z_][A-Za-z0-9_-]{0,62}$")
    #: The Kafka topic of its change events (default: `<topic_prefix>.<schema>.<table>`).
    topic: str | None = None
    key_columns: tuple[str, ...] = Field(default=("id",), min_length=1)
    #: The column naming the tenant; None when the whole table belongs to `tenant`.
    tenant_column: str | None = "company_id"
    #: The tenant of every row when the table belongs to one tenant (a valid tenant name).
    tenant: str | None = None
    type_column: str | None = "entity_type"
    #: Entity type when there is no type column or it is null (default: the name, upper case).
    default_entity_type: str | None = None
    title_column: str | None = "name"
    content_columns: tuple[str, ...] = Field(default=("content",), min_length=1)
    #: How content columns combine: a `str.format` template over the column names (e.g.
    #: `"Subject: {subject}\n\n{body}"`); default: the non-empty columns joined by a blank line.
    content_template: str | None = None
    #: Columns holding JSON (JSON/JSONB arrive as text): as content they are rendered as
    #: `key: value` lines, as metadata they are parsed.
    json_columns: tuple[str, ...] = ()
    #: A JSON object column merged into the metadata.
    metadata_column: str | None = "metadata"
    #: Plain columns copied into the metadata under their own names.
    metadata_columns: tuple[str, ...] = ()
    #: Where the content's format is named: a column, else this key of the metadata object.
    format_column: str | None = None
    format_metadata_key: str | None = "format"
    default_format: ContentFormat = ContentFormat.TEXT
    content_hash_column: str | None = "content_hash"
    created_at_column: str | None = "created_at"
    updated_at_column: str | None = "updated_at"
    #: Soft-delete column: a row where it is set is deleted from the index.
    deleted_at_column: str | None = "deleted_at"
    #: Metadata keys copied to the index payload as filterable keyword fields.
    keyword_fields: tuple[str, ...] = ()
    #: Column or metadata key holding the event date used by date-range filters.
    event_date_field: str | None = None
    max_content_chars: int = Field(default=2_000_000, gt=0)
    #: A title longer than this is the row's MAPPING_ERROR: every chunk's payload carries the
    #: title, so an unbounded one multiplies by the entity's chunks (a title is a line, not a
    #: body: put long text in a content column).
    max_title_chars: int = Field(default=4_096, gt=0)
    #: A document column (PDF, DOCX, XLSX, CSV as bytes or as a reference to a file): when
    #: set, the entity's content is the document and `content_columns` are not read.
    document: DocumentSource | None = None

    @model_validator(mode="before")
    @classmethod
    def _legacy_id_column(cls, data: Any) -> Any:
        # `id_column` (one key column) predates composite keys; still accepted.
        if isinstance(data, Mapping) and "id_column" in data:
            data = dict(data)
            if "key_columns" in data:
                raise ValueError("give key_columns or id_column, not both")
            data["key_columns"] = (data.pop("id_column"),)
        return data

    @field_validator("tenant")
    @classmethod
    def _valid_tenant(cls, value: str | None) -> str | None:
        if value is None:
            return None
        try:
            return TenantId(value)
        except InvalidTenantError as exc:
            raise ValueError(str(exc)) from None

    @model_validator(mode="after")
    def _check(self) -> TableMapping:
        parts = self.table.split(".")
        if not 1 <= len(parts) <= 2 or not all(_IDENT.match(p) for p in parts):
            raise ValueError(f"table must be 'schema.table' (plain names), got {self.table!r}")
        if (self.tenant_column is None) == (self.tenant is None):
            raise ValueError(f"{self.table}: set exactly one of tenant_column and tenant")
        columns = [c for c in self.columns() if c is not None]
        bad = [c for c in columns if not _IDENT.match(c)]
        if bad:
            raise ValueError(f"{self.table}: not plain column names: {bad}")
        if len(set(self.key_columns)) != len(self.key_columns):
            raise ValueError(f"{self.table}: key_columns repeat a column")
        if self.content_template is not None:
            used = _template_fields(self.content_template, self.table)
            unknown = sorted(used - set(self.content_columns))
            if unknown:
                raise ValueError(
                    f"{self.table}: content_template names {unknown}, which are not "
                    f"content_columns {list(self.content_columns)}"
                )
        return self

    @property
    def schema_name(self) -> str:
        """The table's schema (`public` when the table is given without one)."""
        return self.table.split(".")[0] if "." in self.table else "public"

    @property
    def table_name(self) -> str:
        """The table name without its schema."""
        return self.table.split(".")[-1]

    @property
    def label(self) -> str:
        """The name in entity ids and payloads."""
        # `table_name` inlined: read a few times for every entity id Retrieve verifies
        return self.name or self.table.rpartition(".")[2]

    @property
    def entity_type_default(self) -> str:
        """The entity type of rows without a type column value."""
        return self.default_entity_type or self.label.upper()

    def topic_name(self, prefix: str) -> str:
        """The topic Debezium writes this table's changes to."""
        return self.topic or f"{prefix}.{self.schema_name}.{self.table_name}"

    @property
    def body_columns(self) -> tuple[str, ...]:
        """The columns the entity's content comes from (a TOAST placeholder in one of them
        means the row must be re-read)."""
        if self.document is not None:
            return (self.document.column,)
        return self.content_columns

    def verdict_columns(self) -> list[str] | None:
        """The columns a verification verdict reads when the table stores each row's content
        hash: the key, tenant, type, soft-delete and hash columns (None without a hash column:
        the hash is computed from the content, so every column is read)."""
        if self.content_hash_column is None:
            return None
        named = [
            *self.key_columns,
            self.tenant_column,
            self.type_column,
            self.deleted_at_column,
            self.content_hash_column,
        ]
        return list(dict.fromkeys(c for c in named if c is not None))

    def columns(self) -> list[str]:
        """Every column the mapping reads, without duplicates, in a stable order."""
        named = [
            *self.key_columns,
            self.tenant_column,
            self.type_column,
            self.title_column,
            *(self.document.columns() if self.document is not None else self.content_columns),
            self.metadata_column,
            *self.metadata_columns,
            self.format_column,
            self.content_hash_column,
            self.created_at_column,
            self.updated_at_column,
            self.deleted_at_column,
        ]
        if self.event_date_field is not None and self.event_date_field in self.metadata_columns:
            named.append(self.event_date_field)
        return list(dict.fromkeys(c for c in named if c is not None))

    def entity_id(self, key: Sequence[object]) -> str:
        """`<name>:<key values>`: unique across tables."""
        if len(key) != len(self.key_columns):
            raise MappingError(
                f"{self.table}: key has {len(key)} values, the table {len(self.key_columns)}"
            )
        return f"{self.label}:{','.join(_encode_key_part(v) for v in key)}"

    def key_of(self, entity_id: str) -> tuple[str, ...]:
        """The key values (as text) of one of this table's entity ids."""
        name, sep, rest = entity_id.partition(":")
        if not sep or name != self.label:
            raise MappingError(f"{entity_id!r} is not an entity id of table {self.label!r}")
        # `unquote` returns a value without `%` unchanged: the usual key has none
        parts = tuple(rest.split(",")) if "%" not in rest else tuple(map(unquote, rest.split(",")))
        if len(parts) != len(self.key_columns) or not all(parts):
            raise MappingError(
                f"{entity_id!r}: expected {len(self.key_columns)} key values "
                f"({', '.join(self.key_columns)})"
            )
        return parts

    def row_entity_id(self, row: RowView) -> str:
        """The entity id of a row (or a Kafka key) that carries the key columns."""
        return self.entity_id([row.required_text(c) for c in self.key_columns])

    def row_tenant(self, row: RowView) -> TenantId:
        """The row's tenant: its tenant column, or the table's constant tenant. A tenant name
        the index cannot hold is a MappingError (the record goes to the DLQ)."""
        if self.tenant is not None:
            return TenantId(self.tenant)  # validated into one (`_valid_tenant`)
        assert self.tenant_column is not None  # validated: exactly one is set
        return _tenant_name(row.required_text(self.tenant_column), row, self.tenant_column)

    def row_tenant_if_known(self, row: RowView) -> TenantId | None:
        """The tenant when the row carries it. A delete's `before` under REPLICA IDENTITY
        DEFAULT holds the key only: Debezium fills the other NOT NULL columns with empty
        values, so an empty tenant means unknown."""
        if self.tenant is not None:
            return TenantId(self.tenant)
        value = row.optional_text(self.tenant_column)
        if value is None or not value.strip():
            return None
        assert self.tenant_column is not None
        return _tenant_name(value.strip(), row, self.tenant_column)


def mapping_errors(position: int, item: object) -> list[str]:
    """What is wrong with one element of `RAGSTREAM_PLAN__TABLES` (empty: nothing), each
    message naming the table (`tables[n] (schema.table)`), the field and the accepted values
    or fields."""
    if isinstance(item, TableMapping):
        return []
    table = item.get("table") if isinstance(item, Mapping) else None
    where = f"tables[{position}]" + (f" ({table})" if isinstance(table, str) else "")
    if not isinstance(item, Mapping):
        return [f"{where}: a table mapping is a JSON object, got {type(item).__name__}"]
    try:
        TableMapping.model_validate(item)
    except ValidationError as exc:
        return [_mapping_error(where, error) for error in exc.errors()]
    return []


#: Fields of a mapping (and of its document) a message offers when a field is unknown.
_DOCUMENT_FIELDS = tuple(DocumentSource.model_fields)


def _mapping_error(where: str, error: Mapping[str, Any]) -> str:
    loc = [str(p) for p in error.get("loc", ())]
    field = ".".join(loc)
    message = str(error.get("msg", "invalid"))
    if error.get("type") == "extra_forbidden" and loc:
        fields = _DOCUMENT_FIELDS if loc[0] == "document" and len(loc) > 1 else _MAPPING_FIELDS
        close = difflib.get_close_matches(loc[-1], fields, n=1, cutoff=0.6)
        hint = f" (did you mean {close[0]!r}?)" if close else ""
        return f"{where}: unknown field {field!r}{hint}; the fields are: {', '.join(fields)}"
    if error.get("type") in ("tuple_type", "list_type") and loc:
        return f'{where}: {field}: {message} (a JSON list, e.g. ["id"])'
    message = message.removeprefix("Value error, ")
    return f"{where}: {field}: {message}" if field else f"{where}: {message}"


def _tenant_name(value: str, row: RowView, column: str) -> TenantId:
    try:
        return TenantId(value)
    except InvalidTenantError as exc:
        raise MappingError(f"{row.where}: column {column!r}: {exc}", column=column) from exc


def table_of_entity(entity_id: str) -> str:
    """The table name part of an entity id (`''` for an id without one)."""
    name, sep, _ = entity_id.partition(":")
    return name if sep else ""


_IDENT = re.compile(r"^[A-Za-z_][A-Za-z0-9_]{0,62}$")
_MAPPING_FIELDS = tuple(TableMapping.model_fields)
#: Characters that would make a key ambiguous in an entity id.
_KEY_UNSAFE = re.compile(r"[%,]")


def _encode_key_part(value: object) -> str:
    text = str(value)
    if not text:
        raise MappingError("an empty key value cannot identify an entity")
    if "%" not in text and "," not in text:
        return text  # nothing to encode (`_KEY_UNSAFE`): the usual key
    return _KEY_UNSAFE.sub(lambda m: f"%{ord(m.group()):02X}", text)


def _template_fields(template: str, where: str) -> set[str]:
    try:
        return {f for _, f, _, _ in string.Formatter().parse(template) if f}
    except ValueError as exc:
        raise ValueError(f"{where}: content_template is not a valid template ({exc})") from exc


_K = TypeVar("_K")


def _register(index: dict[_K, TableMapping], key: _K, mapping: TableMapping, what: str) -> None:
    if key in index:
        raise ConfigError(
            f"table mappings {index[key].table} and {mapping.table} share the {what} {key!r}"
        )
    index[key] = mapping


class TableCatalog:
    """Every mapped table, found by event source, topic, or entity id."""

    def __init__(self, tables: Sequence[TableMapping], topic_prefix: str) -> None:
        if not tables:
            raise ConfigError("no SoR table is mapped (RAGSTREAM_PLAN__TABLES)")
        self.tables = tuple(tables)
        self.topic_prefix = topic_prefix
        self._by_label: dict[str, TableMapping] = {}
        self._by_source: dict[tuple[str, str], TableMapping] = {}
        self._by_topic: dict[str, TableMapping] = {}
        for mapping in self.tables:
            _register(self._by_label, mapping.label, mapping, "name")
            _register(self._by_source, (mapping.schema_name, mapping.table_name), mapping, "table")
            _register(self._by_topic, mapping.topic_name(topic_prefix), mapping, "topic")

    def __iter__(self) -> Iterator[TableMapping]:
        return iter(self.tables)

    def topics(self) -> list[str]:
        """The change-event topics of every mapped table."""
        return list(self._by_topic)

    def for_topic(self, topic: str) -> TableMapping | None:
        """The table whose changes arrive on `topic`."""
        return self._by_topic.get(topic)

    def for_source(self, schema: str | None, table: str | None, topic: str) -> TableMapping:
        """The table of a change event: by its `source` block, else by its topic."""
        if table is not None:
            found = self._by_source.get((schema or "public", table))
            if found is not None:
                return found
        found = self._by_topic.get(topic)
        if found is not None:
            return found
        where = f"{schema}.{table}" if table is not None else f"topic {topic!r}"
        raise MappingError(
            f"no table mapping for {where} (mapped: {', '.join(m.table for m in self.tables)})"
        )

    def for_entity(self, entity_id: str) -> TableMapping | None:
        """The table an entity id belongs to; None when its table is not mapped."""
        return self._by_label.get(table_of_entity(entity_id))

    def by_label(self, label: str) -> TableMapping | None:
        """The table named `label` in entity ids."""
        return self._by_label.get(label)

    def require(self, label: str) -> TableMapping:
        """The table named `label`; ConfigError naming the mapped tables when there is none."""
        found = self._by_label.get(label)
        if found is None:
            names = ", ".join(m.label for m in self)
            raise ConfigError(f"no mapped table {label!r} (mapped: {names})")
        return found


class RowView:
    """Typed accessors over one decoded row, raising `MappingError` with the column name."""

    def __init__(self, row: Mapping[str, Any], where: str) -> None:
        self._row = row
        self._where = where

    @property
    def where(self) -> str:
        """Where the row came from (for error messages)."""
        return self._where

    def has(self, column: str) -> bool:
        """True when the row carries the column (even if its value is null)."""
        return column in self._row

    def required_text(self, column: str) -> str:
        """A non-empty string (ints are accepted for id-like columns)."""
        if column not in self._row:
            raise MappingError(f"{self._where}: column {column!r} is missing", column=column)
        value = self._row[column]
        if isinstance(value, bool) or value is None:
            raise MappingError(
                f"{self._where}: column {column!r} is null or not text", column=column
            )
        if isinstance(value, int | str | Decimal):
            text = str(value).strip()
            if text:
                return _unicode_text(text, self._where, column)
        raise MappingError(
            f"{self._where}: column {column!r} must be a non-empty string or int", column=column
        )

    def optional_text(self, column: str | None) -> str | None:
        """A string, or None when the column is absent or null."""
        if column is None or self._row.get(column) is None:
            return None
        value = self._row[column]
        if isinstance(value, str):
            return _unicode_text(value, self._where, column)
        if isinstance(value, int | float | Decimal) and not isinstance(value, bool):
            return str(value)
        raise MappingError(
            f"{self._where}: column {column!r} must be text, got {_kind(value)}", column=column
        )

    def optional_time(self, column: str | None) -> datetime | None:
        """A UTC datetime from a datetime, an ISO string or epoch microseconds (MicroTimestamp)."""
        if column is None or self._row.get(column) is None:
            return None
        try:
            return to_datetime(self._row[column], f"{self._where}: column {column!r}")
        except MappingError as exc:
            exc.column = column
            raise

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
        return _in_utc(value, value, where)
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
        return _in_utc(parsed, value, where)
    raise MappingError(f"{where}: {_kind(value)} is not a timestamp")


def _in_utc(moment: datetime, value: object, where: str) -> datetime:
    """`moment` in UTC (naive: taken as UTC). A moment at the edge of the calendar with an
    offset has no UTC datetime (`9999-12-31T23:59:59-05:00`): the row's fault, not a crash
    where a payload writes it."""
    if moment.tzinfo is None:
        return moment.replace(tzinfo=UTC)
    try:
        return moment.astimezone(UTC)
    except OverflowError as exc:
        raise MappingError(f"{where}: {value!r} is out of range in UTC") from exc


def epoch_us(moment: datetime) -> int:
    """Microseconds since the epoch, exact (no float rounding)."""
    delta = moment - _EPOCH
    return (delta.days * 86_400 + delta.seconds) * 1_000_000 + delta.microseconds


#: How deep a JSON value (a metadata object, a JSON column) may nest. Python's parser stops at
#: its recursion limit with a RecursionError, and every later walk of the value (rendering,
#: payloads) recurses too: a deeper value is refused as the row's fault, naming the column.
MAX_JSON_DEPTH = 64


def json_depth(value: object, limit: int = MAX_JSON_DEPTH) -> int:
    """How deep `value` nests (a scalar: 0, `[]`: 1), counted without recursion; stops counting
    past `limit` (returns `limit + 1`)."""
    deepest = 0
    stack: list[tuple[object, int]] = [(value, 0)]
    while stack:
        item, depth = stack.pop()
        if isinstance(item, Mapping | list | tuple):
            depth += 1
            if depth > limit:
                return limit + 1
            deepest = max(deepest, depth)
            children = item.values() if isinstance(item, Mapping) else item
            stack.extend((child, depth) for child in children)
    return deepest


def _loads(text: str, where: str, what: str, column: str | None) -> object:
    """JSON text parsed, or the row's MappingError (invalid, or nested past `MAX_JSON_DEPTH`)."""
    try:
        parsed: object = json.loads(text)
    except json.JSONDecodeError as exc:
        raise MappingError(f"{where}: {what} is not valid JSON ({exc.msg})", column=column) from exc
    except ValueError as exc:
        # an integer of more than `sys.get_int_max_str_digits()` digits (4300 by default)
        raise MappingError(f"{where}: {what} is not usable JSON ({exc})", column=column) from exc
    except RecursionError:
        raise MappingError(
            f"{where}: {what} nests deeper than {MAX_JSON_DEPTH} levels", column=column
        ) from None
    _check_depth(parsed, where, what, column)
    return parsed


def _check_depth(value: object, where: str, what: str, column: str | None) -> None:
    """Refuse a JSON value nested past `MAX_JSON_DEPTH`, or holding a lone surrogate in a key
    or string (`_unicode_text`)."""
    if json_depth(value) > MAX_JSON_DEPTH:
        raise MappingError(
            f"{where}: {what} nests deeper than {MAX_JSON_DEPTH} levels", column=column
        )
    stack: list[object] = [value]
    while stack:  # bounded by the depth checked above
        item = stack.pop()
        if isinstance(item, str):
            _unicode_text(item, where, column, what)
        elif isinstance(item, Mapping):
            stack.extend(item.keys())
            stack.extend(item.values())
        elif isinstance(item, list | tuple):
            stack.extend(item)


#: A UTF-16 surrogate code point: never a character on its own.
_SURROGATE = re.compile(r"[\ud800-\udfff]")


def _unicode_text(text: str, where: str, column: str | None, what: str | None = None) -> str:
    """`text`, or the row's MappingError when it holds a lone surrogate: a JSON escape such as
    `\\ud800` decodes to one, and no UTF-8 consumer (the index payloads, the DLQ headers'
    readers, a SoR query) can take it."""
    if not text.isascii():
        found = _SURROGATE.search(text)
        if found is not None:
            named = what or f"column {column!r}"
            raise MappingError(
                f"{where}: {named} holds a lone surrogate (U+{ord(found.group()):04X}), "
                "which is not Unicode text",
                column=column,
            )
    return text


def parse_metadata(value: object, where: str, column: str | None = None) -> dict[str, Any]:
    """The metadata column as a dict: JSON/JSONB arrives as a string (io.debezium.data.Json)."""
    if value is None:
        return {}
    if isinstance(value, Mapping):
        _check_depth(value, where, "metadata", column)
        return dict(value)
    if isinstance(value, str):
        if not value.strip():
            return {}
        parsed = _loads(value, where, "metadata", column)
        if isinstance(parsed, dict):
            return parsed
        raise MappingError(
            f"{where}: metadata must be a JSON object, got {_kind(parsed)}", column=column
        )
    raise MappingError(
        f"{where}: metadata must be a JSON object, got {_kind(value)}", column=column
    )


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


def column_text(row: RowView, column: str, mapping: TableMapping) -> str:
    """One content column as text: JSON columns rendered as `key: value` lines."""
    value = row.value(column)
    if value is None:
        return ""
    if column in mapping.json_columns or isinstance(value, Mapping | list):
        return render_json(parse_json(value, f"{row.where}: column {column!r}", column))
    return row.optional_text(column) or ""


def content_of(row: RowView, mapping: TableMapping) -> str:
    """The entity text: the content columns combined as the mapping says."""
    values = {c: column_text(row, c, mapping) for c in mapping.content_columns}
    if mapping.content_template is None:
        return "\n\n".join(v for v in values.values() if v)
    return mapping.content_template.format_map(values).strip()


def metadata_of(row: RowView, mapping: TableMapping) -> dict[str, Any]:
    """The metadata object column merged with the copied metadata columns."""
    metadata = parse_metadata(
        row.value(mapping.metadata_column), row.where, mapping.metadata_column
    )
    for column in mapping.metadata_columns:
        value = row.value(column)
        if column in mapping.json_columns and value is not None:
            value = parse_json(value, f"{row.where}: column {column!r}", column)
        else:
            _check_depth(value, row.where, f"column {column!r}", column)
        metadata[column] = _plain(value)
    return metadata


def parse_json(value: object, where: str, column: str | None = None) -> object:
    """A JSON column's value (a string for io.debezium.data.Json, or already parsed), nested
    at most `MAX_JSON_DEPTH` levels."""
    if isinstance(value, str):
        return _loads(value, where, "the value", column)
    _check_depth(value, where, "the value", column)
    return value


def render_json(value: object, prefix: str = "") -> str:
    """JSON as readable text: one `path: value` line per scalar, in document order."""
    lines: list[str] = []
    _render(value, prefix, lines)
    return "\n".join(lines)


def _render(value: object, path: str, lines: list[str]) -> None:
    if isinstance(value, Mapping):
        for key, item in value.items():
            _render(item, f"{path}.{key}" if path else str(key), lines)
    elif isinstance(value, list):
        if all(not isinstance(v, Mapping | list) for v in value):
            text = ", ".join(_scalar(v) for v in value)
            lines.append(f"{path}: {text}" if path else text)
        else:
            for n, item in enumerate(value):
                _render(item, f"{path}[{n}]", lines)
    elif value is not None:
        lines.append(f"{path}: {_scalar(value)}" if path else _scalar(value))


def _scalar(value: object) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    return str(value)


def _plain(value: object) -> object:
    """A metadata value as JSON holds it (the decoder yields typed values: datetimes, dates,
    times, decimals, UUIDs, bytes)."""
    if isinstance(value, datetime | date | time):
        return value.isoformat()
    if isinstance(value, Decimal | UUID):
        return str(value)
    if isinstance(value, bytes | bytearray):
        return base64.b64encode(value).decode("ascii")
    if isinstance(value, list | tuple):
        return [_plain(v) for v in value]
    if isinstance(value, Mapping):
        return {str(k): _plain(v) for k, v in value.items()}
    return value
