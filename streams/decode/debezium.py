"""Decode Debezium change events (PostgreSQL connector, JsonConverter) into `ChangeEvent`s.

What is accepted:

- Keys and values with or without the JsonConverter envelope. A document is an envelope when it
  is an object with exactly the keys `schema` and `payload`, `schema` being an object or null;
  the schema then drives logical-type conversion (`streams.decode.logical_types`). Without a
  schema, `DecodeOptions.column_types` hints do (keys `column`, `table.column` or
  `schema.table.column`, the most qualified winning; the table comes from `source` or, failing
  that, from the topic `<prefix>.<schema>.<table>`). Hints are ignored when a schema is present.
- A null value -> `TOMBSTONE` (and so is an envelope whose payload is null); the key is still
  decoded. A topic starting with `heartbeat_topic_prefix` -> `HEARTBEAT`, key and value unread.
- `op` c/u/d/r -> `CHANGE`; t -> `TRUNCATE`; m -> `MESSAGE` (prefix, base64 content -> bytes).
- A transaction boundary of `provide.transaction.metadata=true` (no `op`; `status` BEGIN or END,
  an `id`; on `<prefix>.transaction`) -> `TRANSACTION`; the `transaction` block of change
  events is ignored like any unknown field.
- `source` -> `SourceInfo`; `snapshot` may be a string enum, a boolean, null or missing (FALSE).
  Unknown fields anywhere (`ts_us`, `ts_ns`, `transaction`, MySQL's `file`...) are ignored.
- The TOAST placeholder (`toast_placeholder`, as the whole value, in its base64 or hex form for
  binary columns, or as an element of an array column) is removed from `before`/`after`; the
  names removed from `after` are listed in `unavailable_columns`. It is never returned as text.
- Headers `__debezium.oldkey` / `__debezium.newkey` (a primary-key change) -> `old_key`/`new_key`.
- `envelope="unwrapped"` (ExtractNewRecordState): the value is the flat row. `__deleted`
  ("true"/true) makes it a delete whose row is `before`. `__op`, when present, gives the op;
  otherwise the op is `unwrapped_default_op` (default `u`: the row as it is now, an upsert
  with no before image; the serde-unwrapped fixture carries no op at all). The metadata fields
  the SMT adds (`__op`, `__deleted`, `__ts_ms`, `__table`, `__lsn`, `__source_*`, ...) are read
  into `source`/`ts_ms` and removed from the row. Metadata in headers is not read.

What is refused, always with a `DecodeError` (subclass) whose message names the field path:

- bytes that are not UTF-8, not JSON, empty, or nested too deeply; a key, value, row, `source`
  or `message` that is not an object where one is required; `before`/`after` that is neither an
  object nor null; a malformed schema; wrong JSON types in `source` or top-level `ts_ms`;
- a value with no `op` (saying what it found instead), an unknown op
  (`UnsupportedOperationError`), c/u/r without `after`, d with an `after`, an unwrapped row
  that is really a full envelope (or the reverse), `__deleted` contradicting `__op`;
- an unknown `source.snapshot` marker; differing duplicate old/new-key headers;
- logical values Python cannot hold or that are malformed (`LogicalTypeError`, see
  `logical_types` for the infinity and clamp policy);
- records over `max_record_bytes` (key + value + header names and values):
  `RecordTooLargeDecodeError`, which is both a `DecodeError` and a `RecordTooLargeError`.
"""

from __future__ import annotations

import base64
import json
from collections.abc import Mapping
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Any, Final, Literal

from ragcore.errors import (
    ConfigError,
    DecodeError,
    RecordTooLargeError,
    UnsupportedOperationError,
)
from schemas.events import (
    TOAST_PLACEHOLDER,
    ChangeEvent,
    Op,
    RawRecord,
    RecordKind,
    SnapshotMarker,
    SourceInfo,
)
from streams.decode.logical_types import (
    ColumnType,
    ConnectSchema,
    convert_value,
    decode_base64,
    json_type,
)

