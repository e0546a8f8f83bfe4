"""Decoded Debezium change events: frozen, typed values at the Kafka boundary.

The decoder (`streams.decode`) produces these from raw Kafka records; everything downstream
(mapping, planning, the worker) reads only these types, never raw JSON.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from enum import StrEnum
from typing import Any

#: The value Debezium writes for an unchanged TOASTed column it could not read.
TOAST_PLACEHOLDER = "__debezium_unavailable_value"


class Op(StrEnum):
    """Debezium's `op` field."""

    CREATE = "c"
    UPDATE = "u"
    DELETE = "d"
    READ = "r"  # snapshot row
    TRUNCATE = "t"
    MESSAGE = "m"  # logical decoding message (pg_logical_emit_message)


class RecordKind(StrEnum):
    """What a Kafka record on a CDC topic is, before any policy is applied."""

    CHANGE = "change"  # c / u / d / r
    TOMBSTONE = "tombstone"  # null value after a delete: compaction marker, no-op for us
    TRUNCATE = "truncate"
    MESSAGE = "message"
    HEARTBEAT = "heartbeat"  # Debezium heartbeat topic record
    SCHEMA_CHANGE = "schema_change"  # DDL history records on the server-name topic
    TRANSACTION = (
        "transaction"  # BEGIN/END on `<prefix>.transaction` (provide.transaction.metadata)
    )


class SnapshotMarker(StrEnum):
    """`source.snapshot`, normalized: real events carry a string enum, the docs show a boolean."""

    FALSE = "false"
    TRUE = "true"
    FIRST = "first"
    FIRST_IN_DATA_COLLECTION = "first_in_data_collection"
    LAST_IN_DATA_COLLECTION = "last_in_data_collection"
    LAST = "last"
    INCREMENTAL = "incremental"

    @property
    def is_snapshot(self) -> bool:
        """True for every marker except FALSE."""
        return self is not SnapshotMarker.FALSE


@dataclass(frozen=True, slots=True)
class SourceInfo:
    """The parts of Debezium's `source` block ragstream uses (PostgreSQL connector names)."""

    connector: str | None = None
    name: str | None = None
    db: str | None = None
    schema: str | None = None
    table: str | None = None
    ts_ms: int | None = None  # commit time in the source database
    snapshot: SnapshotMarker = SnapshotMarker.FALSE
    lsn: int | None = None
    tx_id: int | None = None
    sequence: str | None = None


@dataclass(frozen=True, slots=True)
class RecordPosition:
    """Where a record came from: enough to find it again and to put it in a DLQ header."""

    topic: str
    partition: int
    offset: int


@dataclass(frozen=True, slots=True)
class ChangeEvent:
    """One decoded Kafka record from a Debezium topic.

    `before`/`after` hold decoded column values (logical types converted where the schema or the
    column-type hints say how); `unavailable_columns` names the columns whose value was the TOAST
    placeholder — those columns are *absent* from `after`, never present as text.
    """

    kind: RecordKind
    position: RecordPosition
    op: Op | None = None
    key: Mapping[str, Any] | None = None
    before: Mapping[str, Any] | None = None
    after: Mapping[str, Any] | None = None
    source: SourceInfo | None = None
    ts_ms: int | None = None  # when Debezium processed the event
    unavailable_columns: frozenset[str] = field(default_factory=frozenset)
    old_key: Mapping[str, Any] | None = None  # `__debezium.oldkey` header: PK change (d half)
    new_key: Mapping[str, Any] | None = None  # `__debezium.newkey` header: PK change (c half)
    message_prefix: str | None = None  # for MESSAGE records
    message_content: bytes | None = None

    @property
    def is_snapshot(self) -> bool:
        """True when the event comes from an initial or incremental snapshot."""
        return self.source is not None and self.source.snapshot.is_snapshot


@dataclass(frozen=True, slots=True)
class RawRecord:
    """A Kafka record as it came off the wire, before decoding (also what a DLQ record keeps)."""

    topic: str
    partition: int
    offset: int
    key: bytes | None
    value: bytes | None
    headers: tuple[tuple[str, bytes | None], ...] = ()
    timestamp_ms: int | None = None

    @property
    def position(self) -> RecordPosition:
        """Topic, partition and offset of this record."""
        return RecordPosition(self.topic, self.partition, self.offset)
