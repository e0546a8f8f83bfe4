"""Blue-green reindex (issue 8) on real parts: a throwaway PostgreSQL
SoR, the tansu broker carrying Debezium-shaped change events, the ingest worker's consumer
loop, qdrant-edge and the Retrieve pipeline (in process, sharing the store as `ragstream dev`
does: qdrant-edge allows one opener per shard).

The embedders are `HashEmbedder` doubles (deterministic bag-of-hashed-words vectors; see
tests/streams/support.py): "model 1" has 64 dimensions and a 64-token budget, "model 2" 48
dimensions and a 48-token budget, so vectors, manifests and even chunk boundaries differ
between the versions and a mix-up cannot pass unnoticed.
"""

from __future__ import annotations

import hashlib
import random
import sqlite3
import threading
import time
import uuid
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import psycopg
import pytest
from confluent_kafka import Producer
from prometheus_client import CollectorRegistry
from psycopg.rows import dict_row
from pydantic import SecretStr

from ragcore.embedders.base import Vectors, l2_normalize
from ragcore.embedders.spec import EmbeddingSpec
from ragcore.errors import IndexNotFoundError, SorRowError
from ragcore.kafka_config import KafkaSettings
from ragcore.plan import PlanConfig
from ragcore.prepare import Preparer
from ragcore.settings import SorSettings, StoreSettings
from ragcore.sor.base import SystemOfRecord
from ragcore.sparse import Bm25Encoder
from ragcore.store.base import Placement, StoreFilter, VectorStore
from ragcore.store.edge import EdgeStore
from ragcore.store.ids import CATALOG_COLLECTION
from ragcore.store.qdrant_remote import CatalogEntries, QdrantRemoteStore, ServerPlacementCatalog
from ragcore.store.registry import QdrantIndexRegistry
from ragcore.store.tiered import TieredStore, pool_name
from ragcore.wiring import build_store, payload_schema
from ragdev.services.postgres import PostgresCluster
from ragdev.services.tansu import TansuBroker
from ragdev.sor.debezium_format import change_event, encode_key, encode_value
from ragstream.cli import _placements
from ragstream.parity import ParitySettings
from ragstream.reindex import (
    CalibrateFn,
    ReindexOptions,
    ReindexReport,
    calibrate_with,
    reindex,
    retriever_search,
)
from retrieval_api.metrics import RetrieveMetrics
from retrieval_api.pipeline_settings import RetrievalConfig
from retrieval_api.retriever import Retriever
from retrieval_api.validate import validate_request
from schemas.entities import Entity
from schemas.events import Op
from schemas.proto.ragstream.retrieval.v1 import retrieval_pb2 as pb
from streams.app import IngestWorker, build_worker
from streams.settings import IngestSettings
from tests.conftest import REPO_ROOT
from tests.streams.support import (
    HASH_SPEC,
    HashEmbedder,
    content,
    create_topics,
    eid,
    entities_plan,
    fast_consumer,
    index_snapshot,
    wait_committed,
)

pytestmark = pytest.mark.integration

TABLE_SQL = REPO_ROOT / "schemas" / "sql" / "entities.postgres.sql"
TENANT = "acme"
V1 = HASH_SPEC
V2 = EmbeddingSpec(
    name="hash-test", version="2", dimension=48, max_input_tokens=48, tokenizer=V1.tokenizer
)


class BrokenEmbedder(HashEmbedder):
    """A 'new model' that is useless: each text's vector is a pseudo-random direction seeded by
    the whole text, so nothing about its words survives (e.g. a wrong model file)."""

    def embed_documents(self, texts: Sequence[str]) -> Vectors:
        return self._noise(texts)

    def embed_query(self, text: str) -> Vectors:
        vector: Vectors = self._noise([text])[0]
        return vector

    def _noise(self, texts: Sequence[str]) -> Vectors:
        rows = []
        for text in texts:
            seed = int.from_bytes(hashlib.blake2b(text.encode(), digest_size=8).digest(), "little")
            rows.append(np.random.default_rng(seed).standard_normal(self.spec.dimension))
        return l2_normalize(np.asarray(rows, dtype=np.float32))


