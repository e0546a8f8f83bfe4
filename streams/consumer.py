"""The core consumer loop: poll a batch, hand it to the handler, DLQ the poison, commit.

Invariants (docs/decisions/kafka-client-and-consumer-loop.md):
- offsets are committed only after the handler returned, i.e. after every write of the batch
  was acknowledged by the store, and after every DLQ record of the batch was delivered;
- per-partition order is Kafka's: one batch at a time, handled in offset order;
- a retryable dependency failure (embedder, store, SoR or the DLQ topic overloaded or
  unreachable) commits nothing:
  the batch's partitions are rewound to the batch start and all partitions are paused for a
  backoff (honouring retry-after), then resumed. Re-processing is safe: writes are idempotent;
- revocation can only happen inside `poll()`/`consume()`, while a batch is being fetched, when
  nothing is being handled and everything handled was committed; so revoking needs no extra
  commit, and the fetched records of a partition that went to another member are dropped
  (its new owner starts at the committed offset);
- while behind (`catch_up_wait_ms`) a batch is fetched for longer, never a record that is not;
- no offset ever jumps silently (`auto.offset.reset=error`): a partition the group never read
  starts at its first offset by an explicit assignment, and a committed offset or a fetch
  position that fell out of the log (retention overtook the worker) is logged, counted in
  `ragstream_ingest_offset_gaps_total`, handed to `on_offset_gaps` (the worker reconciles)
  and restarted at the low watermark by an explicit assignment.
"""

from __future__ import annotations

import logging
import random
import signal
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from types import FrameType
from typing import Any, Protocol

from confluent_kafka import (
    OFFSET_BEGINNING,
    OFFSET_INVALID,
    Consumer,
    KafkaError,
    KafkaException,
    Message,
    Producer,
    TopicPartition,
)
from pydantic import BaseModel, ConfigDict, Field

from ragcore.errors import (
    ConfigError,
    DeadLetterUnavailableError,
    EmbeddingUnavailableError,
    RagstreamError,
    SorUnavailableError,
    StoreUnavailableError,
)
from ragcore.kafka_config import KafkaSettings
from ragcore.tracing import Tracing
from schemas.events import RawRecord
from streams.metrics import IngestMetrics

log = logging.getLogger(__name__)

#: Retryable dependency failures: the batch is retried after a backoff, nothing is committed.
RETRYABLE = (
    EmbeddingUnavailableError,
    StoreUnavailableError,
    SorUnavailableError,
    DeadLetterUnavailableError,
)
#: The `dependency` label of `ragstream_ingest_backpressure_total` per retryable failure.
DEPENDENCY: dict[type[RagstreamError], str] = {
    EmbeddingUnavailableError: "embedder",
    StoreUnavailableError: "store",
    SorUnavailableError: "sor",
    DeadLetterUnavailableError: "dlq",
}


def dependency_of(exc: RagstreamError) -> str:
    """The dependency a retryable failure is blamed on (metrics label, log line)."""
    for kind, name in DEPENDENCY.items():
        if isinstance(exc, kind):
            return name
    return "unknown"


DLQ_HEADER_PREFIX = "ragstream."


