"""Real CDC end to end: SQL statements against PostgreSQL are the only input.

PostgreSQL 15 (logical decoding) -> real Debezium 3.6.3 (Kafka Connect standalone, the shipped
connector configuration; `ragdev.services.debezium`) -> the tansu broker -> the ingest worker
(consumer group, qdrant-edge) -> gRPC Retrieve verifying every hit against the same PostgreSQL.
Assertions are on the index and on Retrieve; after each scenario the index equals the SoR:
`reconcile` (report only, never a repair) finds zero drift in every tenant.

Three tables of different shapes, two tenants:
- `entities`: the seed table (JSON metadata, a content-hash column, REPLICA IDENTITY FULL, its
  content stored EXTERNAL so a long body is TOASTed uncompressed);
- `order_lines`: a composite key (order_id, line_no), content from two columns, REPLICA
  IDENTITY DEFAULT (a delete carries the key only);
- `products`: a JSONB column rendered as content, its own tenant column (`vendor`).

The embedder is the deterministic `HashEmbedder` (these tests are about what reaches the index,
not about vectors); it counts the texts it embeds.
"""

from __future__ import annotations

import asyncio
import hashlib
import json
import os
import random
import signal
import subprocess
import sys
import threading
import time
import uuid
from collections.abc import Callable, Coroutine, Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TypeVar

import grpc
import psycopg
import pytest
from confluent_kafka.admin import AdminClient
from prometheus_client import CollectorRegistry
from psycopg.rows import dict_row
from pydantic import SecretStr

from ragcore.embedders.spec import EmbeddingSpec
from ragcore.kafka_config import KafkaSettings
from ragcore.mapping import TableMapping
from ragcore.plan import PlanConfig
from ragcore.prepare import Preparer
from ragcore.settings import SorSettings, StoreSettings
from ragcore.sor.base import SystemOfRecord
from ragcore.sor.sql import PostgresSor
from ragcore.sparse import Bm25Encoder
from ragcore.store.base import StoreFilter, VectorStore
from ragcore.store.registry import FileIndexRegistry
from ragcore.wiring import build_store, payload_schema
from ragdev.services.debezium import DebeziumConnect, PostgresSource
from ragdev.services.postgres import PostgresCluster
from ragdev.services.tansu import TansuBroker
from ragstream.parity import ParitySettings
from ragstream.reindex import ReindexOptions, reindex, retriever_search
from retrieval_api.app import RetrieveApp, build_app
from retrieval_api.settings import AuthSettings, GrpcSettings, RetrieveSettings
from schemas.entities import ContentFormat
from schemas.proto.ragstream.retrieval.v1 import retrieval_pb2 as pb
from schemas.proto.ragstream.retrieval.v1 import retrieval_pb2_grpc as pb_grpc
from streams.app import IngestWorker, build_worker
from streams.reconcile import ReconcileReport, reconcile
from streams.settings import IngestSettings
from tests.conftest import REPO_ROOT
from tests.retrieval_api.stack import RecordingPublisher
from tests.streams.support import (
    HASH_SPEC,
    EmbeddingStubServer,
    HashEmbedder,
    committed,
    content,
    create_topics,
    fast_consumer,
    index_snapshot,
    read_all,
    stub_embedder,
    three_tables,
)

pytestmark = [pytest.mark.integration, pytest.mark.slow]

TENANTS = ("acme", "globex")
TOKENS = {"acme": "acme-token", "globex": "globex-token"}
V2 = EmbeddingSpec(
    name="hash-test", version="2", dimension=48, max_input_tokens=48, tokenizer=HASH_SPEC.tokenizer
)


C = TypeVar("C", bound="Cdc")


def mappings(schema: str) -> tuple[TableMapping, ...]:
    """The three tables, as the worker and Retrieve map them."""
    return three_tables(schema)


TABLES_SQL = """
ALTER TABLE entities ALTER COLUMN content SET STORAGE EXTERNAL;
CREATE TABLE order_lines (order_id int, line_no int, org text NOT NULL, product text,
  note text, PRIMARY KEY (order_id, line_no));
CREATE TABLE products (sku text PRIMARY KEY, vendor text NOT NULL, title text, specs jsonb,
  updated_at timestamptz NOT NULL DEFAULT now(), deleted_at timestamptz);
"""


