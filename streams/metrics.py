"""Prometheus metrics of the ingest worker, built on an injected registry (never the global one
at import time), so tests can read them with `registry.get_sample_value`."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterable, Iterator, Mapping
from typing import Any

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram
from prometheus_client.core import GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from ragcore.documents import REASONS

#: Stage latencies are short except embedding; buckets cover 0.5 ms .. 60 s.
_STAGE_BUCKETS = (
    0.0005,
    0.001,
    0.0025,
    0.005,
    0.01,
    0.025,
    0.05,
    0.1,
    0.25,
    0.5,
    1,
    2.5,
    5,
    10,
    30,
    60,
)
#: DLQ error codes exported at 0 from the start: `increase()` sees no increase in the first
#: samples of a new series, so without them the first burst of a code would not fire
#: RagstreamIngestDLQSpike. Codes outside this list (policy rejections) start at first use.
DLQ_CODES = (
    "DECODE_ERROR",
    "LOGICAL_TYPE_ERROR",
    "UNSUPPORTED_OP",
    "MAPPING_ERROR",
    "SCHEMA_DRIFT",
    "SOR_ROW_UNREADABLE",  # a re-read SoR row whose content cannot be mapped
    "SOR_TABLE_UNREADABLE",  # a re-read whose table the SoR cannot read (permissions, schema)
    "CONTENT_UNAVAILABLE",  # a TOAST placeholder or reindex request with no SoR to re-read
    "INVALID_TENANT",
    "RECORD_TOO_LARGE",
    "CHUNKING_ERROR",
    "BAD_REINDEX_REQUEST",
    # a typed error a write stage raised for one entity's data (not an outage): its own code
    "EMBEDDING_FAILED",
    "EMBEDDING_DIMENSION_MISMATCH",
    "STORE_ERROR",
    "INDEX_NOT_FOUND",
    "MANIFEST_MISMATCH",
    "RECORD_UNPROCESSABLE",
    *REASONS,  # documents that yield no text (ragcore.documents)
)
#: The lanes of the ingest scheduler (`streams.scheduler.Lane` labels), exported from the start.
LANES = ("live", "bulk", "reindex")
#: The `dependency` of `ragstream_ingest_backpressure_total` (`streams.consumer.DEPENDENCY`),
#: exported at 0 from the start: a healthy worker's dashboard shows none, not "no data".
DEPENDENCIES = ("embedder", "store", "sor", "dlq")
_FRESHNESS_BUCKETS = (0.1, 0.25, 0.5, 1, 2, 3, 5, 10, 30, 60, 120, 300, 900, 3600)


class IngestMetrics:
    """Every metric the worker exports (README: Metrics). `tenant_classes`: the classes the
    scheduler knows (their series are exported from the start, at 0)."""

    def __init__(
        self, registry: CollectorRegistry, tenant_classes: Iterable[str] = ("default",)
    ) -> None:
        self.registry = registry
        self.events = Counter(
            "ragstream_ingest_events_total",
            "Change records processed, by topic, op and outcome "
            "(upserted, deleted, unchanged, skipped, stale, dlq, refetched).",
            ["topic", "op", "outcome"],
            registry=registry,
        )
        self.dlq = Counter(
            "ragstream_ingest_dlq_records_total",
            "Records sent to the dead-letter topic, by error code.",
            ["code"],
            registry=registry,
        )
        for code in DLQ_CODES:
            self.dlq.labels(code)
        self.schema_drift = Counter(
            "ragstream_ingest_schema_drift_total",
            "Change events dead-lettered because they lack a mapped column (renamed or dropped "
            "in the SoR), by table and column.",
            ["table", "column"],
            registry=registry,
        )
        self.skipped_older = Counter(
            "ragstream_ingest_skipped_older_total",
            "Change events older than the indexed version of their entity (not applied).",
            registry=registry,
        )
        self.rereads = Counter(
            "ragstream_ingest_rereads_total",
            "Entities re-read from the SoR (TOAST refetches, reindex requests, repairs) by what "
            "the re-read did: changed, unchanged, raced (a change landed meanwhile) or rejected.",
            ["outcome"],
            registry=registry,
        )
        self.chunks_upserted = Counter(
            "ragstream_ingest_chunks_upserted_total",
            "Chunks written to the store.",
            registry=registry,
        )
        self.chunks_deleted = Counter(
            "ragstream_ingest_chunks_deleted_total",
            "Chunks deleted from the store.",
            registry=registry,
        )
        self.embedding_calls = Counter(
            "ragstream_ingest_embedding_calls_total",
            "Calls to the embedder (cache misses are embedded in one call per batch).",
            registry=registry,
        )
        self.embedded_texts = Counter(
            "ragstream_ingest_embedded_texts_total",
            "Texts embedded, by source: model (computed) or cache.",
            ["source"],
            registry=registry,
        )
        self.stage_seconds = Histogram(
            "ragstream_ingest_stage_seconds",
            "Time per pipeline stage per batch: decode, plan, normalize, chunk, embed, write, "
            "dlq, commit.",
            ["stage"],
            buckets=_STAGE_BUCKETS,
            registry=registry,
        )
        self.batch_size = Histogram(
            "ragstream_ingest_batch_records",
            "Records per consumed batch.",
            buckets=(1, 2, 5, 10, 25, 50, 100, 250, 500, 1000, 2500),
            registry=registry,
        )
        self.catch_up_batches = Counter(
            "ragstream_ingest_catch_up_batches_total",
            "Batches fetched for longer because the worker was behind (catch_up_wait_ms).",
            registry=registry,
        )
        self.freshness = Histogram(
            "ragstream_ingest_freshness_seconds",
            "SoR commit time (source.ts_ms) to searchable (store write acknowledged), by "
            "tenant class and lane (live, bulk, reindex).",
            ["tenant_class", "lane"],
            buckets=_FRESHNESS_BUCKETS,
            registry=registry,
        )
        self.paused_partitions = Gauge(
            "ragstream_ingest_paused_partitions",
            "Partitions paused right now (fetching stops while the read-ahead budget is full).",
            registry=registry,
        )
        self.backpressure = Counter(
            "ragstream_ingest_backpressure_total",
            "Batches retried because a dependency signalled overload or was unreachable.",
            ["dependency"],
            registry=registry,
        )
        for dependency in DEPENDENCIES:
            self.backpressure.labels(dependency)
        self.committed_offset = Gauge(
            "ragstream_ingest_committed_offset",
            "Last committed offset per topic partition.",
            ["topic", "partition"],
            registry=registry,
        )
        self.last_commit_timestamp = Gauge(
            "ragstream_ingest_last_commit_timestamp_seconds",
            "Unix time of the last successful offset commit (stall detection).",
            registry=registry,
        )
        self.source_last_heard = Gauge(
            "ragstream_source_last_heard_timestamp_seconds",
            "Unix time of the newest record (heartbeat or change) a Debezium connector produced "
            "that this worker consumed, per source (topic prefix); the worker's start time until "
            "the first one.",
            ["source"],
            registry=registry,
        )
        self.source_heard_age = Gauge(
            "ragstream_source_heard_age_seconds",
            "Seconds since the newest record a Debezium connector produced that this worker "
            "consumed, per source (heartbeats keep it low on a quiet SoR).",
            ["source"],
            registry=registry,
        )
        self.slot_retained_bytes = Gauge(
            "ragstream_sor_replication_slot_retained_bytes",
            "WAL a logical replication slot of the SoR holds back (pg_current_wal_lsn() minus "
            "its restart_lsn), per slot (PostgreSQL SoR).",
            ["slot"],
            registry=registry,
        )
        self.slot_active = Gauge(
            "ragstream_sor_replication_slot_active",
            "1 while a consumer (the Debezium connector) is attached to the replication slot.",
            ["slot"],
            registry=registry,
        )
        self.wal_gaps = Counter(
            "ragstream_sor_wal_gaps_total",
            "Replication slots that vanished (dropped) or lost WAL: changes may be missing from "
            "the stream; each is closed by an automatic reconcile once the slot is back.",
            ["slot"],
            registry=registry,
        )
        self.offset_gaps = Counter(
            "ragstream_ingest_offset_gaps_total",
            "Assigned partitions whose committed offset was out of range (below the low "
            "watermark: changes expired unread, past retention): the offsets in between are "
            "lost; each is closed by an automatic reconcile.",
            ["topic", "partition"],
            registry=registry,
        )
        self.loop_heartbeat = Gauge(
            "ragstream_ingest_loop_heartbeat_timestamp_seconds",
            "Unix time the worker's intake (poll, route, commit), apply (embed, write) or express "
            "(the quiet tenants' small batches) thread last went round its loop: an old one is a "
            "worker that lost its processing loop.",
            ["thread"],
            registry=registry,
        )
        self.assigned_partitions = Gauge(
            "ragstream_ingest_assigned_partitions",
            "Partitions assigned to this worker.",
            registry=registry,
        )
        for tenant_class in {"default", *tenant_classes}:
            for lane in LANES:
                self.freshness.labels(tenant_class, lane)
        self.backlog = PartitionBacklog(registry)
        self.read_ahead = ReadAheadCollector(registry)
        self.read_ahead_dropped = Counter(
            "ragstream_ingest_read_ahead_dropped_total",
            "Fetched records not kept because their tenant held its share of the read-ahead "
            "budget (or the budget was full): fetched again by a rescan.",
            registry=registry,
        )
        self.rescans = Counter(
            "ragstream_ingest_rescans_total",
            "Partitions fetched again from their lowest dropped record.",
            registry=registry,
        )
        self.restart_records = Counter(
            "ragstream_ingest_restart_records_total",
            "Records fetched again after a partition was assigned: skipped (the commit "
            "metadata names them finished by the earlier owner) or redone (below the highest "
            "offset the metadata names finished: the earlier owner had read past them).",
            ["outcome"],
            registry=registry,
        )
        for outcome in ("skipped", "redone"):
            self.restart_records.labels(outcome)
        self.metadata_cut = Counter(
            "ragstream_ingest_commit_metadata_cut_total",
            "Finished offsets left out of a commit's metadata (over max_metadata_bytes): "
            "redone after a restart.",
            registry=registry,
        )


class PartitionBacklog(Collector):
    """Consumer lag and backlog age per assigned topic partition, computed at scrape time.

    - `ragstream_ingest_consumer_lag_records`: the partition's high watermark minus the group's
      committed offset (what a lag exporter reports for the group, from the worker itself);
    - `ragstream_ingest_backlog_age_seconds`: how long the oldest change not yet applied has been
      waiting, by its Kafka record timestamp; 0 when nothing is pending. It is known for the
      records the worker has polled and not committed (a batch in progress, or rewound for
      backpressure); while the next records still sit in the client's fetch queue it reads 0
      until they are polled, i.e. for the instant between two batches.

    Only partitions assigned to this worker are exported (their labels leave on revocation), so
    the cardinality is the group's partition count across all workers.
    """

    def __init__(self, registry: CollectorRegistry, clock: Callable[[], float] = time.time) -> None:
        self._clock = clock
        self._lock = threading.Lock()
        self._lag: dict[tuple[str, int], int] = {}
        self._oldest_ms: dict[tuple[str, int], int] = {}
        self._source: Callable[[], Mapping[tuple[str, int], int]] | None = None
        registry.register(self)

    def source(self, oldest: Callable[[], Mapping[tuple[str, int], int]]) -> None:
        """Read the oldest pending record's timestamp per partition from `oldest` at scrape
        time (the consumer's scheduler) instead of `holding`/`applied`."""
        self._source = oldest

    def set_lag(self, lags: Mapping[tuple[str, int], int]) -> None:
        """Replace the lag of every assigned partition (partitions not named are dropped)."""
        with self._lock:
            self._lag = {tp: max(0, lag) for tp, lag in lags.items()}
            self._oldest_ms = {tp: ts for tp, ts in self._oldest_ms.items() if tp in self._lag}

    def holding(self, partition: tuple[str, int], timestamp_ms: int) -> None:
        """The worker polled a record of `partition` it has not committed yet; the oldest one
        per partition is kept until `applied`."""
        with self._lock:
            known = self._oldest_ms.get(partition)
            if known is None or timestamp_ms < known:
                self._oldest_ms[partition] = timestamp_ms

    def applied(self, partition: tuple[str, int], lag: int | None) -> None:
        """Everything held of `partition` was committed; `lag` is what remains, when known."""
        with self._lock:
            self._oldest_ms.pop(partition, None)
            if lag is not None and partition in self._lag:
                self._lag[partition] = max(0, lag)

    def forget(self, partitions: Iterable[tuple[str, int]]) -> None:
        """Partitions revoked from this worker: no longer exported."""
        with self._lock:
            for tp in partitions:
                self._lag.pop(tp, None)
                self._oldest_ms.pop(tp, None)

    def describe(self) -> Iterator[Metric]:
        """The two families, without samples (for registration)."""
        yield from self._families()

    def collect(self) -> Iterator[Metric]:
        """Lag and backlog age of every assigned partition, now."""
        now_ms = self._clock() * 1000
        lag_family, age_family = self._families()
        pending = dict(self._source()) if self._source is not None else None
        with self._lock:
            for (topic, partition), lag in sorted(self._lag.items()):
                labels = [topic, str(partition)]
                lag_family.add_metric(labels, lag)
                held = self._oldest_ms if pending is None else pending
                oldest = held.get((topic, partition))
                age = max(0.0, (now_ms - oldest) / 1000) if oldest is not None else 0.0
                age_family.add_metric(labels, age)
        yield lag_family
        yield age_family

    @staticmethod
    def _families() -> tuple[GaugeMetricFamily, GaugeMetricFamily]:
        lag = GaugeMetricFamily(
            "ragstream_ingest_consumer_lag_records",
            "Records behind the high watermark per assigned topic partition (high watermark "
            "minus the committed offset).",
            labels=["topic", "partition"],
        )
        age = GaugeMetricFamily(
            "ragstream_ingest_backlog_age_seconds",
            "Age of the oldest change not yet applied per assigned topic partition (its Kafka "
            "record timestamp); 0 when nothing is pending.",
            labels=["topic", "partition"],
        )
        return lag, age


class ReadAheadCollector(Collector):
    """What the worker holds read ahead and what waits, at scrape time, from its scheduler and
    read-ahead state (`observe`):

    - `ragstream_ingest_read_ahead_records` / `_bytes`: held now (fetched, not finished), and
      `ragstream_ingest_read_ahead_budget_records` / `_bytes`: the budget;
    - `ragstream_ingest_backlog_records{tenant_class, lane}`: records waiting (kept, or dropped
      for a rescan), and `ragstream_ingest_backlog_oldest_age_seconds{tenant_class, lane}`: the
      age of the oldest of them (0 when none waits).

    Every known class and lane is exported, at 0 when nothing waits (a quiet stack shows values)."""

    def __init__(self, registry: CollectorRegistry, clock: Callable[[], float] = time.time) -> None:
        self._clock = clock
        self._scheduler: Any = None
        self._readahead: Any = None
        registry.register(self)

    def observe(self, scheduler: Any, readahead: Any) -> None:
        """Export `scheduler` (a `streams.scheduler.Scheduler`) and `readahead` (a
        `streams.readahead.ReadAhead`); typed loosely: the scheduler imports nothing of this
        module, and this module nothing of it."""
        self._scheduler = scheduler
        self._readahead = readahead

    def describe(self) -> Iterator[Metric]:
        """The families, without samples (for registration)."""
        yield from self._families()

    def collect(self) -> Iterator[Metric]:
        """Current values."""
        families = self._families()
        held, held_bytes, budget, budget_bytes, backlog, age = families
        scheduler, readahead = self._scheduler, self._readahead
        if scheduler is None:
            yield from families
            return
        config = scheduler.config
        held.add_metric([], scheduler.records)
        held_bytes.add_metric([], scheduler.bytes)
        budget.add_metric([], config.max_records)
        budget_bytes.add_metric([], config.max_bytes)
        rows: dict[tuple[str, str], list[float]] = {
            (cls, lane): [0, -1.0]
            for cls in {"default", *config.classes.values()}
            for lane in LANES
        }
        for (cls, lane), waiting in scheduler.backlog().items():
            row = rows.setdefault((cls, lane.label), [0, -1.0])
            row[0] += waiting.records
            if waiting.oldest_ms is not None and (row[1] < 0 or waiting.oldest_ms < row[1]):
                row[1] = waiting.oldest_ms
        if readahead is not None:
            for (tenant, lane), (count, oldest) in readahead.dropped_backlog().items():
                row = rows.setdefault((scheduler.class_of(tenant), lane.label), [0, -1.0])
                row[0] += count
                if oldest is not None and (row[1] < 0 or oldest < row[1]):
                    row[1] = oldest
        now_ms = self._clock() * 1000
        for (cls, lane), (records, oldest) in sorted(rows.items()):
            backlog.add_metric([cls, lane], records)
            age.add_metric([cls, lane], max(0.0, (now_ms - oldest) / 1000) if oldest >= 0 else 0.0)
        yield from families

    @staticmethod
    def _families() -> tuple[GaugeMetricFamily, ...]:
        return (
            GaugeMetricFamily(
                "ragstream_ingest_read_ahead_records",
                "Records fetched and held, not finished (the read-ahead in use).",
            ),
            GaugeMetricFamily(
                "ragstream_ingest_read_ahead_bytes",
                "Bytes (record keys and values) fetched and held, not finished.",
            ),
            GaugeMetricFamily(
                "ragstream_ingest_read_ahead_budget_records",
                "The read-ahead budget in records "
                "(RAGSTREAM_CONSUMER__SCHEDULER__READ_AHEAD_RECORDS).",
            ),
            GaugeMetricFamily(
                "ragstream_ingest_read_ahead_budget_bytes",
                "The read-ahead budget in bytes (RAGSTREAM_CONSUMER__SCHEDULER__READ_AHEAD_BYTES).",
            ),
            GaugeMetricFamily(
                "ragstream_ingest_backlog_records",
                "Change records waiting to be applied (held, or dropped for a rescan), by tenant "
                "class and lane (live, bulk, reindex).",
                labels=["tenant_class", "lane"],
            ),
            GaugeMetricFamily(
                "ragstream_ingest_backlog_oldest_age_seconds",
                "Age of the oldest change waiting to be applied (its Kafka record timestamp), "
                "by tenant class and lane; 0 when none waits.",
                labels=["tenant_class", "lane"],
            ),
        )
