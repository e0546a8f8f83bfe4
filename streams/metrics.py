"""Prometheus metrics of the ingest worker, built on an injected registry (never the global one
at import time), so tests can read them with `registry.get_sample_value`."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterable, Iterator, Mapping

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
    "INVALID_TENANT",
    "RECORD_TOO_LARGE",
    "CHUNKING_ERROR",
    "BAD_REINDEX_REQUEST",
    *REASONS,  # documents that yield no text (ragcore.documents)
)
_FRESHNESS_BUCKETS = (0.1, 0.25, 0.5, 1, 2, 3, 5, 10, 30, 60, 120, 300, 900, 3600)


class IngestMetrics:
    """Every metric the worker exports (README: Metrics)."""

    def __init__(self, registry: CollectorRegistry) -> None:
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
            "SoR commit time (source.ts_ms) to searchable (store write acknowledged).",
            buckets=_FRESHNESS_BUCKETS,
            registry=registry,
        )
        self.paused_partitions = Gauge(
            "ragstream_ingest_paused_partitions",
            "Partitions paused for backpressure right now.",
            registry=registry,
        )
        self.backpressure = Counter(
            "ragstream_ingest_backpressure_total",
            "Batches retried because a dependency signalled overload or was unreachable.",
            ["dependency"],
            registry=registry,
        )
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
        self.assigned_partitions = Gauge(
            "ragstream_ingest_assigned_partitions",
            "Partitions assigned to this worker.",
            registry=registry,
        )
        self.backlog = PartitionBacklog(registry)


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
        registry.register(self)

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
        with self._lock:
            for (topic, partition), lag in sorted(self._lag.items()):
                labels = [topic, str(partition)]
                lag_family.add_metric(labels, lag)
                oldest = self._oldest_ms.get((topic, partition))
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
