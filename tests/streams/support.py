"""Test support for the ingest worker suites: real broker and engine, a fast embedder.

The worker suites check Kafka and store semantics (nothing lost, nothing duplicated) over
thousands of events. The real local embedder runs at ~18 chunks/s here, so these suites use
`HashEmbedder`, a deterministic bag-of-hashed-tokens embedder (a test double for speed; one
suite runs the real ONNX embedder end to end). The subprocess crash test reaches the same
vectors through the product's OpenAI-compatible HTTP embedder and `EmbeddingStubServer`.
"""

from __future__ import annotations

import hashlib
import json
import logging
import random
import re
import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import Any

import numpy as np
from confluent_kafka import Consumer, Producer, TopicPartition
from confluent_kafka.admin import AdminClient
from confluent_kafka.cimpl import NewTopic

from ragcore.embedders.base import Vectors, l2_normalize
from ragcore.embedders.spec import EmbeddingSpec
from ragcore.mapping import TableMapping
from ragcore.plan import PlanConfig
from ragcore.prepare import Preparer
from ragcore.store.base import StoreFilter, VectorStore
from ragcore.store.registry import IndexRegistry
from ragdev.sor.debezium_format import change_event, encode_key, encode_value
from schemas.events import Op
from streams.consumer import ConsumerConfig
from tests.http_stub import Response, serve_json

DIM = 64
HASH_SPEC = EmbeddingSpec(
    name="hash-test",
    version="1",
    dimension=DIM,
    max_input_tokens=64,
    tokenizer="tiktoken:cl100k_base",
)
_WORD = re.compile(r"\w+")


def hash_vectors(texts: Sequence[str], dim: int = DIM) -> Vectors:
    """Deterministic unit vectors: hashed word counts (texts sharing words are similar)."""
    out = np.zeros((len(texts), dim), dtype=np.float32)
    for row, text in enumerate(texts):
        for word in _WORD.findall(text.lower()) or ["<empty>"]:
            digest = hashlib.blake2b(word.encode(), digest_size=4).digest()
            out[row, int.from_bytes(digest, "little") % dim] += 1.0
    return l2_normalize(out)


class HashEmbedder:
    """`Embedder` test double (see module docstring). Counts calls and texts."""

    def __init__(self, spec: EmbeddingSpec = HASH_SPEC) -> None:
        self._spec = spec
        self.calls = 0
        self.texts = 0
        self.fail_with: Exception | None = None

    @property
    def spec(self) -> EmbeddingSpec:
        return self._spec

    def embed_documents(self, texts: Sequence[str]) -> Vectors:
        if self.fail_with is not None:
            raise self.fail_with
        self.calls += 1
        self.texts += len(texts)
        return hash_vectors(texts, self._spec.dimension)

    def embed_query(self, text: str) -> Vectors:
        vector: Vectors = hash_vectors([text], self._spec.dimension)[0]
        return vector

    def check(self) -> None:
        return None

    def close(self) -> None:
        return None


def _embeddings(path: str, headers: dict[str, str], body: Any) -> Response:
    texts = body["input"] if isinstance(body["input"], list) else [body["input"]]
    payload = {
        "object": "list",
        "model": body.get("model", "hash-test"),
        "data": [
            {"object": "embedding", "index": i, "embedding": v.tolist()}
            for i, v in enumerate(hash_vectors(texts))
        ],
        "usage": {"prompt_tokens": 0, "total_tokens": 0},
    }
    return 200, json.dumps(payload).encode(), {}


class EmbeddingStubServer:
    """An OpenAI-compatible `/v1/embeddings` endpoint on loopback serving `hash_vectors`."""

    def __init__(self) -> None:
        self._serving = serve_json(_embeddings)
        self.base_url = ""

    def __enter__(self) -> EmbeddingStubServer:
        self.base_url = f"{self._serving.__enter__()}/v1"
        return self

    def __exit__(self, *exc: object) -> None:
        self._serving.__exit__(None, None, None)


# --- Kafka --------------------------------------------------------------------------------------


