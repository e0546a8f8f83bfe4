"""Rescans re-read by a reader of their own (`ReadAhead(reader=True)`): the main fetch never
goes back, so a change at the head waits for no re-read; order holds all the same (the model
test drives this at random: tests/streams/test_scheduler_model.py)."""

from __future__ import annotations

import pytest

from streams.offsets import Seen
from streams.readahead import ReadAhead, Route
from streams.scheduler import Lane, Scheduler, SchedulerConfig, Unit

pytestmark = pytest.mark.unit

TP = ("sor.public.entities", 0)


def setup() -> tuple[ReadAhead, Scheduler[list[int]]]:
    scheduler: Scheduler[list[int]] = Scheduler(
        SchedulerConfig(max_records=8, tenant_share=0.5, express_units=0), lambda a, b: a + b
    )
    readahead = ReadAhead(scheduler, reader=True)  # type: ignore[arg-type]
    readahead.assign(TP, 0)
    return readahead, scheduler


def rescanning(rows: int) -> tuple[ReadAhead, Scheduler[list[int]]]:
    """globex's bulk of `rows` fetched (0-3 kept, its share; the rest dropped), applied, and
    its rescan begun at 4."""
    readahead, scheduler = setup()
    for o in range(rows):
        fetch(readahead, scheduler, o, "globex")
    drain(readahead, scheduler)
    assert readahead.due_rescans() == [(TP, 4)]
    return readahead, scheduler


def fetch(
    readahead: ReadAhead,
    scheduler: Scheduler[list[int]],
    offset: int,
    tenant: str,
    *,
    reread: bool = False,
    barrier: bool = False,
) -> str:
    """One fetched record, as the consumer's intake takes it (`reread`: from the reader)."""
    seen = readahead.classify(TP, offset, reread=reread)
    if seen is not Seen.NEW:
        return "duplicate"
    if readahead.known_drop(TP, offset):
        return "known drop"
    key = None if barrier else f"{tenant}-{offset % 3}"
    route = Route(tenant, Lane.LIVE, key, barrier)
    if not readahead.decide(TP, offset, route, 100):
        return "dropped"
    scheduler.add(Unit(TP, [offset], key, tenant, Lane.LIVE, [offset], 100, barrier))
    return "kept"


def drain(readahead: ReadAhead, scheduler: Scheduler[list[int]]) -> list[int]:
    applied: list[int] = []
    batch = scheduler.take(0)
    while batch:
        scheduler.complete(batch)
        offsets = [o for u in batch for o in u.offsets]
        readahead.finish(TP, offsets)
        applied += offsets
        batch = scheduler.take(0)
    return applied


def test_the_head_is_kept_while_the_reader_re_reads_below_it() -> None:
    readahead, scheduler = setup()
    # globex's bulk: 0-3 kept (its share), 4-19 dropped
    outcomes = [fetch(readahead, scheduler, o, "globex") for o in range(20)]
    assert outcomes.count("dropped") == 16
    drain(readahead, scheduler)
    assert readahead.due_rescans() == [(TP, 4)]
    assert readahead.reader_rescan(TP)
    # the reader re-reads 4-7 while acme's change arrives at the head: kept at once
    assert [fetch(readahead, scheduler, o, "globex", reread=True) for o in range(4, 6)] == [
        "kept",
        "kept",
    ]
    assert fetch(readahead, scheduler, 20, "acme") == "kept"
    assert 20 in drain(readahead, scheduler)
    # the commit point stays at the lowest record the reader has not re-read
    point = readahead.commit_point(TP)
    assert point is not None and point.offset == 6
    # the reader fills globex's share, the rest is known and cut: the reader lets go
    again = [fetch(readahead, scheduler, o, "globex", reread=True) for o in range(6, 11)]
    assert again == ["kept"] * 4 + ["known drop"]
    assert readahead.due_cuts() == []  # no seek: the main fetch never went back
    assert readahead.rescans_over() == [TP]
    assert not readahead.reader_rescan(TP)
    assert fetch(readahead, scheduler, 21, "acme") == "kept"
    drain(readahead, scheduler)
    # everything comes in the end, globex's in order
    while readahead.due_rescans():
        for o in range(22):
            fetch(readahead, scheduler, o, "globex", reread=True)
        drain(readahead, scheduler)
        readahead.rescans_over()
    point = readahead.commit_point(TP)
    assert point is not None and point.offset == 22
    readahead.check()


