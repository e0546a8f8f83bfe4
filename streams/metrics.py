"""Prometheus metrics of the ingest worker, built on an injected registry (never the global one
at import time), so tests can read them with `registry.get_sample_value`."""

from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram

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
        self.skipped_older = Counter(
            "ragstream_ingest_skipped_older_total",
            "Change events older than the indexed version of their entity (not applied).",
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
        self.assigned_partitions = Gauge(
            "ragstream_ingest_assigned_partitions",
            "Partitions assigned to this worker.",
            registry=registry,
        )
