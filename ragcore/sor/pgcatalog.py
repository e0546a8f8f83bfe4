"""What a live PostgreSQL holds, read from its catalog: tables, columns, keys, REPLICA
IDENTITY, publications and replication slots.

`read_catalog` reads it through any query function (a psycopg connection in `ragstream tables`,
the SoR reader's pool in the worker's start-up check), with catalog queries only: no table is
scanned. `ragcore.sor.mapcheck` judges table mappings against it; `ragstream tables discover`
proposes mappings from it.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from enum import StrEnum
from typing import Any, Protocol, runtime_checkable

from ragcore.sor.base import SlotState

#: Runs one SQL statement with `%s` parameters and returns its rows as dicts.
Query = Callable[[str, Sequence[Any]], list[dict[str, Any]]]


class ColumnKind(StrEnum):
    """What a column's (base) type is, as far as a table mapping cares."""

    TEXT = "text"
    INTEGER = "integer"
    NUMERIC = "numeric"
    BOOLEAN = "boolean"
    TIMESTAMP = "timestamp"
    DATE = "date"
    TIME = "time"
    JSON = "json"
    BYTEA = "bytea"
    UUID = "uuid"
    ENUM = "enum"
    ARRAY = "array"
    OTHER = "other"


_KINDS_BY_TYPE: dict[str, ColumnKind] = {
    "int2": ColumnKind.INTEGER,
    "int4": ColumnKind.INTEGER,
    "int8": ColumnKind.INTEGER,
    "numeric": ColumnKind.NUMERIC,
    "float4": ColumnKind.NUMERIC,
    "float8": ColumnKind.NUMERIC,
    "bool": ColumnKind.BOOLEAN,
    "timestamp": ColumnKind.TIMESTAMP,
    "timestamptz": ColumnKind.TIMESTAMP,
    "date": ColumnKind.DATE,
    "time": ColumnKind.TIME,
    "timetz": ColumnKind.TIME,
    "json": ColumnKind.JSON,
    "jsonb": ColumnKind.JSON,
    "bytea": ColumnKind.BYTEA,
    "uuid": ColumnKind.UUID,
}


def column_kind(base_type: str, category: str, typtype: str) -> ColumnKind:
    """The kind of a column from its base type name, type category and `typtype`."""
    if typtype == "e":
        return ColumnKind.ENUM
    if category == "A":
        return ColumnKind.ARRAY
    if base_type in _KINDS_BY_TYPE:
        return _KINDS_BY_TYPE[base_type]
    if category == "S":  # text, varchar, char, name, citext
        return ColumnKind.TEXT
    return ColumnKind.OTHER


@dataclass(frozen=True, slots=True)
class ColumnInfo:
    """One column of a table."""

    name: str
    #: the type as PostgreSQL prints it (`character varying(80)`, `jsonb`, a domain's name)
    type: str
    kind: ColumnKind
    not_null: bool
    #: a generated column: logical replication does not publish it before PostgreSQL 18
    generated: bool = False
    #: the declared length of a varchar/char column
    max_length: int | None = None
    #: the reading role may SELECT it
    readable: bool = True


@dataclass(frozen=True, slots=True)
class IndexInfo:
    """A unique index (the primary key's included) or the REPLICA IDENTITY index."""

    name: str
    columns: tuple[str, ...]
    primary: bool
    unique: bool
    replica_identity: bool
    #: a partial or expression index identifies no row on its columns alone
    partial: bool = False

    @property
    def identifies_rows(self) -> bool:
        """Unique over plain columns, for every row."""
        return self.unique and not self.partial


@dataclass(frozen=True, slots=True)
class ForeignKey:
    """A foreign key: these columns reference `references` (`schema.table`)."""

    columns: tuple[str, ...]
    references: str


class ReplicaIdentity(StrEnum):
    """`pg_class.relreplident`: what a change event's old row (`before`) holds."""

    DEFAULT = "default"  # the primary key's columns (nothing without a primary key)
    FULL = "full"  # every column
    INDEX = "index"  # the columns of one unique index
    NOTHING = "nothing"  # nothing


