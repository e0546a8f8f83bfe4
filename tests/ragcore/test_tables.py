"""Many tables, one truth: the worker, reconcile and the SoR readers with three tables of
different shapes, on a real PostgreSQL and a real SQLite SoR, and qdrant-edge.

- `entities`: the seed table (text key, tenant column, JSON metadata);
- `order_lines`: a composite key (order_id, line_no), content from two columns;
- `products`: a JSON column rendered as content, its own tenant column (`vendor`).

The change events are what Debezium's PostgreSQL connector writes (`change_event`); the handler
is driven directly (no broker: these tests are about what reaches the index).
"""

from __future__ import annotations

import json
import sqlite3
import uuid
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import psycopg
import pytest
from prometheus_client import CollectorRegistry
from psycopg.rows import dict_row
from pydantic import SecretStr

from ragcore.kafka_config import KafkaSettings
from ragcore.mapping import TableMapping
from ragcore.plan import PlanConfig
from ragcore.settings import SorSettings, StoreSettings
from ragcore.store.base import StoreFilter
from ragcore.store.edge import EdgeStore
from ragdev.services.postgres import PostgresCluster
from ragdev.sor.debezium_format import change_event, encode_key, encode_value
from schemas.events import TOAST_PLACEHOLDER, Op, RawRecord
from streams.app import IngestWorker, build_worker
from streams.reconcile import reconcile
from streams.settings import IngestSettings
from tests.streams.support import HashEmbedder, index_snapshot, three_tables

pytestmark = pytest.mark.integration

TENANTS = ("acme", "globex")


def mappings(schema: str) -> tuple[TableMapping, ...]:
    """The three tables (and `invoices`, ingested but later unmapped) in `schema`."""
    return three_tables(schema, named=True)


INVOICES = "invoices"

PG_DDL = """
CREATE TABLE entities (id text PRIMARY KEY, company_id text NOT NULL,
  entity_type text NOT NULL DEFAULT 'KNOWLEDGE_ARTIFACT', name text NOT NULL DEFAULT '',
  content text NOT NULL DEFAULT '', metadata jsonb NOT NULL DEFAULT '{}'::jsonb,
  content_hash text, created_at timestamptz NOT NULL DEFAULT now(),
  updated_at timestamptz NOT NULL DEFAULT now(), deleted_at timestamptz);
CREATE TABLE order_lines (order_id int, line_no int, org text NOT NULL, product text,
  note text, PRIMARY KEY (order_id, line_no));
CREATE TABLE products (sku text PRIMARY KEY, vendor text NOT NULL, title text,
  specs jsonb, updated_at timestamptz NOT NULL DEFAULT now(), deleted_at timestamptz);
CREATE TABLE invoices (id text PRIMARY KEY, company_id text NOT NULL, name text,
  content text, entity_type text, metadata jsonb, content_hash text,
  created_at timestamptz, updated_at timestamptz, deleted_at timestamptz);
"""
SQLITE_DDL = """
CREATE TABLE entities (id TEXT PRIMARY KEY, company_id TEXT NOT NULL,
  entity_type TEXT NOT NULL DEFAULT 'KNOWLEDGE_ARTIFACT', name TEXT NOT NULL DEFAULT '',
  content TEXT NOT NULL DEFAULT '', metadata TEXT NOT NULL DEFAULT '{}', content_hash TEXT,
  created_at TEXT, updated_at TEXT, deleted_at TEXT);
CREATE TABLE order_lines (order_id INTEGER, line_no INTEGER, org TEXT NOT NULL,
  product TEXT, note TEXT, PRIMARY KEY (order_id, line_no));
CREATE TABLE products (sku TEXT PRIMARY KEY, vendor TEXT NOT NULL, title TEXT, specs TEXT,
  updated_at TEXT, deleted_at TEXT);
CREATE TABLE invoices (id TEXT PRIMARY KEY, company_id TEXT NOT NULL, name TEXT,
  content TEXT, entity_type TEXT, metadata TEXT, content_hash TEXT,
  created_at TEXT, updated_at TEXT, deleted_at TEXT);
"""


