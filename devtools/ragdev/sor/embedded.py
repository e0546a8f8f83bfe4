"""The embedded system of record: SQLite tables whose writes publish the change events
Debezium's PostgreSQL connector would (same envelope, same topic naming): snapshot `r` events
for a bulk load, `c`/`u`/`d` (+ tombstone) for changes.

The tables are the mapped ones (`PlanConfig.tables`); rows are written by column name and keyed
by the mapping's key columns, so every table shape works. Each write commits the row and a
monotonically increasing LSN in one transaction, then publishes the event and waits for the
broker's acknowledgement, so a `put` that returned is on its way to the index.
"""

from __future__ import annotations

import json
import sqlite3
import threading
from collections.abc import Iterable, Mapping, Sequence
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from confluent_kafka import Producer

from ragcore.errors import ConfigError, RagstreamError
from ragcore.mapping import TableMapping
from ragcore.plan import PlanConfig
from ragcore.sor.base import quote_ident
from ragdev.sor.debezium_format import change_event, encode_key, encode_value
from schemas.events import Op


def _now() -> str:
    return datetime.now(UTC).isoformat().replace("+00:00", "Z")


def _stored(value: object) -> object:
    """A Python value as SQLite stores it (JSON objects as text)."""
    return json.dumps(value, sort_keys=True) if isinstance(value, dict | list) else value