@dataclass
class Cdc:
    """One module's system: SoR schema, Debezium, worker, store, Retrieve."""

    pg: PostgresCluster
    broker: TansuBroker
    schema: str
    prefix: str
    data_dir: Path
    dbz: DebeziumConnect
    plan: PlanConfig
    store: VectorStore
    embedder: HashEmbedder
    next_embedder: HashEmbedder
    worker: IngestWorker
    app: RetrieveApp
    publisher: RecordingPublisher
    client: pb_grpc.RetrievalServiceStub
    dlq: str
    group: str
    stops: list[Callable[[], None]] = field(default_factory=list)
    thread: threading.Thread | None = None
    settings: IngestSettings = field(init=False)
    services: Services = field(init=False)

    # --- the SoR ----------------------------------------------------------------------------

    def sql(self, statement: str, params: tuple[Any, ...] = ()) -> list[dict[str, Any]]:
        with psycopg.connect(self.pg.dsn, autocommit=True) as conn:
            conn.execute(f'SET search_path TO "{self.schema}"'.encode())
            cur = conn.cursor(row_factory=dict_row)
            cur.execute(statement.encode(), params)
            return list(cur.fetchall()) if cur.description else []

    def put(self, key: str, tenant: str, text: str, title: str = "") -> None:
        self.sql(
            "INSERT INTO entities (id, company_id, name, content, metadata)"
            ' VALUES (%s, %s, %s, %s, \'{"format": "text"}\')',
            (key, tenant, title or key, text),
        )

    # --- the worker ---------------------------------------------------------------------------

    def start_worker(self) -> None:
        self.worker.stop.clear()
        self.worker.loop.start()
        self.thread = threading.Thread(
            target=self.worker.loop.run, args=(self.worker.stop,), daemon=True
        )
        self.thread.start()

    def stop_worker(self) -> None:
        self.worker.stop.set()
        if self.thread is not None:
            self.thread.join(30)
            assert not self.thread.is_alive()

    # --- the index --------------------------------------------------------------------------

    @property
    def sor(self) -> SystemOfRecord:
        assert self.worker.sor is not None
        return self.worker.sor

    def index(self) -> dict[str, set[str]]:
        """tenant -> indexed entity ids."""
        snap = index_snapshot(self.store, self.worker.registry, TENANTS)
        return {tenant: set(entities) for tenant, entities in snap.items()}

    def payloads(self, tenant: str, entity_id: str) -> list[dict[str, Any]]:
        version = self.worker.registry.active_version(tenant)
        assert version is not None
        name = self.worker.registry.manifest(tenant, version).index_name
        flt = StoreFilter(tenant_id=tenant, entity_ids=(entity_id,))
        return [dict(p.payload) for p in self.store.scroll(name, flt)]

    def converged(self, timeout: float = 60.0) -> list[ReconcileReport]:
        """Wait until the index equals the SoR in every tenant (reconcile reports, never
        repairs); return the reports."""
        deadline = time.monotonic() + timeout
        while True:
            reports = [
                reconcile(t, sor=self.sor, store=self.store, registry=self.worker.registry)
                for t in TENANTS  # a tenant without an index yet has all its rows missing
            ]
            if all(r.drift == 0 and r.blind == 0 for r in reports):
                return reports
            if time.monotonic() > deadline:
                pytest.fail(f"index != SoR after {timeout}s: {[r.to_dict() for r in reports]}")
            time.sleep(0.3)

    def metric(self, name: str, labels: dict[str, str] | None = None) -> float:
        total = 0.0
        for metric in self.worker.metrics.registry.collect():
            for sample in metric.samples:
                if sample.name == name and (labels or {}).items() <= sample.labels.items():
                    total += sample.value
        return total

    # --- Retrieve ---------------------------------------------------------------------------

    def ask(self, tenant: str, query: str, *, as_tenant: str | None = None) -> pb.EvidencePack:
        token = TOKENS[as_tenant or tenant]
        request = pb.RetrieveRequest(query_text=query, top_k=5, tenant=tenant)
        pack: pb.EvidencePack = self.client.Retrieve(
            request, metadata=(("authorization", f"Bearer {token}"),), timeout=30
        )
        return pack


def eventually(check: Callable[[], bool], timeout: float = 60.0, what: str = "") -> float:
    began = time.monotonic()
    while not check():
        if time.monotonic() - began > timeout:
            pytest.fail(f"not reached in {timeout}s: {what}")
        time.sleep(0.2)
    return time.monotonic() - began


def wait_for_topics(bootstrap: str, topics: list[str], timeout: float = 60.0) -> None:
    admin = AdminClient({"bootstrap.servers": bootstrap})
    eventually(
        lambda: set(topics) <= set(admin.list_topics(timeout=5).topics),
        timeout,
        f"Debezium created {topics}",
    )


@dataclass
class Services:
    """Retrieve serving gRPC on loopback from its own event loop thread."""

    app: RetrieveApp
    publisher: RecordingPublisher
    metrics: CollectorRegistry
    loop: asyncio.AbstractEventLoop
    thread: threading.Thread
    channel: grpc.Channel

    def run(self, work: Coroutine[Any, Any, None]) -> None:
        asyncio.run_coroutine_threadsafe(work, self.loop).result(30)

    def stop(self) -> None:
        self.channel.close()
        self.run(self.app.server.stop())
        self.loop.call_soon_threadsafe(self.loop.stop)
        self.thread.join(10)
        self.app.close()


