"""Judge table mappings against a live PostgreSQL, before any change event arrives.

`check_mappings` compares each `TableMapping` with the catalog `ragcore.sor.pgcatalog` read:
the table and every mapped column exist and can be read, each column's type suits the field
that names it, the key columns identify a row and arrive with deletes, REPLICA IDENTITY gives
deletes and tenant moves what they need, the tenant column cannot be NULL, the table is
published (and its mapped columns with it). `sample_rows` adds what only the rows can tell
(NULL or invalid tenant names, a metadata column that holds no JSON object), reading a bounded
number of rows per table.

Every problem names the table, the mapping field and the fix (the SQL to run, or the field or
property to change). Errors are mappings that cannot work: the worker refuses to start with
them (`refuse_unworkable`, from `IngestWorker.check`); warnings lose or delay something (a
tenant move seen only by reconcile, a table whose changes are not published); notes inform.
`ragstream tables check` prints them all.
"""

from __future__ import annotations

import difflib
import logging
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from enum import StrEnum
from typing import Any

from ragcore.errors import ConfigError
from ragcore.mapping import TableMapping
from ragcore.sor.pgcatalog import (
    ColumnInfo,
    ColumnKind,
    DatabaseInfo,
    PublicationInfo,
    ReplicaIdentity,
    TableInfo,
)

log = logging.getLogger(__name__)

Query = Callable[[str, Sequence[Any]], list[dict[str, Any]]]


class Severity(StrEnum):
    """How bad a problem is."""

    ERROR = "error"  # the mapping cannot work: the worker refuses it
    WARNING = "warning"  # something is lost or delayed until fixed
    NOTE = "note"  # worth knowing; nothing to fix


@dataclass(frozen=True, slots=True)
class Problem:
    """One thing wrong with a table mapping, a connector or a topic, and its fix."""

    code: str
    severity: Severity
    #: `schema.table`, or "" for the database, the connector or the broker as a whole
    table: str
    #: the mapping field (`tenant_column`, `document.column`), connector property or topic
    field: str
    message: str
    #: what to do: the SQL to run, or the field or property to change
    fix: str
    #: the fix as one runnable SQL statement, when it is one
    sql: str | None = None

    def to_dict(self) -> dict[str, Any]:
        """The problem as JSON fields (`sql` only when there is a statement)."""
        doc: dict[str, Any] = {
            "severity": self.severity.value,
            "code": self.code,
            "table": self.table,
            "field": self.field,
            "message": self.message,
            "fix": self.fix,
        }
        if self.sql is not None:
            doc["sql"] = self.sql
        return doc

    def line(self) -> str:
        """One line for a log or a terminal."""
        where = " ".join(p for p in (self.table, self.field) if p)
        return f"{self.severity.value.upper()} {where}: {self.message} Fix: {self.fix}"


def quote(name: str) -> str:
    """A SQL identifier quoted for a fix statement (any name, quotes doubled)."""
    return '"' + name.replace('"', '""') + '"'


def qualified_sql(table: str) -> str:
    """`schema.table` quoted for a fix statement."""
    schema, _, name = table.rpartition(".")
    return f"{quote(schema or 'public')}.{quote(name)}"


