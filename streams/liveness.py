"""When the worker last heard from each Debezium connector (a *source*, named by its topic prefix).

A stopped connector writes nothing: without a signal, a quiet table and a dead connector look the
same. Debezium's heartbeats (`heartbeat.interval.ms`, topic `<heartbeat prefix>.<topic.prefix>`)
make silence meaningful: every record a source produced, heartbeat or change, is a sign of life
at its Kafka timestamp (when the connector produced it). This module exports, per source,

- `ragstream_source_last_heard_timestamp_seconds` (Unix time of the newest record seen) and
- `ragstream_source_heard_age_seconds` (now minus that, computed at scrape time),

logs one WARNING when a source falls silent for `silent_after_s` and one INFO line when it is
heard again. A source not heard since the worker started counts from the start, so a connector
that is dead from the beginning is reported too. Across several workers the freshest one counts
(only one of them holds the heartbeat partition): the alert takes the minimum.

Without heartbeats (`liveness.heartbeats` off, e.g. the dev stack's embedded SoR, which has no
connector) silence means nothing, so no source is watched and none of this is exported.
"""

from __future__ import annotations

import functools
import logging
import re
import threading
import time
from collections.abc import Callable, Iterable, Sequence
from typing import Generic, TypeVar

from pydantic import BaseModel, ConfigDict, Field

from ragcore.sor.base import SlotSource
from schemas.events import RawRecord
from streams.consumer import DeadLetter, RecordHandler, Routed
from streams.metrics import IngestMetrics

log = logging.getLogger(__name__)

P = TypeVar("P")