@dataclass
class Source:
    """The SoR table plus the change events Debezium would publish for each write."""

    dsn: str
    schema: str
    topic: str
    producer: Producer
    last: dict[int, int] = field(default_factory=dict)
    lsn: int = 10_000
    lock: threading.Lock = field(default_factory=threading.Lock)

    def sql(self, statement: str, params: tuple[Any, ...] = ()) -> list[dict[str, Any]]:
        with psycopg.connect(self.dsn, autocommit=True) as conn:
            conn.execute(f'SET search_path TO "{self.schema}"'.encode())
            cur = conn.cursor(row_factory=dict_row)
            cur.execute(statement.encode(), params)
            return list(cur.fetchall()) if cur.description else []

    def _emit(self, key: str, value: dict[str, Any] | None) -> None:
        def delivered(err: Any, msg: Any) -> None:
            assert err is None, err
            self.last[msg.partition()] = max(self.last.get(msg.partition(), -1), msg.offset())

        payload = encode_value(value) if value is not None else None
        self.producer.produce(
            self.topic, key=encode_key({"id": key}), value=payload, on_delivery=delivered
        )
        self.producer.poll(0)

    def put(self, entity_id: str, text: str) -> None:
        """Insert or update (and undelete) a row, then publish its c/u event."""
        with self.lock:
            before = self.sql("SELECT * FROM entities WHERE id = %s", (entity_id,))
            self.sql(
                "INSERT INTO entities (id, company_id, content, updated_at) "
                "VALUES (%s, %s, %s, clock_timestamp()) ON CONFLICT (id) DO UPDATE SET "
                "content = EXCLUDED.content, updated_at = EXCLUDED.updated_at, deleted_at = NULL",
                (entity_id, TENANT, text),
            )
            after = self.sql("SELECT * FROM entities WHERE id = %s", (entity_id,))[0]
            self.lsn += 8
            op = Op.UPDATE if before else Op.CREATE
            prior = before[0] if before else None
            self._emit(entity_id, change_event(op, before=prior, after=after, lsn=self.lsn))

    def delete(self, entity_id: str) -> None:
        """Hard delete: the d event and its tombstone."""
        with self.lock:
            before = self.sql("DELETE FROM entities WHERE id = %s RETURNING *", (entity_id,))
            if not before:
                return
            self.lsn += 8
            self._emit(
                entity_id, change_event(Op.DELETE, before=before[0], after=None, lsn=self.lsn)
            )
            self._emit(entity_id, None)

    def soft_delete(self, entity_id: str) -> None:
        """Set deleted_at (an update event)."""
        with self.lock:
            rows = self.sql(
                "UPDATE entities SET deleted_at = clock_timestamp(), updated_at = "
                "clock_timestamp() WHERE id = %s AND deleted_at IS NULL RETURNING *",
                (entity_id,),
            )
            if not rows:
                return
            self.lsn += 8
            self._emit(entity_id, change_event(Op.UPDATE, before=None, after=rows[0], lsn=self.lsn))

    def flush(self) -> dict[int, int]:
        """Wait for delivery; the last offset per partition."""
        assert self.producer.flush(30) == 0
        return dict(self.last)


@dataclass
class Stack:
    """One test's SoR, topic, worker (both models) and Retriever (both models)."""

    broker: TansuBroker
    source: Source
    group: str
    worker: IngestWorker
    store: VectorStore
    retriever: Retriever
    next_embedder: HashEmbedder

    @property
    def sor(self) -> SystemOfRecord:
        assert self.worker.sor is not None
        return self.worker.sor

    def settle(self) -> None:
        """Block until the worker committed every event produced so far."""
        last = self.source.flush()
        wait_committed(self.broker.bootstrap_servers, self.group, self.source.topic, last, 60)

    def ask(self, query: str, version: int | None = None) -> pb.EvidencePack:
        request = pb.RetrieveRequest(query_text=query, top_k=5)
        if version is not None:
            request.index_version = str(version)
        return self.retriever.retrieve(validate_request(request, self.retriever.config, TENANT))

    def run_reindex(self, **options: Any) -> ReindexReport:
        parity = options.pop("parity", ParitySettings(sample=60))
        sleep = options.pop("sleep", time.sleep)
        calibrate: CalibrateFn | None = options.pop("calibrate", None)
        return reindex(
            TENANT,
            embedder=self.next_embedder,
            preparer=Preparer(self.next_embedder.spec),
            handler=self.worker.handler,
            registry=self.worker.registry,
            store=self.store,
            sor=self.sor,
            sparse_encoder=Bm25Encoder().model_version,
            search=retriever_search(self.retriever, parity.top_k),
            options=ReindexOptions(parity=parity, **options),
            sleep=sleep,
            calibrate=calibrate,
        )


