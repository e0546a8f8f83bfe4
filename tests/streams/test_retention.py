"""Retention overtaking the consumer: whether the worker runs (its fetch position falls below
the log start while it is paused by an outage) or was stopped (its committed offset did), it
names the lost offsets (ERROR), counts them (`ragstream_ingest_offset_gaps_total`), hands them
to `on_offset_gaps` (the worker reconciles) and restarts at the low watermark: never a silent
jump, never a stuck partition.

The broker here is librdkafka's own mock cluster (`test.mock.num.brokers`: a Kafka-protocol
broker inside the test process that real clients reach over loopback TCP), because tansu,
the other broker these machines can run, has neither retention nor DeleteRecords and never
answers a fetch with OFFSET_OUT_OF_RANGE (it answers one past the log end with nothing). The
mock keeps at most 5 MiB per partition and deletes the oldest record batches beyond that,
which is retention by size; so the real librdkafka client meets a real out-of-range fetch.

The paths no broker here can produce on demand (the watermark query failing at the moment of
the reset, a partition without a committed offset whose assignment check failed, a reset
delivered for a partition revoked meanwhile) are unit tests with a fake consumer at the end.
"""

from __future__ import annotations

import logging
import time
import uuid
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import pytest
from confluent_kafka import OFFSET_BEGINNING, KafkaError, TopicPartition
from prometheus_client import CollectorRegistry

from ragcore.errors import EmbeddingUnavailableError
from ragcore.kafka_config import KafkaSettings
from schemas.events import RawRecord
from streams.consumer import ConsumerLoop, DeadLetter, OffsetGap, SchedulerSettings
from streams.metrics import IngestMetrics
from tests.streams.support import MockKafka, assert_fetch_gap_logged, fast_consumer


@dataclass
class Recorder:
    """`BatchHandler` that records what it handled; `failing` makes it raise a retryable
    embedder outage (the loop pauses and retries, as in production)."""

    offsets: list[tuple[int, int]] = field(default_factory=list)
    failing: bool = False

    def handle(self, records: Sequence[RawRecord]) -> Sequence[DeadLetter]:
        if self.failing:
            raise EmbeddingUnavailableError("embedder down (test)")
        self.offsets.extend((r.partition, r.offset) for r in records)
        return []


@dataclass
class Loop:
    """A consumer loop driven cycle by cycle from the test, with what it reported."""

    loop: ConsumerLoop
    handler: Recorder
    registry: CollectorRegistry
    gaps: list[OffsetGap]
    topic: str

    def run_until(self, done: Callable[[], bool], timeout: float = 30.0) -> None:
        deadline = time.monotonic() + timeout
        while not done():
            assert time.monotonic() < deadline, f"timed out; handled {self.handler.offsets}"
            self.loop.run_once()

    def gaps_counted(self) -> float | None:
        labels = {"topic": self.topic, "partition": "0"}
        return self.registry.get_sample_value("ragstream_ingest_offset_gaps_total", labels)


def start_loop(
    kafka: MockKafka,
    strategy: str = "range",
    *,
    group: str | None = None,
    read_ahead_records: int = 20_000,
    tenant_share: float = 1.0,
    rescan_reader: bool = True,
) -> Loop:
    suffix = uuid.uuid4().hex[:8]
    topic, dlq = f"ret.{suffix}", f"dlq.{suffix}"
    kafka.create(dlq)
    registry = CollectorRegistry()
    gaps: list[OffsetGap] = []
    handler = Recorder()
    loop = ConsumerLoop(
        KafkaSettings(bootstrap_servers=kafka.bootstrap_servers),
        fast_consumer(
            dlq,
            group or suffix,
            topic,
            assignment_strategy=strategy,
            # the mock delays a group's first join by 3 s (group.initial.rebalance.delay.ms):
            # a shorter session expires the member while it waits
            session_timeout_ms=6000,
            heartbeat_interval_ms=500,
            backoff_initial_s=0.05,
            backoff_max_s=0.1,
            scheduler=SchedulerSettings(
                read_ahead_records=read_ahead_records,
                tenant_share=tenant_share,
                rescan_reader=rescan_reader,
            ),
        ),
        handler,
        IngestMetrics(registry),
        on_offset_gaps=gaps.extend,
    )
    return Loop(loop, handler, registry, gaps, topic)


