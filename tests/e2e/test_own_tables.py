"""Your own PostgreSQL, the README's walkthrough: discover -> check -> real Debezium -> worker
-> Retrieve, on a schema unlike the sample one.

The schema (`WALKTHROUGH_SQL`): `workspaces` (the tenants), `issues` with a composite key
(space, issue_no) whose tenant column `space` is named like no tenant column but references
`workspaces`, `recipes` whose content is JSON and which soft-deletes (`removed_at`), `manuals`
holding PDFs in a bytea column, and `audit_log`, which discover leaves out (nothing to index).
Rows exist before Debezium starts (its snapshot brings them) and more arrive while it runs.

Nothing is mapped by hand: the worker and Retrieve run discover's RAGSTREAM_PLAN__TABLES, the
database gets discover's fixes.sql, and Debezium runs discover's connector configuration (the
launcher's; the keys discover writes are asserted equal). check passes before Debezium starts
(database and connector) and after (topics). Retrieve answers with provenance (entity ids of
the composite key, the PDF's page, the content hash verified against the SoR) and reconcile
finds the index equal to the SoR.
"""

from __future__ import annotations

import asyncio
import hashlib
import json
import os
import subprocess
import sys
import threading
import time
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

import grpc
import psycopg
import pytest
from prometheus_client import CollectorRegistry
from pydantic import SecretStr

from ragcore.kafka_config import KafkaSettings
from ragcore.plan import PlanConfig
from ragcore.settings import SorSettings, StoreSettings
from ragcore.store.base import VectorStore
from ragcore.wiring import build_store, payload_schema
from ragdev.docgen import pdf_bytes
from ragdev.services.debezium import DebeziumConnect, PostgresSource
from ragdev.services.postgres import PostgresCluster
from ragdev.services.tansu import TansuBroker
from retrieval_api.app import build_app
from retrieval_api.settings import AuthSettings, GrpcSettings, RetrieveSettings
from schemas.proto.ragstream.retrieval.v1 import retrieval_pb2 as pb
from schemas.proto.ragstream.retrieval.v1 import retrieval_pb2_grpc as pb_grpc
from streams.app import IngestWorker, build_worker
from streams.reconcile import reconcile
from streams.settings import IngestSettings
from tests.e2e.test_real_cdc import wait_for_topics
from tests.streams.support import HashEmbedder, create_topics, fast_consumer

pytestmark = [pytest.mark.integration, pytest.mark.slow]

TENANTS = ("acme", "globex")
TOKENS = {t: f"{t}-token" for t in TENANTS}
MANUAL = pdf_bytes(
    [
        ["Espresso machine EM-7 manual", "Unpacking and first use."],
        ["Descaling: run the descaling programme with citric acid every 60 days."],
    ],
    title="EM-7 manual",
)

WALKTHROUGH_SQL = """
CREATE TABLE workspaces (slug text PRIMARY KEY, title text NOT NULL);
CREATE TABLE issues (
  space text NOT NULL REFERENCES workspaces (slug),
  issue_no int NOT NULL,
  title text NOT NULL,
  description text,
  priority text NOT NULL DEFAULT 'normal',
  updated_at timestamptz NOT NULL DEFAULT now(),
  PRIMARY KEY (space, issue_no)
);
CREATE TABLE recipes (
  id bigint PRIMARY KEY,
  space text NOT NULL REFERENCES workspaces (slug),
  name text NOT NULL,
  spec jsonb NOT NULL,
  removed_at timestamptz
);
CREATE TABLE manuals (
  id bigint PRIMARY KEY,
  space text NOT NULL REFERENCES workspaces (slug),
  file_name text NOT NULL,
  mime_type text NOT NULL,
  file bytea NOT NULL
);
CREATE TABLE audit_log (
  id bigserial PRIMARY KEY, space text REFERENCES workspaces (slug), at timestamptz, action text
);
INSERT INTO workspaces VALUES ('acme', 'Acme'), ('globex', 'Globex');
INSERT INTO issues (space, issue_no, title, description) VALUES
  ('acme', 1, 'Printer on fire', 'The floor 3 printer caught fire after the firmware update.'),
  ('globex', 1, 'Badge reader offline', 'The lobby badge reader stopped accepting cards.');
INSERT INTO recipes VALUES
  (10, 'acme', 'Saffron risotto', '{"ingredients": ["arborio rice", "saffron", "parmesan"],
    "minutes": 35}', NULL);
INSERT INTO audit_log (space, at, action) VALUES ('acme', now(), 'login');
"""


