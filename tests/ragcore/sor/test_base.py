"""The SoR port's own types: a verdict that cannot hold a contradiction, and the log of
unreadable rows that a row hit by every request cannot flood."""

from __future__ import annotations

import logging

import pytest

from ragcore.errors import SorRowError
from ragcore.sor.base import RowFaults, SorVerdict

pytestmark = pytest.mark.unit


def test_an_unreadable_rows_verdict_exists_and_carries_no_hash() -> None:
    SorVerdict("entities:e1", True, row_error="MAPPING_ERROR")
    SorVerdict("entities:e1", True, deleted=True, row_error="MAPPING_ERROR")
    for bad in (
        {"exists": False},
        {"exists": True, "content_hash": "h1"},
        {"exists": True, "mapped": False},
    ):
        with pytest.raises(ValueError, match="unreadable row"):
            SorVerdict("entities:e1", row_error="MAPPING_ERROR", **bad)


def test_each_unreadable_row_is_logged_once_per_interval_with_its_repeats(
    caplog: pytest.LogCaptureFixture,
) -> None:
    now = [100.0]
    faults = RowFaults(every_s=300.0, size=2, clock=lambda: now[0])

    def error(entity: str, reason: str = "MAPPING_ERROR") -> SorRowError:
        return SorRowError(
            f"public.entities row {entity}, column 'metadata' cannot be read: ...",
            table="public.entities",
            entity_id=entity,
            reason=reason,
            column="metadata",
        )

    with caplog.at_level(logging.WARNING, logger="ragcore.sor.base"):
        for _ in range(3):
            faults.report(error("entities:e1"), "entities:e1")
        faults.report(error("entities:e1", "DOCUMENT_UNAVAILABLE"), "entities:e1")
        now[0] += 301
        faults.report(error("entities:e1"), "entities:e1")
    lines = [r.getMessage() for r in caplog.records]
    assert len(lines) == 3, lines
    assert lines[0].startswith(
        "SoR row unreadable: table public.entities, entity entities:e1, column metadata, "
        "reason MAPPING_ERROR: "
    )
    assert "reason DOCUMENT_UNAVAILABLE" in lines[1]  # another reason is another line
    assert "(2 more reads of it since the last line)" in lines[2]