__all__ = [
    "NEW_KEY_HEADER",
    "OLD_KEY_HEADER",
    "DecodeOptions",
    "RecordTooLargeDecodeError",
    "decode_record",
]

OLD_KEY_HEADER: Final = "__debezium.oldkey"
NEW_KEY_HEADER: Final = "__debezium.newkey"

_CHANGE_OPS: Final = frozenset({Op.CREATE, Op.UPDATE, Op.DELETE, Op.READ})
_SOURCE_FIELDS: Final = (
    "version",
    "connector",
    "name",
    "ts_ms",
    "ts_us",
    "ts_ns",
    "snapshot",
    "db",
    "sequence",
    "schema",
    "table",
    "txId",
    "lsn",
    "xmin",
)
# SourceInfo attribute -> Debezium `source` key.
_SOURCE_KEYS: Final[Mapping[str, str]] = {
    "connector": "connector",
    "name": "name",
    "db": "db",
    "schema": "schema",
    "table": "table",
    "ts_ms": "ts_ms",
    "snapshot": "snapshot",
    "lsn": "lsn",
    "tx_id": "txId",
    "sequence": "sequence",
}
_UNWRAPPED_META: Final = frozenset(
    {"__deleted", "__op", "__ts_ms", "__ts_us", "__ts_ns"} | {f"__{f}" for f in _SOURCE_FIELDS}
)
_UNWRAPPED_META_PREFIXES: Final = ("__source_", "__transaction_")


class RecordTooLargeDecodeError(DecodeError, RecordTooLargeError):
    """A record exceeds `DecodeOptions.max_record_bytes`; it is not parsed at all.

    Both a `DecodeError` (it goes wherever undecodable records go) and a `RecordTooLargeError`.
    """

    code = "RECORD_TOO_LARGE"

    def __init__(self, message: str, *, size: int, limit: int) -> None:
        super().__init__(message)
        self.size = size
        self.limit = limit


@dataclass(frozen=True, slots=True)
class _Hints:
    """Column hints split by how qualified their key is."""

    by_column: Mapping[str, ConnectSchema]
    by_table: Mapping[str, Mapping[str, ConnectSchema]]
    by_schema_table: Mapping[tuple[str, str], Mapping[str, ConnectSchema]]

    @classmethod
    def build(cls, column_types: Mapping[str, ColumnType]) -> _Hints:
        by_column: dict[str, ConnectSchema] = {}
        by_table: dict[str, dict[str, ConnectSchema]] = {}
        by_schema_table: dict[tuple[str, str], dict[str, ConnectSchema]] = {}
        for key, column_type in column_types.items():
            if not isinstance(column_type, ColumnType):
                raise ConfigError(f"column_types[{key!r}] must be a ColumnType")
            parts = key.split(".")
            if any(not part for part in parts) or len(parts) > 3:
                raise ConfigError(
                    f"column_types key {key!r} must be 'column', 'table.column' or "
                    "'schema.table.column'"
                )
            schema = column_type.to_schema()
            if len(parts) == 1:
                by_column[parts[0]] = schema
            elif len(parts) == 2:
                by_table.setdefault(parts[0], {})[parts[1]] = schema
            else:
                by_schema_table.setdefault((parts[0], parts[1]), {})[parts[2]] = schema
        return cls(by_column, by_table, by_schema_table)

    def for_table(self, schema: str | None, table: str | None) -> Mapping[str, ConnectSchema]:
        if table is None or (not self.by_table and not self.by_schema_table):
            return self.by_column
        merged = dict(self.by_column)
        merged.update(self.by_table.get(table, {}))
        if schema is not None:
            merged.update(self.by_schema_table.get((schema, table), {}))
        return merged


