"""The patterns Debezium's logical types are parsed with take linear time on any column
text."""

from __future__ import annotations

from collections.abc import Callable

import pytest

from streams.decode import logical_types
from tests.linear_time import assert_linear

pytestmark = pytest.mark.unit

_INPUTS: list[tuple[str, Callable[[int], str]]] = [
    ("_DECIMAL_STRING", lambda n: "1" * n + "x"),
    ("_DECIMAL_STRING", lambda n: "1." + "1" * n + "x"),
    ("_DECIMAL_STRING", lambda n: "." + "1" * n + "e"),
    ("_DECIMAL_STRING", lambda n: "+" * n),
    ("_ZONED_TIMESTAMP", lambda n: "1" * n),
    ("_ZONED_TIMESTAMP", lambda n: "2024-01-01T00:00:00." + "1" * n + "Z"),
    ("_ZONED_TIME", lambda n: "00:00:00." + "1" * n),
    ("_UUID", lambda n: "a" * n),
    ("_UUID", lambda n: "a-" * n),
    ("_INT_PARAM", lambda n: "-" + "1" * n),
]


@pytest.mark.parametrize(("name", "make"), _INPUTS, ids=[name for name, _ in _INPUTS])
def test_logical_type_patterns_are_linear(name: str, make: Callable[[int], str]) -> None:
    pattern = getattr(logical_types, name)
    assert_linear(pattern.fullmatch, make)
