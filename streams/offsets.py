"""The offset bookkeeping of one assigned partition: what may be committed, and what a restart
may skip (docs/decisions/tenant-fair-ingest.md).

The worker reads ahead and applies records out of offset order (records of one key in order,
other keys as the scheduler picks them), so a partition's committed offset is the lowest record
not yet finished; the finished offsets above it travel in the commit's metadata, so that a
restart skips them instead of applying them again. `PartitionOffsets` is that state, one small
object per partition, changed only under the consumer's lock.

Invariants (checked by `check`, unit-tested in tests/streams/test_offsets.py and driven by the
model test in tests/streams/test_scheduler_model.py):

1. `floor <= commit_point() <= seen_to`: nothing below the floor is unfinished; the commit point
   never passes an offset that is pending (kept, not finished), dropped (seen but not kept: to
   be fetched again) or not yet fetched again by a rescan.
2. pending and done are disjoint, and both lie in `[floor, seen_to)`.
3. every offset in `[floor, seen_to)` that exists in the log is pending, done, or at or above
   the lowest dropped offset (or the rescan cursor): so the commit point loses nothing.
4. the commit point only moves forward; `done_above(point)` holds only finished offsets above it.
"""

from __future__ import annotations

import base64
import binascii
from collections.abc import Iterable
from dataclasses import dataclass
from enum import Enum

#: The commit metadata's format tag: runs of finished offsets above the committed offset.
METADATA_PREFIX = "rs1:"
#: What fits the broker's `offset.metadata.max.bytes` (Kafka's default 4096) with room to spare.
DEFAULT_METADATA_BYTES = 3_800


class Seen(Enum):
    """How a fetched offset relates to what the partition already knows."""

    #: not seen before (or seen, dropped and now fetched again): to be kept or dropped
    NEW = "new"
    #: below the floor, pending or done: already handled (a rescan or a restart re-read it)
    DUPLICATE = "duplicate"
    #: finished by an earlier owner of the partition (named in the commit metadata it read)
    DONE_BEFORE = "done_before"


@dataclass(frozen=True, slots=True)
class CommitPoint:
    """What to commit for a partition: the offset and the finished offsets above it (encoded
    into the commit metadata; `dropped` of them did not fit and will be redone after a
    restart)."""

    offset: int
    metadata: str
    dropped: int = 0


