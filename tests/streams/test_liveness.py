"""Source liveness: the last time each Debezium connector was heard from (heartbeat or change),
as metrics and log lines, and the replication slots' retained WAL."""

from __future__ import annotations

import logging
from collections.abc import Sequence

import pytest
from prometheus_client import CollectorRegistry

from ragcore.sor.base import SlotState
from schemas.events import RawRecord
from streams.consumer import BatchAdapter, BatchHandler, DeadLetter, Routed
from streams.liveness import ObservedHandler, SlotWatch, SourceLiveness, heartbeat_pattern
from streams.metrics import IngestMetrics


class Clock:
    def __init__(self, now: float) -> None:
        self.now = now

    def __call__(self) -> float:
        return self.now


def record(topic: str, ts_ms: int | None, offset: int = 0) -> RawRecord:
    return RawRecord(
        topic=topic, partition=0, offset=offset, key=None, value=b"{}", timestamp_ms=ts_ms
    )


def liveness(clock: Clock, *, heartbeats: bool = True) -> tuple[SourceLiveness, CollectorRegistry]:
    registry = CollectorRegistry()
    watch = SourceLiveness(
        IngestMetrics(registry),
        topic_sources=lambda t: "sor" if t.startswith("sor.") else None,
        heartbeat_prefix="__debezium-heartbeat",
        sources=("sor",),
        silent_after_s=20.0,
        heartbeats=heartbeats,
        clock=clock,
    )
    return watch, registry


def age(registry: CollectorRegistry, source: str) -> float | None:
    return registry.get_sample_value("ragstream_source_heard_age_seconds", {"source": source})


@pytest.mark.unit
def test_heartbeats_and_changes_keep_the_age_low_and_silence_makes_it_grow() -> None:
    clock = Clock(1_000.0)
    watch, registry = liveness(clock)
    assert age(registry, "sor") == 0.0  # expected from the start: counts from the worker's start
    clock.now = 1_012.0
    assert age(registry, "sor") == 12.0
    watch.observe([record("__debezium-heartbeat.sor", 1_010_000)])
    assert age(registry, "sor") == 2.0
    watch.observe([record("sor.public.entities", 1_011_500)])
    assert age(registry, "sor") == 0.5
    assert registry.get_sample_value(
        "ragstream_source_last_heard_timestamp_seconds", {"source": "sor"}
    ) == pytest.approx(1_011.5)
    # an older record (a replayed batch) never moves the time back
    watch.observe([record("__debezium-heartbeat.sor", 1_000_000)])
    assert age(registry, "sor") == 0.5
    # records of other topics (the reindex topic) are nobody's sign of life
    clock.now = 1_100.0
    watch.observe([record("ragstream.reindex-requests", 1_099_000)])
    assert age(registry, "sor") == pytest.approx(88.5)


@pytest.mark.unit
def test_without_heartbeats_silence_means_nothing_and_no_source_is_watched() -> None:
    clock = Clock(1_000.0)
    watch, registry = liveness(clock, heartbeats=False)
    watch.observe([record("sor.public.entities", 1_000_000)])
    clock.now = 1_100.0
    assert age(registry, "sor") is None
    assert watch.check() == []


@pytest.mark.unit
def test_a_second_connector_is_a_source_of_its_own() -> None:
    clock = Clock(500.0)
    watch, registry = liveness(clock)
    watch.observe([record("__debezium-heartbeat.crm", 499_000)])
    assert age(registry, "crm") == 1.0
    assert age(registry, "sor") == 0.0


@pytest.mark.unit
def test_silence_is_logged_once_and_the_return_once(caplog: pytest.LogCaptureFixture) -> None:
    clock = Clock(0.0)
    watch, _ = liveness(clock)
    caplog.set_level(logging.INFO, logger="streams.liveness")
    clock.now = 10.0
    assert watch.check() == []
    clock.now = 25.0
    assert watch.check() == ["sor"]
    assert watch.check() == ["sor"]
    warnings = [r for r in caplog.records if r.levelno == logging.WARNING]
    assert len(warnings) == 1 and "source sor" in warnings[0].getMessage()
    assert "RagstreamSourceSilent" in warnings[0].getMessage()
    watch.observe([record("__debezium-heartbeat.sor", 24_500)])
    assert watch.check() == []
    assert any("heard again" in r.getMessage() for r in caplog.records)


@pytest.mark.unit
def test_the_observed_handler_notes_records_before_routing_them() -> None:
    clock = Clock(100.0)
    watch, registry = liveness(clock)
    seen: list[RawRecord] = []

    class Inner(BatchAdapter):
        def route(self, record: RawRecord) -> Routed[list[RawRecord]]:
            seen.append(record)
            return super().route(record)

    observed = ObservedHandler(Inner(_nothing()), watch)
    batch = [record("__debezium-heartbeat.sor", 99_000), record("sor.public.entities", None, 1)]
    for rec in batch:
        assert observed.route(rec) is not None
    assert seen == batch
    assert age(registry, "sor") == 0.0  # a record without a timestamp counts at consume time


def _nothing() -> BatchHandler:
    class Nothing:
        def handle(self, records: Sequence[RawRecord]) -> Sequence[DeadLetter]:
            return []

    return Nothing()


