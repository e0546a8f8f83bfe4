"""Near-duplicate texts: word 3-shingles with numbers masked, Jaccard similarity."""

from __future__ import annotations

import re

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from ragcore.textsim import (
    SIGNATURE_WORDS,
    duplicate_slots,
    near_duplicate,
    payload_signature,
    signature,
    similarity,
    stored_words,
)

pytestmark = pytest.mark.unit

TICKET = (
    "Login fails with E-2113 (#{n})\n\nOur users cannot log in through SAML since this morning; "
    "the login page shows error E-2113. Reported by customer account {account}."
)


def test_texts_that_differ_only_in_numbers_are_duplicates() -> None:
    a = signature(TICKET.format(n=1000, account=532))
    b = signature(TICKET.format(n=1006, account=117))
    assert similarity(a, b) == 1.0
    assert near_duplicate(a, b)


def test_texts_that_differ_in_an_identifier_or_words_are_not() -> None:
    a = signature(TICKET.format(n=1000, account=532))
    other_code = signature(TICKET.format(n=1000, account=532).replace("E-2113", "E-2150"))
    other_words = signature(
        "Webhook sent twice (#1002)\n\nEvery webhook arrived twice after your maintenance "
        "window. Reported by customer account 532."
    )
    assert not near_duplicate(a, other_code)
    assert similarity(a, other_words) < 0.2


def test_similarity_is_jaccard_of_the_shingles() -> None:
    # "a b c d" -> {abc, bcd}; "a b c e" -> {abc, bce}: 1 shared of 3
    assert similarity(signature("a b c d"), signature("a b c e")) == pytest.approx(1 / 3)
    assert signature("Two words") == frozenset({("two", "words")})
    assert similarity(signature(""), signature("")) == 1.0
    assert similarity(signature(""), signature("x")) == 0.0


def test_duplicate_slots_counts_repeats_of_a_better_text() -> None:
    texts = [
        TICKET.format(n=1, account=2),
        "The release notes of 2.3 list E-2113 as fixed.",
        TICKET.format(n=3, account=4),
        TICKET.format(n=5, account=6),
    ]
    assert duplicate_slots(texts, 5) == 2
    assert duplicate_slots(texts, 3) == 1
    with pytest.raises(ValueError):
        duplicate_slots(texts, 0)


def _reference_signature(text: str, words: int) -> frozenset[tuple[str, ...]]:
    """The definition as first written (every token matched, shingles sliced)."""
    tokens = [
        "<n>" if re.fullmatch(r"[0-9]+(?:[.,][0-9]+)*", t) else t
        for t in re.findall(r"\w+(?:[-.]\w+)*", text.casefold())
    ]
    if not tokens:
        return frozenset()
    if len(tokens) <= words:
        return frozenset({tuple(tokens)})
    return frozenset(tuple(tokens[i : i + words]) for i in range(len(tokens) - words + 1))


@settings(max_examples=400, deadline=None)
@given(
    st.text(alphabet=st.sampled_from(list("ab Z9 0.,-_\n²٣ßİ")) | st.characters(), max_size=80),
    st.integers(min_value=1, max_value=4),
)
def test_signature_equals_the_reference_definition(text: str, words: int) -> None:
    assert signature(text, words) == _reference_signature(text, words)


@settings(max_examples=400, deadline=None)
@given(
    st.text(alphabet=st.sampled_from(list("ab Z9 0.,-_\n²٣ßİ")) | st.characters(), max_size=80),
    st.integers(min_value=1, max_value=4),
)
def test_a_signature_from_the_stored_words_is_the_texts(text: str, words: int) -> None:
    """Retrieve builds its candidates' signatures from the words stored with each chunk: the
    same set as from the text; without them (or another format) the text is read."""
    stored = {"text": text, SIGNATURE_WORDS: stored_words(text)}
    assert payload_signature(stored, words) == signature(text, words)
    assert payload_signature({"text": text}, words) == signature(text, words)
    # words of another format are not read as these: the text is
    other = {"text": text, SIGNATURE_WORDS: "w0:" + stored_words("something else entirely")[3:]}
    assert payload_signature(other, words) == signature(text, words)


def test_stored_words_are_the_signatures_words() -> None:
    assert stored_words("Ticket #1042: Login FAILS") == "w1:ticket <n> login fails"
    assert stored_words("") == "w1:"
    assert payload_signature({SIGNATURE_WORDS: "w1:"}) == frozenset()
    assert payload_signature({}) == frozenset()