@dataclass
class Walkthrough:
    dsn: str
    schema: str
    discovered: dict[str, Any]
    checks: dict[str, tuple[int, dict[str, Any]]]
    worker: IngestWorker
    store: VectorStore
    client: pb_grpc.RetrievalServiceStub

    def sql(self, statement: str, params: tuple[Any, ...] = ()) -> None:
        with psycopg.connect(self.dsn, autocommit=True) as conn:
            conn.execute(f"SET search_path TO {self.schema}".encode())
            conn.execute(statement.encode(), params)

    def ask(self, tenant: str, query: str) -> pb.EvidencePack:
        request = pb.RetrieveRequest(query_text=query, top_k=5, tenant=tenant)
        pack: pb.EvidencePack = self.client.Retrieve(
            request, metadata=(("authorization", f"Bearer {TOKENS[tenant]}"),), timeout=30
        )
        return pack

    def top(self, tenant: str, query: str) -> pb.Result | None:
        """The first result, or None (no evidence, or no index yet for the tenant)."""
        try:
            pack = self.ask(tenant, query)
        except grpc.RpcError as exc:
            if exc.code() is grpc.StatusCode.NOT_FOUND:
                return None  # the tenant's first change is not indexed yet
            raise
        return pack.results[0] if pack.status == pb.RETRIEVAL_STATUS_SUCCESS else None


def eventually(check: Callable[[], bool], what: str, timeout: float = 120.0) -> None:
    deadline = time.monotonic() + timeout
    while not check():
        if time.monotonic() > deadline:
            pytest.fail(f"not reached in {timeout}s: {what}")
        time.sleep(0.3)


def cli(env: dict[str, str], *args: str) -> tuple[int, dict[str, Any]]:
    """`ragstream tables ...` as a user runs it (its own process), the JSON report it prints."""
    done = subprocess.run(
        [sys.executable, "-m", "ragstream.cli", "tables", *args],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
        env={**os.environ, **env},
    )
    assert done.returncode in (0, 1), done.stderr
    return done.returncode, json.loads(done.stdout)


@pytest.fixture(scope="module")
def walkthrough(
    postgres: PostgresCluster,
    kafka_broker: TansuBroker,
    tmp_path_factory: pytest.TempPathFactory,
) -> Iterator[Walkthrough]:
    suffix = uuid.uuid4().hex[:8]
    schema, prefix, name = f"own_{suffix}", f"own{suffix}", f"own_{suffix}"
    out = tmp_path_factory.mktemp("discovered")
    with psycopg.connect(postgres.dsn, autocommit=True) as conn:
        conn.execute(f"CREATE SCHEMA {schema}".encode())
        conn.execute(f"SET search_path TO {schema}".encode())
        conn.execute(WALKTHROUGH_SQL.encode())
        conn.execute(
            b"INSERT INTO manuals VALUES (1, 'acme', 'em7-manual.pdf', 'application/pdf', %s)",
            (MANUAL,),
        )
    dlq = f"{prefix}.dlq"
    env = {
        "RAGSTREAM_PLAN__TOPIC_PREFIX": prefix,
        "RAGSTREAM_CONSUMER__DLQ_TOPIC": dlq,
        "RAGSTREAM_KAFKA__BOOTSTRAP_SERVERS": kafka_broker.bootstrap_servers,
    }
    check_args = ("check", "--dsn", postgres.dsn, "--tables", str(out / "tables.json"))
    try:
        # 1. discover, with the connector
        code, discovered = cli(
            env,
            "discover",
            "--dsn",
            postgres.dsn,
            "--schema",
            schema,
            "--publication",
            name,
            "--slot",
            name,
            "--connector-name",
            name,
            "--connector",
            "--write",
            str(out),
        )
        assert code == 0
        # 2. its fixes, reviewed (here: all of them)
        with psycopg.connect(postgres.dsn, autocommit=True) as conn:
            conn.execute((out / "fixes.sql").read_bytes())
        # 3. check before Debezium runs: the database and the connector
        checks = {
            "before": cli(
                env, *check_args, "--connector", str(out / "kafka-connect.json"), "--no-broker"
            )
        }
        # 4. real Debezium with discover's connector
        generated = json.loads((out / "kafka-connect.json").read_text())["config"]
        dbz = DebeziumConnect(
            bootstrap_servers=kafka_broker.bootstrap_servers,
            source=PostgresSource("127.0.0.1", postgres.port, "postgres", "postgres"),
            tables=generated["table.include.list"].split(","),
            topic_prefix=generated["topic.prefix"],
            name=generated["name"],
            work_dir=tmp_path_factory.mktemp("connect"),
            connector={
                "publication.name": generated["publication.name"],
                "slot.name": generated["slot.name"],
                "poll.interval.ms": "50",
            },
            create_publication=False,  # fixes.sql created it
        )
        running = dbz.connector_config()
        for key, value in generated.items():
            if key.startswith(("database.", "topic.creation.")) or key == "poll.interval.ms":
                continue  # the launcher's local address, its test topics, fast polls
            assert running[key] == value, key
        plan = PlanConfig.model_validate(
            {"tables": json.loads((out / "tables.json").read_text()), "topic_prefix": prefix}
        )
        dbz.start(timeout=180)
        try:
            create_topics(kafka_broker.bootstrap_servers, dlq, partitions=1)
            wait_for_topics(kafka_broker.bootstrap_servers, plan.catalog.topics(), 120)
            # 5. check again, the topics included
            checks["after"] = cli(env, *check_args, "--connector", str(out / "kafka-connect.json"))
            # 6. the worker and Retrieve on discover's mappings
            yield from _run(
                postgres,
                kafka_broker,
                tmp_path_factory,
                Found(schema, plan, dlq, discovered, checks),
            )
        finally:
            dbz.stop()
    finally:
        with psycopg.connect(postgres.dsn, autocommit=True) as conn:
            conn.execute(f"DROP PUBLICATION IF EXISTS {name}".encode())
            conn.execute(f"DROP SCHEMA {schema} CASCADE".encode())