def wire(
    settings: IngestSettings,
    store: VectorStore,
    embedder: HashEmbedder,
    next_embedder: HashEmbedder,
) -> tuple[IngestWorker, Services]:
    """The worker and Retrieve for `settings.plan` on the shared store."""
    worker = build_worker(
        settings,
        CollectorRegistry(),
        store=store,
        embedder=embedder,
        next_embedder=next_embedder,
    )
    worker.check()
    publisher, metrics = RecordingPublisher(), CollectorRegistry()
    app = build_app(
        RetrieveSettings(
            grpc=GrpcSettings(port=0),
            auth=AuthSettings(
                tokens={t: hashlib.sha256(v.encode()).hexdigest() for t, v in TOKENS.items()}
            ),
            store=settings.store,
            sor=settings.sor,
            plan=settings.plan,
        ),
        metrics,
        store=store,
        embedder=HashEmbedder(),
        next_embedder=HashEmbedder(V2),
        publisher=publisher,
    )
    loop = asyncio.new_event_loop()
    thread = threading.Thread(target=loop.run_forever, daemon=True)
    thread.start()
    asyncio.run_coroutine_threadsafe(app.server.start(), loop).result(30)
    channel = grpc.insecure_channel(f"127.0.0.1:{app.server.port}")
    return worker, Services(app, publisher, metrics, loop, thread, channel)


@dataclass(frozen=True)
class Captured:
    """A schema of its own in the shared PostgreSQL cluster, captured by its own Debezium."""

    schema: str
    prefix: str
    suffix: str
    dbz: DebeziumConnect

    @property
    def dlq(self) -> str:
        return f"{self.prefix}.dlq"

    @property
    def group(self) -> str:
        return f"ingest-{self.suffix}"


@contextmanager
def captured_schema(
    postgres: PostgresCluster,
    kafka_broker: TansuBroker,
    tmp_path_factory: pytest.TempPathFactory,
    *,
    name: str,
    setup: Callable[[psycopg.Connection[Any]], None],
    tables: Sequence[str],
    connector: Mapping[str, str] | None = None,
    before_start: Callable[[Captured], None] | None = None,
    start_timeout: float = 90.0,
    partitions: int | None = None,
    route_by: Sequence[str] = (),
) -> Iterator[Captured]:
    """Create schema `<name>_<suffix>` (`setup` runs in it: tables, rows that exist before
    Debezium starts), start a Debezium connector for its `tables` (topic prefix
    `<name><suffix>`, 50 ms polls; `partitions` and `route_by` as `DebeziumConnect` takes
    them), create the DLQ topic; on exit stop Debezium (its slot is dropped) and drop the
    schema."""
    suffix = uuid.uuid4().hex[:8]
    schema, prefix = f"{name}_{suffix}", f"{name}{suffix}"
    with psycopg.connect(postgres.dsn, autocommit=True) as conn:
        conn.execute(f'CREATE SCHEMA "{schema}"'.encode())
        conn.execute(f'SET search_path TO "{schema}"'.encode())
        setup(conn)
    dbz = DebeziumConnect(
        bootstrap_servers=kafka_broker.bootstrap_servers,
        source=PostgresSource("127.0.0.1", postgres.port, "postgres", "postgres"),
        tables=[f"{schema}.{t}" for t in tables],
        topic_prefix=prefix,
        name=prefix,
        work_dir=tmp_path_factory.mktemp("connect"),
        connector={"poll.interval.ms": "50", **(connector or {})},
        partitions=partitions,
        route_by=route_by,
    )
    captured = Captured(schema, prefix, suffix, dbz)
    try:
        if before_start is not None:
            before_start(captured)
        dbz.start(timeout=start_timeout)
        create_topics(kafka_broker.bootstrap_servers, captured.dlq, partitions=1)
        yield captured
    finally:
        dbz.stop()
        with psycopg.connect(postgres.dsn, autocommit=True) as conn:
            conn.execute(f'DROP SCHEMA "{schema}" CASCADE'.encode())


def ingest_settings(
    kafka_broker: TansuBroker,
    postgres: PostgresCluster,
    captured: Captured,
    plan: PlanConfig,
    data_dir: Path,
    **extra: Any,
) -> IngestSettings:
    """The worker's settings for a captured schema: its DLQ and group, qdrant-edge in
    `data_dir`, the SoR, fast consumer timings; `extra` adds or overrides sections."""
    return IngestSettings(
        kafka=KafkaSettings(bootstrap_servers=kafka_broker.bootstrap_servers),
        consumer=fast_consumer(captured.dlq, captured.group),
        store=StoreSettings(data_dir=data_dir),
        sor=SorSettings(kind="postgres", dsn=SecretStr(postgres.dsn)),
        plan=plan,
        embedding_cache=None,
        **extra,
    )


SEED_TABLES = ("entities", "order_lines", "products")


