"""`SystemOfRecord` over PostgreSQL (psycopg 3 pool, production) and SQLite (embedded).

Two kinds of failure are kept apart: the SoR cannot be reached (`SorUnavailableError`: callers
pause and retry) and one table cannot be read (`SorTableError`: missing table or column, no
privilege; a configuration problem of that table that retrying does not fix).
"""

from __future__ import annotations

import json
import logging
import re
import sqlite3
import threading
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any
from urllib.parse import unquote

import psycopg
from psycopg import abc as pg_abc
from psycopg.abc import AdaptContext, Buffer
from psycopg.adapt import Loader
from psycopg.conninfo import conninfo_to_dict
from psycopg.pq import Format
from psycopg.rows import dict_row
from psycopg.types.json import set_json_loads
from psycopg_pool import ConnectionPool

from ragcore.errors import SorRowError, SorTableError, SorUnavailableError
from ragcore.mapping import TableCatalog, TableMapping
from ragcore.plan import ContentHasher
from ragcore.sor.base import (
    RowFaults,
    SlotState,
    SorVerdict,
    SqlShape,
    UnreadableValue,
    entity_of_row,
    group_by_table,
    missing_verdicts,
    per_tenant,
    row_entity_id_or_none,
    tables_of,
    verdict_of_row,
)
from ragcore.sor.pgcatalog import SLOTS_SQL, DatabaseInfo, read_catalog, slot_states
from schemas.entities import Entity

__all__ = ["PostgresSor", "SlotState", "SorTableError", "SorUnavailableError", "SqliteSor"]

log = logging.getLogger(__name__)

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
        #: the log of this reader's unreadable rows (one line per row and 5 minutes)
        self.faults = RowFaults()

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
        ids = [row_entity_id_or_none(r, mapping) for r in bare]
        again = [mapping.key_of(i) for i in ids if i is not None]
        # a row whose key forms no entity id stays as read: its verdict reports the row
        nameless = [r for r, i in zip(bare, ids, strict=True) if i is None]
        kept = [r for r in rows if r.get(column)] + nameless
        return kept + self._rows_by_keys(mapping, again, tenant_id)

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
            found: dict[str, SorVerdict] = {}
            nameless: SorRowError | None = None
            for row in rows:
                # one row that cannot be judged is that row's verdict, never the request's
                verdict = verdict_of_row(row, mapping, self.hasher, "sor", self.faults)
                if isinstance(verdict, SorRowError):
                    nameless = verdict
                else:
                    found[verdict.entity_id] = verdict
            for i in ids:
                if i in found:
                    out[i] = found[i]
                elif nameless is not None:
                    # a row whose key forms no entity id may be this one: never deny it
                    out[i] = SorVerdict(entity_id=i, exists=True, row_error=nameless.reason)
                else:
                    out[i] = SorVerdict(entity_id=i, exists=False)
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

    def fetch_entities(
        self, tenant_id: str | None, entity_ids: Sequence[str]
    ) -> dict[str, Entity | SorRowError]:
        """Live entities among the ids (a tenant, when given, must match); a row that cannot
        be mapped is its `SorRowError`, the other rows are still returned."""
        groups, _unmapped = group_by_table(self._catalog, entity_ids)
        out: dict[str, Entity | SorRowError] = {}
        for mapping, keys, ids in groups.values():
            if tenant_id is not None and mapping.tenant not in (None, tenant_id):
                continue
            deleted_col = mapping.deleted_at_column
            nameless: SorRowError | None = None
            for row in self._rows_by_keys(mapping, keys, tenant_id):
                if deleted_col is not None and row.get(deleted_col) is not None:
                    continue
                read = entity_of_row(row, mapping, self.hasher, "sor", self.faults)
                if isinstance(read, Entity):
                    out[read.entity_id] = read
                elif read.entity_id is None:
                    nameless = read
                else:
                    out[read.entity_id] = read
            if nameless is not None:
                # a row whose key forms no entity id may be any id not found: never call one
                # of them gone (a re-read would delete it)
                for i in ids:
                    out.setdefault(i, _as_entity_error(nameless, i))
        return out

    def count(self, tenant_id: str, table: str | None = None) -> int:
        """The tenant's live rows."""
        total = 0
        for mapping in per_tenant(tables_of(self._catalog, table), tenant_id):
            shape = self._shapes[mapping.label]
            rows = self._query(shape.count_live(), shape.tenant_params(tenant_id), mapping.table)
            total += int(rows[0]["n"])
        return total

    def scan(
        self, tenant_id: str, batch: int = 500, table: str | None = None
    ) -> Iterator[Entity | SorRowError]:
        """Keyset-paginated scan of a tenant's live rows, table by table; a row that cannot be
        mapped is yielded as its `SorRowError` and the scan goes on."""
        for mapping in per_tenant(tables_of(self._catalog, table), tenant_id):
            shape = self._shapes[mapping.label]
            cursor: list[Any] | None = None
            while True:
                params = shape.tenant_params(tenant_id) + (cursor or []) + [batch]
                rows = self._query(shape.scan_page(cursor is not None), params, mapping.table)
                for row in rows:
                    yield entity_of_row(row, mapping, self.hasher, "sor", self.faults)
                if len(rows) < batch:
                    break
                cursor = [rows[-1][c] for c in mapping.key_columns]


