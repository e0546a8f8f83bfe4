"""Paired bootstrap and sign-flip permutation tests."""

from __future__ import annotations

from collections.abc import Callable

import numpy as np
import pytest

from ragcore.quality.errors import EvalError
from ragcore.quality.significance import (
    PairedTest,
    compare,
    paired_bootstrap,
    paired_permutation,
    paired_values,
)

pytestmark = pytest.mark.unit

PairedTestFn = Callable[..., PairedTest]
RNG = np.random.default_rng(7)
BASE = RNG.random(40)


@pytest.mark.parametrize("test", [paired_bootstrap, paired_permutation])
def test_identical_configurations_are_not_different(test: PairedTestFn) -> None:
    result = test(BASE, BASE.copy(), resamples=2000, seed=1)
    assert result.mean_diff == 0.0
    assert result.p_value == pytest.approx(1.0)
    assert result.ci_low <= 0.0 <= result.ci_high
    assert not result.significant()


@pytest.mark.parametrize("test", [paired_bootstrap, paired_permutation])
def test_large_consistent_difference_is_significant(test: PairedTestFn) -> None:
    better = BASE + 0.2 + RNG.normal(0.0, 0.02, BASE.size)
    result = test(BASE, better, resamples=2000, seed=1)
    assert result.mean_diff == pytest.approx(float(np.mean(better - BASE)))
    assert result.mean_b > result.mean_a
    # With R resamples the smallest Monte Carlo p-value is 1 / (R + 1).
    assert result.p_value <= 2 / 2001
    assert 0.15 < result.ci_low < result.mean_diff < result.ci_high < 0.25
    assert result.significant(0.01)


def test_noise_only_difference_is_not_significant() -> None:
    noisy = BASE + RNG.normal(0.0, 0.1, BASE.size)
    noisy -= np.mean(noisy - BASE)  # exactly zero mean difference
    for result in (
        paired_bootstrap(BASE, noisy, resamples=2000, seed=3),
        paired_permutation(BASE, noisy, resamples=2000, seed=3),
    ):
        assert result.p_value > 0.5
        assert result.ci_low < 0.0 < result.ci_high


@pytest.mark.parametrize("test", [paired_bootstrap, paired_permutation])
def test_seeded_runs_are_deterministic(test: PairedTestFn) -> None:
    other = BASE + RNG.normal(0.01, 0.1, BASE.size)
    first = test(BASE, other, resamples=1500, seed=42)
    again = test(BASE, other, resamples=1500, seed=42)
    assert first == again
    different = test(BASE, other, resamples=1500, seed=43)
    assert (different.ci_low, different.ci_high) != (first.ci_low, first.ci_high)


def test_small_samples_get_an_exact_permutation_test() -> None:
    # 4 queries, all improved by 1: of the 2^4 = 16 sign assignments only "all +" and "all -"
    # reach |mean| = 1, so the exact two-sided p-value is 2/16.
    result = paired_permutation([0.0] * 4, [1.0] * 4, resamples=1000, seed=0)
    assert result.exact
    assert result.p_value == pytest.approx(2 / 16)
    # Mixed signs: d = (+1, +1, +1, -1), |mean| = 0.5; assignments with |sum| >= 2 are those
    # with 3 or 4 equal signs: 2 * (1 + 4) = 10 of 16.
    mixed = paired_permutation([0.0] * 4, [1.0, 1.0, 1.0, -1.0], resamples=1000)
    assert mixed.p_value == pytest.approx(10 / 16)


def test_compare_pairs_by_query_id() -> None:
    a = {"q1": 0.0, "q2": 0.5, "q3": 1.0}
    b = {"q3": 1.0, "q1": 1.0, "q2": 0.5}
    ids, xa, xb = paired_values(a, b)
    assert ids == ["q1", "q2", "q3"]
    assert list(xb - xa) == [1.0, 0.0, 0.0]
    result = compare(a, b, method="permutation", resamples=100)
    assert result.method == "permutation" and result.n == 3
    assert result.to_dict()["mean_diff"] == pytest.approx(1 / 3)
    with pytest.raises(EvalError, match=r"only in a \['q3'\]"):
        compare(a, {"q1": 1.0, "q2": 1.0})


def test_bad_inputs_are_rejected() -> None:
    with pytest.raises(EvalError, match="equal in length"):
        paired_bootstrap([1.0, 2.0], [1.0])
    with pytest.raises(EvalError, match="no queries"):
        paired_bootstrap([], [])
    with pytest.raises(EvalError, match="NaN"):
        paired_permutation([float("nan")], [1.0])
    with pytest.raises(EvalError, match="resamples"):
        paired_bootstrap([1.0], [1.0], resamples=0)
    with pytest.raises(EvalError, match="confidence"):
        paired_bootstrap([1.0], [1.0], confidence=1.0)