@dataclass(frozen=True, slots=True)
class DecodeOptions:
    """How to read the records of one set of Debezium topics.

    Attributes:
        envelope: "debezium" for the full change-event envelope, "unwrapped" for rows flattened
            by ExtractNewRecordState.
        heartbeat_topic_prefix: topics starting with it carry heartbeats (Debezium's
            `topic.heartbeat.prefix`, default `__debezium-heartbeat`).
        column_types: logical-type hints for schemaless topics, by `column`, `table.column` or
            `schema.table.column`.
        max_record_bytes: refuse larger records (key + value + headers) before parsing them.
        clamp_out_of_range: clamp timestamps/dates/times Python cannot hold instead of raising
            `LogicalTypeError` (see `logical_types`).
        toast_placeholder: Debezium's `unavailable.value.placeholder`.
        unwrapped_default_op: the op of an unwrapped row with no `__op` and no `__deleted`
            (c, u or r).
    """

    envelope: Literal["debezium", "unwrapped"] = "debezium"
    heartbeat_topic_prefix: str = "__debezium-heartbeat"
    column_types: Mapping[str, ColumnType] = field(default_factory=dict)
    max_record_bytes: int | None = None
    clamp_out_of_range: bool = False
    toast_placeholder: str = TOAST_PLACEHOLDER
    unwrapped_default_op: Op = Op.UPDATE
    _hints: _Hints = field(init=False, repr=False, compare=False)
    _placeholders: frozenset[str] = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        if self.envelope not in ("debezium", "unwrapped"):
            raise ConfigError(f"envelope must be 'debezium' or 'unwrapped', not {self.envelope!r}")
        if not self.heartbeat_topic_prefix:
            raise ConfigError(
                "heartbeat_topic_prefix must not be empty (it would match every topic)"
            )
        if self.max_record_bytes is not None and self.max_record_bytes <= 0:
            raise ConfigError(f"max_record_bytes must be positive, not {self.max_record_bytes}")
        if not self.toast_placeholder:
            raise ConfigError("toast_placeholder must not be empty")
        if self.unwrapped_default_op not in (Op.CREATE, Op.UPDATE, Op.READ):
            raise ConfigError(
                f"unwrapped_default_op must be c, u or r, not {self.unwrapped_default_op!r}"
            )
        raw = self.toast_placeholder.encode("utf-8")
        # A private read-only copy: the hints below are derived once and must not drift.
        object.__setattr__(self, "column_types", MappingProxyType(dict(self.column_types)))
        object.__setattr__(self, "_hints", _Hints.build(self.column_types))
        # Binary columns carry the placeholder's bytes, written in the binary.handling.mode.
        object.__setattr__(
            self,
            "_placeholders",
            frozenset({self.toast_placeholder, base64.b64encode(raw).decode(), raw.hex()}),
        )


_DEFAULT_OPTIONS: Final = DecodeOptions()


def _is_transaction_marker(payload: Mapping[str, Any]) -> bool:
    """A BEGIN/END record of Debezium's transaction metadata topic."""
    return (
        "op" not in payload
        and not {"source", "before", "after"} & payload.keys()
        and payload.get("status") in ("BEGIN", "END")
        and isinstance(payload.get("id"), str)
    )


def decode_record(raw: RawRecord, options: DecodeOptions | None = None) -> ChangeEvent:
    """Decode one Kafka record from a Debezium topic.

    Raises `ragcore.errors.DecodeError` (or a subclass: `LogicalTypeError`,
    `UnsupportedOperationError`, `RecordTooLargeDecodeError`) for anything it cannot read; see
    the module docstring for what is accepted and refused.
    """
    opts = options if options is not None else _DEFAULT_OPTIONS
    try:
        return _Decoder(raw, opts).decode()
    except RecursionError as exc:
        raise DecodeError("record is nested too deeply to decode") from exc


# --- JSON helpers ----------------------------------------------------------------------------


def _keys(obj: Mapping[str, Any]) -> str:
    names = sorted(obj)
    shown = ", ".join(repr(name[:40]) for name in names[:8])
    more = f", ... ({len(names)} keys)" if len(names) > 8 else ""
    return f"[{shown}{more}]"