@pytest.fixture
def stack_factory(
    kafka_broker: TansuBroker, postgres: PostgresCluster, tmp_path: Path
) -> Iterator[Any]:
    made: list[tuple[Stack, threading.Thread]] = []
    schemas: list[str] = []

    def make(next_embedder: HashEmbedder, *, tiered: bool = False) -> Stack:
        """A stack on an engine store (dedicated collections), or with `tiered` on the store
        `ragstream` builds (new tenants shared)."""
        suffix = uuid.uuid4().hex[:8]
        schema, topic = f"rx_{suffix}", f"sor.public.entities.{suffix}"
        schemas.append(schema)
        with psycopg.connect(postgres.dsn, autocommit=True) as conn:
            conn.execute(f'CREATE SCHEMA "{schema}"'.encode())
            conn.execute(f'SET search_path TO "{schema}"'.encode())
            conn.execute(TABLE_SQL.read_text().encode())
        create_topics(kafka_broker.bootstrap_servers, topic, f"dlq.{suffix}", partitions=2)
        sor = SorSettings(kind="postgres", dsn=SecretStr(postgres.dsn))
        settings = IngestSettings(
            plan=entities_plan(f"{schema}.entities", topic),
            kafka=KafkaSettings(bootstrap_servers=kafka_broker.bootstrap_servers),
            consumer=fast_consumer(f"dlq.{suffix}", suffix, topic),
            store=StoreSettings(data_dir=tmp_path / suffix),
            embedding_cache=None,
            sor=sor,
        )
        store = (
            build_store(settings.store, payload_schema(settings.plan))
            if tiered
            else EdgeStore(settings.store.data_dir)
        )
        worker = build_worker(
            settings,
            CollectorRegistry(),
            store=store,
            embedder=HashEmbedder(V1),
            next_embedder=next_embedder,
        )
        assert worker.sor is not None
        retriever = Retriever(
            config=RetrievalConfig(),
            embedder=HashEmbedder(V1),
            other_embedders=[next_embedder],
            sparse=Bm25Encoder(),
            store=store,
            registry=worker.registry,
            sor=worker.sor,
            metrics=RetrieveMetrics(CollectorRegistry()),
        )
        worker.check()
        worker.loop.start()
        thread = threading.Thread(target=worker.loop.run, args=(worker.stop,), daemon=True)
        thread.start()
        producer = Producer({"bootstrap.servers": kafka_broker.bootstrap_servers, "linger.ms": 5})
        source = Source(postgres.dsn, schema, topic, producer)
        stack = Stack(kafka_broker, source, suffix, worker, store, retriever, next_embedder)
        made.append((stack, thread))
        return stack

    yield make
    for stack, thread in made:
        stack.worker.stop.set()
        thread.join(30)
        assert not thread.is_alive()
        stack.worker.close()
        stack.store.close()
    with psycopg.connect(postgres.dsn, autocommit=True) as conn:
        for schema in schemas:
            conn.execute(f'DROP SCHEMA "{schema}" CASCADE'.encode())


def expected_index(sor: SystemOfRecord, spec: EmbeddingSpec) -> dict[str, dict[str, str]]:
    """entity -> {chunk_id: content hash} the SoR calls for, chunked for `spec`."""
    preparer = Preparer(spec)
    out: dict[str, dict[str, str]] = {}
    for entity in sor.scan(TENANT):
        assert isinstance(entity, Entity), entity  # the test's SoR has no unreadable row
        chunks = preparer.chunks(entity)
        if chunks:
            out[entity.entity_id] = {c.chunk_id: entity.content_hash for c in chunks}
    return out


def load(stack: Stack, rng: random.Random, n: int) -> None:
    for i in range(n):
        stack.source.put(f"ent-{i:04d}", content(rng, rng.randint(2, 12)))
    stack.settle()


