"""What the worker keeps of what it fetches: the read-ahead budget per tenant, and rescans
(docs/decisions/tenant-fair-ingest.md).

The consumer fetches every partition in offset order; a tenant's bulk load in a partition that
other tenants share would hold their changes behind it unless the worker read past it. It
reads ahead, within a budget of records and bytes (`Scheduler.admits`), in which one tenant may
hold only a share. A record that does not fit is *dropped*: not kept, not committed past, and
fetched again by a *rescan* (a seek back to the lowest dropped offset of its partition) once
its tenant has room again. So a 100,000-row import holds at most its tenant's share in memory,
and the other tenants' changes after it are read, kept and applied at once.

Order is kept by construction: once a tenant drops a record in a partition, every later record
of that tenant there is dropped too until the rescan (its keys' records then arrive in order);
a barrier (TRUNCATE, schema change, tenant move) after any dropped record is dropped with
everything after it (it must follow every earlier record of its partition). A rescan re-reads
the partition from its lowest dropped offset: offsets already kept or finished are recognised
(`PartitionOffsets.classify`), and the tenant of each offset dropped before is remembered
(eight bytes an offset), so a record whose tenant still has no room is dropped again without
being decoded.

Not thread-safe on its own: the consumer thread calls everything but `finish`, which the apply
thread calls; `ReadAhead` serializes them with its lock.
"""

from __future__ import annotations

import threading
import time
from array import array
from bisect import bisect_left
from collections.abc import Hashable, Iterable, Sequence
from dataclasses import dataclass, field

from streams.offsets import DEFAULT_METADATA_BYTES, CommitPoint, PartitionOffsets, Seen
from streams.scheduler import Lane, Scheduler, TopicPartition

#: The tenant index of a dropped barrier in the dropped-offset cache: decoded again on a rescan.
_BARRIER = 0xFFFF


@dataclass(frozen=True, slots=True)
class Route:
    """What the scheduler needs to know of a record before it is planned: its tenant (`""`:
    unknown), lane, ordering key (None: none) and whether it is a barrier."""

    tenant: str
    lane: Lane = Lane.LIVE
    key: Hashable | None = None
    barrier: bool = False


@dataclass
class _Intake:
    """One partition's read-ahead state."""

    offsets: PartitionOffsets
    #: a restart's redo is read up to here before anything of the partition is applied (None:
    #: not held), since `held_since` (monotonic seconds)
    hold_until: int | None = None
    held_since: float = 0.0
    #: where the client's fetch stands (control records and compacted offsets are never seen)
    fetched_to: int = 0
    #: the broker timestamp of the oldest record dropped and not fetched again, by tenant and
    #: lane (backlog age), and how many
    dropped_stats: dict[tuple[str, Lane], list[int]] = field(default_factory=dict)
    #: tenants that dropped a record since the last rescan began (all later ones drop too)
    dropping: set[str] = field(default_factory=set)
    #: a barrier was dropped: everything after it drops until the rescan
    drop_all: bool = False
    #: offsets dropped (ascending within a pass) and their tenants' indexes (`_BARRIER` for a
    #: barrier): what a rescan need not decode again
    cache_offsets: array[int] = field(default_factory=lambda: array("q"))
    cache_tenants: array[int] = field(default_factory=lambda: array("H"))
    #: the cache of the pass before the rescan in progress (looked up while re-reading)
    previous_offsets: array[int] = field(default_factory=lambda: array("q"))
    previous_tenants: array[int] = field(default_factory=lambda: array("H"))
    #: the rescan in progress may stop once its cursor passes this offset (`due_cuts`; None:
    #: not known, worked out again when `dropping` grows), and the size of `dropping` then
    cut_after: int | None = None
    cut_checked: int = 0
    #: a rescan re-read by a reader of its own (`ReadAhead(reader=True)`) while the main fetch
    #: goes on above it, at the *head*: what the head dropped meanwhile (tenants, a barrier,
    #: the cache entries), merged into the pass's own when the rescan ends
    head_dropping: set[str] = field(default_factory=set)
    head_drop_all: bool = False
    head_offsets: array[int] = field(default_factory=lambda: array("q"))
    head_tenants: array[int] = field(default_factory=lambda: array("H"))
    #: per tenant index, the last offset the rescan re-reads for it (`_BARRIER`: the last
    #: barrier, or record of a tenant the cache cannot name): the head keeps none of a
    #: tenant's records while the rescan has yet to pass that tenant's, nothing while it has
    #: yet to pass such a barrier
    rescan_last: dict[int, int] = field(default_factory=dict)
    #: the reader's rescan ended at the record being taken: the head's drops are merged once
    #: it is decided (by the rescan's rules)
    end_pending: bool = False

    def at_head(self, offset: int) -> bool:
        """Whether `offset` is the main fetch's while a reader re-reads below it."""
        return self.offsets.reading and offset >= self.offsets.rescan_to