def _parse_json(data: bytes, path: str) -> Any:
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise DecodeError(f"{path}: not UTF-8 ({exc.reason} at byte {exc.start})") from exc
    if not text.strip():
        raise DecodeError(f"{path}: empty (a tombstone is a null value, not an empty one)")
    try:
        return json.loads(text)
    except RecursionError as exc:
        raise DecodeError(f"{path}: JSON nested too deeply") from exc
    except ValueError as exc:
        raise DecodeError(f"{path}: not JSON ({exc})") from exc


def _split_envelope(doc: Any, path: str) -> tuple[ConnectSchema | None, Any, str]:
    """(schema, payload, payload path) of a JsonConverter document."""
    if (
        isinstance(doc, dict)
        and doc.keys() == {"schema", "payload"}
        and (doc["schema"] is None or isinstance(doc["schema"], dict))
    ):
        raw_schema = doc["schema"]
        schema = (
            None if raw_schema is None else ConnectSchema.from_json(raw_schema, f"{path}.schema")
        )
        return schema, doc["payload"], f"{path}.payload"
    return None, doc, path


def _opt_int(obj: Mapping[str, Any], key: str, path: str) -> int | None:
    value = obj.get(key)
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int):
        raise DecodeError(f"{path}.{key}: expected an integer or null, found {json_type(value)}")
    return value


def _opt_str(obj: Mapping[str, Any], key: str, path: str) -> str | None:
    value = obj.get(key)
    if value is None or isinstance(value, str):
        return value
    raise DecodeError(f"{path}.{key}: expected a string or null, found {json_type(value)}")


def _snapshot(value: Any, path: str) -> SnapshotMarker:
    if value is None:
        return SnapshotMarker.FALSE
    if isinstance(value, bool):  # the docs' schema types it as a boolean
        return SnapshotMarker.TRUE if value else SnapshotMarker.FALSE
    if isinstance(value, str):
        try:
            return SnapshotMarker(value.lower())
        except ValueError:
            allowed = ", ".join(marker.value for marker in SnapshotMarker)
            raise DecodeError(
                f"{path}: unknown snapshot marker {value[:40]!r} (known: {allowed})"
            ) from None
    raise DecodeError(f"{path}: expected a string or boolean, found {json_type(value)}")


def _source_info(obj: Mapping[str, Any], path: str, keys: Mapping[str, str]) -> SourceInfo:
    """A SourceInfo from `obj`; `keys` maps SourceInfo attributes to the keys that hold them."""

    def text(attribute: str) -> str | None:
        key = keys.get(attribute)
        return None if key is None else _opt_str(obj, key, path)

    def number(attribute: str) -> int | None:
        key = keys.get(attribute)
        return None if key is None else _opt_int(obj, key, path)

    snapshot_key = keys.get("snapshot")
    return SourceInfo(
        connector=text("connector"),
        name=text("name"),
        db=text("db"),
        schema=text("schema"),
        table=text("table"),
        ts_ms=number("ts_ms"),
        snapshot=(
            SnapshotMarker.FALSE
            if snapshot_key is None
            else _snapshot(obj.get(snapshot_key), f"{path}.{snapshot_key}")
        ),
        lsn=number("lsn"),
        tx_id=number("tx_id"),
        sequence=text("sequence"),
    )


def _deleted_flag(value: Any, path: str) -> bool:
    if value is None:
        return False
    if isinstance(value, bool):
        return value
    if isinstance(value, str) and value.lower() in ("true", "false"):
        return value.lower() == "true"
    raise DecodeError(f'{path}: expected "true"/"false" or a boolean, found {value!r:.60}')


def _is_unwrapped_meta(name: str) -> bool:
    return name in _UNWRAPPED_META or name.startswith(_UNWRAPPED_META_PREFIXES)


def _looks_like_envelope(payload: Mapping[str, Any]) -> bool:
    return (
        isinstance(payload.get("op"), str)
        and isinstance(payload.get("source"), dict)
        and ("before" in payload or "after" in payload)
    )


# --- the decoder -----------------------------------------------------------------------------


