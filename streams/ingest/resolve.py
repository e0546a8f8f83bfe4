"""Stage 2, resolve: each entity's work becomes a row to upsert or a delete. Deletes and
truncates are written here; a refetch (a TOAST placeholder, a reindex request, a repair) reads
the row the SoR holds now, and a row that is gone is deleted."""

from __future__ import annotations

import logging
import time
from collections.abc import Sequence
from dataclasses import dataclass

from ragcore.errors import MappingError, SorTableError
from ragcore.plan import Action, Plan
from ragcore.store.base import ENTITY_ID, SOURCE_TABLE, StoreFilter
from ragcore.store.points import VERSION_LSN
from schemas.entities import Entity
from streams.ingest.context import Stages
from streams.ingest.work import NO_FAULTS, Faults, Work
from streams.ingest.write import delete_entity, delete_in_tenant

log = logging.getLogger("streams.ingest")


@dataclass(frozen=True, slots=True)
class Resolved:
    """The rows to upsert (by entity, the last word of the segment), the work done here
    (deletes, truncates, upserts a re-read overrode), re-reads a truncate asks for (applied
    after this segment) and what could not be resolved."""

    upserts: tuple[tuple[Work, Entity], ...]
    applied: tuple[Work, ...]
    rereads: tuple[Work, ...]
    faults: Faults


def resolve(work: Sequence[Work], stages: Stages) -> Resolved:
    """Write the segment's deletes and truncates, re-read its refetches."""
    # by entity id: a refetched row (the SoR's current state) replaces an earlier upsert
    upserts: dict[str, tuple[Work, Entity]] = {}
    applied: list[Work] = []
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
                    applied.append(replaced[0])
            if entity is not None:
                upserts[entity.entity_id] = (item, entity)
        else:
            assert plan.entity is not None
            upserts[plan.entity.entity_id] = (item, plan.entity)
        if plan.previous_tenant_id is not None and plan.entity_id is not None:
            delete_in_tenant(plan.previous_tenant_id, plan.entity_id, stages)
    return Resolved(tuple(upserts.values()), tuple(applied), tuple(rereads), faults)


def _refetch(item: Work, stages: Stages) -> tuple[bool, Entity | None, Faults]:
    """(whether the SoR could say, the entity it holds now, faults). A row that is gone is
    deleted here; an entity whose table the SoR reader cannot read is left as it is."""
    plan = item.plan
    if stages.rows is None:
        return False, None, stages.reject(item, "CONTENT_UNAVAILABLE", plan.detail)
    try:
        entity = stages.rows.fetch_entity(plan)
    except (MappingError, SorTableError) as exc:
        # nothing is known about the row: never delete what cannot be seen
        reason = f"cannot re-read {plan.entity_id}: {exc}"
        return False, None, stages.reject(item, exc.code, reason)
    if entity is None:
        # The row is gone from the SoR: its chunks must go too.
        assert plan.entity_id is not None
        delete_entity(plan.tenant_id, plan.entity_id, stages)
        stages.count_all(item, "deleted")
        return True, None, NO_FAULTS
    stages.count_all(item, "refetched")
    return True, entity, NO_FAULTS


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
        for target in stages.targets.write_targets(tenant):
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
