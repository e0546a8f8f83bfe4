"""The ingest consumer: read ahead, apply fairly and out of offset order, commit what is safe.

Two threads share the work (docs/decisions/tenant-fair-ingest.md,
docs/decisions/kafka-client-and-consumer-loop.md):

- the **intake** (the thread that calls `run`) polls, decodes and routes each record, keeps it
  within the read-ahead budget or drops it for a later rescan (`streams.readahead`), queues it
  in the `streams.scheduler.Scheduler`, commits, and serves rebalances. It polls all the time,
  so the group membership survives however long a batch takes (`max.poll.interval.ms`);
- the **apply** thread takes batches from the scheduler (per-key order, barriers, lanes, tenant
  turns), applies them (`RecordHandler.apply`: resolve, decide, embed, write), delivers their
  dead letters, and marks their offsets finished.

Invariants:
- a partition's committed offset is the lowest record not yet finished (applied with every
  write acknowledged by the store, or dead-lettered with the DLQ acknowledging it, or needing no
  work); the finished offsets above it travel in the commit metadata (`streams.offsets`), so a
  restart skips them; metadata that does not fit is cut (those records are redone, never lost);
- the records of one key are applied in offset order; a barrier (TRUNCATE, schema change,
  tenant move) after everything before it in its partition, before everything after it;
- a retryable dependency failure (embedder, store, SoR, DLQ: `RETRYABLE`) finishes nothing: the
  batch goes back to the scheduler and applying pauses for a backoff (honouring retry-after),
  while the intake keeps reading ahead within the budget. Re-processing is safe: writes are
  idempotent;
- anything else the apply raises is fatal: the worker stops and `run` raises (a non-zero exit:
  the data's own failures never get here, the handler dead-letters them);
- revocation happens inside `poll()` on the intake thread: the revoked partitions' queued units
  are dropped, their units in flight are waited for (so no write of this member lands after its
  successor's), their commit points are committed, and their state forgotten;
- no offset ever jumps silently (`auto.offset.reset=error`): a partition the group never read
  starts at its first offset by an explicit assignment, and a committed offset or a fetch
  position that fell out of the log (retention overtook the worker) is logged, counted in
  `ragstream_ingest_offset_gaps_total`, handed to `on_offset_gaps` (the worker reconciles)
  and restarted at the low watermark by an explicit assignment.
"""

from __future__ import annotations

import dataclasses
import logging
import random
import signal
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from types import FrameType
from typing import Any, Generic, Protocol, TypeVar, runtime_checkable

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
from pydantic import BaseModel, ConfigDict, Field, field_validator

from ragcore.errors import (
    ConfigError,
    DeadLetterUnavailableError,
    EmbeddingUnavailableError,
    RagstreamError,
    SorUnavailableError,
    StoreUnavailableError,
)
from ragcore.kafka_config import KafkaSettings
from ragcore.redact import redact_text
from ragcore.tracing import Tracing
from schemas.events import RawRecord
from streams.metrics import IngestMetrics
from streams.offsets import DEFAULT_METADATA_BYTES, CommitPoint, Seen, decode_done
from streams.readahead import ReadAhead, Route
from streams.scheduler import Scheduler, SchedulerConfig, Unit
from streams.scheduler import TopicPartition as Part

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