class _Decoder:
    """Decodes one record; holds what every step needs."""

    def __init__(self, raw: RawRecord, opts: DecodeOptions) -> None:
        self.raw = raw
        self.opts = opts
        self.clamp = opts.clamp_out_of_range

    def decode(self) -> ChangeEvent:
        raw = self.raw
        self._check_size()
        if raw.topic.startswith(self.opts.heartbeat_topic_prefix):
            return ChangeEvent(kind=RecordKind.HEARTBEAT, position=raw.position)
        if raw.value is None:
            return self._tombstone(self._topic_table())
        schema, payload, path = _split_envelope(_parse_json(raw.value, "value"), "value")
        if payload is None:  # a JsonConverter envelope around a null value
            return self._tombstone(self._topic_table())
        if not isinstance(payload, dict):
            raise DecodeError(f"{path}: expected a JSON object, found {json_type(payload)}")
        if _is_transaction_marker(payload):
            return ChangeEvent(kind=RecordKind.TRANSACTION, position=raw.position)
        if self.opts.envelope == "unwrapped":
            return self._decode_unwrapped(schema, payload, path)
        return self._decode_debezium(schema, payload, path)

    # -- record-level pieces

    def _check_size(self) -> None:
        limit = self.opts.max_record_bytes
        if limit is None:
            return
        raw = self.raw
        size = len(raw.key or b"") + len(raw.value or b"")
        for name, value in raw.headers:
            size += len(name.encode("utf-8", "surrogatepass")) + len(value or b"")
        if size > limit:
            raise RecordTooLargeDecodeError(
                f"record is {size} bytes (key + value + headers), over max_record_bytes={limit}",
                size=size,
                limit=limit,
            )

    def _topic_table(self) -> tuple[str | None, str | None]:
        parts = self.raw.topic.split(".")
        return (parts[-2], parts[-1]) if len(parts) >= 3 else (None, None)

    def _table_of(self, source: SourceInfo | None) -> tuple[str | None, str | None]:
        if source is not None and source.table is not None:
            return source.schema, source.table
        return self._topic_table()

    def _tombstone(self, table: tuple[str | None, str | None]) -> ChangeEvent:
        hints = self.opts._hints.for_table(*table)
        return ChangeEvent(
            kind=RecordKind.TOMBSTONE,
            position=self.raw.position,
            key=self._decode_key(self.raw.key, "key", hints),
            old_key=self._header_key(OLD_KEY_HEADER, hints),
            new_key=self._header_key(NEW_KEY_HEADER, hints),
        )

    def _decode_key(
        self, data: bytes | None, path: str, hints: Mapping[str, ConnectSchema]
    ) -> dict[str, Any] | None:
        if data is None:
            return None
        schema, payload, payload_path = _split_envelope(_parse_json(data, path), path)
        if payload is None:
            return None
        if not isinstance(payload, dict):
            raise DecodeError(
                f"{payload_path}: expected an object of key columns, found {json_type(payload)}"
            )
        lookup = _row_fields(schema, hints)
        return {
            column: self._convert(value, lookup.get(column), f"{payload_path}.{column}")
            for column, value in payload.items()
        }

    def _header_key(self, name: str, hints: Mapping[str, ConnectSchema]) -> dict[str, Any] | None:
        values = [value for header, value in self.raw.headers if header == name]
        if not values:
            return None
        if len(set(values)) > 1:
            raise DecodeError(f"headers[{name!r}]: {len(values)} headers with different values")
        return self._decode_key(values[0], f"headers[{name!r}]", hints)

    def _convert(self, value: Any, schema: ConnectSchema | None, where: str) -> Any:
        if schema is None:
            return value
        return convert_value(value, schema, where=where, clamp=self.clamp)

    def _is_placeholder(self, value: Any) -> bool:
        placeholders = self.opts._placeholders
        if isinstance(value, str):
            return value in placeholders
        if isinstance(value, list):
            return any(isinstance(item, str) and item in placeholders for item in value)
        return False

    def _decode_row(
        self, row: Any, path: str, fields: Mapping[str, ConnectSchema]
    ) -> tuple[dict[str, Any] | None, frozenset[str]]:
        """The row with logical types converted and TOAST placeholders removed, and their names."""
        if row is None:
            return None, frozenset()
        if not isinstance(row, dict):
            raise DecodeError(f"{path}: expected an object or null, found {json_type(row)}")
        decoded: dict[str, Any] = {}
        unavailable: set[str] = set()
        for column, value in row.items():
            if self._is_placeholder(value):
                unavailable.add(column)
                continue
            decoded[column] = self._convert(value, fields.get(column), f"{path}.{column}")
        return decoded, frozenset(unavailable)

    # -- the two envelopes

    def _decode_debezium(
        self, schema: ConnectSchema | None, payload: dict[str, Any], path: str
    ) -> ChangeEvent:
        op = self._op(payload, path)
        source_obj = payload.get("source")
        if source_obj is not None and not isinstance(source_obj, dict):
            raise DecodeError(
                f"{path}.source: expected an object or null, found {json_type(source_obj)}"
            )
        source = (
            None if source_obj is None else _source_info(source_obj, f"{path}.source", _SOURCE_KEYS)
        )
        ts_ms = _opt_int(payload, "ts_ms", path)
        table = self._table_of(source)
        hints = self.opts._hints.for_table(*table)
        key = self._decode_key(self.raw.key, "key", hints)
        old_key = self._header_key(OLD_KEY_HEADER, hints)
        new_key = self._header_key(NEW_KEY_HEADER, hints)
        common: dict[str, Any] = {
            "position": self.raw.position,
            "op": op,
            "key": key,
            "source": source,
            "ts_ms": ts_ms,
            "old_key": old_key,
            "new_key": new_key,
        }
        if op is Op.TRUNCATE:
            return ChangeEvent(kind=RecordKind.TRUNCATE, **common)
        if op is Op.MESSAGE:
            prefix, content = self._message(payload.get("message"), f"{path}.message")
            return ChangeEvent(
                kind=RecordKind.MESSAGE, message_prefix=prefix, message_content=content, **common
            )
        envelope_fields = schema.fields if schema is not None and schema.fields else {}
        before, _ = self._decode_row(
            payload.get("before"),
            f"{path}.before",
            _row_fields(envelope_fields.get("before") if schema else None, hints, schema),
        )
        after, unavailable = self._decode_row(
            payload.get("after"),
            f"{path}.after",
            _row_fields(envelope_fields.get("after") if schema else None, hints, schema),
        )
        if op is Op.DELETE and after is not None:
            raise DecodeError(f"{path}.after: op 'd' must have a null 'after', found an object")
        if op is not Op.DELETE and after is None:
            raise DecodeError(f"{path}.after: op {op.value!r} needs an 'after' row, found null")
        return ChangeEvent(
            kind=RecordKind.CHANGE,
            before=before,
            after=after,
            unavailable_columns=unavailable,
            **common,
        )

    def _op(self, payload: Mapping[str, Any], path: str) -> Op:
        raw_op = payload.get("op")
        if raw_op is None:
            if "before" not in payload and "after" not in payload:
                hint = (
                    " (a flat row? use envelope='unwrapped')"
                    if "__deleted" in payload or "__op" in payload
                    else ""
                )
                raise DecodeError(
                    f"{path}: not a Debezium change event: no 'op' and no 'before'/'after'; "
                    f"found keys {_keys(payload)}{hint}"
                )
            raise DecodeError(f"{path}.op: missing ('before'/'after' present but no operation)")
        if not isinstance(raw_op, str):
            raise DecodeError(f"{path}.op: expected a string, found {json_type(raw_op)}")
        try:
            return Op(raw_op)
        except ValueError:
            raise UnsupportedOperationError(
                f"{path}.op: unsupported operation {raw_op[:20]!r} (known: c, u, d, r, t, m)"
            ) from None

    def _message(self, message: Any, path: str) -> tuple[str, bytes]:
        if not isinstance(message, dict):
            raise DecodeError(f"{path}: expected an object, found {json_type(message)}")
        prefix = message.get("prefix")
        if not isinstance(prefix, str):
            raise DecodeError(f"{path}.prefix: expected a string, found {json_type(prefix)}")
        content = message.get("content")
        if not isinstance(content, str):
            raise DecodeError(f"{path}.content: expected base64 text, found {json_type(content)}")
        return prefix, decode_base64(content, where=f"{path}.content")

    def _decode_unwrapped(
        self, schema: ConnectSchema | None, payload: dict[str, Any], path: str
    ) -> ChangeEvent:
        if _looks_like_envelope(payload):
            raise DecodeError(
                f"{path}: a full Debezium envelope (op/source/before/after) where "
                "envelope='unwrapped' expects a flat row; use envelope='debezium'"
            )
        meta = {name: value for name, value in payload.items() if _is_unwrapped_meta(name)}
        row = {name: value for name, value in payload.items() if not _is_unwrapped_meta(name)}
        deleted = _deleted_flag(meta.get("__deleted"), f"{path}.__deleted")
        op = self._unwrapped_op(meta.get("__op"), deleted, path)
        source = self._unwrapped_source(meta, path)
        ts_ms = _opt_int(meta, "__ts_ms", path)
        hints = self.opts._hints.for_table(*self._table_of(source))
        decoded, unavailable = self._decode_row(row, path, _row_fields(schema, hints))
        is_delete = op is Op.DELETE
        return ChangeEvent(
            kind=RecordKind.CHANGE,
            position=self.raw.position,
            op=op,
            key=self._decode_key(self.raw.key, "key", hints),
            before=decoded if is_delete else None,
            after=None if is_delete else decoded,
            source=source,
            ts_ms=ts_ms,
            unavailable_columns=frozenset() if is_delete else unavailable,
            old_key=self._header_key(OLD_KEY_HEADER, hints),
            new_key=self._header_key(NEW_KEY_HEADER, hints),
        )

    def _unwrapped_op(self, raw_op: Any, deleted: bool, path: str) -> Op:
        if raw_op is None:
            return Op.DELETE if deleted else self.opts.unwrapped_default_op
        if not isinstance(raw_op, str):
            raise DecodeError(f"{path}.__op: expected a string, found {json_type(raw_op)}")
        try:
            op = Op(raw_op)
        except ValueError:
            raise UnsupportedOperationError(
                f"{path}.__op: unsupported operation {raw_op[:20]!r} (known: c, u, d, r)"
            ) from None
        if op not in _CHANGE_OPS:
            raise UnsupportedOperationError(
                f"{path}.__op: op {op.value!r} cannot be carried by a flattened row"
            )
        if deleted and op is not Op.DELETE:
            raise DecodeError(f"{path}: __deleted is true but __op is {op.value!r}")
        return op

    def _unwrapped_source(self, meta: Mapping[str, Any], path: str) -> SourceInfo | None:
        keys: dict[str, str] = {}
        for attribute, source_key in _SOURCE_KEYS.items():
            candidates = [f"__source_{source_key}"]
            if source_key != "ts_ms":  # `__ts_ms` is the event's time, not the source's
                candidates.append(f"__{source_key}")
            for candidate in candidates:
                if candidate in meta:
                    keys[attribute] = candidate
                    break
        if not keys:
            return None
        return _source_info(meta, path, keys)


def _row_fields(
    row_schema: ConnectSchema | None,
    hints: Mapping[str, ConnectSchema],
    envelope_schema: ConnectSchema | None = None,
) -> Mapping[str, ConnectSchema]:
    """Per-column schemas for a row: from its schema when the record has one, else the hints."""
    if row_schema is not None:
        return row_schema.fields or {}
    if envelope_schema is not None:  # a schema that does not describe this row: no conversion
        return {}
    return hints
