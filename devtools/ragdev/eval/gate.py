"""Regression gate: floors and ceilings on aggregate metrics (`ragstream eval --gate FILE`).

A gate file is JSON or TOML (by suffix: `.toml` is TOML, anything else JSON):

    {"description": "...",
     "floors":   {"recall@5": 0.80, "mrr@10": 0.70, "ndcg@5": 0.75},
     "ceilings": {"latency_p95_ms": 500},
     "kind_floors": {"exact_identifier": {"hit@1": 1.0}}}

`kind_floors` hold floors on the aggregates of one query kind (`EvalResult.by_kind`), reported
as `<kind>/<metric>`.

A floor passes when value >= floor, a ceiling when value <= ceiling. A metric the run did not
compute (absent, or None because undefined, e.g. abstention precision with no abstentions) fails
its check: a gate must never pass by not measuring.
"""

from __future__ import annotations

import json
import math
import tomllib
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError, model_validator

from ragcore.quality.errors import EvalDataError

Bound = Literal["floor", "ceiling"]


class Gate(BaseModel):
    """Floors (minimums) and ceilings (maximums) on aggregate metric names."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    description: str = ""
    floors: dict[str, float] = Field(default_factory=dict)
    ceilings: dict[str, float] = Field(default_factory=dict)
    kind_floors: dict[str, dict[str, float]] = Field(default_factory=dict)

    @model_validator(mode="after")
    def _not_empty(self) -> Gate:
        if not self.floors and not self.ceilings and not self.kind_floors:
            raise ValueError("a gate needs at least one floor or ceiling")
        kinds = [
            (f"{k}/{m}", v) for k, floors in self.kind_floors.items() for m, v in floors.items()
        ]
        for name, bound in (*self.floors.items(), *self.ceilings.items(), *kinds):
            if not math.isfinite(bound):
                raise ValueError(f"bound of {name!r} must be a finite number, got {bound}")
        return self


@dataclass(frozen=True)
class GateCheck:
    """One comparison of the gate."""

    metric: str
    bound: Bound
    limit: float
    value: float | None
    passed: bool

    def describe(self) -> str:
        """e.g. 'PASS recall@5 = 0.8333 >= 0.8000' or 'FAIL ndcg@5 not computed (floor 0.75)'."""
        verdict = "PASS" if self.passed else "FAIL"
        if self.value is None:
            return f"{verdict} {self.metric} not computed ({self.bound} {self.limit:g})"
        op = ">=" if self.bound == "floor" else "<="
        return f"{verdict} {self.metric} = {self.value:.4f} {op} {self.limit:.4f}"

    def to_dict(self) -> dict[str, Any]:
        """JSON-serializable form."""
        return {
            "metric": self.metric,
            "bound": self.bound,
            "limit": self.limit,
            "value": self.value,
            "passed": self.passed,
        }


@dataclass(frozen=True)
class GateResult:
    """Every check of a gate and whether all passed."""

    checks: tuple[GateCheck, ...]

    @property
    def passed(self) -> bool:
        """True when every check passed."""
        return all(c.passed for c in self.checks)

    @property
    def failures(self) -> list[GateCheck]:
        """The checks that failed."""
        return [c for c in self.checks if not c.passed]

    def summary(self) -> str:
        """One line per check plus a verdict line (for the CLI)."""
        lines = [c.describe() for c in self.checks]
        failed = len(self.failures)
        lines.append(
            "gate passed" if not failed else f"gate FAILED: {failed} of {len(self.checks)} checks"
        )
        return "\n".join(lines)

    def to_dict(self) -> dict[str, Any]:
        """JSON-serializable form."""
        return {"passed": self.passed, "checks": [c.to_dict() for c in self.checks]}


def _finite(value: float | None) -> float | None:
    # NaN compares false both ways: treat it as "not computed" rather than let it pass a ceiling.
    if value is None or not math.isfinite(value):
        return None
    return float(value)


def check_gate(
    aggregates: Mapping[str, float | None],
    gate: Gate,
    by_kind: Mapping[str, Mapping[str, float | None]] | None = None,
) -> GateResult:
    """Compare aggregate metrics with the gate's floors and ceilings (floors first, by name),
    then each kind's floors with `by_kind` (a kind absent from the run fails its checks)."""
    checks: list[GateCheck] = []
    for metric, limit in sorted(gate.floors.items()):
        value = _finite(aggregates.get(metric))
        checks.append(
            GateCheck(metric, "floor", limit, value, value is not None and value >= limit)
        )
    for metric, limit in sorted(gate.ceilings.items()):
        value = _finite(aggregates.get(metric))
        checks.append(
            GateCheck(metric, "ceiling", limit, value, value is not None and value <= limit)
        )
    for kind, floors in sorted(gate.kind_floors.items()):
        values = (by_kind or {}).get(kind, {})
        for metric, limit in sorted(floors.items()):
            value = _finite(values.get(metric))
            checks.append(
                GateCheck(
                    f"{kind}/{metric}", "floor", limit, value, value is not None and value >= limit
                )
            )
    return GateResult(tuple(checks))


def parse_gate(data: Mapping[str, Any], *, source: str = "<gate>") -> Gate:
    """Validate a gate mapping; EvalDataError naming `source` when invalid."""
    try:
        return Gate.model_validate(data)
    except ValidationError as exc:
        raise EvalDataError(f"invalid gate {source}: {exc}") from exc


def load_gate(path: Path | str) -> Gate:
    """Read a gate file (TOML when the suffix is .toml, JSON otherwise)."""
    path = Path(path)
    try:
        raw = path.read_bytes()
    except OSError as exc:
        raise EvalDataError(f"cannot read gate {path}: {exc}") from exc
    try:
        if path.suffix.lower() == ".toml":
            data: Any = tomllib.loads(raw.decode("utf-8"))
        else:
            data = json.loads(raw)
    except (UnicodeDecodeError, json.JSONDecodeError, tomllib.TOMLDecodeError) as exc:
        raise EvalDataError(f"cannot parse gate {path}: {exc}") from exc
    if not isinstance(data, Mapping):
        raise EvalDataError(f"gate {path} must be an object/table at the top level")
    return parse_gate(data, source=str(path))
