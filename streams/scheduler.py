"""Which fetched change the ingest worker applies next: per-key order, barriers, lanes and a
weighted round robin between tenants (docs/decisions/tenant-fair-ingest.md).

The consumer reads ahead; every kept record becomes a `Unit` here. The scheduler hands the apply
thread batches such that

- the units of one key (an entity) are applied one after the other in arrival order: a unit is
  taken only when it heads its key's queue and no earlier unit of the key is in flight; a unit
  arriving behind a queued one of the same key and partition is merged into it (the merge
  function says how: the last full state supersedes);
- a barrier (a TRUNCATE, a schema change, a tenant move: a meaning beyond one entity) is taken
  only when every earlier unit of its partition is finished, and no later unit of its partition
  is taken before it is finished;
- lanes go in order (live changes, then snapshot and bulk reads, then reindex requests), with a
  share of every batch kept for the lower lanes when they wait, so they never starve;
- within a lane, tenants take turns: each tenant with ready units gives up to `quantum x weight`
  units to a batch, the tenant that starts a batch rotates. A tenant's bulk load therefore
  fills the batches only while no other tenant waits.

With `fair` off every unit shares one queue: arrival order, key order and barriers still hold
(the behaviour of a worker without tenant fairness, for comparison).

The scheduler also keeps the read-ahead budget's books: records and bytes held per tenant and in
total (`admits` decides whether a fetched record may be kept). It is thread-safe: the consumer
thread adds and revokes, the apply thread takes, completes and requeues.
"""

from __future__ import annotations

import heapq
import itertools
import threading
from collections import deque
from collections.abc import Callable, Hashable, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from enum import IntEnum
from typing import Any, Generic, TypeVar

P = TypeVar("P")

#: A topic partition.
TopicPartition = tuple[str, int]


class Lane(IntEnum):
    """The class of traffic a unit belongs to, in priority order."""

    LIVE = 0  # change events committed now
    BULK = 1  # snapshot rows (initial and incremental snapshots)
    REINDEX = 2  # Retrieve's reindex requests: re-reads of entities it found stale

    @property
    def label(self) -> str:
        """The metrics label."""
        return self.name.lower()


@dataclass(eq=False)
class Unit(Generic[P]):
    """What one or more records of one key ask of the index, held until applied.

    `offsets` are the records' offsets in `partition` (several after a merge); `payload` is the
    planned work, opaque to the scheduler; `timestamp_ms` the oldest record's broker timestamp
    (backlog age)."""

    partition: TopicPartition
    offsets: list[int]
    key: Hashable | None
    tenant: str
    lane: Lane
    payload: P
    nbytes: int = 0
    barrier: bool = False
    timestamp_ms: int | None = None
    #: set by the scheduler
    seq: int = 0
    in_flight: bool = False
    done: bool = False
    #: in its tenant's ready queue (taken or dropped from it lazily)
    ready: bool = False
    #: a key head waiting behind its partition's barrier
    blocked: bool = False

    @property
    def first(self) -> int:
        """The lowest offset the unit covers."""
        return self.offsets[0]

    @property
    def records(self) -> int:
        """How many records the unit covers."""
        return len(self.offsets)


#: Merges a unit arriving behind a queued one of the same key: the combined payload, or None
#: when the two must stay apart (applied one after the other).
Merge = Callable[[P, P], P | None]


@dataclass
class SchedulerConfig:
    """The scheduler's knobs (`streams.consumer.SchedulerSettings` is the user-facing form)."""

    fair: bool = True
    quantum: int = 32
    max_batch_units: int = 64
    #: units whose payload is heavy (documents): at most this many per batch
    max_batch_heavy: int = 2
    #: a tenant with at most this many live units ready goes in a batch of its own while another
    #: tenant has a backlog (0: never)
    express_units: int = 8
    weights: Mapping[str, float] = field(default_factory=dict)
    classes: Mapping[str, str] = field(default_factory=dict)
    max_records: int = 20_000
    max_bytes: int = 256 * 1024 * 1024
    #: the share of the budget one tenant may hold (its further records are dropped and
    #: fetched again later), so other tenants' records always find room
    tenant_share: float = 0.5


