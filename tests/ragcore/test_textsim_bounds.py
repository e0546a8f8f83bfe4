"""Near-duplicate signatures run in linear time on any text."""

from __future__ import annotations

import pytest

from ragcore.textsim import signature
from tests.linear_time import assert_linear

pytestmark = pytest.mark.unit


@pytest.mark.parametrize(
    "piece", ["1.", "1,", "1", "a-", "a.", "-", ".", "1 ", "x1", "1.1-", "é.", "a b c "], ids=repr
)
def test_signatures_are_linear(piece: str) -> None:
    assert_linear(signature, lambda n: piece * n + "x")
