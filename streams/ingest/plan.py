"""Stage 1, decode and plan: each record becomes its place in the scheduler (`route`: tenant,
lane, key, barrier) and the work it asks of the index (`Pending`: per entity, the last full
state; a TRUNCATE alone), or a dead letter. Nothing is written here.

Containment: whatever decoding or planning a record raises is that record's fault (its bytes
and its row are all these stages read), so it becomes a dead letter naming the table, column,
entity and tenant as far as they can be read, and the lane goes on. Only an outage of a
dependency (`RETRYABLE`) or a configuration error stops it."""

from __future__ import annotations

import json
import logging
import re
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from functools import partial

from ragcore.errors import ConfigError, MappingError, RagstreamError
from ragcore.mapping import table_of_entity
from ragcore.plan import Action, Plan, RecordIdentity
from ragcore.store.ids import TenantId
from schemas.events import ChangeEvent, Op, RawRecord, RecordKind
from streams.consumer import RETRYABLE, DeadLetter
from streams.ingest.context import Stages
from streams.ingest.ports import Decoder, Planner
from streams.ingest.work import Work
from streams.readahead import Route
from streams.scheduler import Lane

log = logging.getLogger("streams.ingest")

#: The code of a dead letter whose record raised something no stage expected (a bug to report:
#: logged with its traceback), instead of a typed error with its own code.
UNEXPECTED = "RECORD_UNPROCESSABLE"

#: What a dead letter can say of a record's table, entity and tenant
#: (`ragcore.plan.record_identity`).
Locator = Callable[[ChangeEvent], RecordIdentity]

#: What a dead letter can say of the table of a record that cannot be decoded: the mapped
#: table whose changes arrive on its topic (None: no table's).
TopicTable = Callable[[str], str | None]

#: A UTF-16 surrogate code point: never a character on its own.
_SURROGATE = re.compile(r"[\ud800-\udfff]")

#: Record kinds that never change the index: finished as soon as they are read.
_NO_WORK = frozenset({RecordKind.TOMBSTONE, RecordKind.HEARTBEAT, RecordKind.TRANSACTION})


@dataclass(frozen=True)
class Pending:
    """What one unit of the scheduler asks of the index: per entity, the work that decides its
    state (`works`, keyed by (entity id, refetch): the last full state, and a refetch after
    it), a TRUNCATE (alone: a barrier), the dead letters of its records, its lane, and when its
    first record was read (`started`, the handler's clock)."""

    works: Mapping[tuple[str, bool], Work] = field(default_factory=dict)
    truncate: Work | None = None
    letters: tuple[DeadLetter, ...] = ()
    lane: Lane = Lane.LIVE
    started: float = 0.0

    @property
    def records(self) -> int:
        """The records this pending work covers."""
        count = sum(len(w.records) for w in self.works.values()) + len(self.letters)
        return count + (len(self.truncate.records) if self.truncate is not None else 0)

    def merge(self, later: Pending) -> Pending | None:
        """This work with `later`'s of the same key after it (the later full state supersedes,
        a refetch follows an upsert): None when either is a TRUNCATE (never merged)."""
        if self.truncate is not None or later.truncate is not None:
            return None
        works = dict(self.works)
        for work in later.works.values():
            reduce_work(works, work)
        return Pending(
            works,
            None,
            self.letters + later.letters,
            min(self.lane, later.lane),
            min(self.started, later.started),
        )


@dataclass(frozen=True)
class Deferred:
    """The records of one scheduler unit, routed but not planned: the intake thread only
    decodes and routes (planning a row costs 1.5-2.5x its decoding), so it reaches a quiet
    tenant's change queued behind a bulk sooner; the apply thread plans them, in offset order
    (`planned`). `heavy`: whether applying reads a document (known from the record's table)."""

    plans: tuple[Callable[[], Pending | None], ...]
    heavy: bool = False

    def merge(self, later: Deferred) -> Deferred:
        """This unit's records with `later`'s of the same key after them (never a barrier:
        the scheduler merges no barrier, so no TRUNCATE)."""
        return Deferred(self.plans + later.plans, self.heavy or later.heavy)

    def planned(self) -> Pending | None:
        """The unit's work: each record planned in order and merged (None: all skips)."""
        out: Pending | None = None
        for plan in self.plans:
            pending = plan()
            if pending is None:
                continue
            merged = pending if out is None else out.merge(pending)
            if merged is None:
                raise AssertionError("a TRUNCATE was merged with other records")
            out = merged
        return out