class Traffic:
    """SoR writes with their change events, and Retrieve calls, in background threads."""

    def __init__(self, stack: Stack, n_entities: int, seed: int) -> None:
        self.stack = stack
        self.rng = random.Random(seed)
        self.n = n_entities
        self.stop = threading.Event()
        self.writes = 0
        self.packs: list[tuple[int, str, int]] = []  # (index_version, model, results)
        self.errors: list[BaseException] = []
        self.threads = [
            threading.Thread(target=self._guard, args=(self._write,), daemon=True),
            threading.Thread(target=self._guard, args=(self._read,), daemon=True),
        ]

    def __enter__(self) -> Traffic:
        for thread in self.threads:
            thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop.set()
        for thread in self.threads:
            thread.join(30)

    def _guard(self, body: Any) -> None:
        try:
            while not self.stop.is_set():
                body()
        except BaseException as exc:  # noqa: BLE001 - re-raised by the test via .errors
            self.errors.append(exc)

    def _write(self) -> None:
        source, rng = self.stack.source, self.rng
        entity = f"ent-{rng.randrange(self.n + 20):04d}"  # some new ids too
        roll = rng.random()
        if roll < 0.7:
            source.put(entity, content(rng, rng.randint(1, 14)))
        elif roll < 0.85:
            source.delete(entity)
        else:
            source.soft_delete(entity)
        self.writes += 1
        time.sleep(0.02)

    def _read(self) -> None:
        pack = self.stack.ask("refund invoice shipment warranty")
        self.packs.append((pack.index_version, pack.embedding_model_version, len(pack.results)))
        time.sleep(0.01)


def test_model_change_under_live_traffic_ends_with_the_sor_in_the_new_model_only(
    stack_factory: Any,
) -> None:
    """Seed 000 test 5: reindex to a new embedder while changes stream in and Retrieve serves;
    after the switch the index equals the SoR exactly and every point carries the new model."""
    stack: Stack = stack_factory(HashEmbedder(V2))
    load(stack, random.Random(11), 120)
    assert stack.worker.registry.active_version(TENANT) == 1

    pinned_during_grace: list[pb.EvidencePack] = []

    def sleep(seconds: float) -> None:
        if seconds == 1.5:  # the grace period: the old version still answers pinned requests
            pinned_during_grace.append(stack.ask("refund invoice", version=1))
        time.sleep(seconds)

    with Traffic(stack, 120, seed=3) as traffic:
        # the gate is tested below; here the two hash "models" differ in dimension and
        # chunking, and the data moves under the gate, so it only has to be run, loosely
        gate = ParitySettings(sample=60, tolerance=0.15)
        report = stack.run_reindex(settle_s=2.5, grace_s=1.5, sleep=sleep, parity=gate)
        time.sleep(1.0)  # changes keep flowing after the switch, into the new version
    assert not traffic.errors, traffic.errors
    stack.settle()

    assert report.outcome == "switched", report.to_dict()
    assert (report.old_version, report.new_version, report.retired) == (1, 2, [1])
    assert report.parity is not None and report.parity["queries"] > 20
    assert traffic.writes > 50, "the reindex did not run under live traffic"
    registry = stack.worker.registry
    assert registry.active_version(TENANT) == 2
    assert registry.manifest(TENANT, 1).status == "retired"
    assert registry.manifest(TENANT, 2).embedding_model_version == V2.model_version

    # the index is the SoR, exactly, chunked for the new model
    assert index_snapshot(stack.store, registry, [TENANT])[TENANT] == expected_index(stack.sor, V2)
    points = list(
        stack.store.scroll("rag__acme__v2", StoreFilter(tenant_id=TENANT), with_vectors=True)
    )
    assert points and {p.payload["embedding_version"] for p in points} == {V2.model_version}
    assert {p.payload["index_version"] for p in points} == {2}
    assert {len(p.dense) for p in points if p.dense is not None} == {V2.dimension}

    # Retrieve saw one version or the other per request, each with its own model, and never
    # went back to the old version after the switch
    models = {1: V1.model_version, 2: V2.model_version}
    assert traffic.packs and all(models[v] == m for v, m, _ in traffic.packs)
    versions = [v for v, _, _ in traffic.packs]
    assert versions[0] == 1 and versions[-1] == 2
    assert versions == sorted(versions), "a request after the switch was served by v1"
    served = stack.ask("refund invoice shipment")
    assert (served.index_version, served.embedding_model_version) == (2, V2.model_version)

    # pinned to the old version: served during the grace period, refused once it is retired
    assert [p.index_version for p in pinned_during_grace] == [1]
    assert pinned_during_grace[0].embedding_model_version == V1.model_version
    with pytest.raises(IndexNotFoundError, match="retired"):
        stack.ask("refund invoice", version=1)


