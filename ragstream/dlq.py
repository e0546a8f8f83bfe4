"""`ragstream dlq replay`: bring back what was dead-lettered, once its cause is fixed.

Each dead-lettered change record names an entity (its table's key) and usually its tenant. The
replay reads that identity with the *current* table mappings (`ragcore.plan.identity_of`: key and
tenant columns only, so a record that lacks a since-restored column still names its entity) and
re-reads each named entity from the system of record through the worker's write path
(`IngestHandler.reread`): what the SoR holds now is indexed, a row that is gone is deleted.
Re-reading instead of re-applying the old event means the replay can never put an outdated
version over a newer one, and running it twice is harmless.

Records whose cause is not fixed (they cannot be decoded, their table is not mapped, or their
entity still cannot be read or indexed, e.g. a mapped column is still missing in the SoR) are
listed and nothing is committed: the command exits 1 and the next run sees them again. When
everything was replayed, the replay group's offsets are committed, so a
later run starts after them (`--from-beginning` reads the whole DLQ again). Records dead-lettered
by policy (`POLICY_*`: a truncate or logical message the policy sends to the DLQ) name no
entity and are left alone.

The DLQ has retention like any topic. A replay group whose committed offset fell below the
log start never reads the records in between: no offset jumps silently
(`auto.offset.reset=error`); the replay starts at the log start, names the lost offsets in the
report (`lost_to_retention`) and an ERROR, and exits 1 even when everything it read was
replayed, because the entities those records named can only be brought back by
`ragstream reconcile --repair`.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol

from confluent_kafka import OFFSET_BEGINNING, Consumer, KafkaError, TopicPartition

from ragcore.errors import RagstreamError
from ragcore.kafka_config import KafkaSettings
from ragcore.plan import PlanConfig, identity_of
from schemas.events import ChangeEvent, RawRecord
from streams.consumer import DLQ_HEADER_PREFIX, OffsetGap, offset_gap, to_raw
from streams.ingest import Rejection

log = logging.getLogger(__name__)

_CODE = DLQ_HEADER_PREFIX + "error.code"
_SOURCE = DLQ_HEADER_PREFIX + "source."


class Rereader(Protocol):
    """The worker's re-read path (`IngestHandler.reread`)."""

    def reread(self, tenant_id: str, entity_ids: Sequence[str], reason: str) -> list[Rejection]:
        """Re-read entities from the SoR and apply what it holds now."""
        ...


@dataclass
class ReplayReport:
    """What a replay did."""

    read: int = 0
    entities: int = 0
    skipped: int = 0
    failing: list[dict[str, Any]] = field(default_factory=list)
    #: DLQ offsets deleted by retention before the replay group read them
    lost: list[OffsetGap] = field(default_factory=list)
    committed: bool = False

    @property
    def ok(self) -> bool:
        """Whether everything dead-lettered was replayed (nothing failing, nothing lost)."""
        return not self.failing and not self.lost

    def as_dict(self) -> dict[str, Any]:
        """JSON form (the command's output)."""
        return {
            "read": self.read,
            "entities_reread": self.entities,
            "skipped": self.skipped,
            "still_failing": self.failing,
            "lost_to_retention": [gap.describe() for gap in self.lost],
            "committed": self.committed,
        }


def original_record(dlq: RawRecord) -> tuple[RawRecord, str]:
    """The record as it was before it was dead-lettered (its source topic, partition and offset
    from the `ragstream.source.*` headers), and the error code it was dead-lettered with."""
    found = {k: (v or b"").decode() for k, v in dlq.headers if k.startswith(DLQ_HEADER_PREFIX)}
    original = tuple((k, v) for k, v in dlq.headers if not k.startswith(DLQ_HEADER_PREFIX))
    topic = found.get(_SOURCE + "topic")
    if not topic:
        raise RagstreamError(f"{dlq.topic}[{dlq.partition}]@{dlq.offset}: no source headers")
    return (
        RawRecord(
            topic=topic,
            partition=int(found.get(_SOURCE + "partition") or 0),
            offset=int(found.get(_SOURCE + "offset") or 0),
            key=dlq.key,
            value=dlq.value,
            headers=original,
        ),
        found.get(_CODE, ""),
    )


def replay_records(
    records: Sequence[RawRecord],
    *,
    decode: Callable[[RawRecord], ChangeEvent],
    config: PlanConfig,
    handler: Rereader,
    known_tenants: Callable[[], Sequence[str]],
) -> ReplayReport:
    """Re-read every entity the dead-lettered `records` name (see the module docstring)."""
    report = ReplayReport(read=len(records))
    by_tenant: dict[str, dict[str, RawRecord]] = {}
    for dlq in records:
        where = f"{dlq.topic}[{dlq.partition}]@{dlq.offset}"
        try:
            raw, code = original_record(dlq)
            if code.startswith("POLICY_"):
                report.skipped += 1
                continue
            named = identity_of(decode(raw), config)
        except RagstreamError as exc:
            report.failing.append({"dlq": where, "code": exc.code, "reason": str(exc)})
            continue
        if named is None:
            report.skipped += 1
            continue
        entity_id, tenants = named
        # a delete whose row carried no tenant: wherever the entity may be indexed
        for tenant in [t for t in tenants if t is not None] or list(known_tenants()):
            by_tenant.setdefault(tenant, {})[entity_id] = dlq
    for tenant, entities in sorted(by_tenant.items()):
        report.entities += len(entities)
        for rejection in handler.reread(tenant, list(entities), "dlq_replay"):
            source = entities.get(rejection.entity_id)
            where = f"{source.topic}[{source.partition}]@{source.offset}" if source else "?"
            report.failing.append(
                {
                    "dlq": where,
                    "entity_id": rejection.entity_id,
                    "code": rejection.code,
                    "reason": rejection.reason,
                }
            )
    return report


