"""Near-duplicate text detection (pure): word shingles and their Jaccard similarity.

Retrieve collapses results whose texts are the same or nearly the same (the same ticket filed
by many customers, a paragraph copied into several documents), and the eval harness counts the
top-k slots such repeats hold; both use this one definition.

A text's signature is the set of its word 3-shingles after lowercasing, with every purely
numeric token (ticket numbers, account numbers, counts) replaced by one placeholder: two
tickets that differ only in their numbers are duplicates, while texts that differ in an
identifier (`GX-300` vs `GX-310`, `E-2113` vs `E-2150`) or in words are not. Measured on the
dev sample corpus: copies of one ticket 1.0, pump datasheets of one template at most 0.87,
service bulletins at most 0.75, release notes at most 0.56; hence the default cut of 0.9.

Finding a text's words is most of a signature's cost, so a chunk stores them when it is
written (`SIGNATURE_WORDS`, `stored_words`) and Retrieve builds the signatures of its
candidates from them (`payload_signature`); a chunk stored without them has its text read.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Any

#: Jaccard similarity of signatures at or above which two texts are near-duplicates.
NEAR_DUPLICATE_SIMILARITY = 0.9
SHINGLE_WORDS = 3

# A word, optionally joined to more words by - or . (identifiers, versions). Possessive
# quantifiers: nothing follows a match, so backtracking never changes one and skipping it is
# faster; on ASCII text `\w` is [A-Za-z0-9_] under either flag, and the ASCII twin is faster
# (the signature's regex is most of its cost; as `ragcore.sparse._words` does).
_WORD_RE = re.compile(r"\w++(?:[-.]\w++)*+")
_WORD_ASCII_RE = re.compile(r"\w++(?:[-.]\w++)*+", re.ASCII)
_NUMBER_RE = re.compile(r"[0-9]+(?:[.,][0-9]+)*")
_DIGIT_RE = re.compile(r"[0-9]")
_NUMBER = "<n>"

Signature = frozenset[tuple[str, ...]]


#: The payload key of a chunk's words as its signature sees them (`stored_words`).
SIGNATURE_WORDS = "signature_words"
# The stored words' format and word definition: bump when either changes (`_WORD_RE`, the
# case folding, the number mask).
_WORDS_TAG = "w1:"


def shingle_words(text: str) -> list[str]:
    """The words of `text` as a signature sees them: case-folded, numbers masked."""
    folded = text.casefold()
    tokens = (_WORD_ASCII_RE if folded.isascii() else _WORD_RE).findall(folded)
    # a number starts with an ASCII digit: only those tokens are matched, and only in a text
    # that has one (Retrieve computes a signature per candidate; this is most of its cost)
    if _DIGIT_RE.search(folded) is not None:
        tokens = [_NUMBER if "0" <= t[0] <= "9" and _NUMBER_RE.fullmatch(t) else t for t in tokens]
    return tokens


def signature(text: str, words: int = SHINGLE_WORDS) -> Signature:
    """The set of `words`-word shingles of `text` (numbers masked); a text shorter than
    `words` words is one shingle of all its words, an empty text the empty set."""
    return shingles(shingle_words(text), words)


def shingles(tokens: list[str], words: int = SHINGLE_WORDS) -> Signature:
    """The signature of a text's `shingle_words`: the set of its `words`-word shingles."""
    if words < 1:
        raise ValueError(f"shingle size must be >= 1, got {words}")
    if not tokens:
        return frozenset()
    if len(tokens) <= words:
        return frozenset({tuple(tokens)})
    # the shifted lists differ in length: zip stops at the last whole shingle
    if words == 3:  # the default, spelled out: no generator of slices
        return frozenset(zip(tokens, tokens[1:], tokens[2:], strict=False))
    return frozenset(zip(*(tokens[i:] for i in range(words)), strict=False))


def stored_words(text: str) -> str:
    """A text's `shingle_words` as a chunk's payload stores them (`SIGNATURE_WORDS`): a format tag,
    then the words joined by single spaces (a word never holds one)."""
    return _WORDS_TAG + " ".join(shingle_words(text))


def payload_signature(payload: Mapping[str, Any], words: int = SHINGLE_WORDS) -> Signature:
    """The signature of a chunk from the words its payload stores, else from its `text`
    (chunks written without them, or with another word definition): the same set."""
    stored = payload.get(SIGNATURE_WORDS)
    if isinstance(stored, str) and stored.startswith(_WORDS_TAG):
        body = stored[len(_WORDS_TAG) :]
        return shingles(body.split(" ") if body else [], words)
    text = payload.get("text")
    return signature(text if isinstance(text, str) else "", words)


def similarity(a: Signature, b: Signature) -> float:
    """Jaccard similarity of two signatures in [0, 1]; two empty texts are identical (1)."""
    if not a and not b:
        return 1.0
    common = len(a & b)
    return common / (len(a) + len(b) - common)


def near_duplicate(a: Signature, b: Signature, cut: float = NEAR_DUPLICATE_SIMILARITY) -> bool:
    """True when the texts of two signatures are the same or nearly the same."""
    return similarity(a, b) >= cut


def duplicate_slots(texts: list[str], k: int, cut: float = NEAR_DUPLICATE_SIMILARITY) -> int:
    """How many of the first `k` texts are near-duplicates of a text ranked above them."""
    if k < 1:
        raise ValueError(f"k must be >= 1, got {k}")
    seen: list[Signature] = []
    repeats = 0
    for text in texts[:k]:
        sig = signature(text)
        if any(near_duplicate(sig, other, cut) for other in seen):
            repeats += 1
        seen.append(sig)
    return repeats