_IDENTITIES = {
    "d": ReplicaIdentity.DEFAULT,
    "f": ReplicaIdentity.FULL,
    "i": ReplicaIdentity.INDEX,
    "n": ReplicaIdentity.NOTHING,
}


@dataclass(frozen=True, slots=True)
class TableInfo:
    """One table (or partitioned table) of the database."""

    schema: str
    name: str
    columns: tuple[ColumnInfo, ...]
    replica_identity: ReplicaIdentity
    indexes: tuple[IndexInfo, ...] = ()
    foreign_keys: tuple[ForeignKey, ...] = ()
    #: the planner's estimate (None: never analyzed)
    rows_estimate: int | None = None
    #: the reading role may use the schema and SELECT from the table
    readable: bool = True
    partitioned: bool = False

    @property
    def qualified(self) -> str:
        """`schema.table`."""
        return f"{self.schema}.{self.name}"

    def column(self, name: str) -> ColumnInfo | None:
        """The column named `name`, or None."""
        for column in self.columns:
            if column.name == name:
                return column
        return None

    @property
    def primary_key(self) -> tuple[str, ...]:
        """The primary key's columns in key order (empty without one)."""
        for index in self.indexes:
            if index.primary:
                return index.columns
        return ()

    @property
    def replica_index(self) -> IndexInfo | None:
        """The REPLICA IDENTITY USING INDEX index, when there is one."""
        for index in self.indexes:
            if index.replica_identity:
                return index
        return None

    def unique_index_on(self, columns: Sequence[str]) -> IndexInfo | None:
        """A unique index over exactly `columns` (any order), the primary key first."""
        wanted = set(columns)
        found = [i for i in self.indexes if i.identifies_rows and set(i.columns) == wanted]
        found.sort(key=lambda i: not i.primary)
        return found[0] if found else None

    def old_row_columns(self) -> frozenset[str] | None:
        """The columns a delete's or an update's old row carries (`before`), None for every
        column (REPLICA IDENTITY FULL)."""
        if self.replica_identity is ReplicaIdentity.FULL:
            return None
        if self.replica_identity is ReplicaIdentity.INDEX:
            index = self.replica_index
            return frozenset(index.columns) if index is not None else frozenset()
        if self.replica_identity is ReplicaIdentity.DEFAULT:
            return frozenset(self.primary_key)
        return frozenset()


@dataclass(frozen=True, slots=True)
class PublishedTable:
    """A table as one publication publishes it."""

    #: the published columns (None: all of them; a column list needs PostgreSQL 15)
    columns: tuple[str, ...] | None = None
    #: the publication's row filter for the table (PostgreSQL 15), or None
    row_filter: str | None = None


@dataclass(frozen=True, slots=True)
class PublicationInfo:
    """One publication: which operations it publishes and which tables."""

    name: str
    all_tables: bool
    inserts: bool
    updates: bool
    deletes: bool
    truncates: bool
    #: the tables `read_catalog` read that it publishes (named, by schema or by FOR ALL TABLES)
    tables: Mapping[str, PublishedTable] = field(default_factory=dict)

    def publishes(self, qualified: str) -> PublishedTable | None:
        """How this publication publishes the table `schema.table` (None: it does not)."""
        return self.tables.get(qualified)


@dataclass(frozen=True, slots=True)
class DatabaseInfo:
    """What `read_catalog` found."""

    version_num: int
    version: str
    wal_level: str
    database: str
    user: str
    tables: Mapping[str, TableInfo]
    publications: tuple[PublicationInfo, ...] = ()
    slots: tuple[SlotState, ...] = ()

    def table(self, qualified: str) -> TableInfo | None:
        """The table `schema.table` (a table without a schema is in `public`)."""
        return self.tables.get(qualified if "." in qualified else f"public.{qualified}")

    def publication(self, name: str) -> PublicationInfo | None:
        """The publication named `name`, or None."""
        for publication in self.publications:
            if publication.name == name:
                return publication
        return None

    def publications_of(self, qualified: str) -> list[PublicationInfo]:
        """The publications that publish the table."""
        return [p for p in self.publications if p.publishes(qualified) is not None]

    @property
    def publishes_generated_columns(self) -> bool:
        """Whether logical replication can publish generated columns (PostgreSQL 18)."""
        return self.version_num >= 180000


