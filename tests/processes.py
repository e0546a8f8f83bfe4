"""Helpers of tests that check processes they started are gone."""

from __future__ import annotations

from pathlib import Path


def alive(pid: int) -> bool:
    """Whether process `pid` exists and is not a zombie (killed, not yet reaped)."""
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rpartition(")")[2].split()[0]
    except OSError:
        return False
    return state != "Z"