def _as_entity_error(error: SorRowError, entity_id: str) -> SorRowError:
    """`error` (of a row whose key forms no entity id) reported for `entity_id`."""
    return SorRowError(
        f"{entity_id}: not told apart from an unreadable row of {error.table}: {error}",
        table=error.table,
        entity_id=entity_id,
        reason=error.reason,
        column=error.column,
    )


def _loads_json(data: str | bytes) -> Any:
    """json/jsonb values: what Python cannot parse (nested deeper than its recursion limit,
    an integer over its digit limit) stays in the row as an `UnreadableValue`."""
    try:
        return json.loads(data)
    except (RecursionError, ValueError) as exc:
        return UnreadableValue(f"{type(exc).__name__}: {exc}")


def _tolerant(inner: type[pg_abc.Loader]) -> type[Loader]:
    """A text loader around psycopg's own (`inner`) that turns a value Python cannot hold
    (a timestamp of 'infinity' or before year 1, an interval over timedelta's range) into an
    `UnreadableValue` instead of failing the whole query: one row's value is that row's
    fault. Fetching 100k rows side by side (7 alternating rounds, medians): two timestamptz
    columns 0.63 -> 0.84 s (1.33x, ~1 us a value); rows of id, jsonb and two timestamptz
    2.22 -> 2.19 s (0.99x: `_loads_json` is no slower than psycopg's own)."""

    class Tolerant(Loader):
        def __init__(self, oid: int, context: AdaptContext | None = None) -> None:
            super().__init__(oid, context)
            self._inner = inner(oid, context)

        def load(self, data: Buffer) -> Any:
            try:
                return self._inner.load(data)
            except (psycopg.DataError, ValueError, OverflowError) as exc:
                return UnreadableValue(f"{type(exc).__name__}: {exc}")

    Tolerant.__name__ = f"Tolerant{inner.__name__}"
    return Tolerant


#: The temporal types whose values Python's datetime cannot always hold.
_TEMPORAL = ("timestamptz", "timestamp", "date", "interval")


def _tolerant_loaders() -> dict[str, type[Loader]]:
    types = psycopg.adapters.types
    out: dict[str, type[Loader]] = {}
    for name in _TEMPORAL:
        info = types.get(name)
        inner = None if info is None else psycopg.adapters.get_loader(info.oid, Format.TEXT)
        if inner is not None:
            out[name] = _tolerant(inner)
    return out


_TOLERANT_LOADERS = _tolerant_loaders()


def _configure(conn: psycopg.Connection[Any]) -> None:
    """Every pooled connection decodes values so that one row's bad value never fails a
    query (`UnreadableValue`)."""
    for name, loader in _TOLERANT_LOADERS.items():
        conn.adapters.register_loader(name, loader)
    set_json_loads(_loads_json, conn)


