"""The consumer loop's batches while behind (`catch_up_wait_ms`), against the real tansu
broker: a worker that is behind keeps fetching up to the wait and hands one larger batch to
the handler in offset order, committed after it; a record that is not behind is never held."""

from __future__ import annotations

import threading
import time
import uuid
from collections.abc import Sequence

import pytest
from confluent_kafka import Producer
from prometheus_client import CollectorRegistry

from ragcore.kafka_config import KafkaSettings
from ragdev.services.tansu import TansuBroker
from schemas.events import RawRecord
from streams.consumer import ConsumerLoop, DeadLetter
from streams.metrics import IngestMetrics
from tests.streams.support import committed, create_topics, fast_consumer

pytestmark = pytest.mark.integration


class Batches:
    """A handler that records each batch it was given (offsets) and when."""

    def __init__(self) -> None:
        self.batches: list[tuple[float, list[int]]] = []

    def handle(self, records: Sequence[RawRecord]) -> Sequence[DeadLetter]:
        self.batches.append((time.monotonic(), [r.offset for r in records]))
        return []


def _loop(
    broker: TansuBroker, wait_ms: int
) -> tuple[ConsumerLoop, Batches, IngestMetrics, str, str]:
    topic, dlq, group = (f"{n}.{uuid.uuid4().hex[:8]}" for n in ("catchup", "dlq", "g"))
    create_topics(broker.bootstrap_servers, topic, dlq, partitions=1)
    config = fast_consumer(
        dlq, group, topic, catch_up_wait_ms=wait_ms, behind_ms=500, max_batch_records=100
    )
    handler = Batches()
    metrics = IngestMetrics(CollectorRegistry())
    loop = ConsumerLoop(
        KafkaSettings(bootstrap_servers=broker.bootstrap_servers), config, handler, metrics
    )
    loop.start()
    deadline = time.monotonic() + 30
    while not metrics.registry.get_sample_value(
        "ragstream_ingest_assigned_partitions"
    ):  # the group join (tansu: ~1 s)
        assert time.monotonic() < deadline, "never assigned"
        assert loop.run_once() == 0
    return loop, handler, metrics, topic, group


def _produce(broker: TansuBroker, topic: str, n: int, every_s: float, age_s: float) -> None:
    """`n` records, one per `every_s`, stamped `age_s` in the past (a backlog's age)."""
    producer = Producer({"bootstrap.servers": broker.bootstrap_servers, "linger.ms": 0})
    for i in range(n):
        stamp = int((time.time() - age_s) * 1000)
        producer.produce(topic, key=b"k", value=f"{i}".encode(), timestamp=stamp)
        producer.flush(10)
        time.sleep(every_s)


def _first_batch(
    broker: TansuBroker, wait_ms: int, age_s: float
) -> tuple[list[int], float, IngestMetrics, str, str]:
    """One record stamped `age_s` ago, then ten fresh ones 0.1 s apart; the loop's first
    batch (offsets) and its delay after the first record was produced."""
    loop, handler, metrics, topic, group = _loop(broker, wait_ms)
    try:
        _produce(broker, topic, 1, 0, age_s)
        produced = time.monotonic()
        later = threading.Thread(target=_produce, args=(broker, topic, 10, 0.1, 0.0))
        later.start()
        while not handler.batches:
            assert time.monotonic() < produced + 30, "nothing consumed"
            loop.run_once()
        later.join(30)
        seen, offsets = handler.batches[0]
        return offsets, seen - produced, metrics, topic, group
    finally:
        loop.close()


def _catch_ups(metrics: IngestMetrics) -> float | None:
    return metrics.registry.get_sample_value("ragstream_ingest_catch_up_batches_total")


def test_a_worker_behind_fetches_one_larger_batch_in_offset_order_then_commits(
    kafka_broker: TansuBroker,
) -> None:
    offsets, delay, metrics, topic, group = _first_batch(kafka_broker, 800, age_s=5.0)
    # the old record's batch waited (up to 0.8 s) for the fresh ones behind it
    assert len(offsets) >= 5
    assert offsets == list(range(offsets[0], offsets[0] + len(offsets)))  # offset order, no gap
    assert 0.4 <= delay <= 3.0
    assert _catch_ups(metrics) == 1
    got = committed(kafka_broker.bootstrap_servers, group, topic, [0])
    assert got[0] >= offsets[-1] + 1  # committed after the handler returned


def test_without_the_wait_a_worker_behind_handles_what_is_fetched_at_once(
    kafka_broker: TansuBroker,
) -> None:
    offsets, delay, metrics, _, _ = _first_batch(kafka_broker, 0, age_s=5.0)
    assert len(offsets) <= 2 and delay < 0.4
    assert _catch_ups(metrics) == 0


def test_a_record_that_is_not_behind_is_never_held(kafka_broker: TansuBroker) -> None:
    offsets, delay, metrics, _, _ = _first_batch(kafka_broker, 800, age_s=0.0)
    assert len(offsets) <= 2 and delay < 0.4
    assert _catch_ups(metrics) == 0


def test_a_rebalance_during_the_wait_loses_no_record(kafka_broker: TansuBroker) -> None:
    """A second member joins while the first is fetching a catch-up batch: whichever member
    ends up with the partition, every record is handled and the group commits past the last."""
    first, handled_a, _, topic, group = _loop(kafka_broker, 3000)
    dlq = f"dlq.{uuid.uuid4().hex[:8]}"
    create_topics(kafka_broker.bootstrap_servers, dlq, partitions=1)
    handled_b = Batches()
    second = ConsumerLoop(
        KafkaSettings(bootstrap_servers=kafka_broker.bootstrap_servers),
        fast_consumer(dlq, group, topic, catch_up_wait_ms=3000, behind_ms=500),
        handled_b,
        IngestMetrics(CollectorRegistry()),
    )
    stop = threading.Event()

    def run(loop: ConsumerLoop) -> None:
        while not stop.is_set():
            loop.run_once()

    _produce(kafka_broker, topic, 1, 0, 5.0)
    fresh = threading.Thread(target=_produce, args=(kafka_broker, topic, 20, 0.1, 0.0))
    fresh.start()
    members = [threading.Thread(target=run, args=(first,))]
    members[0].start()
    time.sleep(0.3)  # the first member is inside its catch-up wait
    second.start()
    members.append(threading.Thread(target=run, args=(second,)))
    members[1].start()
    fresh.join(30)
    try:
        deadline = time.monotonic() + 40
        while committed(kafka_broker.bootstrap_servers, group, topic, [0])[0] < 21:
            assert time.monotonic() < deadline, "the group never committed past the last record"
            time.sleep(0.3)
    finally:
        stop.set()
        for member in members:
            member.join(30)
        first.close()
        second.close()
    seen = {o for h in (handled_a, handled_b) for _, batch in h.batches for o in batch}
    assert seen == set(range(21))
    for _, batch in handled_a.batches + handled_b.batches:
        assert batch == sorted(batch)  # each batch in offset order