@dataclass
class TablesEnv:
    """One SoR (PostgreSQL schema or SQLite file) with the tables, a store and a worker."""

    kind: str
    schema: str
    sql: Any  # (statement, params) -> rows as dicts
    sor: SorSettings
    data_dir: Path
    store: EdgeStore
    worker: IngestWorker
    lsn: int = 1000
    offset: int = 0

    def build(self, tables: tuple[TableMapping, ...]) -> IngestWorker:
        return build_tables_worker(self.data_dir, self.sor, self.store, tables)

    def record(
        self, table: str, key: Mapping[str, Any], value: Mapping[str, Any] | None
    ) -> RawRecord:
        self.offset += 1
        return RawRecord(
            f"sor.public.{table}", 0, self.offset, encode_key(key), encode_value(value)
        )

    def event(
        self,
        table: str,
        op: Op,
        key_columns: tuple[str, ...],
        before: Mapping[str, Any] | None,
        after: Mapping[str, Any] | None,
    ) -> RawRecord:
        self.lsn += 8
        row = after if after is not None else before
        assert row is not None
        value = change_event(
            op, before=before, after=after, table=table, schema=self.schema, lsn=self.lsn
        )
        return self.record(table, {c: row[c] for c in key_columns}, value)

    def truncate(self, table: str) -> RawRecord:
        self.lsn += 8
        value = change_event(
            Op.TRUNCATE, before=None, after=None, table=table, schema=self.schema, lsn=self.lsn
        )
        self.offset += 1
        return RawRecord(f"sor.public.{table}", 0, self.offset, None, encode_value(value))

    def apply(self, *records: RawRecord, worker: IngestWorker | None = None) -> None:
        letters = (worker or self.worker).handler.handle(list(records))
        assert not letters, [(x.code, x.message) for x in letters]

    def snapshot(self) -> dict[str, dict[str, dict[str, str]]]:
        return index_snapshot(self.store, self.worker.registry, TENANTS)


def build_tables_worker(
    data_dir: Path, sor: SorSettings, store: EdgeStore, tables: tuple[TableMapping, ...]
) -> IngestWorker:
    """A worker (handler, SoR reader) mapping `tables`, writing to `store`."""
    settings = IngestSettings(
        kafka=KafkaSettings(bootstrap_servers="127.0.0.1:1"),  # never contacted
        store=StoreSettings(data_dir=data_dir),
        sor=sor,
        plan=PlanConfig(tables=tables),
        embedding_cache=None,
    )
    return build_worker(settings, CollectorRegistry(), store=store, embedder=HashEmbedder())


def _pg_rows(
    dsn: str, schema: str, statement: str, params: tuple[Any, ...]
) -> list[dict[str, Any]]:
    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute(f'SET search_path TO "{schema}"'.encode())
        cur = conn.cursor(row_factory=dict_row)
        cur.execute(statement.replace("?", "%s").encode(), params)
        return [dict(r) for r in cur.fetchall()] if cur.description else []