class EmbeddedSor:
    """SQLite SoR + Debezium-format publishing to Kafka(-protocol) topics, one per table."""

    def __init__(
        self,
        path: Path,
        bootstrap_servers: str,
        *,
        plan: PlanConfig,
        ddl: Sequence[str] = (),
    ) -> None:
        """`ddl`: SQL scripts creating the tables (idempotent, `CREATE TABLE IF NOT EXISTS`)."""
        self.path = path
        self.catalog = plan.catalog
        self._prefix = plan.topic_prefix
        self._lock = threading.Lock()
        path.parent.mkdir(parents=True, exist_ok=True)
        self._conn = sqlite3.connect(path, check_same_thread=False, timeout=10)
        self._conn.row_factory = sqlite3.Row
        self._conn.execute("PRAGMA journal_mode=WAL")
        for script in ddl:
            self._conn.executescript(script)
        self._conn.execute("CREATE TABLE IF NOT EXISTS sor_meta (k TEXT PRIMARY KEY, v INTEGER)")
        self._conn.execute("INSERT OR IGNORE INTO sor_meta VALUES ('lsn', 1000)")
        self._conn.commit()
        self._closed = False
        self._producer = Producer(
            {"bootstrap.servers": bootstrap_servers, "enable.idempotence": True, "linger.ms": 5}
        )

    # --- tables ------------------------------------------------------------------------------

    def mapping(self, table: str) -> TableMapping:
        """The mapped table named `table` (its label, e.g. `tickets`)."""
        return self.catalog.require(table)

    def topic(self, table: str) -> str:
        """The topic a table's change events go to."""
        return self.mapping(table).topic_name(self._prefix)

    @staticmethod
    def _sql_table(mapping: TableMapping) -> str:
        return quote_ident(mapping.table_name)

    @staticmethod
    def _where_key(mapping: TableMapping) -> str:
        return " AND ".join(f"{quote_ident(c)} = ?" for c in mapping.key_columns)

    # --- reads -------------------------------------------------------------------------------

    def row(self, table: str, key: Sequence[object]) -> dict[str, Any] | None:
        """The row as stored, or None."""
        mapping = self.mapping(table)
        found = self._conn.execute(
            f"SELECT * FROM {self._sql_table(mapping)} WHERE {self._where_key(mapping)}",
            [str(k) for k in key],
        ).fetchone()
        return dict(found) if found is not None else None

    def count(self, table: str | None = None) -> int:
        """Rows in one table, or in all mapped tables."""
        mappings = [self.mapping(table)] if table is not None else list(self.catalog)
        return sum(
            int(self._conn.execute(f"SELECT count(*) FROM {self._sql_table(m)}").fetchone()[0])
            for m in mappings
        )

    # --- writes ------------------------------------------------------------------------------

    def _next_lsn(self) -> int:
        self._conn.execute("UPDATE sor_meta SET v = v + 8 WHERE k = 'lsn'")
        return int(self._conn.execute("SELECT v FROM sor_meta WHERE k = 'lsn'").fetchone()[0])

    def _key(self, mapping: TableMapping, values: Mapping[str, Any]) -> list[object]:
        missing = [c for c in mapping.key_columns if values.get(c) in (None, "")]
        if missing:
            raise ConfigError(f"{mapping.table}: a row needs its key columns {missing}")
        return [values[c] for c in mapping.key_columns]

    def _upsert_row(self, mapping: TableMapping, after: Mapping[str, Any]) -> None:
        columns = list(after)
        self._conn.execute(
            f"INSERT OR REPLACE INTO {self._sql_table(mapping)} "
            f"({', '.join(quote_ident(c) for c in columns)}) "
            f"VALUES ({', '.join('?' * len(columns))})",
            [_stored(after[c]) for c in columns],
        )

    def put(self, table: str, values: Mapping[str, Any]) -> Op:
        """Insert or update a row (clearing a soft delete; `updated_at`/`created_at` set when
        the table maps them) and publish its change event."""
        mapping = self.mapping(table)
        key = self._key(mapping, values)
        with self._lock:
            before = self.row(table, key)
            now = _now()
            after: dict[str, Any] = {**(before or {}), **values}
            if mapping.created_at_column is not None:
                after[mapping.created_at_column] = (before or {}).get(
                    mapping.created_at_column
                ) or values.get(mapping.created_at_column, now)
            if mapping.updated_at_column is not None:
                after[mapping.updated_at_column] = now
            if mapping.deleted_at_column is not None:
                after[mapping.deleted_at_column] = None
            with self._conn:
                self._upsert_row(mapping, after)
                lsn = self._next_lsn()
            stored = self.row(table, key)
            assert stored is not None
            op = Op.UPDATE if before else Op.CREATE
            self._publish(mapping, stored, self._event(mapping, op, before, stored, lsn))
            return op

    def soft_delete(self, table: str, key: Sequence[object]) -> bool:
        """Set the soft-delete column; False when the row does not exist."""
        mapping = self.mapping(table)
        column = mapping.deleted_at_column
        if column is None:
            raise ConfigError(f"{mapping.table} has no soft-delete column")
        with self._lock:
            before = self.row(table, key)
            if before is None:
                return False
            after = {**before, column: _now()}
            if mapping.updated_at_column is not None:
                after[mapping.updated_at_column] = after[column]
            with self._conn:
                self._upsert_row(mapping, after)
                lsn = self._next_lsn()
            self._publish(mapping, after, self._event(mapping, Op.UPDATE, before, after, lsn))
            return True

    def delete(self, table: str, key: Sequence[object]) -> bool:
        """Hard delete: a `d` event then a tombstone; False when the row does not exist."""
        mapping = self.mapping(table)
        with self._lock:
            before = self.row(table, key)
            if before is None:
                return False
            with self._conn:
                self._conn.execute(
                    f"DELETE FROM {self._sql_table(mapping)} WHERE {self._where_key(mapping)}",
                    [str(k) for k in key],
                )
                lsn = self._next_lsn()
            self._publish(mapping, before, self._event(mapping, Op.DELETE, before, None, lsn))
            self._publish(mapping, before, None)
            return True

    def load(self, table: str, rows: Iterable[Mapping[str, Any]]) -> int:
        """Bulk-insert rows that are not there yet (no events: `snapshot` publishes them)."""
        mapping = self.mapping(table)
        added = 0
        with self._lock, self._conn:
            for row in rows:
                now = _now()
                values = dict(row)
                for column in (mapping.created_at_column, mapping.updated_at_column):
                    if column is not None:
                        values.setdefault(column, now)
                columns = list(values)
                cur = self._conn.execute(
                    f"INSERT OR IGNORE INTO {self._sql_table(mapping)} "
                    f"({', '.join(quote_ident(c) for c in columns)}) "
                    f"VALUES ({', '.join('?' * len(columns))})",
                    [_stored(values[c]) for c in columns],
                )
                added += cur.rowcount
        return added

    def snapshot(self) -> int:
        """Publish every row of every table as a snapshot `r` event, like Debezium's initial
        snapshot."""
        with self._lock:
            lsn = int(self._conn.execute("SELECT v FROM sor_meta WHERE k = 'lsn'").fetchone()[0])
            total = 0
            mappings = list(self.catalog)
            for t, mapping in enumerate(mappings):
                order = ", ".join(quote_ident(c) for c in mapping.key_columns)
                rows = [
                    dict(r)
                    for r in self._conn.execute(
                        f"SELECT * FROM {self._sql_table(mapping)} ORDER BY {order}"
                    )
                ]
                for i, row in enumerate(rows):
                    last = t == len(mappings) - 1 and i == len(rows) - 1
                    event = self._event(
                        mapping, Op.READ, None, row, lsn, snapshot="last" if last else "true"
                    )
                    self._publish(mapping, row, event, flush=False)
                total += len(rows)
            self._flush()
            return total

    def _event(
        self,
        mapping: TableMapping,
        op: Op,
        before: Mapping[str, Any] | None,
        after: Mapping[str, Any] | None,
        lsn: int,
        *,
        snapshot: str = "false",
    ) -> dict[str, Any]:
        return change_event(
            op,
            before=before,
            after=after,
            table=mapping.table_name,
            schema=mapping.schema_name,
            server=self._prefix,
            lsn=lsn,
            snapshot=snapshot,
        )

    def _publish(
        self,
        mapping: TableMapping,
        row: Mapping[str, Any],
        event: Mapping[str, Any] | None,
        flush: bool = True,
    ) -> None:
        key = {c: row[c] for c in mapping.key_columns}
        self._producer.produce(
            mapping.topic_name(self._prefix), key=encode_key(key), value=encode_value(event)
        )
        self._producer.poll(0)
        if flush:
            self._flush()

    def _flush(self) -> None:
        if self._producer.flush(30):
            raise RagstreamError("the broker did not acknowledge the SoR's change events")

    def close(self) -> None:
        """Flush and close; the producer is released here, so its connections close before
        the dev stack stops the broker. Closing twice is a no-op."""
        if self._closed:
            return
        self._closed = True
        self._producer.flush(10)
        del self._producer
        self._conn.close()
