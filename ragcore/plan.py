"""Decide what one change event means for the index: upsert, delete, skip or refetch.

Pure logic: `plan_event(event, config)` reads a decoded `ChangeEvent` and returns a `Plan`.
The worker executes plans; `ragstream inspect-event` prints them. Policy
(docs/decisions/debezium-change-events.md):

| record                         | action                                                  |
|--------------------------------|---------------------------------------------------------|
| c / u / r, live row            | upsert (the entity built from `after`)                  |
| c / u / r, `deleted_at` set    | delete (soft delete)                                    |
| d                              | delete (id from `before`, else from the Kafka key)      |
| u that moved the row's tenant  | upsert in the new tenant + delete in the old one        |
| content column TOAST-unchanged | refetch (re-read the SoR; the placeholder is not text)  |
| tombstone                      | skip (offset advances)                                  |
| heartbeat, schema change       | skip (counted)                                          |
| transaction BEGIN/END          | skip (counted)                                          |
| t (truncate)                   | by policy: purge the table's chunks (default), skip, dlq|
| m (message)                    | by policy: skip (default, counted) or dlq               |

A primary-key change arrives as d (header `__debezium.newkey`) then c (header
`__debezium.oldkey`); each half is planned on its own, so the old id is deleted and the new id
indexed.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from enum import StrEnum
from functools import cached_property
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

from ragcore.documents.source import (
    DOCUMENT_NAME,
    DocumentSource,
    document_bytes,
    document_format,
    encode_document,
)
from ragcore.errors import ConfigError, InvalidTenantError, MappingError, SchemaDriftError
from ragcore.mapping import (
    RowView,
    TableCatalog,
    TableMapping,
    content_of,
    mapping_errors,
    metadata_of,
    parse_format,
    version_of,
)
from ragcore.store.ids import TenantId
from schemas.entities import ContentFormat, Entity, EntityVersion
from schemas.events import ChangeEvent, Op, RecordKind, RecordPosition

#: (raw content, format) -> SHA-256 hex of the normalized content; used when the table has no
#: content-hash column. Injected so this module stays independent of the normalizer's options.
ContentHasher = Callable[[str, ContentFormat], str]


class Action(StrEnum):
    """What the worker does with a record."""

    UPSERT = "upsert"
    DELETE = "delete"
    SKIP = "skip"
    REFETCH = "refetch"
    TRUNCATE = "truncate"  # remove the table's chunks indexed before the truncate
    DLQ = "dlq"


class PlanPolicy(BaseModel):
    """What to do with records that carry no row change."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    truncate: Literal["purge", "skip", "dlq"] = Field(
        default="purge",
        description=(
            "purge: remove every chunk of the truncated table that was indexed before the "
            "TRUNCATE (all tenants); skip: count it only; dlq: send it to the DLQ."
        ),
    )
    message: Literal["skip", "dlq"] = "skip"