@pytest.mark.unit
def test_the_heartbeat_pattern_matches_the_own_connector_only() -> None:
    import re

    pattern = re.compile(heartbeat_pattern("__debezium-heartbeat", "sor"))
    assert pattern.match("__debezium-heartbeat.sor")
    assert not pattern.match("__debezium-heartbeat.sorx")
    assert not pattern.match("__debezium-heartbeat.crm")
    assert not pattern.match("__debezium-heartbeat")
    assert not pattern.match("sor.public.entities")


class _Slots:
    def __init__(self) -> None:
        self.slots = [SlotState("ragstream_entities", "pgoutput", True, 1_000, "reserved")]

    def replication_slots(self) -> list[SlotState]:
        return list(self.slots)


@pytest.mark.unit
def test_slot_watch_exports_retained_wal_and_logs_a_slot_left_without_consumer(
    caplog: pytest.LogCaptureFixture,
) -> None:
    registry = CollectorRegistry()
    source = _Slots()
    watch = SlotWatch(IngestMetrics(registry), source)
    caplog.set_level(logging.INFO, logger="streams.liveness")
    watch.check()
    labels = {"slot": "ragstream_entities"}
    assert registry.get_sample_value("ragstream_sor_replication_slot_active", labels) == 1
    source.slots = [SlotState("ragstream_entities", "pgoutput", False, 9_000_000, "extended")]
    watch.check()
    watch.check()
    assert registry.get_sample_value("ragstream_sor_replication_slot_active", labels) == 0
    assert (
        registry.get_sample_value("ragstream_sor_replication_slot_retained_bytes", labels)
        == 9_000_000
    )
    assert len([r for r in caplog.records if "has no consumer" in r.getMessage()]) == 1


@pytest.mark.unit
def test_a_dropped_slot_is_a_wal_gap_closed_once_it_streams_again(
    caplog: pytest.LogCaptureFixture,
) -> None:
    registry = CollectorRegistry()
    source = _Slots()
    watch = SlotWatch(IngestMetrics(registry), source)
    assert watch.check() == []
    # exported at 0 from the first sight, so that `increase()` sees the first gap
    assert (
        registry.get_sample_value("ragstream_sor_wal_gaps_total", {"slot": "ragstream_entities"})
        == 0
    )
    source.slots = []  # dropped while its connector was down
    assert watch.check() == []
    assert watch.check() == []
    labels = {"slot": "ragstream_entities"}
    assert registry.get_sample_value("ragstream_sor_wal_gaps_total", labels) == 1
    assert any("WAL gap" in r.getMessage() for r in caplog.records)
    source.slots = [SlotState("ragstream_entities", "pgoutput", False, 0, "reserved")]
    assert watch.check() == []  # created again, not streaming yet
    source.slots = [SlotState("ragstream_entities", "pgoutput", True, 0, "reserved")]
    assert watch.check() == ["ragstream_entities"]
    assert watch.check() == []  # closed once


@pytest.mark.unit
def test_a_slot_that_lost_wal_is_a_gap_too() -> None:
    registry = CollectorRegistry()
    source = _Slots()
    watch = SlotWatch(IngestMetrics(registry), source)
    source.slots = [SlotState("ragstream_entities", "pgoutput", True, 0, "lost")]
    assert watch.check() == []
    assert (
        registry.get_sample_value("ragstream_sor_wal_gaps_total", {"slot": "ragstream_entities"})
        == 1
    )
    source.slots = [SlotState("ragstream_entities", "pgoutput", True, 0, "reserved")]
    assert watch.check() == ["ragstream_entities"]


@pytest.mark.unit
def test_a_slot_whose_confirmed_position_went_back_is_a_wal_gap(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """A SoR restored from a base backup loses the slot and Debezium recreates it at the
    restored server's lower WAL positions; when no check fell in the moment the slot was
    missing (the SoR was restarting), the position going back still tells."""
    registry = CollectorRegistry()
    source = _Slots()
    source.slots = [SlotState("ragstream_entities", "pgoutput", True, 0, "reserved", 90_000)]
    watch = SlotWatch(IngestMetrics(registry), source)
    assert watch.check() == []
    source.slots = [SlotState("ragstream_entities", "pgoutput", True, 0, "reserved", 95_000)]
    assert watch.check() == []  # moving on is no gap
    labels = {"slot": "ragstream_entities"}
    assert registry.get_sample_value("ragstream_sor_wal_gaps_total", labels) == 0
    source.slots = [SlotState("ragstream_entities", "pgoutput", False, 0, "reserved", 40_000)]
    assert watch.check() == []
    assert registry.get_sample_value("ragstream_sor_wal_gaps_total", labels) == 1
    assert any("went back (95000 -> 40000" in r.getMessage() for r in caplog.records)
    source.slots = [SlotState("ragstream_entities", "pgoutput", True, 0, "reserved", 41_000)]
    assert watch.check() == ["ragstream_entities"]  # streaming again: close it
    assert watch.check() == []
    assert registry.get_sample_value("ragstream_sor_wal_gaps_total", labels) == 1