def test_the_head_drops_a_tenant_whose_records_the_reader_has_yet_to_re_read() -> None:
    readahead, scheduler = rescanning(10)
    # globex's newer change at the head must not overtake its records at 4-9
    assert fetch(readahead, scheduler, 10, "globex") == "dropped"
    for o in range(4, 10):
        assert fetch(readahead, scheduler, o, "globex", reread=True) == "kept"
        drain(readahead, scheduler)
    # the reader reaches where the rescan ends: its fetch beyond is the main fetch's
    assert fetch(readahead, scheduler, 10, "globex", reread=True) == "duplicate"
    assert readahead.rescans_over() == [TP]
    # 10 was dropped at the head: globex's next change there waits for it (order)
    assert fetch(readahead, scheduler, 11, "globex") == "dropped"
    assert readahead.due_rescans() == [(TP, 10)]
    assert fetch(readahead, scheduler, 10, "globex", reread=True) == "kept"
    assert fetch(readahead, scheduler, 11, "globex", reread=True) == "kept"
    assert drain(readahead, scheduler) == [10, 11]
    readahead.check()


def test_a_barrier_the_reader_has_yet_to_re_read_holds_the_head() -> None:
    readahead, scheduler = setup()
    for o in range(6):
        fetch(readahead, scheduler, o, "globex")  # 0-3 kept, 4-5 dropped
    assert fetch(readahead, scheduler, 6, "", barrier=True) == "dropped"
    drain(readahead, scheduler)
    assert readahead.due_rescans() == [(TP, 4)]
    # initech never dropped anything, but a TRUNCATE at 6 comes before its change at 7
    assert fetch(readahead, scheduler, 7, "initech") == "dropped"
    assert fetch(readahead, scheduler, 4, "globex", reread=True) == "kept"
    assert fetch(readahead, scheduler, 5, "globex", reread=True) == "kept"
    assert fetch(readahead, scheduler, 6, "", reread=True, barrier=True) == "kept"
    assert drain(readahead, scheduler) == [4, 5, 6]
    assert fetch(readahead, scheduler, 7, "initech", reread=True) == "duplicate"
    assert readahead.rescans_over() == [TP]
    assert readahead.due_rescans() == [(TP, 7)]
    assert fetch(readahead, scheduler, 7, "initech", reread=True) == "kept"
    assert drain(readahead, scheduler) == [7]
    readahead.check()


def test_a_barrier_at_the_head_waits_for_the_re_read() -> None:
    readahead, scheduler = rescanning(6)
    assert fetch(readahead, scheduler, 6, "", barrier=True) == "dropped"
    assert fetch(readahead, scheduler, 7, "acme") == "dropped"  # it follows the barrier
    for o in (4, 5):
        assert fetch(readahead, scheduler, o, "globex", reread=True) == "kept"
    assert fetch(readahead, scheduler, 6, "", reread=True) == "duplicate"
    assert readahead.rescans_over() == [TP]
    assert drain(readahead, scheduler) == [4, 5]
    assert readahead.due_rescans() == [(TP, 6)]
    assert fetch(readahead, scheduler, 6, "", reread=True, barrier=True) == "kept"
    assert fetch(readahead, scheduler, 7, "acme", reread=True) == "kept"
    assert drain(readahead, scheduler) == [6, 7]
    readahead.check()


def test_a_failed_reader_hands_the_partitions_rescans_to_the_main_fetch() -> None:
    readahead, scheduler = rescanning(10)
    assert fetch(readahead, scheduler, 4, "globex", reread=True) == "kept"
    readahead.abandon_rescan(TP)
    assert readahead.rescans_over() == [TP]
    drain(readahead, scheduler)
    # what the reader did not re-read is dropped again: the main fetch seeks back for it
    assert readahead.due_rescans() == [(TP, 5)]
    assert not readahead.reader_rescan(TP)
    assert fetch(readahead, scheduler, 5, "globex") == "kept"
    readahead.check()


def test_the_reader_keeps_pace_with_the_applying() -> None:
    scheduler: Scheduler[list[int]] = Scheduler(
        SchedulerConfig(max_records=40, tenant_share=0.5, express_units=0), lambda a, b: a + b
    )
    readahead = ReadAhead(scheduler, reader=True, reread_slice=5)  # type: ignore[arg-type]
    readahead.assign(TP, 0)
    outcomes = [fetch(readahead, scheduler, o, "globex") for o in range(60)]
    assert outcomes.count("kept") == 20  # its share; 20-59 dropped
    assert readahead.due_rescans() == []  # no room for a slice yet
    assert not readahead.reread_room()  # no rescan
    applied = 0
    batch = scheduler.take(0)
    while applied < 5:  # the applying makes room for one slice
        scheduler.complete(batch)
        readahead.finish(TP, [o for u in batch for o in u.offsets])
        applied += sum(u.records for u in batch)
        batch = scheduler.take(0)
    assert readahead.due_rescans() == [(TP, 20)]
    assert readahead.reread_room()
    # the reader takes what fits, then waits for room instead of dropping the rest again
    taken = [fetch(readahead, scheduler, o, "globex", reread=True) for o in range(20, 20 + applied)]
    assert taken == ["kept"] * applied
    assert not readahead.reread_room()
    assert readahead.refetch_from(TP) == 20 + applied  # where it goes on
    drain(readahead, scheduler)
    assert readahead.reread_room()
    readahead.check()
