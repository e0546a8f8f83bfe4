"""Hand-built catalogs (`ragcore.sor.pgcatalog`) for the pure tests of discover and check."""

from __future__ import annotations

from collections.abc import Sequence

from ragcore.sor.pgcatalog import (
    ColumnInfo,
    ColumnKind,
    DatabaseInfo,
    ForeignKey,
    IndexInfo,
    PublicationInfo,
    PublishedTable,
    ReplicaIdentity,
    TableInfo,
)

_TYPES = {
    ColumnKind.TEXT: "text",
    ColumnKind.INTEGER: "integer",
    ColumnKind.NUMERIC: "numeric",
    ColumnKind.BOOLEAN: "boolean",
    ColumnKind.TIMESTAMP: "timestamp with time zone",
    ColumnKind.DATE: "date",
    ColumnKind.TIME: "time without time zone",
    ColumnKind.JSON: "jsonb",
    ColumnKind.BYTEA: "bytea",
    ColumnKind.UUID: "uuid",
    ColumnKind.ENUM: "ticket_state",
    ColumnKind.ARRAY: "text[]",
    ColumnKind.OTHER: "tsvector",
}


def col(
    name: str,
    kind: ColumnKind = ColumnKind.TEXT,
    *,
    not_null: bool = False,
    generated: bool = False,
    max_length: int | None = None,
    readable: bool = True,
) -> ColumnInfo:
    """A column of `kind` (its PostgreSQL type name is a typical one)."""
    type_name = _TYPES[kind] if max_length is None else f"character varying({max_length})"
    return ColumnInfo(
        name=name,
        type=type_name,
        kind=kind,
        not_null=not_null,
        generated=generated,
        max_length=max_length,
        readable=readable,
    )


def table(
    qualified: str,
    columns: Sequence[ColumnInfo],
    *,
    pk: Sequence[str] = ("id",),
    identity: ReplicaIdentity = ReplicaIdentity.FULL,
    unique: Sequence[Sequence[str]] = (),
    replica_index: Sequence[str] | None = None,
    references: dict[str, str] | None = None,
    readable: bool = True,
) -> TableInfo:
    """A table with a primary key `pk` (NOT NULL, as PostgreSQL makes it), further unique
    indexes, a REPLICA IDENTITY and foreign keys (`column -> schema.table`)."""
    schema, _, name = qualified.partition(".")
    by_name = {c.name: c for c in columns}
    fixed = [
        ColumnInfo(c.name, c.type, c.kind, True, c.generated, c.max_length, c.readable)
        if c.name in pk
        else c
        for c in columns
    ]
    assert all(k in by_name for k in pk), pk
    indexes = [IndexInfo(f"{name}_pkey", tuple(pk), True, True, False)] if pk else []
    indexes += [
        IndexInfo(f"{name}_{'_'.join(u)}_key", tuple(u), False, True, False) for u in unique
    ]
    if replica_index is not None:
        indexes.append(IndexInfo(f"{name}_ri", tuple(replica_index), False, True, True))
    return TableInfo(
        schema=schema,
        name=name,
        columns=tuple(fixed),
        replica_identity=identity,
        indexes=tuple(indexes),
        foreign_keys=tuple(ForeignKey((c,), t) for c, t in (references or {}).items()),
        rows_estimate=None,
        readable=readable,
    )


def publication(
    name: str,
    *tables: str,
    columns: dict[str, tuple[str, ...]] | None = None,
    row_filter: dict[str, str] | None = None,
    deletes: bool = True,
    truncates: bool = True,
) -> PublicationInfo:
    """A publication of `tables` (all operations unless told), with column lists and row
    filters per table."""
    return PublicationInfo(
        name=name,
        all_tables=False,
        inserts=True,
        updates=True,
        deletes=deletes,
        truncates=truncates,
        tables={
            t: PublishedTable((columns or {}).get(t), (row_filter or {}).get(t)) for t in tables
        },
    )


def database(
    *tables: TableInfo,
    publications: Sequence[PublicationInfo] = (),
    wal_level: str = "logical",
    version_num: int = 150000,
) -> DatabaseInfo:
    """A PostgreSQL 15 database holding `tables`."""
    return DatabaseInfo(
        version_num=version_num,
        version=f"{version_num // 10000}.0",
        wal_level=wal_level,
        database="shop",
        user="ragstream",
        tables={t.qualified: t for t in tables},
        publications=tuple(publications),
    )