def create_topics(bootstrap: str, *names: str, partitions: int = 4) -> None:
    """Create topics explicitly (tansu would auto-create them with 4 partitions)."""
    admin = AdminClient({"bootstrap.servers": bootstrap})
    futures = admin.create_topics(
        [NewTopic(n, num_partitions=partitions, replication_factor=1) for n in names]
    )
    for future in futures.values():
        future.result(15)


@dataclass(frozen=True)
class Record:
    """One record to produce."""

    key: bytes | None
    value: bytes | None
    headers: tuple[tuple[str, bytes], ...] = ()


def produce(bootstrap: str, topic: str, records: Sequence[Record]) -> dict[int, int]:
    """Produce in order (idempotent producer); returns the last offset per partition."""
    producer = Producer(
        {
            "bootstrap.servers": bootstrap,
            "enable.idempotence": True,
            "linger.ms": 5,
            "message.max.bytes": 8_000_000,  # the poison suite sends a 5 MB record
        }
    )
    last: dict[int, int] = {}
    errors: list[str] = []

    def delivered(err: Any, msg: Any) -> None:
        if err is not None:
            errors.append(str(err))
        else:
            last[msg.partition()] = max(last.get(msg.partition(), -1), msg.offset())

    for rec in records:
        producer.produce(
            topic, key=rec.key, value=rec.value, headers=list(rec.headers), on_delivery=delivered
        )
        producer.poll(0)
    assert producer.flush(30) == 0
    assert not errors, errors
    return last


class MockKafka:
    """librdkafka's mock cluster (`test.mock.num.brokers`) of one broker: a Kafka-protocol
    broker inside the test process that real clients reach over loopback TCP, and the only
    broker here with retention (by size: it keeps 5 MiB per partition and deletes the oldest
    record batches beyond that). No CreateTopics: topics are auto-created with 4 partitions
    when first written. Held by a producer that also writes to it (each record in its own
    batch, so retention deletes record by record); it lives as long as that producer."""

    def __init__(self) -> None:
        self.producer = Producer({"test.mock.num.brokers": 1, "linger.ms": 0})
        brokers = self.producer.list_topics(timeout=10).brokers.values()
        self.bootstrap_servers = ",".join(f"{b.host}:{b.port}" for b in brokers)

    def create(self, *topics: str) -> None:
        """Create topics (4 partitions) by asking for their metadata."""
        for topic in topics:
            assert topic in self.producer.list_topics(topic, timeout=10).topics

    def produce(self, topic: str, records: Sequence[bytes | Record], partition: int = 0) -> None:
        """Write `records` (values or keyed records) to one partition, each in its own batch."""
        for item in records:
            rec = Record(b"k", item) if isinstance(item, bytes) else item
            self.producer.produce(
                topic, key=rec.key, value=rec.value, headers=list(rec.headers), partition=partition
            )
            assert self.producer.flush(10) == 0

    def expire(
        self, topic: str, past: int, filler: bytes | Record = b"f" * 200_000
    ) -> tuple[int, int]:
        """Write `filler` records to partition 0 until retention deleted every offset up to
        `past`; returns the watermarks."""
        while True:
            self.produce(topic, [filler] * 5)
            low, high = self.watermarks(topic)
            if low > past:
                return low, high

    def watermarks(self, topic: str, partition: int = 0) -> tuple[int, int]:
        """The partition's low and high watermark."""
        reader = Consumer({"bootstrap.servers": self.bootstrap_servers, "group.id": "wm"})
        try:
            marks = reader.get_watermark_offsets(
                TopicPartition(topic, partition), timeout=10, cached=False
            )
            assert marks is not None
            return marks
        finally:
            reader.close()

    def commit(self, group: str, topic: str, offset: int) -> None:
        """Commit `offset` of partition 0 for `group` (no member running)."""
        mover = Consumer({"bootstrap.servers": self.bootstrap_servers, "group.id": group})
        try:
            mover.commit(offsets=[TopicPartition(topic, 0, offset)], asynchronous=False)
        finally:
            mover.close()


