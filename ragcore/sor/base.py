"""The SoR port and the SQL both readers share.

One batched query per table and call (never one per id): Retrieve verifies all hits of a
request with `verify`, the worker re-reads TOAST-placeholder rows with `fetch_entities`, reindex
and reconcile stream a tenant with `scan`. Every table is read through its `TableMapping` (the
same one ingest maps change events with), so what Retrieve compares is what ingest indexed. An
entity id names its table (`<table>:<key>`): ids of tables the reader has no mapping for are
reported as unmapped, never as missing, so nothing acts on a table it cannot see.

One row never fails a call: whatever a row's content raises while it is mapped (metadata that
is not JSON, a referenced document that cannot be read, a value the driver could not decode:
`UnreadableValue`) is converted at the row (`entity_of_row`, `verdict_of_row`) into that row's
`SorRowError`, reported to the reader's `RowFaults`; only the SoR failing (`SorUnavailableError`,
`SorTableError`) still fails the call.
"""

from __future__ import annotations

import logging
import re
import threading
import time
from collections import OrderedDict
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Protocol, runtime_checkable

from ragcore.errors import (
    ConfigError,
    DocumentError,
    MappingError,
    RagstreamError,
    SchemaDriftError,
    SorRowError,
    SorTableError,
    UnavailableError,
)
from ragcore.mapping import (
    RowView,
    TableCatalog,
    TableMapping,
    parse_json,
    parse_metadata,
    to_datetime,
    version_of,
)
from ragcore.plan import ContentHasher, build_entity
from schemas.entities import Entity, EntityVersion

log = logging.getLogger(__name__)

_IDENT = re.compile(r"^[A-Za-z_][A-Za-z0-9_]{0,62}$")


@dataclass(frozen=True, slots=True)
class SorVerdict:
    """What the SoR says about one entity right now.

    `mapped` is False when the entity's table is not one the reader can read (not configured,
    or the table cannot be queried): such an entity is neither confirmed nor denied.
    `row_error` is set when the row was read but its content cannot be judged (the reason of
    its `SorRowError`): it exists, carries no content hash and is neither confirmed nor denied.
    """

    entity_id: str
    exists: bool
    deleted: bool = False
    content_hash: str | None = None
    entity_type: str | None = None
    mapped: bool = True
    row_error: str | None = None

    def __post_init__(self) -> None:
        if self.row_error is not None and not (
            self.exists and self.mapped and self.content_hash is None
        ):
            raise ValueError(
                f"{self.entity_id}: an unreadable row's verdict exists, is mapped and has no "
                "content hash"
            )


class SystemOfRecord(Protocol):
    """Read access to the SoR tables that feed the index."""

    @property
    def catalog(self) -> TableCatalog:
        """The tables this reader reads."""
        ...

    def verify(self, tenant_id: str, entity_ids: Sequence[str]) -> dict[str, SorVerdict]:
        """Existence, soft deletion and content hash of each id, one query per table."""
        ...

    def fetch_entities(
        self, tenant_id: str | None, entity_ids: Sequence[str]
    ) -> Mapping[str, Entity | SorRowError]:
        """The live (not soft-deleted) entities among `entity_ids`, as ingest would map them;
        a row that cannot be mapped is its `SorRowError` (the others are still returned), to
        be raised for that entity. Ids of unmapped tables are left out."""
        ...

    def scan(
        self, tenant_id: str, batch: int = 500, table: str | None = None
    ) -> Iterator[Entity | SorRowError]:
        """Every live entity of the tenant (of one table, by its name, or of all tables in
        catalog order), in key order per table, `batch` rows per round trip. A row that cannot
        be mapped is yielded as its `SorRowError` and the scan goes on: callers report it and
        never take it for a missing row."""
        ...

    def count(self, tenant_id: str, table: str | None = None) -> int:
        """How many live entities the tenant has (progress of a reindex)."""
        ...

    def check(self) -> None:
        """Raise when the SoR is unreachable (health checks, startup)."""
        ...

    def close(self) -> None:
        """Release connections."""
        ...


@dataclass(frozen=True, slots=True)
class SlotState:
    """One logical replication slot: whether a consumer is attached, how much WAL it retains
    and PostgreSQL's `wal_status` (`lost`: WAL it needed was removed)."""

    name: str
    plugin: str
    active: bool
    retained_bytes: int
    wal_status: str
    #: the slot's `confirmed_flush_lsn` as a byte position (None: not known)
    confirmed_lsn: int | None = None


@runtime_checkable
class SlotSource(Protocol):
    """A SoR that can list its replication slots (PostgreSQL)."""

    def replication_slots(self) -> list[SlotState]:
        """The database's logical slots and the WAL each retains."""
        ...