class TenantSchedule(BaseModel):
    """One tenant's place in the ingest scheduler."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    weight: float = Field(
        default=1.0,
        gt=0,
        le=100,
        description="The tenant's share of each batch relative to others (2: twice a turn).",
    )
    tenant_class: str = Field(
        default="default",
        pattern=r"^[a-z0-9][a-z0-9_-]{0,31}$",
        description="The metrics label of the tenant (backlog and freshness by class).",
    )


class SchedulerSettings(BaseModel):
    """How the worker shares its work between tenants and lanes, and how far it reads ahead
    (docs/decisions/tenant-fair-ingest.md)."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    fair: bool = Field(
        default=True,
        description=(
            "Tenants take turns and live changes go before snapshot and reindex traffic. Off: "
            "one queue in arrival order (per-key order and barriers still hold)."
        ),
    )
    quantum: int = Field(
        default=32, gt=0, description="Units (entities) a tenant of weight 1 gives one batch."
    )
    max_batch_units: int = Field(
        default=64, gt=0, description="Units (entities) one batch applies at most."
    )
    express_units: int = Field(
        default=8,
        ge=0,
        description=(
            "A tenant with at most this many live changes ready is applied in a small batch of "
            "its own while another tenant has a backlog (its changes wait for the batch in "
            "flight only); every other batch is a regular round. 0: off."
        ),
    )
    max_batch_documents: int = Field(
        default=2,
        gt=0,
        description=(
            "Entities of document tables one batch applies at most (each may fetch and extract "
            "a file of up to its table's document.max_bytes)."
        ),
    )
    read_ahead_records: int = Field(
        default=20_000, gt=0, description="Records the worker holds fetched and not finished."
    )
    read_ahead_bytes: int = Field(
        default=256 * 1024 * 1024,
        gt=0,
        description=(
            "Bytes (record keys and values) the worker holds fetched and not finished; the "
            "process holds about 2-3x this in memory for them (decoded rows, planned entities)."
        ),
    )
    tenant_share: float = Field(
        default=0.5,
        gt=0,
        le=1,
        description=(
            "The share of the read-ahead budget one tenant may hold; its further records are "
            "fetched again later (a rescan), so the other tenants' changes always find room."
        ),
    )
    rescan_reader: bool = Field(
        default=True,
        description=(
            "A rescan (records dropped for room, fetched again) is re-read by a second, "
            "group-less Kafka client while the group's consumer goes on at the head, so a quiet "
            "tenant's change waits for no re-read. Off: the consumer seeks back for it."
        ),
    )
    rescan_slice_records: int = Field(
        default=200,
        gt=0,
        description=(
            "Records the intake takes from the rescan reader at a time, between two polls of "
            "the head, once a tenant it re-reads has room for them: the re-reading keeps pace "
            "with the applying, and a change at the head waits for at most one slice."
        ),
    )
    tenants: dict[str, TenantSchedule] = Field(
        default_factory=dict,
        description=(
            'Weight and class per tenant (JSON object), e.g. {"globex": {"weight": 0.5, '
            '"tenant_class": "bulk"}}; others: weight 1, class default.'
        ),
    )
    commit_interval_ms: int = Field(
        default=200, ge=0, description="How often the worker commits what it finished."
    )
    max_metadata_bytes: int = Field(
        default=DEFAULT_METADATA_BYTES,
        ge=0,
        le=1_000_000,
        description=(
            "Commit metadata (finished offsets above the committed one) kept within this "
            "(Kafka's offset.metadata.max.bytes is 4096); what does not fit is redone after a "
            "restart. 0: no metadata."
        ),
    )
    redo_hold_s: float = Field(
        default=10.0,
        ge=0,
        description=(
            "After an assignment, how long at most the worker reads a partition's records from "
            "its committed offset to the end it had then before applying any (what an earlier "
            "owner may have applied is redone: reading it first lets a redone insert meet the "
            "delete after it, so a deleted entity is not indexed again). 0: no hold."
        ),
    )
    revoke_wait_s: float = Field(
        default=60.0,
        gt=0,
        description=(
            "How long a revocation waits for the revoked partitions' batch in flight to be "
            "applied before it lets the partitions go (keep below max_poll_interval_ms)."
        ),
    )

    @field_validator("tenants")
    @classmethod
    def _tenant_names(cls, value: dict[str, TenantSchedule]) -> dict[str, TenantSchedule]:
        from ragcore.store.ids import TenantId  # noqa: PLC0415 - a settings-time check

        for name in value:
            TenantId(name)
        return value

    def scheduler_config(self) -> SchedulerConfig:
        """The scheduler's own form of these settings."""
        return SchedulerConfig(
            fair=self.fair,
            quantum=self.quantum,
            max_batch_units=self.max_batch_units,
            max_batch_heavy=self.max_batch_documents,
            express_units=self.express_units,
            weights={t: s.weight for t, s in self.tenants.items()},
            classes={t: s.tenant_class for t, s in self.tenants.items()},
            max_records=self.read_ahead_records,
            max_bytes=self.read_ahead_bytes,
            tenant_share=self.tenant_share,
        )


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
    scheduler: SchedulerSettings = Field(default_factory=SchedulerSettings)
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
    """Processes one batch of records in offset order; must be idempotent (the simple form of
    a handler: tests and tools; `BatchAdapter` runs it under the consumer loop).

    Returns the records to dead-letter. Raises an error from `RETRYABLE` when a dependency is
    overloaded (the whole batch is retried later) and any other exception for a fatal condition.
    """

    def handle(self, records: Sequence[RawRecord]) -> Sequence[DeadLetter]:
        """Process `records`; everything not returned as a dead letter is durably applied."""
        ...


P = TypeVar("P")


@dataclass(frozen=True, slots=True)
class Routed(Generic[P]):
    """A decoded record's place in the scheduler (`route`) and how to plan it (`plan`: called
    only when the record is kept; None from it means the record needs no work)."""

    route: Route
    plan: Callable[[], P | None]


@runtime_checkable
class RecordHandler(Protocol[P]):
    """What the consumer loop asks of the ingest handler (`streams.ingest.IngestHandler`)."""

    def route(self, record: RawRecord) -> Routed[P] | None:
        """Decode `record` and say where it goes; None when it needs no work (a heartbeat, a
        tombstone). Never raises for the record's content: a bad record routes to a dead
        letter."""
        ...

    def merge(self, earlier: P, later: P) -> P | None:
        """One payload for two queued units of one key (the later supersedes), or None."""
        ...

    def heavy(self, payload: P) -> bool:
        """Whether the payload is costly to apply (a document): few of them go in a batch."""
        ...

    def apply(self, payloads: Sequence[P]) -> Sequence[DeadLetter]:
        """Apply a batch; return its dead letters. Raises an error from `RETRYABLE` when a
        dependency is overloaded or unreachable (nothing of the batch counts as applied)."""
        ...


