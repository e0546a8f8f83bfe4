"""The committed man-page pin against this machine's /usr/share/man/man1 (reads ~1,200 pages)."""

from __future__ import annotations

import pytest

from ragdev.eval.manpages import DEFAULT_MAN_DIR, load_pinned

# reads this machine's man pages (no service): integration with the machine's files
pytestmark = [pytest.mark.integration, pytest.mark.slow]


def test_committed_pin_loads_here_or_skips_with_a_reason() -> None:
    load = load_pinned()
    if not DEFAULT_MAN_DIR.is_dir():
        assert load.evalset is None and load.skipped_reason is not None
        pytest.skip(load.skipped_reason)  # a failure under CI (conftest)
    accounted = load.loaded + len(load.missing) + len(load.changed) + len(load.unparsable)
    assert accounted == load.pinned
    if load.evalset is not None:
        assert len(load.evalset.queries) == load.loaded
        assert all(e.word_count() >= 50 for e in load.evalset.entities)
    else:
        assert load.skipped_reason is not None