class ReadAhead:
    """Keep-or-drop decisions, offsets and rescans of every assigned partition."""

    def __init__(
        self,
        scheduler: Scheduler[object],
        *,
        rescan_low_water: float = 0.5,
        max_metadata_bytes: int = DEFAULT_METADATA_BYTES,
        reader: bool = False,
        reread_slice: int = 200,
    ) -> None:
        """`reader`: rescans are re-read by a reader of their own (the consumer's second,
        group-less client: `classify(reread=True)`), so that the main fetch never goes back
        and the records at the head wait for no re-read; else the main fetch seeks back.
        A reader's rescan begins once a dropping tenant has room for `reread_slice` records
        and is read a slice at a time as room appears (`reread_room`): the re-reading is
        paced by the applying, not done in bursts."""
        self._scheduler = scheduler
        self._low_water = rescan_low_water
        self._reader = reader
        self._slice = reread_slice
        #: partitions whose reader's rescan ended (`rescans_over`), and partitions whose
        #: reader failed (their rescans seek the main fetch back until reassigned)
        self._over: set[TopicPartition] = set()
        self._no_reader: set[TopicPartition] = set()
        self._max_metadata = max_metadata_bytes
        self._lock = threading.Lock()
        self._parts: dict[TopicPartition, _Intake] = {}
        #: assigned partitions whose start is not known yet (made at their first record)
        self._lazy: set[TopicPartition] = set()
        self._tenants: list[str] = []
        self._tenant_index: dict[str, int] = {}
        #: counters for metrics: dropped records, rescans, offsets skipped as finished before
        self.dropped = 0
        self.rescans = 0
        #: rescans stopped early (`due_cuts`)
        self.cuts = 0
        self.done_before = 0

    # --- assignment -----------------------------------------------------------------------------

    def assign(
        self,
        tp: TopicPartition,
        start: int | None,
        done_before: Iterable[int] = (),
        *,
        hold_until: int | None = None,
    ) -> None:
        """A partition read from `start` (its committed offset; None: not known, e.g. a group
        that never committed there: the first offset fetched); `done_before`: offsets above it
        that the commit metadata names as finished; `hold_until`: the partition's end at the
        assignment, to be read before anything of it is applied (the caller holds it in the
        scheduler; `releasable` says when to let it go)."""
        with self._lock:
            self._lazy.discard(tp)
            self._parts.pop(tp, None)
            self._no_reader.discard(tp)
            self._over.discard(tp)
            if start is None:
                self._lazy.add(tp)
            else:
                held = hold_until if hold_until is not None and hold_until > start else None
                self._parts[tp] = _Intake(
                    PartitionOffsets(start, done_before), held, time.monotonic()
                )

    def holding(self, tp: TopicPartition) -> bool:
        """Whether `tp` waits for its redo to be read."""
        with self._lock:
            part = self._parts.get(tp)
            return part is not None and part.hold_until is not None

    def fetched(self, tp: TopicPartition, position: int) -> None:
        """The client's fetch position of `tp` (past control records the worker never sees)."""
        with self._lock:
            part = self._parts.get(tp)
            if part is not None:
                part.fetched_to = max(part.fetched_to, position)

    def releasable(self, max_hold_s: float) -> list[TopicPartition]:
        """The held partitions to release now: their redo is read (the fetch reached the end
        they had at the assignment: records dropped for room on the way are another tenant's,
        or a tenant whose later records come back in a rescan, with the version rule as their
        guard), or the budget is full (nothing more can be kept: applying must make room), or
        they were held `max_hold_s`."""
        out: list[TopicPartition] = []
        now = time.monotonic()
        full = self._scheduler.full()
        with self._lock:
            for tp, part in self._parts.items():
                until = part.hold_until
                if until is None:
                    continue
                read = max(part.offsets.seen_to, part.fetched_to)
                if read >= until or full or now - part.held_since >= max_hold_s:
                    part.hold_until = None
                    out.append(tp)
        return out

    def revoke(self, tp: TopicPartition) -> None:
        """Forget a partition."""
        with self._lock:
            self._parts.pop(tp, None)
            self._lazy.discard(tp)
            self._over.discard(tp)

    def assigned(self) -> list[TopicPartition]:
        """The partitions this worker reads."""
        with self._lock:
            return [*self._parts, *self._lazy]

    def skip_to(self, tp: TopicPartition, offset: int) -> None:
        """The partition's log starts at `offset` now (an offset gap): nothing below it can be
        fetched again."""
        with self._lock:
            part = self._parts.get(tp)
            if part is not None:
                self._settle(tp, part)
                reading = part.offsets.reading
                part.offsets.lost_below(offset)
                self._ended(tp, part, reading)

    # --- what arrives ---------------------------------------------------------------------------

    def classify(self, tp: TopicPartition, offset: int, *, reread: bool = False) -> Seen | None:
        """What a fetched offset is (None: its partition is not assigned: drop the record);
        `reread`: fetched by the rescan reader."""
        with self._lock:
            part = self._parts.get(tp)
            if part is None and tp in self._lazy and not reread:
                self._lazy.discard(tp)
                part = self._parts[tp] = _Intake(PartitionOffsets(offset))
            if part is None:
                return None
            self._settle(tp, part)
            reading = part.offsets.reading
            seen = part.offsets.classify(offset, reread=reread)
            if reading and not part.offsets.reading and seen is Seen.NEW:
                part.end_pending = True
            else:
                self._ended(tp, part, reading)
            if seen is Seen.DONE_BEFORE:
                self.done_before += 1
            return seen

    def known_drop(self, tp: TopicPartition, offset: int) -> bool:
        """Whether a NEW offset fetched again by a rescan can be dropped again without being
        decoded: it was dropped before, is no barrier, and its tenant still has no room."""
        with self._lock:
            part = self._parts.get(tp)
            if part is None:
                return False
            index = _lookup(part.previous_offsets, part.previous_tenants, offset)
            if index is None or index == _BARRIER:
                return False
            tenant = self._tenants[index]
            if tenant not in part.dropping and self._scheduler.admits(tenant, 0):
                return False
            self._drop(tp, part, offset, tenant, barrier=False)
            self._settle(tp, part)
            return True

    def decide(
        self,
        tp: TopicPartition,
        offset: int,
        route: Route,
        nbytes: int,
        timestamp_ms: int | None = None,
    ) -> bool:
        """Keep (True: the caller queues the unit) or drop a NEW offset."""
        with self._lock:
            part = self._parts.get(tp)
            if part is None:
                return False
            keep = self._keeps(part, offset, route, nbytes)
            if keep:
                part.offsets.keep(offset)
            else:
                self._drop(tp, part, offset, route.tenant, barrier=route.barrier)
                stats = part.dropped_stats.setdefault((route.tenant, route.lane), [0, -1])
                stats[0] += 1
                if timestamp_ms is not None and (stats[1] < 0 or timestamp_ms < stats[1]):
                    stats[1] = timestamp_ms
            self._settle(tp, part)
            return keep

    def _keeps(self, part: _Intake, offset: int, route: Route, nbytes: int) -> bool:
        if part.at_head(offset):
            return self._head_keeps(part, route, nbytes)
        if part.drop_all:
            return False
        if route.barrier:
            # a barrier follows everything before it: it waits for what was dropped (below it:
            # the head may have dropped records after it while a reader re-read it)
            dropped = part.offsets.dropped_from
            return dropped is None or dropped > offset
        if route.tenant in part.dropping:
            return False
        return self._scheduler.admits(route.tenant, nbytes)

    def _head_keeps(self, part: _Intake, route: Route, nbytes: int) -> bool:
        """Keep a record at the head while a reader re-reads below it: not a barrier (it
        follows what is re-read), nor a record of a tenant that dropped since the rescan
        began or that the rescan has yet to re-read (its keys' records come in order), nor
        anything while the rescan has yet to re-read a barrier."""
        cursor = part.offsets.cursor
        if part.drop_all or part.head_drop_all or route.barrier or cursor is None:
            return False
        tenant = route.tenant
        if tenant in part.dropping or tenant in part.head_dropping:
            return False
        if part.rescan_last.get(_BARRIER, -1) >= cursor:
            return False
        index = self._tenant_index.get(tenant)
        if index is not None and part.rescan_last.get(index, -1) >= cursor:
            return False
        return self._scheduler.admits(tenant, nbytes)

    def _drop(
        self, tp: TopicPartition, part: _Intake, offset: int, tenant: str, *, barrier: bool
    ) -> None:
        head = part.at_head(offset)
        part.offsets.drop(offset)
        self.dropped += 1
        if barrier and head:
            part.head_drop_all = True
        elif barrier:
            part.drop_all = True
        elif head:
            part.head_dropping.add(tenant)
        else:
            part.dropping.add(tenant)
        index = _BARRIER if barrier else self._index(tenant)
        if head:
            _append(part.head_offsets, part.head_tenants, offset, index)
        else:
            _append(part.cache_offsets, part.cache_tenants, offset, index)

    def skip(self, tp: TopicPartition, offset: int) -> None:
        """A NEW offset that needs no work (a heartbeat, a tombstone, a skipped record)."""
        with self._lock:
            part = self._parts.get(tp)
            if part is not None:
                part.offsets.finish(offset)
                self._settle(tp, part)

    def finish(self, tp: TopicPartition, offsets: Sequence[int]) -> None:
        """Kept offsets applied (or dead-lettered): finished."""
        with self._lock:
            part = self._parts.get(tp)
            if part is None:
                return  # revoked meanwhile
            for offset in offsets:
                part.offsets.finish(offset)

    # --- rescans --------------------------------------------------------------------------------

    def due_rescans(self) -> list[tuple[TopicPartition, int]]:
        """Partitions whose dropped records have room now: (partition, offset to seek to). The
        caller seeks there; the partition's drops start over."""
        out: list[tuple[TopicPartition, int]] = []
        with self._lock:
            if self._scheduler.full(0.8):
                return out
            share = self._scheduler.config.max_records * self._scheduler.config.tenant_share
            for tp, part in self._parts.items():
                self._settle(tp, part)
                if part.offsets.dropped_from is None or part.offsets.rescanning:
                    continue
                reader = self._reader and tp not in self._no_reader
                room = part.drop_all and not part.dropping
                if reader:
                    room = room or any(self._room(t) for t in part.dropping)
                else:
                    room = room or any(
                        self._scheduler.held(t) < share * self._low_water for t in part.dropping
                    )
                if not self._scheduler.config.fair:
                    room = True  # dropped only because the whole budget was full
                if not room:
                    continue
                start = part.offsets.start_rescan(reader=reader)
                if start is None:
                    continue
                part.previous_offsets = part.cache_offsets
                part.previous_tenants = part.cache_tenants
                part.cache_offsets, part.cache_tenants = array("q"), array("H")
                part.dropping = set()
                part.drop_all = False
                part.dropped_stats = {}
                part.cut_after = None
                part.cut_checked = 0
                if reader:
                    # ascending: each tenant's last offset wins
                    part.rescan_last = dict(
                        zip(part.previous_tenants, part.previous_offsets, strict=True)
                    )
                self.rescans += 1
                out.append((tp, start))
        return out

    def reread_room(self) -> bool:
        """Whether the reader may take a slice now: a partition it re-reads has a barrier
        or a tenant with room for a slice ahead of its cursor (or only records kept or
        finished already). While every tenant ahead is at its share the reader waits, and
        goes on where it stood once the applying made room, rather than fetch records only
        to drop them again."""
        with self._lock:
            for part in self._parts.values():
                cursor = part.offsets.cursor
                if cursor is None or not part.offsets.reading:
                    continue
                ahead = False
                for index, last in part.rescan_last.items():
                    if last < cursor:
                        continue
                    ahead = True
                    if index == _BARRIER or self._tenants[index] in part.dropping:
                        return True  # decoded, or dropped again at once: no room needed
                    if self._room(self._tenants[index]):
                        return True
                if not ahead:
                    return True
            return False

    def _room(self, tenant: str) -> bool:
        """Whether `tenant` has room for a slice of records (or, for a share smaller than a
        slice, for its whole share)."""
        return self._scheduler.room(tenant) >= min(self._slice, self._scheduler.share())

    def reader_rescan(self, tp: TopicPartition) -> bool:
        """Whether the rescan in progress in `tp` is the reader's to re-read."""
        with self._lock:
            part = self._parts.get(tp)
            return part is not None and part.offsets.reading

    def rescans_over(self) -> list[TopicPartition]:
        """The partitions whose reader's rescan ended (read to its end, stopped early, or the
        partition lost): the reader lets them go."""
        with self._lock:
            out = sorted(self._over)
            self._over.clear()
            return out

    def abandon_rescan(self, tp: TopicPartition) -> None:
        """The reader cannot fetch `tp` (its offset fell out of the log, say): what it has not
        re-read counts as dropped again, and the partition's rescans seek the main fetch back
        (whose own error handling reports an offset gap) until it is assigned again."""
        with self._lock:
            part = self._parts.get(tp)
            self._no_reader.add(tp)
            if part is not None:
                self._settle(tp, part)
            if part is not None and part.offsets.reading:
                self._cut(tp, part)

    def _cut(self, tp: TopicPartition, part: _Intake) -> int | None:
        """Stop the rescan in progress (`PartitionOffsets.cut_rescan`): what it did not re-read
        stays dropped, as it was (the next rescan's cache)."""
        cursor = part.offsets.cursor
        reading = part.offsets.reading
        resume = part.offsets.cut_rescan()
        if resume is None or cursor is None:
            return None
        start = bisect_left(part.previous_offsets, cursor)
        for i in range(start, len(part.previous_offsets)):
            index = part.previous_tenants[i]
            _append(part.cache_offsets, part.cache_tenants, part.previous_offsets[i], index)
            # their tenants' later records drop too, until the next rescan (order)
            if index == _BARRIER:
                part.drop_all = True
            else:
                part.dropping.add(self._tenants[index])
        part.cut_after = None
        self._ended(tp, part, reading)
        return resume

    def _settle(self, tp: TopicPartition, part: _Intake) -> None:
        """Merge the head's drops of a reader's rescan that ended at a record now taken."""
        if part.end_pending:
            part.end_pending = False
            self._ended(tp, part, True)

    def _ended(self, tp: TopicPartition, part: _Intake, reading: bool) -> None:
        """After a reader's rescan ended: what the head dropped meanwhile is dropped as any
        other (every later record of its tenants drops too, until the next rescan)."""
        if not reading or part.offsets.reading:
            return
        part.dropping |= part.head_dropping
        part.drop_all = part.drop_all or part.head_drop_all
        for offset, index in zip(part.head_offsets, part.head_tenants, strict=True):
            _append(part.cache_offsets, part.cache_tenants, offset, index)
        part.head_dropping = set()
        part.head_drop_all = False
        part.head_offsets, part.head_tenants = array("q"), array("H")
        part.rescan_last = {}
        self._over.add(tp)

    def due_cuts(self) -> list[tuple[TopicPartition, int]]:
        """Rescans to stop now, and where to seek forward to (where the fetch stood when each
        began; a reader's rescan needs no seek: it is in `rescans_over`). A rescan stops once
        every record it has yet to re-read is kept or finished already, or was dropped in the
        pass before and belongs to a tenant that dropped again in this one: re-read, each
        would be dropped again without being decoded (`known_drop`), so skipping them changes
        nothing but the time the records at the head wait (and the reader's work). Not while
        a barrier waits among them or one was dropped in this pass."""
        out: list[tuple[TopicPartition, int]] = []
        with self._lock:
            for tp, part in self._parts.items():
                self._settle(tp, part)
                cursor = part.offsets.cursor
                if cursor is None or part.drop_all or not part.dropping:
                    continue
                if part.cut_after is None or part.cut_checked != len(part.dropping):
                    part.cut_after = self._last_blocking(part, cursor)
                    part.cut_checked = len(part.dropping)
                if cursor <= part.cut_after:
                    continue
                reading = part.offsets.reading
                resume = self._cut(tp, part)
                if resume is None:
                    continue
                self.cuts += 1
                if not reading:
                    out.append((tp, resume))
        return out

    def _last_blocking(self, part: _Intake, cursor: int) -> int:
        """The highest offset from `cursor` on that the rescan must re-read itself: one
        dropped before whose tenant has not dropped again (or a barrier); `cursor - 1`:
        none."""
        dropping = {self._tenant_index.get(t) for t in part.dropping}
        offsets, tenants = part.previous_offsets, part.previous_tenants
        for i in range(len(offsets) - 1, bisect_left(offsets, cursor) - 1, -1):
            if tenants[i] == _BARRIER or tenants[i] not in dropping:
                return offsets[i]
        return cursor - 1

    # --- commits --------------------------------------------------------------------------------

    def commit_points(self) -> dict[TopicPartition, CommitPoint]:
        """What to commit now for every assigned partition whose point moved since its last
        commit."""
        out: dict[TopicPartition, CommitPoint] = {}
        with self._lock:
            for tp, part in self._parts.items():
                point = part.offsets.commit_point(self._max_metadata)
                if point.offset > part.offsets.last_committed or point.metadata:
                    out[tp] = point
        return out

    def committed(self, points: dict[TopicPartition, CommitPoint]) -> None:
        """The broker acknowledged `points`."""
        with self._lock:
            for tp, point in points.items():
                part = self._parts.get(tp)
                if part is not None:
                    part.offsets.committed(point.offset)

    def commit_point(self, tp: TopicPartition) -> CommitPoint | None:
        """The commit point of one partition (None: not assigned)."""
        with self._lock:
            part = self._parts.get(tp)
            return None if part is None else part.offsets.commit_point(self._max_metadata)

    def position(self, tp: TopicPartition) -> int | None:
        """One past the highest offset seen of `tp` (where its fetch stands)."""
        with self._lock:
            part = self._parts.get(tp)
            return None if part is None else part.offsets.seen_to

    def dropped_oldest(self) -> dict[TopicPartition, int]:
        """The oldest dropped record's broker timestamp per partition (backlog age)."""
        out: dict[TopicPartition, int] = {}
        with self._lock:
            for tp, part in self._parts.items():
                stamps = [s[1] for s in part.dropped_stats.values() if s[1] >= 0]
                if stamps:
                    out[tp] = min(stamps)
        return out

    def dropped_backlog(self) -> dict[tuple[str, Lane], tuple[int, int | None]]:
        """Dropped records not fetched again, and the oldest one's timestamp, by tenant and
        lane (a rescan that began counts them again as they come)."""
        out: dict[tuple[str, Lane], tuple[int, int | None]] = {}
        with self._lock:
            for part in self._parts.values():
                for key, (count, oldest) in part.dropped_stats.items():
                    known, stamp = out.get(key, (0, None))
                    if oldest >= 0 and (stamp is None or oldest < stamp):
                        stamp = oldest
                    out[key] = (known + count, stamp)
        return out

    def refetch_from(self, tp: TopicPartition) -> int | None:
        """The lowest offset of `tp` the worker has yet to fetch again (dropped for room, or
        not re-read yet by the rescan in progress; None: none)."""
        with self._lock:
            part = self._parts.get(tp)
            if part is None:
                return None
            marks = [o for o in (part.offsets.dropped_from, part.offsets.cursor) if o is not None]
            return min(marks, default=None)

    def check(self) -> None:
        """Assert every partition's invariants (tests)."""
        with self._lock:
            for part in self._parts.values():
                part.offsets.check()

    def _index(self, tenant: str) -> int:
        index = self._tenant_index.get(tenant)
        if index is None:
            index = len(self._tenants)
            if index >= _BARRIER:
                return _BARRIER  # the cache is advisory: such a record is decoded again
            self._tenants.append(tenant)
            self._tenant_index[tenant] = index
        return index


def _append(offsets: array[int], tenants: array[int], offset: int, index: int) -> None:
    """Add a dropped offset to a cache, which stays ascending (one out of order is left out:
    the cache is advisory, such a record is decoded again)."""
    if not offsets or offsets[-1] < offset:
        offsets.append(offset)
        tenants.append(index)


def _lookup(offsets: array[int], tenants: array[int], offset: int) -> int | None:
    i = bisect_left(offsets, offset)
    if i < len(offsets) and offsets[i] == offset:
        return tenants[i]
    return None
