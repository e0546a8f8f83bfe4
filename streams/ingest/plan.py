"""Stage 1, decode and plan: a batch of records becomes the work per entity (the last full state
of each entity in the batch), in segments a TRUNCATE separates. Records that cannot be decoded
or mapped, and policy rejections, become dead letters; nothing is written here.

Containment: whatever decoding or planning a record raises is that record's fault (its bytes
and its row are all these stages read), so it becomes a dead letter naming the table, column,
entity and tenant as far as they can be read, and the batch goes on. Only an outage of a
dependency (`RETRYABLE`) or a configuration error stops the batch."""

from __future__ import annotations

import json
import logging
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from ragcore.errors import ConfigError, MappingError, RagstreamError
from ragcore.plan import Action, Plan, RecordIdentity
from ragcore.store.ids import TenantId
from schemas.events import ChangeEvent, RawRecord
from streams.consumer import RETRYABLE, DeadLetter
from streams.ingest.context import Stages
from streams.ingest.ports import Decoder, Planner
from streams.ingest.work import Work

log = logging.getLogger("streams.ingest")

#: The code of a dead letter whose record raised something no stage expected (a bug to report:
#: logged with its traceback), instead of a typed error with its own code.
UNEXPECTED = "RECORD_UNPROCESSABLE"

#: What a dead letter can say of a record's table, entity and tenant
#: (`ragcore.plan.record_identity`).
Locator = Callable[[ChangeEvent], RecordIdentity]


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
    locate: Locator | None = None,
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
        except (*RETRYABLE, ConfigError):
            raise
        except Exception as exc:  # noqa: BLE001 - the record's bytes are its own fault
            letters.append(fault_letter(rec, exc, "decode"))
            stages.count(rec.topic, "?", "dlq")
            continue
        finally:
            decode_s += time.perf_counter() - t0
        t1 = time.perf_counter()
        try:
            planned = plan(event)
        except (*RETRYABLE, ConfigError):
            raise
        except Exception as exc:  # noqa: BLE001 - the record's row is its own fault
            identity = _identify(locate, event)
            letters.append(fault_letter(rec, exc, "plan", identity))
            stages.count(rec.topic, event.op, "dlq")
            continue
        finally:
            plan_s += time.perf_counter() - t1
        if planned.action is Action.SKIP:
            stages.count(rec.topic, event.op or event.kind.value, "skipped")
            continue
        if planned.action is Action.DLQ:
            letters.append(
                DeadLetter(
                    rec,
                    f"POLICY_{planned.reason.upper()}",
                    planned.detail,
                    "plan",
                    table=planned.table,
                )
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


def fault_reason(exc: Exception, stage: str, where: str) -> tuple[str, str]:
    """The code and message of a dead letter or rejection for `exc`, raised by `stage` while
    processing the record or entity `where` names: a typed error keeps its code; anything
    else is `RECORD_UNPROCESSABLE`, logged with its traceback (a stage let it through: a bug to
    report, but never the partition's end)."""
    if isinstance(exc, RagstreamError):
        return exc.code, str(exc)
    log.error(
        "%s: %s raised %s; dead-lettered as %s",
        where,
        stage,
        type(exc).__name__,
        UNEXPECTED,
        exc_info=exc,
    )
    return UNEXPECTED, f"{stage}: unexpected {type(exc).__name__}: {exc}"


def fault_letter(
    rec: RawRecord, exc: Exception, stage: str, identity: RecordIdentity | None = None
) -> DeadLetter:
    """The dead letter of a record whose decoding or planning raised `exc` (`fault_reason`)."""
    code, message = fault_reason(exc, stage, f"{rec.topic}[{rec.partition}]@{rec.offset}")
    identity = identity or RecordIdentity()
    return DeadLetter(
        rec,
        code,
        message,
        stage,
        table=identity.table,
        column=exc.column if isinstance(exc, MappingError) else None,
        entity_id=identity.entity_id,
        tenant_id=identity.tenant_id,
    )


def _identify(locate: Locator | None, event: ChangeEvent) -> RecordIdentity | None:
    return None if locate is None else locate(event)


def _reindex_plan(rec: RawRecord, letters: list[DeadLetter], stages: Stages) -> Plan | None:
    """A reindex request from Retrieve -> re-read the entity from the SoR (a refetch)."""
    try:
        doc = json.loads(rec.value or b"")
        if not isinstance(doc, dict):
            raise TypeError("a reindex request is a JSON object")
        tenant, entity_id = doc["tenant"], doc["entity_id"]
        if not isinstance(tenant, str) or not isinstance(entity_id, str) or not entity_id:
            raise TypeError("tenant and entity_id must be strings")
        valid = TenantId(tenant)
    except RecursionError:
        _bad_request(rec, letters, stages, "nested too deeply")
        return None
    except (ValueError, KeyError, TypeError, RagstreamError) as exc:
        _bad_request(rec, letters, stages, str(exc))
        return None
    return Plan(
        Action.REFETCH,
        "reindex_request",
        rec.position,
        tenant_id=valid,
        entity_id=entity_id,
        detail=f"Retrieve found it {doc.get('reason', 'stale')}: re-read from the SoR",
    )


def _bad_request(rec: RawRecord, letters: list[DeadLetter], stages: Stages, why: str) -> None:
    letters.append(DeadLetter(rec, "BAD_REINDEX_REQUEST", why, "decode"))
    stages.count(rec.topic, "reindex", "dlq")


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