def test_a_failing_parity_gate_leaves_the_old_version_active(stack_factory: Any) -> None:
    stack: Stack = stack_factory(BrokenEmbedder(V2))
    load(stack, random.Random(12), 80)

    report = stack.run_reindex(settle_s=0, grace_s=0)

    assert report.outcome == "parity_failed", report.to_dict()
    assert report.parity is not None and report.parity["failures"]
    assert report.parity["new"]["mrr@10"] < report.parity["old"]["mrr@10"] - 0.02
    registry = stack.worker.registry
    assert registry.active_version(TENANT) == 1
    assert registry.manifest(TENANT, 2).status == "retired"
    assert stack.ask("refund invoice shipment").index_version == 1
    # the worker stopped writing the refused version once it was retired
    stack.source.put("ent-9999", "Pump valve calibration report for the new sensor.")
    stack.settle()
    only = StoreFilter(tenant_id=TENANT, entity_ids=(eid("ent-9999"),))
    assert stack.store.count("rag__acme__v1", only) >= 1
    assert stack.store.count("rag__acme__v2", only) == 0

    # the explicit override switches anyway, and says so
    forced = stack.run_reindex(settle_s=0, grace_s=0, force=True)
    assert forced.outcome == "switched" and forced.parity_overridden
    assert forced.new_version == 3 and registry.active_version(TENANT) == 3


def test_unreadable_sor_rows_are_reported_and_the_reindex_goes_on(stack_factory: Any) -> None:
    """A snapshot or catch-up scan meets rows that cannot be mapped: each is reported once
    and left out; the rest is built, caught up and switched to."""
    stack: Stack = stack_factory(HashEmbedder(V2))
    load(stack, random.Random(14), 40)
    # behind the stream's back: metadata that is not JSON, and JSON nested too deep
    stack.source.sql(
        "UPDATE entities SET metadata = to_jsonb(%s::text) WHERE id = 'ent-0003'",
        ('{"format": "text"',),
    )
    stack.source.sql(
        "UPDATE entities SET metadata = %s::jsonb WHERE id = 'ent-0017'",
        ("[" * 3000 + "]" * 3000,),
    )

    report = stack.run_reindex(
        settle_s=0, grace_s=0, parity=ParitySettings(sample=30, tolerance=0.5)
    )

    assert report.outcome == "switched", report.to_dict()
    assert report.unreadable_rows == [eid("ent-0003"), eid("ent-0017")]
    assert report.to_dict()["unreadable_rows_count"] == 2
    assert report.written == 38 and report.catchup[-1]["behind_sor"] == 0
    only = StoreFilter(tenant_id=TENANT, entity_ids=(eid("ent-0003"), eid("ent-0017")))
    assert stack.store.count(f"rag__acme__v{report.new_version}", only) == 0


