"""`SystemOfRecord` over PostgreSQL (psycopg 3 pool, production) and SQLite (embedded).

Two kinds of failure are kept apart: the SoR cannot be reached (`SorUnavailableError`: callers
pause and retry) and one table cannot be read (`SorTableError`: missing table or column, no
privilege; a configuration problem of that table that retrying does not fix).
"""

from __future__ import annotations

import logging
import sqlite3
import threading
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

import psycopg
from psycopg.rows import dict_row
from psycopg_pool import ConnectionPool

from ragcore.errors import SorTableError, SorUnavailableError
from ragcore.mapping import RowView, TableCatalog, TableMapping
from ragcore.plan import ContentHasher
from ragcore.sor.base import (
    SlotState,
    SorVerdict,
    SqlShape,
    group_by_table,
    missing_verdicts,
    per_tenant,
    row_to_entity,
    row_to_verdict,
    tables_of,
)
from schemas.entities import Entity

__all__ = ["PostgresSor", "SlotState", "SorTableError", "SorUnavailableError", "SqliteSor"]

log = logging.getLogger(__name__)

#: The logical slots of the current database and the WAL each one retains.
_SLOTS_SQL = (
    "SELECT slot_name, plugin, active, wal_status, "
    "pg_wal_lsn_diff(pg_current_wal_lsn(), restart_lsn)::bigint AS retained_bytes, "
    "pg_wal_lsn_diff(confirmed_flush_lsn, '0/0')::bigint AS confirmed_lsn "
    "FROM pg_replication_slots WHERE slot_type = 'logical' AND database = current_database() "
    "ORDER BY slot_name"
)


#: Keys per query: keeps statements and parameter lists bounded.
_CHUNK = 500


class _SqlReader:
    """The query logic both drivers share; subclasses only run SQL."""

    def __init__(
        self,
        catalog: TableCatalog,
        hasher: ContentHasher,
        placeholder: str,
        *,
        qualified: bool,
    ) -> None:
        self._catalog = catalog
        self.hasher = hasher
        self._shapes = {m.label: SqlShape(m, placeholder, qualified=qualified) for m in catalog}

    @property
    def catalog(self) -> TableCatalog:
        """The tables this reader reads."""
        return self._catalog

    def _query(self, sql: str, params: Sequence[Any], table: str) -> list[dict[str, Any]]:
        raise NotImplementedError

    def _rows_by_keys(
        self,
        mapping: TableMapping,
        keys: Sequence[tuple[str, ...]],
        tenant_id: str | None,
        *,
        verdicts: bool = False,
    ) -> list[dict[str, Any]]:
        shape = self._shapes[mapping.label]
        rows: list[dict[str, Any]] = []
        for start in range(0, len(keys), _CHUNK):
            part = keys[start : start + _CHUNK]
            params: list[Any] = [v for key in part for v in key]
            with_tenant = tenant_id is not None and mapping.tenant_column is not None
            if with_tenant and tenant_id is not None:
                params += shape.tenant_params(tenant_id)
            sql = shape.by_keys(len(part), with_tenant, verdicts=verdicts)
            rows += self._query(sql, params, mapping.table)
        return rows

    def _verdict_rows(
        self, mapping: TableMapping, keys: Sequence[tuple[str, ...]], tenant_id: str
    ) -> list[dict[str, Any]]:
        """The rows `row_to_verdict` needs: a table storing content hashes is read without its
        content (Retrieve verifies every hit, and a document's content may be large); a row
        whose stored hash is empty is read again whole, its hash computed as ingest does."""
        rows = self._rows_by_keys(mapping, keys, tenant_id, verdicts=True)
        column = mapping.content_hash_column
        if column is None:
            return rows  # read whole already
        bare = [r for r in rows if not r.get(column)]
        if not bare:
            return rows
        again = [mapping.key_of(mapping.row_entity_id(RowView(r, "sor"))) for r in bare]
        return [r for r in rows if r.get(column)] + self._rows_by_keys(mapping, again, tenant_id)

    def verify(self, tenant_id: str, entity_ids: Sequence[str]) -> dict[str, SorVerdict]:
        """Existence, soft deletion and content hash of each id (missing ids: exists=False;
        ids of unmapped or unreadable tables: mapped=False)."""
        groups, unmapped = group_by_table(self._catalog, entity_ids)
        out = missing_verdicts(unmapped, mapped=False)
        for mapping, keys, ids in groups.values():
            if mapping.tenant is not None and mapping.tenant != tenant_id:
                out.update(missing_verdicts(ids, mapped=True))
                continue
            try:
                rows = self._verdict_rows(mapping, keys, tenant_id)
            except SorTableError as exc:
                # one broken table must not fail every request: its hits are unverifiable
                log.error("cannot verify entities of %s: %s", mapping.table, exc)
                out.update(missing_verdicts(ids, mapped=False))
                continue
            found = {
                v.entity_id: v
                for v in (row_to_verdict(r, mapping, self.hasher, "sor") for r in rows)
            }
            out.update({i: found.get(i, SorVerdict(entity_id=i, exists=False)) for i in ids})
        return out

    def probe_tables(self) -> dict[str, str]:
        """`schema.table` -> the error, for each mapped table that cannot be read (one
        zero-row query per table; `TableProbe`)."""
        out: dict[str, str] = {}
        for mapping in self._catalog:
            try:
                self._query(self._shapes[mapping.label].probe(), [], mapping.table)
            except SorTableError as exc:
                out[mapping.table] = str(exc)
        return out

    def fetch_entities(self, tenant_id: str | None, entity_ids: Sequence[str]) -> dict[str, Entity]:
        """Live entities among the ids (a tenant, when given, must match)."""
        groups, _unmapped = group_by_table(self._catalog, entity_ids)
        out: dict[str, Entity] = {}
        for mapping, keys, _ids in groups.values():
            if tenant_id is not None and mapping.tenant not in (None, tenant_id):
                continue
            deleted_col = mapping.deleted_at_column
            for row in self._rows_by_keys(mapping, keys, tenant_id):
                if deleted_col is not None and row.get(deleted_col) is not None:
                    continue
                entity = row_to_entity(row, mapping, self.hasher, "sor")
                out[entity.entity_id] = entity
        return out

    def count(self, tenant_id: str, table: str | None = None) -> int:
        """The tenant's live rows."""
        total = 0
        for mapping in per_tenant(tables_of(self._catalog, table), tenant_id):
            shape = self._shapes[mapping.label]
            rows = self._query(shape.count_live(), shape.tenant_params(tenant_id), mapping.table)
            total += int(rows[0]["n"])
        return total

    def scan(self, tenant_id: str, batch: int = 500, table: str | None = None) -> Iterator[Entity]:
        """Keyset-paginated scan of a tenant's live rows, table by table."""
        for mapping in per_tenant(tables_of(self._catalog, table), tenant_id):
            shape = self._shapes[mapping.label]
            cursor: list[Any] | None = None
            while True:
                params = shape.tenant_params(tenant_id) + (cursor or []) + [batch]
                rows = self._query(shape.scan_page(cursor is not None), params, mapping.table)
                for row in rows:
                    yield row_to_entity(row, mapping, self.hasher, "sor")
                if len(rows) < batch:
                    break
                cursor = [rows[-1][c] for c in mapping.key_columns]


