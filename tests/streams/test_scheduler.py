"""The scheduler's choices: tenants take turns, lanes go in order, a quiet tenant gets an express
batch, a key's units go one after the other, barriers wait, merges supersede, revocation and
requeues keep order. (Correctness under crashes and rebalances: test_scheduler_model.py.)"""

from __future__ import annotations

import pytest

from streams.scheduler import Lane, Scheduler, SchedulerConfig, Unit

pytestmark = pytest.mark.unit

P0 = ("t", 0)


def unit(
    offset: int,
    tenant: str = "acme",
    key: str | None = None,
    lane: Lane = Lane.LIVE,
    *,
    barrier: bool = False,
    partition: tuple[str, int] = P0,
) -> Unit[list[int]]:
    return Unit(
        partition,
        [offset],
        key if key is not None or barrier else f"{tenant}-{offset}",
        tenant,
        lane,
        [offset],
        10,
        barrier,
        1000 + offset,
    )


def offsets(batch: list[Unit[list[int]]]) -> list[int]:
    return [o for u in batch for o in u.offsets]


def scheduler(**config: object) -> Scheduler[list[int]]:
    return Scheduler(SchedulerConfig(**config), lambda a, b: a + b)  # type: ignore[arg-type]


def test_a_quiet_tenant_waits_for_the_batch_in_flight_only() -> None:
    s = scheduler(quantum=4, max_batch_units=8, express_units=2)
    for n in range(100):
        s.add(unit(n, "globex"))
    first = s.take(0)
    assert offsets(first) == list(range(8))  # one tenant, no other waiting: a full batch
    s.add(unit(100, "acme"))
    assert offsets(s.take(0)) == [100]  # express: alone, ahead of the backlog
    assert offsets(s.take(0)) == list(range(8, 16))
    s.complete(first)


def test_express_batches_alternate_with_rounds_so_the_backlog_never_starves() -> None:
    s = scheduler(quantum=4, max_batch_units=8, express_units=2)
    for n in range(100):
        s.add(unit(n, "globex"))
    served = []
    for n in range(6):
        s.add(unit(1000 + n, f"quiet{n}"))  # a new quiet change before every take
        served.append(offsets(s.take(0)))
    # express batches between rounds; a round serves the quiet tenant that is ready too, in
    # its first pass, and the backlog, left alone, fills the rest
    assert served[0::2] == [[1000], [1002], [1004]]
    assert served[1::2] == [
        [0, 1, 2, 3, 1001, 4, 5, 6],
        [7, 8, 9, 10, 1003, 11, 12, 13],
        [14, 15, 16, 17, 1005, 18, 19, 20],
    ]


def test_tenants_take_turns_by_weight_and_the_first_turn_rotates() -> None:
    s = scheduler(quantum=2, max_batch_units=10, express_units=0, weights={"globex": 2.0})
    for n in range(20):
        s.add(unit(n, "acme"))
        s.add(unit(100 + n, "globex"))
    first, second = s.take(0), s.take(0)
    assert [u.tenant for u in first] == ["acme"] * 2 + ["globex"] * 4
    assert [u.tenant for u in second] == ["globex"] * 4 + ["acme"] * 2


def test_live_changes_go_first_and_a_share_is_kept_for_waiting_snapshot_rows() -> None:
    s = scheduler(quantum=100, max_batch_units=16, express_units=0)
    for n in range(50):
        s.add(unit(n, "acme", lane=Lane.BULK))
    for n in range(50):
        s.add(unit(100 + n, "globex"))
    batch = s.take(0)
    lanes = [u.lane for u in batch]
    assert lanes == [Lane.LIVE] * 14 + [Lane.BULK] * 2  # 16 // 8 kept for the lower lane


def test_a_keys_units_go_one_after_the_other() -> None:
    s = scheduler(quantum=10, max_batch_units=10, express_units=0)
    first = s.add(unit(0, key="k"))
    s.take(0)  # in flight
    s.add(unit(1, key="k"))
    s.add(unit(2, key="other"))
    assert offsets(s.take(0)) == [2]  # k's next waits for its first
    s.complete([first])
    assert offsets(s.take(0)) == [1]


