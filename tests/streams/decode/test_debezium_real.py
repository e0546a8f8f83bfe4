"""Conformance on real connector output: every record Debezium 3.6.3's PostgreSQL connector wrote
into a Kafka-protocol broker (shared/vectors/debezium-real) goes through the worker's real
handler without a single DLQ entry, each planned as Debezium meant it, and the index ends equal
to the system of record.

How the records were produced (shared/recipes/debezium-connect): PostgreSQL 15, pgoutput,
Kafka Connect 4.3 standalone, JsonConverter with `schemas.enable=true` for key and value,
`decimal.handling.mode` and `time.precision.mode` at their defaults (precise, adaptive),
`skipped.operations=none` (TRUNCATE emitted), no heartbeats, no transaction metadata. Table:
`public.entities(id text pk, tenant_id text, title text, body text, updated_at timestamptz,
deleted_at timestamptz)`; the change set: inserts (one with a 24 kB body), a title-only update
under REPLICA IDENTITY FULL, another under DEFAULT (the body arrives as
`__debezium_unavailable_value`), a soft delete, a delete + tombstone, a primary-key change
(d with `__debezium.newkey`, tombstone, c with `__debezium.oldkey`), a TRUNCATE, an insert.
The captures of our own real-CDC suite (other converter settings) are checked in
tests/e2e/test_real_cdc.py.
"""

from __future__ import annotations

import json
import sqlite3
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from prometheus_client import CollectorRegistry

from ragcore.kafka_config import KafkaSettings
from ragcore.mapping import TableMapping
from ragcore.plan import Action, PlanConfig, plan_event
from ragcore.settings import SorSettings, StoreSettings
from ragcore.store.edge import EdgeStore
from schemas.entities import ContentFormat
from schemas.events import RawRecord
from streams.app import IngestWorker, build_worker
from streams.decode import decode_record
from streams.settings import IngestSettings
from tests.conftest import VECTORS
from tests.streams.support import HashEmbedder, index_snapshot

CAPTURE = VECTORS / "debezium-real" / "pg15-debezium-3.6.3-connect-json.jsonl"

#: The captured table, as ragstream maps it.
REAL_TABLE = TableMapping(
    table="public.entities",
    key_columns=("id",),
    tenant_column="tenant_id",
    type_column=None,
    title_column="title",
    content_columns=("body",),
    metadata_column=None,
    content_hash_column=None,
    created_at_column=None,
)
PLAN = PlanConfig(tables=(REAL_TABLE,))

#: (action, reason, entity) of each record, in offset order, from the change set above.
EXPECTED = [
    (Action.UPSERT, "upsert", "entities:e1"),
    (Action.UPSERT, "upsert", "entities:e2"),  # the 24 kB body
    (Action.UPSERT, "upsert", "entities:e3"),
    (Action.UPSERT, "upsert", "entities:e2"),  # title only, REPLICA IDENTITY FULL
    (Action.REFETCH, "content_unavailable", "entities:e2"),  # title only, DEFAULT: placeholder
    (Action.DELETE, "soft_delete", "entities:e1"),
    (Action.DELETE, "delete", "entities:e1"),
    (Action.SKIP, "tombstone", None),
    (Action.DELETE, "delete_pk_change", "entities:e3"),
    (Action.SKIP, "tombstone", None),
    (Action.UPSERT, "upsert", "entities:e3b"),
    (Action.TRUNCATE, "truncate", None),
    (Action.UPSERT, "upsert", "entities:e4"),
]


def captured() -> list[RawRecord]:
    """The capture as raw Kafka records (key and value were JSON documents on the wire)."""
    if not CAPTURE.is_file():
        pytest.skip(f"captured Debezium records not found at {CAPTURE}")  # a failure under CI
    out = []
    for line in CAPTURE.read_text().splitlines():
        doc: dict[str, Any] = json.loads(line)
        headers = tuple((k, str(v).encode()) for k, v in (doc.get("headers") or {}).items())
        out.append(
            RawRecord(
                topic=doc["topic"],
                partition=doc["partition"],
                offset=doc["offset"],
                key=None if doc["key"] is None else json.dumps(doc["key"]).encode(),
                value=None if doc["value"] is None else json.dumps(doc["value"]).encode(),
                headers=headers,
                timestamp_ms=doc.get("timestamp"),
            )
        )
    return out


def _hash(content: str, fmt: ContentFormat) -> str:
    return f"{fmt}:{len(content)}"


@pytest.mark.unit
def test_every_captured_record_decodes_and_plans_as_debezium_meant_it() -> None:
    records = captured()
    assert len(records) == len(EXPECTED)
    for raw, (action, reason, entity) in zip(records, EXPECTED, strict=True):
        plan = plan_event(decode_record(raw), PLAN, _hash)
        assert (plan.action, plan.reason, plan.entity_id) == (action, reason, entity), raw.offset
    big = plan_event(decode_record(records[1]), PLAN, _hash)
    assert big.entity is not None and len(big.entity.content) == 24_000
    assert big.tenant_id == "t1" and big.version is not None and big.version.lsn is not None


@pytest.fixture
def worker(tmp_path: Path) -> Iterator[IngestWorker]:
    """The worker's handler over qdrant-edge, with a SQLite SoR holding the table's final
    state (after the whole change set only `e4` is left)."""
    sor = tmp_path / "sor.sqlite"
    with sqlite3.connect(sor) as conn:
        conn.execute(
            "CREATE TABLE entities (id TEXT PRIMARY KEY, tenant_id TEXT, title TEXT, body TEXT,"
            " updated_at TEXT, deleted_at TEXT)"
        )
        conn.execute(
            "INSERT INTO entities VALUES ('e4', 't1', 'fourth', 'after truncate',"
            " '2026-11-24T10:12:39.941933Z', NULL)"
        )
    settings = IngestSettings(
        kafka=KafkaSettings(bootstrap_servers="127.0.0.1:1"),  # never contacted
        store=StoreSettings(data_dir=tmp_path / "store"),
        sor=SorSettings(kind="sqlite", sqlite_path=sor),
        plan=PLAN,
        embedding_cache=None,
    )
    store = EdgeStore(tmp_path / "store")
    built = build_worker(settings, CollectorRegistry(), store=store, embedder=HashEmbedder())
    yield built
    built.close()
    store.close()


@pytest.mark.integration
def test_the_captured_stream_leaves_no_dlq_entry_and_the_index_equal_to_the_sor(
    worker: IngestWorker,
) -> None:
    states = []
    for raw in captured():  # one record per batch: every intermediate state is observable
        letters = worker.handler.handle([raw])
        assert not letters, [(x.code, x.message) for x in letters]
        snapshot = index_snapshot(worker.store, worker.registry, ["t1", "t2"])
        states.append({t: sorted(e) for t, e in snapshot.items()})
    assert states[2] == {"t1": ["entities:e1", "entities:e2"], "t2": ["entities:e3"]}
    assert states[10]["t2"] == ["entities:e3b"]  # the primary-key change moved the entity
    assert states[11] == {}  # the TRUNCATE removed every chunk of the table, in both tenants
    assert states[12] == {"t1": ["entities:e4"]}  # the index equals the SoR