#: The column kinds each mapping field accepts, as ingest reads them.
_TEXTUAL = frozenset({ColumnKind.TEXT, ColumnKind.ENUM})
ACCEPTED: dict[str, frozenset[ColumnKind]] = {
    "key_columns": _TEXTUAL | {ColumnKind.INTEGER, ColumnKind.NUMERIC, ColumnKind.UUID},
    "tenant_column": _TEXTUAL | {ColumnKind.INTEGER, ColumnKind.UUID},
    "type_column": _TEXTUAL,
    "title_column": _TEXTUAL | {ColumnKind.INTEGER, ColumnKind.NUMERIC, ColumnKind.UUID},
    "content_columns": _TEXTUAL
    | {
        ColumnKind.JSON,
        ColumnKind.ARRAY,
        ColumnKind.INTEGER,
        ColumnKind.NUMERIC,
        ColumnKind.UUID,
        ColumnKind.OTHER,
    },
    "json_columns": frozenset({ColumnKind.JSON, ColumnKind.TEXT}),
    "metadata_column": frozenset({ColumnKind.JSON, ColumnKind.TEXT}),
    "format_column": _TEXTUAL,
    "content_hash_column": frozenset({ColumnKind.TEXT}),
    "created_at_column": frozenset({ColumnKind.TIMESTAMP}),
    "updated_at_column": frozenset({ColumnKind.TIMESTAMP}),
    "deleted_at_column": frozenset(ColumnKind) - {ColumnKind.BOOLEAN},
    "document.format_column": _TEXTUAL,
    "document.mime_type_column": _TEXTUAL,
    "document.name_column": _TEXTUAL,
}
#: What each field's values are for (the message of a type problem says it).
_WHY = {
    "key_columns": "a key value forms the entity id",
    "tenant_column": "its value names the tenant",
    "type_column": "its value is the entity type",
    "title_column": "its value is the title",
    "content_columns": "it is indexed as text",
    "json_columns": "it is parsed as JSON",
    "metadata_column": "it must hold a JSON object",
    "format_column": "it names text, markdown or html",
    "content_hash_column": "it holds the content's hash",
    "created_at_column": "it is read as a timestamp",
    "updated_at_column": "it orders versions without a source position",
    "deleted_at_column": "a row is deleted where it is not NULL, and a boolean false is not NULL",
    "document.format_column": "it names the document format",
    "document.mime_type_column": "it holds a MIME type",
    "document.name_column": "it holds a file name",
}


def column_roles(mapping: TableMapping) -> list[tuple[str, str]]:
    """(mapping field, column) for every column the mapping reads, in field order."""
    roles: list[tuple[str, str]] = [("key_columns", c) for c in mapping.key_columns]
    single = {
        "tenant_column": mapping.tenant_column,
        "type_column": mapping.type_column,
        "title_column": mapping.title_column,
    }
    roles += [(f, c) for f, c in single.items() if c is not None]
    if mapping.document is None:
        roles += [("content_columns", c) for c in mapping.content_columns]
    else:
        doc = mapping.document
        named = {
            "document.column": doc.column,
            "document.format_column": doc.format_column,
            "document.mime_type_column": doc.mime_type_column,
            "document.name_column": doc.name_column,
        }
        roles += [(f, c) for f, c in named.items() if c is not None]
    if mapping.metadata_column is not None:
        roles.append(("metadata_column", mapping.metadata_column))
    roles += [("metadata_columns", c) for c in mapping.metadata_columns]
    rest = {
        "format_column": mapping.format_column,
        "content_hash_column": mapping.content_hash_column,
        "created_at_column": mapping.created_at_column,
        "updated_at_column": mapping.updated_at_column,
        "deleted_at_column": mapping.deleted_at_column,
    }
    roles += [(f, c) for f, c in rest.items() if c is not None]
    return roles


def _kinds(kinds: frozenset[ColumnKind]) -> str:
    return ", ".join(sorted(k.value for k in kinds))


def _suggest(name: str, choices: Sequence[str]) -> str:
    close = difflib.get_close_matches(name, choices, n=1, cutoff=0.6)
    return f" (did you mean {close[0]!r}?)" if close else ""


