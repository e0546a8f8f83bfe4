"""Writes to a PostgreSQL system of record the way an application does (`ragstream sor` on the
dev stack with `--sor postgres`): plain SQL on the mapped tables; Debezium captures the changes
from the WAL and publishes them, nothing here touches Kafka."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from datetime import UTC, datetime
from typing import Any

import psycopg
from psycopg.rows import dict_row
from psycopg.types.json import Jsonb

from ragcore.errors import ConfigError, SorUnavailableError
from ragcore.mapping import TableMapping
from ragcore.plan import PlanConfig
from ragcore.sor.base import quote_ident
from schemas.events import Op


class PostgresWriter:
    """`SorWriter` over PostgreSQL: one autocommit connection, one statement per call."""

    def __init__(self, dsn: str, plan: PlanConfig) -> None:
        self.catalog = plan.catalog
        self._prefix = plan.topic_prefix
        try:
            self._conn = psycopg.connect(dsn, autocommit=True, row_factory=dict_row)
        except psycopg.OperationalError as exc:
            raise SorUnavailableError(f"PostgreSQL unavailable: {exc}") from exc

    def mapping(self, table: str) -> TableMapping:
        """The mapped table named `table`."""
        return self.catalog.require(table)

    def topic(self, table: str) -> str:
        """The topic Debezium publishes the table's changes to."""
        return self.mapping(table).topic_name(self._prefix)

    @staticmethod
    def _table(mapping: TableMapping) -> str:
        return ".".join(quote_ident(p) for p in mapping.table.split("."))

    @staticmethod
    def _where_key(mapping: TableMapping) -> str:
        return " AND ".join(f"{quote_ident(c)}::text = %s" for c in mapping.key_columns)

    def row(self, table: str, key: Sequence[object]) -> dict[str, Any] | None:
        """The row as stored, or None."""
        mapping = self.mapping(table)
        cur = self._conn.execute(
            f"SELECT * FROM {self._table(mapping)} WHERE {self._where_key(mapping)}".encode(),
            [str(k) for k in key],
        )
        found = cur.fetchone()
        return dict(found) if found is not None else None

    def count(self, table: str) -> int:
        """Rows in the table."""
        mapping = self.mapping(table)
        cur = self._conn.execute(f"SELECT count(*) AS n FROM {self._table(mapping)}".encode())
        found = cur.fetchone()
        return int(found["n"]) if found is not None else 0

    def put(self, table: str, values: Mapping[str, Any]) -> Op:
        """INSERT ... ON CONFLICT (key) DO UPDATE: the row's other columns are kept, a soft
        delete is cleared and `updated_at` is set when the table maps them."""
        mapping = self.mapping(table)
        row: dict[str, Any] = {
            c: Jsonb(v) if isinstance(v, dict | list) else v for c, v in values.items()
        }
        now = datetime.now(UTC)
        if mapping.updated_at_column is not None:
            row[mapping.updated_at_column] = now
        if mapping.deleted_at_column is not None:
            row[mapping.deleted_at_column] = None
        columns = list(row)
        keys = ", ".join(quote_ident(c) for c in mapping.key_columns)
        updates = [c for c in columns if c not in mapping.key_columns]
        set_list = ", ".join(f"{quote_ident(c)} = EXCLUDED.{quote_ident(c)}" for c in updates)
        statement = (
            f"INSERT INTO {self._table(mapping)} ({', '.join(quote_ident(c) for c in columns)}) "
            f"VALUES ({', '.join(['%s'] * len(columns))}) ON CONFLICT ({keys}) "
            + (f"DO UPDATE SET {set_list}" if updates else "DO NOTHING")
            + " RETURNING (xmax = 0) AS inserted"
        )
        cur = self._conn.execute(statement.encode(), [row[c] for c in columns])
        found = cur.fetchone()
        return Op.CREATE if found is not None and found["inserted"] else Op.UPDATE

    def soft_delete(self, table: str, key: Sequence[object]) -> bool:
        """Set the soft-delete column; False when the row does not exist."""
        mapping = self.mapping(table)
        column = mapping.deleted_at_column
        if column is None:
            raise ConfigError(f"{mapping.table} has no soft-delete column")
        sets = [f"{quote_ident(column)} = now()"]
        if mapping.updated_at_column is not None:
            sets.append(f"{quote_ident(mapping.updated_at_column)} = now()")
        cur = self._conn.execute(
            f"UPDATE {self._table(mapping)} SET {', '.join(sets)} "
            f"WHERE {self._where_key(mapping)}".encode(),
            [str(k) for k in key],
        )
        return cur.rowcount > 0

    def delete(self, table: str, key: Sequence[object]) -> bool:
        """DELETE the row; False when it does not exist."""
        mapping = self.mapping(table)
        cur = self._conn.execute(
            f"DELETE FROM {self._table(mapping)} WHERE {self._where_key(mapping)}".encode(),
            [str(k) for k in key],
        )
        return cur.rowcount > 0

    def close(self) -> None:
        """Close the connection."""
        self._conn.close()
