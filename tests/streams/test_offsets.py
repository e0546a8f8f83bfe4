"""`PartitionOffsets` and the commit metadata codec: the commit point never passes an unfinished
offset, and what the metadata names as finished is exactly what was finished."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from streams.offsets import (
    METADATA_PREFIX,
    PartitionOffsets,
    Seen,
    decode_done,
    encode_done,
)

pytestmark = pytest.mark.unit


@settings(max_examples=300, deadline=None)
@given(
    st.integers(0, 10**12),
    st.lists(st.integers(1, 5_000), unique=True, max_size=300),
    st.integers(40, 4_000),
)
def test_metadata_round_trips_what_fits_and_counts_what_does_not(
    offset: int, above: list[int], max_bytes: int
) -> None:
    done = sorted(offset + a for a in above)
    metadata, dropped = encode_done(offset, done, max_bytes)
    assert len(metadata) <= max_bytes
    decoded = decode_done(offset, metadata)
    # the lowest offsets are kept, the highest left out (redone after a restart, never lost)
    assert decoded == done[: len(done) - dropped]
    assert not metadata or metadata.startswith(METADATA_PREFIX)


@pytest.mark.parametrize("metadata", [None, "", "other writer", "rs1:!!!", "rs1:gA"])
def test_foreign_or_broken_metadata_names_nothing(metadata: str | None) -> None:
    assert decode_done(10, metadata) == []


def test_runs_compress_a_long_stretch_of_finished_offsets() -> None:
    done = list(range(1_001, 101_001))  # 100,000 finished above a pending offset 1,000
    metadata, dropped = encode_done(1_000, done, 64)
    assert dropped == 0 and len(metadata) < 20
    assert decode_done(1_000, metadata) == done


def test_the_commit_point_is_the_lowest_unfinished_offset() -> None:
    state = PartitionOffsets(10)
    for offset in (10, 11, 12, 14):  # 13 is a transaction marker: never fetched
        assert state.classify(offset) is Seen.NEW
        state.keep(offset)
    state.finish(11)
    state.finish(14)
    point = state.commit_point()
    assert point.offset == 10
    assert decode_done(10, point.metadata) == [11, 14]
    state.finish(10)
    state.finish(12)
    assert state.commit_point().offset == 15  # past the marker too
    assert state.commit_point().metadata == ""
    state.check()


def test_a_dropped_offset_holds_the_commit_point_until_it_is_fetched_again() -> None:
    state = PartitionOffsets(0)
    for offset in range(6):
        state.classify(offset)
        if offset in (2, 3):
            state.drop(offset)  # its tenant is over its share
        else:
            state.keep(offset)
            state.finish(offset)
    point = state.commit_point()
    assert point.offset == 2 and decode_done(2, point.metadata) == [4, 5]
    assert state.start_rescan() == 2
    assert state.start_rescan() is None  # one rescan at a time
    # re-read from 2: the cursor holds the point at 2 until 2 is finished
    assert state.classify(2) is Seen.NEW
    state.keep(2)
    assert state.commit_point().offset == 2
    state.finish(2)
    assert state.commit_point().offset == 3  # 3 is not fetched again yet
    assert state.classify(3) is Seen.NEW
    state.keep(3)
    state.finish(3)
    assert state.classify(4) is Seen.DUPLICATE and state.classify(5) is Seen.DUPLICATE
    assert state.commit_point().offset == 6
    assert not state.rescanning
    state.check()


def test_a_rescan_cut_short_leaves_what_it_did_not_re_read_dropped() -> None:
    state = PartitionOffsets(0)
    for offset in range(8):
        state.classify(offset)
        if offset >= 2:
            state.drop(offset)
        else:
            state.keep(offset)
            state.finish(offset)
    assert state.start_rescan() == 2
    assert state.cursor == 2
    state.classify(2)
    state.keep(2)
    state.finish(2)
    state.classify(3)
    state.drop(3)  # its tenant is full again
    assert state.cut_rescan() == 8  # seek forward to where the fetch stood
    assert not state.rescanning and state.cut_rescan() is None
    assert state.dropped_from == 3
    assert state.commit_point().offset == 3  # 4-7 were not re-read: still held
    state.check()
    assert state.start_rescan() == 3  # the next rescan fetches them


def test_offsets_an_earlier_owner_finished_are_skipped_once() -> None:
    state = PartitionOffsets(100, done_before=[102, 103, 99])
    assert state.commit_point().offset == 100
    assert decode_done(100, state.commit_point().metadata) == [102, 103]
    assert state.classify(100) is Seen.NEW
    state.keep(100)
    assert state.classify(101) is Seen.NEW
    state.keep(101)
    assert state.classify(102) is Seen.DONE_BEFORE
    assert state.classify(103) is Seen.DONE_BEFORE
    assert state.classify(102) is Seen.DUPLICATE
    state.finish(101)
    assert state.commit_point().offset == 100
    state.finish(100)
    assert state.commit_point().offset == 104
    state.check()