def check_mappings(
    mappings: Sequence[TableMapping],
    db: DatabaseInfo,
    *,
    publication: str | None = None,
    publication_created_by_connector: bool = False,
) -> list[Problem]:
    """Every problem of the mappings against the catalog `db`. `publication`: the connector's
    `publication.name` (None: any publication of the table counts);
    `publication_created_by_connector`: the connector creates or extends it at start
    (`publication.autocreate.mode` filtered or all_tables), so a table missing from it is
    only a note."""
    problems: list[Problem] = []
    if db.wal_level != "logical":
        problems.append(
            Problem(
                "WAL_LEVEL",
                Severity.WARNING,
                "",
                "wal_level",
                f"wal_level is {db.wal_level!r}: Debezium reads logical replication, which needs "
                "'logical' (if this DSN is a replica and Debezium reads the primary, check the "
                "primary)",
                "ALTER SYSTEM SET wal_level = logical; then restart PostgreSQL",
                "ALTER SYSTEM SET wal_level = logical",
            )
        )
    for mapping in mappings:
        problems += _check_table(mapping, db, publication, created=publication_created_by_connector)
    if publication is not None and db.publication(publication) is None:
        tables = ", ".join(qualified_sql(_qualified(m)) for m in mappings)
        statement = f"CREATE PUBLICATION {quote(publication)} FOR TABLE {tables}"
        problems.append(
            Problem(
                "PUBLICATION_MISSING",
                Severity.NOTE if publication_created_by_connector else Severity.WARNING,
                "",
                "publication.name",
                f"publication {publication!r} does not exist"
                + (
                    " (the connector creates it at start)"
                    if publication_created_by_connector
                    else ": the connector (publication.autocreate.mode=disabled) cannot start"
                ),
                f"run `{statement}` as the tables' owner",
                statement,
            )
        )
    return problems


def _qualified(mapping: TableMapping) -> str:
    return f"{mapping.schema_name}.{mapping.table_name}"


def _check_table(
    mapping: TableMapping,
    db: DatabaseInfo,
    publication: str | None,
    *,
    created: bool,
) -> list[Problem]:
    name = _qualified(mapping)
    table = db.table(name)
    if table is None:
        known = [t for t in db.tables if t.split(".")[0] == mapping.schema_name]
        return [
            Problem(
                "TABLE_MISSING",
                Severity.ERROR,
                name,
                "table",
                f"table {name} does not exist{_suggest(name, list(db.tables))}"
                + (
                    f" (tables in schema {mapping.schema_name}: {', '.join(known)})"
                    if known
                    else ""
                ),
                "set `table` to an existing `schema.table`, or create the table",
            )
        ]
    problems: list[Problem] = []
    if not table.readable:
        statement = (
            f"GRANT USAGE ON SCHEMA {quote(table.schema)} TO {quote(db.user)}; "
            f"GRANT SELECT ON {qualified_sql(name)} TO {quote(db.user)}"
        )
        problems.append(
            Problem(
                "TABLE_UNREADABLE",
                Severity.ERROR,
                name,
                "table",
                f"role {db.user!r} cannot read {name}: Retrieve's verification, TOAST re-reads "
                "and reconcile read it",
                f"run `{statement}`",
                statement,
            )
        )
    problems += _check_columns(mapping, table, db)
    problems += _check_key(mapping, table)
    problems += _check_identity(mapping, table)
    problems += _check_tenant(mapping, table)
    problems += _check_published(mapping, table, db, publication, created=created)
    return problems


