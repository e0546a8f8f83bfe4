"""Stage 2, resolve: each entity's work becomes a row to upsert or a delete. Deletes and
truncates are written here. A refetch (a TOAST placeholder, a reindex request from Retrieve, a
reconcile repair, a reindex catch-up) re-reads the row the SoR holds now: that read is the
truth at the time of the read, whatever its timestamps (docs/decisions/change-ordering.md).
It is guarded against a race with the stream: the indexed state is observed before the SoR is
read, and the row is written (or, when it is gone, deleted) only where that state is still the
one observed, so a change that landed meanwhile is never overwritten."""

from __future__ import annotations

import logging
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from ragcore.errors import MappingError, SorTableError
from ragcore.plan import Action, Plan
from ragcore.store.base import ENTITY_ID, SOURCE_TABLE, StoreFilter
from ragcore.store.points import VERSION_LSN
from schemas.entities import Entity
from streams.ingest.context import Stages
from streams.ingest.indexed import Key, fingerprint, manifests, observe
from streams.ingest.work import NO_FAULTS, Faults, Fingerprint, RereadOutcome, Upsert, Work
from streams.ingest.write import delete_entity, delete_in_tenant

log = logging.getLogger("streams.ingest")


@dataclass(frozen=True, slots=True)
class Resolved:
    """The rows to upsert (by entity, the last word of the segment), the work done here
    (deletes, truncates, upserts a re-read overrode), what became of the re-reads whose row is
    gone (`gone`: "changed" when deleted, "raced" when the index changed meanwhile, "unchanged"
    when nothing was indexed), re-reads a truncate asks for (applied after this segment) and
    what could not be resolved."""

    upserts: tuple[Upsert, ...]
    applied: tuple[Work, ...]
    gone: tuple[tuple[Work, RereadOutcome], ...]
    rereads: tuple[Work, ...]
    faults: Faults


def resolve(work: Sequence[Work], stages: Stages) -> Resolved:
    """Write the segment's deletes and truncates, re-read its refetches."""
    # the indexed state each re-read may replace, observed before the SoR is read
    observed = observe(
        (
            (item.plan.tenant_id, item.plan.entity_id)
            for item in work
            if item.plan.action is Action.REFETCH
            and item.plan.tenant_id is not None
            and item.plan.entity_id is not None
        ),
        stages,
    )
    # by entity id: a refetched row (the SoR's current state) replaces an earlier upsert
    upserts: dict[str, Upsert] = {}
    applied: list[Work] = []
    gone: list[tuple[Work, RereadOutcome]] = []
    rereads: list[Work] = []
    faults = NO_FAULTS
    for item in work:
        plan = item.plan
        if plan.action is Action.TRUNCATE:
            rereads += _truncate(item, stages)
            applied.append(item)
            continue
        if plan.action is Action.DELETE:
            assert plan.entity_id is not None
            delete_entity(plan.tenant_id, plan.entity_id, stages)
            applied.append(item)
            stages.count_all(item, "deleted")
        elif plan.action is Action.REFETCH:
            known, entity, fault = _refetch(item, stages)
            faults += fault
            if known:
                # the SoR's current row (or its absence) overrides an earlier upsert
                replaced = upserts.pop(plan.entity_id or "", None)
                if replaced is not None:
                    applied.append(replaced.item)
            if known and entity is None:
                gone.append((item, _delete_gone(item, observed, stages)))
            if entity is not None:
                mine = {c: f for (c, e), f in observed.items() if e == entity.entity_id}
                upserts[entity.entity_id] = Upsert(item, entity, mine)
        else:
            entity = plan.entity
            if plan.deferred is not None:
                # a document row's file is read now, one batch at a time
                try:
                    entity = plan.deferred.build()
                except MappingError as exc:  # DocumentError too: this entity's own fault
                    faults += stages.reject(item, exc.code, str(exc), column=exc.column)
                    continue
            assert entity is not None
            upserts[entity.entity_id] = Upsert(item, entity)
        if plan.previous_tenant_id is not None and plan.entity_id is not None:
            delete_in_tenant(plan.previous_tenant_id, plan.entity_id, stages)
    return Resolved(
        tuple(upserts.values()),
        tuple(applied),
        tuple(gone),
        tuple(rereads),
        faults,
    )


