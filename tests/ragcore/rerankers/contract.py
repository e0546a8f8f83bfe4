"""Conformance suite every reranker (`ragcore.rerankers.RerankerAdapter`) must pass.

Subclass `RerankerContract` and override the `reranker` fixture. The suite checks what
Retrieve's ranking relies on: one relevance probability in [0, 1] per passage, in input order
(a passage scores the same alone or in a batch), the same scores again for the same pairs, no
call for no passages, a passage sharing the query's words above one sharing none, a usable
`check()` and an idempotent `close()`.
"""

from __future__ import annotations

import pytest

from ragcore.rerankers import RerankerAdapter

QUERY = "pump pressure drop"
RELATED = "pump pressure drop after the seal was replaced"
UNRELATED = "motor bearing noise"
PASSAGES = [UNRELATED, RELATED, "the pressure sensor drift", "oil temperature high"]


class RerankerContract:
    """The reranker port's promises, for one implementation."""

    @pytest.fixture
    def reranker(self) -> RerankerAdapter:
        raise NotImplementedError("subclasses provide the reranker fixture")

    def test_one_probability_per_passage(self, reranker: RerankerAdapter) -> None:
        scores = reranker.score(QUERY, PASSAGES)
        assert len(scores) == len(PASSAGES)
        assert all(isinstance(s, float) and 0.0 <= s <= 1.0 for s in scores)

    def test_scores_follow_the_input_order_and_repeat(self, reranker: RerankerAdapter) -> None:
        batch = reranker.score(QUERY, PASSAGES)
        alone = [reranker.score(QUERY, [p])[0] for p in PASSAGES]
        assert batch == pytest.approx(alone, abs=1e-6)
        assert reranker.score(QUERY, list(reversed(PASSAGES))) == pytest.approx(
            list(reversed(batch)), abs=1e-6
        )

    def test_no_passages_no_scores(self, reranker: RerankerAdapter) -> None:
        assert reranker.score(QUERY, []) == []

    def test_a_passage_sharing_the_query_s_words_scores_higher(
        self, reranker: RerankerAdapter
    ) -> None:
        related, unrelated = reranker.score(QUERY, [RELATED, UNRELATED])
        assert related > unrelated

    def test_check_passes_and_close_is_idempotent(self, reranker: RerankerAdapter) -> None:
        reranker.check()
        reranker.close()
        reranker.close()
