"""The cross-fitted hard threshold: folds by query, stratified, every query scored by models
that did not see it (retrieval_api.calibration, docs/decisions/abstention-threshold.md)."""

from __future__ import annotations

from collections import Counter
from collections.abc import Sequence

import numpy as np
import pytest

from ragcore.fusion import FusedHit
from ragcore.sparse import Bm25Encoder, LexicalMatch, LexicalQuery, LexiconStats
from retrieval_api import calibration
from retrieval_api.calibration import (
    CalibrationSettings,
    _choose_hard,
    _cross_fitted_best,
    _Example,
    _folds,
)
from retrieval_api.candidates import RawPool
from retrieval_api.evidence_score import CHUNK_FEATURES, LogisticModel, Signals
from retrieval_api.prior import prior_calibration
from retrieval_api.selfsupervised import CalibrationQuery

pytestmark = pytest.mark.unit

POOL = 5


def _example(n: int, answerable: bool, answer_in_pool: bool, rng: np.random.Generator) -> _Example:
    """A query whose pool holds its answer first (answerable) or only weak candidates."""
    query = LexicalQuery((f"w{n}",), (2.0,), (), (), 0.0)
    signals = []
    labels: list[float | None] = []
    for i in range(POOL):
        answer = answerable and answer_in_pool and i == 0
        cosine = rng.uniform(0.45, 0.8) if answer else rng.uniform(0.05, 0.5)
        score = rng.uniform(4.0, 12.0) if answer else rng.uniform(0.0, 6.0)
        coverage = rng.uniform(0.5, 1.0) if answer else rng.uniform(0.0, 0.6)
        signals.append(Signals(cosine, LexicalMatch(score, score / 7.5, coverage, ())))
        labels.append(1.0 if answer else 0.0)
    hits = tuple(
        FusedHit(f"p{n}-{i}", f"c{n}-{i}", 0.0, None, i + 1, None, i + 1, {}) for i in range(POOL)
    )
    kind = "paraphrase" if answerable else "background"
    return _Example(
        CalibrationQuery(f"query {n}", kind, answerable, chunk_id=f"c{n}-0"),
        RawPool(query, hits, tuple(signals)),
        labels,
    )


def _examples(positives: int, negatives: int, seed: int = 0) -> list[_Example]:
    rng = np.random.default_rng(seed)
    out = [_example(n, True, n % 10 != 0, rng) for n in range(positives)]
    out += [_example(positives + n, False, False, rng) for n in range(negatives)]
    return out


def test_folds_split_by_query_stratified_by_answerability_and_seeded() -> None:
    examples = _examples(53, 47)
    fold = _folds(examples, 5, seed=3)
    assert len(fold) == len(examples) and set(fold) == set(range(5))
    for answerable in (True, False):
        sizes = Counter(
            f for f, e in zip(fold, examples, strict=True) if e.query.answerable is answerable
        )
        assert max(sizes.values()) - min(sizes.values()) <= 1
    assert _folds(examples, 5, seed=3) == fold
    assert _folds(examples, 5, seed=4) != fold


def test_every_decidable_query_is_scored_once_by_models_that_did_not_see_it(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    examples = _examples(60, 60)
    fitted_on: list[set[int]] = []
    real_fit = calibration._fit_models

    def spy(
        train: Sequence[_Example], names: Sequence[str], l2: float
    ) -> tuple[LogisticModel, LogisticModel]:
        fitted_on.append({id(e) for e in train})
        return real_fit(train, names, l2)

    monkeypatch.setattr(calibration, "_fit_models", spy)
    draft = prior_calibration(LexiconStats.build(["a"], Bm25Encoder()))
    settings = CalibrationSettings(threshold_folds=4, seed=1)
    best, answerable = _cross_fitted_best(examples, draft, CHUNK_FEATURES, settings)
    # positives without their answer in the pool are left out (no evidence to lose)
    decidable = [e for e in examples if not e.query.answerable or 1.0 in e.labels]
    assert len(best) == len(decidable) == 114
    assert sorted(answerable) == sorted(e.query.answerable for e in decidable)
    assert len(fitted_on) == 4
    fold = _folds(examples, 4, seed=1)
    for k, seen in enumerate(fitted_on):
        held = {id(e) for e, f in zip(examples, fold, strict=True) if f == k}
        assert not held & seen
        assert len(seen | held) == len(examples)
    # the synthetic classes separate: the threshold chosen on the out-of-fold scores abstains
    # on most negatives and at most 20% of the positives
    hard, info = _choose_hard(best, answerable, 0.2)
    negatives = [b for b, a in zip(best, answerable, strict=True) if not a]
    positives = [b for b, a in zip(best, answerable, strict=True) if a]
    assert sum(b < hard for b in negatives) / len(negatives) > 0.8
    assert sum(b < hard for b in positives) / len(positives) <= 0.2
    assert info["balanced_accuracy"] > 0.8


@pytest.mark.parametrize(("folds", "queries"), [(1, 4), (5, 0)])
def test_settings_refuse_fewer_than_two_folds_or_no_threshold_queries(
    folds: int, queries: int
) -> None:
    with pytest.raises(ValueError, match="threshold_folds must be >= 2"):
        CalibrationSettings(threshold_folds=folds, threshold_queries=queries)


def test_command_settings_keep_the_default_multiple_unless_given() -> None:
    default = CalibrationSettings.from_command(
        40, seed=2, max_false_abstention=0.1, threshold_queries=None
    )
    assert (default.positives, default.negatives, default.seed) == (40, 40, 2)
    assert default.max_false_abstention == 0.1
    assert default.threshold_queries == CalibrationSettings().threshold_queries == 4
    given = CalibrationSettings.from_command(
        40, seed=2, max_false_abstention=0.1, threshold_queries=1
    )
    assert given.threshold_queries == 1