def test_a_shared_tenant_outgrowing_the_threshold_is_promoted_by_reindex(
    stack_factory: Any,
) -> None:
    """Issue 16: a tenant starts as a partition of the shared pool; once it holds more points
    than the threshold, `ragstream index placement` says so and `ragstream reindex` (auto)
    builds its next version in its own collection, through the parity gate and the atomic
    switch; a demotion is asked for explicitly."""
    stack: Stack = stack_factory(HashEmbedder(V2), tiered=True)
    store = stack.store
    assert isinstance(store, TieredStore)
    load(stack, random.Random(21), 60)
    registry = stack.worker.registry
    assert registry.manifest(TENANT, 1).placement == "shared"
    assert store.placement_of("rag__acme__v1") == "shared"
    assert store.engine.list_collections() == [pool_name(V1.dimension)]
    points = store.count("rag__acme__v1", StoreFilter(tenant_id=TENANT))
    assert points > 10

    below = _placements(registry, store, threshold=points)
    assert below["due_for_promotion"] == [] and below["tenants_by_placement"]["shared"] == 1
    due = _placements(registry, store, threshold=10)
    assert due["due_for_promotion"] == [TENANT]

    gate = ParitySettings(sample=60, tolerance=0.15)  # two hash "models": run it, loosely
    report = stack.run_reindex(
        settle_s=2.5, grace_s=0, dedicated_above_points=10, drop_retired=True, parity=gate
    )
    assert report.outcome == "switched", report.to_dict()
    assert report.placement == "dedicated"
    assert report.placement_reason.startswith(f"promotion: v1 holds {points} points")
    assert report.parity is not None and report.parity["queries"] > 20
    assert registry.active_version(TENANT) == 2
    assert registry.manifest(TENANT, 2).placement == "dedicated"
    assert store.placement_of("rag__acme__v2") == "dedicated"
    assert not store.collection_exists("rag__acme__v1")  # retired and dropped: partition gone
    assert "rag__acme__v2" in store.engine.list_collections()
    assert index_snapshot(store, registry, [TENANT])[TENANT] == expected_index(stack.sor, V2)
    assert _placements(registry, store, threshold=10)["due_for_promotion"] == []
    # live changes now land in the dedicated collection
    stack.source.put("ent-9999", "Pump valve calibration report for the new sensor.")
    stack.settle()
    only = StoreFilter(tenant_id=TENANT, entity_ids=(eid("ent-9999"),))
    assert store.count("rag__acme__v2", only) >= 1
    assert stack.ask("pump valve calibration").index_version == 2

    # auto keeps a dedicated tenant dedicated; going back to the pool is asked for
    kept = stack.run_reindex(settle_s=0, grace_s=0, parity=gate, switch=False)
    assert (kept.placement, kept.outcome) == ("dedicated", "built"), kept.to_dict()
    registry.retire(TENANT, kept.new_version)
    demoted = stack.run_reindex(
        settle_s=2.5, grace_s=0, parity=gate, placement="shared", drop_retired=True
    )
    assert (demoted.placement, demoted.outcome) == ("shared", "switched"), demoted.to_dict()
    assert store.placement_of(f"rag__acme__v{demoted.new_version}") == "shared"
    assert index_snapshot(store, registry, [TENANT])[TENANT] == expected_index(stack.sor, V2)


def test_reindex_fits_the_new_version_calibration_before_the_parity_gate(
    stack_factory: Any,
) -> None:
    stack: Stack = stack_factory(HashEmbedder(V2))
    load(stack, random.Random(5), 40)
    fit = calibrate_with(stack.retriever, stack.next_embedder)
    calls: list[int] = []

    def calibrate(tenant: str, version: int, progress: Any) -> dict[str, Any]:
        assert stack.worker.registry.manifest(tenant, version).status == "building"
        calls.append(version)
        return fit(tenant, version, progress)

    report = stack.run_reindex(settle_s=0, grace_s=0, calibrate=calibrate)

    assert calls == [report.new_version]
    assert report.calibration is not None and report.calibration["fingerprint"]
    assert report.to_dict()["calibration"] == report.calibration
    registry = stack.worker.registry
    assert registry.load_calibration(TENANT, report.new_version) is not None
    assert registry.load_calibration(TENANT, 1) is None  # the old version keeps the prior
    assert report.parity is not None


class FlakySor:
    """The real SoR, except that the first snapshot scan dies part way (a crashed reindex)."""

    def __init__(self, inner: SystemOfRecord, fail_after: int) -> None:
        self.inner = inner
        self.fail_after = fail_after
        self.failed = False

    def __getattr__(self, name: str) -> Any:
        return getattr(self.inner, name)

    def scan(
        self, tenant_id: str, batch: int = 500, table: str | None = None
    ) -> Iterator[Entity | SorRowError]:
        for n, entity in enumerate(self.inner.scan(tenant_id, batch, table)):
            if not self.failed and n == self.fail_after:
                self.failed = True
                raise ConnectionError("SoR connection lost mid-snapshot")
            yield entity


def test_an_interrupted_reindex_resumes_its_version(stack_factory: Any) -> None:
    stack: Stack = stack_factory(HashEmbedder(V2))
    load(stack, random.Random(13), 60)
    flaky = FlakySor(stack.sor, fail_after=30)
    common: dict[str, Any] = {
        "embedder": stack.next_embedder,
        "preparer": Preparer(V2),
        "handler": stack.worker.handler,
        "registry": stack.worker.registry,
        "store": stack.store,
        "sparse_encoder": Bm25Encoder().model_version,
        "search": None,
    }
    with pytest.raises(ConnectionError):
        reindex(TENANT, sor=flaky, options=ReindexOptions(settle_s=0, grace_s=0), **common)
    assert stack.worker.registry.manifest(TENANT, 2).status == "building"
    assert stack.worker.registry.active_version(TENANT) == 1

    report = reindex(TENANT, sor=flaky, options=ReindexOptions(settle_s=0, grace_s=0), **common)
    assert report.resumed and report.new_version == 2 and report.outcome == "switched"
    assert [m.version for m in stack.worker.registry.list_versions(TENANT)] == [1, 2]
    assert index_snapshot(stack.store, stack.worker.registry, [TENANT])[TENANT] == expected_index(
        stack.sor, V2
    )