@runtime_checkable
class TableProbe(Protocol):
    """A SoR reader that can tell, without a query for any entity, which mapped tables it cannot
    read (a renamed or dropped mapped column, a missing table, no privilege)."""

    def probe_tables(self) -> dict[str, str]:
        """`schema.table` -> why it cannot be read, for every unreadable mapped table. Raises
        `SorUnavailableError` when the SoR itself is unreachable."""
        ...


def quote_ident(name: str, mark: str = '"') -> str:
    """Quote a configured identifier after checking it is a plain one (no injection). SQLite
    reads a double-quoted name that matches no column as a string literal (a dropped column
    would read as its own name): its readers quote with backticks (`mark`), which are
    identifiers only."""
    if not _IDENT.match(name):
        raise ConfigError(f"not a plain SQL identifier: {name!r}")
    return f"{mark}{name}{mark}"


class SqlShape:
    """SQL text for one mapped table, with a driver-specific placeholder.

    `qualified=False` drops the schema (SQLite has none).
    """

    def __init__(self, mapping: TableMapping, placeholder: str, *, qualified: bool = True) -> None:
        parts = mapping.table.split(".") if qualified else [mapping.table_name]
        mark = '"' if qualified else "`"  # not qualified: SQLite (see `quote_ident`)

        def q(name: str) -> str:
            return quote_ident(name, mark)

        self._q = q
        self.table = ".".join(q(p) for p in parts)
        self.mapping = mapping
        self.ph = placeholder
        self.columns = mapping.columns()
        self.select_list = ", ".join(q(c) for c in self.columns)
        verdict = mapping.verdict_columns()
        #: what a verdict selects (`TableMapping.verdict_columns`; None: `select_list`)
        self.verdict_list = None if verdict is None else ", ".join(q(c) for c in verdict)
        self._keys = [q(c) for c in mapping.key_columns]

    def _key_expr(self) -> str:
        return self._keys[0] if len(self._keys) == 1 else f"({', '.join(self._keys)})"

    def _key_marks(self) -> str:
        marks = ", ".join([self.ph] * len(self._keys))
        return marks if len(self._keys) == 1 else f"({marks})"

    def _tenant_clause(self) -> str:
        column = self.mapping.tenant_column
        return "" if column is None else f" AND {self._q(column)} = {self.ph}"

    def _live_clause(self) -> str:
        column = self.mapping.deleted_at_column
        return "" if column is None else f" AND {self._q(column)} IS NULL"

    def tenant_params(self, tenant_id: str) -> list[Any]:
        """The parameter of the tenant clause (none for a constant-tenant table)."""
        return [] if self.mapping.tenant_column is None else [tenant_id]

    def by_keys(self, n: int, with_tenant: bool, *, verdicts: bool = False) -> str:
        """SELECT the mapped columns of `n` keys (optionally within one tenant); `verdicts`:
        only the columns a verdict reads, when the table has fewer (`verdict_list`)."""
        marks = ", ".join([self._key_marks()] * n)
        where = f"{self._key_expr()} IN ({marks})"
        if with_tenant:
            where += self._tenant_clause()
        columns = self.verdict_list if verdicts and self.verdict_list else self.select_list
        return f"SELECT {columns} FROM {self.table} WHERE {where}"

    def probe(self) -> str:
        """SELECT the mapped columns of no row: fails exactly when a mapped column or the
        table is gone (or not readable)."""
        return f"SELECT {self.select_list} FROM {self.table} WHERE 1 = 0"

    def count_live(self) -> str:
        """SELECT the number of a tenant's live rows (column `n`)."""
        where = "1 = 1" + self._tenant_clause() + self._live_clause()
        return f"SELECT COUNT(*) AS n FROM {self.table} WHERE {where}"

    def scan_page(self, with_cursor: bool) -> str:
        """One keyset page of a tenant's live rows, in key order."""
        where = "1 = 1" + self._tenant_clause() + self._live_clause()
        if with_cursor:
            where += f" AND {self._key_expr()} > {self._key_marks()}"
        return (
            f"SELECT {self.select_list} FROM {self.table} WHERE {where} "
            f"ORDER BY {', '.join(self._keys)} LIMIT {self.ph}"
        )


