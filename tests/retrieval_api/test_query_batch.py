"""The query batcher: a lone query is embedded at once; queries arriving during a call go
together in the next, led by the longest-waiting request; errors reach every request of the
batch; nobody is left waiting."""

from __future__ import annotations

import threading
import time
from collections.abc import Sequence

import numpy as np
import pytest

from ragcore.embedders.base import Vectors
from ragcore.errors import EmbeddingError, EmbeddingUnavailableError
from retrieval_api.query_batch import QueryBatcher

pytestmark = pytest.mark.unit


def vector_of(text: str) -> Vectors:
    return np.array([len(text), sum(map(ord, text))], dtype=np.float32)


def same(result: Vectors | BaseException, text: str) -> bool:
    return not isinstance(result, BaseException) and np.array_equal(result, vector_of(text))


class Model:
    """Records each call; the first call can be held until released, so that others queue."""

    def __init__(self, hold_first: bool = False, fail: dict[int, Exception] | None = None) -> None:
        self.calls: list[list[str]] = []
        self.inside = threading.Event()
        self.release = threading.Event()
        if not hold_first:
            self.release.set()
        self.fail = fail or {}

    def __call__(self, texts: Sequence[str]) -> Vectors:
        self.calls.append(list(texts))
        if len(self.calls) == 1:
            self.inside.set()
            assert self.release.wait(10)
        if len(self.calls) in self.fail:
            raise self.fail[len(self.calls)]
        return np.stack([vector_of(t) for t in texts])


def run_concurrently(
    batcher: QueryBatcher, model: Model, texts: Sequence[str]
) -> dict[str, Vectors | BaseException]:
    """The first text leads and is held inside the model while the others queue (in no
    particular order)."""
    results: dict[str, Vectors | BaseException] = {}

    def one(text: str) -> None:
        try:
            results[text] = batcher.embed(text)
        except (EmbeddingError, ZeroDivisionError) as exc:  # collected for the assertions
            results[text] = exc

    first = threading.Thread(target=one, args=(texts[0],))
    first.start()
    assert model.inside.wait(10)
    others = []
    for text in texts[1:]:
        thread = threading.Thread(target=one, args=(text,))
        thread.start()
        others.append(thread)
    deadline = time.monotonic() + 10
    while len(batcher._queued) < len(texts) - 1:  # every other request is queued
        assert time.monotonic() < deadline
        time.sleep(0.005)
    model.release.set()
    for thread in (first, *others):
        thread.join(10)
        assert not thread.is_alive(), "a request was left waiting"
    return results


def test_a_lone_query_is_embedded_at_once_alone() -> None:
    model, sizes = Model(), list[int]()
    batcher = QueryBatcher(model, observe=sizes.append)
    assert np.array_equal(batcher.embed("refund"), vector_of("refund"))
    assert np.array_equal(batcher.embed("vpn"), vector_of("vpn"))
    assert model.calls == [["refund"], ["vpn"]] and sizes == [1, 1]


def test_queries_arriving_during_a_call_go_together_in_the_next() -> None:
    model, sizes = Model(hold_first=True), list[int]()
    batcher = QueryBatcher(model, observe=sizes.append)
    texts = ["q0", "q1", "q22", "q333", "q4444"]
    results = run_concurrently(batcher, model, texts)
    assert model.calls[0] == ["q0"] and sorted(model.calls[1]) == texts[1:]
    assert len(model.calls) == 2
    assert sizes == [1, 4]
    for text in texts:
        assert same(results[text], text), text


def test_batches_are_cut_at_max_batch() -> None:
    model = Model(hold_first=True)
    batcher = QueryBatcher(model, max_batch=2)
    texts = [f"q{i}" for i in range(6)]
    results = run_concurrently(batcher, model, texts)
    assert [len(call) for call in model.calls] == [1, 2, 2, 1]
    assert sorted(t for call in model.calls for t in call) == texts
    assert all(same(results[t], t) for t in texts)


def test_an_embedder_error_reaches_every_request_of_its_batch_only() -> None:
    outage = EmbeddingUnavailableError("model busy", retry_after=1.0)
    model = Model(hold_first=True, fail={2: outage})
    batcher = QueryBatcher(model)
    results = run_concurrently(batcher, model, ["q0", "q1", "q2"])
    assert same(results["q0"], "q0")
    assert results["q1"] is outage and results["q2"] is outage
    assert np.array_equal(batcher.embed("q3"), vector_of("q3"))  # the batcher carries on


def test_an_unexpected_error_is_raised_by_the_leader_and_nobody_hangs() -> None:
    model = Model(hold_first=True, fail={2: ZeroDivisionError("bug")})
    batcher = QueryBatcher(model)
    results = run_concurrently(batcher, model, ["q0", "q1", "q2"])
    # the request that led the failing batch raises the bug itself, the other a typed error
    kinds = sorted(type(results[t]).__name__ for t in ("q1", "q2"))
    assert kinds == ["EmbeddingError", "ZeroDivisionError"]
    assert np.array_equal(batcher.embed("q3"), vector_of("q3"))


def test_max_batch_must_be_positive() -> None:
    with pytest.raises(ValueError, match="max_batch"):
        QueryBatcher(Model(), max_batch=0)
