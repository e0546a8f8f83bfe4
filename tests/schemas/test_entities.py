"""The one ordering rule of an entity's changes (docs/decisions/change-ordering.md)."""

from __future__ import annotations

import pytest

from schemas.entities import EntityVersion as V

pytestmark = pytest.mark.unit


def test_commit_order_decides_not_the_application_clock() -> None:
    # a newer commit (higher LSN) with an older updated_at: clock skew, a restore written back
    newer_commit = V(updated_at_us=100, lsn=20)
    older_commit = V(updated_at_us=900, lsn=10)
    assert older_commit.is_older_than(newer_commit)
    assert not newer_commit.is_older_than(older_commit)


def test_at_the_same_lsn_a_snapshot_row_loses_to_a_streamed_one() -> None:
    assert V(lsn=10, snapshot=True).is_older_than(V(lsn=10))
    assert not V(lsn=10).is_older_than(V(lsn=10, snapshot=True))
    assert not V(lsn=10).is_older_than(V(lsn=10))


def test_updated_at_breaks_the_tie_only_without_any_source_position() -> None:
    assert V(updated_at_us=1).is_older_than(V(updated_at_us=2))
    assert not V(updated_at_us=2).is_older_than(V(updated_at_us=1))
    assert V(updated_at_us=5, snapshot=True).is_older_than(V(updated_at_us=5))


def test_missing_information_never_proves_a_version_older() -> None:
    # one side with a source position, the other without: nothing is known
    assert not V(updated_at_us=1, lsn=5).is_older_than(V(updated_at_us=9))
    assert not V(updated_at_us=1).is_older_than(V(updated_at_us=9, lsn=5))
    assert not V().is_older_than(V(updated_at_us=9))
    assert not V(updated_at_us=9).is_older_than(V())
