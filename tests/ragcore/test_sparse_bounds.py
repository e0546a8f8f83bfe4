"""The sparse encoder's tokenization runs in linear time on any text (its regexes are
possessive: a match never backtracks)."""

from __future__ import annotations

from collections.abc import Callable

import pytest

from ragcore.sparse import Bm25Encoder, StoredTerms, is_identifier
from tests.linear_time import assert_linear

pytestmark = pytest.mark.unit

_PIECES = [
    "a.", "a-", "a_", "a:", "a/", "-", ".", ":", "/", "_", "a", "1", "1.", "1,", "1a", "a1",
    "E-", "x.y", "a b ", "é", "é.", "日本", "a-1.", "--a", "1.1-",
]  # fmt: skip


@pytest.mark.parametrize("piece", _PIECES, ids=repr)
def test_encoding_a_chunk_is_linear(piece: str) -> None:
    encoder = Bm25Encoder()
    assert_linear(encoder.count_terms, lambda n: piece * n)
    assert_linear(encoder.tokenize, lambda n: piece * n + " x")


@pytest.mark.parametrize(
    "make",
    [
        lambda n: "1" * n + "a",
        lambda n: "1." + "1" * n + "x",
        lambda n: "1" * n + "-day",
        lambda n: "a" * n + "_b",
        lambda n: "a_" * n,
    ],
)
def test_the_identifier_test_is_linear(make: Callable[[int], str]) -> None:
    assert_linear(is_identifier, make)


def test_reading_stored_counts_is_linear() -> None:
    encoder = Bm25Encoder()

    def stored(n: int) -> StoredTerms:
        counts = encoder.count_terms(" ".join(f"w{i}" for i in range(n)))
        return StoredTerms(StoredTerms.text_of(counts.to_mapping(), counts.length))

    assert_linear(lambda terms: terms.indices(), stored)