@pytest.mark.integration
@pytest.mark.parametrize("strategy", ["range", "cooperative-sticky"])
def test_a_running_worker_overtaken_by_retention_names_the_lost_offsets_and_restarts_at_the_log_start(  # noqa: E501
    mock_kafka: MockKafka, strategy: str, caplog: pytest.LogCaptureFixture
) -> None:
    # a budget of five records: holding the five it reads ahead during the outage pauses its
    # fetching, so that retention overtakes it
    env = start_loop(mock_kafka, strategy, read_ahead_records=5)
    mock_kafka.produce(env.topic, [b"seen-%d" % i for i in range(10)])
    with caplog.at_level(logging.INFO):
        env.loop.start()
        try:
            # a new group starts at the first offset (auto.offset.reset=error notwithstanding)
            env.run_until(lambda: len(env.handler.offsets) == 10)
            assert env.handler.offsets == [(0, i) for i in range(10)]
            # the embedder goes down: the worker retries offset 10 and reads ahead the five
            # changes that arrive (it holds them: retention deleting them does not lose them);
            # then retention deletes what arrives next before the worker could read it
            env.handler.failing = True
            mock_kafka.produce(env.topic, [b"lost-%d" % i for i in range(5)])
            env.run_until(lambda: "embedder unavailable" in caplog.text)
            low, high = mock_kafka.expire(env.topic, past=15)
            env.handler.failing = False
            env.run_until(lambda: env.handler.offsets[-1:] == [(0, high - 1)])
        finally:
            env.loop.close()
    (gap,) = env.gaps
    # the fetch stood past the five it read ahead (and what it had fetched of the filler)
    assert 15 <= gap.offset < low
    assert gap == OffsetGap(env.topic, 0, gap.offset, low, high, "fetch position")
    assert env.gaps_counted() == 1
    assert_fetch_gap_logged(caplog.records, env.topic, gap.offset, low)
    # nothing jumped: the records held were applied, and after the gap the worker read every
    # retained record, in order, once
    held = [(0, o) for o in range(10, gap.offset)]
    assert env.handler.offsets[10:] == held + [(0, o) for o in range(low, high)]


@pytest.mark.integration
@pytest.mark.parametrize("rescan_reader", [True, False])
def test_records_dropped_for_room_and_expired_before_their_rescan_are_a_gap_not_a_jump(
    mock_kafka: MockKafka, rescan_reader: bool, caplog: pytest.LogCaptureFixture
) -> None:
    """Records dropped for room (their tenant was over its share) are fetched again by a
    rescan; when retention deleted them first, the rescan's fetch is out of range: the rescan
    reader hands the partition to the consumer, whose fetch names the gap and restarts at
    the log start (with the reader off, the consumer's own rescan does)."""
    # a budget of four, a tenant's share two: the third record held is dropped
    env = start_loop(
        mock_kafka, read_ahead_records=4, tenant_share=0.5, rescan_reader=rescan_reader
    )
    mock_kafka.produce(env.topic, [b"seen-%d" % i for i in range(4)])
    with caplog.at_level(logging.INFO):
        env.loop.start()
        try:
            env.run_until(lambda: len(env.handler.offsets) == 4)
            # the embedder goes down while 4-8 arrive: 4 and 5 are held, 6-8 dropped
            env.handler.failing = True
            mock_kafka.produce(env.topic, [b"dropped-%d" % i for i in range(5)])
            env.run_until(lambda: env.loop.readahead.dropped >= 3)
            low, high = mock_kafka.expire(env.topic, past=9)
            env.handler.failing = False
            env.run_until(lambda: env.handler.offsets[-1:] == [(0, high - 1)], timeout=60)
        finally:
            env.loop.close()
    assert env.loop.readahead.rescans >= 1
    # 6-8 are lost, and said to be: a gap from at most 6 to the log start
    assert env.gaps, "no gap reported"
    assert min(g.offset for g in env.gaps) <= 6
    assert all(g.low <= low for g in env.gaps)
    assert_fetch_gap_logged(caplog.records, env.topic, min(g.offset for g in env.gaps), low)
    # nothing else lost or applied twice, and in order
    assert env.handler.offsets == [(0, o) for o in range(6)] + [(0, o) for o in range(low, high)]