def test_a_queued_units_key_merges_the_later_record_into_it() -> None:
    s = scheduler(express_units=0)
    first = s.add(unit(0, key="k", lane=Lane.BULK))
    merged = s.add(unit(1, key="k"))
    assert merged is first
    assert first.offsets == [0, 1] and first.payload == [0, 1]
    assert first.lane is Lane.LIVE  # a live change promotes the snapshot row it supersedes
    assert s.records == 2


def test_a_barrier_waits_for_earlier_units_and_holds_later_ones() -> None:
    s = scheduler(quantum=10, max_batch_units=10, express_units=0)
    early = s.add(unit(0))
    s.take(0)
    s.add(unit(1, barrier=True))
    s.add(unit(2))
    s.add(unit(3, partition=("t", 1)))  # another partition is not held
    assert offsets(s.take(0)) == [3]
    s.complete([early])
    barrier = s.take(0)
    assert offsets(barrier) == [1]
    assert s.take(0) == []
    s.complete(barrier)
    assert offsets(s.take(0)) == [2]


def test_nothing_merges_across_a_pending_barrier() -> None:
    s = scheduler(express_units=0)
    s.add(unit(0, key="k"))
    s.add(unit(1, barrier=True))
    later = s.add(unit(2, key="k"))
    assert later.offsets == [2]


def test_requeued_units_go_back_ahead_of_later_arrivals() -> None:
    s = scheduler(quantum=2, max_batch_units=2, express_units=0)
    for n in range(4):
        s.add(unit(n))
    batch = s.take(0)
    s.requeue(batch)
    assert offsets(s.take(0)) == [0, 1]


def test_revoking_forgets_queued_units_returns_those_in_flight_and_frees_the_budget() -> None:
    s = scheduler(quantum=2, max_batch_units=2, express_units=0)
    for n in range(4):
        s.add(unit(n))
    in_flight = s.take(0)
    assert sorted(offsets(s.revoke([P0]))) == offsets(in_flight)
    assert s.take(0) == []
    s.complete(in_flight)
    assert s.records == 0 and s.pending() == 0


def test_the_budget_keeps_room_for_other_tenants() -> None:
    s = scheduler(max_records=10, tenant_share=0.5)
    for n in range(5):
        assert s.admits("globex", 1)
        s.add(unit(n, "globex"))
    assert not s.admits("globex", 1)  # its share is full
    assert s.admits("acme", 1)
    for n in range(5):
        s.add(unit(10 + n, "acme"))
    assert not s.admits("initech", 1)  # the whole budget is full


def test_a_batch_holds_at_most_its_heavy_units_documents() -> None:
    s: Scheduler[list[int]] = Scheduler(
        SchedulerConfig(quantum=10, max_batch_units=10, max_batch_heavy=2, express_units=0),
        lambda a, b: a + b,
        heavy=lambda u: u.offsets[0] % 2 == 0,  # even offsets read a document
    )
    for n in range(8):
        s.add(unit(n))
    assert offsets(s.take(0)) == [0, 1, 2, 3]  # the third document waits for the next batch
    assert offsets(s.take(0)) == [4, 5, 6, 7]


def test_a_held_partition_gives_nothing_until_released_and_merges_meanwhile() -> None:
    s = scheduler(quantum=10, max_batch_units=10, express_units=0)
    s.hold(P0)
    s.add(unit(0, key="k"))
    s.add(unit(1, key="k"))  # the redone delete after the redone insert
    s.add(unit(2, partition=("t", 1)))
    assert offsets(s.take(0)) == [2]  # another partition goes on
    assert s.held_partitions() == [P0]
    s.release(P0)
    assert offsets(s.take(0)) == [0, 1]  # one unit: the later record superseded the earlier
