"""Paired significance tests for two configurations evaluated on the same queries (pure, numpy).

Both tests work on the per-query differences d_i = b_i - a_i (b = candidate, a = baseline) of one
metric, so a positive `mean_diff` means b scored higher.

- `paired_bootstrap`: resample queries with replacement; the CI is the percentile interval of
  the resampled mean differences; the two-sided p-value is the share of resampled means, shifted
  to the null (mean 0), at least as far from 0 as the observed mean: (1 + count) / (1 + R).
- `paired_permutation` (sign flip): under H0 "a and b are exchangeable per query" each d_i is as
  likely to be -d_i; p = share of random sign assignments whose |mean| >= the observed |mean|.
  When 2^n <= `resamples` every assignment is enumerated (an exact test); otherwise
  (1 + count) / (1 + R). Its CI is the bootstrap one (a permutation test gives no interval).

The "+1" keeps a Monte Carlo p-value from ever being reported as exactly 0. Seeded: the same
inputs, seed and resamples give the same numbers.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass
from typing import Any, Literal

import numpy as np
import numpy.typing as npt

from ragcore.quality.errors import EvalError

Method = Literal["bootstrap", "permutation"]
DEFAULT_RESAMPLES = 10_000
DEFAULT_CONFIDENCE = 0.95
# Resampled means that tie the observed one must count as "as extreme"; float sums may differ
# in the last bits depending on the order of addition.
_TIE_EPS = 1e-12
# Bound the (resamples x n) index matrices held in memory at once.
_BLOCK_CELLS = 2_000_000

FloatArray = npt.NDArray[np.float64]


@dataclass(frozen=True)
class PairedTest:
    """Result of a paired test of metric b vs metric a over the same n queries."""

    method: Method
    n: int
    mean_a: float
    mean_b: float
    mean_diff: float  # mean(b - a)
    ci_low: float
    ci_high: float
    confidence: float
    p_value: float
    resamples: int
    seed: int
    exact: bool  # the permutation p-value enumerated every sign assignment

    def significant(self, alpha: float = 0.05) -> bool:
        """p < alpha."""
        return self.p_value < alpha

    def to_dict(self) -> dict[str, Any]:
        """JSON-serializable form."""
        return asdict(self)


def _differences(a: Sequence[float] | FloatArray, b: Sequence[float] | FloatArray) -> FloatArray:
    xa = np.asarray(a, dtype=np.float64)
    xb = np.asarray(b, dtype=np.float64)
    if xa.ndim != 1 or xa.shape != xb.shape:
        raise EvalError(f"paired samples must be 1-D and equal in length: {xa.shape} vs {xb.shape}")
    if xa.size == 0:
        raise EvalError("paired test of no queries")
    if not (np.isfinite(xa).all() and np.isfinite(xb).all()):
        raise EvalError("paired samples contain NaN or infinite values")
    return xb - xa


def _check(resamples: int, confidence: float) -> None:
    if resamples < 1:
        raise EvalError(f"resamples must be >= 1, got {resamples}")
    if not 0 < confidence < 1:
        raise EvalError(f"confidence must be in (0, 1), got {confidence}")


def _bootstrap_means(d: FloatArray, resamples: int, rng: np.random.Generator) -> FloatArray:
    n = d.size
    block = max(1, _BLOCK_CELLS // n)
    means = np.empty(resamples, dtype=np.float64)
    for start in range(0, resamples, block):
        stop = min(resamples, start + block)
        idx = rng.integers(0, n, size=(stop - start, n))
        means[start:stop] = d[idx].mean(axis=1)
    return means


def _interval(means: FloatArray, confidence: float) -> tuple[float, float]:
    alpha = 1.0 - confidence
    low, high = np.quantile(means, [alpha / 2, 1 - alpha / 2])
    return float(low), float(high)


def paired_bootstrap(
    a: Sequence[float] | FloatArray,
    b: Sequence[float] | FloatArray,
    *,
    resamples: int = DEFAULT_RESAMPLES,
    seed: int = 0,
    confidence: float = DEFAULT_CONFIDENCE,
) -> PairedTest:
    """Paired bootstrap of mean(b - a): percentile CI and two-sided p-value (module docstring)."""
    _check(resamples, confidence)
    d = _differences(a, b)
    observed = float(d.mean())
    means = _bootstrap_means(d, resamples, np.random.default_rng(seed))
    low, high = _interval(means, confidence)
    extreme = int(np.count_nonzero(np.abs(means - observed) >= abs(observed) - _TIE_EPS))
    return PairedTest(
        method="bootstrap",
        n=int(d.size),
        mean_a=float(np.mean(np.asarray(a, dtype=np.float64))),
        mean_b=float(np.mean(np.asarray(b, dtype=np.float64))),
        mean_diff=observed,
        ci_low=low,
        ci_high=high,
        confidence=confidence,
        p_value=min(1.0, (1 + extreme) / (1 + resamples)),
        resamples=resamples,
        seed=seed,
        exact=False,
    )


def paired_permutation(
    a: Sequence[float] | FloatArray,
    b: Sequence[float] | FloatArray,
    *,
    resamples: int = DEFAULT_RESAMPLES,
    seed: int = 0,
    confidence: float = DEFAULT_CONFIDENCE,
) -> PairedTest:
    """Paired sign-flip permutation test of mean(b - a) (exact when 2^n <= resamples)."""
    _check(resamples, confidence)
    d = _differences(a, b)
    n = int(d.size)
    observed = abs(float(d.mean()))
    rng = np.random.default_rng(seed)
    exact = n < 63 and 2**n <= resamples
    if exact:
        codes = np.arange(2**n, dtype=np.int64)[:, None]
        signs = 1.0 - 2.0 * ((codes >> np.arange(n, dtype=np.int64)) & 1)
        stats = np.abs((signs * d).mean(axis=1))
        p_value = float(np.count_nonzero(stats >= observed - _TIE_EPS)) / 2**n
    else:
        block = max(1, _BLOCK_CELLS // n)
        extreme = 0
        for start in range(0, resamples, block):
            rows = min(resamples, start + block) - start
            signs = rng.choice(np.array([-1.0, 1.0]), size=(rows, n))
            stats = np.abs((signs * d).mean(axis=1))
            extreme += int(np.count_nonzero(stats >= observed - _TIE_EPS))
        p_value = (1 + extreme) / (1 + resamples)
    # The interval comes from an independent bootstrap stream of the same seed.
    low, high = _interval(
        _bootstrap_means(d, resamples, np.random.default_rng([seed, 1])), confidence
    )
    return PairedTest(
        method="permutation",
        n=n,
        mean_a=float(np.mean(np.asarray(a, dtype=np.float64))),
        mean_b=float(np.mean(np.asarray(b, dtype=np.float64))),
        mean_diff=float(d.mean()),
        ci_low=low,
        ci_high=high,
        confidence=confidence,
        p_value=min(1.0, p_value),
        resamples=resamples,
        seed=seed,
        exact=exact,
    )


def paired_values(
    a: Mapping[str, float], b: Mapping[str, float]
) -> tuple[list[str], FloatArray, FloatArray]:
    """Align two query_id -> value maps (e.g. `EvalResult.metric_values`) on the same queries.

    EvalError when they cover different queries: a paired test needs both configurations to be
    measured on exactly the same queries.
    """
    if set(a) != set(b):
        only_a = sorted(set(a) - set(b))
        only_b = sorted(set(b) - set(a))
        raise EvalError(f"unpaired queries: only in a {only_a}, only in b {only_b}")
    ids = sorted(a)
    return (
        ids,
        np.array([a[i] for i in ids], dtype=np.float64),
        np.array([b[i] for i in ids], dtype=np.float64),
    )


def compare(
    a: Mapping[str, float],
    b: Mapping[str, float],
    *,
    method: Method = "bootstrap",
    resamples: int = DEFAULT_RESAMPLES,
    seed: int = 0,
    confidence: float = DEFAULT_CONFIDENCE,
) -> PairedTest:
    """Paired test of b vs a on per-query values keyed by query id."""
    _, xa, xb = paired_values(a, b)
    test = paired_bootstrap if method == "bootstrap" else paired_permutation
    return test(xa, xb, resamples=resamples, seed=seed, confidence=confidence)
