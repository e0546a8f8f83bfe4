"""Whether an index version's evidence calibration still describes its index.

A calibration is fitted from the chunks a version held at the time (`ragstream calibrate`, every
reindex) and keeps the lexical statistics it counted then: the threshold it chose, and the BM25
statistics Retrieve scores with, belong to that corpus. As the tenant's rows change, the index
moves away from it. Measured on the golden set (docs/decisions/calibration-without-labels.md):
calibrated on 60% of the entities, then the other 40% written, abstention recall on its
unanswerable questions was 0.26-0.65 against 0.68 when calibrated on the whole set.

The state is told from counts alone (the chunks the calibration counted against the chunks the
version holds now), so the worker's reconciliation pass, which scrolls every tenant anyway, can
export it without importing the Retrieve service.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any, Literal

from ragcore.store.registry import IndexRegistry

CalibrationStateName = Literal["fitted", "stale", "prior", "unreadable"]
#: Every state, in the order the gauge and the reports list them.
CALIBRATION_STATES: tuple[CalibrationStateName, ...] = ("fitted", "stale", "prior", "unreadable")
#: A calibration is stale once the version's chunk count moved this far from what it counted.
DEFAULT_STALE_RATIO = 0.2


@dataclass(frozen=True, slots=True)
class CalibrationState:
    """One version's calibration against its index now.

    - `fitted`: calibrated on about the chunks it holds now;
    - `stale`: the chunk count moved more than the stale ratio since (refit: `ragstream
      calibrate --stale`);
    - `prior`: never calibrated (Retrieve scores with the built-in prior model);
    - `unreadable`: a stored calibration that cannot be parsed (Retrieve cannot use it either).
    """

    state: CalibrationStateName
    #: the tenant's chunks in the version now
    chunks: int
    #: the chunks the calibration counted (None: no readable calibration)
    calibrated_chunks: int | None = None
    fitted_at: str | None = None
    #: why a stored calibration is unreadable
    error: str | None = None

    @property
    def change(self) -> float | None:
        """|chunks now - chunks calibrated| / chunks calibrated (None without a calibration)."""
        if self.calibrated_chunks is None:
            return None
        if self.calibrated_chunks == 0:
            return 0.0 if self.chunks == 0 else float("inf")
        return abs(self.chunks - self.calibrated_chunks) / self.calibrated_chunks

    def to_dict(self) -> dict[str, Any]:
        """JSON form (the change rounded; an infinite change is null)."""
        change = self.change
        return {
            "state": self.state,
            "chunks": self.chunks,
            "calibrated_chunks": self.calibrated_chunks,
            "change": None if change is None or change == float("inf") else round(change, 4),
            "fitted_at": self.fitted_at,
            **({"error": self.error} if self.error else {}),
        }


def judge_calibration(
    text: str | None, chunks: int, *, stale_ratio: float = DEFAULT_STALE_RATIO
) -> CalibrationState:
    """The state of a stored calibration `text` (None: none stored) for a version that holds
    `chunks` of the tenant's chunks now."""
    if text is None:
        return CalibrationState("prior", chunks)
    try:
        doc = json.loads(text)
        counted = int(doc["lexicon"]["n_docs"])
        fitted_at = str(doc["fitted_at"])
    except (ValueError, TypeError, KeyError) as exc:
        return CalibrationState("unreadable", chunks, error=f"{type(exc).__name__}: {exc}")
    fitted = CalibrationState("fitted", chunks, counted, fitted_at)
    change = fitted.change
    if change is not None and change > stale_ratio:
        return CalibrationState("stale", chunks, counted, fitted_at)
    return fitted


def calibration_state(
    registry: IndexRegistry,
    tenant: str,
    version: int,
    chunks: int,
    *,
    stale_ratio: float = DEFAULT_STALE_RATIO,
) -> CalibrationState:
    """The state of the calibration stored with `tenant`'s `version` (see `judge_calibration`)."""
    return judge_calibration(
        registry.load_calibration(tenant, version), chunks, stale_ratio=stale_ratio
    )
