"""Write change events exactly as Debezium's PostgreSQL connector does (JSON converter,
`schemas.enable=false`): the embedded SoR publishes these, and tests use them to produce
realistic streams. Key: `{"id": ...}`. Value: `{before, after, source, op, ts_ms, transaction}`.

Column encodings follow the connector's defaults: TIMESTAMPTZ -> `io.debezium.time.ZonedTimestamp`
(ISO-8601 UTC string), JSONB -> `io.debezium.data.Json` (a JSON string), TEXT -> string,
BYTEA -> base64 string (`binary.handling.mode=bytes` through the JSON converter).
"""

from __future__ import annotations

import base64
import json
import time
from collections.abc import Mapping
from datetime import UTC, datetime
from typing import Any

from schemas.events import Op

CONNECTOR_VERSION = "3.1.0.Final"


def zoned_timestamp(moment: datetime) -> str:
    """`io.debezium.time.ZonedTimestamp` text of an aware datetime."""
    return moment.astimezone(UTC).isoformat().replace("+00:00", "Z")


def row_json(row: Mapping[str, Any]) -> dict[str, Any]:
    """Encode a row's Python values the way the connector does."""
    out: dict[str, Any] = {}
    for column, value in row.items():
        if isinstance(value, datetime):
            out[column] = zoned_timestamp(value)
        elif isinstance(value, bytes | bytearray | memoryview):
            out[column] = base64.b64encode(bytes(value)).decode("ascii")
        elif isinstance(value, dict | list):
            out[column] = json.dumps(value, sort_keys=True)
        else:
            out[column] = value
    return out


def change_event(
    op: Op,
    *,
    before: Mapping[str, Any] | None,
    after: Mapping[str, Any] | None,
    table: str = "entities",
    schema: str = "public",
    db: str = "sor",
    server: str = "sor",
    lsn: int,
    tx_id: int | None = None,
    ts_ms: int | None = None,
    snapshot: str = "false",
) -> dict[str, Any]:
    """One change-event value (the `payload` of a schemaless record)."""
    now_ms = int(time.time() * 1000)
    commit_ms = ts_ms if ts_ms is not None else now_ms
    return {
        "before": row_json(before) if before is not None else None,
        "after": row_json(after) if after is not None else None,
        "source": {
            "version": CONNECTOR_VERSION,
            "connector": "postgresql",
            "name": server,
            "ts_ms": commit_ms,
            "snapshot": snapshot,
            "db": db,
            "sequence": json.dumps([None, str(lsn)]),
            "schema": schema,
            "table": table,
            "txId": tx_id if tx_id is not None else lsn,
            "lsn": lsn,
            "xmin": None,
        },
        "op": op.value,
        "ts_ms": now_ms,
        "transaction": None,
    }


def encode_key(key: Mapping[str, Any]) -> bytes:
    """A record key: the primary-key columns as a JSON object."""
    return json.dumps(row_json(key), sort_keys=True).encode()


def encode_value(value: Mapping[str, Any] | None) -> bytes | None:
    """A record value (None stays a tombstone)."""
    return None if value is None else json.dumps(value, sort_keys=True).encode()


def topic_for(server: str = "sor", schema: str = "public", table: str = "entities") -> str:
    """Debezium's topic naming: `<topic.prefix>.<schema>.<table>`."""
    return f"{server}.{schema}.{table}"
