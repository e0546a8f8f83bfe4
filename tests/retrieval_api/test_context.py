"""Context under a token budget: neighbours without overlap, texts first, then contexts."""

from __future__ import annotations

from typing import Any

import pytest

from ragcore.embedders.local_onnx import MINILM_SPEC
from ragcore.tokenizers import TokenCounter, load_token_counter
from retrieval_api.context import (
    BudgetAction,
    Context,
    context_of,
    neighbour_ids,
    plan_context,
)
from retrieval_api.ranking import RankedChunk
from tests.retrieval_api.helpers import cand

pytestmark = pytest.mark.unit

DOC = (
    "Refunds. Annual plans cancelled within 30 days are refunded in full. "
    "After 30 days the remaining months are credited to the account, never paid out. "
    "Monthly plans are never refunded; they simply end at the close of the billing period."
)


@pytest.fixture(scope="module")
def counter() -> TokenCounter:
    return load_token_counter(MINILM_SPEC.tokenizer)


def _chunk(n: int, start: int, end: int) -> dict[str, Any]:
    return {
        "chunk_id": f"entities:kb-refunds:chunk:{n}",
        "text": DOC[start:end],
        "locator": {"chunk_index": n, "char_start": start, "char_end": end},
    }


def test_neighbour_ids_are_the_chunks_before_and_after() -> None:
    assert neighbour_ids("entities:kb:chunk:3") == ("entities:kb:chunk:2", "entities:kb:chunk:4")
    assert neighbour_ids("entities:kb:chunk:0") == (None, "entities:kb:chunk:1")
    assert neighbour_ids("not-a-chunk-id") == (None, None)


def test_context_is_the_neighbours_without_the_overlap() -> None:
    # chunk 1 = [60, 150); chunk 0 = [0, 70) and chunk 2 = [140, end) overlap it by 10 chars
    middle = _chunk(1, 60, 150)
    extra = {k: v for k, v in middle.items() if k != "chunk_id"}
    result = RankedChunk(cand(middle["chunk_id"], 0.8, **extra), 0.8)
    neighbours = {c["chunk_id"]: c for c in (_chunk(0, 0, 70), _chunk(2, 140, len(DOC)))}
    context = context_of(result, neighbours)
    assert context.before == DOC[0:60]
    assert context.after == DOC[150:]
    assert context.chunk_ids == ("entities:kb-refunds:chunk:0", "entities:kb-refunds:chunk:2")
    assert context.before + middle["text"] + context.after == DOC
    # a missing neighbour (the last chunk) leaves its side empty
    alone = context_of(result, {})
    assert alone == Context()


def test_everything_fits_within_a_large_budget(counter: TokenCounter) -> None:
    ctx = Context("before text here.", "after text here.", ("c:chunk:0", "c:chunk:2"))
    plan = plan_context([("c:chunk:1", DOC, ctx)], counter, 10_000)
    placed = plan.placed["c:chunk:1"]
    assert (placed.text, placed.context, placed.context_truncated) == (DOC, ctx, False)
    expected = counter.count(DOC) + counter.count(ctx.before) + counter.count(ctx.after)
    assert plan.used == expected == placed.text_tokens + placed.context_tokens
    assert plan.cuts == ()
    assert plan.tokenizer == MINILM_SPEC.tokenizer


def test_texts_come_first_then_contexts_and_the_budget_is_never_exceeded(
    counter: TokenCounter,
) -> None:
    first, second, third = DOC[:70], DOC[70:], "Monthly plans end with the period."
    ctx = Context(DOC, DOC, ("x:chunk:0",))
    n1, n2, n3 = (counter.count(t) for t in (first, second, third))
    budget = n1 + n3 + 6  # room for the first and third texts and a little context
    assert n2 > n3 + 6
    plan = plan_context(
        [("a:chunk:1", first, ctx), ("b:chunk:1", second, ctx), ("c:chunk:1", third, ctx)],
        counter,
        budget,
    )
    assert set(plan.placed) == {"a:chunk:1", "c:chunk:1"}
    assert plan.dropped == {"b:chunk:1"}
    a, c = plan.placed["a:chunk:1"], plan.placed["c:chunk:1"]
    assert a.context_truncated and a.context_tokens <= 6
    assert DOC.endswith(a.context.before) and DOC.startswith(a.context.after)
    assert c.context == Context() and c.context_tokens == 0
    assert plan.used <= budget
    assert plan.used == a.text_tokens + a.context_tokens + c.text_tokens
    actions = [(cut.chunk_id, cut.action) for cut in plan.cuts]
    assert actions == [
        ("b:chunk:1", BudgetAction.RESULT_DROPPED),
        ("a:chunk:1", BudgetAction.CONTEXT_TRUNCATED),
        ("c:chunk:1", BudgetAction.CONTEXT_DROPPED),
    ]
    assert plan.cuts[0].tokens_before == n2 and plan.cuts[0].tokens_after == 0


def test_the_first_result_is_cut_rather_than_dropped(counter: TokenCounter) -> None:
    plan = plan_context([("a:chunk:0", DOC, Context())], counter, 8)
    placed = plan.placed["a:chunk:0"]
    assert DOC.startswith(placed.text) and 0 < placed.text_tokens <= 8
    assert counter.count(placed.text) == placed.text_tokens
    [cut] = plan.cuts
    assert cut.action is BudgetAction.TEXT_TRUNCATED
    assert (cut.tokens_before, cut.tokens_after) == (counter.count(DOC), placed.text_tokens)
    with pytest.raises(ValueError):
        plan_context([], counter, 0)


@pytest.mark.parametrize("ref", [MINILM_SPEC.tokenizer, "tiktoken:cl100k_base"])
def test_counts_and_cuts_agree_with_the_tokenizer(ref: str) -> None:
    counter = load_token_counter(ref)
    ctx = Context(DOC, DOC, ("x:chunk:0",))
    whole = plan_context([("a:chunk:1", DOC, Context())], counter, 10_000)
    assert whole.used == counter.count(DOC)  # per-word sums equal the text's count
    plan = plan_context([("a:chunk:1", DOC, ctx)], counter, counter.count(DOC) + 20)
    placed = plan.placed["a:chunk:1"]
    assert placed.context_truncated and plan.used <= counter.count(DOC) + 20
    assert counter.count(placed.context.before) + counter.count(placed.context.after) <= 20
    assert DOC.endswith(placed.context.before) and DOC.startswith(placed.context.after)
    cut = plan_context([("a:chunk:1", DOC, Context())], counter, 7).placed["a:chunk:1"]
    assert 0 < counter.count(cut.text) <= 7 and DOC.startswith(cut.text)