def read_dlq(
    kafka: KafkaSettings,
    topic: str,
    group_id: str,
    *,
    from_beginning: bool,
    idle_s: float = 3.0,
    limit: int = 100_000,
    high_watermark_slack: int = 0,
) -> tuple[Consumer, list[RawRecord], list[OffsetGap]]:
    """Every DLQ record after the replay group's committed offsets (or all of them), read until
    nothing arrives for `idle_s`, and the gaps: partitions whose committed offset lies outside
    the log (read from the log start instead; `high_watermark_slack` as the worker's consumer
    setting of that name). The consumer stays open for `commit`."""
    consumer = Consumer(
        {
            **kafka.client_config(),
            "group.id": group_id,
            "enable.auto.commit": False,
            # Start positions are chosen below; an offset out of range is an error, not a jump.
            "auto.offset.reset": "error",
            "session.timeout.ms": 6000,
            "heartbeat.interval.ms": 500,
            "fetch.wait.max.ms": 50,
        }
    )
    try:
        partitions, gaps = _start_positions(consumer, topic, from_beginning, high_watermark_slack)
    except BaseException:
        consumer.close()
        raise
    for gap in gaps:
        log.error(
            "dead-lettered records lost to the DLQ's retention before this replay read them: %s; "
            "run `ragstream reconcile --repair` for the entities they named",
            gap.describe(),
        )
    consumer.assign(partitions)
    records: list[RawRecord] = []
    while len(records) < limit:
        msg = consumer.poll(idle_s)
        if msg is None:
            break
        err = msg.error()
        if err is not None:
            if err.code() == KafkaError._PARTITION_EOF:
                continue
            consumer.close()
            raise RagstreamError(f"reading the DLQ failed: {err}")
        records.append(to_raw(msg))
    return consumer, records, gaps


def _start_positions(
    consumer: Consumer, topic: str, from_beginning: bool, slack: int
) -> tuple[list[TopicPartition], list[OffsetGap]]:
    """Where the replay reads each partition of `topic`: its first retained offset when reading
    from the beginning or when the group never committed; else the committed offset, or the
    log start when that offset lies outside the log (a gap)."""
    metadata = consumer.list_topics(topic, timeout=10)
    meta = metadata.topics.get(topic)
    if meta is None or meta.error is not None or not meta.partitions:
        raise RagstreamError(f"DLQ topic {topic!r} does not exist")
    partitions = [TopicPartition(topic, p) for p in sorted(meta.partitions)]
    if from_beginning:
        return [TopicPartition(topic, p.partition, OFFSET_BEGINNING) for p in partitions], []
    starts: list[TopicPartition] = []
    gaps: list[OffsetGap] = []
    for tp in consumer.committed(partitions, timeout=10):
        if tp.offset < 0:
            starts.append(TopicPartition(topic, tp.partition, OFFSET_BEGINNING))
            continue
        marks = consumer.get_watermark_offsets(
            TopicPartition(topic, tp.partition), timeout=10, cached=False
        )
        if marks is None:
            raise RagstreamError(f"the watermarks of {topic}[{tp.partition}] are unknown")
        gap = offset_gap(topic, tp.partition, tp.offset, *marks, slack=slack)
        if gap is not None:
            gaps.append(gap)
        starts.append(TopicPartition(topic, tp.partition, tp.offset if gap is None else gap.low))
    return starts, gaps


def replay_dlq(
    kafka: KafkaSettings,
    topic: str,
    group_id: str,
    *,
    decode: Callable[[RawRecord], ChangeEvent],
    config: PlanConfig,
    handler: Rereader,
    known_tenants: Callable[[], Sequence[str]],
    from_beginning: bool = False,
    idle_s: float = 3.0,
    high_watermark_slack: int = 0,
) -> ReplayReport:
    """`ragstream dlq replay`: read the DLQ (`read_dlq`), replay what it holds
    (`replay_records`) and, when nothing still fails, commit the replay group past it."""
    consumer, records, gaps = read_dlq(
        kafka,
        topic,
        group_id,
        from_beginning=from_beginning,
        idle_s=idle_s,
        high_watermark_slack=high_watermark_slack,
    )
    try:
        report = replay_records(
            records, decode=decode, config=config, handler=handler, known_tenants=known_tenants
        )
        report.lost = gaps
        if not report.failing:
            # past the gaps too: they are reported once, the reconcile repairs what they named
            commit_after(consumer, records, gaps)
            report.committed = True
    finally:
        consumer.close()
    return report


def commit_after(
    consumer: Consumer, records: Sequence[RawRecord], gaps: Sequence[OffsetGap] = ()
) -> None:
    """Commit the replay group past `records`, and at least to the log start of each gap's
    partition (a gap with no record read after it is not reported again)."""
    last: dict[tuple[str, int], int] = {(g.topic, g.partition): g.low - 1 for g in gaps}
    for rec in records:
        key = (rec.topic, rec.partition)
        last[key] = max(rec.offset, last.get(key, -1))
    if last:
        consumer.commit(
            offsets=[TopicPartition(t, p, o + 1) for (t, p), o in last.items()], asynchronous=False
        )