@dataclass
class Found:
    """What the commands produced: the schema, discover's plan and report, check's reports."""

    schema: str
    plan: PlanConfig
    dlq: str
    discovered: dict[str, Any]
    checks: dict[str, tuple[int, dict[str, Any]]]


def _run(
    postgres: PostgresCluster,
    kafka_broker: TansuBroker,
    tmp_path_factory: pytest.TempPathFactory,
    found: Found,
) -> Iterator[Walkthrough]:
    """The worker (its start-up check included) and Retrieve on discover's mappings."""
    plan, schema = found.plan, found.schema
    data_dir = tmp_path_factory.mktemp("store")
    sor = SorSettings(kind="postgres", dsn=SecretStr(postgres.dsn))
    settings = IngestSettings(
        kafka=KafkaSettings(bootstrap_servers=kafka_broker.bootstrap_servers),
        consumer=fast_consumer(found.dlq, f"ingest-{schema}"),
        store=StoreSettings(data_dir=data_dir),
        sor=sor,
        plan=plan,
        embedding_cache=None,
    )
    store = build_store(settings.store, payload_schema(plan))
    worker = build_worker(settings, CollectorRegistry(), store=store, embedder=HashEmbedder())
    worker.check()  # the start-up mapping check passes on discover's mappings
    app = build_app(
        RetrieveSettings(
            grpc=GrpcSettings(port=0),
            auth=AuthSettings(
                tokens={t: hashlib.sha256(v.encode()).hexdigest() for t, v in TOKENS.items()}
            ),
            store=StoreSettings(data_dir=data_dir),
            sor=sor,
            plan=plan,
            publish_enabled=False,
        ),
        CollectorRegistry(),
        store=store,
        embedder=HashEmbedder(),
    )
    loop = asyncio.new_event_loop()
    loop_thread = threading.Thread(target=loop.run_forever, daemon=True)
    loop_thread.start()
    asyncio.run_coroutine_threadsafe(app.server.start(), loop).result(30)
    channel = grpc.insecure_channel(f"127.0.0.1:{app.server.port}")
    worker.loop.start()
    thread = threading.Thread(target=worker.loop.run, args=(worker.stop,), daemon=True)
    thread.start()
    try:
        yield Walkthrough(
            postgres.dsn,
            schema,
            found.discovered,
            found.checks,
            worker,
            store,
            pb_grpc.RetrievalServiceStub(channel),
        )
    finally:
        worker.stop.set()
        thread.join(30)
        channel.close()
        asyncio.run_coroutine_threadsafe(app.server.stop(), loop).result(30)
        loop.call_soon_threadsafe(loop.stop)
        loop_thread.join(10)
        app.close()
        worker.close()
        store.close()