class BatchAdapter:
    """A `RecordHandler` over a `BatchHandler`: every record is its own unit, of no tenant and
    no key, applied in arrival order (tests and tools that handle raw records)."""

    def __init__(self, handler: BatchHandler) -> None:
        self.handler = handler

    def route(self, record: RawRecord) -> Routed[list[RawRecord]]:
        """Every record is work, in one lane."""
        return Routed(Route(""), lambda: [record])

    def merge(self, earlier: list[RawRecord], later: list[RawRecord]) -> None:
        """Never merged."""
        return None

    def heavy(self, payload: list[RawRecord]) -> bool:
        """Nothing is heavy."""
        return False

    def apply(self, payloads: Sequence[list[RawRecord]]) -> Sequence[DeadLetter]:
        """The batch's records, in arrival order, to the batch handler."""
        return self.handler.handle([r for p in payloads for r in p])


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


def dlq_headers(letter: DeadLetter, truncated: bool) -> list[tuple[str, str | bytes | None]]:
    """Headers of a DLQ record: where it came from and why it is there."""
    rec = letter.record
    fields = {
        "error.code": letter.code,
        # a document URL's userinfo or presigned query, a DSN's password: never in a header
        "error.message": redact_text(letter.message)[:2000],
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
    # a value that is no valid UTF-8 text (a lone surrogate from a JSON escape in the row) is
    # written escaped: a header never fails the letter that explains it
    own: list[tuple[str, str | bytes | None]] = [
        (DLQ_HEADER_PREFIX + k, v.encode("utf-8", "backslashreplace")) for k, v in fields.items()
    ]
    original: list[tuple[str, str | bytes | None]] = [(k, v) for k, v in rec.headers]
    return own + original


class RescanReader:
    """The second, group-less Kafka client that re-reads the records a partition dropped for
    room (a rescan) from where they begin, while the group's consumer goes on at the head: a
    change there waits for no re-read (docs/decisions/tenant-fair-ingest.md). Made at its
    first rescan; only the intake thread calls it."""

    def __init__(self, config: Callable[[], dict[str, Any]]) -> None:
        self._config = config
        self._consumer: Consumer | None = None
        self._reading: set[Part] = set()

    @property
    def active(self) -> bool:
        """Whether a rescan is being re-read."""
        return bool(self._reading)

    def start(self, tp: Part, offset: int) -> None:
        """Re-read `tp` from `offset` (a rescan of it in progress is given up for this one)."""
        if self._consumer is None:
            self._consumer = Consumer(self._config())
        if tp in self._reading:
            self._consumer.incremental_unassign([TopicPartition(*tp)])
        self._consumer.incremental_assign([TopicPartition(tp[0], tp[1], offset)])
        self._reading.add(tp)

    def stop(self, tps: Sequence[Part]) -> None:
        """Stop re-reading `tps` (what it fetched of them and was not taken is discarded)."""
        gone = [tp for tp in tps if tp in self._reading]
        if gone and self._consumer is not None:
            self._consumer.incremental_unassign([TopicPartition(*tp) for tp in gone])
        self._reading.difference_update(gone)

    def fetch(self, limit: int, timeout_s: float) -> list[Message]:
        """Up to `limit` records (or error events) already fetched, waiting up to
        `timeout_s` for the first."""
        if self._consumer is None or not self._reading:
            return []
        return self._consumer.consume(limit, timeout_s)

    def close(self) -> None:
        """Close the client (it holds no group membership and no offsets)."""
        consumer, self._consumer = self._consumer, None
        self._reading.clear()
        if consumer is not None:
            consumer.close()


class ConsumerLoop:
    """Runs the ingest consumer group until `stop` is set (see the module docstring)."""

    def __init__(
        self,
        kafka: KafkaSettings,
        config: ConsumerConfig,
        handler: RecordHandler[Any] | BatchHandler,
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
        self._handler: RecordHandler[Any] = (
            handler if isinstance(handler, RecordHandler) else BatchAdapter(handler)
        )
        self._metrics = metrics
        self._sleep = sleep
        self._consumer: Consumer | None = None
        self._producer: Producer | None = None
        schedule = config.scheduler
        self.scheduler: Scheduler[Any] = Scheduler(
            schedule.scheduler_config(),
            self._handler.merge,
            heavy=lambda unit: self._handler.heavy(unit.payload),
        )
        self.readahead = ReadAhead(
            self.scheduler,
            max_metadata_bytes=schedule.max_metadata_bytes,
            reader=schedule.rescan_reader,
            reread_slice=schedule.rescan_slice_records,
        )
        self._reader = RescanReader(self._reader_config)
        #: the end of a backoff (set by the apply thread, honoured by both)
        self._paused_until: float | None = None
        self._budget_paused = False
        self._paused = False
        self._backoff = config.backoff_initial_s
        self._assigned: set[Part] = set()
        # lag bookkeeping: the group's committed offset and the last high watermark per partition
        self._committed: dict[Part, int] = {}
        self._high: dict[Part, int] = {}
        self._lag_due = 0.0
        self._commit_due = 0.0
        #: per assigned partition, where its fetch stands (or a logical offset: OFFSET_BEGINNING,
        #: OFFSET_INVALID for the group's committed offset); re-assigning a partition whose
        #: fetch stopped restarts every other partition from here (eager)
        self._positions: dict[Part, int] = {}
        #: partitions whose fetch stopped on an offset reset, with librdkafka's fetch position
        #: (None: no committed offset), waiting for `_restart_stopped`
        self._stopped: dict[Part, int | None] = {}
        #: the highest offset the commit metadata read at assignment names finished (redo count)
        self._done_before_max: dict[Part, int] = {}
        self._cooperative = all(
            s.strip() == "cooperative-sticky" for s in config.assignment_strategy.split(",")
        )
        #: what ended the apply thread, re-raised by `run`
        self._failure: BaseException | None = None
        metrics.read_ahead.observe(self.scheduler, self.readahead)
        metrics.backlog.source(self._oldest_pending)

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

    def _reader_config(self) -> dict[str, Any]:
        c = self._config
        return {
            **self._kafka.client_config(),
            # never joins the group (it only assigns) and never commits: the id is librdkafka's
            # requirement, not a membership
            "group.id": f"{c.group_id}.rescan",
            "enable.auto.commit": False,
            "enable.auto.offset.store": False,
            "auto.offset.reset": "error",
            "queued.max.messages.kbytes": max(1024, c.queued_max_messages_kbytes // 4),
            "fetch.wait.max.ms": c.fetch_wait_max_ms,
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

    @property
    def failure(self) -> BaseException | None:
        """What stopped the apply thread, if anything did."""
        return self._failure

    # --- rebalances -------------------------------------------------------------------------

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
        if self._paused:
            consumer.pause([TopicPartition(t, p) for (t, p) in starts])

    def start_offsets(self, consumer: Consumer, partitions: Sequence[Part]) -> dict[Part, int]:
        """Where each newly assigned partition starts, from the group's committed offset and
        the partition's watermarks: OFFSET_BEGINNING where the group never committed (a new
        group reads everything); the low watermark where the committed offset is out of range
        (each such gap is logged as an ERROR naming the lost offsets, counted in
        `ragstream_ingest_offset_gaps_total` and handed to `on_offset_gaps`); otherwise the
        committed offset (OFFSET_INVALID), whose commit metadata names the offsets above it
        an earlier owner finished (skipped when fetched again). Sets up each partition's
        read-ahead state and records the positions for `_restart_stopped`.

        When the broker does not answer, every partition starts at its committed offset and
        librdkafka's error event for one without (or out of range) does the rest."""
        timeout = self._config.lag_query_timeout_s
        starts = {tp: OFFSET_INVALID for tp in partitions}
        positions = dict(starts)
        states: dict[Part, tuple[int | None, list[int]]] = {tp: (None, []) for tp in partitions}
        #: each partition's end at the assignment: its redo is read before anything is applied
        ends: dict[Part, int] = {}
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
                ends[key] = marks[1]
                gap = offset_gap(
                    tp.topic,
                    tp.partition,
                    tp.offset,
                    *marks,
                    slack=self._config.high_watermark_slack,
                )
                if gap is None:
                    positions[key] = tp.offset
                    done = decode_done(tp.offset, tp.metadata)
                    states[key] = (tp.offset, done)
                    self._committed[key] = tp.offset
                else:
                    gaps.append(gap)
                    starts[key] = positions[key] = gap.low
                    states[key] = (gap.low, [])
        except KafkaException as exc:
            log.error(
                "cannot compare the committed offsets of %s with their watermarks (%s): "
                "starting at the committed offsets; one out of range is reported when its "
                "fetch fails",
                list(partitions),
                exc,
            )
            starts = {tp: OFFSET_INVALID for tp in partitions}
            states = {tp: (None, []) for tp in partitions}
            positions = dict(starts)
        for part, (start, done) in states.items():
            hold = ends.get(part) if self._config.scheduler.redo_hold_s > 0 else None
            self.readahead.assign(part, start, done, hold_until=hold)
            if self.readahead.holding(part):
                self.scheduler.hold(part)
            if done:
                self._done_before_max[part] = max(done)
                log.info(
                    "%s[%d]: the commit metadata names %d offsets above %s finished by an "
                    "earlier owner: skipped when fetched again",
                    *part,
                    len(done),
                    start,
                )
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
        """Let partitions go: drop their queued work, wait for their batch in flight (so that
        none of this member's writes lands after its successor's), commit what they finished."""
        revoked = [(p.topic, p.partition) for p in partitions]
        in_flight = self.scheduler.revoke(revoked)
        wait = self._config.scheduler.revoke_wait_s if self._failure is None else 0.0
        if in_flight and not self.scheduler.wait_idle(in_flight, wait):
            log.error(
                "revoking %s: its batch in flight did not finish within %.0f s; the partitions "
                "go to their next owner anyway (its writes may race this one's: the version "
                "rule keeps the newer row, reconcile repairs the rest)",
                revoked,
                wait,
            )
        self._commit(force=True, only=set(revoked))
        self._reader.stop(revoked)
        self._assigned.difference_update(revoked)
        for tp in revoked:
            self.readahead.revoke(tp)
            self._committed.pop(tp, None)
            self._high.pop(tp, None)
            self._positions.pop(tp, None)
            self._stopped.pop(tp, None)
            self._done_before_max.pop(tp, None)
        self._metrics.backlog.forget(revoked)
        self._metrics.assigned_partitions.set(len(self._assigned))
        log.info("revoked %s", revoked)

    # --- the loop ---------------------------------------------------------------------------

    def run(self, stop: threading.Event) -> None:
        """Consume until `stop` is set, then finish the batch in flight, commit and close.
        Raises (after closing) when the apply thread failed: the worker must not live on
        without its processing loop."""
        if self._consumer is None:
            self.start()
        appliers = [
            threading.Thread(
                target=self._apply_forever, args=(stop,), name="ingest-apply", daemon=True
            )
        ]
        schedule = self._config.scheduler
        if schedule.fair and schedule.express_units > 0:
            # a second thread for the quiet tenants' changes, so that they wait neither for a
            # backlog's batch in flight nor for a share of the next one
            appliers.append(
                threading.Thread(
                    target=self._apply_forever,
                    args=(stop,),
                    kwargs={"express": True},
                    name="ingest-express",
                    daemon=True,
                )
            )
        for applier in appliers:
            applier.start()
        try:
            while not stop.is_set():
                self._intake_once()
        finally:
            stop.set()
            self.scheduler.close()
            for applier in appliers:
                applier.join()
            try:
                self._commit(force=True)
            finally:
                self.close()
        if self._failure is not None:
            raise RagstreamError(
                f"the ingest apply loop stopped: {type(self._failure).__name__}: {self._failure}"
            ) from self._failure

    def run_once(self) -> int:
        """One intake and one apply cycle in the calling thread (tests and tools), then a
        commit; returns the number of records applied."""
        self._intake_once()
        wait = self._config.catch_up_wait_ms / 1000
        if wait and self._behind_ready():
            deadline = time.monotonic() + wait
            while (
                self.scheduler.ready_units() < self._config.scheduler.max_batch_units
                and time.monotonic() < deadline
            ):
                self._intake_once()
            self._metrics.catch_up_batches.inc()
        handled = 0
        if self._paused_until is None or time.monotonic() >= self._paused_until:
            handled = self._apply_once(0)
        self._commit(force=True)
        return handled

    def _apply_forever(self, stop: threading.Event, *, express: bool = False) -> None:
        """An apply thread: batches until stopped (`express`: only the quiet tenants' small
        ones); a failure that is not an outage stops the worker (`run` raises it)."""
        beat = self._metrics.loop_heartbeat.labels("express" if express else "apply")
        try:
            while not stop.is_set():
                beat.set(time.time())
                until = self._paused_until
                if until is not None and (left := until - time.monotonic()) > 0:
                    stop.wait(left)
                    continue
                if not express:
                    self._catch_up(stop)
                self._apply_once(0.2, express=express)
        except BaseException as exc:
            self._failure = exc
            log.critical(
                "the ingest apply loop failed (%s: %s): stopping the worker",
                type(exc).__name__,
                exc,
                exc_info=exc,
            )
            stop.set()

    def _catch_up(self, stop: threading.Event) -> None:
        """While behind, wait up to `catch_up_wait_ms` for a fuller batch (a remote embedder
        whose call costs far more than its texts); a unit that is not behind is never held."""
        wait = self._config.catch_up_wait_ms / 1000
        if not wait or not self._behind_ready():
            return
        deadline = time.monotonic() + wait
        while (
            self.scheduler.ready_units() < self._config.scheduler.max_batch_units
            and (left := deadline - time.monotonic()) > 0
            and not stop.wait(min(left, 0.02))
        ):
            pass
        self._metrics.catch_up_batches.inc()

    def _behind_ready(self) -> bool:
        oldest = self.scheduler.oldest_ready_ms()
        return oldest is not None and time.time() * 1000 - oldest > self._config.behind_ms

    def _intake_once(self) -> None:
        """One intake cycle: pause or resume, rescans, poll, route and keep, restart stopped
        partitions, commit when due."""
        consumer = self._require_consumer()
        self._metrics.loop_heartbeat.labels("intake").set(time.time())
        self._pause_or_resume(consumer)
        if time.monotonic() >= self._lag_due:
            self.refresh_lag()
        held = self.scheduler.held_partitions()
        if held:
            for position in consumer.position([TopicPartition(t, p) for t, p in held]):
                if position.offset >= 0:
                    self.readahead.fetched((position.topic, position.partition), position.offset)
        for tp in self.readahead.releasable(self._config.scheduler.redo_hold_s):
            self.scheduler.release(tp)
        for tp, offset in self.readahead.due_rescans():
            self._metrics.rescans.inc()
            if self.readahead.reader_rescan(tp):
                self._reader.start(tp, offset)
                log.info("%s[%d]: re-reading from %d (records dropped for room)", *tp, offset)
                continue
            log.info("%s[%d]: fetching again from %d (records dropped for room)", *tp, offset)
            try:
                if tp not in self._stopped:
                    consumer.seek(TopicPartition(tp[0], tp[1], offset))
                    continue
            except KafkaException as exc:
                # its fetch stopped (an out-of-range event not taken yet): restarted below
                log.info("%s[%d]: cannot seek (%s): restarting its fetch", *tp, exc)
            self._stopped[tp] = offset
        reread = self._reread_due()
        msgs = self._fetch(consumer, wait=not reread)
        for msg in msgs:
            err = msg.error()
            if err is None:
                self._take(to_raw(msg))
            elif err.code() == KafkaError._PARTITION_EOF:
                continue
            elif err.code() == KafkaError._AUTO_OFFSET_RESET:
                # the partition's fetch stopped: its offset is out of range (retention
                # overtook the worker) or it has none; restarted below
                topic, partition = msg.topic(), msg.partition()
                if topic is None or partition is None:
                    raise RagstreamError(f"an offset reset without a partition: {err}")
                log.info("fetch of %s[%d] stopped: %s", topic, partition, err.str())
                self._stopped[(topic, partition)] = msg.offset()
            elif err.fatal():
                raise RagstreamError(f"fatal Kafka consumer error: {err}")
            else:
                log.warning("consumer error (retried by librdkafka): %s", err)
        if reread:
            self._reread()
        for tp, offset in self.readahead.due_cuts():
            # what the rescan has yet to re-read would all be dropped again: back to the head
            if tp in self._assigned and tp not in self._stopped:
                consumer.seek(TopicPartition(tp[0], tp[1], offset))
                log.debug("%s[%d]: rescan stopped, fetching on from %d", *tp, offset)
        self._reader.stop(self.readahead.rescans_over())
        if self._stopped:
            self._restart_stopped(consumer)
        self._pause_or_resume(consumer)  # at once: what librdkafka prefetches would be dropped
        self._commit()

    def _reread_due(self) -> bool:
        """Whether the rescan reader's next slice is taken this cycle: while it re-reads and
        a tenant ahead of it has room for a slice (`ReadAhead.reread_room`)."""
        return self._reader.active and self.readahead.reread_room()

    def _reread(self) -> None:
        """A slice of what the rescan reader fetched. A partition it cannot fetch (its offset
        fell out of the log) goes back to rescans by the group's consumer, whose error
        handling reports the gap."""
        for msg in self._reader.fetch(self._config.scheduler.rescan_slice_records, 0.02):
            err = msg.error()
            if err is None:
                self._take(to_raw(msg), reread=True)
                continue
            topic, partition = msg.topic(), msg.partition()
            if err.code() == KafkaError._PARTITION_EOF:
                continue
            if err.fatal():
                raise RagstreamError(f"fatal Kafka error of the rescan reader: {err}")
            reset = err.code() == KafkaError._AUTO_OFFSET_RESET
            if reset and topic is not None and partition is not None:
                log.warning(
                    "%s[%d]: the rescan reader cannot fetch its records (%s): the consumer "
                    "fetches them again itself",
                    topic,
                    partition,
                    err.str(),
                )
                self.readahead.abandon_rescan((topic, partition))
            else:
                log.warning("rescan reader error (retried by librdkafka): %s", err)

    def _fetch(self, consumer: Consumer, *, wait: bool = True) -> list[Message]:
        """What is fetched: waits for the first record (briefly while work is pending, so that
        commits follow the apply thread closely; not at all without `wait`: the rescan
        reader's slice waits instead), then takes what is already there."""
        busy = self.scheduler.pending() > 0 or self._paused
        wait_s = 0.0 if not wait else 0.05 if busy else self._config.poll_timeout_s
        first = consumer.poll(wait_s)
        if first is None:
            return []
        limit = self._config.max_batch_records
        return [first, *consumer.consume(limit - 1, 0)] if limit > 1 else [first]

    def _take(self, rec: RawRecord, *, reread: bool = False) -> None:
        """One fetched record (`reread`: by the rescan reader): skipped when already handled,
        else routed, kept within the read-ahead budget (or dropped for a rescan), planned and
        queued."""
        tp = (rec.topic, rec.partition)
        seen = self.readahead.classify(tp, rec.offset, reread=reread)
        if seen is None or seen is Seen.DUPLICATE:
            return
        if seen is Seen.DONE_BEFORE:
            self._metrics.restart_records.labels("skipped").inc()
            return
        if self.readahead.known_drop(tp, rec.offset):
            self._metrics.read_ahead_dropped.inc()
            return
        if rec.offset <= self._done_before_max.get(tp, -1):
            self._metrics.restart_records.labels("redone").inc()
        routed = self._handler.route(rec)
        if routed is None:
            self.readahead.skip(tp, rec.offset)
            return
        nbytes = len(rec.key or b"") + len(rec.value or b"")
        route = routed.route
        if not self.readahead.decide(tp, rec.offset, route, nbytes, rec.timestamp_ms):
            self._metrics.read_ahead_dropped.inc()
            return
        payload = routed.plan()
        if payload is None:
            self.readahead.finish(tp, [rec.offset])
            return
        unit = Unit(
            tp,
            [rec.offset],
            route.key,
            route.tenant,
            route.lane,
            payload,
            nbytes,
            route.barrier,
            rec.timestamp_ms,
        )
        self.scheduler.add(unit)

    def _apply_once(self, wait_s: float, *, express: bool = False) -> int:
        """Take one batch, apply it, deliver its dead letters and finish its offsets; 0 when
        nothing was ready or the batch went back for a retry."""
        batch = self.scheduler.take(wait_s, express=express)
        if not batch:
            return 0
        records = sum(unit.records for unit in batch)
        self._metrics.batch_size.observe(records)
        with self._tracing.span("ingest.batch", self._batch_attributes(batch)) as span:
            try:
                letters = self._handler.apply([unit.payload for unit in batch])
                self._dead_letter(letters)
            except RETRYABLE as exc:
                self.scheduler.requeue(batch)
                self._back_off(exc)
                if span is not None:
                    span.set_attribute("ragstream.outcome", "retried")
                return 0
            except BaseException:
                # fatal: nothing of the batch is applied or finished; it is no longer in flight
                # (a revocation on the way out must not wait for it)
                self.scheduler.requeue(batch)
                raise
            if span is not None:
                span.set_attribute("ragstream.outcome", "applied")
        for unit in batch:
            self.readahead.finish(unit.partition, unit.offsets)
        self.scheduler.complete(batch)
        self._backoff = self._config.backoff_initial_s
        return records

    def _batch_attributes(self, batch: Sequence[Unit[Any]]) -> dict[str, str | int]:
        """The batch span's attributes (OpenTelemetry messaging conventions)."""
        if not self._tracing.enabled:
            return {}
        return {
            "messaging.system": "kafka",
            "messaging.operation.type": "process",
            "messaging.consumer.group.name": self._config.group_id,
            "messaging.batch.message_count": sum(u.records for u in batch),
            "ragstream.partitions": len({u.partition for u in batch}),
            "ragstream.tenants": len({u.tenant for u in batch}),
        }

    # --- pausing ----------------------------------------------------------------------------

    def _pause_or_resume(self, consumer: Consumer) -> None:
        """Fetching pauses while the read-ahead budget is full (records fetched then would only
        be dropped) and resumes below 90% of it. A backoff does not pause it: the worker reads
        ahead during an outage (within the budget), so its backlog metrics see every waiting
        change and the work starts at once when the dependency is back."""
        now = time.monotonic()
        if self._paused_until is not None and now >= self._paused_until:
            self._paused_until = None
        if self._budget_paused:
            self._budget_paused = self.scheduler.full(0.9)
        else:
            self._budget_paused = self.scheduler.full()
        want = self._budget_paused
        if want == self._paused:
            return
        assignment = consumer.assignment()
        if want:
            consumer.pause(assignment)
            self._metrics.paused_partitions.set(len(assignment))
            log.info("paused %d partitions (read-ahead budget full)", len(assignment))
        else:
            consumer.resume(assignment)
            self._metrics.paused_partitions.set(0)
            log.info("resumed %d partitions", len(assignment))
        self._paused = want

    def _back_off(self, exc: RagstreamError) -> None:
        """A dependency is overloaded or unreachable: pause for a backoff (its retry-after
        hint at least), doubling up to `backoff_max_s`."""
        dependency = dependency_of(exc)
        self._metrics.backpressure.labels(dependency).inc()
        retry_after = getattr(exc, "retry_after", None)
        delay = max(retry_after or 0.0, self._backoff * (0.5 + random.random() / 2))
        self._backoff = min(self._backoff * 2, self._config.backoff_max_s)
        self._paused_until = time.monotonic() + delay
        log.warning(
            "%s unavailable (%s): applying paused for %.2fs, the batch will be retried",
            dependency,
            exc,
            delay,
        )

    # --- offsets ----------------------------------------------------------------------------

    def _commit(self, *, force: bool = False, only: set[Part] | None = None) -> None:
        """Commit every partition's commit point that moved (at most every
        `scheduler.commit_interval_ms` unless forced)."""
        now = time.monotonic()
        if not force and now < self._commit_due:
            return
        self._commit_due = now + self._config.scheduler.commit_interval_ms / 1000
        consumer = self._consumer
        if consumer is None:
            return
        points = {
            tp: point
            for tp, point in self.readahead.commit_points().items()
            if (only is None or tp in only) and tp not in self._stopped
        }
        if not points:
            return
        offsets = [
            TopicPartition(t, p, point.offset, metadata=point.metadata)
            for (t, p), point in points.items()
        ]
        started = time.perf_counter()
        try:
            consumer.commit(offsets=offsets, asynchronous=False)
        except KafkaException as exc:
            # retried at the next cycle; a commit lost to a rebalance is safe: the next owner
            # re-processes idempotently
            log.warning("offset commit failed (retried): %s", exc)
            return
        self._committed_points(points, time.perf_counter() - started)

    def _committed_points(self, points: dict[Part, CommitPoint], seconds: float) -> None:
        self.readahead.committed(points)
        self._metrics.stage_seconds.labels("commit").observe(seconds)
        self._metrics.last_commit_timestamp.set(time.time())
        for tp, point in points.items():
            topic, partition = tp
            self._metrics.committed_offset.labels(topic, str(partition)).set(point.offset)
            if point.dropped:
                self._metrics.metadata_cut.inc(point.dropped)
            self._committed[tp] = point.offset
            high = self._high.get(tp)
            self._metrics.backlog.applied(tp, None if high is None else high - point.offset)

    def _oldest_pending(self) -> dict[Part, int]:
        """The broker timestamp of the oldest record not finished, per partition."""
        return self.scheduler.oldest_by_partition(self.readahead.dropped_oldest())

    def _restart_stopped(self, consumer: Consumer) -> None:
        """Restart the partitions whose fetch stopped on an offset reset. One without a
        committed offset (the watermark check at assignment did not answer) starts at its first
        offset; one whose position fell out of the log is a gap like those found at assignment
        (logged with the lost offsets, counted, handed to `on_offset_gaps`) and restarts at the
        low watermark. librdkafka cannot seek a stopped partition, so it is assigned again. A
        broker that does not answer the watermark query leaves it stopped until the next
        cycle."""
        for tp in [tp for tp in self._stopped if tp not in self._assigned]:
            del self._stopped[tp]  # revoked meanwhile: its new owner starts it
        timeout = self._config.lag_query_timeout_s
        starts: dict[Part, int] = {}
        gaps: list[OffsetGap] = []
        for (topic, partition), fetch_at in sorted(self._stopped.items()):
            # where the fetch stood when it stopped (a rescan may have moved it back), else
            # where the loop knows it to be
            position = (
                fetch_at
                if fetch_at is not None and fetch_at >= 0
                else self._position((topic, partition))
            )
            # what it dropped for room and has yet to fetch again lies below: lost as well
            refetch = self.readahead.refetch_from((topic, partition))
            if position is not None and position >= 0 and refetch is not None:
                position = min(position, refetch)
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
                self.readahead.skip_to((topic, partition), gap.low)
        if not starts:
            return
        self._reassign(consumer, starts)
        for tp in starts:
            self._stopped.pop(tp, None)
        self._report_gaps(gaps)

    def _position(self, tp: Part) -> int:
        """Where the partition's fetch stands: one past the last offset seen, else the start
        it was assigned at (possibly logical)."""
        seen = self.readahead.position(tp)
        return seen if seen is not None else self._positions.get(tp, OFFSET_INVALID)

    def _reassign(self, consumer: Consumer, starts: dict[Part, int]) -> None:
        """Assign stopped partitions again at `starts` (cooperative: those alone; eager: the
        whole assignment, every other partition where its fetch stands, except those still
        stopped), keeping the loop's pause in force."""
        self._positions.update(starts)
        if self._cooperative:
            consumer.incremental_unassign([TopicPartition(t, p) for t, p in starts])
            restarted = [TopicPartition(t, p, o) for (t, p), o in starts.items()]
            consumer.incremental_assign(restarted)
        else:
            restarted = [
                TopicPartition(t, p, starts[(t, p)] if (t, p) in starts else self._position((t, p)))
                for t, p in sorted(self._assigned)
                if (t, p) in starts or (t, p) not in self._stopped
            ]
            consumer.assign(restarted)
        if self._paused:
            consumer.pause([TopicPartition(tp.topic, tp.partition) for tp in restarted])
        log.info("restarted %s", sorted(starts.items()))

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
            lags: dict[Part, int] = {}
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

    # --- dead letters -----------------------------------------------------------------------

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
            self._produce_letter(producer, letter, on_delivery)
            self._metrics.dlq.labels(letter.code).inc()
            log.warning(
                "DLQ %s[%d]@%d %s: %s",
                letter.record.topic,
                letter.record.partition,
                letter.record.offset,
                letter.code,
                redact_text(letter.message)[:300],
            )
        remaining = producer.flush(30)
        self._metrics.stage_seconds.labels("dlq").observe(time.perf_counter() - started)
        if remaining or failures:
            # Not delivered: the batch is retried rather than finished past a lost record.
            raise DeadLetterUnavailableError(
                f"DLQ delivery to {self._config.dlq_topic} failed ({remaining} undelivered): "
                f"{failures[:3]}"
            )

    def _produce_letter(
        self,
        producer: Producer,
        letter: DeadLetter,
        on_delivery: Callable[[KafkaError | None, Message], None],
    ) -> None:
        """Queue one letter: its value cut at `dlq_max_value_bytes` (and its key, past an
        eighth of it: a letter must fit the broker's message size whatever the record held);
        a letter the client still refuses as too large goes without its value and original
        headers. A full local queue is flushed once, then is an outage of the DLQ."""
        limit = self._config.dlq_max_value_bytes
        value, key = letter.record.value, letter.record.key
        truncated = value is not None and len(value) > limit
        if truncated and value is not None:
            value = value[:limit]
        if key is not None and len(key) > limit // 8:
            key = key[: limit // 8]
            letter = dataclasses.replace(letter, message=f"(key cut) {letter.message}")
        headers = dlq_headers(letter, truncated)
        for attempt in range(2):
            try:
                producer.produce(
                    self._config.dlq_topic,
                    key=key,
                    value=value,
                    headers=headers,
                    on_delivery=on_delivery,
                )
                return
            except BufferError:
                if attempt:
                    raise DeadLetterUnavailableError(
                        f"the DLQ producer's queue stays full ({self._config.dlq_topic})"
                    ) from None
                producer.flush(5)
            except KafkaException as exc:
                if exc.args[0].code() != KafkaError.MSG_SIZE_TOO_LARGE or attempt:
                    raise DeadLetterUnavailableError(
                        f"DLQ produce to {self._config.dlq_topic} failed: {exc}"
                    ) from exc
                # the record's own headers or key made it too large: the letter says so
                value = None
                headers = [h for h in headers if h[0].startswith(DLQ_HEADER_PREFIX)]
                headers.append((DLQ_HEADER_PREFIX + "value.dropped", b"too large for the DLQ"))

    def close(self) -> None:
        """Flush the DLQ producer and leave the group."""
        producer, self._producer = self._producer, None
        if producer is not None:
            producer.flush(10)
        consumer, self._consumer = self._consumer, None
        if consumer is not None:
            consumer.close()
        self._reader.close()

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
