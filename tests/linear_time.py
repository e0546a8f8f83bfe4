"""Checks that a function of untrusted text runs in about linear time: the time of an input
GROWTH times as large, as a ratio (a quadratic function takes GROWTH**2 times as long).

Timing on a shared, loaded machine is noisy in one direction (a run can only be slowed down),
so each size is timed several times, interleaved with the other size, and the fastest run of
each counts; a ratio over the bound is measured again before it fails a test. The first size
is grown until one run takes `MIN_SECONDS`, so that timer resolution and constant costs do not
hide the growth of a cheap function.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

GROWTH = 8
#: Linear is 8, n log n about 10, quadratic 64.
MAX_RATIO = 24.0
MIN_SECONDS = 0.003
ROUNDS = 5
ATTEMPTS = 5


@dataclass(frozen=True)
class Growth:
    """One measurement: the fastest time at `n` and at GROWTH * n, and their ratio."""

    n: int
    chars: int
    small_s: float
    large_s: float

    @property
    def ratio(self) -> float:
        """large_s / small_s."""
        return self.large_s / max(self.small_s, 1e-9)

    def describe(self) -> str:
        """The measurement in words (for a failure message)."""
        return (
            f"{GROWTH}x the input took {self.ratio:.1f}x the time: "
            f"{self.small_s * 1e3:.2f} ms at n={self.n} ({self.chars} chars), "
            f"{self.large_s * 1e3:.2f} ms at n={GROWTH * self.n}; linear is {GROWTH}, "
            f"quadratic {GROWTH**2}, the bound {MAX_RATIO:g}"
        )


def _timed(fn: Callable[[Any], object], arg: Any) -> float:
    started = time.perf_counter()
    fn(arg)
    return time.perf_counter() - started


def _size(made: Any) -> int:
    return len(made) if hasattr(made, "__len__") else 0


def measure(
    fn: Callable[[Any], object],
    make: Callable[[int], Any],
    *,
    start: int = 64,
    max_chars: int = 1 << 18,
) -> Growth:
    """Time `fn(make(n))` against `fn(make(GROWTH * n))`, n grown from `start` (doubling)
    until a run takes MIN_SECONDS or the input reaches `max_chars` characters."""
    n = start
    small = make(n)
    while _timed(fn, small) < MIN_SECONDS and _size(make(2 * n)) <= max_chars:
        n *= 2
        small = make(n)
    large = make(GROWTH * n)
    small_s = large_s = float("inf")
    for _ in range(ROUNDS):
        small_s = min(small_s, _timed(fn, small))
        large_s = min(large_s, _timed(fn, large))
    return Growth(n, _size(small), small_s, large_s)


def assert_linear(
    fn: Callable[[Any], object],
    make: Callable[[int], Any],
    *,
    start: int = 64,
    max_chars: int = 1 << 18,
) -> Growth:
    """AssertionError unless GROWTH times the input takes less than MAX_RATIO times as long
    (measured up to ATTEMPTS times); the passing measurement."""
    best: Growth | None = None
    for _ in range(ATTEMPTS):
        growth = measure(fn, make, start=start, max_chars=max_chars)
        if growth.ratio < MAX_RATIO:
            return growth
        best = growth if best is None or growth.ratio < best.ratio else best
    assert best is not None
    raise AssertionError(best.describe())
