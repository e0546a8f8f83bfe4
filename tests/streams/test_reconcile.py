"""Reconciliation against a real PostgreSQL SoR and qdrant-edge: injected drift (points deleted
behind the system's back, SoR rows changed or deleted without events, a partial chunk set) is
found exactly, and `--repair` fixes it through the normal write path."""

from __future__ import annotations

import json
import random
import threading
import time
import uuid
from collections.abc import Iterator
from pathlib import Path

import psycopg
import pytest
from prometheus_client import CollectorRegistry
from psycopg.rows import dict_row
from pydantic import SecretStr

from ragcore.calibration_state import CALIBRATION_STATES, CalibrationState
from ragcore.kafka_config import KafkaSettings
from ragcore.settings import SorSettings, StoreSettings
from ragcore.sparse import Bm25Encoder
from ragcore.store.base import Placement, StoreFilter
from ragcore.store.edge import EdgeStore
from ragcore.store.ids import TenantId
from ragdev.services.postgres import PostgresCluster
from ragdev.sor.debezium_format import change_event, encode_key, encode_value
from schemas.events import Op, RawRecord
from streams.app import IngestWorker, build_worker
from streams.ingest import SorBatch
from streams.reconcile import (
    BLIND_KINDS,
    DRIFT_KINDS,
    ReconcileMetrics,
    ReconcileReport,
    reconcile,
)
from streams.settings import IngestSettings
from tests.streams.support import HashEmbedder, content, eid, entities_plan, index_snapshot

pytestmark = pytest.mark.integration

SQL = Path(__file__).resolve().parents[2] / "schemas" / "sql" / "entities.postgres.sql"


class Env:
    def __init__(self, dsn: str, data_dir: Path) -> None:
        self.dsn = dsn
        self.schema = f"r_{uuid.uuid4().hex[:8]}"
        self.sql(f'CREATE SCHEMA "{self.schema}"')
        self.sql(SQL.read_text())
        self.store = EdgeStore(data_dir)
        sor = SorSettings(kind="postgres", dsn=SecretStr(dsn))
        settings = IngestSettings(
            kafka=KafkaSettings(bootstrap_servers="127.0.0.1:1"),  # never contacted
            store=StoreSettings(data_dir=data_dir),
            sor=sor,
            plan=entities_plan(f"{self.schema}.entities", "sor.public.entities"),
            embedding_cache=None,
        )
        self.worker: IngestWorker = build_worker(
            settings, CollectorRegistry(), store=self.store, embedder=HashEmbedder()
        )
        self.offset = 0

    def sql(self, statement: str, params: tuple[object, ...] = ()) -> list[dict[str, object]]:
        with psycopg.connect(self.dsn, autocommit=True) as conn:
            conn.execute(f'SET search_path TO "{self.schema}"'.encode())
            cur = conn.cursor(row_factory=dict_row)
            cur.execute(statement.encode(), params)
            return list(cur.fetchall()) if cur.description else []

    def put(self, entity_id: str, text: str) -> None:
        self.sql(
            "INSERT INTO entities (id, company_id, content) VALUES (%s, 'acme', %s)"
            " ON CONFLICT (id) DO UPDATE SET content = EXCLUDED.content, updated_at = now()",
            (entity_id, text),
        )
        row = self.sql("SELECT * FROM entities WHERE id = %s", (entity_id,))[0]
        self.offset += 1
        value = change_event(Op.CREATE, before=None, after=row, lsn=100 + self.offset)
        record = RawRecord(
            "sor.public.entities",
            0,
            self.offset,
            encode_key({"id": entity_id}),
            encode_value(value),
        )
        assert not self.worker.handler.handle([record])

    def close(self) -> None:
        self.worker.close()
        self.store.close()
        self.sql(f'DROP SCHEMA "{self.schema}" CASCADE')


@pytest.fixture
def env(postgres: PostgresCluster, tmp_path: Path) -> Iterator[Env]:
    e = Env(postgres.dsn, tmp_path / "store")
    yield e
    e.close()