_PASSWORD_FIELD = re.compile(r"(password\s*=\s*)('(?:[^'\\]|\\.)*'|\S+)", re.IGNORECASE)
_URI_USERINFO = re.compile(r"([a-z][a-z0-9+.-]*://[^:/@\s]*:)([^@\s]*)@", re.IGNORECASE)
#: a DSN's password value up to the next `key=` (also when it is malformed: unquoted spaces)
_PASSWORD_VALUE = re.compile(r"password\s*=\s*(.*?)(?=\s+\w+\s*=|$)", re.IGNORECASE | re.DOTALL)


def _password_parts(dsn: str) -> set[str]:
    """Every piece of the DSN's password a message could echo: the parsed password, and for a
    DSN libpq cannot parse, each word after `password=` and a URI's `user:password@`."""
    parts: set[str] = set()
    try:
        password = conninfo_to_dict(dsn).get("password")
    except psycopg.Error:
        password = None  # not parseable: the patterns below are all there is
    if isinstance(password, str):
        parts.add(password)
    for found in _PASSWORD_VALUE.finditer(dsn):
        parts.update(w.strip("'\"") for w in found.group(1).split())
    for found in _URI_USERINFO.finditer(dsn):
        parts.add(unquote(found.group(2)))
        parts.add(found.group(2))
    return {p for p in parts if p}


def redact(text: str, dsn: str) -> str:
    """`text` without the DSN's password: a `password=` field, a URI's `user:password@` and
    the password (or, for a malformed DSN, each word of it) wherever it appears: libpq echoes
    a DSN it cannot parse. The host, port and user stay: the server log needs them (clients
    never see this text)."""
    out = _URI_USERINFO.sub(r"\1***@", _PASSWORD_FIELD.sub(r"\1***", text))
    for part in sorted(_password_parts(dsn), key=len, reverse=True):
        out = out.replace(part, "***")
    return out


def describe(dsn: str) -> str:
    """Where a DSN points, for the server log: its host, port, user and database (never its
    password or other options); empty when the DSN cannot be parsed."""
    try:
        parts = conninfo_to_dict(dsn)
    except psycopg.Error:
        return ""
    return " ".join(f"{k}={parts[k]}" for k in ("host", "port", "user", "dbname") if parts.get(k))


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
        self._dsn = dsn
        where = describe(dsn)
        #: names the server in outage messages (a pool timeout says nothing of it)
        self._where = f" ({where})" if where else ""
        self._pool = ConnectionPool(
            dsn,
            min_size=min_size,
            max_size=max_size,
            timeout=timeout_s,
            configure=_configure,
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
            raise SorTableError(redact(f"cannot read {table}: {exc}".strip(), self._dsn)) from exc
        except (psycopg.OperationalError, psycopg.errors.QueryCanceled) as exc:
            # includes psycopg_pool.PoolTimeout: no connection could be made
            message = f"PostgreSQL{self._where} unavailable: {exc}"
            raise SorUnavailableError(redact(message, self._dsn)) from exc
        except psycopg.Error as exc:
            message = f"PostgreSQL{self._where} query failed: {exc}"
            raise SorUnavailableError(redact(message, self._dsn)) from exc

    def check(self) -> None:
        """One round trip."""
        self._query("SELECT 1 AS ok", [], "-")

    def replication_slots(self) -> list[SlotState]:
        """Every logical replication slot of the database and the WAL it holds back: an
        inactive slot (its Debezium connector is down) keeps WAL until it is consumed again or
        dropped; a `lost` slot has lost WAL (a gap the index must close by a reconcile)."""
        return slot_states(self._query(SLOTS_SQL, [], "pg_replication_slots"))

    def database_info(self, tables: Sequence[str]) -> DatabaseInfo:
        """The catalog of the mapped `tables` (`schema.table`): columns, keys, REPLICA
        IDENTITY, publications (`ragcore.sor.pgcatalog`; catalog queries only)."""
        return read_catalog(
            lambda sql, params: self._query(sql, params, "pg_catalog"), tables=tables, slots=False
        )

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