def gap_logged(records: Sequence[logging.LogRecord], topic: str, position: int, low: int) -> bool:
    """Whether an ERROR names the offsets of `topic`[0] lost below the running worker's fetch
    position `position`."""
    errors = [r.getMessage() for r in records if r.levelno == logging.ERROR]
    lost = (
        f"{topic}[0]: fetch position {position} < low watermark {low}, offsets "
        f"{position}..{low - 1} ({low - position}) lost"
    )
    return any(lost in m for m in errors)


def assert_fetch_gap_logged(
    records: Sequence[logging.LogRecord], topic: str, position: int, low: int
) -> None:
    """An ERROR names the offsets of `topic`[0] lost below the running worker's fetch position."""
    errors = [r.getMessage() for r in records if r.levelno == logging.ERROR]
    assert gap_logged(records, topic, position, low), errors


def committed(bootstrap: str, group: str, topic: str, partitions: Sequence[int]) -> dict[int, int]:
    """The group's committed offsets (-1001 when none)."""
    consumer = Consumer({"bootstrap.servers": bootstrap, "group.id": group})
    try:
        tps = consumer.committed([TopicPartition(topic, p) for p in partitions], timeout=10)
        return {tp.partition: tp.offset for tp in tps}
    finally:
        consumer.close()


def wait_committed(
    bootstrap: str, group: str, topic: str, last: dict[int, int], timeout: float
) -> None:
    """Block until the group committed past every produced record."""
    deadline = time.monotonic() + timeout
    got: dict[int, int] = {}
    while time.monotonic() < deadline:
        got = committed(bootstrap, group, topic, list(last))
        if all(got.get(p, -1) >= off + 1 for p, off in last.items()):
            return
        time.sleep(0.3)
    raise AssertionError(f"group {group} did not commit {last}: committed {got}")


def read_all(bootstrap: str, topic: str | Sequence[str], timeout: float = 10.0) -> list[Any]:
    """Every record of a topic, or of several read at once (one idle wait for all of them),
    for DLQ assertions. Ends 2 s after the last record (the test broker's high watermark
    cannot be trusted), or at `timeout`."""
    consumer = Consumer(
        {
            "bootstrap.servers": bootstrap,
            "group.id": f"reader-{random.random()}",
            "auto.offset.reset": "earliest",
            "enable.auto.commit": False,
            "session.timeout.ms": 2000,
            "heartbeat.interval.ms": 300,
        }
    )
    out: list[Any] = []
    try:
        consumer.subscribe([topic] if isinstance(topic, str) else list(topic))
        deadline = time.monotonic() + timeout
        idle_since = time.monotonic()
        while time.monotonic() < deadline:
            msg = consumer.poll(0.2)
            if msg is None:
                if out and time.monotonic() - idle_since > 2.0:
                    break
                continue
            if msg.error() is None:
                out.append(msg)
                idle_since = time.monotonic()
    finally:
        consumer.close()
    return out


# --- a system of record and its change stream ---------------------------------------------------

WORDS = (
    "refund",
    "invoice",
    "shipment",
    "pump",
    "valve",
    "warranty",
    "outage",
    "latency",
    "cluster",
    "token",
    "policy",
    "customer",
    "ticket",
    "escalation",
    "firmware",
    "sensor",
    "calibration",
    "pressure",
    "report",
    "audit",
    "backup",
    "restore",
    "rotation",
    "certificate",
    "billing",
    "discount",
    "contract",
    "renewal",
    "onboarding",
    "checklist",
    "",
)


def sentence(rng: random.Random) -> str:
    """A short random sentence."""
    words = [rng.choice(WORDS) for _ in range(rng.randint(5, 14))]
    return " ".join(words).capitalize() + "."


def content(rng: random.Random, sentences: int) -> str:
    """A document of `sentences` sentences in paragraphs of 3."""
    parts = [sentence(rng) for _ in range(sentences)]
    return "\n\n".join(" ".join(parts[i : i + 3]) for i in range(0, len(parts), 3))


