"""Decide what one change event means for the index: upsert, delete, skip or refetch.

Pure logic: `plan_event(event, config)` reads a decoded `ChangeEvent` and returns a `Plan`.
The worker executes plans; `ragstream inspect-event` prints them. Policy (DESIGN decision 6):

| record                         | action                                                  |
|--------------------------------|---------------------------------------------------------|
| c / u / r, live row            | upsert (the entity built from `after`)                  |
| c / u / r, `deleted_at` set    | delete (soft delete)                                    |
| d                              | delete (id from `before`, else from the Kafka key)      |
| u that moved the row's tenant  | upsert in the new tenant + delete in the old one        |
| content column TOAST-unchanged | refetch (re-read the SoR; the placeholder is not text)  |
| tombstone                      | skip (offset advances)                                  |
| heartbeat, schema change       | skip (counted)                                          |
| t (truncate), m (message)      | by policy: skip (default, counted) or dlq               |

A primary-key change arrives as d (header `__debezium.newkey`) then c (header
`__debezium.oldkey`); each half is planned on its own, so the old id is deleted and the new id
indexed.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from enum import StrEnum
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field

from ragstream.errors import MappingError
from schemas.entities import ContentFormat, Entity, EntityVersion
from schemas.events import ChangeEvent, Op, RecordKind, RecordPosition
from streams.mapping import (
    RowView,
    TableMapping,
    parse_format,
    parse_metadata,
    version_of,
)

#: (raw content, format) -> SHA-256 hex of the normalized content; used when the table has no
#: content-hash column. Injected so this module stays independent of the normalizer's options.
ContentHasher = Callable[[str, ContentFormat], str]


class Action(StrEnum):
    """What the worker does with a record."""

    UPSERT = "upsert"
    DELETE = "delete"
    SKIP = "skip"
    REFETCH = "refetch"
    DLQ = "dlq"


class PlanPolicy(BaseModel):
    """What to do with records that carry no row change."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    truncate: Literal["skip", "dlq"] = "skip"
    message: Literal["skip", "dlq"] = "skip"


