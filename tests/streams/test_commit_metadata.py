"""The commit metadata through a real Kafka client and a broker that keeps it (librdkafka's mock
cluster; tansu 0.6 answers an empty string, see docs/decisions/tenant-fair-ingest.md): a record
that cannot be applied yet holds the committed offset while the records after it are applied;
their offsets travel in the commit's metadata, and the next member of the group skips them."""

from __future__ import annotations

import threading
import time
import uuid
from collections.abc import Sequence

import pytest
from confluent_kafka import Consumer, TopicPartition
from prometheus_client import CollectorRegistry

from ragcore.errors import StoreUnavailableError
from ragcore.kafka_config import KafkaSettings
from schemas.events import RawRecord
from streams.consumer import ConsumerLoop, DeadLetter, Routed
from streams.metrics import IngestMetrics
from streams.offsets import decode_done
from streams.readahead import Route
from tests.streams.support import MockKafka, Record, fast_consumer

pytestmark = pytest.mark.integration


class Held:
    """A `RecordHandler`: each record is its own key, its tenant the value's prefix (`bulk-3`:
    tenant `bulk`); a batch holding a record of a `held` tenant fails as an outage would (it is
    retried), the others are applied (their values noted, in order)."""

    def __init__(self, held: set[str]) -> None:
        self.held = held
        self.applied: list[bytes] = []
        self.lock = threading.Lock()

    def route(self, record: RawRecord) -> Routed[RawRecord]:
        value = record.value or b""
        tenant = value.decode().split("-")[0]
        return Routed(Route(tenant, key=value), lambda: record)

    def merge(self, earlier: RawRecord, later: RawRecord) -> None:
        return None

    def heavy(self, payload: RawRecord) -> bool:
        return False

    def apply(self, payloads: Sequence[RawRecord]) -> Sequence[DeadLetter]:
        with self.lock:
            if any((p.value or b"").decode().split("-")[0] in self.held for p in payloads):
                raise StoreUnavailableError("held (test)")
            self.applied += [p.value or b"" for p in payloads]
        return []


def loop_for(kafka: MockKafka, topic: str, dlq: str, group: str, handler: Held) -> ConsumerLoop:
    return ConsumerLoop(
        KafkaSettings(bootstrap_servers=kafka.bootstrap_servers),
        fast_consumer(
            dlq,
            group,
            topic,
            session_timeout_ms=6000,
            heartbeat_interval_ms=500,
            backoff_initial_s=0.05,
            backoff_max_s=0.1,
        ),
        handler,
        IngestMetrics(CollectorRegistry()),
    )


def committed(kafka: MockKafka, group: str, topic: str) -> tuple[int, str | None]:
    reader = Consumer({"bootstrap.servers": kafka.bootstrap_servers, "group.id": group})
    try:
        (tp,) = reader.committed([TopicPartition(topic, 0)], timeout=10)
        return tp.offset, tp.metadata
    finally:
        reader.close()


def run_until(loop: ConsumerLoop, done: object, timeout: float = 30.0) -> None:
    stop = threading.Event()
    thread = threading.Thread(target=loop.run, args=(stop,), daemon=True)
    thread.start()
    deadline = time.monotonic() + timeout
    try:
        while not done():  # type: ignore[operator]
            assert time.monotonic() < deadline, "timed out"
            time.sleep(0.05)
    finally:
        stop.set()
        thread.join(30)


def test_finished_offsets_above_a_held_one_travel_in_the_metadata_and_are_skipped(
    mock_kafka: MockKafka,
) -> None:
    suffix = uuid.uuid4().hex[:8]
    topic, dlq, group = f"meta.{suffix}", f"dlq.{suffix}", f"g-{suffix}"
    mock_kafka.create(dlq)
    # a tenant's backlog of twelve records that cannot be applied yet, then another tenant's
    # three: those are applied first (an express batch), out of offset order
    values = [f"bulk-{n}".encode() for n in range(12)] + [f"quiet-{n}".encode() for n in range(3)]
    mock_kafka.produce(topic, [Record(v, v) for v in values])
    first = Held(held={"bulk"})
    loop = loop_for(mock_kafka, topic, dlq, group, first)
    loop.start()
    run_until(loop, lambda: len(first.applied) == 3 and committed(mock_kafka, group, topic)[1])
    offset, metadata = committed(mock_kafka, group, topic)
    assert first.applied == [b"quiet-0", b"quiet-1", b"quiet-2"]
    assert offset == 0  # the held backlog holds the commit
    assert decode_done(offset, metadata) == [12, 13, 14]  # what was finished rides along
    second = Held(held=set())
    successor = loop_for(mock_kafka, topic, dlq, group, second)
    successor.start()
    run_until(successor, lambda: committed(mock_kafka, group, topic)[0] == 15)
    # the three named finished were skipped, not redone; the backlog was applied in order
    assert second.applied == values[:12]
