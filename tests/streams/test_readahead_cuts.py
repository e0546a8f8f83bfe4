"""Rescans stopped early (`ReadAhead.due_cuts`): the records at the head do not wait for the
re-read of records that would all be dropped again."""

from __future__ import annotations

import pytest

from streams.offsets import Seen
from streams.readahead import ReadAhead, Route
from streams.scheduler import Lane, Scheduler, SchedulerConfig, Unit

pytestmark = pytest.mark.unit

TP = ("sor.public.entities", 0)


def fetch(readahead: ReadAhead, scheduler: Scheduler[list[int]], offset: int, tenant: str) -> str:
    """One fetched record, as the consumer's intake takes it: what became of it."""
    seen = readahead.classify(TP, offset)
    if seen is not Seen.NEW:
        return "duplicate"
    if readahead.known_drop(TP, offset):
        return "known drop"
    route = Route(tenant, Lane.LIVE, f"{tenant}-{offset}")
    if not readahead.decide(TP, offset, route, 100):
        return "dropped"
    scheduler.add(Unit(TP, [offset], route.key, tenant, Lane.LIVE, [offset], 100, False))
    return "kept"


def drain(readahead: ReadAhead, scheduler: Scheduler[list[int]]) -> None:
    batch = scheduler.take(0)
    while batch:
        scheduler.complete(batch)
        readahead.finish(TP, [o for u in batch for o in u.offsets])
        batch = scheduler.take(0)


def test_a_rescan_stops_once_what_is_left_would_be_dropped_again() -> None:
    scheduler: Scheduler[list[int]] = Scheduler(
        SchedulerConfig(max_records=8, tenant_share=0.5, express_units=0), lambda a, b: a + b
    )
    readahead = ReadAhead(scheduler)  # type: ignore[arg-type]
    readahead.assign(TP, 0)
    # a bulk of globex: 4 kept (its share), 16 dropped; then acme at the head
    outcomes = [fetch(readahead, scheduler, o, "globex") for o in range(20)]
    assert outcomes.count("kept") == 4 and outcomes.count("dropped") == 16
    assert fetch(readahead, scheduler, 20, "acme") == "kept"
    drain(readahead, scheduler)
    assert readahead.due_rescans() == [(TP, 4)]
    assert readahead.due_cuts() == []  # nothing re-read yet: globex has room
    # the rescan re-reads globex until its share is full again and it drops one
    again = [fetch(readahead, scheduler, o, "globex") for o in range(4, 9)]
    assert again == ["kept"] * 4 + ["known drop"]
    # what is left (9-19) is globex's, dropped before and now again: skip it
    assert readahead.due_cuts() == [(TP, 21)]
    assert readahead.cuts == 1
    assert fetch(readahead, scheduler, 21, "acme") == "kept"  # the head, at once
    point = readahead.commit_point(TP)
    assert point is not None and point.offset == 4  # nothing dropped is committed past
    drain(readahead, scheduler)
    # the next rescan starts where the first one stopped and knows 9-19 without decoding
    assert readahead.due_rescans() == [(TP, 8)]
    assert [fetch(readahead, scheduler, o, "globex") for o in range(8, 12)] == ["kept"] * 4
    assert fetch(readahead, scheduler, 12, "globex") == "known drop"
    readahead.check()


def test_a_rescan_is_not_cut_while_another_tenants_dropped_record_is_ahead() -> None:
    scheduler: Scheduler[list[int]] = Scheduler(
        SchedulerConfig(max_records=8, tenant_share=0.5, express_units=0), lambda a, b: a + b
    )
    readahead = ReadAhead(scheduler)  # type: ignore[arg-type]
    readahead.assign(TP, 0)
    for o in range(10):
        fetch(readahead, scheduler, o, "globex")  # 0-3 kept, 4-9 dropped
    for o in range(10, 16):
        fetch(readahead, scheduler, o, "initech")  # 10-13 kept, 14-15 dropped
    drain(readahead, scheduler)
    assert readahead.due_rescans() == [(TP, 4)]
    assert [fetch(readahead, scheduler, o, "globex") for o in range(4, 9)][-1] == "known drop"
    # globex is full again, but initech's dropped 14-15 lie ahead and initech has room
    assert readahead.due_cuts() == []
    fetch(readahead, scheduler, 9, "globex")
    for o in range(10, 14):
        assert fetch(readahead, scheduler, o, "initech") == "duplicate"
    assert fetch(readahead, scheduler, 14, "initech") == "kept"
    assert fetch(readahead, scheduler, 15, "initech") == "kept"
    readahead.check()