class PostgresSor(_SqlReader):
    """PostgreSQL through a psycopg 3 connection pool."""

    def __init__(
        self,
        dsn: str,
        *,
        catalog: TableCatalog,
        hasher: ContentHasher,
        min_size: int = 1,
        max_size: int = 8,
        timeout_s: float = 5.0,
    ) -> None:
        super().__init__(catalog, hasher, "%s", qualified=True)
        self._timeout = timeout_s
        self._pool = ConnectionPool(
            dsn,
            min_size=min_size,
            max_size=max_size,
            timeout=timeout_s,
            # after a server restart the pooled connections are dead: test before handing out
            check=ConnectionPool.check_connection,
            open=True,
            # no server-side prepared statements: after an ALTER COLUMN ... TYPE a prepared
            # SELECT fails ("cached plan must not change result type") on every pooled
            # connection that prepared it, which made the SoR unreadable until a restart
            kwargs={
                "autocommit": True,
                "connect_timeout": max(1, int(timeout_s)),
                "prepare_threshold": None,
            },
        )

    def _query(self, sql: str, params: Sequence[Any], table: str) -> list[dict[str, Any]]:
        try:
            with (
                self._pool.connection(timeout=self._timeout) as conn,
                conn.cursor(row_factory=dict_row) as cur,
            ):
                return cur.execute(sql.encode(), list(params)).fetchall()
        except (
            psycopg.errors.UndefinedTable,
            psycopg.errors.UndefinedColumn,
            psycopg.errors.InsufficientPrivilege,
            psycopg.errors.InvalidSchemaName,
        ) as exc:
            raise SorTableError(f"cannot read {table}: {exc}".strip()) from exc
        except (psycopg.OperationalError, psycopg.errors.QueryCanceled) as exc:
            # includes psycopg_pool.PoolTimeout: no connection could be made
            raise SorUnavailableError(f"PostgreSQL unavailable: {exc}") from exc
        except psycopg.Error as exc:
            raise SorUnavailableError(f"PostgreSQL query failed: {exc}") from exc

    def check(self) -> None:
        """One round trip."""
        self._query("SELECT 1 AS ok", [], "-")

    def replication_slots(self) -> list[SlotState]:
        """Every logical replication slot of the database and the WAL it holds back: an
        inactive slot (its Debezium connector is down) keeps WAL until it is consumed again or
        dropped; a `lost` slot has lost WAL (a gap the index must close by a reconcile)."""
        rows = self._query(_SLOTS_SQL, [], "pg_replication_slots")
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

    def close(self) -> None:
        """Close the pool."""
        self._pool.close()


class SqliteSor(_SqlReader):
    """The embedded SQLite SoR (one connection per thread, WAL mode). Tables are addressed
    without their schema."""

    def __init__(self, path: Path, *, catalog: TableCatalog, hasher: ContentHasher) -> None:
        super().__init__(catalog, hasher, "?", qualified=False)
        self._path = path
        self._local = threading.local()

    def _conn(self) -> sqlite3.Connection:
        conn: sqlite3.Connection | None = getattr(self._local, "conn", None)
        if conn is None:
            conn = sqlite3.connect(self._path, timeout=5.0)
            conn.row_factory = sqlite3.Row
            self._local.conn = conn
        return conn

    def _query(self, sql: str, params: Sequence[Any], table: str) -> list[dict[str, Any]]:
        try:
            return [dict(r) for r in self._conn().execute(sql, list(params)).fetchall()]
        except sqlite3.OperationalError as exc:
            if str(exc).startswith(("no such table", "no such column")):
                raise SorTableError(f"cannot read {table}: {exc}") from exc
            raise SorUnavailableError(f"SQLite SoR query failed: {exc}") from exc
        except sqlite3.Error as exc:
            raise SorUnavailableError(f"SQLite SoR query failed: {exc}") from exc

    def check(self) -> None:
        """One round trip."""
        self._query("SELECT 1 AS ok", [], "-")

    def close(self) -> None:
        """Close this thread's connection."""
        conn = getattr(self._local, "conn", None)
        if conn is not None:
            conn.close()
            self._local.conn = None
