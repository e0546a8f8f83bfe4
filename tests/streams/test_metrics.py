"""The worker's own lag and backlog-age gauges (PartitionBacklog), on a fake clock."""

from __future__ import annotations

import pytest
from prometheus_client import CollectorRegistry

from streams.metrics import PartitionBacklog

pytestmark = pytest.mark.unit

LAG = "ragstream_ingest_consumer_lag_records"
AGE = "ragstream_ingest_backlog_age_seconds"


class Clock:
    def __init__(self) -> None:
        self.now = 1_000.0

    def __call__(self) -> float:
        return self.now


def _labels(partition: int) -> dict[str, str]:
    return {"topic": "t", "partition": str(partition)}


def test_age_is_that_of_the_oldest_held_record_until_it_is_applied() -> None:
    registry, clock = CollectorRegistry(), Clock()
    backlog = PartitionBacklog(registry, clock)
    backlog.set_lag({("t", 0): 3, ("t", 1): 0})
    backlog.holding(("t", 0), 990_000)  # ms: 10 s before now
    backlog.holding(("t", 0), 995_000)  # newer: not the oldest
    backlog.holding(("t", 0), 985_000)  # older, polled later (a rewound batch): the oldest
    clock.now += 5
    assert registry.get_sample_value(AGE, _labels(0)) == 20.0
    assert registry.get_sample_value(AGE, _labels(1)) == 0.0
    assert registry.get_sample_value(LAG, _labels(0)) == 3
    backlog.applied(("t", 0), lag=0)
    assert registry.get_sample_value(AGE, _labels(0)) == 0.0
    assert registry.get_sample_value(LAG, _labels(0)) == 0


def test_a_high_watermark_below_the_committed_offset_reads_zero_not_negative() -> None:
    # tansu reports the base offset of the last batch + 1: below the committed offset when the
    # last batch held several records.
    registry = CollectorRegistry()
    backlog = PartitionBacklog(registry, Clock())
    backlog.set_lag({("t", 0): -4})
    assert registry.get_sample_value(LAG, _labels(0)) == 0
    backlog.applied(("t", 0), lag=-2)
    assert registry.get_sample_value(LAG, _labels(0)) == 0


def test_revoked_partitions_leave_the_exposition() -> None:
    registry = CollectorRegistry()
    backlog = PartitionBacklog(registry, Clock())
    backlog.set_lag({("t", p): p for p in range(4)})
    backlog.holding(("t", 2), 1)
    backlog.forget([("t", 2), ("t", 3)])
    exported = {
        sample.labels["partition"]
        for family in registry.collect()
        if family.name in (LAG, AGE)
        for sample in family.samples
    }
    assert exported == {"0", "1"}
    backlog.set_lag({("t", 0): 1})  # a new assignment replaces the set
    assert registry.get_sample_value(LAG, _labels(1)) is None


def test_known_dlq_codes_are_exported_at_zero_before_the_first_dead_letter() -> None:
    # increase() sees nothing in a series' first samples: a first burst must start from 0
    from streams.metrics import DLQ_CODES, IngestMetrics

    # the codes a re-read can end under too (they started at first use before issue 41)
    assert {"CONTENT_UNAVAILABLE", "SOR_TABLE_UNREADABLE", "NO_TEXT_LAYER"} <= set(DLQ_CODES)
    registry = CollectorRegistry()
    IngestMetrics(registry)
    for code in DLQ_CODES:
        assert registry.get_sample_value("ragstream_ingest_dlq_records_total", {"code": code}) == 0


def test_backpressure_starts_at_zero_and_no_heartbeat_is_exported_before_its_loop_runs() -> None:
    # a healthy worker's dashboard shows 0 per dependency, not "no data"; a heartbeat at 0
    # would read as a loop lost since 1970, so it appears only once its thread goes round
    from streams.consumer import DEPENDENCY
    from streams.metrics import DEPENDENCIES, IngestMetrics

    assert set(DEPENDENCIES) == set(DEPENDENCY.values())
    registry = CollectorRegistry()
    metrics = IngestMetrics(registry)
    value = registry.get_sample_value
    for dependency in DEPENDENCIES:
        assert value("ragstream_ingest_backpressure_total", {"dependency": dependency}) == 0
    heartbeat = "ragstream_ingest_loop_heartbeat_timestamp_seconds"
    assert value(heartbeat, {"thread": "apply"}) is None
    metrics.loop_heartbeat.labels("apply").set(1_000.0)
    assert value(heartbeat, {"thread": "apply"}) == 1_000.0