@pytest.mark.integration
def test_a_committed_offset_below_the_log_start_is_one_gap_not_two(
    mock_kafka: MockKafka, caplog: pytest.LogCaptureFixture
) -> None:
    """The startup check restarts the partition at the low watermark itself, so the fetch
    never fails and the gap is counted once (the check at assignment, not the fetch)."""
    group = uuid.uuid4().hex[:8]
    env = start_loop(mock_kafka, group=group)
    mock_kafka.produce(env.topic, [b"old-%d" % i for i in range(3)])
    mock_kafka.commit(group, env.topic, 2)
    low, high = mock_kafka.expire(env.topic, past=2)
    with caplog.at_level(logging.INFO):
        env.loop.start()
        try:
            env.run_until(lambda: env.handler.offsets[-1:] == [(0, high - 1)])
        finally:
            env.loop.close()
    assert env.gaps == [OffsetGap(env.topic, 0, 2, low, high)]
    assert env.gaps_counted() == 1
    assert f"committed offset 2 < low watermark {low}" in caplog.text
    assert "fetch of" not in caplog.text  # no out-of-range fetch happened
    assert env.handler.offsets == [(0, o) for o in range(low, high)]


# --- what no broker here produces: a fake consumer -------------------------------------------


class FakeMessage:
    """An error event as librdkafka delivers it for a partition whose fetch stopped."""

    def __init__(self, topic: str, partition: int, offset: int | None) -> None:
        self._where = (topic, partition, offset)

    def error(self) -> KafkaError:
        return KafkaError(KafkaError._AUTO_OFFSET_RESET, "offset reset (test)")

    def topic(self) -> str:
        return self._where[0]

    def partition(self) -> int:
        return self._where[1]

    def offset(self) -> int | None:
        return self._where[2]


@dataclass
class FakeConsumer:
    """Answers `poll` with queued error events and the watermark query with `marks`."""

    events: list[FakeMessage]
    marks: tuple[int, int] | None
    assigned: list[list[tuple[str, int, int]]] = field(default_factory=list)

    def poll(self, _timeout: float) -> FakeMessage | None:
        return self.events.pop(0) if self.events else None

    def consume(self, _n: int, _timeout: float) -> list[Any]:
        return []

    def get_watermark_offsets(self, *_a: Any, **_k: Any) -> tuple[int, int] | None:
        return self.marks

    def assign(self, partitions: list[TopicPartition]) -> None:
        self.assigned.append([(p.topic, p.partition, p.offset) for p in partitions])


def fake_loop(consumer: FakeConsumer, positions: dict[tuple[str, int], int]) -> Loop:
    registry = CollectorRegistry()
    gaps: list[OffsetGap] = []
    handler = Recorder()
    loop = ConsumerLoop(
        KafkaSettings(bootstrap_servers="127.0.0.1:9"),
        fast_consumer("dlq", "g", "t", lag_refresh_s=3600),
        handler,
        IngestMetrics(registry),
        on_offset_gaps=gaps.extend,
    )
    # the state `_on_assign` leaves behind, without a broker
    loop._consumer = consumer  # type: ignore[assignment]
    loop._assigned.update(positions)
    loop._positions.update(positions)
    loop._lag_due = float("inf")
    return Loop(loop, handler, registry, gaps, "t")


@pytest.mark.unit
def test_a_partition_without_a_committed_offset_starts_at_its_first_offset_and_is_no_gap() -> None:
    consumer = FakeConsumer([FakeMessage("t", 1, None)], marks=(40, 90))
    env = fake_loop(consumer, {("t", 0): 12, ("t", 1): -1001})
    env.loop.run_once()
    # eager: the whole assignment again, the other partition where the loop stood
    assert consumer.assigned == [[("t", 0, 12), ("t", 1, OFFSET_BEGINNING)]]
    assert env.gaps == []


@pytest.mark.unit
def test_a_stopped_partition_whose_watermarks_are_unknown_stays_stopped_until_they_are() -> None:
    consumer = FakeConsumer([FakeMessage("t", 0, 7)], marks=None)
    env = fake_loop(consumer, {("t", 0): 7, ("t", 1): 3})
    env.loop.run_once()
    assert consumer.assigned == []  # not restarted blind, not counted
    assert env.gaps == []
    consumer.marks = (20, 30)
    env.loop.run_once()
    assert consumer.assigned == [[("t", 0, 20), ("t", 1, 3)]]
    assert env.gaps == [OffsetGap("t", 0, 7, 20, 30, "fetch position")]
    assert env.gaps_counted() == 1


@pytest.mark.unit
def test_an_offset_reset_of_a_partition_revoked_meanwhile_is_left_to_its_new_owner() -> None:
    consumer = FakeConsumer([FakeMessage("t", 5, 7)], marks=(20, 30))
    env = fake_loop(consumer, {("t", 0): 12})
    env.loop.run_once()
    assert consumer.assigned == []
    assert env.gaps == []