class PartitionOffsets:
    """Offsets of one partition: pending (kept, not finished), done (finished out of order,
    above the floor), dropped (seen but not kept, to be fetched again) and the rescan in
    progress. Not thread-safe: the owner serializes calls."""

    def __init__(self, start: int, done_before: Iterable[int] = ()) -> None:
        """`start`: the committed offset the partition is read from; `done_before`: offsets at
        or above it that an earlier owner finished (from the commit metadata)."""
        self.floor = start
        self.seen_to = start
        self._pending: set[int] = set()
        self._done: set[int] = set()
        #: finished by an earlier owner, not yet fetched again by this one
        self._done_before: set[int] = {o for o in done_before if o >= start}
        self._dropped_from: int | None = None
        #: a rescan in progress: re-reading from `_cursor` up to `_rescan_to` (exclusive)
        self._cursor: int | None = None
        self._rescan_to = start
        #: the rescan in progress is re-read by a reader of its own (the main fetch goes on)
        self._reader = False
        self._committed = start

    # --- what arrives ---------------------------------------------------------------------------

    def classify(self, offset: int, *, reread: bool = False) -> Seen:
        """What a fetched `offset` is (and, during a rescan, moves its cursor past it).

        `reread`: fetched by a rescan's own reader (`start_rescan(reader=True)`), which
        re-reads below `rescan_to` while the partition's main fetch goes on above it; what the
        reader fetches outside a rescan, or at or above its end, is the main fetch's to take
        (a DUPLICATE here)."""
        if self._cursor is not None and reread == self._reader:
            if reread and offset >= self._rescan_to:
                self._cursor = None  # the reader has passed everything it had to re-read
                return Seen.DUPLICATE
            self._cursor = max(self._cursor, offset + 1)
            if self._cursor >= self._rescan_to:
                self._cursor = None  # the rescan has read everything it had to
        elif reread:
            return Seen.DUPLICATE
        if offset < self.floor or offset in self._pending or offset in self._done:
            return Seen.DUPLICATE
        if offset in self._done_before:
            self._done_before.discard(offset)
            self.seen_to = max(self.seen_to, offset + 1)
            self._finish(offset)
            return Seen.DONE_BEFORE
        return Seen.NEW

    def keep(self, offset: int) -> None:
        """A NEW offset the worker keeps (it is pending until `finish`)."""
        self._pending.add(offset)
        self.seen_to = max(self.seen_to, offset + 1)

    def drop(self, offset: int) -> None:
        """A NEW offset the worker does not keep now (its tenant is over its read-ahead share):
        it is fetched again by a later rescan, and nothing at or above it is committed until
        then."""
        if self._dropped_from is None or offset < self._dropped_from:
            self._dropped_from = offset
        self.seen_to = max(self.seen_to, offset + 1)

    def finish(self, offset: int) -> None:
        """A pending offset is finished (applied, dead-lettered or skipped), or a NEW one
        needs no work (`keep` then `finish` in one)."""
        self._pending.discard(offset)
        self.seen_to = max(self.seen_to, offset + 1)
        self._finish(offset)

    def _finish(self, offset: int) -> None:
        self._done.add(offset)
        self._advance()

    # --- rescans --------------------------------------------------------------------------------

    @property
    def dropped_from(self) -> int | None:
        """The lowest dropped offset not fetched again yet (None: nothing dropped)."""
        return self._dropped_from

    @property
    def rescanning(self) -> bool:
        """A rescan is re-reading offsets that were dropped."""
        return self._cursor is not None

    def start_rescan(self, *, reader: bool = False) -> int | None:
        """Begin fetching the dropped offsets again: returns where to seek (None: nothing was
        dropped, or a rescan is still in progress). Until the re-read passes what had been
        seen, nothing from the seek position on counts as finished unless it is done.
        `reader`: a reader of its own re-reads them (`classify(reread=True)`) and the main
        fetch goes on from where it stands; else the main fetch seeks back."""
        start = self._dropped_from
        if start is None or self._cursor is not None:
            return None
        self._dropped_from = None
        self._cursor = start
        self._rescan_to = self.seen_to
        self._reader = reader
        return start

    @property
    def rescan_to(self) -> int:
        """Where the rescan in progress ends (exclusive; the last one's end when none is)."""
        return self._rescan_to

    @property
    def reading(self) -> bool:
        """A rescan in progress is re-read by a reader of its own."""
        return self._cursor is not None and self._reader

    @property
    def cursor(self) -> int | None:
        """The next offset a rescan in progress has to re-read (None: no rescan)."""
        return self._cursor

    def cut_rescan(self) -> int | None:
        """Stop the rescan in progress where its cursor stands: what it has not re-read yet
        counts as dropped again (fetched by the next rescan; nothing from the cursor on is
        committed until then). Returns where the fetch stood when the rescan began, to seek
        forward to (None: no rescan in progress)."""
        cursor = self._cursor
        if cursor is None:
            return None
        self._cursor = None
        if self._dropped_from is None or cursor < self._dropped_from:
            self._dropped_from = cursor
        return self._rescan_to

    def lost_below(self, offset: int) -> None:
        """The log no longer holds the offsets below `offset` (retention overtook the worker):
        what was dropped there cannot be fetched again (the offset gap is reconciled), and the
        fetch goes on from `offset`."""
        if self._dropped_from is not None and self._dropped_from < offset:
            self._dropped_from = offset if self._dropped_from < self.seen_to else None
        if self._cursor is not None and self._cursor < offset:
            self._cursor = offset if offset < self._rescan_to else None
        self.seen_to = max(self.seen_to, offset)
        self.floor = max(self.floor, min([offset, *self._pending]))
        self._advance()

    # --- what to commit -------------------------------------------------------------------------

    def commit_point(self, max_metadata_bytes: int = DEFAULT_METADATA_BYTES) -> CommitPoint:
        """The offset to commit (the lowest one not finished) and the metadata naming the
        finished offsets above it, cut to `max_metadata_bytes` (the runs that do not fit are
        left out: redone after a restart, never lost)."""
        offset = self._lowest_unfinished()
        above = sorted(o for o in self._done if o > offset)
        above += sorted(o for o in self._done_before if o > offset)
        metadata, dropped = encode_done(offset, sorted(set(above)), max_metadata_bytes)
        return CommitPoint(offset, metadata, dropped)

    def committed(self, offset: int) -> None:
        """The broker acknowledged a commit of `offset`."""
        self._committed = max(self._committed, offset)

    @property
    def last_committed(self) -> int:
        """The highest offset this worker committed (or the start)."""
        return self._committed

    @property
    def pending(self) -> int:
        """How many kept offsets are not finished."""
        return len(self._pending)

    def _lowest_unfinished(self) -> int:
        candidates = [self.seen_to]
        if self._pending:
            candidates.append(min(self._pending))
        if self._dropped_from is not None:
            candidates.append(self._dropped_from)
        if self._cursor is not None:
            # the rescan has not re-read from its cursor on: the first offset there that is not
            # finished (a finished one stays finished whether it is fetched again or not)
            cursor = self._cursor
            while cursor in self._done:
                cursor += 1
            candidates.append(cursor)
        return max(self.floor, min(candidates))

    def _advance(self) -> None:
        """Raise the floor over finished offsets and forget them (the set stays small)."""
        low = self._lowest_unfinished()
        if low > self.floor:
            self.floor = low
            self._done = {o for o in self._done if o >= low}

    def check(self) -> None:
        """Assert the invariants of the module docstring (tests and the model test)."""
        point = self._lowest_unfinished()
        assert self.floor <= point <= self.seen_to, (self.floor, point, self.seen_to)
        assert not self._pending & self._done
        assert all(self.floor <= o < self.seen_to for o in self._pending)
        assert all(o >= self.floor for o in self._done)