def group_by_table(
    catalog: TableCatalog, entity_ids: Sequence[str]
) -> tuple[dict[str, tuple[TableMapping, list[tuple[str, ...]], list[str]]], list[str]]:
    """Split entity ids by table: label -> (mapping, keys, ids), and the ids of no mapped
    table (or not well formed for theirs)."""
    groups: dict[str, tuple[TableMapping, list[tuple[str, ...]], list[str]]] = {}
    unmapped: list[str] = []
    for entity_id in dict.fromkeys(entity_ids):
        mapping = catalog.for_entity(entity_id)
        if mapping is None:
            unmapped.append(entity_id)
            continue
        try:
            key = mapping.key_of(entity_id)
        except MappingError:
            unmapped.append(entity_id)
            continue
        _, keys, ids = groups.setdefault(mapping.label, (mapping, [], []))
        keys.append(key)
        ids.append(entity_id)
    return groups, unmapped


def row_to_verdict(
    row: Mapping[str, Any], mapping: TableMapping, hasher: ContentHasher, where: str
) -> SorVerdict:
    """Turn a selected row into a verdict, computing the hash when the table has none (not
    for a soft-deleted row: it is deleted whatever its content)."""
    view = RowView(row, where)
    entity_id = mapping.row_entity_id(view)
    deleted = (
        mapping.deleted_at_column is not None and row.get(mapping.deleted_at_column) is not None
    )
    content_hash: str | None = None
    if mapping.content_hash_column is not None and row.get(mapping.content_hash_column):
        content_hash = str(row[mapping.content_hash_column]).strip().lower()
    elif not deleted:
        entity = row_to_entity(row, mapping, hasher, where)
        content_hash = entity.content_hash
    return SorVerdict(
        entity_id=entity_id,
        exists=True,
        deleted=deleted,
        content_hash=content_hash,
        entity_type=view.optional_text(mapping.type_column) or mapping.entity_type_default,
    )


def row_to_entity(
    row: Mapping[str, Any],
    mapping: TableMapping,
    hasher: ContentHasher,
    where: str,
) -> Entity:
    """Map a selected row exactly as ingest maps a change event's `after`."""
    view = RowView(row, where)
    version: EntityVersion = version_of(view, mapping, lsn=None, snapshot=False)
    return build_entity(
        view,
        mapping,
        tenant_id=mapping.row_tenant(view),
        entity_id=mapping.row_entity_id(view),
        version=version,
        hasher=hasher,
        where=where,
    )


@dataclass(frozen=True, slots=True)
class UnreadableValue:
    """A column value the SoR driver could not turn into Python (JSON nested deeper than
    Python parses, a timestamp outside Python's years 1-9999): the reader keeps this marker in
    the row so that the failure is the row's (`SorRowError` at the row boundary), not the
    whole query's."""

    reason: str


class _UnreadableColumnError(MappingError):
    """A selected column holds an `UnreadableValue`."""

    code = "VALUE_UNDECODABLE"

    def __init__(self, column: str, reason: str, where: str) -> None:
        super().__init__(f"{where}: column {column!r} cannot be decoded ({reason})")
        self.column = column


#: What a row's content never raises: the SoR failing keeps its own meaning (callers pause and
#: retry, or treat the table as unreadable), so the row boundary lets these through.
_NOT_THE_ROWS: tuple[type[Exception], ...] = (UnavailableError, SorTableError)


