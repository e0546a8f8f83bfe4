"""Faults on real CDC: PostgreSQL 15 -> real Debezium -> tansu -> the worker -> gRPC Retrieve.

Each scenario breaks something an operator meets in production, checks that the fault is
visible (metric, log line, DLQ record, health) and ends with the index equal to the SoR
(`reconcile` reports zero drift in every tenant, never repairing) and Retrieve answering from
the current SoR, with no manual step other than what the runbook in docs/runbooks/ says.

One stack for the module (the `cdc` stack of test_real_cdc.py, with heartbeats every second,
the worker's liveness watch running and a 3 s silence threshold); the scenarios run in file
order and each leaves the index equal to the SoR.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass

import psycopg
import pytest
from grpc_health.v1 import health_pb2, health_pb2_grpc
from prometheus_client import CollectorRegistry

from ragcore.kafka_config import KafkaSettings
from ragcore.mapping import TableMapping
from ragcore.plan import PlanConfig
from ragdev.services.postgres import PostgresCluster
from ragdev.services.tansu import TansuBroker
from ragstream.dlq import KafkaLetters, ReplayReport, parking_topic_of, replay_dlq, sor_locator
from schemas.proto.ragstream.retrieval.v1 import retrieval_pb2 as pb
from schemas.proto.ragstream.retrieval.v1 import retrieval_pb2_grpc as pb_grpc
from streams.decode import decode_record
from streams.liveness import LivenessSettings
from streams.reconcile import reconcile
from tests.e2e.test_real_cdc import (
    TENANTS,
    Cdc,
    eventually,
    start_cdc,
    wire,
)
from tests.streams.support import create_topics, read_all

pytestmark = [pytest.mark.integration, pytest.mark.slow]

HEARTBEAT_HB = "__debezium-heartbeat"


@dataclass
class FaultCdc(Cdc):
    """The CDC stack with the worker's source watch (liveness, slots, WAL gaps) running."""

    watch: threading.Thread | None = None

    def start_worker(self) -> None:
        super().start_worker()
        self.watch = threading.Thread(target=self.worker.watch_sources, daemon=True)
        self.watch.start()

    def stop_worker(self) -> None:
        super().stop_worker()
        if self.watch is not None:
            self.watch.join(30)

    def age(self) -> float:
        return self.metric("ragstream_source_heard_age_seconds", {"source": self.prefix})

    def slot_active(self) -> float:
        return self.metric("ragstream_sor_replication_slot_active", {"slot": self.dbz.slot})

    def replay(self) -> ReplayReport:
        """`ragstream dlq replay`, in process (qdrant-edge allows one opener: the worker's)."""
        options = self.worker.settings.decode.options()
        letters = KafkaLetters(
            KafkaSettings(bootstrap_servers=self.broker.bootstrap_servers),
            self.dlq,
            f"{self.group}-dlq-replay",
            idle_s=2.0,
            # tansu reports a batch's base offset + 1 as the high watermark (dev stack: the same)
            high_watermark_slack=1_000,
        )
        with letters:
            return replay_dlq(
                letters,
                parking_topic=parking_topic_of(self.dlq),
                decode=lambda raw: decode_record(raw, options),
                config=self.plan,
                handler=self.worker.handler,
                known_tenants=self.worker.targets.known_tenants,
                locate=sor_locator(self.sor),
                reindex_topic=self.worker.settings.consumer.reindex_topic,
            )

    def refresh_health(self) -> None:
        self.services.run(self.app.server.refresh_health())

    def health(self, service: str) -> int:
        stub = health_pb2_grpc.HealthStub(self.services.channel)
        reply = stub.Check(health_pb2.HealthCheckRequest(service=service), timeout=10)
        status: int = reply.status
        return status

    @property
    def retrieve_metrics(self) -> CollectorRegistry:
        return self.services.metrics

    def remap(self, plan: PlanConfig) -> None:
        """Restart the worker and Retrieve with `plan`, as an operator rolls out a new table
        mapping (same store, same consumer group)."""
        self.stop_worker()
        self.services.stop()
        self.worker.close()
        self.settings = self.settings.model_copy(update={"plan": plan})
        self.worker, self.services = wire(
            self.settings, self.store, self.embedder, self.next_embedder
        )
        self.plan, self.app, self.publisher = plan, self.services.app, self.services.publisher
        self.client = pb_grpc.RetrievalServiceStub(self.services.channel)
        self.start_worker()