def _check_columns(mapping: TableMapping, table: TableInfo, db: DatabaseInfo) -> list[Problem]:
    problems: list[Problem] = []
    names = [c.name for c in table.columns]
    seen: set[tuple[str, str]] = set()
    for field, column_name in column_roles(mapping):
        if (field, column_name) in seen:
            continue
        seen.add((field, column_name))
        column = table.column(column_name)
        if column is None:
            problems.append(
                Problem(
                    "COLUMN_MISSING",
                    Severity.ERROR,
                    table.qualified,
                    field,
                    f"column {column_name!r} does not exist{_suggest(column_name, names)}; "
                    f"columns: {', '.join(names)}",
                    f"set {field} to one of the table's columns (every change event would "
                    "go to the DLQ as SCHEMA_DRIFT)",
                )
            )
            continue
        if column.generated and not db.publishes_generated_columns:
            problems.append(
                Problem(
                    "COLUMN_GENERATED",
                    Severity.ERROR,
                    table.qualified,
                    field,
                    f"column {column_name!r} is generated: logical replication does not "
                    f"publish generated columns before PostgreSQL 18 (this is {db.version}), so "
                    "no change event carries it",
                    f"map a stored column instead of {column_name!r} (the application or a "
                    "trigger can fill one)",
                )
            )
        if not column.readable and table.readable:  # else TABLE_UNREADABLE says it
            statement = (
                f"GRANT SELECT ({quote(column_name)}) ON {qualified_sql(table.qualified)} "
                f"TO {quote(db.user)}"
            )
            problems.append(
                Problem(
                    "COLUMN_UNREADABLE",
                    Severity.ERROR,
                    table.qualified,
                    field,
                    f"role {db.user!r} cannot read column {column_name!r}",
                    f"run `{statement}`",
                    statement,
                )
            )
        problems += _check_type(mapping, table, field, column)
    json_read = set(mapping.columns())
    for column_name in mapping.json_columns:
        column = table.column(column_name)
        if column_name not in json_read:
            problems.append(
                Problem(
                    "JSON_COLUMN_UNUSED",
                    Severity.WARNING,
                    table.qualified,
                    "json_columns",
                    f"json_columns names {column_name!r}, which is neither a content nor a "
                    "metadata column of the mapping",
                    f"add {column_name!r} to content_columns or metadata_columns, or remove it "
                    "from json_columns",
                )
            )
        elif column is not None and column.kind not in ACCEPTED["json_columns"]:
            problems.append(_type_problem(table, "json_columns", column))
    return problems


def _type_problem(table: TableInfo, field: str, column: ColumnInfo) -> Problem:
    accepted = ACCEPTED[field]
    return Problem(
        "COLUMN_TYPE",
        Severity.ERROR,
        table.qualified,
        field,
        f"column {column.name!r} is {column.type} ({column.kind.value}); {field} accepts "
        f"{_kinds(accepted)} ({_WHY.get(field, 'as ingest reads it')})",
        f"set {field} to a column of an accepted type",
    )


def _check_type(
    mapping: TableMapping, table: TableInfo, field: str, column: ColumnInfo
) -> list[Problem]:
    where = table.qualified
    if field == "document.column":
        assert mapping.document is not None
        wanted = ColumnKind.BYTEA if mapping.document.kind == "binary" else ColumnKind.TEXT
        if column.kind is wanted:
            return []
        if column.kind is ColumnKind.TEXT:
            fix = 'set document.kind to "reference" (with root or allowed_hosts)'
        elif column.kind is ColumnKind.BYTEA:
            fix = 'set document.kind to "binary"'
        else:
            fix = "set document.column to a bytea (binary) or text (reference) column"
        return [
            Problem(
                "COLUMN_TYPE",
                Severity.ERROR,
                where,
                field,
                f"column {column.name!r} is {column.type}; a {mapping.document.kind} document "
                f"column must be {'bytea' if wanted is ColumnKind.BYTEA else 'text'}",
                fix,
            )
        ]
    accepted = ACCEPTED.get(field)
    if accepted is not None and column.kind not in accepted:
        return [_type_problem(table, field, column)]
    problems: list[Problem] = []
    if (
        field == "content_columns"
        and column.kind is ColumnKind.JSON
        and column.name not in mapping.json_columns
    ):
        problems.append(
            Problem(
                "JSON_NOT_DECLARED",
                Severity.WARNING,
                where,
                "json_columns",
                f"content column {column.name!r} is {column.type} but not in json_columns: "
                "it is indexed as raw JSON text instead of `key: value` lines",
                f'add "{column.name}" to json_columns',
            )
        )
    if field == "content_columns" and column.kind is ColumnKind.OTHER:
        problems.append(
            Problem(
                "COLUMN_TYPE_UNKNOWN",
                Severity.WARNING,
                where,
                field,
                f"content column {column.name!r} is {column.type}: Debezium renders this type "
                "in its own way (check one change event with `ragstream inspect-event`)",
                "keep it if its text reads well, else remove it from content_columns",
            )
        )
    if field == "deleted_at_column" and column.not_null:
        problems.append(
            Problem(
                "DELETED_AT_NOT_NULL",
                Severity.ERROR,
                where,
                field,
                f"column {column.name!r} is NOT NULL: a row counts as deleted where it is not "
                "NULL, so every row would be deleted",
                f"set deleted_at_column to a nullable column set on delete (or null), or run "
                f"`ALTER TABLE {qualified_sql(where)} ALTER COLUMN {quote(column.name)} "
                "DROP NOT NULL`",
            )
        )
    if field in ("updated_at_column", "created_at_column") and column.kind is ColumnKind.DATE:
        problems.append(
            Problem(
                "COLUMN_TYPE",
                Severity.ERROR,
                where,
                field,
                f"column {column.name!r} is a date: {field} reads a timestamp",
                f"set {field} to a timestamp column, or null",
            )
        )
    return problems