def route_record(
    rec: RawRecord,
    *,
    decode: Decoder,
    plan: Planner,
    reindex_topic: str | None,
    locate: Locator | None,
    stages: Stages,
    clock: Callable[[], float] = time.time,
    documents: frozenset[str] = frozenset(),
    topic_table: TopicTable | None = None,
) -> tuple[Route, Deferred] | None:
    """Where a record goes in the scheduler and its planning, deferred to the apply thread;
    None for a record that needs no work. Never raises for the record's content. `documents`:
    the labels of the tables whose entities are documents (applying a write or a re-read of
    one reads its file: few go in one batch); `topic_table` names the table of a record that
    cannot be decoded (by its topic)."""
    read_at = clock()
    if reindex_topic is not None and rec.topic == reindex_topic:
        request = _reindex_plan(rec, stages)
        if isinstance(request, DeadLetter):
            refused = Pending(letters=(request,), started=read_at)
            return Route("", Lane.REINDEX), Deferred((lambda: refused,))
        assert request.tenant_id is not None and request.entity_id is not None
        work = Work(request, (rec,))
        heavy = table_of_entity(request.entity_id) in documents
        pending = Pending({(request.entity_id, True): work}, lane=Lane.REINDEX, started=read_at)
        return Route(request.tenant_id, Lane.REINDEX, request.entity_id), Deferred(
            (lambda: pending,), heavy
        )
    started = time.perf_counter()
    try:
        event = decode(rec)
    except (*RETRYABLE, ConfigError):
        raise
    except Exception as exc:  # noqa: BLE001 - the record's bytes are its own fault
        table = topic_table(rec.topic) if topic_table is not None else None
        letter = fault_letter(rec, exc, "decode", RecordIdentity(table=table))
        stages.count(rec.topic, "?", "dlq")
        faulted = Pending(letters=(letter,), started=read_at)
        return Route(""), Deferred((lambda: faulted,))
    finally:
        stages.metrics.stage_seconds.labels("decode").observe(time.perf_counter() - started)
    if event.kind in _NO_WORK:
        stages.count(rec.topic, event.op or event.kind.value, "skipped")
        return None
    identity = _identify(locate, event) or RecordIdentity()
    lane = Lane.BULK if event.is_snapshot else Lane.LIVE
    barrier = event.kind in (RecordKind.TRUNCATE, RecordKind.SCHEMA_CHANGE) or (
        event.op is Op.UPDATE and identity.moved_from is not None
    )
    key = None if event.kind is not RecordKind.CHANGE else identity.entity_id
    route = Route(identity.tenant_id or "", lane, key, barrier)
    # a document row's write reads its file (a delete reads nothing)
    heavy = identity.table in documents and event.op is not Op.DELETE
    return route, Deferred(
        (
            partial(
                _prepare,
                rec,
                event,
                lane=lane,
                read_at=read_at,
                plan=plan,
                locate=locate,
                stages=stages,
            ),
        ),
        heavy,
    )


def _prepare(
    rec: RawRecord,
    event: ChangeEvent,
    *,
    lane: Lane,
    read_at: float,
    plan: Planner,
    locate: Locator | None,
    stages: Stages,
) -> Pending | None:
    """The record's work (None: a skip), or its dead letter."""
    started = time.perf_counter()
    try:
        planned = plan(event)
    except (*RETRYABLE, ConfigError):
        raise
    except Exception as exc:  # noqa: BLE001 - the record's row is its own fault
        letter = fault_letter(rec, exc, "plan", _identify(locate, event))
        stages.count(rec.topic, event.op, "dlq")
        return Pending(letters=(letter,), lane=lane, started=read_at)
    finally:
        stages.metrics.stage_seconds.labels("plan").observe(time.perf_counter() - started)
    if planned.action is Action.SKIP:
        stages.count(rec.topic, event.op or event.kind.value, "skipped")
        return None
    if planned.action is Action.DLQ:
        letter = DeadLetter(
            rec, f"POLICY_{planned.reason.upper()}", planned.detail, "plan", table=planned.table
        )
        stages.count(rec.topic, event.op or event.kind.value, "dlq")
        return Pending(letters=(letter,), lane=lane, started=read_at)
    if planned.action is Action.TRUNCATE:
        return Pending(truncate=Work(planned, (rec,)), lane=lane, started=read_at)
    works: dict[tuple[str, bool], Work] = {}
    reduce_work(works, Work(planned, (rec,)))
    return Pending(works, lane=lane, started=read_at)


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


def _reindex_plan(rec: RawRecord, stages: Stages) -> Plan | DeadLetter:
    """A reindex request from Retrieve -> re-read the entity from the SoR (a refetch)."""
    try:
        doc = json.loads(rec.value or b"")
        if not isinstance(doc, dict):
            raise TypeError("a reindex request is a JSON object")
        tenant, entity_id = doc["tenant"], doc["entity_id"]
        if not isinstance(tenant, str) or not isinstance(entity_id, str) or not entity_id:
            raise TypeError("tenant and entity_id must be strings")
        if not entity_id.isascii() and _SURROGATE.search(entity_id):
            # a JSON `\ud800` escape: no store filter or SoR query can take it
            raise ValueError("entity_id holds a lone surrogate, which is not Unicode text")
        valid = TenantId(tenant)
    except RecursionError:
        return _bad_request(rec, stages, "nested too deeply")
    except (ValueError, KeyError, TypeError, RagstreamError) as exc:
        return _bad_request(rec, stages, str(exc))
    return Plan(
        Action.REFETCH,
        "reindex_request",
        rec.position,
        tenant_id=valid,
        entity_id=entity_id,
        detail=f"Retrieve found it {doc.get('reason', 'stale')}: re-read from the SoR",
    )


def _bad_request(rec: RawRecord, stages: Stages, why: str) -> DeadLetter:
    stages.count(rec.topic, "reindex", "dlq")
    return DeadLetter(rec, "BAD_REINDEX_REQUEST", why, "decode")


def reduce_work(by_entity: dict[tuple[str, bool], Work], work: Work) -> None:
    """Keep, per entity, the work that decides its state.

    Kafka keys changes by primary key, so one entity's events arrive in commit order: the last
    full state (upsert or delete) supersedes everything before it. A refetch (TOAST
    placeholder, reindex request) carries no content, so it does not supersede an earlier
    upsert: that upsert is applied, and the refetch after it.
    """
    plan = work.plan
    assert plan.entity_id is not None  # every non-skip plan names its entity
    refetch = plan.action is Action.REFETCH
    superseded: list[RawRecord] = []
    tenants: list[TenantId | None] = []
    for key in (
        [(plan.entity_id, True)] if refetch else [(plan.entity_id, False), (plan.entity_id, True)]
    ):
        previous = by_entity.pop(key, None)
        if previous is not None:
            superseded.extend(previous.records)
            tenants.extend(previous.record_tenants())
    by_entity[(plan.entity_id, refetch)] = Work(
        plan, (*superseded, *work.records), (*tenants, *work.record_tenants())
    )
