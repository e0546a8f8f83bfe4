"""The in-process lexical baselines (bm25s, our BM25 over whole documents)."""

from __future__ import annotations

import pytest

from ragcore.quality.dataset import EvalEntity, EvalQuery, EvalSet, QueryKind
from ragdev.eval.lexical import BASELINES

pytestmark = pytest.mark.unit

DOCS = {
    "refund": "Annual plans are refunded pro rata within thirty days of renewal.",
    "pump": "Grease the pump bearings every two thousand hours with lithium grease.",
    "errors": "Error E-2113 means the identity provider clock drifted too far.",
}


def evalset() -> EvalSet:
    return EvalSet(
        name="tiny",
        version="1",
        entities=tuple(
            EvalEntity(entity_id=k, tenant="acme", entity_type="DOC", content=v)
            for k, v in DOCS.items()
        ),
        queries=(
            EvalQuery(
                query_id="q1",
                text="when are bearings greased?",
                tenant="acme",
                kind=QueryKind.KEYWORD,
                answerable=True,
                relevant={"pump": 3},
            ),
            EvalQuery(
                query_id="q2",
                text="E-2113",
                tenant="acme",
                kind=QueryKind.EXACT_IDENTIFIER,
                answerable=True,
                relevant={"errors": 3},
            ),
        ),
    )


@pytest.mark.parametrize("name", sorted(BASELINES))
def test_each_baseline_ranks_the_lexical_match_first(name: str) -> None:
    result = BASELINES[name](evalset(), 10)
    assert result.row("q1").top_entities[0] == "pump"
    assert result.row("q2").top_entities[0] == "errors"
    assert result.aggregates["hit@1"] == 1.0