def seed_tables(rows_sql: str = "") -> Callable[[psycopg.Connection[Any]], None]:
    """`setup` for the three tables, then `rows_sql` (rows that exist before Debezium)."""

    def setup(conn: psycopg.Connection[Any]) -> None:
        conn.execute((REPO_ROOT / "schemas" / "sql" / "entities.postgres.sql").read_bytes())
        conn.execute(TABLES_SQL.encode())
        if rows_sql:
            conn.execute(rows_sql.encode())

    return setup


def start_cdc(
    kind: type[C],
    postgres: PostgresCluster,
    kafka_broker: TansuBroker,
    tmp_path_factory: pytest.TempPathFactory,
    *,
    name: str,
    rows_sql: str,
    connector: Mapping[str, str] | None = None,
    topics_first: bool = False,
    start_timeout: float = 90.0,
    **extra: Any,
) -> Iterator[C]:
    """The three tables captured by Debezium, the worker (running) and Retrieve: a `kind`
    stack for a test module's fixture; `topics_first` creates the tables' topics before
    Debezium starts (tables that start empty); `extra` goes to the worker's settings."""

    def create_table_topics(captured: Captured) -> None:
        topics = PlanConfig(tables=mappings(captured.schema), topic_prefix=captured.prefix)
        create_topics(kafka_broker.bootstrap_servers, *topics.catalog.topics(), partitions=1)

    with captured_schema(
        postgres,
        kafka_broker,
        tmp_path_factory,
        name=name,
        setup=seed_tables(rows_sql),
        tables=SEED_TABLES,
        connector=connector,
        before_start=create_table_topics if topics_first else None,
        start_timeout=start_timeout,
    ) as captured:
        plan = PlanConfig(tables=mappings(captured.schema), topic_prefix=captured.prefix)
        heartbeat = captured.dbz.heartbeat_topic()
        wait_for_topics(
            kafka_broker.bootstrap_servers, [*plan.catalog.topics(), *filter(None, [heartbeat])]
        )
        data_dir = tmp_path_factory.mktemp("store")
        settings = ingest_settings(kafka_broker, postgres, captured, plan, data_dir, **extra)
        store = build_store(settings.store, payload_schema(plan))
        embedder, next_embedder = HashEmbedder(), HashEmbedder(V2)
        worker, services = wire(settings, store, embedder, next_embedder)
        stack = kind(
            postgres,
            kafka_broker,
            captured.schema,
            captured.prefix,
            data_dir,
            captured.dbz,
            plan,
            store,
            embedder,
            next_embedder,
            worker,
            services.app,
            services.publisher,
            pb_grpc.RetrievalServiceStub(services.channel),
            captured.dlq,
            captured.group,
        )
        stack.settings, stack.services = settings, services
        stack.start_worker()
        yield stack
        stack.stop_worker()
        stack.services.stop()
        stack.worker.close()
        store.close()


