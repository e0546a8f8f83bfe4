"""`runner.comparison`: the paired bootstrap of each configuration against the default."""

from __future__ import annotations

import pytest

from ragcore.quality.dataset import EvalQuery, QueryKind
from ragcore.quality.metrics import QueryRun, Status, evaluate
from ragdev.eval.runner import ConfigResult, comparison

pytestmark = pytest.mark.unit

#: distractors d0..d9; query q<i> has its one relevant document r<i>
QUERIES = tuple(
    EvalQuery(
        query_id=f"q{i}",
        text=f"query {i}",
        tenant="acme",
        kind=QueryKind.PARAPHRASE,
        answerable=True,
        relevant={f"r{i}": 1},
    )
    for i in range(6)
)


def ranked(query: EvalQuery, rank: int | None) -> QueryRun:
    """A successful run of ten results with the relevant document at `rank` (None: absent)."""
    ids = [f"d{j}" for j in range(10)]
    if rank is not None:
        ids[rank - 1] = next(iter(query.relevant))
    return QueryRun(query.query_id, Status.SUCCESS, entity_ids=tuple(ids))


def config(name: str, rank: int | None) -> ConfigResult:
    result = evaluate(QUERIES, [ranked(q, rank) for q in QUERIES])
    return ConfigResult(name, {}, result)


def test_comparison_tests_ndcg_at_10_beside_ndcg_at_5() -> None:
    """A configuration that finds the answer at rank 7 where the default misses it: equal
    nDCG@5 (both 0), higher nDCG@10 — only the nDCG@10 test can see the difference."""
    out = comparison([config("default", None), config("deeper", 7)])
    tests = out["deeper"]
    assert set(tests) == {"ndcg@5", "ndcg@10"}
    assert tests["ndcg@5"]["mean_diff_vs_default"] == 0.0
    ndcg10 = tests["ndcg@10"]
    assert ndcg10["mean_diff_vs_default"] == pytest.approx(1 / 3)  # 1/log2(7+1)
    low, high = ndcg10["ci95"]
    assert 0 < low <= high
    assert ndcg10["p_value"] < 0.05


def test_comparison_difference_is_the_configuration_minus_the_default() -> None:
    out = comparison([config("default", 1), config("worse", 3)], metrics=("ndcg@5",))
    assert out["worse"]["ndcg@5"]["mean_diff_vs_default"] == pytest.approx(0.5 - 1.0)