@runtime_checkable
class CatalogSource(Protocol):
    """A SoR reader that can read its database's catalog (PostgreSQL)."""

    def database_info(self, tables: Sequence[str]) -> DatabaseInfo:
        """The catalog of the tables `schema.table`, their publications included."""
        ...


_SERVER_SQL = (
    "SELECT current_setting('server_version_num')::int AS version_num,"
    " current_setting('server_version') AS version, current_setting('wal_level') AS wal_level,"
    " current_database() AS database, current_user AS user_name"
)

_TABLES_SQL = (
    "SELECT c.oid::bigint AS oid, n.nspname AS schema, c.relname AS name,"
    " c.relkind::text AS relkind, c.relreplident::text AS replident,"
    " c.reltuples::bigint AS reltuples,"
    " has_schema_privilege(n.oid, 'USAGE') AND has_table_privilege(c.oid, 'SELECT')"
    " AS readable"
    " FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace"
    " WHERE c.relkind IN ('r', 'p') AND NOT c.relispartition"
    " AND n.nspname NOT IN ('pg_catalog', 'information_schema')"
    " AND n.nspname !~ '^pg_(toast|temp_)'"
    " AND (%s::text[] IS NULL OR n.nspname = ANY(%s::text[]))"
    " AND (%s::text[] IS NULL OR n.nspname || '.' || c.relname = ANY(%s::text[]))"
    " ORDER BY n.nspname, c.relname"
)

_COLUMNS_SQL = (
    "SELECT a.attrelid::bigint AS oid, a.attname AS name,"
    " format_type(a.atttypid, a.atttypmod) AS type,"
    " COALESCE(bt.typname, t.typname)::text AS base_type,"
    " COALESCE(bt.typcategory, t.typcategory)::text AS category,"
    " COALESCE(bt.typtype, t.typtype)::text AS typtype,"
    " a.attnotnull AS not_null, a.attgenerated::text AS generated,"
    " CASE WHEN t.typname IN ('varchar', 'bpchar') AND a.atttypmod > 4"
    " THEN a.atttypmod - 4 END AS max_length,"
    " has_column_privilege(a.attrelid, a.attnum, 'SELECT') AS readable"
    " FROM pg_attribute a JOIN pg_type t ON t.oid = a.atttypid"
    " LEFT JOIN pg_type bt ON t.typtype = 'd' AND bt.oid = t.typbasetype"
    " WHERE a.attrelid = ANY(%s::oid[]) AND a.attnum > 0 AND NOT a.attisdropped"
    " ORDER BY a.attrelid, a.attnum"
)

_INDEXES_SQL = (
    "SELECT i.indrelid::bigint AS oid, ic.relname AS name, i.indisprimary AS is_primary,"
    " i.indisunique AS is_unique, i.indisreplident AS is_replica_identity,"
    " (i.indpred IS NOT NULL OR i.indexprs IS NOT NULL) AS partial,"
    " ARRAY(SELECT a.attname::text FROM unnest(i.indkey::int2[]) WITH ORDINALITY AS k(num, ord)"
    " JOIN pg_attribute a ON a.attrelid = i.indrelid AND a.attnum = k.num"
    " WHERE k.ord <= i.indnkeyatts ORDER BY k.ord) AS columns"
    " FROM pg_index i JOIN pg_class ic ON ic.oid = i.indexrelid"
    " WHERE i.indrelid = ANY(%s::oid[]) AND (i.indisunique OR i.indisreplident)"
    " ORDER BY i.indrelid, NOT i.indisprimary, ic.relname"
)

_FOREIGN_KEYS_SQL = (
    "SELECT c.conrelid::bigint AS oid, fn.nspname || '.' || fc.relname AS refers,"
    " ARRAY(SELECT a.attname::text FROM unnest(c.conkey) WITH ORDINALITY AS k(num, ord)"
    " JOIN pg_attribute a ON a.attrelid = c.conrelid AND a.attnum = k.num ORDER BY k.ord)"
    " AS columns"
    " FROM pg_constraint c JOIN pg_class fc ON fc.oid = c.confrelid"
    " JOIN pg_namespace fn ON fn.oid = fc.relnamespace"
    " WHERE c.contype = 'f' AND c.conrelid = ANY(%s::oid[])"
    " ORDER BY c.conrelid, c.conname"
)