@pytest.fixture(scope="module")
def cdc(
    postgres: PostgresCluster, kafka_broker: TansuBroker, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[FaultCdc]:
    # order_lines and products start empty: their topics exist before their first change
    yield from start_cdc(
        FaultCdc,
        postgres,
        kafka_broker,
        tmp_path_factory,
        name="flt",
        rows_sql=(
            "INSERT INTO entities (id, company_id, name, content) VALUES"
            " ('s-1', 'acme', 'Refund policy', 'Refunds are issued within thirty days.'),"
            " ('s-2', 'globex', 'Seals', 'Pump seals are checked every thousand hours.')"
        ),
        connector={"heartbeat.interval.ms": "1000"},
        topics_first=True,
        start_timeout=240,  # a loaded CI machine starts the JVM slowly
        liveness=LivenessSettings(silent_after_s=3.0, check_interval_s=0.5),
    )


def top(cdc: Cdc, tenant: str, query: str) -> pb.Result:
    pack = cdc.ask(tenant, query)
    assert pack.status == pb.RETRIEVAL_STATUS_SUCCESS, pack
    result: pb.Result = pack.results[0]
    return result


def top_entity(cdc: Cdc, tenant: str, query: str) -> str:
    return str(top(cdc, tenant, query).entity_id)


def texts(cdc: Cdc, tenant: str, entity_id: str) -> set[str]:
    """The indexed chunk texts of one entity."""
    return {str(p["text"]) for p in cdc.payloads(tenant, entity_id)}


# --- the scenarios -------------------------------------------------------------------------------


def test_heartbeats_keep_a_quiet_source_alive(cdc: FaultCdc) -> None:
    cdc.converged()
    # nothing changes in the SoR, yet the connector is heard from every second
    time.sleep(4)
    eventually(lambda: cdc.age() < 2.5, 20, "a heartbeat within the last 2.5 s")
    eventually(lambda: cdc.slot_active() == 1, 20, "the slot has its consumer")
    assert cdc.metric("ragstream_ingest_events_total", {"op": "heartbeat", "outcome": "skipped"})


def test_debezium_down_is_loud_and_what_changed_meanwhile_arrives_after_restart(
    cdc: FaultCdc, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO)
    cdc.converged()
    cdc.dbz.kill()  # the Kafka Connect JVM dies (SIGKILL; reaped: no defunct process)
    assert cdc.dbz.exited() is not None and cdc.dbz.pid is None
    # "minutes" compressed honestly: many changes, of every kind, while it is down
    for n in range(120):
        cdc.put(f"down-{n}", TENANTS[n % 2], f"Outage ledger entry {n} about valve {n * 7}.")
    cdc.sql(
        "UPDATE entities SET content = 'Refunds are issued within fourteen days.',"
        " updated_at = now() WHERE id = 's-1'"
    )
    cdc.sql("DELETE FROM entities WHERE id IN ('down-0', 'down-1', 'down-2')")
    waited = eventually(lambda: cdc.age() > 3.0, 30, "the source's age passes 3 s")
    assert waited < 15
    eventually(
        lambda: any(
            "nothing heard from its Debezium connector" in r.getMessage() for r in caplog.records
        ),
        15,
        "the worker's WARNING naming the silent source",
    )
    eventually(lambda: cdc.slot_active() == 0, 20, "the slot without consumer is exported")
    retained = cdc.metric("ragstream_sor_replication_slot_retained_bytes", {"slot": cdc.dbz.slot})
    assert retained > 0
    assert "entities:down-50" not in cdc.index()["acme"]  # not captured while down

    cdc.dbz.restart(timeout=240)  # resumes from its stored offsets and the kept slot
    cdc.converged(timeout=120)
    assert cdc.age() < 3.0
    # logged by the worker's periodic liveness check (every 0.5 s), not when the age drops
    eventually(
        lambda: any("heard again" in r.getMessage() for r in caplog.records),
        5,
        "the worker's INFO that the source is heard again",
    )
    assert top_entity(cdc, "acme", "refunds issued within fourteen days") == "entities:s-1"
    acme = cdc.index()["acme"]
    assert "entities:down-50" in acme and "entities:down-0" not in acme


def test_a_renamed_content_column_dead_letters_its_events_and_replay_brings_them_back(
    cdc: FaultCdc,
) -> None:
    cdc.converged()
    dlq_before = len(read_all(cdc.broker.bootstrap_servers, cdc.dlq, timeout=3))
    table = f"{cdc.schema}.order_lines"
    cdc.sql("ALTER TABLE order_lines RENAME COLUMN note TO remark")
    cdc.sql(
        "INSERT INTO order_lines VALUES (3003, 1, 'acme', 'Gasket G-9', 'Fits the GX-300.'),"
        " (3003, 2, 'globex', 'Valve V-2', 'Brass body.')"
    )
    # another table keeps flowing meanwhile, and ADD COLUMN elsewhere changes nothing
    cdc.sql("ALTER TABLE products ADD COLUMN color text")
    cdc.sql(
        "INSERT INTO products (sku, vendor, title, specs, color) VALUES"
        " ('GX-500', 'globex', 'GX-500 compressor', '{\"stages\": 2}', 'red')"
    )
    cdc.put("after-rename", "acme", "The canteen opens at half past eleven.")
    eventually(
        lambda: (
            cdc.metric("ragstream_ingest_schema_drift_total", {"table": table, "column": "note"})
            == 2
        ),
        60,
        "both order lines counted as schema drift",
    )
    eventually(lambda: "products:GX-500" in cdc.index()["globex"], 60, "the other table flows")
    eventually(lambda: "entities:after-rename" in cdc.index()["acme"], 60, "entities flow")
    letters = read_all(cdc.broker.bootstrap_servers, cdc.dlq, timeout=5)[dlq_before:]
    assert len(letters) == 2
    for letter in letters:
        headers = {k: (v or b"").decode() for k, v in letter.headers() or []}
        assert headers["ragstream.error.code"] == "SCHEMA_DRIFT"
        assert table in headers["ragstream.error.message"]
        assert "note" in headers["ragstream.error.message"]
    index = cdc.index()
    assert "order_lines:3003,1" not in index["acme"]  # never indexed as if `note` were empty
    # Retrieve reports the table it cannot verify through its health and a gauge
    cdc.refresh_health()
    assert cdc.health(f"sor:{table}") == health_pb2.HealthCheckResponse.NOT_SERVING
    assert cdc.health("") == health_pb2.HealthCheckResponse.SERVING
    unreadable = {"table": table}
    assert (
        cdc.retrieve_metrics.get_sample_value("ragstream_retrieve_sor_table_unreadable", unreadable)
        == 1
    )
    # while the mapping still reads `note`, a replay fixes nothing: both letters are re-queued
    # at the DLQ's tail (nothing blocks the letters after them) and the replay exits 1
    report = cdc.replay()
    assert (report.read, len(report.requeued), report.committed, report.exit_code) == (
        2,
        2,
        True,
        1,
    )
    assert {r["code"] for r in report.requeued} == {"SOR_TABLE_UNREADABLE"}

    cdc.sql("ALTER TABLE order_lines RENAME COLUMN remark TO note")  # the fix (runbook)
    report = cdc.replay()  # the re-queued letters
    assert (report.replayed, report.requeued, report.committed, report.exit_code) == (
        2,
        [],
        True,
        0,
    )
    assert report.entities == 2
    cdc.refresh_health()
    assert cdc.health(f"sor:{table}") == health_pb2.HealthCheckResponse.SERVING
    cdc.converged()
    assert "order_lines:3003,1" in cdc.index()["acme"]
    assert top_entity(cdc, "globex", "brass valve V-2") == "order_lines:3003,2"
    assert cdc.replay().read == 0  # the replay group committed past them


def test_a_dropped_content_column_dead_letters_its_events_and_the_runbook_converges(
    cdc: FaultCdc,
) -> None:
    cdc.sql("INSERT INTO order_lines VALUES (3005, 1, 'acme', 'Filter F-5', 'Change yearly.')")
    eventually(
        lambda: "order_lines:3005,1" in cdc.index().get("acme", ()), 60, "a line before the drop"
    )
    cdc.converged()
    dlq_before = len(read_all(cdc.broker.bootstrap_servers, cdc.dlq, timeout=3))
    table = f"{cdc.schema}.order_lines"
    drift = {"table": table, "column": "note"}
    drift_before = cdc.metric("ragstream_ingest_schema_drift_total", drift)
    cdc.sql("ALTER TABLE order_lines DROP COLUMN note")
    cdc.sql("INSERT INTO order_lines VALUES (3004, 1, 'acme', 'Hose H-4')")
    cdc.put("after-drop", "acme", "The loading dock closes at six.")
    eventually(
        lambda: cdc.metric("ragstream_ingest_schema_drift_total", drift) == drift_before + 1,
        60,
        "the order line counted as schema drift",
    )
    eventually(lambda: "entities:after-drop" in cdc.index().get("acme", ()), 60, "entities flow")
    (letter,) = read_all(cdc.broker.bootstrap_servers, cdc.dlq, timeout=5)[dlq_before:]
    headers = {k: (v or b"").decode() for k, v in letter.headers() or []}
    assert headers["ragstream.error.code"] == "SCHEMA_DRIFT"
    assert table in headers["ragstream.error.message"]
    assert "note" in headers["ragstream.error.message"]
    assert "order_lines:3004,1" not in cdc.index()["acme"]  # never indexed as if `note` were empty

    # the fix (runbook): the migration is reverted; the dropped notes are gone from the SoR, so
    # the rows indexed before the drop are stale until the repairing reconcile re-reads them
    cdc.sql("ALTER TABLE order_lines ADD COLUMN note text")
    report = cdc.replay()
    assert (report.replayed, report.requeued, report.committed, report.entities) == (1, [], True, 1)
    stale = [
        reconcile(t, sor=cdc.sor, store=cdc.store, registry=cdc.worker.registry) for t in TENANTS
    ]
    assert "order_lines:3005,1" in {e for r in stale for e in r.stale}, [r.to_dict() for r in stale]
    cdc.worker.reconcile_once(repair=True)  # `ragstream reconcile --tenant T --repair`, each T
    cdc.converged()
    assert "order_lines:3004,1" in cdc.index()["acme"]
    assert top_entity(cdc, "acme", "hose H-4") == "order_lines:3004,1"


def test_a_dropped_replication_slot_is_a_wal_gap_closed_by_an_automatic_reconcile(
    cdc: FaultCdc, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO)
    cdc.converged()
    cdc.dbz.kill()
    with psycopg.connect(cdc.pg.dsn, autocommit=True) as conn:
        eventually(
            lambda: (
                conn.execute(
                    "SELECT NOT active FROM pg_replication_slots WHERE slot_name = %s",
                    (cdc.dbz.slot,),
                ).fetchone()
                == (True,)
            ),
            30,
            "the walsender let go of the slot",
        )
        conn.execute("SELECT pg_drop_replication_slot(%s)", (cdc.dbz.slot,))
    # changes in the gap: no slot holds them, they never reach Kafka
    for n in range(20):
        cdc.put(f"gap-{n}", TENANTS[n % 2], f"Gap ledger entry {n} about pump {n * 3}.")
    cdc.sql("DELETE FROM entities WHERE id = 's-2'")
    eventually(
        lambda: cdc.metric("ragstream_sor_wal_gaps_total", {"slot": cdc.dbz.slot}) == 1,
        30,
        "the vanished slot counted as a WAL gap",
    )
    cdc.dbz.restart(timeout=240)  # a new slot: streams from now on
    cdc.converged(timeout=120)  # the worker's own reconcile closed the gap
    assert any("closing the WAL gap" in r.getMessage() for r in caplog.records)
    assert "entities:gap-7" in cdc.index()["globex"]
    assert "entities:s-2" not in cdc.index()["globex"]
    cdc.put("after-gap", "acme", "The new badge readers accept phone wallets.")
    cdc.converged()
    assert top_entity(cdc, "acme", "badge readers phone wallets") == "entities:after-gap"


def test_postgresql_restarted_mid_stream_loses_nothing(cdc: FaultCdc) -> None:
    cdc.converged()
    for n in range(30):
        cdc.put(f"crash-{n}", TENANTS[n % 2], f"Crash ledger entry {n} about motor {n * 5}.")
    # a crash of the SoR server while Debezium streams those (immediate stop, same data)
    cdc.pg.stop(keep_data=True)
    cdc.pg.start()
    for n in range(30, 45):
        cdc.put(f"crash-{n}", TENANTS[n % 2], f"Crash ledger entry {n} about motor {n * 5}.")
    cdc.sql("DELETE FROM entities WHERE id = 'crash-3'")
    # Debezium's task retries the lost connection; the worker's SoR pool reconnects
    cdc.converged(timeout=180)
    acme = cdc.index()["acme"]
    assert {"entities:crash-0", "entities:crash-28", "entities:crash-44"} <= acme
    assert "entities:crash-3" not in cdc.index()["globex"]
    assert top_entity(cdc, "globex", "crash ledger entry about motor 215") == "entities:crash-43"


def test_a_newer_commit_with_an_older_updated_at_is_indexed(cdc: FaultCdc) -> None:
    cdc.put("skew", "acme", "The shuttle bus to the plant leaves at seven.")
    cdc.converged()
    skipped = cdc.metric("ragstream_ingest_skipped_older_total")
    # an app server whose clock runs a day behind commits after the indexed version
    cdc.sql(
        "UPDATE entities SET content = 'The shuttle bus to the plant leaves at nine.',"
        " updated_at = now() - interval '1 day' WHERE id = 'skew'"
    )
    eventually(
        lambda: any("at nine" in t for t in texts(cdc, "acme", "entities:skew")),
        60,
        "the newer commit indexed despite its older updated_at",
    )
    cdc.converged()
    assert cdc.metric("ragstream_ingest_skipped_older_total") == skipped
    hit = top(cdc, "acme", "when does the shuttle bus to the plant leave")
    assert hit.entity_id == "entities:skew" and "at nine" in hit.text


def test_a_sor_restored_to_an_earlier_point_by_writes_converges_through_the_stream(
    cdc: FaultCdc,
) -> None:
    for n in range(6):
        cdc.put(f"rp-{n}", TENANTS[n % 2], f"Restore ledger entry {n} about crane {n * 11}.")
    cdc.converged()
    # the restore point: a logical backup of the whole table
    cdc.sql("CREATE TABLE restore_point AS SELECT * FROM entities")
    # after it: rows change (a fresh clock), are deleted, are inserted
    cdc.sql(
        "UPDATE entities SET content = 'Restore ledger entry 0 was rewritten by a bad migration.',"
        " updated_at = now() + interval '1 hour' WHERE id = 'rp-0'"
    )
    cdc.sql("DELETE FROM entities WHERE id IN ('rp-1', 'rp-2')")
    cdc.put("rp-late", "acme", "A row written after the restore point about hoist 99.")
    cdc.converged()
    assert "entities:rp-late" in cdc.index()["acme"]
    # the restore: the table written back as it was, old updated_at values, one transaction
    with psycopg.connect(cdc.pg.dsn) as conn:
        conn.execute(f'SET search_path TO "{cdc.schema}"'.encode())
        conn.execute("TRUNCATE entities")
        conn.execute("INSERT INTO entities SELECT * FROM restore_point")
    cdc.sql("DROP TABLE restore_point")
    # a logical restore is commits like any other: no step (runbooks/procedures/sor-restored.md)
    cdc.converged(timeout=120)
    acme, globex = cdc.index()["acme"], cdc.index()["globex"]
    assert "entities:rp-late" not in acme  # inserted since: vanished
    assert {"entities:rp-2"} <= acme and {"entities:rp-1"} <= globex  # deleted since: back
    assert not any("bad migration" in t for t in texts(cdc, "acme", "entities:rp-0"))
    hit = top(cdc, "acme", "restore ledger entry 0 about crane 0")
    assert hit.entity_id == "entities:rp-0" and "about crane 0" in hit.text
    assert top_entity(cdc, "globex", "restore ledger entry 1 about crane 11") == "entities:rp-1"


def test_a_sor_restored_physically_from_a_base_backup_converges_by_the_runbook(
    cdc: FaultCdc,
) -> None:
    for n in range(4):
        cdc.put(f"pb-{n}", TENANTS[n % 2], f"Base backup ledger entry {n} about winch {n * 7}.")
    cdc.converged()
    backup = cdc.pg.base_backup(cdc.prefix)
    # The history the restore abandons spans a whole WAL segment, as hours of production writes
    # do: its positions lie at least a segment (16 MiB) beyond anything the restored server writes
    # in this test, so the recreated slot's confirmed position is below the one seen before the
    # restore whenever the worker's check comes (with a few kB of history, the restored server's
    # own writes could overtake it before the first check). Two switches with a write between
    # them (a switch without WAL since the last one does nothing).
    with psycopg.connect(cdc.pg.dsn, autocommit=True) as conn:

        def switch_wal() -> int:
            row = conn.execute("SELECT pg_switch_wal() - '0/0'::pg_lsn").fetchone()
            assert row is not None
            return int(row[0])

        switch_wal()
        # after the backup: a bad migration, a delete, an insert; all of it indexed
        cdc.sql(
            "UPDATE entities SET content = 'Base backup ledger entry 0 was mangled by a bad"
            " migration.', updated_at = now() WHERE id = 'pb-0'"
        )
        switched = switch_wal()
    cdc.sql("DELETE FROM entities WHERE id = 'pb-1'")
    cdc.put("pb-late", "acme", "A row written after the backup about hoist 77.")
    cdc.converged()
    assert "entities:pb-late" in cdc.index()["acme"]
    slots = cdc.worker.slots
    assert slots is not None
    eventually(
        lambda: (slots.confirmed(cdc.dbz.slot) or 0) > switched,
        30,
        "the worker saw the slot confirm the history written after the backup",
    )
    gaps = {"slot": cdc.dbz.slot}
    gaps_before = cdc.metric("ragstream_sor_wal_gaps_total", gaps)

    # the restore: the server goes back to the backup (no change events for what it undoes; the
    # slot is gone; new commits get WAL positions below those of the abandoned history)
    cdc.dbz.kill()
    cdc.pg.restore(backup)
    cdc.sql(
        "UPDATE entities SET content = 'Base backup ledger entry 2 about winch 14, inspected"
        " after the restore.', updated_at = now() WHERE id = 'pb-2'"
    )
    # runbook step 1 (procedures/sor-restored.md): the connector, recreated with fresh offsets,
    # takes a new snapshot; step 2, the repairing reconcile, is the worker's own (WAL gap)
    (cdc.dbz.work_dir / "offsets.dat").unlink()
    cdc.dbz.restart(timeout=240)
    eventually(
        lambda: cdc.metric("ragstream_sor_wal_gaps_total", gaps) > gaps_before,
        60,
        "the vanished slot counted as a WAL gap",
    )
    cdc.converged(timeout=120)
    acme, globex = cdc.index()["acme"], cdc.index()["globex"]
    assert "entities:pb-late" not in acme  # inserted since the backup: vanished
    assert "entities:pb-1" in globex  # deleted since the backup: back
    assert not any("bad migration" in t for t in texts(cdc, "acme", "entities:pb-0"))
    assert any("inspected after the restore" in t for t in texts(cdc, "acme", "entities:pb-2"))
    # and the stream applies new commits to the entities the abandoned history had changed
    cdc.sql(
        "UPDATE entities SET content = 'Base backup ledger entry 0 about winch 0, re-issued.',"
        " updated_at = now() WHERE id = 'pb-0'"
    )
    eventually(
        lambda: any("re-issued" in t for t in texts(cdc, "acme", "entities:pb-0")),
        60,
        "a commit after the restore reaches the index",
    )
    cdc.converged()


def test_a_mapped_columns_type_changed_while_streaming(cdc: FaultCdc) -> None:
    cdc.put("ty-1", "globex", "The forklift batteries charge overnight.", "Batteries")
    cdc.converged()
    dlq_before = len(read_all(cdc.broker.bootstrap_servers, cdc.dlq, timeout=3))
    cdc.sql("ALTER TABLE entities ALTER COLUMN name TYPE varchar(200)")
    cdc.sql("ALTER TABLE entities ALTER COLUMN content TYPE varchar(100000)")
    cdc.put("ty-2", "globex", "The paint shop vents are cleaned each Friday.", "Paint shop")
    cdc.sql(
        "UPDATE entities SET name = 'Forklift batteries',"
        " content = 'The forklift batteries charge during the lunch break.',"
        " updated_at = now() WHERE id = 'ty-1'"
    )
    cdc.converged()
    assert {p["title"] for p in cdc.payloads("globex", "entities:ty-1")} == {"Forklift batteries"}
    hit = top(cdc, "globex", "when do the forklift batteries charge")
    assert hit.entity_id == "entities:ty-1" and "lunch break" in hit.text
    assert top_entity(cdc, "globex", "paint shop vents cleaned") == "entities:ty-2"
    assert len(read_all(cdc.broker.bootstrap_servers, cdc.dlq, timeout=3)) == dlq_before


def test_a_new_table_added_to_the_publication_becomes_searchable_once_mapped(
    cdc: FaultCdc,
) -> None:
    cdc.converged()
    table = f"{cdc.schema}.entities_eu"
    cdc.sql("CREATE TABLE entities_eu (LIKE entities INCLUDING ALL)")
    cdc.sql("ALTER TABLE entities_eu REPLICA IDENTITY FULL")
    eu = "INSERT INTO entities_eu (id, company_id, name, content) VALUES (%s, %s, %s, %s)"
    cdc.sql(eu, ("eu-1", "acme", "Customs", "Customs papers for Rotterdam are filed on Tuesdays."))
    # the operator publishes the table and adds it to the running connector (docs/operations.md)
    create_topics(cdc.broker.bootstrap_servers, f"{cdc.prefix}.{table}", partitions=1)
    with psycopg.connect(cdc.pg.dsn, autocommit=True) as conn:
        conn.execute(cdc.dbz.publication_statement(conn, [table]).encode())
    cdc.dbz.tables = (*cdc.dbz.tables, table)
    cdc.dbz.update_config({}, timeout=240)
    cdc.sql(eu, ("eu-2", "globex", "Tariffs", "Tariff codes for pumps changed in March."))
    cdc.put("before-remap", "acme", "The archive room key hangs in the porter's lodge.")
    eventually(lambda: "entities:before-remap" in cdc.index()["acme"], 60, "entities flow")
    assert not any(e.startswith("entities_eu:") for t in cdc.index().values() for e in t)
    # then rolls out the mapping: the worker reads the new topic from its start, and the rows
    # that predate the publication come from the repairing reconcile
    cdc.remap(
        PlanConfig(
            tables=(*cdc.plan.tables, TableMapping(table=table)),
            topic_prefix=cdc.prefix,
        )
    )
    eventually(lambda: "entities_eu:eu-2" in cdc.index()["globex"], 60, "the streamed row")
    cdc.worker.reconcile_once()
    cdc.converged()
    assert top_entity(cdc, "acme", "customs papers for Rotterdam") == "entities_eu:eu-1"
    cdc.sql(
        "UPDATE entities_eu SET content = 'Tariff codes for valves changed in May.',"
        " updated_at = now() WHERE id = 'eu-2'"
    )
    cdc.converged()
    hit = top(cdc, "globex", "tariff codes for valves")
    assert hit.entity_id == "entities_eu:eu-2" and "in May" in hit.text
