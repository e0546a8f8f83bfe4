"""Shared vector checks of the embedder port."""

from __future__ import annotations

import numpy as np
import pytest

from ragcore.embedders.base import (
    check_dimension,
    empty_vectors,
    finalize,
    l2_normalize,
    with_prefix,
)
from ragcore.embedders.spec import EmbeddingSpec
from ragcore.errors import EmbeddingDimensionError, EmbeddingError

SPEC = EmbeddingSpec(
    name="m", version="1", dimension=3, max_input_tokens=10, tokenizer="tiktoken:cl100k_base"
)


@pytest.mark.unit
def test_l2_normalize_gives_float32_unit_rows() -> None:
    out = l2_normalize([[3.0, 4.0, 0.0], [0.0, 0.0, 2.0]])
    assert out.dtype == np.float32
    np.testing.assert_allclose(out, [[0.6, 0.8, 0.0], [0.0, 0.0, 1.0]], atol=1e-7)
    assert l2_normalize(np.zeros((0, 3))).shape == (0, 3)


@pytest.mark.unit
@pytest.mark.parametrize(
    ("rows", "message"),
    [
        ([[1.0, 0.0, 0.0], [0.0, 0.0, 0.0]], "vector 1 has zero norm"),
        ([[np.nan, 1.0, 0.0]], "vector 0 contains NaN"),
        ([[1.0, np.inf, 0.0]], "vector 0 contains NaN or infinite"),
    ],
)
def test_l2_normalize_refuses_vectors_without_direction(
    rows: list[list[float]], message: str
) -> None:
    with pytest.raises(EmbeddingError, match=message):
        l2_normalize(rows)


@pytest.mark.unit
def test_dimension_and_count_checks() -> None:
    with pytest.raises(EmbeddingDimensionError, match=r"expected \(n, 3\)"):
        check_dimension(np.ones((2, 4)), SPEC, 2)
    with pytest.raises(EmbeddingDimensionError):
        check_dimension(np.ones(3), SPEC, 1)
    with pytest.raises(EmbeddingError, match="2 vectors for 3 inputs"):
        finalize(np.ones((2, 3)), SPEC, 3)
    np.testing.assert_allclose(np.linalg.norm(finalize(np.ones((2, 3)), SPEC, 2), axis=1), 1.0)
    assert empty_vectors(SPEC).shape == (0, 3)


@pytest.mark.unit
def test_with_prefix_and_input_types() -> None:
    assert with_prefix("q: ", ["a", ""]) == ["q: a", "q: "]
    assert with_prefix("", ("a",)) == ["a"]
    with pytest.raises(TypeError, match="single str"):
        with_prefix("", "abc")
    with pytest.raises(TypeError, match=r"texts\[0\] is bytes"):
        with_prefix("", [b"a"])  # type: ignore[list-item]