def _check_key(mapping: TableMapping, table: TableInfo) -> list[Problem]:
    where = table.qualified
    if any(table.column(c) is None for c in mapping.key_columns):
        return []  # COLUMN_MISSING says it
    key = list(mapping.key_columns)
    primary = list(table.primary_key)
    unique = table.unique_index_on(key)
    if unique is None:
        statement = (
            None
            if primary
            else f"ALTER TABLE {qualified_sql(where)} ADD PRIMARY KEY "
            f"({', '.join(quote(c) for c in key)})"
        )
        return [
            Problem(
                "KEY_NOT_UNIQUE",
                Severity.ERROR,
                where,
                "key_columns",
                f"key_columns {key} identify no row: no primary key or unique index covers "
                "exactly these columns, so two rows could be one entity",
                f"set key_columns to the primary key {primary}"
                if statement is None
                else f"run `{statement}` if they identify a row",
                statement,
            )
        ]
    if not primary:
        statement = (
            f"ALTER TABLE {qualified_sql(where)} ADD PRIMARY KEY USING INDEX {quote(unique.name)}"
        )
        return [
            Problem(
                "NO_PRIMARY_KEY",
                Severity.WARNING,
                where,
                "key_columns",
                f"{where} has no primary key: Debezium keys change events by it, so its "
                "events carry no Kafka key (one entity's changes are ordered only within one "
                "partition)",
                f"run `{statement}` (or set the connector's message.key.columns)",
                statement,
            )
        ]
    if set(primary) != set(key):
        carried = table.old_row_columns()
        if carried is not None and not set(key) <= carried:
            statement = f"ALTER TABLE {qualified_sql(where)} REPLICA IDENTITY FULL"
            return [
                Problem(
                    "KEY_NOT_IN_DELETES",
                    Severity.ERROR,
                    where,
                    "key_columns",
                    f"key_columns {key} are not the primary key {primary}: a delete carries "
                    f"only {sorted(carried)} (REPLICA IDENTITY "
                    f"{table.replica_identity.value.upper()}), so it cannot name the entity",
                    f"set key_columns to {primary}, or run `{statement}`",
                    statement,
                )
            ]
    return []