@dataclass
class _Partition:
    """Per-partition queue state: the first offsets of its pending units (a heap, lazily
    cleaned), its pending barriers, and its key heads blocked behind a barrier."""

    firsts: list[int] = field(default_factory=list)
    pending_firsts: dict[int, int] = field(default_factory=dict)  # first offset -> count
    barriers: list[int] = field(default_factory=list)  # a heap of pending barrier offsets
    barrier_units: dict[int, Unit[Any]] = field(default_factory=dict)
    blocked: list[Unit[Any]] = field(default_factory=list)
    units: set[Unit[Any]] = field(default_factory=set)
    #: nothing of the partition is taken until `release` (a restart's redo is read first)
    held: bool = False

    def add_first(self, offset: int) -> None:
        self.pending_firsts[offset] = self.pending_firsts.get(offset, 0) + 1
        heapq.heappush(self.firsts, offset)

    def remove_first(self, offset: int) -> None:
        left = self.pending_firsts.get(offset, 0) - 1
        if left > 0:
            self.pending_firsts[offset] = left
        else:
            self.pending_firsts.pop(offset, None)

    def lowest(self) -> int | None:
        while self.firsts and self.firsts[0] not in self.pending_firsts:
            heapq.heappop(self.firsts)
        return self.firsts[0] if self.firsts else None

    def first_barrier(self) -> int | None:
        while self.barriers and self.barriers[0] not in self.barrier_units:
            heapq.heappop(self.barriers)
        return self.barriers[0] if self.barriers else None


@dataclass(frozen=True, slots=True)
class Backlog:
    """Units and records waiting (queued or in flight) for one tenant class and lane, and the
    broker timestamp of the oldest record among them."""

    units: int
    records: int
    oldest_ms: int | None


