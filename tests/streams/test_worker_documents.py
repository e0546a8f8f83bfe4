"""Documents through the worker: PDF and DOCX rows of a `bytea` column arrive as Debezium
change events (base64), are indexed with page and heading locators, and the bad files of the
same batch go to the DLQ under their reasons without holding anything back."""

from __future__ import annotations

import base64
import os
import threading
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest
from prometheus_client import CollectorRegistry

from ragcore.kafka_config import KafkaSettings
from ragcore.mapping import TableMapping
from ragcore.plan import PlanConfig
from ragcore.prepare import Preparer
from ragcore.settings import StoreSettings
from ragcore.store.base import StoreFilter
from ragcore.store.edge import EdgeStore
from ragdev.docgen import docx_bytes, encrypted_pdf_bytes, pdf_bytes
from ragdev.sample_documents import DOCUMENTS_TABLE
from ragdev.services.tansu import TansuBroker
from ragdev.sor.debezium_format import change_event, encode_key, encode_value
from schemas.entities import ContentFormat
from schemas.events import Op
from streams.app import IngestWorker, build_worker
from streams.settings import IngestSettings
from tests.streams.support import (
    HASH_SPEC,
    HashEmbedder,
    Record,
    create_topics,
    fast_consumer,
    produce,
    read_all,
    wait_committed,
)

pytestmark = [pytest.mark.integration, pytest.mark.slow]

TENANT = "globex"
DATASHEET = pdf_bytes(
    [
        ["P-100 centrifugal pump datasheet", "Flow up to 40 m3/h at 32 m head."],
        ["Materials: cast iron casing, stainless steel impeller."],
        ["Seal kit SK-9 fits every P-100 built after 2021."],
    ]
)


def documents_table(topic: str) -> TableMapping:
    """The sample corpus's documents table on this test's topic."""
    return DOCUMENTS_TABLE.model_copy(update={"topic": topic})


@pytest.fixture
def running(
    kafka_broker: TansuBroker, tmp_path: Path
) -> Iterator[tuple[IngestWorker, str, str, str, CollectorRegistry]]:
    suffix = uuid.uuid4().hex[:8]
    topic, dlq, group = f"sor.public.documents.{suffix}", f"ragstream.dlq.{suffix}", suffix
    create_topics(kafka_broker.bootstrap_servers, topic, dlq, partitions=1)
    settings = IngestSettings(
        kafka=KafkaSettings(bootstrap_servers=kafka_broker.bootstrap_servers),
        consumer=fast_consumer(dlq, group, topic),
        store=StoreSettings(data_dir=tmp_path / "store"),
        embedding_cache=None,
        plan=PlanConfig(tables=(documents_table(topic),)),
    )
    registry = CollectorRegistry()
    store = EdgeStore(settings.store.data_dir)
    worker = build_worker(settings, registry, store=store, embedder=HashEmbedder())
    worker.check()
    worker.loop.start()
    thread = threading.Thread(target=worker.loop.run, args=(worker.stop,), daemon=True)
    thread.start()
    try:
        yield worker, topic, dlq, group, registry
    finally:
        worker.stop.set()
        thread.join(30)
        worker.close()


def row(key: int, file_name: str, body: bytes) -> Record:
    after = {
        "id": key,
        "company_id": TENANT,
        "title": file_name,
        "file_name": file_name,
        "body": body,
        # every column the mapping reads is in a real event (a missing one is schema drift)
        "mime_type": None,
        "created_at": None,
        "updated_at": None,
        "deleted_at": None,
    }
    value = change_event(Op.CREATE, before=None, after=after, table="documents", lsn=100 + key)
    return Record(encode_key({"id": key}), encode_value(value))


