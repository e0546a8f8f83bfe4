"""Prometheus metrics of the Retrieve service, on an injected registry."""

from __future__ import annotations

from typing import Generic, TypeVar

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram
from prometheus_client.metrics import MetricWrapperBase

from ragcore.grpc_codes import SERVER_ERROR_CODES
from retrieval_api.ranking import ExclusionReason

M = TypeVar("M", bound=MetricWrapperBase)

_LATENCY = (0.001, 0.0025, 0.005, 0.01, 0.02, 0.03, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10)


class Children(Generic[M]):
    """The children of a labelled metric, each looked up once: prometheus_client's `labels()`
    validates the values and takes a lock on every call, and a Retrieve request asked for
    about 30 children. Label values must be few (stages, statuses, codes, reasons)."""

    def __init__(self, metric: M) -> None:
        self._metric = metric
        self._children: dict[tuple[str, ...], M] = {}

    def __call__(self, *values: str) -> M:
        """The child of `values` (what `metric.labels(*values)` returns)."""
        child = self._children.get(values)
        if child is None:
            # a race only looks the same child up twice: `labels()` returns one object
            child = self._children.setdefault(values, self._metric.labels(*values))
        return child


class RetrieveMetrics:
    """Request outcomes, stage latencies, exclusions and candidates (README: Metrics)."""

    def __init__(self, registry: CollectorRegistry) -> None:
        self.registry = registry
        self.requests = Counter(
            "ragstream_retrieve_requests_total",
            "Retrieve requests by evidence-pack status (SUCCESS, NO_EVIDENCE, IDENTIFIER_MATCH, "
            "FAILED) and gRPC "
            "status code (OK, or the code of a failure: InvalidArgument ... client errors, "
            "Unavailable, Internal ... server errors).",
            ["status", "code"],
            registry=registry,
        )
        self.stage_seconds = Histogram(
            "ragstream_retrieve_stage_seconds",
            "Time per Retrieve stage: validate, embed, search, rerank, verify, evidence.",
            ["stage"],
            buckets=_LATENCY,
            registry=registry,
        )
        self.stage_cpu_seconds = Counter(
            "ragstream_retrieve_stage_cpu_seconds",
            "CPU time of the thread running each Retrieve stage (onnxruntime's own threads, "
            "which the local embedder may use, are not included).",
            ["stage"],
            registry=registry,
        )
        self.query_cache = Counter(
            "ragstream_retrieve_query_cache",
            "Query vectors served from the query-vector cache (hit) or embedded (miss).",
            ["outcome"],
            registry=registry,
        )
        self.excluded = Counter(
            "ragstream_retrieve_excluded_total",
            "Candidates excluded, by reason (deleted, stale, missing, unverifiable, "
            "sor_row_unreadable, below_threshold, duplicate, filtered).",
            ["reason"],
            registry=registry,
        )
        self.candidates = Histogram(
            "ragstream_retrieve_candidates",
            "Candidates returned by the store per request (after fusion).",
            buckets=(0, 1, 5, 10, 20, 50, 100, 200, 500),
            registry=registry,
        )
        self.term_counts = Counter(
            "ragstream_retrieve_term_counts",
            "Candidates whose exact BM25 read the term counts stored with the chunk (stored) "
            "or counted its text (text: chunks written before the counts were stored, or "
            "with another tokenization; a reindex stores them).",
            ["source"],
            registry=registry,
        )
        self.sor_table_unreadable = Gauge(
            "ragstream_retrieve_sor_table_unreadable",
            "1 while Retrieve cannot read a mapped SoR table (renamed or dropped column, "
            "missing table, no privilege): its hits are excluded as unverifiable.",
            ["table"],
            registry=registry,
            # several server processes: the table is unreadable if any live one says so
            multiprocess_mode="livemax",
        )
        self.reindex_requests = Counter(
            "ragstream_retrieve_reindex_requests_total",
            "Reindex requests published for stale, deleted or missing entities.",
            registry=registry,
        )
        self.reindex_requests_suppressed = Counter(
            "ragstream_retrieve_reindex_requests_suppressed_total",
            "Reindex requests not published: the entity was requested within the cooldown "
            "(its re-read is queued, or changed nothing).",
            registry=registry,
        )
        # the hot path's children, looked up once (see `Children`)
        self.requests_of = Children(self.requests)
        # exported at 0 from the start: a healthy server's panels show 0, not "no data", and
        # the first burst of a server error counts in `rate()` (RagstreamRetrieveErrorRate)
        for status, code in (
            ("SUCCESS", "OK"),
            ("NO_EVIDENCE", "OK"),
            ("IDENTIFIER_MATCH", "OK"),
            *(("FAILED", code) for code in SERVER_ERROR_CODES),
        ):
            self.requests_of(status, code)
        self.stage_seconds_of = Children(self.stage_seconds)
        self.stage_cpu_seconds_of = Children(self.stage_cpu_seconds)
        self.query_cache_of = Children(self.query_cache)
        self.excluded_of = Children(self.excluded)
        for reason in ExclusionReason:
            self.excluded_of(reason.value)
        self.term_counts_stored = self.term_counts.labels("stored")
        self.term_counts_text = self.term_counts.labels("text")