def _refetch(item: Work, stages: Stages) -> tuple[bool, Entity | None, Faults]:
    """(whether the SoR could say, the entity it holds now, faults); an entity whose table the
    SoR reader cannot read is left as it is."""
    plan = item.plan
    if stages.rows is None:
        return False, None, stages.reject(item, "CONTENT_UNAVAILABLE", plan.detail)
    try:
        entity = stages.rows.fetch_entity(plan)
    except (MappingError, SorTableError) as exc:
        # nothing is known about the row: never delete what cannot be seen
        reason = f"cannot re-read {plan.entity_id}: {exc}"
        column = exc.column if isinstance(exc, MappingError) else None
        return False, None, stages.reject(item, exc.code, reason, column=column)
    if entity is None:
        stages.count_all(item, "deleted")
        return True, None, NO_FAULTS
    stages.count_all(item, "refetched")
    return True, entity, NO_FAULTS


def _delete_gone(item: Work, observed: Mapping[Key, Fingerprint], stages: Stages) -> RereadOutcome:
    """The row is gone from the SoR: delete its chunks where the indexed state is still the
    one observed before the read; where a change landed meanwhile it is left to the stream
    (which delivers the delete after it)."""
    plan = item.plan
    assert plan.entity_id is not None
    if plan.tenant_id is None:  # no tenant to observe in: the plain delete of every tenant
        delete_entity(None, plan.entity_id, stages)
        return "changed"
    started = time.perf_counter()
    now = manifests([(plan.tenant_id, plan.entity_id)], stages, create=False)
    outcome: RereadOutcome = "unchanged"
    for target in stages.targets.existing_targets(plan.tenant_id):
        key = (target.collection, plan.entity_id)
        refs = now.get(key, {})
        if not refs:
            continue
        if fingerprint(refs) != observed.get(key, frozenset()):
            outcome = "raced" if outcome == "unchanged" else outcome
            continue
        stages.store.delete_points(target.collection, [r.point_id for r in refs.values()])
        stages.metrics.chunks_deleted.inc(len(refs))
        outcome = "changed"
    stages.metrics.stage_seconds.labels("write").observe(time.perf_counter() - started)
    return outcome


def _truncate(item: Work, stages: Stages) -> list[Work]:
    """A TRUNCATE of a mapped table: remove, in every tenant and write target, the table's
    entities indexed from changes before it (their LSN is lower). Entities indexed without
    an LSN (from SoR reads) are to be re-read from the SoR when there is one (returned), else
    removed; those indexed from later changes stay (a truncate is key-less: it may overtake or
    trail row events of other partitions)."""
    plan = item.plan
    assert plan.table is not None
    cutoff = plan.version.lsn if plan.version is not None else None
    started = time.perf_counter()
    removed = 0
    rereads: list[Work] = []
    for tenant in stages.targets.known_tenants():
        reread: set[str] = set()
        for target in stages.targets.existing_targets(tenant):
            flt = StoreFilter(tenant_id=tenant, keywords={SOURCE_TABLE: (plan.table,)})
            doomed: list[str] = []
            for point in stages.store.scroll(
                target.collection, flt, fields=(ENTITY_ID, VERSION_LSN)
            ):
                lsn = point.payload.get(VERSION_LSN)
                if cutoff is not None and isinstance(lsn, int):
                    if lsn < cutoff:
                        doomed.append(point.point_id)
                elif stages.rows is not None:
                    reread.add(str(point.payload[ENTITY_ID]))
                else:
                    doomed.append(point.point_id)
            if doomed:
                stages.store.delete_points(target.collection, doomed, wait=True)
                stages.metrics.chunks_deleted.inc(len(doomed))
                removed += len(doomed)
        rereads += [
            Work(Plan(Action.REFETCH, "truncate", plan.position, tenant_id=tenant, entity_id=e))
            for e in sorted(reread)
        ]
    stages.metrics.stage_seconds.labels("write").observe(time.perf_counter() - started)
    log.info("truncate of %s: %d chunks removed", plan.table, removed)
    stages.count_all(item, "truncated")
    return rereads