class SorModel:
    """An in-memory SoR table whose writes yield Debezium change records (with history)."""

    def __init__(self, seed: int = 7) -> None:
        self.rng = random.Random(seed)
        self.rows: dict[str, dict[str, Any]] = {}
        self.lsn = 1000
        self.clock = datetime(2026, 1, 1, tzinfo=UTC)

    def _tick(self) -> datetime:
        self.lsn += 8
        self.clock += timedelta(seconds=1)
        return self.clock

    def _record(
        self, op: Op, before: dict[str, Any] | None, after: dict[str, Any] | None, key: str
    ) -> Record:
        value = change_event(
            op, before=before, after=after, lsn=self.lsn, ts_ms=int(time.time() * 1000)
        )
        return Record(encode_key({"id": key}), encode_value(value))

    def put(self, entity_id: str, tenant: str, text: str, **extra: Any) -> Record:
        """Insert or update a row (soft-delete by passing deleted_at)."""
        now = self._tick()
        before = self.rows.get(entity_id)
        row = {
            "id": entity_id,
            "company_id": tenant,
            "entity_type": "KNOWLEDGE_ARTIFACT",
            "name": f"Doc {entity_id}",
            "content": text,
            "metadata": {"format": "text"},
            "content_hash": None,
            "created_at": before["created_at"] if before else now,
            "updated_at": now,
            "deleted_at": None,
            **extra,
        }
        self.rows[entity_id] = row
        return self._record(Op.UPDATE if before else Op.CREATE, before, row, entity_id)

    def delete(self, entity_id: str) -> list[Record]:
        """Hard delete: the d event and its tombstone."""
        self._tick()
        before = self.rows.pop(entity_id)
        key = encode_key({"id": entity_id})
        return [self._record(Op.DELETE, before, None, entity_id), Record(key, None)]

    def soft_delete(self, entity_id: str) -> Record:
        """Set deleted_at."""
        row = self.rows[entity_id]
        return self.put(entity_id, row["company_id"], row["content"], deleted_at=self._tick())

    def random_stream(self, n_events: int, tenants: Sequence[str], n_entities: int) -> list[Record]:
        """A mix of creates, updates (growing and shrinking), deletes and soft deletes."""
        records: list[Record] = []
        ids = [f"ent-{i:05d}" for i in range(n_entities)]
        tenant_of = {i: tenants[n % len(tenants)] for n, i in enumerate(ids)}
        while len(records) < n_events:
            entity = self.rng.choice(ids)
            live = entity in self.rows and self.rows[entity]["deleted_at"] is None
            roll = self.rng.random()
            if not live or roll < 0.7:
                text = content(self.rng, self.rng.randint(1, 18))
                records.append(self.put(entity, tenant_of[entity], text))
            elif roll < 0.85:
                records.extend(self.delete(entity))
            else:
                records.append(self.soft_delete(entity))
        return records

    def expected_index(self, preparer: Preparer) -> dict[str, dict[str, dict[str, str]]]:
        """tenant -> entity -> {chunk_id: source_hash} for every live row."""
        out: dict[str, dict[str, dict[str, str]]] = {}
        for row in self.rows.values():
            if row["deleted_at"] is not None:
                continue
            from schemas.entities import ContentFormat, Entity

            digest = preparer.content_hash(row["content"], ContentFormat.TEXT)
            entity = Entity(
                tenant_id=row["company_id"],
                entity_id=eid(row["id"]),
                entity_type="KNOWLEDGE_ARTIFACT",
                content=row["content"],
                content_hash=digest,
            )
            chunks = preparer.chunks(entity)
            if chunks:
                out.setdefault(row["company_id"], {})[entity.entity_id] = {
                    c.chunk_id: digest for c in chunks
                }
        return out