class LivenessSettings(BaseModel):
    """How the worker watches its Debezium connectors."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    heartbeats: bool = Field(
        default=True,
        description=(
            "Consume the connector's heartbeat topic (<decode.heartbeat_topic_prefix>."
            "<plan.topic_prefix>) when the consumed topics are the mapped tables' default ones, "
            "and watch the source for silence. Off (a source without heartbeats): a quiet SoR "
            "cannot be told from a dead connector, so the source is not watched."
        ),
    )
    silent_after_s: float = Field(
        default=20.0,
        gt=0,
        description=(
            "A source not heard from (heartbeat or change) for this long is logged as silent; "
            "keep it above 2x the connector's heartbeat.interval.ms."
        ),
    )
    check_interval_s: float = Field(default=5.0, gt=0, description="How often silence is checked.")


def heartbeat_pattern(heartbeat_prefix: str, topic_prefix: str) -> str:
    """The subscription pattern of the heartbeat topic of the connector writing `topic_prefix`
    (a pattern, not a name: the topic may appear after the worker started, created by the
    connector's first heartbeat)."""
    return f"^{re.escape(heartbeat_prefix)}\\.{re.escape(topic_prefix)}$"


class SourceLiveness:
    """Last heard per source, as metrics and log lines."""

    def __init__(
        self,
        metrics: IngestMetrics,
        *,
        topic_sources: Callable[[str], str | None],
        heartbeat_prefix: str,
        sources: Sequence[str] = (),
        silent_after_s: float = 20.0,
        heartbeats: bool = True,
        clock: Callable[[], float] = time.time,
    ) -> None:
        """`topic_sources(topic)` names the source of a change topic (None: not a source's,
        e.g. the reindex topic); heartbeat topics name their source after the prefix;
        `sources` are expected from the start. `heartbeats` False: the sources send none, so
        a quiet source cannot be told from a dead one and nothing is watched."""
        self._watching = heartbeats
        self._topic_sources = topic_sources
        self._heartbeat = heartbeat_prefix + "."
        self._silent_after = silent_after_s
        self._clock = clock
        self._lock = threading.Lock()
        self._heard: dict[str, float] = {}
        self._silent: set[str] = set()
        self._metrics = metrics
        started = clock()
        for source in sources if heartbeats else ():
            self._heard_at(source, started)

    def source_of(self, topic: str) -> str | None:
        """The source a topic's records come from."""
        if topic.startswith(self._heartbeat):
            return topic[len(self._heartbeat) :] or None
        return self._topic_sources(topic)

    def observe(self, records: Iterable[RawRecord]) -> None:
        """Note every record's source and production time (the consume time when the record
        carries no timestamp)."""
        if not self._watching:
            return
        newest: dict[str, float] = {}
        for rec in records:
            source = self.source_of(rec.topic)
            if source is None:
                continue
            at = rec.timestamp_ms / 1000 if rec.timestamp_ms is not None else self._clock()
            newest[source] = max(at, newest.get(source, at))
        for source, at in newest.items():
            self._heard_at(source, at)

    def _heard_at(self, source: str, at: float) -> None:
        with self._lock:
            known = source in self._heard
            if known and at <= self._heard[source]:
                return
            self._heard[source] = at
        self._metrics.source_last_heard.labels(source).set(at)
        if not known:
            self._metrics.source_heard_age.labels(source).set_function(
                functools.partial(self.age_of, source)
            )

    def age_of(self, source: str) -> float:
        """Seconds since `source` was last heard from (never negative)."""
        with self._lock:
            at = self._heard.get(source)
        return 0.0 if at is None else max(0.0, self._clock() - at)

    def check(self) -> list[str]:
        """Log sources that fell silent or were heard again; returns the silent ones."""
        with self._lock:
            sources = list(self._heard)
        silent = []
        for source in sources:
            age = self.age_of(source)
            if age >= self._silent_after:
                silent.append(source)
                if source not in self._silent:
                    self._silent.add(source)
                    log.warning(
                        "source %s: nothing heard from its Debezium connector for %.0f s "
                        "(no heartbeat, no change): the connector may be down "
                        "(runbook: docs/runbooks/RagstreamSourceSilent.md)",
                        source,
                        age,
                    )
            elif source in self._silent:
                self._silent.discard(source)
                log.info("source %s: its Debezium connector is heard again", source)
        return silent

    def watch(self, stop: threading.Event, every_s: float) -> None:
        """`check` every `every_s` until stopped."""
        while not stop.wait(every_s):
            self.check()


class ObservedHandler(Generic[P]):
    """A `RecordHandler` that tells `SourceLiveness` about every fetched record first."""

    def __init__(self, inner: RecordHandler[P], liveness: SourceLiveness) -> None:
        self._inner = inner
        self._liveness = liveness

    def route(self, record: RawRecord) -> Routed[P] | None:
        """Observe, then route."""
        self._liveness.observe((record,))
        return self._inner.route(record)

    def merge(self, earlier: P, later: P) -> P | None:
        """The inner handler's merge."""
        return self._inner.merge(earlier, later)

    def heavy(self, payload: P) -> bool:
        """The inner handler's weighing."""
        return self._inner.heavy(payload)

    def apply(self, payloads: Sequence[P]) -> Sequence[DeadLetter]:
        """The inner handler's apply."""
        return self._inner.apply(payloads)


class SlotWatch:
    """The SoR's replication slots as metrics: the WAL each retains and whether a connector is
    attached (an inactive slot keeps WAL growing on the SoR's disk). It also notices WAL gaps:
    a slot that vanished (dropped while its connector was down), lost WAL
    (`wal_status=lost`), or whose confirmed position went back (the slot was recreated in a
    SoR restored from a backup, whose new commits take WAL positions below the abandoned
    history's: seen even when no check fell in the moment the slot was missing). Changes
    committed until a new slot exists never reach the stream; `check` names such a slot once
    it is back and streaming, so the caller reconciles then."""

    def __init__(self, metrics: IngestMetrics, sor: SlotSource) -> None:
        self._sor = sor
        self._metrics = metrics
        self._inactive: set[str] = set()
        self._seen: set[str] = set()
        self._gaps: set[str] = set()
        #: the confirmed position each slot had at the last check
        self._confirmed: dict[str, int] = {}

    def check(self) -> list[str]:
        """Read the slots, export them, log changes; return the slots whose WAL gap should be
        closed now (back and active after vanishing or losing WAL)."""
        slots = self._sor.replication_slots()
        present = {slot.name for slot in slots}
        for name in sorted(self._seen - present - self._gaps):
            self._gap(name, "vanished (dropped?)")
        closable = []
        for slot in slots:
            # exported at 0 from the first sight: `increase()` then sees the first gap
            self._metrics.wal_gaps.labels(slot.name)
            self._metrics.slot_retained_bytes.labels(slot.name).set(slot.retained_bytes)
            self._metrics.slot_active.labels(slot.name).set(1 if slot.active else 0)
            last = self._confirmed.get(slot.name)
            if slot.confirmed_lsn is not None:
                self._confirmed[slot.name] = slot.confirmed_lsn
            if slot.wal_status == "lost" and slot.name not in self._gaps:
                self._gap(slot.name, "lost WAL it needed (wal_status=lost)")
            elif (
                last is not None
                and slot.confirmed_lsn is not None
                and slot.confirmed_lsn < last
                and slot.name not in self._gaps
            ):
                self._gap(
                    slot.name,
                    f"confirmed position went back ({last} -> {slot.confirmed_lsn} bytes: "
                    "recreated, the SoR restored from a backup?)",
                )
            elif slot.active and slot.wal_status != "lost" and slot.name in self._gaps:
                self._gaps.discard(slot.name)
                closable.append(slot.name)
            if not slot.active and slot.name not in self._inactive:
                self._inactive.add(slot.name)
                log.warning(
                    "replication slot %s has no consumer (its Debezium connector is down?): "
                    "it retains %d bytes of WAL and growing",
                    slot.name,
                    slot.retained_bytes,
                )
            elif slot.active and slot.name in self._inactive:
                self._inactive.discard(slot.name)
                log.info("replication slot %s has a consumer again", slot.name)
        self._seen |= present
        return closable

    def confirmed(self, name: str) -> int | None:
        """The confirmed position (WAL bytes) slot `name` had at the last check that saw it."""
        return self._confirmed.get(name)

    def _gap(self, name: str, what: str) -> None:
        self._gaps.add(name)
        self._metrics.wal_gaps.labels(name).inc()
        log.error(
            "replication slot %s %s: changes committed until a new slot streams are missing "
            "from the stream (a WAL gap); the index is reconciled with the SoR once the slot is "
            "back (runbook: docs/runbooks/RagstreamWalGap.md)",
            name,
            what,
        )