def _check_identity(mapping: TableMapping, table: TableInfo) -> list[Problem]:
    where = table.qualified
    statement = f"ALTER TABLE {qualified_sql(where)} REPLICA IDENTITY FULL"
    identity = table.replica_identity
    carried = table.old_row_columns()
    if identity is ReplicaIdentity.NOTHING or (
        identity is ReplicaIdentity.DEFAULT and not table.primary_key
    ):
        what = "NOTHING" if identity is ReplicaIdentity.NOTHING else "DEFAULT without a primary key"
        return [
            Problem(
                "REPLICA_IDENTITY",
                Severity.ERROR,
                where,
                "table",
                f"REPLICA IDENTITY {what}: deletes carry no old row, so no delete can be "
                "applied (and a published table refuses UPDATE and DELETE)",
                f"run `{statement}`",
                statement,
            )
        ]
    if carried is None:
        return []
    missing_key = [c for c in mapping.key_columns if c not in carried]
    if identity is ReplicaIdentity.INDEX and missing_key:
        return [
            Problem(
                "REPLICA_IDENTITY",
                Severity.ERROR,
                where,
                "key_columns",
                f"REPLICA IDENTITY USING INDEX carries {sorted(carried)}, not the key columns "
                f"{missing_key}: a delete cannot name its entity",
                f"run `{statement}`",
                statement,
            )
        ]
    tenant = mapping.tenant_column
    if tenant is not None and tenant not in carried:
        return [
            Problem(
                "REPLICA_IDENTITY",
                Severity.WARNING,
                where,
                "tenant_column",
                f"REPLICA IDENTITY {identity.value.upper()}: an update's or delete's old row "
                f"lacks the tenant column {tenant!r}, so a row moved to another tenant keeps "
                "its chunks in the old tenant until reconcile, and a delete is looked up in "
                "every tenant",
                f"run `{statement}`",
                statement,
            )
        ]
    return []


def _check_tenant(mapping: TableMapping, table: TableInfo) -> list[Problem]:
    column = table.column(mapping.tenant_column) if mapping.tenant_column else None
    if column is None or column.not_null:
        return []
    statement = (
        f"ALTER TABLE {qualified_sql(table.qualified)} ALTER COLUMN {quote(column.name)} "
        "SET NOT NULL"
    )
    return [
        Problem(
            "TENANT_NULLABLE",
            Severity.WARNING,
            table.qualified,
            "tenant_column",
            f"tenant column {column.name!r} may be NULL: a row without a tenant cannot be "
            "indexed (its change goes to the DLQ as MAPPING_ERROR)",
            f"give every row a tenant, then run `{statement}`",
            statement,
        )
    ]


def _check_published(
    mapping: TableMapping,
    table: TableInfo,
    db: DatabaseInfo,
    publication: str | None,
    *,
    created: bool,
) -> list[Problem]:
    where = table.qualified
    if publication is not None:
        named = db.publication(publication)
        if named is None:
            return []  # PUBLICATION_MISSING says it (once)
        candidates = [named]
    else:
        candidates = db.publications_of(where)
        if not candidates:
            statement = f"CREATE PUBLICATION ragstream FOR TABLE {qualified_sql(where)}"
            return [
                Problem(
                    "NOT_PUBLISHED",
                    Severity.WARNING,
                    where,
                    "table",
                    f"{where} is in no publication: Debezium's pgoutput streams only published "
                    "tables",
                    f"run `ALTER PUBLICATION <publication.name> ADD TABLE {qualified_sql(where)}`"
                    f" (or `{statement}`) as the table's owner",
                    statement,
                )
            ]
    problems: list[Problem] = []
    for pub in candidates:
        problems += _check_publication(mapping, table, pub, created=created)
    return problems


