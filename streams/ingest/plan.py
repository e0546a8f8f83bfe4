"""Stage 1, decode and plan: a batch of records becomes the work per entity (the last full state
of each entity in the batch), in segments a TRUNCATE separates. Records that cannot be decoded
or mapped, and policy rejections, become dead letters; nothing is written here."""

from __future__ import annotations

import json
import time
from collections.abc import Sequence
from dataclasses import dataclass

from ragcore.errors import DecodeError, InvalidTenantError, MappingError, RecordTooLargeError
from ragcore.plan import Action, Plan
from ragcore.store.ids import validate_tenant
from schemas.events import RawRecord
from streams.consumer import DeadLetter
from streams.ingest.context import Stages
from streams.ingest.ports import Decoder, Planner
from streams.ingest.work import Work


@dataclass(frozen=True, slots=True)
class Planned:
    """A batch's work per entity, in segments applied one after the other, and its dead letters."""

    segments: tuple[tuple[Work, ...], ...]
    letters: tuple[DeadLetter, ...]


def plan_records(
    records: Sequence[RawRecord],
    *,
    decode: Decoder,
    plan: Planner,
    reindex_topic: str | None,
    stages: Stages,
) -> Planned:
    """The batch's work per entity, in segments: a TRUNCATE is a segment of its own, so what
    came before it is applied before it, and what came after, after."""
    letters: list[DeadLetter] = []
    segments: list[tuple[Work, ...]] = []
    by_entity: dict[tuple[str, bool], Work] = {}
    decode_s = plan_s = 0.0
    for rec in records:
        if reindex_topic is not None and rec.topic == reindex_topic:
            request = _reindex_plan(rec, letters, stages)
            if request is not None:
                _reduce(by_entity, request, rec)
            continue
        t0 = time.perf_counter()
        try:
            event = decode(rec)
        except DecodeError as exc:
            letters.append(DeadLetter(rec, exc.code, str(exc), "decode"))
            stages.count(rec.topic, "?", "dlq")
            continue
        finally:
            decode_s += time.perf_counter() - t0
        t1 = time.perf_counter()
        try:
            planned = plan(event)
        except (MappingError, RecordTooLargeError) as exc:
            letters.append(DeadLetter(rec, exc.code, str(exc), "plan"))
            stages.count(rec.topic, event.op, "dlq")
            continue
        finally:
            plan_s += time.perf_counter() - t1
        if planned.action is Action.SKIP:
            stages.count(rec.topic, event.op or event.kind.value, "skipped")
            continue
        if planned.action is Action.DLQ:
            letters.append(
                DeadLetter(rec, f"POLICY_{planned.reason.upper()}", planned.detail, "plan")
            )
            stages.count(rec.topic, event.op or event.kind.value, "dlq")
            continue
        if planned.action is Action.TRUNCATE:
            segments += [tuple(by_entity.values()), (Work(planned, (rec,)),)]
            by_entity = {}
            continue
        _reduce(by_entity, planned, rec)
    segments.append(tuple(by_entity.values()))
    stages.metrics.stage_seconds.labels("decode").observe(decode_s)
    stages.metrics.stage_seconds.labels("plan").observe(plan_s)
    return Planned(tuple(s for s in segments if s), tuple(letters))


def _reindex_plan(rec: RawRecord, letters: list[DeadLetter], stages: Stages) -> Plan | None:
    """A reindex request from Retrieve -> re-read the entity from the SoR (a refetch)."""
    try:
        doc = json.loads(rec.value or b"")
        tenant, entity_id = doc["tenant"], doc["entity_id"]
        if not isinstance(tenant, str) or not isinstance(entity_id, str) or not entity_id:
            raise TypeError("tenant and entity_id must be strings")
        validate_tenant(tenant)
    except (ValueError, KeyError, TypeError, InvalidTenantError) as exc:
        letters.append(DeadLetter(rec, "BAD_REINDEX_REQUEST", str(exc), "decode"))
        stages.count(rec.topic, "reindex", "dlq")
        return None
    return Plan(
        Action.REFETCH,
        "reindex_request",
        rec.position,
        tenant_id=tenant,
        entity_id=entity_id,
        detail=f"Retrieve found it {doc.get('reason', 'stale')}: re-read from the SoR",
    )


def _reduce(by_entity: dict[tuple[str, bool], Work], plan: Plan, rec: RawRecord) -> None:
    """Keep, per entity, the work that decides its state after this batch.

    Kafka keys changes by primary key, so one entity's events share a partition and arrive
    in commit order: the last full state (upsert or delete) supersedes everything before it.
    A refetch (TOAST placeholder) carries no content, so it does not supersede an earlier
    upsert of the batch: that upsert is applied, and the refetch after it.
    """
    assert plan.entity_id is not None  # every non-skip plan names its entity
    refetch = plan.action is Action.REFETCH
    superseded: list[RawRecord] = []
    for key in (
        [(plan.entity_id, True)] if refetch else [(plan.entity_id, False), (plan.entity_id, True)]
    ):
        previous = by_entity.pop(key, None)
        if previous is not None:
            superseded.extend(previous.records)
    by_entity[(plan.entity_id, refetch)] = Work(plan, (*superseded, rec))