@pytest.fixture(params=["postgres", "sqlite"])
def env(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[TablesEnv]:
    schema = f"mt_{uuid.uuid4().hex[:8]}"
    cleanup: list[Any] = []
    if request.param == "postgres":
        postgres: PostgresCluster = request.getfixturevalue("postgres")
        dsn = postgres.dsn
        with psycopg.connect(dsn, autocommit=True) as conn:
            conn.execute(f'CREATE SCHEMA "{schema}"'.encode())
            conn.execute(f'SET search_path TO "{schema}"'.encode())
            conn.execute(PG_DDL.encode())

        def sql(statement: str, params: tuple[Any, ...] = ()) -> list[dict[str, Any]]:
            return _pg_rows(dsn, schema, statement, params)

        sor = SorSettings(kind="postgres", dsn=SecretStr(dsn))

        def drop() -> None:
            with psycopg.connect(dsn, autocommit=True) as conn:
                conn.execute(f'DROP SCHEMA "{schema}" CASCADE'.encode())

        cleanup.append(drop)
    else:
        path = tmp_path / "sor.sqlite"
        with sqlite3.connect(path) as db:
            db.executescript(SQLITE_DDL)

        def sql(statement: str, params: tuple[Any, ...] = ()) -> list[dict[str, Any]]:
            with sqlite3.connect(path) as lite:
                lite.row_factory = sqlite3.Row
                rows = [dict(r) for r in lite.execute(statement, params).fetchall()]
            return rows

        sor = SorSettings(kind="sqlite", sqlite_path=path)
    store = EdgeStore(tmp_path / "store")
    worker = build_tables_worker(tmp_path / "store", sor, store, mappings(schema))
    environment = TablesEnv(request.param, schema, sql, sor, tmp_path / "store", store, worker)
    yield environment
    environment.worker.close()
    store.close()
    for step in cleanup:
        step()


def put_entity(env: TablesEnv, key: str, tenant: str, text: str) -> RawRecord:
    env.sql(
        "INSERT INTO entities (id, company_id, name, content, metadata, created_at, updated_at)"
        " VALUES (?, ?, ?, ?, ?, ?, ?)",
        (
            key,
            tenant,
            f"Doc {key}",
            text,
            '{"format": "text"}',
            "2026-01-01T00:00:00Z",
            f"2026-01-01T00:00:{env.offset % 60:02d}Z",
        ),
    )
    row = env.sql("SELECT * FROM entities WHERE id = ?", (key,))[0]
    return env.event("entities", Op.CREATE, ("id",), None, row)


def put_line(env: TablesEnv, key: tuple[int, int], org: str, product: str, note: str) -> RawRecord:
    order, line = key
    env.sql("INSERT INTO order_lines VALUES (?, ?, ?, ?, ?)", (order, line, org, product, note))
    row = {"order_id": order, "line_no": line, "org": org, "product": product, "note": note}
    return env.event("order_lines", Op.CREATE, ("order_id", "line_no"), None, row)


def put_product(
    env: TablesEnv, sku: str, vendor: str, title: str, specs: dict[str, Any]
) -> RawRecord:
    env.sql(
        "INSERT INTO products (sku, vendor, title, specs, updated_at) VALUES (?, ?, ?, ?, ?)",
        (sku, vendor, title, json.dumps(specs), "2026-01-02T00:00:00Z"),
    )
    row = env.sql("SELECT * FROM products WHERE sku = ?", (sku,))[0]
    if isinstance(row["specs"], dict):  # psycopg parses jsonb; Debezium sends it as text
        row["specs"] = json.dumps(row["specs"])
    return env.event("products", Op.CREATE, ("sku",), None, row)


def load(env: TablesEnv) -> None:
    env.apply(
        put_entity(env, "e1", "acme", "Refunds are issued within thirty days of a return."),
        put_entity(env, "1001", "globex", "Pump seals are checked every thousand hours."),
        put_line(env, (1001, 1), "acme", "Seal kit K-27", "Urgent, ship by air."),
        put_line(env, (1001, 2), "acme", "Bearing set", "Standard delivery."),
        put_line(env, (2002, 1), "globex", "Impeller", "Duplex steel."),
        put_product(env, "GX-300", "globex", "GX-300 pump", {"material": "duplex", "bar": 16}),
        put_product(env, "AC-1", "acme", "Acme Flow seat", {"users": 1, "sso": True}),
    )


def test_three_tables_index_separately_and_reconcile_finds_no_drift(env: TablesEnv) -> None:
    load(env)
    snap = env.snapshot()
    assert set(snap["acme"]) == {
        "entities:e1",
        "order_lines:1001,1",
        "order_lines:1001,2",
        "products:AC-1",
    }
    # the same key in two tables is two entities (an entity `1001`, an order 1001)
    assert set(snap["globex"]) == {"entities:1001", "order_lines:2002,1", "products:GX-300"}
    name = env.worker.registry.manifest("globex", 1).index_name
    points = {
        p.payload["source_entity_id"]: p.payload
        for p in env.store.scroll(name, StoreFilter(tenant_id="globex"))
    }
    product = points["products:GX-300"]
    assert (product["entity_type"], product["source_table"]) == ("PRODUCT", "products")
    assert "material: duplex" in product["text"] and "bar: 16" in product["text"]
    assert points["order_lines:2002,1"]["text"] == "Impeller\n\nDuplex steel."
    sor = env.worker.sor
    assert sor is not None
    for tenant in TENANTS:
        report = reconcile(tenant, sor=sor, store=env.store, registry=env.worker.registry)
        assert (report.drift, report.blind) == (0, 0), report.to_dict()
        assert set(report.tables) == {"entities", "order_lines", "products"}
    acme = reconcile("acme", sor=sor, store=env.store, registry=env.worker.registry)
    assert acme.tables["order_lines"].sor_entities == 2
    assert acme.tables["order_lines"].indexed_entities == 2


def test_update_delete_and_toast_refetch_per_table(env: TablesEnv) -> None:
    load(env)
    before = {
        "order_id": 1001,
        "line_no": 2,
        "org": "acme",
        "product": "Bearing set",
        "note": "Standard delivery.",
    }
    env.sql(
        "UPDATE order_lines SET note = ? WHERE order_id = 1001 AND line_no = 2",
        ("Express delivery, insured.",),
    )
    # REPLICA IDENTITY DEFAULT: the unchanged TOASTed column comes as the placeholder
    after = {**before, "note": TOAST_PLACEHOLDER}
    env.apply(env.event("order_lines", Op.UPDATE, ("order_id", "line_no"), None, after))
    name = env.worker.registry.manifest("acme", 1).index_name
    only = StoreFilter(tenant_id="acme", entity_ids=("order_lines:1001,2",))
    assert [p.payload["text"] for p in env.store.scroll(name, only)] == [
        "Bearing set\n\nExpress delivery, insured."
    ]
    # soft delete in products, hard delete in order_lines
    row = env.sql("SELECT * FROM products WHERE sku = 'AC-1'")[0]
    if isinstance(row["specs"], dict):
        row["specs"] = json.dumps(row["specs"])
    env.sql("UPDATE products SET deleted_at = ? WHERE sku = 'AC-1'", ("2026-02-01T00:00:00Z",))
    soft = {**row, "deleted_at": "2026-02-01T00:00:00Z", "updated_at": "2026-02-01T00:00:00Z"}
    env.sql("DELETE FROM order_lines WHERE order_id = 1001 AND line_no = 1")
    gone = {"order_id": 1001, "line_no": 1}
    env.apply(
        env.event("products", Op.UPDATE, ("sku",), row, soft),
        env.event("order_lines", Op.DELETE, ("order_id", "line_no"), gone, None),
    )
    assert set(env.snapshot()["acme"]) == {"entities:e1", "order_lines:1001,2"}
    sor = env.worker.sor
    assert sor is not None
    report = reconcile("acme", sor=sor, store=env.store, registry=env.worker.registry)
    assert report.drift == 0, report.to_dict()


def test_truncate_removes_that_tables_chunks_in_every_tenant_and_nothing_else(
    env: TablesEnv,
) -> None:
    load(env)
    env.sql("DELETE FROM order_lines")
    truncate = env.truncate("order_lines")
    later = put_line(env, (3003, 1), "globex", "Coupling", "Inserted after the truncate.")
    env.apply(truncate, later)  # one batch: the truncate applies before the later insert
    snap = env.snapshot()
    assert set(snap["acme"]) == {"entities:e1", "products:AC-1"}
    assert set(snap["globex"]) == {"entities:1001", "products:GX-300", "order_lines:3003,1"}
    sor = env.worker.sor
    assert sor is not None
    for tenant in TENANTS:
        report = reconcile(tenant, sor=sor, store=env.store, registry=env.worker.registry)
        assert report.drift == 0, report.to_dict()


def test_reconcile_never_repairs_away_what_it_cannot_see(env: TablesEnv) -> None:
    load(env)
    # a fourth table is ingested while mapped...
    with_invoices = (
        *mappings(env.schema),
        TableMapping(table=f"{env.schema}.{INVOICES}", name=INVOICES),
    )
    wide = env.build(with_invoices)
    env.sql(
        "INSERT INTO invoices (id, company_id, name, content, entity_type, metadata)"
        " VALUES ('i1', 'acme', 'March invoice', 'Invoice for March: 12 seats.', 'INVOICE', '{}')"
    )
    row = env.sql("SELECT * FROM invoices WHERE id = 'i1'")[0]
    if isinstance(row["metadata"], dict):
        row["metadata"] = json.dumps(row["metadata"])
    env.apply(env.event(INVOICES, Op.CREATE, ("id",), None, row), worker=wide)
    wide.close()
    # ...then its mapping is removed, and the products table becomes unreadable
    env.sql("ALTER TABLE products RENAME TO products_old")
    sor = env.worker.sor
    assert sor is not None
    report = reconcile(
        "acme",
        sor=sor,
        store=env.store,
        registry=env.worker.registry,
        handler=env.worker.handler,
        repair=True,
    )
    assert report.unmapped == ["invoices:i1"]
    assert report.unreadable == ["products:AC-1"]
    assert report.tables["products"].error is not None
    assert report.drift == 0 and report.repaired == 0
    # nothing was deleted: both are still indexed
    assert {"invoices:i1", "products:AC-1"} <= set(env.snapshot()["acme"])
    # a reindex request for them is refused, not applied as a delete
    rejected = env.worker.handler.reread("acme", ["invoices:i1", "products:AC-1"], "test")
    assert sorted(r.code for r in rejected) == ["MAPPING_ERROR", "SOR_TABLE_UNREADABLE"]
    assert {"invoices:i1", "products:AC-1"} <= set(env.snapshot()["acme"])