_PUBLICATIONS_SQL = (
    "SELECT oid::bigint AS pubid, pubname, puballtables, pubinsert, pubupdate, pubdelete,"
    " pubtruncate FROM pg_publication ORDER BY pubname"
)
#: The tables a publication names (pg_publication_rel), with PostgreSQL 15's column lists and
#: row filters. Read from the catalog, not the pg_publication_tables view: the view expands
#: every publication to all its tables, and its cost estimate alone makes PostgreSQL JIT-compile
#: it (a 1,234-relation catalog, one publication, 3 tables: 356 ms for the view, 2.0 ms for
#: these queries, 7 alternating rounds).
_PUBLISHED_SQL_15 = (
    "SELECT pr.prpubid::bigint AS pubid, pr.prrelid::bigint AS oid,"
    " CASE WHEN pr.prattrs IS NULL THEN NULL ELSE ARRAY(SELECT a.attname::text"
    " FROM pg_attribute a WHERE a.attrelid = pr.prrelid AND a.attnum = ANY(pr.prattrs::int2[])"
    " ORDER BY a.attnum) END AS columns,"
    " pg_get_expr(pr.prqual, pr.prrelid) AS rowfilter"
    " FROM pg_publication_rel pr WHERE pr.prrelid = ANY(%s::oid[])"
)
_PUBLISHED_SQL = (
    "SELECT prpubid::bigint AS pubid, prrelid::bigint AS oid, NULL::text[] AS columns,"
    " NULL::text AS rowfilter FROM pg_publication_rel WHERE prrelid = ANY(%s::oid[])"
)
#: PostgreSQL 15's FOR TABLES IN SCHEMA publications.
_PUBLISHED_SCHEMAS_SQL = (
    "SELECT pn.pnpubid::bigint AS pubid, n.nspname AS schema FROM pg_publication_namespace pn"
    " JOIN pg_namespace n ON n.oid = pn.pnnspid"
)

#: The logical slots of the current database and the WAL each one retains.
SLOTS_SQL = (
    "SELECT slot_name, plugin, active, wal_status, "
    "pg_wal_lsn_diff(pg_current_wal_lsn(), restart_lsn)::bigint AS retained_bytes, "
    "pg_wal_lsn_diff(confirmed_flush_lsn, '0/0')::bigint AS confirmed_lsn "
    "FROM pg_replication_slots WHERE slot_type = 'logical' AND database = current_database() "
    "ORDER BY slot_name"
)


def slot_states(rows: Sequence[Mapping[str, Any]]) -> list[SlotState]:
    """The rows of `SLOTS_SQL` as `SlotState`s."""
    return [
        SlotState(
            name=str(r["slot_name"]),
            plugin=str(r["plugin"] or ""),
            active=bool(r["active"]),
            retained_bytes=int(r["retained_bytes"] or 0),
            wal_status=str(r["wal_status"] or ""),
            confirmed_lsn=(int(r["confirmed_lsn"]) if r["confirmed_lsn"] is not None else None),
        )
        for r in rows
    ]