def test_injected_drift_is_reported_exactly_and_repaired_through_the_write_path(env: Env) -> None:
    rng = random.Random(5)
    for n in range(6):
        env.put(f"ent-{n}", content(rng, 25 if n == 4 else 3))
    registry, store, sor = env.worker.registry, env.store, env.worker.sor
    assert sor is not None
    clean = reconcile("acme", sor=sor, store=store, registry=registry)
    assert clean.drift == 0 and clean.sor_entities == 6 and clean.indexed_entities == 6

    index = registry.manifest("acme", registry.active_version("acme") or 0).index_name
    store.delete_by_entity(index, "acme", eid("ent-1"))  # points lost behind the system's back
    env.sql("UPDATE entities SET content = 'Changed without an event.' WHERE id = 'ent-2'")
    env.sql("DELETE FROM entities WHERE id = 'ent-3'")  # row gone, its delete event lost
    refs = store.entity_chunks(index, "acme", eid("ent-4"))
    assert len(refs) >= 3
    store.delete_points(index, [refs[eid("ent-4:chunk:1")].point_id])  # a partial chunk set

    metrics_registry = CollectorRegistry()
    found = reconcile("acme", sor=sor, store=store, registry=registry)
    ReconcileMetrics(metrics_registry).record(found)
    assert found.missing == [eid("ent-1")]
    assert sorted(found.stale) == [eid("ent-2"), eid("ent-4")]
    assert found.extra == [eid("ent-3")]
    gauge = metrics_registry.get_sample_value
    assert gauge("ragstream_reconcile_drift_entities", {"kind": "stale"}) == 2
    assert found.placement == registry.manifest("acme", 1).placement
    assert gauge("ragstream_tenants", {"placement": found.placement}) == 1
    assert gauge("ragstream_tenants_due_for_promotion") == 0

    handler = env.worker.handler
    repaired = reconcile(
        "acme", sor=sor, store=store, registry=registry, handler=handler, repair=True
    )
    assert repaired.repaired == 4
    after = reconcile("acme", sor=sor, store=store, registry=registry)
    assert after.drift == 0 and after.sor_entities == 5
    snapshot = index_snapshot(store, registry, ["acme"])["acme"]
    assert eid("ent-3") not in snapshot and len(snapshot[eid("ent-4")]) == len(refs)
    only_2 = StoreFilter(tenant_id="acme", entity_ids=(eid("ent-2"),))
    assert [p.payload["text"] for p in store.scroll(index, only_2)] == ["Changed without an event."]


def test_the_worker_reconciles_on_schedule_repairs_and_exports_the_drift(env: Env) -> None:
    rng = random.Random(6)
    for n in range(4):
        env.put(f"ent-{n}", content(rng, 3))
    worker = env.worker
    index = worker.registry.manifest("acme", 1).index_name
    env.store.delete_by_entity(index, "acme", eid("ent-0"))
    env.sql("DELETE FROM entities WHERE id = 'ent-3'")
    gauge = worker.reconcile_metrics.drift.labels

    (report,) = worker.reconcile_once()
    assert (report.missing, report.extra, report.repaired) == ([eid("ent-0")], [eid("ent-3")], 2)
    assert gauge("missing")._value.get() == 1 and gauge("extra")._value.get() == 1
    states = worker.reconcile_metrics.calibration.labels
    assert report.calibration is not None and report.calibration.state == "prior"
    assert states("prior")._value.get() == 1 and states("fitted")._value.get() == 0

    # the scheduled loop: runs after each interval until the worker stops
    fast = worker.settings.model_copy(
        update={"reconcile": worker.settings.reconcile.model_copy(update={"interval_s": 0.2})}
    )
    worker.settings = fast
    thread = threading.Thread(target=worker.reconcile_forever, daemon=True)
    thread.start()
    deadline = time.monotonic() + 20
    while gauge("missing")._value.get() != 0 and time.monotonic() < deadline:
        time.sleep(0.1)
    worker.stop.set()
    thread.join(10)
    assert not thread.is_alive()
    assert gauge("missing")._value.get() == 0 and gauge("extra")._value.get() == 0
    assert worker.sor is not None
    assert reconcile("acme", sor=worker.sor, store=env.store, registry=worker.registry).drift == 0