class PlanConfig(BaseModel):
    """The mapped SoR tables (one `TableMapping` each) and the record policy."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    tables: tuple[TableMapping, ...] = Field(
        default=(TableMapping(),),
        min_length=1,
        description="One mapping per source table (JSON list; see ragcore/mapping.py).",
    )
    topic_prefix: str = Field(
        default="sor", description="Debezium's topic.prefix: topics are <prefix>.<schema>.<table>."
    )
    policy: PlanPolicy = Field(default_factory=PlanPolicy)

    @field_validator("tables", mode="before")
    @classmethod
    def _list_of_tables(cls, value: Any) -> Any:
        if isinstance(value, Mapping):
            raise ValueError(
                "tables is a JSON list of table mappings, e.g. "
                '[{"table": "public.tickets", "key_columns": ["id"], ...}]'
            )
        if isinstance(value, list | tuple):
            # each mapping's errors name its table, field and the accepted values
            errors = [e for n, item in enumerate(value) for e in mapping_errors(n, item)]
            if errors:
                raise ValueError("; ".join(errors))
        return value

    @model_validator(mode="after")
    def _unique(self) -> PlanConfig:
        try:
            TableCatalog(self.tables, self.topic_prefix)
        except ConfigError as exc:
            raise ValueError(str(exc)) from exc
        return self

    @cached_property
    def catalog(self) -> TableCatalog:
        """The tables, found by event source, topic or entity id."""
        return TableCatalog(self.tables, self.topic_prefix)


@dataclass(frozen=True, slots=True)
class DeferredEntity:
    """The entity of a document table's row, built when it is applied rather than when it is
    planned: building it reads the file (a reference is fetched, bytes are base64-encoded for
    the content), which the ingest worker does one batch at a time within its document budget,
    never for everything it has read ahead."""

    row: Mapping[str, Any]
    mapping: TableMapping
    tenant_id: TenantId
    entity_id: str
    version: EntityVersion
    hasher: ContentHasher
    where: str

    def build(self) -> Entity:
        """The entity (`build_entity`: DocumentError / MappingError when it cannot be had)."""
        return build_entity(
            RowView(self.row, self.where),
            self.mapping,
            tenant_id=self.tenant_id,
            entity_id=self.entity_id,
            version=self.version,
            hasher=self.hasher,
            where=self.where,
        )


@dataclass(frozen=True, slots=True)
class Plan:
    """The decision for one record. `reason` is a stable code; `detail` is for people."""

    action: Action
    reason: str
    position: RecordPosition
    op: Op | None = None
    tenant_id: TenantId | None = None  # None on a delete whose row carried no tenant column
    entity_id: str | None = None
    version: EntityVersion | None = None
    entity: Entity | None = None  # set for UPSERT (or `deferred`)
    #: an UPSERT of a document table planned with `defer_documents`: its entity, to be built
    deferred: DeferredEntity | None = None
    #: the row moved from this tenant (delete it there); validated like `tenant_id`
    previous_tenant_id: TenantId | None = None
    table: str | None = None  # the mapped table's name (`TableMapping.label`)
    source_ts_ms: int | None = None  # SoR commit time, for freshness
    detail: str = ""


def plan_event(
    event: ChangeEvent,
    config: PlanConfig,
    hasher: ContentHasher,
    *,
    defer_documents: bool = False,
) -> Plan:
    """Plan one decoded record. Raises `MappingError` for a change row that cannot be mapped.
    `defer_documents`: an upsert of a document table carries a `DeferredEntity` instead of its
    entity (the file is read when the plan is applied)."""
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
    if event.kind is RecordKind.TRANSACTION:
        return Plan(Action.SKIP, "transaction", detail="transaction boundary (BEGIN/END)", **base)
    if event.kind is RecordKind.TRUNCATE:
        return _plan_truncate(event, config, base)
    if event.kind is RecordKind.MESSAGE:
        action = Action.SKIP if config.policy.message == "skip" else Action.DLQ
        return Plan(action, "logical_message", detail=f"prefix {event.message_prefix!r}", **base)
    return _plan_change(event, config, hasher, base, defer_documents)


def _mapping(event: ChangeEvent, config: PlanConfig) -> TableMapping:
    source = event.source
    return config.catalog.for_source(
        source.schema if source is not None else None,
        source.table if source is not None else None,
        event.position.topic,
    )


def _plan_truncate(event: ChangeEvent, config: PlanConfig, base: dict[str, Any]) -> Plan:
    if config.policy.truncate != "purge":
        action = Action.SKIP if config.policy.truncate == "skip" else Action.DLQ
        return Plan(action, "truncate", detail="table truncated (policy: keep its chunks)", **base)
    mapping = _mapping(event, config)
    lsn = event.source.lsn if event.source is not None else None
    return Plan(
        Action.TRUNCATE,
        "truncate",
        table=mapping.label,
        version=EntityVersion(updated_at_us=None, lsn=lsn, snapshot=False),
        detail=f"{mapping.table} truncated: its chunks indexed before LSN {lsn} are removed",
        **base,
    )


def _plan_change(
    event: ChangeEvent,
    config: PlanConfig,
    hasher: ContentHasher,
    base: dict[str, Any],
    defer_documents: bool = False,
) -> Plan:
    mapping = _mapping(event, config)
    base = {**base, "table": mapping.label}
    where = f"{event.position.topic}[{event.position.partition}]@{event.position.offset}"
    lsn = event.source.lsn if event.source is not None else None
    if event.op is Op.DELETE:
        return _plan_delete(event, mapping, where, lsn, base)
    if event.after is None:
        raise MappingError(f"{where}: op {event.op} without an `after` row")
    check_columns(event.after, event.unavailable_columns, mapping, where)
    row = RowView(event.after, where)
    entity_id = mapping.row_entity_id(row)
    tenant_id = mapping.row_tenant(row)
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
    unavailable = [c for c in mapping.body_columns if c in event.unavailable_columns]
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
    if defer_documents and mapping.document is not None:
        deferred = DeferredEntity(
            event.after, mapping, tenant_id, entity_id, version, hasher, where
        )
        return Plan(Action.UPSERT, "upsert", deferred=deferred, **common)
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


def identity_of(event: ChangeEvent, config: PlanConfig) -> tuple[str, list[str | None]] | None:
    """The entity a change record names and the tenants it names (None: unknown), read from
    its key columns and tenant column only, whatever its other columns hold: what a re-read of
    the SoR needs (`ragstream dlq replay`). None for records without a row change (tombstones,
    heartbeats, truncates...). Raises `MappingError` for an unmapped table or a record
    without its key."""
    if event.kind is not RecordKind.CHANGE:
        return None
    mapping = _mapping(event, config)
    where = f"{event.position.topic}[{event.position.partition}]@{event.position.offset}"
    rows = [r for r in (event.after, event.before, event.key) if r is not None]
    keyed = [r for r in rows if all(c in r for c in mapping.key_columns)]
    if not keyed:
        raise MappingError(f"{where}: no row carries the key columns {list(mapping.key_columns)}")
    entity_id = mapping.row_entity_id(RowView(keyed[0], where))
    tenants: list[str | None] = []
    for row in rows:
        tenant = mapping.row_tenant_if_known(RowView(row, where))
        if tenant is not None and tenant not in tenants:
            tenants.append(tenant)
    return entity_id, tenants or [None]


@dataclass(frozen=True, slots=True)
class RecordIdentity:
    """What a change record names, as far as it can be read: its table (the mapping's label),
    its entity and its tenant. For a dead letter's headers; any part may be unknown."""

    table: str | None = None
    entity_id: str | None = None
    tenant_id: str | None = None
    #: an update that moved the row from another (valid) tenant names it
    moved_from: str | None = None


def record_identity(event: ChangeEvent, config: PlanConfig) -> RecordIdentity:
    """The table, entity and tenant a record names, best effort: never raises (a record that
    cannot be planned is exactly the one whose identity a dead letter wants; what cannot be read
    of it stays None)."""
    source = event.source
    try:
        mapping = config.catalog.for_source(
            source.schema if source is not None else None,
            source.table if source is not None else None,
            event.position.topic,
        )
    except MappingError:
        return RecordIdentity()
    where = f"{event.position.topic}[{event.position.partition}]@{event.position.offset}"
    rows = [r for r in (event.after, event.before, event.key) if r is not None]
    entity_id = tenant = None
    for row in rows:
        if entity_id is None and all(c in row for c in mapping.key_columns):
            with contextlib.suppress(MappingError):
                entity_id = mapping.row_entity_id(RowView(row, where))
        if tenant is None:
            with contextlib.suppress(MappingError):
                tenant = mapping.row_tenant_if_known(RowView(row, where))
    moved_from = None
    if event.op is Op.UPDATE and tenant is not None and event.before is not None:
        with contextlib.suppress(MappingError):
            moved_from = _previous_tenant(event, mapping, tenant, where)
    return RecordIdentity(mapping.label, entity_id, tenant, moved_from)


def check_columns(
    row: Mapping[str, Any], unavailable: frozenset[str], mapping: TableMapping, where: str
) -> None:
    """Raise `SchemaDriftError` when a change row lacks a column the mapping reads.

    Debezium writes every column of the table into `after` (a NULL column is present with a
    null value), so an absent column was renamed or dropped. A TOAST placeholder is not
    absence: the decoder removes it from the row and names it in `unavailable`.
    """
    missing = tuple(c for c in mapping.columns() if c not in row and c not in unavailable)
    if missing:
        raise SchemaDriftError(
            f"{where}: table {mapping.table}: mapped column(s) {', '.join(missing)} missing "
            "from the change event (renamed or dropped in the SoR?): fix the table mapping "
            "(RAGSTREAM_PLAN__TABLES) or the schema, then `ragstream dlq replay`",
            table=mapping.table,
            columns=missing,
        )


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
    if source is None or not all(c in source for c in mapping.key_columns):
        source = event.key
    if source is None:
        raise MappingError(f"{where}: delete without `before` and without a key")
    row = RowView(source, where)
    entity_id = mapping.row_entity_id(row)
    tenant_id = mapping.row_tenant_if_known(row)
    if tenant_id is None and event.key is not None and event.before is not None:
        tenant_id = mapping.row_tenant_if_known(RowView(event.key, where))
    version = EntityVersion(updated_at_us=None, lsn=lsn, snapshot=False)
    if event.before is not None:
        # a key-only `before` (REPLICA IDENTITY DEFAULT) holds placeholder values in its
        # other columns: the delete still applies, its version is then the LSN alone
        with contextlib.suppress(MappingError):
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
    event: ChangeEvent, mapping: TableMapping, tenant_id: TenantId, where: str
) -> TenantId | None:
    """The tenant an update moved its row from, when it moved: the `before` row's tenant,
    read and validated as the `after` row's is. A `before` tenant that is no valid tenant name
    cannot hold an index (its rows were refused as they came), so there is nothing to delete
    there: None."""
    if event.op is not Op.UPDATE or event.before is None or mapping.tenant_column is None:
        return None
    value = RowView(event.before, where).optional_text(mapping.tenant_column)
    if value is None or not value.strip():
        return None
    try:
        before_tenant = TenantId(value.strip())
    except InvalidTenantError:
        return None
    return before_tenant if before_tenant != tenant_id else None


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
    """Build the entity of a live row (also used by SoR readers that re-read a row).

    A table with a document column: the content is the file (base64), its format the declared
    or sniffed one, and `metadata["document_name"]` the file name its chunks cite.
    """
    metadata = metadata_of(row, mapping)
    if mapping.document is not None:
        content, fmt = _document_content(row, mapping, mapping.document, metadata, where)
    else:
        content = content_of(row, mapping)
        if len(content) > mapping.max_content_chars:
            raise MappingError(
                f"{where}: content is {len(content)} characters, over the limit of "
                f"{mapping.max_content_chars}"
            )
        fmt_value: object = row.value(mapping.format_column) if mapping.format_column else None
        if fmt_value is None and mapping.format_metadata_key is not None:
            fmt_value = metadata.get(mapping.format_metadata_key)
        fmt = parse_format(fmt_value, mapping.default_format, where)
    declared_hash = row.optional_text(mapping.content_hash_column)
    content_hash = declared_hash.strip().lower() if declared_hash else hasher(content, fmt)
    entity_type = row.optional_text(mapping.type_column) or mapping.entity_type_default
    title = row.optional_text(mapping.title_column) or ""
    if len(title) > mapping.max_title_chars:
        raise MappingError(
            f"{where}: title is {len(title)} characters, over the limit of "
            f"{mapping.max_title_chars}",
            column=mapping.title_column,
        )
    return Entity(
        tenant_id=tenant_id,
        entity_id=entity_id,
        entity_type=entity_type,
        title=title,
        content=content,
        content_format=fmt,
        metadata=metadata,
        content_hash=content_hash,
        version=version,
        deleted=False,
        created_at=row.optional_time(mapping.created_at_column),
        updated_at=row.optional_time(mapping.updated_at_column),
    )


def _document_content(
    row: RowView,
    mapping: TableMapping,
    source: DocumentSource,
    metadata: dict[str, Any],
    where: str,
) -> tuple[str, ContentFormat]:
    """The document's bytes as entity content and its format; the file name into `metadata`."""
    data, reference_name = document_bytes(source, row.value(source.column), where)
    fmt = document_format(
        source,
        row.value(source.format_column) if source.format_column else None,
        row.value(source.mime_type_column) if source.mime_type_column else None,
        data,
        where,
    )
    name = (
        row.optional_text(source.name_column)
        or reference_name
        or row.optional_text(mapping.title_column)
        or f"{mapping.label}.{fmt.value}"
    )
    metadata[DOCUMENT_NAME] = name
    return encode_document(data), fmt
