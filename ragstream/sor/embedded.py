"""The embedded system of record: a SQLite `entities` table whose writes publish the change
events Debezium's PostgreSQL connector would (same envelope, same topic naming): snapshot `r`
events for a bulk load, `c`/`u`/`d` (+ tombstone) for changes.

Each write commits the row and a monotonically increasing LSN in one transaction, then
publishes the event and waits for the broker's acknowledgement, so a `put` that returned is
on its way to the index.
"""

from __future__ import annotations

import json
import sqlite3
import threading
from collections.abc import Iterable, Mapping
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from confluent_kafka import Producer

from ragstream.errors import RagstreamError
from ragstream.resources import package_dir
from ragstream.sor.debezium_format import change_event, encode_key, encode_value, topic_for
from schemas.events import Op

TABLE = "entities"
COLUMNS = (
    "id",
    "company_id",
    "entity_type",
    "name",
    "content",
    "metadata",
    "content_hash",
    "created_at",
    "updated_at",
    "deleted_at",
)


def _now() -> str:
    return datetime.now(UTC).isoformat().replace("+00:00", "Z")


class EmbeddedSor:
    """SQLite SoR + Debezium-format publishing to a Kafka(-protocol) topic."""

    def __init__(self, path: Path, bootstrap_servers: str, *, server: str = "sor") -> None:
        self.path = path
        self.topic = topic_for(server=server, table=TABLE)
        self._server = server
        self._lock = threading.Lock()
        path.parent.mkdir(parents=True, exist_ok=True)
        self._conn = sqlite3.connect(path, check_same_thread=False, timeout=10)
        self._conn.row_factory = sqlite3.Row
        self._conn.execute("PRAGMA journal_mode=WAL")
        ddl = (package_dir("schemas") / "sql" / "entities.sqlite.sql").read_text()
        self._conn.executescript(ddl)
        self._conn.execute("CREATE TABLE IF NOT EXISTS sor_meta (k TEXT PRIMARY KEY, v INTEGER)")
        self._conn.execute("INSERT OR IGNORE INTO sor_meta VALUES ('lsn', 1000)")
        self._conn.commit()
        self._producer = Producer(
            {"bootstrap.servers": bootstrap_servers, "enable.idempotence": True, "linger.ms": 5}
        )

    # --- reads -------------------------------------------------------------------------------

    def row(self, entity_id: str) -> dict[str, Any] | None:
        """The row as stored, or None."""
        found = self._conn.execute(f"SELECT * FROM {TABLE} WHERE id = ?", (entity_id,)).fetchone()
        return dict(found) if found is not None else None

    def count(self) -> int:
        """Rows in the table."""
        return int(self._conn.execute(f"SELECT count(*) FROM {TABLE}").fetchone()[0])

    # --- writes ------------------------------------------------------------------------------

    def _next_lsn(self) -> int:
        self._conn.execute("UPDATE sor_meta SET v = v + 8 WHERE k = 'lsn'")
        return int(self._conn.execute("SELECT v FROM sor_meta WHERE k = 'lsn'").fetchone()[0])

    def put(
        self,
        entity_id: str,
        tenant: str,
        content: str,
        *,
        title: str = "",
        entity_type: str = "KNOWLEDGE_ARTIFACT",
        metadata: Mapping[str, Any] | None = None,
    ) -> Op:
        """Insert or update a row (clears a soft delete) and publish its change event."""
        with self._lock:
            before = self.row(entity_id)
            now = _now()
            after = {
                "id": entity_id,
                "company_id": tenant,
                "entity_type": entity_type,
                "name": title,
                "content": content,
                "metadata": json.dumps(dict(metadata or {}), sort_keys=True),
                "content_hash": None,
                "created_at": before["created_at"] if before else now,
                "updated_at": now,
                "deleted_at": None,
            }
            with self._conn:
                self._conn.execute(
                    f"INSERT OR REPLACE INTO {TABLE} ({', '.join(COLUMNS)}) "
                    f"VALUES ({', '.join('?' * len(COLUMNS))})",
                    [after[c] for c in COLUMNS],
                )
                lsn = self._next_lsn()
            op = Op.UPDATE if before else Op.CREATE
            self._publish(entity_id, change_event(op, before=before, after=after, lsn=lsn))
            return op

    def soft_delete(self, entity_id: str) -> bool:
        """Set deleted_at; False when the row does not exist."""
        with self._lock:
            before = self.row(entity_id)
            if before is None:
                return False
            after = {**before, "deleted_at": _now(), "updated_at": _now()}
            with self._conn:
                self._conn.execute(
                    f"UPDATE {TABLE} SET deleted_at = ?, updated_at = ? WHERE id = ?",
                    (after["deleted_at"], after["updated_at"], entity_id),
                )
                lsn = self._next_lsn()
            self._publish(entity_id, change_event(Op.UPDATE, before=before, after=after, lsn=lsn))
            return True

    def delete(self, entity_id: str) -> bool:
        """Hard delete: a `d` event then a tombstone; False when the row does not exist."""
        with self._lock:
            before = self.row(entity_id)
            if before is None:
                return False
            with self._conn:
                self._conn.execute(f"DELETE FROM {TABLE} WHERE id = ?", (entity_id,))
                lsn = self._next_lsn()
            self._publish(entity_id, change_event(Op.DELETE, before=before, after=None, lsn=lsn))
            self._publish(entity_id, None)
            return True

    def load(self, rows: Iterable[Mapping[str, Any]]) -> int:
        """Bulk-insert rows that are not there yet (no events: `snapshot` publishes them)."""
        added = 0
        with self._lock, self._conn:
            for row in rows:
                now = _now()
                values = {
                    "content_hash": None,
                    "created_at": now,
                    "updated_at": now,
                    "deleted_at": None,
                    "entity_type": "KNOWLEDGE_ARTIFACT",
                    "name": "",
                    **row,
                    "metadata": json.dumps(dict(row.get("metadata") or {}), sort_keys=True),
                }
                cur = self._conn.execute(
                    f"INSERT OR IGNORE INTO {TABLE} ({', '.join(COLUMNS)}) "
                    f"VALUES ({', '.join('?' * len(COLUMNS))})",
                    [values[c] for c in COLUMNS],
                )
                added += cur.rowcount
        return added

    def snapshot(self) -> int:
        """Publish every row as a snapshot `r` event, like Debezium's initial snapshot."""
        with self._lock:
            rows = [dict(r) for r in self._conn.execute(f"SELECT * FROM {TABLE} ORDER BY id")]
            lsn = int(self._conn.execute("SELECT v FROM sor_meta WHERE k = 'lsn'").fetchone()[0])
            for i, row in enumerate(rows):
                marker = "last" if i == len(rows) - 1 else "true"
                event = change_event(Op.READ, before=None, after=row, lsn=lsn, snapshot=marker)
                self._publish(row["id"], event, flush=False)
            self._flush()
            return len(rows)

    def _publish(self, entity_id: str, event: Mapping[str, Any] | None, flush: bool = True) -> None:
        self._producer.produce(
            self.topic, key=encode_key({"id": entity_id}), value=encode_value(event)
        )
        self._producer.poll(0)
        if flush:
            self._flush()

    def _flush(self) -> None:
        if self._producer.flush(30):
            raise RagstreamError("the broker did not acknowledge the SoR's change events")

    def close(self) -> None:
        """Flush and close."""
        self._producer.flush(10)
        self._conn.close()