def test_the_reconcile_pass_judges_each_calibration_against_the_chunks_it_scrolled(
    env: Env,
) -> None:
    rng = random.Random(7)
    for n in range(5):
        env.put(f"ent-{n}", content(rng, 1))
    worker = env.worker
    registry, sor = worker.registry, worker.sor
    assert sor is not None

    def judged() -> CalibrationState:
        report = reconcile("acme", sor=sor, store=env.store, registry=registry)
        assert report.calibration is not None
        return report.calibration

    assert judged().state == "prior"
    chunks = judged().chunks
    assert chunks == 5
    # what `ragstream calibrate` stores, reduced to what the judgement reads
    fitted = {"fitted_at": "2026-11-26T08:00:00+00:00", "lexicon": {"n_docs": chunks}}
    registry.save_calibration("acme", 1, json.dumps(fitted))
    assert judged() == CalibrationState("fitted", 5, 5, "2026-11-26T08:00:00+00:00")
    env.put("ent-5", content(rng, 1))  # 6 of 5: moved by 0.2, not more
    assert judged().state == "fitted"
    env.put("ent-6", content(rng, 1))
    stale = judged()
    assert (stale.state, stale.chunks, stale.calibrated_chunks) == ("stale", 7, 5)
    registry.save_calibration("acme", 1, "{not json")
    assert judged().state == "unreadable"
    # a run over one table leaves the calibration alone (its gauge belongs to full runs)
    one_table = reconcile("acme", sor=sor, store=env.store, registry=registry, table="entities")
    assert one_table.calibration is None


def test_placement_gauges_count_tenants_and_due_promotions() -> None:
    def report(tenant: str, placement: Placement, points: int) -> ReconcileReport:
        state = CalibrationState("stale" if tenant == "grown" else "fitted", points, 10)
        return ReconcileReport(
            tenant, f"rag__{tenant}__v1", 0, 0, points, placement=placement, calibration=state
        )

    registry = CollectorRegistry()
    ReconcileMetrics(registry, dedicated_above_points=100).record_all(
        [
            report("small", "shared", 100),  # at the threshold: not above it
            report("grown", "shared", 101),
            report("big", "dedicated", 5000),
        ]
    )
    gauge = registry.get_sample_value
    assert gauge("ragstream_tenants", {"placement": "shared"}) == 2
    assert gauge("ragstream_tenants_calibration", {"state": "fitted"}) == 2
    assert gauge("ragstream_tenants_calibration", {"state": "stale"}) == 1
    assert gauge("ragstream_tenants_calibration", {"state": "prior"}) == 0
    assert gauge("ragstream_tenants", {"placement": "dedicated"}) == 1
    assert gauge("ragstream_tenants_due_for_promotion") == 1


def test_before_the_first_run_every_kind_and_state_reads_zero_and_the_last_run_never() -> None:
    # the worker's first run is one interval after it starts: until then the dashboard shows
    # zeros (not "no data") and the last run at 0 says none ran
    registry = CollectorRegistry()
    ReconcileMetrics(registry)
    gauge = registry.get_sample_value
    for kind in (*DRIFT_KINDS, *BLIND_KINDS):
        assert gauge("ragstream_reconcile_drift_entities", {"kind": kind}) == 0
    for state in CALIBRATION_STATES:
        assert gauge("ragstream_tenants_calibration", {"state": state}) == 0
    assert gauge("ragstream_reconcile_last_run_timestamp_seconds") == 0