class RowFaults:
    """Where a reader reports its unreadable rows: one WARNING line per row, naming its
    table, entity, column and reason; the same (table, entity, reason) at most once per
    `every_s` seconds (a row that every request hits must not flood the log: the exclusion
    metric counts each hit), with the number of repeats left out since. Thread-safe."""

    def __init__(
        self,
        every_s: float = 300.0,
        size: int = 10_000,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self._every = every_s
        self._size = size
        self._clock = clock
        self._seen: OrderedDict[tuple[str, str, str], tuple[float, int]] = OrderedDict()
        self._lock = threading.Lock()

    def report(self, error: SorRowError, who: str) -> None:
        """Log `error` (of the row `who` names) unless it was logged within `every_s`."""
        key = (error.table, who, error.reason)
        now = self._clock()
        with self._lock:
            last, left_out = self._seen.get(key, (None, 0))
            if last is not None and now - last < self._every:
                self._seen[key] = (last, left_out + 1)
                return
            self._seen[key] = (now, 0)
            self._seen.move_to_end(key)
            while len(self._seen) > self._size:
                self._seen.popitem(last=False)
        log.warning(
            "SoR row unreadable: table %s, entity %s, column %s, reason %s%s: %s",
            error.table,
            who,
            error.column or "-",
            error.reason,
            f" ({left_out} more reads of it since the last line)" if left_out else "",
            error,
        )


def entity_of_row(
    row: Mapping[str, Any],
    mapping: TableMapping,
    hasher: ContentHasher,
    where: str,
    faults: RowFaults,
) -> Entity | SorRowError:
    """The row boundary of `fetch_entities` and `scan`: the row's entity, or its
    `SorRowError` (reported to `faults`) when anything in its content raises."""
    try:
        _check_decoded(row, where)
        return row_to_entity(row, mapping, hasher, where)
    except _NOT_THE_ROWS:
        raise
    except Exception as exc:  # noqa: BLE001 - the row boundary: whatever a row's content raises is that row's fault
        return row_fault(row, mapping, exc, faults)


def verdict_of_row(
    row: Mapping[str, Any],
    mapping: TableMapping,
    hasher: ContentHasher,
    where: str,
    faults: RowFaults,
) -> SorVerdict | SorRowError:
    """The row boundary of `verify`: the row's verdict; when its content raises, a verdict
    with `row_error` (the error reported to `faults`), or the `SorRowError` itself when not
    even the row's entity id can be formed."""
    deleted = (
        mapping.deleted_at_column is not None and row.get(mapping.deleted_at_column) is not None
    )
    try:
        if not deleted:  # a soft-deleted row's content is not read
            _check_decoded(row, where)
        return row_to_verdict(row, mapping, hasher, where)
    except _NOT_THE_ROWS:
        raise
    except Exception as exc:  # noqa: BLE001 - the row boundary: whatever a row's content raises is that row's fault
        error = row_fault(row, mapping, exc, faults)
    if error.entity_id is None:
        return error
    return SorVerdict(
        entity_id=error.entity_id, exists=True, deleted=deleted, row_error=error.reason
    )


def row_fault(
    row: Mapping[str, Any], mapping: TableMapping, exc: Exception, faults: RowFaults
) -> SorRowError:
    """The typed error of a row whose content raised `exc`, naming the table, the entity (or
    the row's key when it forms no entity id), the column when it is known, and the cause's
    type; reported to `faults`."""
    entity_id = row_entity_id_or_none(row, mapping)
    column = _column_at_fault(row, mapping, exc)
    reason = exc.code if isinstance(exc, RagstreamError) else type(exc).__name__
    who = entity_id or "key (" + ", ".join(f"{c}={row.get(c)!r}" for c in mapping.key_columns) + ")"
    error = SorRowError(
        f"{mapping.table} row {who}"
        + (f", column {column!r}" if column is not None else "")
        + f" cannot be read: {type(exc).__name__}: {exc}",
        table=mapping.table,
        entity_id=entity_id,
        reason=reason,
        column=column,
    )
    faults.report(error, who)
    return error


def row_entity_id_or_none(row: Mapping[str, Any], mapping: TableMapping) -> str | None:
    """The row's entity id, or None when its key columns form none."""
    try:
        return mapping.row_entity_id(RowView(row, "sor"))
    except MappingError:
        return None


def _check_decoded(row: Mapping[str, Any], where: str) -> None:
    for column, value in row.items():
        if isinstance(value, UnreadableValue):
            raise _UnreadableColumnError(column, value.reason, where)


def _column_at_fault(row: Mapping[str, Any], mapping: TableMapping, exc: Exception) -> str | None:
    """The column whose value raised, when it can be told: named by the error, the document
    column for a document's error, else the first JSON or timestamp column that fails to
    parse again on its own."""
    if isinstance(exc, _UnreadableColumnError):
        return exc.column
    if isinstance(exc, SchemaDriftError) and exc.columns:
        return ", ".join(exc.columns)
    if isinstance(exc, DocumentError) and mapping.document is not None:
        return mapping.document.column
    checks: list[tuple[str | None, Callable[[object], object]]] = [
        (mapping.metadata_column, lambda v: parse_metadata(v, "")),
        *((c, lambda v: parse_json(v, "")) for c in mapping.json_columns),
        (mapping.created_at_column, lambda v: to_datetime(v, "")),
        (mapping.updated_at_column, lambda v: to_datetime(v, "")),
    ]
    for column, parse in checks:
        if column is None or row.get(column) is None:
            continue
        try:
            parse(row[column])
        except (MappingError, RecursionError):
            return column
    return None


def missing_verdicts(ids: Sequence[str], *, mapped: bool) -> dict[str, SorVerdict]:
    """Verdicts for ids the SoR does not hold (`mapped`) or cannot tell about (not mapped)."""
    return {i: SorVerdict(entity_id=i, exists=False, mapped=mapped) for i in ids}


def tables_of(catalog: TableCatalog, table: str | None) -> list[TableMapping]:
    """One table by name, or all of them."""
    if table is None:
        return list(catalog)
    return [catalog.require(table)]


def per_tenant(mappings: Sequence[TableMapping], tenant_id: str) -> list[TableMapping]:
    """The tables that can hold rows of `tenant_id` (a constant-tenant table holds only its
    own tenant's)."""
    return [m for m in mappings if m.tenant is None or m.tenant == tenant_id]