class Scheduler(Generic[P]):
    """See the module docstring."""

    def __init__(
        self,
        config: SchedulerConfig,
        merge: Merge[P] | None = None,
        *,
        heavy: Callable[[Unit[P]], bool] = lambda _u: False,
    ) -> None:
        self.config = config
        self._merge = merge
        self._heavy = heavy
        self._lock = threading.Condition()
        self._seq = itertools.count()
        self._keys: dict[Hashable, deque[Unit[P]]] = {}
        self._ready: dict[tuple[Lane, str], deque[Unit[P]]] = {}
        self._turns: dict[Lane, deque[str]] = {lane: deque() for lane in Lane}
        self._partitions: dict[TopicPartition, _Partition] = {}
        self._held_records: dict[str, int] = {}
        self._held_bytes: dict[str, int] = {}
        self.records = 0
        self.bytes = 0
        self._closed = False
        self._after_express = False

    # --- the read-ahead budget ------------------------------------------------------------------

    def admits(self, tenant: str, nbytes: int) -> bool:
        """Whether a record of `tenant` of `nbytes` may be kept now: the total stays within the
        budget and the tenant within its share of it (with fairness off, the total only)."""
        c = self.config
        with self._lock:
            if self.records + 1 > c.max_records or self.bytes + nbytes > c.max_bytes:
                return self.records == 0  # one record always fits (a huge one alone)
            if not c.fair:
                return True
            share_records = self.share()
            share_bytes = max(1, int(c.max_bytes * c.tenant_share))
            held = self._held_records.get(tenant, 0)
            if held + 1 > share_records or self._held_bytes.get(tenant, 0) + nbytes > share_bytes:
                return held == 0
            return True

    def full(self, low_water: float = 1.0) -> bool:
        """Whether the budget is used up (beyond `low_water` of it)."""
        c = self.config
        with self._lock:
            return (
                self.records >= c.max_records * low_water or self.bytes >= c.max_bytes * low_water
            )

    def share(self) -> int:
        """Records one tenant may hold (fairness off: the whole budget)."""
        c = self.config
        return max(1, int(c.max_records * c.tenant_share)) if c.fair else c.max_records

    def room(self, tenant: str) -> int:
        """Records `tenant` may still be given (within its share and the budget)."""
        with self._lock:
            free = self.config.max_records - self.records
            if self.config.fair:
                free = min(free, self.share() - self._held_records.get(tenant, 0))
            return max(0, free)

    def held(self, tenant: str) -> int:
        """Records `tenant` holds now."""
        with self._lock:
            return self._held_records.get(tenant, 0)

    # --- the consumer thread --------------------------------------------------------------------

    def add(self, unit: Unit[P]) -> Unit[P]:
        """Queue `unit` (or merge it into the queued unit of its key it arrives behind); returns
        the unit that now holds it."""
        if not self.config.fair:
            unit.tenant, unit.lane = "*", Lane.LIVE
        with self._lock:
            self._hold(unit.tenant, unit.records, unit.nbytes)
            part = self._partitions.setdefault(unit.partition, _Partition())
            key = unit.key if unit.key is not None else object()
            queue = self._keys.setdefault(key, deque())
            tail = queue[-1] if queue else None
            merged = self._merged(tail, unit, part)
            if merged is not None:
                return merged
            unit.key = key
            unit.seq = next(self._seq)
            queue.append(unit)
            part.units.add(unit)
            part.add_first(unit.first)
            if unit.barrier:
                part.barrier_units[unit.first] = unit
                heapq.heappush(part.barriers, unit.first)
            if queue[0] is unit:
                self._consider(unit)
            self._lock.notify_all()
            return unit

    def _merged(self, tail: Unit[P] | None, unit: Unit[P], part: _Partition) -> Unit[P] | None:
        """`unit` merged into `tail` when allowed: both queued, same partition, neither a
        barrier, no barrier pending between them (barriers are rare: a scan of them is cheap),
        and the merge function agrees."""
        if (
            tail is None
            or self._merge is None
            or tail.in_flight
            or tail.partition != unit.partition
            or tail.barrier
            or unit.barrier
        ):
            return None
        if any(tail.first < b < unit.first for b in part.barrier_units):
            return None  # the later record must follow the barrier between them
        payload = self._merge(tail.payload, unit.payload)
        if payload is None:
            return None
        if tail.tenant != unit.tenant or unit.lane < tail.lane:
            # a live change behind a snapshot row of its key promotes it (it supersedes it)
            self._move(tail, unit.tenant, min(tail.lane, unit.lane))
        tail.payload = payload
        tail.offsets = sorted(tail.offsets + unit.offsets)
        tail.nbytes += unit.nbytes
        if unit.timestamp_ms is not None and (
            tail.timestamp_ms is None or unit.timestamp_ms < tail.timestamp_ms
        ):
            tail.timestamp_ms = unit.timestamp_ms
        return tail

    def _move(self, unit: Unit[P], tenant: str, lane: Lane) -> None:
        """Move a queued unit to another tenant or lane, its budget with it."""
        was_ready = unit.ready
        if was_ready:
            ready = self._ready.get((unit.lane, unit.tenant))
            if ready is not None:
                ready.remove(unit)
            unit.ready = False
        self._release(unit.tenant, unit.records, unit.nbytes)
        self._hold(tenant, unit.records, unit.nbytes)
        unit.tenant, unit.lane = tenant, lane
        if was_ready:
            self._ready_push(unit)

    def hold(self, partition: TopicPartition) -> None:
        """Take nothing of `partition` until `release`: a newly assigned partition whose records
        from the committed offset on may have been applied before (a restart redoes them) is
        read first, so that a redone insert meets the redone delete after it while both are
        queued (merged: the delete supersedes), instead of indexing a deleted entity again."""
        with self._lock:
            self._partitions.setdefault(partition, _Partition()).held = True

    def release(self, partition: TopicPartition) -> None:
        """Let `partition`'s units be taken again."""
        with self._lock:
            part = self._partitions.get(partition)
            if part is None or not part.held:
                return
            part.held = False
            blocked, part.blocked = part.blocked, []
            for waiting in blocked:
                if waiting.blocked:
                    waiting.blocked = False
                    self._consider(waiting)
            self._lock.notify_all()

    def held_partitions(self) -> list[TopicPartition]:
        """The partitions on hold."""
        with self._lock:
            return [tp for tp, part in self._partitions.items() if part.held]

    def revoke(self, partitions: Iterable[TopicPartition]) -> list[Unit[P]]:
        """Forget the queued units of `partitions` (another worker owns them now: it starts at
        the committed offset) and return those still in flight, which the caller waits for."""
        in_flight: list[Unit[P]] = []
        with self._lock:
            for tp in partitions:
                part = self._partitions.pop(tp, None)
                if part is None:
                    continue
                for unit in list(part.units):
                    typed: Unit[P] = unit
                    if typed.in_flight:
                        in_flight.append(typed)
                    else:
                        self._forget(typed)
            self._lock.notify_all()
        return in_flight

    # --- the apply thread -----------------------------------------------------------------------

    def take(self, timeout_s: float | None = None, *, express: bool = False) -> list[Unit[P]]:
        """The next batch (units marked in flight), waiting up to `timeout_s` for one; empty
        when nothing became ready (or the scheduler closed). `express`: only a small batch of
        the live changes of tenants with few ready (`_express`, at most `express_units` units),
        whatever else waits: what a second apply thread takes while the first applies a
        backlog's batch."""
        with self._lock:
            if express:
                if not self._express_ready():
                    self._lock.wait_for(lambda: self._express_ready() or self._closed, timeout_s)
                batch = self._express(limit=self.config.express_units, need_backlog=False)
            else:
                if not self._any_ready():
                    self._lock.wait_for(lambda: self._any_ready() or self._closed, timeout_s)
                batch = self._batch()
            for unit in batch:
                unit.in_flight = True
            return batch

    def _express_ready(self) -> bool:
        c = self.config
        if not c.fair or c.express_units <= 0:
            return False
        for tenant in self._turns[Lane.LIVE]:
            ready = self._ready.get((Lane.LIVE, tenant), ())
            if 0 < len(ready) <= c.express_units and any(
                u.ready and not u.done and not self._heavy(u) for u in ready
            ):
                return True
        return False

    def complete(self, units: Sequence[Unit[P]]) -> None:
        """The units were applied: release their budget and let their successors go."""
        with self._lock:
            for unit in units:
                if unit.done:
                    continue
                unit.done = True
                unit.in_flight = False
                self._forget(unit)
            self._lock.notify_all()

    def requeue(self, units: Sequence[Unit[P]]) -> None:
        """Units taken but not applied (a dependency outage): ready again, ahead of later
        arrivals of their tenant and lane."""
        with self._lock:
            for unit in sorted(units, key=lambda u: u.seq, reverse=True):
                unit.in_flight = False
                if unit.partition not in self._partitions or unit.done:
                    continue  # revoked meanwhile: its new owner applies it
                unit.ready = True
                self._ready.setdefault((unit.lane, unit.tenant), deque()).appendleft(unit)
                turns = self._turns[unit.lane]
                if unit.tenant not in turns:
                    turns.appendleft(unit.tenant)
            self._lock.notify_all()

    def close(self) -> None:
        """Wake a waiting `take` (the worker stops)."""
        with self._lock:
            self._closed = True
            self._lock.notify_all()

    def wait_idle(self, units: Sequence[Unit[P]], timeout_s: float) -> bool:
        """Wait until none of `units` is in flight; False on timeout."""
        with self._lock:
            return self._lock.wait_for(lambda: not any(u.in_flight for u in units), timeout_s)

    # --- what operators see ---------------------------------------------------------------------

    def backlog(self) -> dict[tuple[str, Lane], Backlog]:
        """Waiting units and records, and the oldest record's timestamp, by (tenant class,
        lane)."""
        out: dict[tuple[str, Lane], list[int | None]] = {}
        with self._lock:
            for part in self._partitions.values():
                for unit in part.units:
                    key = (self._class_of(unit.tenant), unit.lane)
                    row = out.setdefault(key, [0, 0, None])
                    row[0] = (row[0] or 0) + 1
                    row[1] = (row[1] or 0) + unit.records
                    ts = unit.timestamp_ms
                    if ts is not None and (row[2] is None or ts < row[2]):
                        row[2] = ts
        return {k: Backlog(v[0] or 0, v[1] or 0, v[2]) for k, v in out.items()}

    def class_of(self, tenant: str) -> str:
        """A tenant's class (metrics label): configured, else `default`."""
        return self._class_of(tenant)

    def _class_of(self, tenant: str) -> str:
        return self.config.classes.get(tenant, "default")

    def ready_units(self) -> int:
        """Units ready to be taken now."""
        with self._lock:
            return sum(1 for q in self._ready.values() for u in q if u.ready and not u.done)

    def oldest_ready_ms(self) -> int | None:
        """The broker timestamp of the oldest record among the ready units (None: none, or
        no timestamps)."""
        with self._lock:
            stamps = [
                u.timestamp_ms
                for q in self._ready.values()
                for u in q
                if u.ready and not u.done and u.timestamp_ms is not None
            ]
        return min(stamps) if stamps else None

    def oldest_by_partition(
        self, extra: Mapping[TopicPartition, int] | None = None
    ) -> dict[TopicPartition, int]:
        """The oldest pending record's broker timestamp per partition (with `extra`: records
        held elsewhere, e.g. dropped for a rescan)."""
        out: dict[TopicPartition, int] = dict(extra or {})
        with self._lock:
            for tp, part in self._partitions.items():
                for unit in part.units:
                    ts = unit.timestamp_ms
                    if ts is not None and (tp not in out or ts < out[tp]):
                        out[tp] = ts
        return out

    def pending(self) -> int:
        """Units queued or in flight."""
        with self._lock:
            return sum(len(p.units) for p in self._partitions.values())

    def units(self) -> Iterator[Unit[P]]:
        """Every pending unit (a snapshot; for tests and the model test)."""
        with self._lock:
            return iter([u for p in self._partitions.values() for u in p.units])

    # --- internals (under the lock) -------------------------------------------------------------

    def _hold(self, tenant: str, records: int, nbytes: int) -> None:
        self._held_records[tenant] = self._held_records.get(tenant, 0) + records
        self._held_bytes[tenant] = self._held_bytes.get(tenant, 0) + nbytes
        self.records += records
        self.bytes += nbytes

    def _release(self, tenant: str, records: int, nbytes: int) -> None:
        left = self._held_records.get(tenant, 0) - records
        if left > 0:
            self._held_records[tenant] = left
            self._held_bytes[tenant] = self._held_bytes.get(tenant, 0) - nbytes
        else:
            self._held_records.pop(tenant, None)
            self._held_bytes.pop(tenant, None)
        self.records -= records
        self.bytes -= nbytes

    def _forget(self, unit: Unit[P]) -> None:
        """Remove a finished or revoked unit everywhere; let what waited for it go."""
        self._release(unit.tenant, unit.records, unit.nbytes)
        queue = self._keys.get(unit.key)
        if queue is not None:
            head = queue[0] is unit if queue else False
            if unit in queue:
                queue.remove(unit)
            if not queue:
                del self._keys[unit.key]
            elif head and unit.partition in self._partitions:
                self._consider(queue[0])
        # a ready queue drops a finished or revoked unit when it reaches it (`_batch`)
        unit.done = True
        part = self._partitions.get(unit.partition)
        if part is None:
            return
        part.units.discard(unit)
        part.remove_first(unit.first)
        unit.blocked = False  # a blocked list drops it when the barrier goes
        if unit.barrier:
            part.barrier_units.pop(unit.first, None)
            blocked, part.blocked = part.blocked, []
            for waiting in blocked:
                if waiting.blocked:
                    waiting.blocked = False
                    self._consider(waiting)
        # the partition's first barrier may have become eligible
        first = part.first_barrier()
        if first is not None:
            barrier: Unit[P] = part.barrier_units[first]
            queue = self._keys.get(barrier.key)
            if queue and queue[0] is barrier:
                self._consider(barrier)

    def _consider(self, unit: Unit[P]) -> None:
        """Make a key head ready, or block it behind its partition's barrier."""
        if unit.in_flight or unit.done:
            return
        part = self._partitions.get(unit.partition)
        if part is None:
            return
        if part.held:
            if not unit.blocked:
                unit.blocked = True
                part.blocked.append(unit)
            return
        barrier = part.first_barrier()
        if unit.barrier:
            if barrier == unit.first and part.lowest() == unit.first:
                self._ready_push(unit)
            # else: made ready when the last earlier unit of its partition finishes
            return
        if barrier is not None and barrier < unit.first:
            if not unit.blocked:
                unit.blocked = True
                part.blocked.append(unit)
            return
        self._ready_push(unit)

    def _ready_push(self, unit: Unit[P]) -> None:
        if unit.ready:
            return
        unit.ready = True
        unit.blocked = False
        ready = self._ready.setdefault((unit.lane, unit.tenant), deque())
        # keep arrival order within a tenant's lane (a requeued or unblocked unit goes back
        # to its place rather than the end)
        if ready and ready[-1].seq > unit.seq:
            position = next(i for i, u in enumerate(ready) if u.seq > unit.seq)
            ready.insert(position, unit)
        else:
            ready.append(unit)
        turns = self._turns[unit.lane]
        if unit.tenant not in turns:
            turns.append(unit.tenant)

    def _any_ready(self) -> bool:
        return any(any(not u.done for u in q) for q in self._ready.values())

    def _batch(self) -> list[Unit[P]]:
        if self.config.fair and self.config.express_units > 0 and not self._after_express:
            express = self._express()
            if express:
                self._after_express = True
                return express
        self._after_express = False
        return self._round()

    def _express(self, limit: int = 0, need_backlog: bool = True) -> list[Unit[P]]:
        """A batch of its own for the live changes of the tenants with few units ready (at most
        `express_units`) while another tenant has a backlog (`need_backlog`): their changes wait
        for the batch in flight only, not for a share of the backlog's next batch. Every other
        batch is a regular round, so a stream of quiet tenants never starves the backlog.
        `limit`: at most so many units (0: `max_batch_units`)."""
        c = self.config
        limit = limit or c.max_batch_units
        small = []
        backlog = False
        for lane in Lane:
            for tenant in self._turns[lane]:
                queued = len(self._ready.get((lane, tenant), ()))
                if queued > c.express_units:
                    backlog = True
                elif lane is Lane.LIVE:
                    small.append(tenant)
        if (need_backlog and not backlog) or not small:
            return []
        batch: list[Unit[P]] = []
        for tenant in small:
            ready = self._ready.get((Lane.LIVE, tenant))
            while ready and len(batch) < limit:
                unit = ready.popleft()
                if unit.done or not unit.ready or self._heavy(unit):
                    if not unit.done and unit.ready:
                        ready.appendleft(unit)  # a document waits for a regular batch
                        break
                    continue
                unit.ready = False
                batch.append(unit)
            if not ready:
                self._ready.pop((Lane.LIVE, tenant), None)
                self._turns[Lane.LIVE].remove(tenant)
        return batch

    def _round(self) -> list[Unit[P]]:
        """A regular batch: lanes in order (a share kept for the lower ones), tenants taking
        turns (up to `quantum` x weight units each); a tenant left alone with units ready
        fills the rest of the batch."""
        c = self.config
        batch: list[Unit[P]] = []
        heavy = 0
        waiting = {lane: bool(self._turns[lane]) for lane in Lane}
        lower_waiting = {lane: any(waiting[o] for o in Lane if o > lane) for lane in Lane}
        for lane in Lane:
            room = c.max_batch_units - len(batch)
            if room <= 0:
                break
            if lower_waiting[lane]:
                room -= max(1, c.max_batch_units // 8)  # a share kept for the lower lanes
            turns = self._turns[lane]
            order = list(turns)
            served = 0
            # one pass over the tenants, up to a quantum each; further passes only while a
            # single tenant still has units ready (no other waits): a lone backlog fills the
            # batch as with fairness off instead of getting a quantum, half of it
            passes = 0
            progress = True
            while (
                room > 0
                and progress
                and (passes == 0 or sum(1 for t in order if self._ready.get((lane, t))) == 1)
            ):
                progress = False
                passes += 1
                for tenant in order:
                    if room <= 0:
                        break
                    if passes == 1:
                        served += 1
                    ready = self._ready.get((lane, tenant))
                    if not ready:
                        continue
                    quota = max(1, round(c.quantum * c.weights.get(tenant, 1.0)))
                    if not c.fair:
                        quota = c.max_batch_units
                    while ready and quota > 0 and room > 0:
                        unit = ready[0]
                        if unit.done or not unit.ready:
                            ready.popleft()  # finished or revoked meanwhile
                            continue
                        if self._heavy(unit):
                            if heavy >= c.max_batch_heavy and batch:
                                break
                            heavy += 1
                        ready.popleft()
                        unit.ready = False
                        batch.append(unit)
                        progress = True
                        quota -= 1
                        room -= 1
                    if not ready:
                        self._ready.pop((lane, tenant), None)
            # the next batch starts with the first tenant this one did not reach (or, when it
            # reached all of them, with the second): every tenant leads in turn
            shift = served if served < len(order) else 1
            turns.clear()
            turns.extend(t for t in order[shift:] + order[:shift] if self._ready.get((lane, t)))
        return batch