@pytest.fixture(scope="module")
def cdc(
    postgres: PostgresCluster, kafka_broker: TansuBroker, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[Cdc]:
    # rows that exist before Debezium starts: its initial snapshot must bring them
    yield from start_cdc(
        Cdc,
        postgres,
        kafka_broker,
        tmp_path_factory,
        name="cdc",
        rows_sql=(
            "INSERT INTO entities (id, company_id, name, content) VALUES"
            " ('s-1', 'acme', 'Refund policy', 'Refunds are issued within thirty days.'),"
            " ('s-2', 'acme', 'VPN', 'The VPN token expires after twelve hours.'),"
            " ('s-3', 'globex', 'Seals', 'Pump seals are checked every thousand hours.');"
            "INSERT INTO order_lines VALUES (1001, 1, 'acme', 'Seal kit K-27', 'Ship by air.'),"
            " (2002, 1, 'globex', 'Impeller', 'Duplex steel.');"
            "INSERT INTO products (sku, vendor, title, specs) VALUES"
            " ('GX-300', 'globex', 'GX-300 pump', '{\"material\": \"duplex\", \"bar\": 16}')"
        ),
    )


# --- the scenarios (in file order; each leaves the index equal to the SoR) --------------------


def test_initial_snapshot_brings_the_rows_that_existed_before(cdc: Cdc) -> None:
    cdc.converged()
    assert cdc.index() == {
        "acme": {"entities:s-1", "entities:s-2", "order_lines:1001,1"},
        "globex": {"entities:s-3", "order_lines:2002,1", "products:GX-300"},
    }
    assert cdc.metric("ragstream_ingest_events_total", {"op": "r", "outcome": "upserted"}) == 6
    product = cdc.payloads("globex", "products:GX-300")[0]
    assert "material: duplex" in product["text"] and product["entity_type"] == "PRODUCT"


def test_insert_update_soft_delete_and_delete_reach_retrieve(cdc: Cdc) -> None:
    cdc.put("i-1", "acme", "Quarterly invoices are emailed on the first Monday.", "Invoices")
    cdc.put("i-2", "acme", "Parking permits are renewed every January at reception.")
    cdc.converged()
    pack = cdc.ask("acme", "when are quarterly invoices emailed?")
    assert pack.status == pb.RETRIEVAL_STATUS_SUCCESS
    assert pack.results[0].entity_id == "entities:i-1"

    cdc.sql(
        "UPDATE entities SET content = %s, updated_at = now() WHERE id = 'i-1'",
        ("Quarterly invoices are posted by mail on the fifth business day.",),
    )
    cdc.converged()
    top = cdc.ask("acme", "quarterly invoices posted by mail fifth business day").results[0]
    assert top.entity_id == "entities:i-1" and "fifth business day" in top.text

    cdc.sql("UPDATE entities SET deleted_at = now() WHERE id = 'i-1'")  # soft delete
    cdc.sql("DELETE FROM entities WHERE id = 'i-2'")  # hard delete
    cdc.converged()
    assert not {"entities:i-1", "entities:i-2"} & cdc.index()["acme"]
    pack = cdc.ask("acme", "quarterly invoices posted by mail")
    assert "entities:i-1" not in [r.entity_id for r in pack.results]


def test_update_of_a_non_content_column_embeds_nothing(cdc: Cdc) -> None:
    cdc.put("n-1", "acme", content(random.Random(1), 30), "Old title")
    cdc.converged()
    assert len(cdc.payloads("acme", "entities:n-1")) >= 5
    texts = cdc.embedder.texts
    cdc.sql("UPDATE entities SET name = 'New title', updated_at = now() WHERE id = 'n-1'")
    eventually(
        lambda: {p["title"] for p in cdc.payloads("acme", "entities:n-1")} == {"New title"},
        what="the new title in every chunk's payload",
    )
    assert cdc.embedder.texts == texts  # payloads rewritten in place, nothing re-embedded
    cdc.converged()


def test_primary_key_change_moves_the_entity(cdc: Cdc) -> None:
    cdc.put("pk-old", "globex", "Bearings are regreased every four thousand hours.")
    cdc.converged()
    cdc.sql("UPDATE entities SET id = 'pk-new' WHERE id = 'pk-old'")  # d + tombstone + c
    cdc.converged()
    globex = cdc.index()["globex"]
    assert "entities:pk-new" in globex and "entities:pk-old" not in globex


def test_tenant_move_leaves_the_old_tenant_and_reaches_the_new_one(cdc: Cdc) -> None:
    cdc.put("tm-1", "acme", "The badge printer sits next to the loading dock.")
    cdc.converged()
    cdc.sql("UPDATE entities SET company_id = 'globex', updated_at = now() WHERE id = 'tm-1'")
    cdc.converged()
    index = cdc.index()
    assert "entities:tm-1" in index["globex"] and "entities:tm-1" not in index["acme"]
    query = "where is the badge printer next to the loading dock?"
    assert "entities:tm-1" not in [r.entity_id for r in cdc.ask("acme", query).results]
    assert cdc.ask("globex", query).results[0].entity_id == "entities:tm-1"


def test_composite_key_and_json_tables_follow_their_rows(cdc: Cdc) -> None:
    cdc.sql("INSERT INTO order_lines VALUES (3003, 1, 'acme', 'Coupling', 'Fragile.')")
    cdc.sql(
        "INSERT INTO products (sku, vendor, title, specs) VALUES"
        " ('AC-1', 'acme', 'Acme seat', '{\"users\": 5, \"sso\": true}')"
    )
    cdc.converged()
    cdc.sql("UPDATE order_lines SET note = 'Fragile, keep upright.' WHERE order_id = 3003")
    cdc.sql("UPDATE products SET specs = '{\"users\": 50}', updated_at = now() WHERE sku = 'AC-1'")
    cdc.converged()
    (line,) = cdc.payloads("acme", "order_lines:3003,1")
    assert line["text"] == "Coupling\n\nFragile, keep upright."
    assert "users: 50" in cdc.payloads("acme", "products:AC-1")[0]["text"]
    cdc.sql("DELETE FROM order_lines WHERE order_id = 3003")  # DEFAULT identity: key only
    cdc.converged()
    assert "order_lines:3003,1" not in cdc.index()["acme"]


def test_truncate_removes_the_tables_chunks_in_every_tenant_without_a_reconcile(
    cdc: Cdc,
) -> None:
    cdc.sql("INSERT INTO order_lines VALUES (4004, 1, 'acme', 'Gasket', 'Spare.')")
    cdc.converged()
    before = cdc.index()
    assert any(e.startswith("order_lines:") for e in before["globex"])
    cdc.sql("TRUNCATE order_lines")
    eventually(
        lambda: not any(e.startswith("order_lines:") for t in cdc.index().values() for e in t),
        what="no order_lines chunk left in any tenant",
    )
    after = cdc.index()
    for tenant in TENANTS:  # the other tables are untouched
        assert {e for e in before[tenant] if not e.startswith("order_lines:")} == after[tenant]
    cdc.sql("INSERT INTO order_lines VALUES (5005, 1, 'globex', 'Valve', 'After the truncate.')")
    cdc.converged()
    assert "order_lines:5005,1" in cdc.index()["globex"]


def test_toasted_body_updated_under_replica_identity_default_and_full(cdc: Cdc) -> None:
    body = content(random.Random(7), 160)  # ~20 kB, stored EXTERNAL: TOASTed
    assert len(body) > 8000
    cdc.sql("ALTER TABLE entities REPLICA IDENTITY DEFAULT")
    try:
        cdc.put("toast-1", "acme", body, "Manual v1")
        cdc.converged()
        chunks = len(cdc.payloads("acme", "entities:toast-1"))
        refetched = cdc.metric("ragstream_ingest_events_total", {"outcome": "refetched"})
        # DEFAULT: the unchanged TOASTed content arrives as __debezium_unavailable_value
        cdc.sql("UPDATE entities SET name = 'Manual v2', updated_at = now() WHERE id = 'toast-1'")
        eventually(
            lambda: {p["title"] for p in cdc.payloads("acme", "entities:toast-1")} == {"Manual v2"},
            what="the title of the placeholder update",
        )
        assert (
            cdc.metric("ragstream_ingest_events_total", {"outcome": "refetched"}) == refetched + 1
        )
        assert len(cdc.payloads("acme", "entities:toast-1")) == chunks  # the body is intact
        cdc.converged()
    finally:
        cdc.sql("ALTER TABLE entities REPLICA IDENTITY FULL")
    # FULL: the old row is logged whole, Debezium fills the column: no placeholder, no refetch
    refetched = cdc.metric("ragstream_ingest_events_total", {"outcome": "refetched"})
    cdc.sql("UPDATE entities SET name = 'Manual v3', updated_at = now() WHERE id = 'toast-1'")
    eventually(
        lambda: {p["title"] for p in cdc.payloads("acme", "entities:toast-1")} == {"Manual v3"},
        what="the title of the FULL update",
    )
    assert cdc.metric("ragstream_ingest_events_total", {"outcome": "refetched"}) == refetched
    cdc.sql(
        "UPDATE entities SET content = %s, updated_at = now() WHERE id = 'toast-1'",
        (body + " A closing remark.",),
    )
    cdc.converged()


def test_a_burst_of_a_thousand_rows(cdc: Cdc) -> None:
    rng = random.Random(1000)
    with psycopg.connect(cdc.pg.dsn, autocommit=True) as conn:
        conn.execute(f'SET search_path TO "{cdc.schema}"'.encode())
        for n in range(1000):  # a thousand transactions, as an application would commit them
            conn.execute(
                "INSERT INTO entities (id, company_id, content) VALUES (%s, %s, %s)",
                (f"burst-{n:04d}", TENANTS[n % 2], content(rng, rng.randint(1, 4))),
            )
    took = eventually(
        lambda: (
            sum(1 for e in cdc.index().get("acme", set()) if e.startswith("entities:burst-")) == 500
        ),
        120,
        "the burst indexed",
    )
    cdc.converged(120)
    print(f"1,000 committed rows indexed {took:.1f}s after the last commit")


def test_debezium_restarted_mid_stream_loses_and_repeats_nothing(cdc: Cdc) -> None:
    done = threading.Event()

    def write() -> None:
        with psycopg.connect(cdc.pg.dsn, autocommit=True) as conn:
            conn.execute(f'SET search_path TO "{cdc.schema}"'.encode())
            for n in range(200):
                conn.execute(
                    "INSERT INTO entities (id, company_id, content) VALUES (%s, 'acme', %s)",
                    (f"dbz-{n:03d}", f"Restart check number {n}."),
                )
                time.sleep(0.02)
        done.set()

    writer = threading.Thread(target=write)
    writer.start()
    time.sleep(1.0)
    cdc.dbz.stop(drop_slot=False)  # a clean stop: offsets committed, the slot keeps the WAL
    time.sleep(1.0)  # rows keep being committed while Debezium is down
    cdc.dbz.start()
    writer.join(60)
    assert done.is_set()
    cdc.converged()
    topic = f"{cdc.prefix}.{cdc.schema}.entities"
    creates = [
        m
        for m in read_all(cdc.broker.bootstrap_servers, topic, timeout=15)
        if m.value()
        and json.loads(m.value()).get("payload", json.loads(m.value())).get("op") == "c"
    ]
    ids = [
        json.loads(m.value()).get("payload", json.loads(m.value()))["after"]["id"] for m in creates
    ]
    ours = sorted(i for i in ids if i.startswith("dbz-"))
    assert ours == [f"dbz-{n:03d}" for n in range(200)]  # every row once: none lost, none twice


def test_worker_killed_and_restarted_mid_stream_converges(cdc: Cdc, tmp_path: Path) -> None:
    """The same CDC stream through a second, separate worker (own consumer group and store)
    run as a process and SIGKILLed after commits, then restarted; its index must end equal to
    the SoR like the first one's."""
    rng = random.Random(42)
    with psycopg.connect(cdc.pg.dsn, autocommit=True) as conn:
        conn.execute(f'SET search_path TO "{cdc.schema}"'.encode())
        for n in range(300):
            conn.execute(
                "INSERT INTO entities (id, company_id, content) VALUES (%s, %s, %s)",
                (f"kill-{n:03d}", TENANTS[n % 2], content(rng, rng.randint(2, 12))),
            )
    cdc.converged()  # the first worker has it all: the stream is complete on the broker
    topics = cdc.plan.catalog.topics()
    ends = {
        t: {p: o for p, o in _last_offsets(cdc.broker.bootstrap_servers, t).items()} for t in topics
    }
    group = f"killed-{uuid.uuid4().hex[:8]}"

    def done() -> bool:
        return all(
            committed(cdc.broker.bootstrap_servers, group, t, list(ends[t])).get(p, -1) > last
            for t in topics
            for p, last in ends[t].items()
        )

    with EmbeddingStubServer() as stub:
        env = _worker_env(cdc, stub, tmp_path, group)
        log = (tmp_path / "worker.log").open("ab")
        kills = 0
        while kills < 3 and not done():
            proc = subprocess.Popen(
                [sys.executable, "-m", "streams"], env=env, stdout=log, stderr=subprocess.STDOUT
            )
            time.sleep(rng.uniform(2.5, 4.0))  # start-up, then some batches
            proc.send_signal(signal.SIGKILL)
            proc.wait(10)
            kills += 1
        log_path = tmp_path / "worker.log"
        started = log_path.read_text(errors="replace").count("consuming [")  # killed workers'
        proc = subprocess.Popen(
            [sys.executable, "-m", "streams"], env=env, stdout=log, stderr=subprocess.STDOUT
        )
        try:
            eventually(done, 120, "the restarted worker caught up")
            # its own line (the killed ones may have committed everything already): only then
            # are its signal handlers installed and a SIGTERM a clean stop
            eventually(
                lambda: log_path.read_text(errors="replace").count("consuming [") > started, 60
            )
        finally:
            proc.send_signal(signal.SIGTERM)
            assert proc.wait(30) == 0
        log.close()
    assert kills >= 1
    store = build_store(StoreSettings(data_dir=tmp_path / "store"), payload_schema(cdc.plan))
    sor = PostgresSor(cdc.pg.dsn, catalog=cdc.plan.catalog, hasher=Preparer(HASH_SPEC).content_hash)
    try:
        registry = FileIndexRegistry(tmp_path / "store", store)
        for tenant in TENANTS:
            report = reconcile(tenant, sor=sor, store=store, registry=registry)
            assert (report.drift, report.blind) == (0, 0), report.to_dict()
            assert report.sor_entities > 150
    finally:
        sor.close()
        store.close()


def _last_offsets(bootstrap: str, topic: str) -> dict[int, int]:
    """partition -> offset of the last record, read from the start (the test broker's high
    watermark cannot be trusted)."""
    last: dict[int, int] = {}
    for msg in read_all(bootstrap, topic, timeout=10):
        last[msg.partition()] = max(last.get(msg.partition(), -1), msg.offset())
    return last


def _worker_env(cdc: Cdc, stub: EmbeddingStubServer, tmp: Path, group: str) -> dict[str, str]:
    embedder = stub_embedder(stub.base_url)
    consumer = fast_consumer(cdc.dlq, group, max_batch_records=50).model_dump(mode="json")
    return {
        **os.environ,
        "PYTHONPATH": str(REPO_ROOT),
        "RAGSTREAM_CACHE_DIR": str(tmp / "cache"),
        "RAGSTREAM_KAFKA__BOOTSTRAP_SERVERS": cdc.broker.bootstrap_servers,
        "RAGSTREAM_CONSUMER": json.dumps(consumer),
        "RAGSTREAM_PLAN": cdc.plan.model_dump_json(),
        "RAGSTREAM_EMBEDDER": json.dumps(embedder),
        "RAGSTREAM_STORE__DATA_DIR": str(tmp / "store"),
        "RAGSTREAM_SOR__KIND": "postgres",
        "RAGSTREAM_SOR__DSN": cdc.pg.dsn,
        "RAGSTREAM_EMBEDDING_CACHE__PATH": str(tmp / "embedding-cache.sqlite"),
        "RAGSTREAM_METRICS_PORT": "0",
        "RAGSTREAM_RECONCILE__INTERVAL_S": "0",
    }


# --- the pipeline's five validation tests, on real CDC -----------------------------------


def test_seed_idempotency_same_content_again_leaves_exactly_its_chunks(cdc: Cdc) -> None:
    text = content(random.Random(10), 60)
    cdc.put("seed-a", "acme", text)
    cdc.converged()
    chunks = cdc.payloads("acme", "entities:seed-a")
    assert len(chunks) >= 10
    texts = cdc.embedder.texts
    cdc.sql("UPDATE entities SET content = %s, updated_at = now() WHERE id = 'seed-a'", (text,))
    stamp = max(p["source_updated_at_us"] for p in chunks)
    eventually(
        lambda: (
            min(p["source_updated_at_us"] for p in cdc.payloads("acme", "entities:seed-a")) > stamp
        ),
        what="the re-delivered row applied",
    )
    again = cdc.payloads("acme", "entities:seed-a")
    assert sorted(p["chunk_id"] for p in again) == sorted(p["chunk_id"] for p in chunks)
    assert cdc.embedder.texts == texts  # same content: no embedding


def test_seed_stale_detection_excludes_the_changed_entity_and_requests_a_reindex(
    cdc: Cdc,
) -> None:
    cdc.put("seed-b", "acme", "The backup generator is tested on the last Friday of the month.")
    cdc.converged()
    query = "when is the backup generator tested?"
    assert cdc.ask("acme", query).results[0].entity_id == "entities:seed-b"
    cdc.stop_worker()  # the index falls behind the SoR
    try:
        cdc.sql(
            "UPDATE entities SET content = %s, updated_at = now() WHERE id = 'seed-b'",
            ("The backup generator is tested every Monday morning.",),
        )
        pack = cdc.ask("acme", query)
        assert "entities:seed-b" not in [r.entity_id for r in pack.results]
        assert [
            (x.entity_id, x.reason) for x in pack.excluded if x.entity_id == "entities:seed-b"
        ] == [("entities:seed-b", pb.EXCLUSION_REASON_STALE)]
        requests = cdc.publisher.on("ragstream.reindex-requests")
        assert {"tenant": "acme", "entity_id": "entities:seed-b", "reason": "stale"}.items() <= (
            requests[-1].items()
        )
    finally:
        cdc.start_worker()
    cdc.converged()
    assert cdc.ask("acme", query).results[0].entity_id == "entities:seed-b"


def test_seed_tenant_isolation_nothing_crosses_tenants(cdc: Cdc) -> None:
    cdc.put("seed-c", "acme", "The acme vault combination changes every solstice.")
    cdc.converged()
    pack = cdc.ask("globex", "acme vault combination solstice")
    assert "entities:seed-c" not in [r.entity_id for r in pack.results]
    assert "entities:seed-c" not in [x.entity_id for x in pack.excluded]
    with pytest.raises(grpc.RpcError) as err:
        cdc.ask("acme", "acme vault combination", as_tenant="globex")
    assert err.value.code() == grpc.StatusCode.PERMISSION_DENIED


def test_seed_provenance_leads_from_the_chunk_to_its_sor_row(cdc: Cdc) -> None:
    cdc.put("seed-d", "globex", "Impellers of duplex steel resist chloride corrosion.", "Impellers")
    cdc.converged()
    result = cdc.ask("globex", "which impellers resist chloride corrosion?").results[0]
    mapping = cdc.plan.catalog.for_entity(result.entity_id)
    assert mapping is not None
    (key,) = mapping.key_of(result.entity_id)
    (row,) = cdc.sql("SELECT * FROM entities WHERE id = %s", (key,))
    assert result.source_hash == Preparer(HASH_SPEC).content_hash(
        row["content"], ContentFormat.TEXT
    )
    assert row["content"][result.locator.char_start : result.locator.char_end] == result.text
    assert result.title == row["name"]


def test_seed_embedding_versioning_reindex_moves_every_chunk_to_the_new_model(cdc: Cdc) -> None:
    cdc.sql("INSERT INTO order_lines VALUES (6006, 1, 'acme', 'Seal', 'For the versioning test.')")
    cdc.converged()
    registry = cdc.worker.registry
    old = registry.active_version("acme")
    report = reindex(
        "acme",
        embedder=cdc.next_embedder,
        preparer=Preparer(V2),
        handler=cdc.worker.handler,
        registry=registry,
        store=cdc.store,
        sor=cdc.sor,
        sparse_encoder=Bm25Encoder().model_version,
        search=retriever_search(cdc.app.retriever, 10),
        options=ReindexOptions(
            parity=ParitySettings(sample=40), settle_s=2.5, grace_s=0, force=True
        ),
    )
    assert report.outcome == "switched", report
    new = registry.active_version("acme")
    assert new is not None and new != old
    name = registry.manifest("acme", new).index_name
    versions = {
        p.payload["embedding_version"]
        for p in cdc.store.scroll(name, StoreFilter(tenant_id="acme"))
    }
    assert versions == {V2.model_version}
    assert registry.manifest("acme", old or 0).status == "retired"
    tables = {
        r.tables[t].sor_entities > 0
        for r in cdc.converged()
        if r.tenant == "acme"
        for t in r.tables
    }
    assert tables == {True}  # acme's rows of all three tables are in the new version


def test_no_record_of_the_whole_run_reached_the_dlq(cdc: Cdc) -> None:
    assert read_all(cdc.broker.bootstrap_servers, cdc.dlq, timeout=3) == []