class PlanConfig(BaseModel):
    """Table mappings (by table name, '*' for any other table) and the record policy."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    tables: dict[str, TableMapping] = Field(default_factory=lambda: {"*": TableMapping()})
    policy: PlanPolicy = Field(default_factory=PlanPolicy)

    def mapping_for(self, table: str | None) -> TableMapping:
        """The mapping of `table`, else the '*' mapping; MappingError when neither exists."""
        if table is not None and table in self.tables:
            return self.tables[table]
        if "*" in self.tables:
            return self.tables["*"]
        raise MappingError(f"no mapping configured for table {table!r}")


@dataclass(frozen=True, slots=True)
class Plan:
    """The decision for one record. `reason` is a stable code; `detail` is for people."""

    action: Action
    reason: str
    position: RecordPosition
    op: Op | None = None
    tenant_id: str | None = None  # None on a delete whose row carried no tenant column
    entity_id: str | None = None
    version: EntityVersion | None = None
    entity: Entity | None = None  # set for UPSERT
    previous_tenant_id: str | None = None  # the row moved from this tenant (delete it there)
    source_ts_ms: int | None = None  # SoR commit time, for freshness
    detail: str = ""


def table_of(event: ChangeEvent) -> str | None:
    """The source table: `source.table`, else the last segment of `<prefix>.<schema>.<table>`."""
    if event.source is not None and event.source.table:
        return event.source.table
    parts = event.position.topic.rsplit(".", 1)
    return parts[-1] if len(parts) == 2 else None


def plan_event(event: ChangeEvent, config: PlanConfig, hasher: ContentHasher) -> Plan:
    """Plan one decoded record. Raises `MappingError` for a change row that cannot be mapped."""
    base: dict[str, Any] = {
        "position": event.position,
        "op": event.op,
        "source_ts_ms": event.source.ts_ms if event.source is not None else None,
    }
    if event.kind is RecordKind.TOMBSTONE:
        return Plan(Action.SKIP, "tombstone", detail="compaction marker after a delete", **base)
    if event.kind is RecordKind.HEARTBEAT:
        return Plan(Action.SKIP, "heartbeat", detail="Debezium heartbeat", **base)
    if event.kind is RecordKind.SCHEMA_CHANGE:
        return Plan(Action.SKIP, "schema_change", detail="schema history record", **base)
    if event.kind is RecordKind.TRUNCATE:
        action = Action.SKIP if config.policy.truncate == "skip" else Action.DLQ
        return Plan(
            action,
            "truncate",
            detail="table truncated: run `ragstream reconcile` to remove the rows' chunks",
            **base,
        )
    if event.kind is RecordKind.MESSAGE:
        action = Action.SKIP if config.policy.message == "skip" else Action.DLQ
        return Plan(action, "logical_message", detail=f"prefix {event.message_prefix!r}", **base)
    return _plan_change(event, config, hasher, base)


def _plan_change(
    event: ChangeEvent, config: PlanConfig, hasher: ContentHasher, base: dict[str, Any]
) -> Plan:
    mapping = config.mapping_for(table_of(event))
    where = f"{event.position.topic}[{event.position.partition}]@{event.position.offset}"
    lsn = event.source.lsn if event.source is not None else None
    if event.op is Op.DELETE:
        return _plan_delete(event, mapping, where, lsn, base)
    if event.after is None:
        raise MappingError(f"{where}: op {event.op} without an `after` row")
    row = RowView(event.after, where)
    entity_id = row.required_text(mapping.id_column)
    tenant_id = row.required_text(mapping.tenant_column)
    version = version_of(row, mapping, lsn=lsn, snapshot=event.is_snapshot)
    previous_tenant = _previous_tenant(event, mapping, tenant_id, where)
    common = {
        **base,
        "tenant_id": tenant_id,
        "entity_id": entity_id,
        "version": version,
        "previous_tenant_id": previous_tenant,
    }
    if mapping.deleted_at_column is not None and row.value(mapping.deleted_at_column) is not None:
        detail = f"{mapping.deleted_at_column} is set"
        return Plan(Action.DELETE, "soft_delete", detail=detail, **common)
    unavailable = [c for c in mapping.content_columns if c in event.unavailable_columns]
    if unavailable:
        return Plan(
            Action.REFETCH,
            "content_unavailable",
            detail=(
                f"columns {unavailable} hold Debezium's unchanged-TOAST placeholder: "
                "re-read the row from the SoR"
            ),
            **common,
        )
    entity = build_entity(
        row,
        mapping,
        tenant_id=tenant_id,
        entity_id=entity_id,
        version=version,
        hasher=hasher,
        where=where,
    )
    return Plan(Action.UPSERT, "upsert", entity=entity, **common)


def _plan_delete(
    event: ChangeEvent,
    mapping: TableMapping,
    where: str,
    lsn: int | None,
    base: dict[str, Any],
) -> Plan:
    # REPLICA IDENTITY DEFAULT gives a `before` with the key columns only, or none at all:
    # the id then comes from the Kafka key, and the tenant may be unknown (the worker then
    # deletes the entity id in whichever tenant holds it; ids are the table's primary key).
    source: Mapping[str, Any] | None = event.before
    if source is None or mapping.id_column not in source:
        source = event.key
    if source is None:
        raise MappingError(f"{where}: delete without `before` and without a key")
    row = RowView(source, where)
    entity_id = row.required_text(mapping.id_column)
    tenant_id = row.optional_text(mapping.tenant_column)
    if tenant_id is None and event.key is not None and event.before is not None:
        tenant_id = RowView(event.key, where).optional_text(mapping.tenant_column)
    version = EntityVersion(updated_at_us=None, lsn=lsn, snapshot=False)
    if event.before is not None:
        version = version_of(RowView(event.before, where), mapping, lsn=lsn, snapshot=False)
    reason = "delete_pk_change" if event.new_key is not None else "delete"
    return Plan(
        Action.DELETE,
        reason,
        tenant_id=tenant_id,
        entity_id=entity_id,
        version=version,
        **base,
    )


def _previous_tenant(
    event: ChangeEvent, mapping: TableMapping, tenant_id: str, where: str
) -> str | None:
    if event.op is not Op.UPDATE or event.before is None:
        return None
    before_tenant = RowView(event.before, where).optional_text(mapping.tenant_column)
    return before_tenant if before_tenant is not None and before_tenant != tenant_id else None


def build_entity(
    row: RowView,
    mapping: TableMapping,
    *,
    tenant_id: str,
    entity_id: str,
    version: EntityVersion,
    hasher: ContentHasher,
    where: str,
) -> Entity:
    """Build the entity of a live row (also used by SoR readers that re-read a row)."""
    parts = [row.optional_text(c) for c in mapping.content_columns]
    content = "\n\n".join(p for p in parts if p)
    if len(content) > mapping.max_content_chars:
        raise MappingError(
            f"{where}: content is {len(content)} characters, over the limit of "
            f"{mapping.max_content_chars}"
        )
    metadata = parse_metadata(row.value(mapping.metadata_column), where)
    fmt_value: object = row.value(mapping.format_column) if mapping.format_column else None
    if fmt_value is None and mapping.format_metadata_key is not None:
        fmt_value = metadata.get(mapping.format_metadata_key)
    fmt = parse_format(fmt_value, mapping.default_format, where)
    declared_hash = row.optional_text(mapping.content_hash_column)
    content_hash = declared_hash.strip().lower() if declared_hash else hasher(content, fmt)
    entity_type = row.optional_text(mapping.type_column) or mapping.default_entity_type
    return Entity(
        tenant_id=tenant_id,
        entity_id=entity_id,
        entity_type=entity_type,
        title=row.optional_text(mapping.title_column) or "",
        content=content,
        content_format=fmt,
        metadata=metadata,
        content_hash=content_hash,
        version=version,
        deleted=False,
        created_at=row.optional_time(mapping.created_at_column),
        updated_at=row.optional_time(mapping.updated_at_column),
    )