def index_snapshot(
    store: VectorStore, registry: IndexRegistry, tenants: Sequence[str]
) -> dict[str, dict[str, dict[str, str]]]:
    """tenant -> entity -> {chunk_id: source_hash} as the active index holds it."""
    out: dict[str, dict[str, dict[str, str]]] = {}
    for tenant in tenants:
        version = registry.active_version(tenant)
        if version is None:
            continue
        name = registry.manifest(tenant, version).index_name
        for point in store.scroll(name, StoreFilter(tenant_id=tenant)):
            p = point.payload
            chunks = out.setdefault(tenant, {}).setdefault(p["source_entity_id"], {})
            assert p["chunk_id"] not in chunks, f"duplicate point for {p['chunk_id']}"
            chunks[p["chunk_id"]] = p["source_hash"]
    return out


def iter_chunks(snapshot: dict[str, dict[str, dict[str, str]]]) -> Iterator[str]:
    """Every chunk id in a snapshot."""
    for entities in snapshot.values():
        for chunks in entities.values():
            yield from chunks


def entities_plan(table: str, topic: str | None = None) -> PlanConfig:
    """The default `entities` mapping for a copy of the table elsewhere (a schema or a table
    name per test): entity ids stay `entities:<id>`; `topic` when the test's topic differs
    from Debezium's naming."""
    return PlanConfig(tables=(TableMapping(table=table, name="entities", topic=topic),))


def eid(key: str) -> str:
    """The entity id of a row of the `entities` table."""
    return f"entities:{key}"


# --- the many-tables fixture: entities, order_lines (composite key), products (JSON specs) -----


def order_lines_mapping(schema: str = "public", *, name: str | None = None) -> TableMapping:
    """`order_lines`: a composite key (order_id, line_no), the tenant in `org`, no timestamps."""
    return TableMapping(
        table=f"{schema}.order_lines",
        name=name,
        key_columns=("order_id", "line_no"),
        tenant_column="org",
        type_column=None,
        title_column="product",
        content_columns=("product", "note"),
        metadata_column=None,
        content_hash_column=None,
        created_at_column=None,
        updated_at_column=None,
        deleted_at_column=None,
    )


def three_tables(schema: str, *, named: bool = False) -> tuple[TableMapping, ...]:
    """entities, order_lines and products (JSON `specs`, soft delete) in `schema`; `named`
    gives each its table name as the label (the tables of two schemas then share labels)."""
    return (
        TableMapping(table=f"{schema}.entities", name="entities" if named else None),
        order_lines_mapping(schema, name="order_lines" if named else None),
        TableMapping(
            table=f"{schema}.products",
            name="products" if named else None,
            key_columns=("sku",),
            tenant_column="vendor",
            type_column=None,
            default_entity_type="PRODUCT",
            title_column="title",
            content_columns=("title", "specs"),
            json_columns=("specs",),
            metadata_column=None,
            content_hash_column=None,
            created_at_column=None,
            updated_at_column="updated_at",
            deleted_at_column="deleted_at",
        ),
    )


# --- worker settings the tests share ---------------------------------------------------------


def fast_consumer(dlq: str, group: str, *topics: str, **overrides: Any) -> ConsumerConfig:
    """Consumer settings for tests: a short session and short polls, so rebalances, restarts
    and shutdowns take tenths of seconds (no topics: the mapped tables' topics)."""
    settings: dict[str, Any] = {
        "dlq_topic": dlq,
        "group_id": group,
        "session_timeout_ms": 2000,
        "heartbeat_interval_ms": 300,
        "poll_timeout_s": 0.2,
        **overrides,
    }
    if topics:
        settings["topics"] = topics
    return ConsumerConfig(**settings)


def stub_embedder(base_url: str, **overrides: Any) -> dict[str, Any]:
    """Settings of the OpenAI-compatible embedder for `HASH_SPEC` served by
    `EmbeddingStubServer` at `base_url` (as JSON-ready values)."""
    return {
        "kind": "openai",
        "base_url": base_url,
        "model": HASH_SPEC.name,
        "version": HASH_SPEC.version,
        "dimension": HASH_SPEC.dimension,
        "max_input_tokens": HASH_SPEC.max_input_tokens,
        "tokenizer": HASH_SPEC.tokenizer,
        **overrides,
    }