def _check_publication(
    mapping: TableMapping, table: TableInfo, pub: PublicationInfo, *, created: bool
) -> list[Problem]:
    where = table.qualified
    published = pub.publishes(where)
    if published is None:
        statement = f"ALTER PUBLICATION {quote(pub.name)} ADD TABLE {qualified_sql(where)}"
        return [
            Problem(
                "NOT_PUBLISHED",
                Severity.NOTE if created else Severity.WARNING,
                where,
                "table",
                f"{where} is not in publication {pub.name!r}"
                + (
                    " (the connector adds it at start: publication.autocreate.mode=filtered)"
                    if created
                    else ": its changes never reach Kafka"
                ),
                f"run `{statement}` as the table's owner",
                statement,
            )
        ]
    problems: list[Problem] = []
    if published.columns is not None:
        # a column the table lacks is COLUMN_MISSING; a generated one, COLUMN_GENERATED
        present = [
            c
            for c in mapping.columns()
            if (col := table.column(c)) is not None and not col.generated
        ]
        missing = [c for c in present if c not in published.columns]
        if missing:
            problems.append(
                Problem(
                    "PUBLICATION_COLUMNS",
                    Severity.ERROR,
                    where,
                    "table",
                    f"publication {pub.name!r} publishes only the columns "
                    f"{list(published.columns)} of {where}, not the mapped {missing}: every "
                    "change event would go to the DLQ as SCHEMA_DRIFT",
                    f"publish every column: `ALTER PUBLICATION {quote(pub.name)} SET TABLE "
                    f"{qualified_sql(where)}` (that resets the publication's table list: "
                    "name every table), or unmap the columns",
                )
            )
    if published.row_filter is not None:
        problems.append(
            Problem(
                "PUBLICATION_ROW_FILTER",
                Severity.NOTE,
                where,
                "table",
                f"publication {pub.name!r} publishes only the rows where "
                f"{published.row_filter}: the others are never indexed, and an update that "
                "moves a row out of the filter arrives as a delete",
                "nothing, if that is intended",
            )
        )
    lacking = [
        op
        for op, on in (("insert", pub.inserts), ("update", pub.updates), ("delete", pub.deletes))
        if not on
    ]
    if lacking:
        problems.append(
            Problem(
                "PUBLICATION_OPERATIONS",
                Severity.WARNING,
                where,
                "table",
                f"publication {pub.name!r} does not publish {', '.join(lacking)}: those "
                "changes never reach the index (reconcile finds them later)",
                f"run `ALTER PUBLICATION {quote(pub.name)} SET (publish = "
                "'insert, update, delete, truncate')`",
                f"ALTER PUBLICATION {quote(pub.name)} SET (publish = "
                "'insert, update, delete, truncate')",
            )
        )
    elif not pub.truncates:
        problems.append(
            Problem(
                "PUBLICATION_OPERATIONS",
                Severity.NOTE,
                where,
                "table",
                f"publication {pub.name!r} does not publish TRUNCATE: a truncated table's "
                "chunks stay until reconcile",
                f"run `ALTER PUBLICATION {quote(pub.name)} SET (publish = "
                "'insert, update, delete, truncate')`",
            )
        )
    return problems


# --- what only the rows can tell -------------------------------------------------------------

#: What `TenantId` accepts (ragcore/store/ids.py), as a PostgreSQL regular expression.
_TENANT_RE = "^[a-z0-9][a-z0-9_-]{0,62}$"


def sample_rows(
    query: Query, mappings: Sequence[TableMapping], db: DatabaseInfo, rows: int
) -> list[Problem]:
    """Problems in the first `rows` rows of each readable mapped table (0: none read): NULL or
    invalid tenant names, metadata that is not a JSON object."""
    problems: list[Problem] = []
    if rows <= 0:
        return problems
    for mapping in mappings:
        table = db.table(_qualified(mapping))
        if table is None or not table.readable:
            continue
        tenant = table.column(mapping.tenant_column) if mapping.tenant_column else None
        if tenant is not None and tenant.readable and tenant.kind in ACCEPTED["tenant_column"]:
            problems += _sample_tenants(query, table, tenant, rows)
        meta = table.column(mapping.metadata_column) if mapping.metadata_column else None
        if meta is not None and meta.readable and meta.kind is ColumnKind.JSON:
            problems += _sample_metadata(query, table, meta, rows)
    return problems


