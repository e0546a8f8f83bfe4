"""`retrieval_api.retriever`: the cooldown that keeps stale hits from re-requests in a loop."""

from __future__ import annotations

import pytest

from retrieval_api.retriever import Cooldown

pytestmark = pytest.mark.unit


def test_a_key_passes_once_per_cooldown_and_the_memo_stays_bounded() -> None:
    now = [0.0]
    cooldown = Cooldown(60.0, 2, clock=lambda: now[0])
    assert cooldown.first("a") and not cooldown.first("a")
    now[0] = 59.9
    assert not cooldown.first("a")
    now[0] = 60.0
    assert cooldown.first("a")
    assert cooldown.first("b") and cooldown.first("c")  # "a" is forgotten: at most 2 keys
    assert cooldown.first("a") and not cooldown.first("c")
