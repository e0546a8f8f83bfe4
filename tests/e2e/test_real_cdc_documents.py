"""Documents through real CDC: a `bytea` column of PostgreSQL, captured by real Debezium
(base64 in the JSON change events), indexed with page and heading locators, verified by
Retrieve against the same PostgreSQL (the file's SHA-256 on both sides), a TOASTed file
re-read when only another column changed, and a bad file sent to the DLQ under its reason.
"""

from __future__ import annotations

import asyncio
import hashlib
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

import grpc
import psycopg
import pytest
from prometheus_client import CollectorRegistry

from ragcore.mapping import TableMapping
from ragcore.plan import PlanConfig
from ragcore.settings import StoreSettings
from ragcore.store.base import StoreFilter, VectorStore
from ragcore.wiring import build_store, payload_schema
from ragdev.docgen import docx_bytes, encrypted_pdf_bytes, pdf_bytes
from ragdev.sample_documents import DOCUMENTS_TABLE
from ragdev.services.postgres import PostgresCluster
from ragdev.services.tansu import TansuBroker
from retrieval_api.app import build_app
from retrieval_api.settings import AuthSettings, GrpcSettings, RetrieveSettings
from schemas.proto.ragstream.retrieval.v1 import retrieval_pb2 as pb
from schemas.proto.ragstream.retrieval.v1 import retrieval_pb2_grpc as pb_grpc
from streams.app import IngestWorker, build_worker
from tests.e2e.test_real_cdc import captured_schema, ingest_settings, wait_for_topics
from tests.streams.support import HashEmbedder, read_all

pytestmark = [pytest.mark.integration, pytest.mark.slow]

TOKEN = "globex-token"
DATASHEET = pdf_bytes(
    [
        ["GX-300 centrifugal pump datasheet", "Rated flow 40 m3/h at 32 m head."],
        ["Materials: duplex stainless steel impeller, cast iron casing."]
        + [f"Performance point {n}: {20 + n} m3/h at {40 - n} m." for n in range(40)],
        ["Maintenance: replace the mechanical seal with seal kit SK-9 every 4000 hours."],
    ],
    title="GX-300 datasheet",
)
PROCEDURE = docx_bytes(
    [("h1", "Seal change"), ("p", "Drain the casing."), ("h2", "Lockout"), ("p", "Open Q1.")]
)


def documents_table(schema: str) -> TableMapping:
    """The sample corpus's documents table in this test's schema (no created/deleted columns)."""
    return DOCUMENTS_TABLE.model_copy(
        update={
            "table": f"{schema}.documents",
            "created_at_column": None,
            "deleted_at_column": None,
        }
    )


@dataclass
class Stack:
    dsn: str
    schema: str
    worker: IngestWorker
    store: VectorStore
    embedder: HashEmbedder
    client: pb_grpc.RetrievalServiceStub
    broker: TansuBroker
    dlq: str

    def sql(self, statement: str, params: tuple[Any, ...] = ()) -> None:
        with psycopg.connect(self.dsn, autocommit=True) as conn:
            conn.execute(f'SET search_path TO "{self.schema}"'.encode())
            conn.execute(statement.encode(), params)

    def payloads(self, entity_id: str) -> list[dict[str, Any]]:
        version = self.worker.registry.active_version("globex")
        if version is None:
            return []
        name = self.worker.registry.manifest("globex", version).index_name
        flt = StoreFilter(tenant_id="globex", entity_ids=(entity_id,))
        return [dict(p.payload) for p in self.store.scroll(name, flt)]

    def ask(self, query: str) -> pb.EvidencePack:
        request = pb.RetrieveRequest(query_text=query, top_k=5, tenant="globex")
        pack: pb.EvidencePack = self.client.Retrieve(
            request, metadata=(("authorization", f"Bearer {TOKEN}"),), timeout=30
        )
        return pack


def eventually(check: Callable[[], bool], what: str, timeout: float = 90.0) -> None:
    deadline = time.monotonic() + timeout
    while not check():
        if time.monotonic() > deadline:
            pytest.fail(f"not reached in {timeout}s: {what}")
        time.sleep(0.3)