def test_documents_are_indexed_with_locators_and_bad_files_go_to_the_dlq(
    running: tuple[IngestWorker, str, str, str, CollectorRegistry], kafka_broker: TansuBroker
) -> None:
    worker, topic, dlq, group, registry = running
    procedure = docx_bytes(
        [("h1", "Seal change"), ("p", "Drain the pump."), ("h2", "Lockout"), ("p", "Open Q1.")]
    )
    records = [
        row(1, "p100-datasheet.pdf", DATASHEET),
        row(2, "locked.pdf", encrypted_pdf_bytes([["secret"]])),
        row(3, "scan.pdf", pdf_bytes([[], []])),
        row(4, "broken.pdf", DATASHEET[: len(DATASHEET) // 3]),
        row(5, "seal-change.docx", procedure),
    ]
    last = produce(kafka_broker.bootstrap_servers, topic, records)
    wait_committed(kafka_broker.bootstrap_servers, group, topic, last, timeout=120)

    letters = read_all(kafka_broker.bootstrap_servers, dlq)
    codes = {
        dict(m.headers())["ragstream.source.offset"].decode(): dict(m.headers())[
            "ragstream.error.code"
        ].decode()
        for m in letters
    }
    assert codes == {"1": "PDF_ENCRYPTED", "2": "NO_TEXT_LAYER", "3": "DOCUMENT_CORRUPT"}
    for code in ("PDF_ENCRYPTED", "NO_TEXT_LAYER", "DOCUMENT_CORRUPT"):
        assert registry.get_sample_value("ragstream_ingest_dlq_records_total", {"code": code}) == 1

    version = worker.registry.active_version(TENANT)
    assert version is not None
    name = worker.registry.manifest(TENANT, version).index_name
    points = list(worker.store.scroll(name, StoreFilter(tenant_id=TENANT)))
    located = sorted(
        (p.payload["source_entity_id"], tuple(p.payload["locator"]["section_path"])) for p in points
    )
    assert located == [
        ("documents:1", ("p100-datasheet.pdf", "p. 1")),
        ("documents:1", ("p100-datasheet.pdf", "p. 2")),
        ("documents:1", ("p100-datasheet.pdf", "p. 3")),
        ("documents:5", ("seal-change.docx", "Seal change")),
        ("documents:5", ("seal-change.docx", "Seal change", "Lockout")),
    ]
    page3 = next(p for p in points if p.payload["locator"].get("page") == 3)
    assert "SK-9" in page3.payload["text"]
    assert page3.payload["locator"]["document"] == "p100-datasheet.pdf"


def _extraction_children() -> set[int]:
    """Pids of this process's document-extraction children (`ragcore.documents.child`)."""
    found = set()
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            parent = int((entry / "stat").read_text().rpartition(")")[2].split()[1])
            cmdline = (entry / "cmdline").read_bytes()
        except OSError:
            continue  # exited meanwhile
        if parent == os.getpid() and b"ragcore.documents.child" in cmdline:
            found.add(int(entry.name))
    return found


def test_closing_the_worker_stops_the_extraction_child_of_a_further_models_preparer(
    tmp_path: Path,
) -> None:
    """During a reindex to another embedder, documents are also extracted for that model by
    its own preparer; closing the worker stops that child too (no broker is needed: the
    worker is built, not run)."""
    topic = "sor.public.documents.close"
    settings = IngestSettings(
        kafka=KafkaSettings(bootstrap_servers="127.0.0.1:9"),
        consumer=fast_consumer("ragstream.dlq.close", "close", topic),
        store=StoreSettings(data_dir=tmp_path / "store"),
        embedding_cache=None,
        plan=PlanConfig(tables=(documents_table(topic),)),
    )
    other = HashEmbedder(HASH_SPEC.model_copy(update={"name": "hash-next"}))
    worker = build_worker(
        settings,
        CollectorRegistry(),
        store=EdgeStore(settings.store.data_dir),
        embedder=HashEmbedder(),
        next_embedder=other,
    )
    before = _extraction_children()
    try:
        _, preparer = worker.handler.models[other.spec.model_version]
        assert isinstance(preparer, Preparer)
        text = preparer.normalized(base64.b64encode(DATASHEET).decode(), ContentFormat.PDF).text
        assert "Seal kit SK-9" in text
        started = _extraction_children() - before
        assert len(started) == 1
    finally:
        worker.close()
    assert not started & _extraction_children()