# --- the commit metadata ------------------------------------------------------------------------


def encode_done(offset: int, done: list[int], max_bytes: int) -> tuple[str, int]:
    """`done` (sorted finished offsets above `offset`) as commit metadata: `rs1:` and base64 of
    varint pairs (gap from the end of the previous run, run length). Returns the metadata and
    how many offsets did not fit (the highest runs are left out)."""
    if not done:
        return "", 0
    runs: list[tuple[int, int]] = []
    for o in done:
        if runs and o == runs[-1][0] + runs[-1][1]:
            runs[-1] = (runs[-1][0], runs[-1][1] + 1)
        else:
            runs.append((o, 1))
    # base64 writes 4 characters for every 3 bytes begun
    budget = (max_bytes - len(METADATA_PREFIX)) // 4 * 3
    out = bytearray()
    previous_end = offset
    kept = 0
    for start, length in runs:
        piece = _varint(start - previous_end) + _varint(length)
        if len(out) + len(piece) > budget:
            break
        out += piece
        previous_end = start + length
        kept += length
    if not out:
        return "", len(done)
    return METADATA_PREFIX + base64.urlsafe_b64encode(bytes(out)).decode("ascii"), len(done) - kept


def decode_done(offset: int, metadata: str | None) -> list[int]:
    """The finished offsets above `offset` that `encode_done` wrote; none for metadata of
    another form (another writer, an older worker, a broker that does not keep metadata)."""
    if not metadata or not metadata.startswith(METADATA_PREFIX):
        return []
    try:
        data = base64.urlsafe_b64decode(metadata[len(METADATA_PREFIX) :])
    except (binascii.Error, ValueError):
        return []
    out: list[int] = []
    position = offset
    values = _read_varints(data)
    if values is None or len(values) % 2:
        return []
    for gap, length in zip(values[::2], values[1::2], strict=True):
        start = position + gap
        out.extend(range(start, start + length))
        position = start + length
    return out


def _varint(value: int) -> bytes:
    out = bytearray()
    while True:
        byte = value & 0x7F
        value >>= 7
        if value:
            out.append(byte | 0x80)
        else:
            out.append(byte)
            return bytes(out)


def _read_varints(data: bytes) -> list[int] | None:
    values: list[int] = []
    current = shift = 0
    for byte in data:
        current |= (byte & 0x7F) << shift
        if byte & 0x80:
            shift += 7
            if shift > 63:
                return None
        else:
            values.append(current)
            current = shift = 0
    return values if shift == 0 else None