def read_catalog(
    query: Query,
    *,
    schemas: Sequence[str] | None = None,
    tables: Sequence[str] | None = None,
    slots: bool = True,
) -> DatabaseInfo:
    """The database's tables (all user tables, or those in `schemas`, or the `schema.table`
    names in `tables`), publications and (`slots`) logical replication slots. Partitions are
    left out: their partitioned table stands for them."""
    server = query(_SERVER_SQL, [])[0]
    schema_list = list(schemas) if schemas else None
    table_list = [t if "." in t else f"public.{t}" for t in tables] if tables is not None else None
    table_rows = query(_TABLES_SQL, [schema_list, schema_list, table_list, table_list])
    oids = [int(r["oid"]) for r in table_rows]
    columns: dict[int, list[ColumnInfo]] = {oid: [] for oid in oids}
    indexes: dict[int, list[IndexInfo]] = {oid: [] for oid in oids}
    foreign: dict[int, list[ForeignKey]] = {oid: [] for oid in oids}
    if oids:
        for r in query(_COLUMNS_SQL, [oids]):
            columns[int(r["oid"])].append(
                ColumnInfo(
                    name=str(r["name"]),
                    type=str(r["type"]),
                    kind=column_kind(str(r["base_type"]), str(r["category"]), str(r["typtype"])),
                    not_null=bool(r["not_null"]),
                    generated=bool(r["generated"]),
                    max_length=int(r["max_length"]) if r["max_length"] is not None else None,
                    readable=bool(r["readable"]),
                )
            )
        for r in query(_INDEXES_SQL, [oids]):
            indexes[int(r["oid"])].append(
                IndexInfo(
                    name=str(r["name"]),
                    columns=tuple(r["columns"] or ()),
                    primary=bool(r["is_primary"]),
                    unique=bool(r["is_unique"]),
                    replica_identity=bool(r["is_replica_identity"]),
                    partial=bool(r["partial"]),
                )
            )
        for r in query(_FOREIGN_KEYS_SQL, [oids]):
            foreign[int(r["oid"])].append(
                ForeignKey(columns=tuple(r["columns"] or ()), references=str(r["refers"]))
            )
    found: dict[str, TableInfo] = {}
    for r in table_rows:
        oid = int(r["oid"])
        estimate = int(r["reltuples"])
        info = TableInfo(
            schema=str(r["schema"]),
            name=str(r["name"]),
            columns=tuple(columns[oid]),
            replica_identity=_IDENTITIES.get(str(r["replident"]), ReplicaIdentity.DEFAULT),
            indexes=tuple(indexes[oid]),
            foreign_keys=tuple(foreign[oid]),
            rows_estimate=estimate if estimate >= 0 else None,
            readable=bool(r["readable"]),
            partitioned=str(r["relkind"]) == "p",
        )
        found[info.qualified] = info
    version_num = int(server["version_num"])
    return DatabaseInfo(
        version_num=version_num,
        version=str(server["version"]),
        wal_level=str(server["wal_level"]),
        database=str(server["database"]),
        user=str(server["user_name"]),
        tables=found,
        publications=_publications(
            query, version_num, {int(r["oid"]): f"{r['schema']}.{r['name']}" for r in table_rows}
        ),
        slots=tuple(slot_states(query(SLOTS_SQL, []))) if slots else (),
    )


def _publications(
    query: Query, version_num: int, tables: Mapping[int, str]
) -> tuple[PublicationInfo, ...]:
    """Every publication, and how it publishes each of `tables` (oid -> `schema.table`): named
    in it, in one of its schemas (PostgreSQL 15), or by FOR ALL TABLES."""
    rows = query(_PUBLICATIONS_SQL, [])
    named: dict[int, dict[str, PublishedTable]] = {int(r["pubid"]): {} for r in rows}
    if tables:
        sql = _PUBLISHED_SQL_15 if version_num >= 150000 else _PUBLISHED_SQL
        for r in query(sql, [list(tables)]):
            columns = r["columns"]
            named.setdefault(int(r["pubid"]), {})[tables[int(r["oid"])]] = PublishedTable(
                columns=tuple(columns) if columns is not None else None,
                row_filter=str(r["rowfilter"]) if r["rowfilter"] is not None else None,
            )
    schemas: dict[int, set[str]] = {}
    if version_num >= 150000:
        for r in query(_PUBLISHED_SCHEMAS_SQL, []):
            schemas.setdefault(int(r["pubid"]), set()).add(str(r["schema"]))
    out = []
    for r in rows:
        pubid = int(r["pubid"])
        published = dict(named.get(pubid, {}))
        for qualified in tables.values():
            schema = qualified.split(".")[0]
            if bool(r["puballtables"]) or schema in schemas.get(pubid, set()):
                published.setdefault(qualified, PublishedTable())
        out.append(
            PublicationInfo(
                name=str(r["pubname"]),
                all_tables=bool(r["puballtables"]),
                inserts=bool(r["pubinsert"]),
                updates=bool(r["pubupdate"]),
                deletes=bool(r["pubdelete"]),
                truncates=bool(r["pubtruncate"]),
                tables=published,
            )
        )
    return tuple(out)
