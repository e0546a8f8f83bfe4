"""`SystemOfRecord` over PostgreSQL (psycopg 3 pool, production) and SQLite (embedded)."""

from __future__ import annotations

import sqlite3
import threading
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

import psycopg
from psycopg.rows import dict_row
from psycopg_pool import ConnectionPool

from ragstream.errors import RagstreamError
from ragstream.sor.base import SorVerdict, SqlShape, row_to_entity, row_to_verdict
from schemas.entities import Entity
from streams.mapping import TableMapping
from streams.plan import ContentHasher


class SorUnavailableError(RagstreamError):
    """The system of record cannot be reached or refused the query."""

    code = "SOR_UNAVAILABLE"


class _SqlReader:
    """The query logic both drivers share; subclasses only run SQL."""

    def __init__(
        self, table: str, mapping: TableMapping, hasher: ContentHasher, placeholder: str
    ) -> None:
        self.mapping = mapping
        self.hasher = hasher
        self.shape = SqlShape(table, mapping, placeholder)

    def _query(self, sql: str, params: Sequence[Any]) -> list[dict[str, Any]]:
        raise NotImplementedError

    def verify(self, tenant_id: str, entity_ids: Sequence[str]) -> dict[str, SorVerdict]:
        """Existence, soft deletion and content hash of each id (missing ids: exists=False)."""
        ids = list(dict.fromkeys(entity_ids))
        if not ids:
            return {}
        rows = self._query(self.shape.by_ids(len(ids), with_tenant=True), [*ids, tenant_id])
        found = {
            v.entity_id: v
            for v in (row_to_verdict(r, self.mapping, self.hasher, "sor") for r in rows)
        }
        return {i: found.get(i, SorVerdict(entity_id=i, exists=False)) for i in ids}

    def fetch_entities(self, tenant_id: str | None, entity_ids: Sequence[str]) -> dict[str, Entity]:
        """Live entities among the ids (a tenant, when given, must match)."""
        ids = list(dict.fromkeys(entity_ids))
        if not ids:
            return {}
        params: list[Any] = [*ids] + ([tenant_id] if tenant_id is not None else [])
        rows = self._query(self.shape.by_ids(len(ids), with_tenant=tenant_id is not None), params)
        out: dict[str, Entity] = {}
        deleted_col = self.mapping.deleted_at_column
        for row in rows:
            if deleted_col is not None and row.get(deleted_col) is not None:
                continue
            entity = row_to_entity(row, self.mapping, self.hasher, "sor")
            out[entity.entity_id] = entity
        return out

    def count(self, tenant_id: str) -> int:
        """The tenant's live rows."""
        rows = self._query(self.shape.count_live(), [tenant_id])
        return int(rows[0]["n"])

    def scan(self, tenant_id: str, batch: int = 500) -> Iterator[Entity]:
        """Keyset-paginated scan of a tenant's live rows."""
        cursor: str | None = None
        while True:
            if cursor is None:
                rows = self._query(self.shape.scan_page(False), [tenant_id, batch])
            else:
                rows = self._query(self.shape.scan_page(True), [tenant_id, cursor, batch])
            for row in rows:
                yield row_to_entity(row, self.mapping, self.hasher, "sor", tenant_id=tenant_id)
            if len(rows) < batch:
                return
            cursor = rows[-1][self.mapping.id_column]


class PostgresSor(_SqlReader):
    """PostgreSQL through a psycopg 3 connection pool."""

    def __init__(
        self,
        dsn: str,
        *,
        table: str = "public.entities",
        mapping: TableMapping | None = None,
        hasher: ContentHasher,
        min_size: int = 1,
        max_size: int = 8,
        timeout_s: float = 5.0,
    ) -> None:
        super().__init__(table, mapping or TableMapping(), hasher, "%s")
        self._timeout = timeout_s
        self._pool = ConnectionPool(
            dsn,
            min_size=min_size,
            max_size=max_size,
            timeout=timeout_s,
            open=True,
            kwargs={"autocommit": True},
        )

    def _query(self, sql: str, params: Sequence[Any]) -> list[dict[str, Any]]:
        try:
            with (
                self._pool.connection(timeout=self._timeout) as conn,
                conn.cursor(row_factory=dict_row) as cur,
            ):
                return cur.execute(sql.encode(), list(params)).fetchall()
        except (psycopg.OperationalError, psycopg.errors.QueryCanceled) as exc:
            raise SorUnavailableError(f"PostgreSQL unavailable: {exc}") from exc
        except psycopg.Error as exc:
            raise SorUnavailableError(f"PostgreSQL query failed: {exc}") from exc

    def check(self) -> None:
        """One round trip."""
        self._query("SELECT 1 AS ok", [])

    def close(self) -> None:
        """Close the pool."""
        self._pool.close()


class SqliteSor(_SqlReader):
    """The embedded SQLite SoR (one connection per thread, WAL mode)."""

    def __init__(
        self,
        path: Path,
        *,
        table: str = "entities",
        mapping: TableMapping | None = None,
        hasher: ContentHasher,
    ) -> None:
        super().__init__(table, mapping or TableMapping(), hasher, "?")
        self._path = path
        self._local = threading.local()

    def _conn(self) -> sqlite3.Connection:
        conn: sqlite3.Connection | None = getattr(self._local, "conn", None)
        if conn is None:
            conn = sqlite3.connect(self._path, timeout=5.0)
            conn.row_factory = sqlite3.Row
            self._local.conn = conn
        return conn

    def _query(self, sql: str, params: Sequence[Any]) -> list[dict[str, Any]]:
        try:
            return [dict(r) for r in self._conn().execute(sql, list(params)).fetchall()]
        except sqlite3.Error as exc:
            raise SorUnavailableError(f"SQLite SoR query failed: {exc}") from exc

    def check(self) -> None:
        """One round trip."""
        self._query("SELECT 1 AS ok", [])

    def close(self) -> None:
        """Close this thread's connection."""
        conn = getattr(self._local, "conn", None)
        if conn is not None:
            conn.close()
            self._local.conn = None