class ConsumerConfig(BaseModel):
    """Consumer-group behaviour of the ingest worker."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    group_id: str = "ragstream-ingest"
    topics: tuple[str, ...] = Field(
        default=(),
        description=(
            "Topics to consume; entries starting with '^' are regex patterns. Empty: the "
            "topics of the mapped tables (plan.tables)."
        ),
    )
    dlq_topic: str = "ragstream.dlq"
    #: Retrieve publishes reindex requests (stale, deleted or missing hits) here; the worker
    #: re-reads those entities from the SoR. None: not consumed.
    reindex_topic: str | None = None
    max_batch_records: int = Field(default=500, gt=0)
    poll_timeout_s: float = Field(default=0.5, gt=0)
    catch_up_wait_ms: int = Field(
        default=0,
        ge=0,
        le=5_000,
        description=(
            "While the worker is behind (the oldest record just fetched is older than "
            "behind_ms), keep fetching for up to this long, or until max_batch_records, before "
            "handling the batch: fewer, larger batches while catching up. 0: handle what is "
            "fetched at once. A record that is not behind is never held. Only for an embedder "
            "whose call costs far more than its records (a remote API): with the local model "
            "the wait is idle time (docs/decisions/kafka-client-and-consumer-loop.md)."
        ),
    )
    behind_ms: int = Field(
        default=500,
        ge=0,
        description=(
            "Age (now - its broker timestamp) of the oldest fetched record above which the "
            "worker counts as behind (catch_up_wait_ms)."
        ),
    )
    session_timeout_ms: int = 10_000
    heartbeat_interval_ms: int = 3_000
    max_poll_interval_ms: int = 300_000
    #: Eager `range` by default: `cooperative-sticky` works with real Kafka but did not
    #: converge on the tansu test broker when a member left the group.
    assignment_strategy: str = "range"
    backoff_initial_s: float = Field(default=0.5, gt=0)
    backoff_max_s: float = Field(default=30.0, gt=0)
    #: librdkafka pre-fetch bound (bounded memory).
    queued_max_messages_kbytes: int = 32_768
    #: How long the broker may hold a fetch with no new data (librdkafka's default 500 ms adds
    #: up to that to every change's freshness on a quiet topic; 50 ms costs a few idle fetches).
    fetch_wait_max_ms: int = Field(default=50, ge=0, le=10_000)
    #: How often librdkafka refreshes topic metadata, which is also when a pattern subscription
    #: (the connector's heartbeat topic) finds a topic created after the worker started
    #: (librdkafka's default: 5 minutes).
    metadata_refresh_ms: int = Field(default=10_000, ge=1_000)
    #: DLQ values above this are truncated (the header says so; the original stays in its topic).
    dlq_max_value_bytes: int = 900_000
    lag_refresh_s: float = Field(
        default=5.0,
        gt=0,
        description=(
            "Seconds between two queries of the high watermarks of the worker's partitions, "
            "for its own consumer-lag metric (one ListOffsets round trip per partition)."
        ),
    )
    lag_query_timeout_s: float = Field(
        default=2.0,
        gt=0,
        description="Timeout of one watermark or committed-offset query (delays the loop).",
    )
    high_watermark_slack: int = Field(
        default=0,
        ge=0,
        description=(
            "Records a committed offset may lie past the broker's high watermark before it "
            "counts as an offset gap (a truncated or recreated log). 0 for Kafka, whose high "
            "watermark is the log end; the dev broker tansu reports the base offset of the "
            "last record batch + 1, so the dev stack allows more."
        ),
    )


@dataclass(frozen=True, slots=True)
class OffsetGap:
    """A partition the group must read from `offset` (its committed offset at assignment, or
    the running worker's fetch position) while its log spans `[low, high)`: `[offset, low)`
    expired unread (past retention, or deleted records) or, when `offset > high`, the log was
    truncated or recreated (what is lost is unknown). Either way the index may miss changes."""

    topic: str
    partition: int
    offset: int
    low: int
    high: int
    #: what `offset` is, for the log line: "committed offset" or "fetch position"
    at: str = "committed offset"

    def describe(self) -> str:
        """The lost range, for the log line."""
        where = f"{self.topic}[{self.partition}]"
        if self.offset < self.low:
            return (
                f"{where}: {self.at} {self.offset} < low watermark {self.low}, "
                f"offsets {self.offset}..{self.low - 1} ({self.low - self.offset}) lost"
            )
        return (
            f"{where}: {self.at} {self.offset} > high watermark {self.high}, the "
            "log was truncated or recreated (lost offsets unknown)"
        )


def offset_gap(
    topic: str,
    partition: int,
    offset: int,
    low: int,
    high: int,
    *,
    slack: int = 0,
    at: str = "committed offset",
) -> OffsetGap | None:
    """The gap of a partition to be read from `offset` (negative: the group never committed
    there, which starts at the low watermark by design, no gap) whose log spans `[low, high)`;
    `slack`: how far past `high` an offset may lie (a broker that under-reports its high
    watermark)."""
    if offset < 0 or low <= offset <= high + slack:
        return None
    return OffsetGap(topic, partition, offset, low, high, at)


@dataclass(frozen=True, slots=True)
class DeadLetter:
    """A record the handler could not process, with the reason and, when known, the table,
    column, entity and tenant it concerns (DLQ headers `ragstream.error.*`)."""

    record: RawRecord
    code: str
    message: str
    stage: str
    table: str | None = None
    column: str | None = None
    entity_id: str | None = None
    tenant_id: str | None = None


class BatchHandler(Protocol):
    """Processes one batch of records in offset order; must be idempotent.

    Returns the records to dead-letter. Raises an error from `RETRYABLE` when a dependency is
    overloaded (the whole batch is retried later) and any other exception for a fatal condition.
    """

    def handle(self, records: Sequence[RawRecord]) -> Sequence[DeadLetter]:
        """Process `records`; everything not returned as a dead letter is durably applied."""
        ...


def to_raw(msg: Message) -> RawRecord:
    """Copy a confluent-kafka message into our frozen record type."""
    ts_type, ts = msg.timestamp()
    topic, partition, offset = msg.topic(), msg.partition(), msg.offset()
    if topic is None or partition is None or offset is None:
        raise RagstreamError("a Kafka message without topic/partition/offset is not a record")
    raw_headers = msg.headers() or []
    pairs = raw_headers.items() if isinstance(raw_headers, dict) else raw_headers
    headers = tuple((k, v.encode() if isinstance(v, str) else v) for k, v in pairs)
    return RawRecord(
        topic=topic,
        partition=partition,
        offset=offset,
        key=msg.key(),
        value=msg.value(),
        headers=headers,
        timestamp_ms=ts if ts_type != 0 else None,
    )


def after_rebalance(
    msgs: Sequence[Message], revoked: set[tuple[str, int]], assigned: set[tuple[str, int]]
) -> list[Message]:
    """The messages of a fetch during which `revoked` partitions were revoked, in order: none
    of a partition now owned by another member (not handled, not committed: its new owner
    starts at the group's committed offset), and of a partition assigned back only those
    fetched since it restarted at the committed offset (an offset going back marks the
    restart; the records before it are fetched again, so per-partition order holds)."""
    start: dict[tuple[str, int], int] = {}
    last: dict[tuple[str, int], int] = {}
    for i, msg in enumerate(msgs):
        tp, offset = (msg.topic(), msg.partition()), msg.offset()
        if msg.error() is None and tp in revoked and offset is not None:
            if tp in last and offset <= last[tp]:
                start[tp] = i
            last[tp] = offset
    return [
        m
        for i, m in enumerate(msgs)
        if (tp := (m.topic(), m.partition())) not in revoked
        or (tp in assigned and i >= start.get(tp, 0))
    ]


def dlq_headers(letter: DeadLetter, truncated: bool) -> list[tuple[str, str | bytes | None]]:
    """Headers of a DLQ record: where it came from and why it is there."""
    rec = letter.record
    fields = {
        "error.code": letter.code,
        "error.message": letter.message[:2000],
        "error.stage": letter.stage,
        **{
            f"error.{name}": value
            for name, value in (
                ("table", letter.table),
                ("column", letter.column),
                ("entity", letter.entity_id),
                ("tenant", letter.tenant_id),
            )
            if value is not None
        },
        "source.topic": rec.topic,
        "source.partition": str(rec.partition),
        "source.offset": str(rec.offset),
        "source.timestamp_ms": "" if rec.timestamp_ms is None else str(rec.timestamp_ms),
        "value.truncated": "true" if truncated else "false",
    }
    own: list[tuple[str, str | bytes | None]] = [
        (DLQ_HEADER_PREFIX + k, v.encode()) for k, v in fields.items()
    ]
    original: list[tuple[str, str | bytes | None]] = [(k, v) for k, v in rec.headers]
    return own + original


class ConsumerLoop:
    """Runs the ingest consumer group until `stop` is set."""

    def __init__(
        self,
        kafka: KafkaSettings,
        config: ConsumerConfig,
        handler: BatchHandler,
        metrics: IngestMetrics,
        *,
        sleep: Callable[[float], None] = time.sleep,
        tracing: Tracing | None = None,
        on_offset_gaps: Callable[[Sequence[OffsetGap]], None] | None = None,
    ) -> None:
        self._kafka = kafka
        #: told about out-of-range committed offsets (the worker reconciles)
        self._on_offset_gaps = on_offset_gaps
        self._tracing = tracing or Tracing.off()
        self._config = config
        self._handler = handler
        self._metrics = metrics
        self._sleep = sleep
        self._consumer: Consumer | None = None
        self._producer: Producer | None = None
        self._paused_until: float | None = None
        self._backoff = config.backoff_initial_s
        self._assigned: set[tuple[str, int]] = set()
        #: partitions revoked while a batch is being fetched (its records of them are dropped)
        self._revoked: set[tuple[str, int]] = set()
        # lag bookkeeping: the group's committed offset and the last high watermark per partition
        self._committed: dict[tuple[str, int], int] = {}
        self._high: dict[tuple[str, int], int] = {}
        self._lag_due = 0.0
        #: per assigned partition, the next offset the loop needs (or a logical one:
        #: OFFSET_BEGINNING, OFFSET_INVALID for the group's committed offset); re-assigning a
        #: partition whose fetch stopped restarts every other partition from here (eager)
        self._positions: dict[tuple[str, int], int] = {}
        #: partitions whose fetch stopped on an offset reset, with librdkafka's fetch position
        #: (None: no committed offset), waiting for `_restart_stopped`
        self._stopped: dict[tuple[str, int], int | None] = {}
        self._cooperative = all(
            s.strip() == "cooperative-sticky" for s in config.assignment_strategy.split(",")
        )

    # --- setup ------------------------------------------------------------------------------

    def _consumer_config(self) -> dict[str, Any]:
        c = self._config
        return {
            **self._kafka.client_config(),
            "group.id": c.group_id,
            "enable.auto.commit": False,
            "enable.auto.offset.store": False,
            # never jump silently: an offset out of range is an error event we handle
            # (`_restart_stopped`); a new group's partitions start at their first offset by
            # an explicit assignment (`_on_assign`)
            "auto.offset.reset": "error",
            "session.timeout.ms": c.session_timeout_ms,
            "heartbeat.interval.ms": c.heartbeat_interval_ms,
            "max.poll.interval.ms": c.max_poll_interval_ms,
            "partition.assignment.strategy": c.assignment_strategy,
            "queued.max.messages.kbytes": c.queued_max_messages_kbytes,
            "fetch.wait.max.ms": c.fetch_wait_max_ms,
            "topic.metadata.refresh.interval.ms": c.metadata_refresh_ms,
            "error_cb": self._on_error,
        }

    def _producer_config(self) -> dict[str, Any]:
        return {
            **self._kafka.client_config(),
            "enable.idempotence": True,
            "acks": "all",
            "linger.ms": 5,
            "message.max.bytes": max(1_000_000, self._config.dlq_max_value_bytes + 100_000),
            "error_cb": self._on_error,
        }

    @staticmethod
    def _on_error(err: KafkaError) -> None:
        if err.fatal():
            log.error("fatal Kafka error: %s", err)
        else:
            log.warning("Kafka client error (librdkafka retries): %s", err)

    def start(self, startup_timeout_s: float = 10.0) -> None:
        """Create the clients and check that every named topic exists (fail fast)."""
        consumer = Consumer(self._consumer_config())
        try:
            metadata = consumer.list_topics(timeout=startup_timeout_s)
        except KafkaException as exc:
            consumer.close()
            raise ConfigError(
                f"Kafka unreachable at {self._kafka.bootstrap_servers}: {exc}"
            ) from exc
        missing = [
            t
            for t in (*self.subscriptions(), self._config.dlq_topic)
            if not t.startswith("^") and t not in metadata.topics
        ]
        if missing:
            consumer.close()
            raise ConfigError(f"Kafka topics do not exist: {missing} (create them first)")
        self._consumer = consumer
        self._producer = Producer(self._producer_config())
        consumer.subscribe(
            self.subscriptions(), on_assign=self._on_assign, on_revoke=self._on_revoke
        )
        log.info(
            "consuming %s as group %s (%s)",
            self.subscriptions(),
            self._config.group_id,
            self._kafka.redacted_config(),
        )

    def subscriptions(self) -> list[str]:
        """The change-event topics, plus the reindex-request topic when configured."""
        topics = list(self._config.topics)
        if self._config.reindex_topic:
            topics.append(self._config.reindex_topic)
        return topics

    def is_designated(self) -> bool | None:
        """Whether this member holds partition 0 of the first configured (non-pattern) topic,
        which designates one member of the group for group-wide chores (the scheduled
        reconciliation). None before `start` or when every topic is a pattern."""
        if self._consumer is None:
            return None
        named = [t for t in self._config.topics if not t.startswith("^")]
        if not named:
            return None
        return (named[0], 0) in self._assigned

    def _on_assign(self, consumer: Consumer, partitions: list[TopicPartition]) -> None:
        self._assigned.update((p.topic, p.partition) for p in partitions)
        self._metrics.assigned_partitions.set(len(self._assigned))
        log.info("assigned %s", [(p.topic, p.partition) for p in partitions])
        for p in partitions:  # exported at 0: `increase()` sees the first gap
            self._metrics.offset_gaps.labels(p.topic, str(p.partition))
        starts = self.start_offsets(consumer, [(p.topic, p.partition) for p in partitions])
        assignment = [TopicPartition(t, p, o) for (t, p), o in starts.items()]
        if self._cooperative:
            consumer.incremental_assign(assignment)
        else:
            consumer.assign(assignment)

    def start_offsets(
        self, consumer: Consumer, partitions: Sequence[tuple[str, int]]
    ) -> dict[tuple[str, int], int]:
        """Where each newly assigned partition starts, from the group's committed offset and
        the partition's watermarks: OFFSET_BEGINNING where the group never committed (a new
        group reads everything); the low watermark where the committed offset is out of range
        (each such gap is logged as an ERROR naming the lost offsets, counted in
        `ragstream_ingest_offset_gaps_total` and handed to `on_offset_gaps`); otherwise the
        committed offset (OFFSET_INVALID). Records the positions for `_restart_stopped`.

        When the broker does not answer, every partition starts at its committed offset and
        librdkafka's error event for one without (or out of range) does the rest."""
        timeout = self._config.lag_query_timeout_s
        starts = {tp: OFFSET_INVALID for tp in partitions}
        positions = dict(starts)
        gaps: list[OffsetGap] = []
        try:
            committed = (
                consumer.committed([TopicPartition(t, p) for t, p in partitions], timeout=timeout)
                if partitions
                else []
            )
            for tp in committed:
                key = (tp.topic, tp.partition)
                if tp.offset < 0:
                    starts[key] = positions[key] = OFFSET_BEGINNING
                    continue
                marks = consumer.get_watermark_offsets(
                    TopicPartition(tp.topic, tp.partition), timeout=timeout, cached=False
                )
                if marks is None:
                    raise KafkaException(KafkaError(KafkaError._TIMED_OUT))
                gap = offset_gap(
                    tp.topic,
                    tp.partition,
                    tp.offset,
                    *marks,
                    slack=self._config.high_watermark_slack,
                )
                if gap is None:
                    positions[key] = tp.offset
                else:
                    gaps.append(gap)
                    starts[key] = positions[key] = gap.low
        except KafkaException as exc:
            log.error(
                "cannot compare the committed offsets of %s with their watermarks (%s): "
                "starting at the committed offsets; one out of range is reported when its "
                "fetch fails",
                list(partitions),
                exc,
            )
            starts = {tp: OFFSET_INVALID for tp in partitions}
            self._positions.update(starts)
            return starts
        self._positions.update(positions)
        self._report_gaps(gaps)
        return starts

    def _report_gaps(self, gaps: Sequence[OffsetGap]) -> None:
        for gap in gaps:
            self._metrics.offset_gaps.labels(gap.topic, str(gap.partition)).inc()
            log.error(
                "changes lost before the worker read them (past retention): %s; the index "
                "may miss them until the automatic reconcile closes the gap",
                gap.describe(),
            )
        if gaps and self._on_offset_gaps is not None:
            self._on_offset_gaps(gaps)

    def _on_revoke(self, consumer: Consumer, partitions: list[TopicPartition]) -> None:
        # Nothing is in flight here (see module docstring): all handled work is committed.
        revoked = [(p.topic, p.partition) for p in partitions]
        self._revoked.update(revoked)
        self._assigned.difference_update(revoked)
        for tp in revoked:
            self._committed.pop(tp, None)
            self._high.pop(tp, None)
            self._positions.pop(tp, None)
            self._stopped.pop(tp, None)
        self._metrics.backlog.forget(revoked)
        self._metrics.assigned_partitions.set(len(self._assigned))
        log.info("revoked %s", [(p.topic, p.partition) for p in partitions])

    # --- the loop ---------------------------------------------------------------------------

    def run(self, stop: threading.Event) -> None:
        """Consume until `stop` is set, then close cleanly (committed work stays committed)."""
        if self._consumer is None:
            self.start()
        try:
            while not stop.is_set():
                self.run_once()
        finally:
            self.close()

    def run_once(self) -> int:
        """One poll-handle-commit cycle; returns the number of records handled."""
        consumer = self._require_consumer()
        if self._paused_until is not None and time.monotonic() >= self._paused_until:
            self._resume_all()
        if time.monotonic() >= self._lag_due:
            self.refresh_lag()
        msgs = self._fetch(consumer)
        records: list[RawRecord] = []
        for msg in msgs:
            err = msg.error()
            if err is None:
                records.append(to_raw(msg))
            elif err.code() == KafkaError._PARTITION_EOF:
                continue
            elif err.code() == KafkaError._AUTO_OFFSET_RESET:
                # the partition's fetch stopped: its offset is out of range (retention
                # overtook the worker) or it has none; restarted after the batch
                topic, partition = msg.topic(), msg.partition()
                if topic is None or partition is None:
                    raise RagstreamError(f"an offset reset without a partition: {err}")
                log.info("fetch of %s[%d] stopped: %s", topic, partition, err.str())
                self._stopped[(topic, partition)] = msg.offset()
            elif err.fatal():
                raise RagstreamError(f"fatal Kafka consumer error: {err}")
            else:
                log.warning("consumer error (retried by librdkafka): %s", err)
        handled = 0
        if records:
            with self._tracing.span("ingest.batch", self._batch_attributes(records)) as span:
                handled = self._apply(records)
                if span is not None:
                    span.set_attribute("ragstream.outcome", "committed" if handled else "retried")
        if self._stopped:
            self._restart_stopped(consumer)
        return handled

    def _restart_stopped(self, consumer: Consumer) -> None:
        """Restart the partitions whose fetch stopped on an offset reset (after the batch, so
        their position counts what it handled). One without a committed offset (the
        watermark check at assignment did not answer) starts at its first offset; one whose
        position fell out of the log is a gap like those found at assignment (logged with the
        lost offsets, counted, handed to `on_offset_gaps`) and restarts at the low watermark.
        librdkafka cannot seek a stopped partition, so it is assigned again. A broker that does
        not answer the watermark query leaves it stopped until the next cycle."""
        for tp in [tp for tp in self._stopped if tp not in self._assigned]:
            del self._stopped[tp]  # revoked meanwhile: its new owner starts it
        timeout = self._config.lag_query_timeout_s
        starts: dict[tuple[str, int], int] = {}
        gaps: list[OffsetGap] = []
        for (topic, partition), fetch_at in sorted(self._stopped.items()):
            known = self._positions.get((topic, partition), OFFSET_INVALID)
            position = known if known >= 0 else fetch_at
            if position is None or position < 0:
                log.info(
                    "%s[%d] has no committed offset (the group never read it): starting at "
                    "its first offset",
                    topic,
                    partition,
                )
                starts[(topic, partition)] = OFFSET_BEGINNING
                continue
            try:
                marks = consumer.get_watermark_offsets(
                    TopicPartition(topic, partition), timeout=timeout, cached=False
                )
            except KafkaException as exc:
                marks, reason = None, str(exc)
            else:
                reason = f"no answer within {timeout}s"
            if marks is None:
                log.warning(
                    "%s[%d] stopped at an offset out of range (%d) and its watermarks are "
                    "unknown (%s): retried next cycle",
                    topic,
                    partition,
                    position,
                    reason,
                )
                continue
            # the broker's own answer: no slack for an under-reported high watermark
            gap = offset_gap(topic, partition, position, *marks, at="fetch position")
            if gap is None:
                log.warning(
                    "%s[%d]: the broker reported fetch position %d out of range, but its log "
                    "now spans %d..%d: resuming there",
                    topic,
                    partition,
                    position,
                    *marks,
                )
                starts[(topic, partition)] = position
            else:
                gaps.append(gap)
                starts[(topic, partition)] = gap.low
        if not starts:
            return
        self._reassign(consumer, starts)
        for tp in starts:
            self._stopped.pop(tp, None)
        self._report_gaps(gaps)

    def _reassign(self, consumer: Consumer, starts: dict[tuple[str, int], int]) -> None:
        """Assign stopped partitions again at `starts` (cooperative: those alone; eager: the
        whole assignment, every other partition at its recorded position, except those still
        stopped), keeping the loop's pause (backoff) in force."""
        self._positions.update(starts)
        if self._cooperative:
            consumer.incremental_unassign([TopicPartition(t, p) for t, p in starts])
            restarted = [TopicPartition(t, p, o) for (t, p), o in starts.items()]
            consumer.incremental_assign(restarted)
        else:
            restarted = [
                TopicPartition(t, p, self._positions.get((t, p), OFFSET_INVALID))
                for t, p in sorted(self._assigned)
                if (t, p) in starts or (t, p) not in self._stopped
            ]
            consumer.assign(restarted)
        if self._paused_until is not None:
            consumer.pause([TopicPartition(tp.topic, tp.partition) for tp in restarted])
        log.info("restarted %s", sorted(starts.items()))

    def _fetch(self, consumer: Consumer) -> list[Message]:
        """The next batch's messages. Waits for the first record only, then takes what is
        already fetched: a lone event is handled at once (freshness), while under load the
        local queue fills batches. While behind, keeps fetching up to `catch_up_wait_ms`.
        A rebalance meanwhile is settled by `after_rebalance`."""
        self._revoked.clear()
        limit = self._config.max_batch_records
        first = consumer.poll(self._config.poll_timeout_s)
        if first is None:
            return []
        msgs = [first]
        if limit > 1:
            msgs += consumer.consume(limit - 1, 0)
        if self._config.catch_up_wait_ms and len(msgs) < limit and self._behind(msgs):
            deadline = time.monotonic() + self._config.catch_up_wait_ms / 1000
            while len(msgs) < limit and (left := deadline - time.monotonic()) > 0:
                msgs += consumer.consume(limit - len(msgs), left)
            self._metrics.catch_up_batches.inc()
        return after_rebalance(msgs, self._revoked, self._assigned) if self._revoked else msgs

    def _behind(self, msgs: Sequence[Message]) -> bool:
        """Whether the oldest record fetched is older than `behind_ms` (broker timestamps)."""
        stamps = [ts for m in msgs if m.error() is None and (ts := m.timestamp())[0] != 0]
        if not stamps:
            return False
        oldest = min(ms for _, ms in stamps)
        return time.time() * 1000 - oldest > self._config.behind_ms

    def _batch_attributes(self, records: Sequence[RawRecord]) -> dict[str, str | int]:
        """The batch span's attributes (OpenTelemetry messaging conventions)."""
        if not self._tracing.enabled:
            return {}
        return {
            "messaging.system": "kafka",
            "messaging.operation.type": "process",
            "messaging.consumer.group.name": self._config.group_id,
            "messaging.batch.message_count": len(records),
            "ragstream.partitions": len({(r.topic, r.partition) for r in records}),
        }

    def _apply(self, records: Sequence[RawRecord]) -> int:
        """Handle, dead-letter and commit one batch; 0 when it was rewound for a retry."""
        self._metrics.batch_size.observe(len(records))
        for rec in records:
            if rec.timestamp_ms is not None:
                self._metrics.backlog.holding((rec.topic, rec.partition), rec.timestamp_ms)
        try:
            letters = self._handler.handle(records)
            self._dead_letter(letters)
        except RETRYABLE as exc:
            self._back_off(records, exc)
            return 0
        self._commit(records)
        self._backoff = self._config.backoff_initial_s
        return len(records)

    def _dead_letter(self, letters: Sequence[DeadLetter]) -> None:
        if not letters:
            return
        producer = self._require_producer()
        started = time.perf_counter()
        failures: list[str] = []

        def on_delivery(err: KafkaError | None, _msg: Message) -> None:
            if err is not None:
                failures.append(str(err))

        for letter in letters:
            value = letter.record.value
            truncated = value is not None and len(value) > self._config.dlq_max_value_bytes
            if truncated and value is not None:
                value = value[: self._config.dlq_max_value_bytes]
            producer.produce(
                self._config.dlq_topic,
                key=letter.record.key,
                value=value,
                headers=dlq_headers(letter, truncated),
                on_delivery=on_delivery,
            )
            self._metrics.dlq.labels(letter.code).inc()
            log.warning(
                "DLQ %s[%d]@%d %s: %s",
                letter.record.topic,
                letter.record.partition,
                letter.record.offset,
                letter.code,
                letter.message[:300],
            )
        remaining = producer.flush(30)
        self._metrics.stage_seconds.labels("dlq").observe(time.perf_counter() - started)
        if remaining or failures:
            # Not delivered: the batch is retried rather than committed past a lost record.
            raise DeadLetterUnavailableError(
                f"DLQ delivery to {self._config.dlq_topic} failed ({remaining} undelivered): "
                f"{failures[:3]}"
            )

    def _commit(self, records: Sequence[RawRecord]) -> None:
        consumer = self._require_consumer()
        next_offsets: dict[tuple[str, int], int] = {}
        for rec in records:
            key = (rec.topic, rec.partition)
            next_offsets[key] = max(next_offsets.get(key, -1), rec.offset + 1)
        offsets = [TopicPartition(t, p, o) for (t, p), o in next_offsets.items()]
        self._positions.update(next_offsets)
        started = time.perf_counter()
        try:
            consumer.commit(offsets=offsets, asynchronous=False)
        except KafkaException as exc:
            # A commit lost to a rebalance is safe: the new owner re-processes idempotently.
            log.warning("offset commit failed (records will be re-delivered): %s", exc)
            return
        self._metrics.stage_seconds.labels("commit").observe(time.perf_counter() - started)
        self._metrics.last_commit_timestamp.set(time.time())
        for (topic, partition), offset in next_offsets.items():
            self._metrics.committed_offset.labels(topic, str(partition)).set(offset)
            tp = (topic, partition)
            self._committed[tp] = offset
            high = self._high.get(tp)
            self._metrics.backlog.applied(tp, None if high is None else high - offset)

    def refresh_lag(self) -> None:
        """Export the lag of every assigned partition: its high watermark (asked of the broker)
        minus the group's committed offset (ours, or the broker's for a partition this worker
        has not committed yet; the low watermark when the group never committed there).

        A broker that does not answer within `lag_query_timeout_s` leaves the previous values
        (logged); the next refresh retries. The tansu dev broker reports the base offset of the
        last record batch + 1 as its high watermark, so there the lag reads low for a partition
        whose last batch held several records (clamped at 0); real Kafka reports the log end."""
        consumer = self._require_consumer()
        self._lag_due = time.monotonic() + self._config.lag_refresh_s
        timeout = self._config.lag_query_timeout_s
        assigned = sorted(self._assigned)
        try:
            unknown = [TopicPartition(t, p) for t, p in assigned if (t, p) not in self._committed]
            if unknown:
                for tp in consumer.committed(unknown, timeout=timeout):
                    if tp.offset >= 0:
                        self._committed[(tp.topic, tp.partition)] = tp.offset
            lags: dict[tuple[str, int], int] = {}
            for topic, partition in assigned:
                marks = consumer.get_watermark_offsets(
                    TopicPartition(topic, partition), timeout=timeout, cached=False
                )
                if marks is None:  # the client's way of saying the query timed out
                    log.warning("consumer lag not refreshed: no watermarks within %ss", timeout)
                    return
                low, high = marks
                self._high[(topic, partition)] = high
                lags[(topic, partition)] = high - self._committed.get((topic, partition), low)
        except KafkaException as exc:
            log.warning("consumer lag not refreshed (broker did not answer): %s", exc)
            return
        self._metrics.backlog.set_lag(lags)

    def _back_off(self, records: Sequence[RawRecord], exc: RagstreamError) -> None:
        consumer = self._require_consumer()
        dependency = dependency_of(exc)
        self._metrics.backpressure.labels(dependency).inc()
        first: dict[tuple[str, int], int] = {}
        for rec in records:
            key = (rec.topic, rec.partition)
            first[key] = min(first.get(key, rec.offset), rec.offset)
        self._positions.update(first)
        for (topic, partition), offset in first.items():
            if (topic, partition) not in self._stopped:  # a stopped fetch cannot seek
                consumer.seek(TopicPartition(topic, partition, offset))
        assignment = consumer.assignment()
        consumer.pause(assignment)
        self._metrics.paused_partitions.set(len(assignment))
        retry_after = getattr(exc, "retry_after", None)
        delay = max(retry_after or 0.0, self._backoff * (0.5 + random.random() / 2))
        self._backoff = min(self._backoff * 2, self._config.backoff_max_s)
        self._paused_until = time.monotonic() + delay
        log.warning(
            "%s unavailable (%s): paused %d partitions for %.2fs, batch will be retried",
            dependency,
            exc,
            len(assignment),
            delay,
        )

    def _resume_all(self) -> None:
        consumer = self._require_consumer()
        assignment = consumer.assignment()
        consumer.resume(assignment)
        self._paused_until = None
        self._metrics.paused_partitions.set(0)
        log.info("resumed %d partitions", len(assignment))

    def close(self) -> None:
        """Flush the DLQ producer and leave the group."""
        producer, self._producer = self._producer, None
        if producer is not None:
            producer.flush(10)
        consumer, self._consumer = self._consumer, None
        if consumer is not None:
            consumer.close()

    def _require_consumer(self) -> Consumer:
        if self._consumer is None:
            raise RagstreamError("consumer loop not started")
        return self._consumer

    def _require_producer(self) -> Producer:
        if self._producer is None:
            raise RagstreamError("consumer loop not started")
        return self._producer


def install_signal_handlers(stop: threading.Event) -> None:
    """SIGTERM/SIGINT set `stop`: the loop finishes its batch, commits, and closes."""

    def handler(signum: int, _frame: FrameType | None) -> None:
        log.info(
            "received %s: finishing the current batch, then stopping", signal.strsignal(signum)
        )
        stop.set()

    signal.signal(signal.SIGTERM, handler)
    signal.signal(signal.SIGINT, handler)