def test_discover_maps_each_table_by_its_shape_and_leaves_out_what_it_cannot(
    walkthrough: Walkthrough,
) -> None:
    s = walkthrough.schema
    mappings = {m["table"]: m for m in walkthrough.discovered["RAGSTREAM_PLAN__TABLES"]}
    assert set(mappings) == {f"{s}.issues", f"{s}.recipes", f"{s}.manuals"}
    issues, recipes, manuals = (mappings[f"{s}.{t}"] for t in ("issues", "recipes", "manuals"))
    assert issues["key_columns"] == ["space", "issue_no"]
    assert issues["tenant_column"] == recipes["tenant_column"] == "space"  # by foreign key
    assert recipes["json_columns"] == ["spec"]
    assert recipes["deleted_at_column"] == "removed_at"
    assert manuals["document"]["column"] == "file"
    left_out = {x["table"]: x["reason"] for x in walkthrough.discovered["left_out"]}
    assert set(left_out) == {f"{s}.workspaces", f"{s}.audit_log"}
    assert "nothing to index" in left_out[f"{s}.audit_log"]
    reasons = {t["table"]: t["reasons"] for t in walkthrough.discovered["tables"]}
    assert f"references {s}.workspaces" in reasons[f"{s}.issues"]["tenant_column"]


def test_check_passes_before_debezium_and_with_the_topics_after(walkthrough: Walkthrough) -> None:
    for when in ("before", "after"):
        code, report = walkthrough.checks[when]
        assert (code, report["ok"]) == (0, True), (when, report["problems"])
    assert walkthrough.checks["after"][1]["checked"]["broker"] is not None


def test_snapshot_rows_are_answered_with_provenance(walkthrough: Walkthrough) -> None:
    eventually(
        lambda: (
            (r := walkthrough.top("acme", "printer caught fire firmware")) is not None
            and r.entity_id == "issues:acme,1"
        ),
        "the snapshotted issue",
    )
    top = walkthrough.top("acme", "printer caught fire firmware")
    assert top is not None
    assert top.title == "Printer on fire"
    assert top.source_hash  # verified equal to the SoR's row
    assert top.source_reference.endswith("issues:acme,1")
    # each table's snapshot has its own topic: none waits for another's (tenant-fair ingest)
    eventually(
        lambda: (
            (r := walkthrough.top("acme", "saffron arborio rice parmesan")) is not None
            and r.entity_id == "recipes:10"
        ),
        "the snapshotted recipe",
    )
    recipe = walkthrough.top("acme", "saffron arborio rice parmesan")
    assert recipe is not None and recipe.entity_id == "recipes:10"
    assert "ingredients: arborio rice, saffron, parmesan" in recipe.text  # JSON as lines
    eventually(
        lambda: (
            (r := walkthrough.top("acme", "descaling programme citric acid")) is not None
            and r.entity_id == "manuals:1"
        ),
        "the manual's page",
    )
    page = walkthrough.top("acme", "descaling programme citric acid")
    assert page is not None
    assert list(page.locator.section_path) == ["em7-manual.pdf", "p. 2"]
    # tenants stay apart: globex sees its own issue, never acme's
    eventually(
        lambda: (
            (r := walkthrough.top("globex", "badge reader lobby cards")) is not None
            and r.entity_id == "issues:globex,1"
        ),
        "globex's issue",
    )
    badge = walkthrough.top("globex", "badge reader lobby cards")
    assert badge is not None and badge.entity_id == "issues:globex,1"
    other = walkthrough.ask("globex", "printer caught fire firmware")
    assert all(r.entity_id.split(":")[1].split(",")[0] != "acme" for r in other.results)


def test_live_changes_soft_deletes_and_the_index_equal_to_the_sor(
    walkthrough: Walkthrough,
) -> None:
    eventually(lambda: walkthrough.top("acme", "saffron arborio") is not None, "the recipe")
    walkthrough.sql(
        "INSERT INTO issues (space, issue_no, title, description) VALUES"
        " ('acme', 2, 'Coffee machine leaks', 'Water pools under the EM-7 after descaling.')"
    )
    eventually(
        lambda: (
            (r := walkthrough.top("acme", "water pools under coffee machine")) is not None
            and r.entity_id == "issues:acme,2"
        ),
        "the new issue",
    )
    walkthrough.sql("UPDATE recipes SET removed_at = now() WHERE id = 10")
    eventually(
        lambda: all(
            r.entity_id != "recipes:10" for r in walkthrough.ask("acme", "saffron arborio").results
        ),
        "the soft-deleted recipe gone",
    )
    walkthrough.sql("INSERT INTO audit_log (space, at, action) VALUES ('acme', now(), 'export')")
    sor = walkthrough.worker.sor
    assert sor is not None

    def converged() -> bool:
        reports = [
            reconcile(t, sor=sor, store=walkthrough.store, registry=walkthrough.worker.registry)
            for t in TENANTS
        ]
        return all(r.drift == 0 and r.blind == 0 for r in reports)

    eventually(converged, "the index equal to the SoR")
