"""Conformance on real connector output: every record Debezium 3.6.3's PostgreSQL connector wrote
into a Kafka-protocol broker goes through the worker's real handler without a single DLQ entry,
each planned as Debezium meant it, and the index ends equal to the system of record.

Two captures of the same change set: ours, in the repository (tests/data/debezium/, written by
`devtools/capture_debezium.py` with the project's own launcher), and an earlier one kept beside
the checkout under shared/vectors/debezium-real (its tests are `external`).

How the records were produced: PostgreSQL 15, pgoutput,
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
from tests.conftest import REPO_ROOT, require_vectors
from tests.streams.support import HashEmbedder, index_snapshot

#: Our capture (devtools/capture_debezium.py writes it).
OWN = REPO_ROOT / "tests" / "data" / "debezium" / "entities-changeset.jsonl"
SHARED = "debezium-real/pg15-debezium-3.6.3-connect-json.jsonl"
#: The third-party capture's parameter: `external`, it exists only where shared/ does.
SHARED_CAPTURE = pytest.param("shared", marks=pytest.mark.external)

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


def capture_lines(which: str) -> list[str]:
    """The JSON lines of a capture: `own` (in the repository) or `shared` (beside it)."""
    path = OWN if which == "own" else require_vectors() / SHARED
    return path.read_text().splitlines()


def captured(which: str) -> list[RawRecord]:
    """The capture as raw Kafka records (key and value were JSON documents on the wire)."""
    out = []
    for line in capture_lines(which):
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


@pytest.mark.parametrize("which", [pytest.param("own", marks=pytest.mark.unit), SHARED_CAPTURE])
def test_every_captured_record_decodes_and_plans_as_debezium_meant_it(which: str) -> None:
    records = captured(which)
    assert len(records) == len(EXPECTED)
    for raw, (action, reason, entity) in zip(records, EXPECTED, strict=True):
        plan = plan_event(decode_record(raw), PLAN, _hash)
        assert (plan.action, plan.reason, plan.entity_id) == (action, reason, entity), raw.offset
    big = plan_event(decode_record(records[1]), PLAN, _hash)
    assert big.entity is not None and len(big.entity.content) == 24_000
    assert big.tenant_id == "t1" and big.version is not None and big.version.lsn is not None


@pytest.fixture
def worker(tmp_path: Path, which: str) -> Iterator[IngestWorker]:
    """The worker's handler over qdrant-edge, with a SQLite SoR holding the table's final
    state (after the whole change set only `e4` is left, as the capture's last row has it)."""
    last = json.loads(capture_lines(which)[-1])["value"]["payload"]["after"]
    assert last["id"] == "e4", last
    sor = tmp_path / "sor.sqlite"
    with sqlite3.connect(sor) as conn:
        conn.execute(
            "CREATE TABLE entities (id TEXT PRIMARY KEY, tenant_id TEXT, title TEXT, body TEXT,"
            " updated_at TEXT, deleted_at TEXT)"
        )
        conn.execute(
            "INSERT INTO entities VALUES (:id, :tenant_id, :title, :body, :updated_at,"
            " :deleted_at)",
            last,
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


@pytest.mark.parametrize(
    "which", [pytest.param("own", marks=pytest.mark.integration), SHARED_CAPTURE]
)
def test_the_captured_stream_leaves_no_dlq_entry_and_the_index_equal_to_the_sor(
    worker: IngestWorker, which: str
) -> None:
    states = []
    for raw in captured(which):  # one record per batch: every intermediate state is observable
        letters = worker.handler.handle([raw])
        assert not letters, [(x.code, x.message) for x in letters]
        snapshot = index_snapshot(worker.store, worker.registry, ["t1", "t2"])
        states.append({t: sorted(e) for t, e in snapshot.items()})
    assert states[2] == {"t1": ["entities:e1", "entities:e2"], "t2": ["entities:e3"]}
    assert states[10]["t2"] == ["entities:e3b"]  # the primary-key change moved the entity
    assert states[11] == {}  # the TRUNCATE removed every chunk of the table, in both tenants
    assert states[12] == {"t1": ["entities:e4"]}  # the index equals the SoR