def _sample_tenants(query: Query, table: TableInfo, column: ColumnInfo, rows: int) -> list[Problem]:
    col = quote(column.name)
    value = f"btrim({col}::text)"
    invalid = f"({value} !~ '{_TENANT_RE}' OR strpos({value}, '__') > 0)"
    sql = (
        f"SELECT count(*) AS sampled, count(*) FILTER (WHERE {col} IS NULL) AS nulls,"
        f" count(*) FILTER (WHERE {col} IS NOT NULL AND {invalid}) AS invalid,"
        f" (array_agg(DISTINCT {col}::text) FILTER (WHERE {col} IS NOT NULL AND {invalid}))"
        f"[1:3] AS examples"
        f" FROM (SELECT {col} FROM {qualified_sql(table.qualified)} LIMIT %s) AS s"
    )
    found = query(sql, [rows])[0]
    sampled, nulls, bad = int(found["sampled"]), int(found["nulls"]), int(found["invalid"])
    problems: list[Problem] = []
    where = table.qualified
    if nulls:
        problems.append(
            Problem(
                "TENANT_NULLS",
                Severity.WARNING,
                where,
                "tenant_column",
                f"{nulls} of {sampled} rows read have no tenant ({column.name} IS NULL): each "
                "goes to the DLQ as MAPPING_ERROR",
                f"give them a tenant (UPDATE {qualified_sql(where)} SET {quote(column.name)} "
                f"= ... WHERE {quote(column.name)} IS NULL), then SET NOT NULL",
            )
        )
    if bad:
        examples = ", ".join(repr(e) for e in found["examples"] or [])
        problems.append(
            Problem(
                "TENANT_INVALID",
                Severity.WARNING,
                where,
                "tenant_column",
                f"{bad} of {sampled} rows read name no valid tenant (e.g. {examples}): a tenant "
                "name is 1-63 characters of a-z, 0-9, _ and -, starting with a letter or digit, "
                "without '__'; those rows go to the DLQ as MAPPING_ERROR",
                "map a column holding such names (the application or a trigger can keep one, "
                "e.g. lower-case slugs), or fix the values",
            )
        )
    return problems


def _sample_metadata(
    query: Query, table: TableInfo, column: ColumnInfo, rows: int
) -> list[Problem]:
    col = quote(column.name)
    kind = f"jsonb_typeof({col}::jsonb)"
    sql = (
        f"SELECT count(*) AS sampled, count(*) FILTER (WHERE {col} IS NOT NULL AND {kind} NOT IN"
        f" ('object', 'null')) AS other"
        f" FROM (SELECT {col} FROM {qualified_sql(table.qualified)} LIMIT %s) AS s"
    )
    found = query(sql, [rows])[0]
    other = int(found["other"])
    if not other:
        return []
    return [
        Problem(
            "METADATA_NOT_OBJECT",
            Severity.WARNING,
            table.qualified,
            "metadata_column",
            f"{other} of {int(found['sampled'])} rows read hold JSON that is not an object in "
            f"{column.name!r}: each goes to the DLQ as MAPPING_ERROR",
            f"move {column.name!r} to content_columns and json_columns (its values are "
            "rendered as text), or store objects",
        )
    ]


def refuse_unworkable(mappings: Sequence[TableMapping], db: DatabaseInfo) -> list[Problem]:
    """Log the warnings of `check_mappings` and raise `ConfigError` naming every mapping that
    cannot work (its errors); return the problems found."""
    problems = check_mappings(mappings, db)
    errors = [p for p in problems if p.severity is Severity.ERROR]
    for problem in problems:
        if problem.severity is Severity.WARNING:
            log.warning("table mapping: %s", problem.line())
    if errors:
        listed = "\n  ".join(p.line() for p in errors)
        raise ConfigError(
            f"{len(errors)} table mapping problem(s) in RAGSTREAM_PLAN__TABLES make it unable "
            f"to work:\n  {listed}\n(`ragstream tables check` lists every problem)"
        )
    return problems