def test_a_write_to_a_version_a_reindex_dropped_is_retried_on_fresh_targets(
    env: Env, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    """The worker's cached targets may still name a version that a reindex retired and
    dropped; the batch is applied again on targets re-read from the registry instead of
    ending the consumer loop."""
    env.put("ent-0", "Pump valve calibration report.")
    monkeypatch.setattr("streams.adapters.time.monotonic", lambda: 0.0)  # the cache never expires
    env.put("ent-1", "Second report, still on version one.")  # cached: [v1]
    registry, store = env.worker.registry, env.store
    registry.create_version("acme", HashEmbedder().spec, sparse_encoder=Bm25Encoder().model_version)
    registry.mark_ready("acme", 2, total_vectors=0)
    registry.activate("acme", 2)
    registry.retire("acme", 1)
    assert store.drop_collection("rag__acme__v1")
    with caplog.at_level("WARNING", logger="streams.ingest"):
        env.put("ent-2", "Third report, after the switch.")
    assert "re-reading the index targets" in caplog.text
    only = StoreFilter(tenant_id="acme", entity_ids=(eid("ent-2"),))
    assert store.count("rag__acme__v2", only) == 1


def test_an_unreadable_row_is_reported_and_the_run_goes_on_without_repairing_it(
    env: Env, caplog: pytest.LogCaptureFixture
) -> None:
    rng = random.Random(8)
    for n in range(5):
        env.put(f"ent-{n}", content(rng, 3))
    worker = env.worker
    index = worker.registry.manifest("acme", 1).index_name
    # an indexed row whose metadata stops being JSON, a row never indexed whose metadata is
    # nested deeper than Python parses, and after both (in key order) real drift
    env.sql(
        "UPDATE entities SET metadata = to_jsonb(%s::text) WHERE id = 'ent-1'",
        ('{"format": "text"',),
    )
    env.sql(
        "INSERT INTO entities (id, company_id, content, metadata)"
        " VALUES ('ent-0b', 'acme', 'Deep.', %s::jsonb)",
        ("[" * 3000 + "]" * 3000,),
    )
    indexed = env.store.entity_chunks(index, "acme", eid("ent-1"))
    assert indexed
    env.store.delete_by_entity(index, "acme", eid("ent-4"))

    with caplog.at_level("WARNING", logger="ragcore.sor.base"):
        (report,) = worker.reconcile_once(repair=True)  # the scheduled run's pass
    assert sorted(report.unreadable_rows) == [eid("ent-0b"), eid("ent-1")]
    assert report.tables["entities"].unreadable_rows == 2
    # an unreadable row is not a missing one: neither extra nor stale, never repaired away
    assert (report.missing, report.extra, report.stale) == ([eid("ent-4")], [], [])
    assert report.repaired == 1
    assert env.store.entity_chunks(index, "acme", eid("ent-1")) == indexed
    assert report.to_dict()["unreadable_rows"] == {
        "count": 2,
        "ids": [eid("ent-0b"), eid("ent-1")],
    }
    assert worker.reconcile_metrics.drift.labels("unreadable_rows")._value.get() == 2
    lines = [r.getMessage() for r in caplog.records if "SoR row unreadable" in r.getMessage()]
    assert len(lines) == 2
    for entity_id in (eid("ent-0b"), eid("ent-1")):
        (line,) = [x for x in lines if f"entity {entity_id}," in x]
        assert f"table {env.schema}.entities" in line and "column metadata" in line
    assert worker.sor is not None
    again = reconcile("acme", sor=worker.sor, store=env.store, registry=worker.registry)
    assert (again.drift, len(again.unreadable_rows)) == (0, 2)


def test_a_reread_rejects_an_unreadable_row_alone_and_never_deletes_it(env: Env) -> None:
    """Re-reads (a repair, a reindex request, a catch-up) go through `SorRows`: a row that
    cannot be mapped is that entity's rejection (SOR_ROW_UNREADABLE); the other ids of the same
    batch are re-read, and the unreadable one keeps its chunks (it is not gone)."""
    rng = random.Random(9)
    for n in range(3):
        env.put(f"ent-{n}", content(rng, 3))
    index = env.worker.registry.manifest("acme", 1).index_name
    env.sql(
        "UPDATE entities SET metadata = to_jsonb(%s::text) WHERE id = 'ent-0'",
        ('{"format": "text"',),
    )
    env.sql("UPDATE entities SET content = 'Changed without an event.' WHERE id = 'ent-1'")
    env.sql("DELETE FROM entities WHERE id = 'ent-2'")
    kept = env.store.entity_chunks(index, "acme", eid("ent-0"))

    done = env.worker.handler.apply_rows(
        SorBatch(TenantId("acme"), "reconcile", reread=(eid("ent-0"), eid("ent-1"), eid("ent-2")))
    )
    (rejected,) = done.rejections
    assert (rejected.entity_id, rejected.code) == (eid("ent-0"), "SOR_ROW_UNREADABLE")
    assert "metadata" in rejected.reason
    assert sorted(done.changed) == [eid("ent-1"), eid("ent-2")]
    assert env.store.entity_chunks(index, "acme", eid("ent-0")) == kept
    assert env.store.entity_chunks(index, "acme", eid("ent-2")) == {}