@pytest.fixture(scope="module")
def stack(
    postgres: PostgresCluster, kafka_broker: TansuBroker, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[Stack]:
    def setup(conn: psycopg.Connection[Any]) -> None:
        conn.execute(
            b"CREATE TABLE documents (id int PRIMARY KEY, company_id text NOT NULL, title text,"
            b" file_name text, mime_type text, body bytea NOT NULL,"
            b" updated_at timestamptz NOT NULL DEFAULT now());"
            b" ALTER TABLE documents ALTER COLUMN body SET STORAGE EXTERNAL;"
        )
        # before Debezium starts: its snapshot must bring it
        conn.execute(
            b"INSERT INTO documents (id, company_id, title, file_name, mime_type, body)"
            b" VALUES (1, 'globex', 'GX-300 datasheet', 'gx300-datasheet.pdf',"
            b" 'application/pdf', %s)",
            (DATASHEET,),
        )

    with captured_schema(
        postgres, kafka_broker, tmp_path_factory, name="docs", setup=setup, tables=["documents"]
    ) as captured:
        schema = captured.schema
        plan = PlanConfig(tables=(documents_table(schema),), topic_prefix=captured.prefix)
        wait_for_topics(kafka_broker.bootstrap_servers, plan.catalog.topics())
        data_dir = tmp_path_factory.mktemp("store")
        settings = ingest_settings(kafka_broker, postgres, captured, plan, data_dir)
        sor = settings.sor
        store = build_store(settings.store, payload_schema(plan))
        embedder = HashEmbedder()
        worker = build_worker(settings, CollectorRegistry(), store=store, embedder=embedder)
        worker.check()
        app = build_app(
            RetrieveSettings(
                grpc=GrpcSettings(port=0),
                auth=AuthSettings(tokens={"globex": hashlib.sha256(TOKEN.encode()).hexdigest()}),
                store=StoreSettings(data_dir=data_dir),
                sor=sor,
                plan=plan,
                publish_enabled=False,  # no audit or reindex topic in this test
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
            yield Stack(
                postgres.dsn,
                schema,
                worker,
                store,
                embedder,
                pb_grpc.RetrievalServiceStub(channel),
                kafka_broker,
                captured.dlq,
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


def test_a_snapshotted_pdf_is_indexed_page_by_page_and_retrieve_cites_the_page(
    stack: Stack,
) -> None:
    eventually(lambda: len(stack.payloads("documents:1")) >= 3, "the datasheet's chunks")
    pages = {p["locator"]["page"] for p in stack.payloads("documents:1")}
    assert pages == {1, 2, 3}
    pack = stack.ask("seal kit SK-9 replacement interval hours")
    assert pack.status == pb.RETRIEVAL_STATUS_SUCCESS, pack
    top = pack.results[0]
    assert top.entity_id == "documents:1"  # verified against the bytea's SHA-256: not stale
    assert list(top.locator.section_path) == ["gx300-datasheet.pdf", "p. 3"]
    assert top.locator.extracted_from == "pdf"


def test_a_docx_insert_is_indexed_with_its_heading_path(stack: Stack) -> None:
    stack.sql(
        "INSERT INTO documents (id, company_id, title, file_name, mime_type, body)"
        " VALUES (2, 'globex', 'Seal change', 'seal-change.docx', NULL, %s)",
        (PROCEDURE,),
    )
    eventually(lambda: len(stack.payloads("documents:2")) == 2, "the procedure's chunks")
    paths = sorted(tuple(p["locator"]["section_path"]) for p in stack.payloads("documents:2"))
    assert paths == [
        ("seal-change.docx", "Seal change"),
        ("seal-change.docx", "Seal change", "Lockout"),
    ]


def test_a_title_update_re_reads_the_toasted_file_and_embeds_nothing(stack: Stack) -> None:
    eventually(lambda: len(stack.payloads("documents:1")) >= 3, "the datasheet's chunks")
    texts = stack.embedder.texts
    stack.sql("UPDATE documents SET title = 'GX-300 datasheet rev B' WHERE id = 1")
    eventually(
        lambda: {p["title"] for p in stack.payloads("documents:1")} == {"GX-300 datasheet rev B"},
        "the new title on every chunk",
    )
    assert stack.embedder.texts == texts  # same file hash: payloads only


def test_an_encrypted_pdf_goes_to_the_dlq_and_the_next_row_is_indexed(stack: Stack) -> None:
    stack.sql(
        "INSERT INTO documents (id, company_id, title, file_name, mime_type, body) VALUES"
        " (3, 'globex', 'Locked', 'locked.pdf', 'application/pdf', %s),"
        " (4, 'globex', 'Spare seal', 'spare.pdf', 'application/pdf', %s)",
        (encrypted_pdf_bytes([["secret"]]), pdf_bytes([["Spare seal kit SK-10."]])),
    )
    eventually(lambda: len(stack.payloads("documents:4")) == 1, "the row after the bad one")
    letters = read_all(stack.broker.bootstrap_servers, stack.dlq)
    codes = [dict(m.headers())["ragstream.error.code"] for m in letters]
    assert codes == [b"PDF_ENCRYPTED"]
    assert stack.payloads("documents:3") == []