@pytest.mark.parametrize("placement", ["dedicated", "shared"])
def test_reindex_on_the_qdrant_server_registry_swaps_the_active_pointer(
    tmp_path: Path, placement: Placement
) -> None:
    """The same job against qdrant-client (local mode implements the server API). Dedicated:
    the active pointer is the alias `rag__acme`, manifests live in collection metadata.
    Shared (the store `ragstream` builds for a server): both versions are partitions of the
    pools, their manifests and the active pointer are entries of the catalog collection."""
    sor_path = tmp_path / "sor.sqlite"
    conn = sqlite3.connect(sor_path)
    rng = random.Random(21)
    with conn:
        conn.executescript((REPO_ROOT / "schemas" / "sql" / "entities.sqlite.sql").read_text())
        for n in range(30):
            conn.execute(
                "INSERT INTO entities (id, company_id, content, created_at, updated_at) "
                "VALUES (?, ?, ?, '2026-01-01T00:00:00Z', '2026-01-01T00:00:00Z')",
                (f"doc-{n:03d}", TENANT, content(rng, rng.randint(2, 8))),
            )
    conn.close()
    remote = QdrantRemoteStore.local(schema=payload_schema(PlanConfig()))
    store: VectorStore = remote
    if placement == "shared":
        store = TieredStore(
            remote, ServerPlacementCatalog(CatalogEntries(remote)), default_placement="shared"
        )
    settings = IngestSettings(
        kafka=KafkaSettings(bootstrap_servers="127.0.0.1:1"),  # never contacted
        sor=SorSettings(kind="sqlite", sqlite_path=sor_path),
        embedding_cache=None,
    )
    worker = build_worker(
        settings,
        CollectorRegistry(),
        store=store,
        embedder=HashEmbedder(V1),
        next_embedder=HashEmbedder(V2),
    )
    try:
        assert isinstance(worker.registry, QdrantIndexRegistry) and worker.sor is not None
        retriever = Retriever(
            config=RetrievalConfig(),
            embedder=HashEmbedder(V1),
            other_embedders=[HashEmbedder(V2)],
            sparse=Bm25Encoder(),
            store=store,
            registry=worker.registry,
            sor=worker.sor,
            metrics=RetrieveMetrics(CollectorRegistry()),
        )
        reports = []
        for model in worker.models:
            reports.append(
                reindex(
                    TENANT,
                    embedder=model,
                    preparer=Preparer(model.spec),
                    handler=worker.handler,
                    registry=worker.registry,
                    store=store,
                    sor=worker.sor,
                    sparse_encoder=Bm25Encoder().model_version,
                    search=retriever_search(retriever, 10),
                    options=ReindexOptions(
                        settle_s=0,
                        grace_s=0,
                        parity=ParitySettings(tolerance=0.15),
                        new_tenants=placement,
                    ),
                )
            )
        assert [(r.outcome, r.new_version) for r in reports] == [("switched", 1), ("switched", 2)]
        assert reports[1].parity is not None and reports[1].parity["queries"] == 30
        assert [r.placement for r in reports] == [placement, placement]
        if placement == "dedicated":
            assert remote.alias_target("rag__acme") == "rag__acme__v2"
        else:
            assert remote.alias_target("rag__acme") is None
            assert CatalogEntries(remote).get("active", TENANT) == 2
            assert remote.list_collections() == sorted(
                [CATALOG_COLLECTION, pool_name(V1.dimension), pool_name(V2.dimension)]
            )
        assert worker.registry.manifest(TENANT, 1).status == "retired"
        assert index_snapshot(store, worker.registry, [TENANT])[TENANT] == expected_index(
            worker.sor, V2
        )
        request = pb.RetrieveRequest(query_text="refund invoice", top_k=3)
        pack = retriever.retrieve(validate_request(request, retriever.config, TENANT))
        assert (pack.index_name, pack.embedding_model_version) == (
            "rag__acme__v2",
            V2.model_version,
        )
    finally:
        worker.close()
        store.close()
