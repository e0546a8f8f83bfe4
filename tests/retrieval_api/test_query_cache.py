"""The query-vector cache: a repeated question is not embedded again, within one tenant."""

from __future__ import annotations

import numpy as np
import pytest

from ragcore.embedders.base import Vectors
from retrieval_api.query_cache import QueryVectorCache
from tests.retrieval_api.stack import Stack


class _Embed:
    def __init__(self) -> None:
        self.calls: list[str] = []

    def __call__(self, query: str) -> Vectors:
        self.calls.append(query)
        vector: Vectors = np.full(4, float(len(self.calls)), dtype=np.float32)
        return vector


@pytest.mark.unit
def test_a_repeated_query_is_served_from_the_cache_and_counted() -> None:
    outcomes: list[str] = []
    embed = _Embed()
    cache = QueryVectorCache(8, outcomes.append)
    first = cache.vector("acme", "m@1", "what is sso", embed)
    again = cache.vector("acme", "m@1", "what is sso", embed)
    assert embed.calls == ["what is sso"] and outcomes == ["miss", "hit"]
    assert np.array_equal(first, again)
    with pytest.raises(ValueError, match="read-only"):
        again[0] = 0.0  # shared between requests: nobody may change it


@pytest.mark.unit
def test_tenants_and_models_never_share_an_entry() -> None:
    embed = _Embed()
    cache = QueryVectorCache(8)
    cache.vector("acme", "m@1", "q", embed)
    cache.vector("globex", "m@1", "q", embed)  # another tenant: its own miss (no timing leak)
    cache.vector("acme", "m@2", "q", embed)  # another model: another vector
    assert len(embed.calls) == 3


@pytest.mark.unit
def test_the_least_recently_used_entry_goes_first_and_zero_entries_is_off() -> None:
    embed = _Embed()
    cache = QueryVectorCache(2)
    for query in ("a", "b", "a", "c", "a", "b"):
        cache.vector("t", "m", query, embed)
    # "b" was evicted by "c" (the least recently used then), "a" stayed
    assert embed.calls == ["a", "b", "c", "b"]
    off = QueryVectorCache(0)
    off.vector("t", "m", "a", embed)
    off.vector("t", "m", "a", embed)
    assert embed.calls[-2:] == ["a", "a"]


@pytest.mark.integration
def test_retrieve_embeds_a_repeated_question_once_per_tenant(stack: Stack) -> None:
    stack.write("sso-1", "acme", "Single sign-on with Okta uses SAML assertions.")
    stack.write("sso-2", "globex", "Pumps ship with SAML single sign-on for the portal.")

    def count(outcome: str) -> float:
        return stack.sample("ragstream_retrieve_query_cache_total", outcome=outcome)

    first = stack.retrieve("acme", "how does single sign-on work?")
    again = stack.retrieve("acme", "how does single sign-on work?")
    other = stack.retrieve("globex", "how does single sign-on work?")
    assert (count("miss"), count("hit")) == (2, 1)
    assert first.results and [r.chunk_id for r in again.results] == [
        r.chunk_id for r in first.results
    ]
    assert other.results and all(r.entity_id.endswith("sso-2") for r in other.results)
