"""BM25-style sparse vectors for Qdrant's IDF modifier (pure; no engine import).

Documents carry BM25's term-frequency part, `tf * (k1 + 1) / (tf + k1 * (1 - b + b * len /
avgdl))`, with a fixed, configured `avgdl`; the engine multiplies by IDF at query time (sparse
vector with `Modifier.IDF`), so the collection's statistics stay current without re-encoding.
Queries are the unique tokens with weight 1. This matches bm25s quality here (MODELS.md).

Tokens map to indices through a stable 31-bit hash (blake2b), never Python's salted `hash()`:
the same token must get the same index in every process, forever. Changing the tokenizer or the
hash re-keys an index, so `Bm25Encoder.model_version` goes into every index manifest.

Tokenization keeps identifiers whole *and* split: `E-1042` gives `e-1042`, `e`, `1042`;
`ERR_TIMEOUT` gives `err_timeout`, `err`, `timeout`; `v2.3.1` gives `v2.3.1`, `v2`, `3`, `1`.
So an exact identifier query matches exactly, and a query for one part still matches. There is
no stemmer (PyStemmer is not a dependency).
"""

from __future__ import annotations

import hashlib
import math
import re
from collections import Counter
from dataclasses import dataclass, field

from ragstream.store.base import SparseVector

#: Bump when tokenization or hashing changes: it is part of `Bm25Encoder.model_version`.
TOKENIZER_VERSION = 1

# A word, optionally joined to more words by - _ . / : (identifiers, versions, paths).
_COMPOUND = re.compile(r"\w+(?:[-./:]\w+)*")
_SEPARATORS = re.compile(r"[-_./:]+")

_ENGLISH_STOPWORDS_TEXT = """
    a about above after again against all am an and any are as at be because been before
    being below between both but by can could did do does doing down during each few for from
    further had has have having he her here hers herself him himself his how i if in into is it
    its itself just me more most my myself no nor not now of off on once only or other our ours
    ourselves out over own same she should so some such than that the their theirs them
    themselves then there these they this those through to too under until up very was we were
    what when where which while who whom why will with would you your yours yourself
    yourselves"""

#: A small English stopword list (articles, pronouns, auxiliaries, common prepositions).
ENGLISH_STOPWORDS: frozenset[str] = frozenset(_ENGLISH_STOPWORDS_TEXT.split())


def token_index(token: str) -> int:
    """The sparse index of a token: the first 31 bits of its blake2b digest."""
    digest = hashlib.blake2b(token.encode("utf-8"), digest_size=8).digest()
    return int.from_bytes(digest, "big") & 0x7FFFFFFF


@dataclass(frozen=True, slots=True)
class Bm25Config:
    """Tokenization and BM25 parameters (defaults: k1=1.2, b=0.75, avgdl=256 as in Qdrant)."""

    k1: float = 1.2
    b: float = 0.75
    avgdl: float = 256.0
    stopwords: frozenset[str] = field(default=ENGLISH_STOPWORDS)
    max_token_len: int = 64

    def __post_init__(self) -> None:
        if self.k1 < 0:
            raise ValueError(f"k1 must be >= 0, got {self.k1}")
        if not 0.0 <= self.b <= 1.0:
            raise ValueError(f"b must be within [0, 1], got {self.b}")
        if not self.avgdl > 0:
            raise ValueError(f"avgdl must be > 0, got {self.avgdl}")
        if self.max_token_len < 1:
            raise ValueError(f"max_token_len must be >= 1, got {self.max_token_len}")


def bm25_weight(tf: float, doc_len: float, config: Bm25Config) -> float:
    """BM25's term-frequency saturation (without IDF) for one term of a document."""
    norm = 1.0 - config.b + config.b * doc_len / config.avgdl
    return tf * (config.k1 + 1.0) / (tf + config.k1 * norm)


class Bm25Encoder:
    """Tokenizes text and encodes documents and queries as sparse vectors."""

    def __init__(self, config: Bm25Config | None = None) -> None:
        """Use `config` (defaults when None)."""
        self.config = config or Bm25Config()

    @property
    def model_version(self) -> str:
        """Identity of the encoding, recorded in index manifests (a mismatch re-keys terms)."""
        c = self.config
        stop = "en" if c.stopwords == ENGLISH_STOPWORDS else f"custom{len(c.stopwords)}"
        return (
            f"ragstream-bm25@{TOKENIZER_VERSION};k1={c.k1:g};b={c.b:g};avgdl={c.avgdl:g};"
            f"stop={stop};max={c.max_token_len}"
        )

    def words(self, text: str) -> list[list[str]]:
        """Surface words (lowercased), each with its derived tokens: [whole, part, part...].

        Stopwords are dropped when they stand alone; parts of an identifier are always kept.
        """
        out: list[list[str]] = []
        for match in _COMPOUND.finditer(text.lower()):
            word = match.group()
            parts = [p for p in _SEPARATORS.split(word) if p]
            if len(parts) == 1 and word == parts[0]:
                if word in self.config.stopwords:
                    continue
                tokens = [word]
            else:
                tokens = [word, *parts]
            tokens = [t for t in tokens if len(t) <= self.config.max_token_len]
            if tokens:
                out.append(tokens)
        return out

    def tokenize(self, text: str) -> list[str]:
        """Every token of `text` in order (identifiers followed by their parts)."""
        return [token for word in self.words(text) for token in word]

    def encode_document(self, text: str) -> SparseVector:
        """BM25 document weights; the document length is its number of surface words."""
        words = self.words(text)
        if not words:
            return SparseVector((), ())
        counts: Counter[int] = Counter(token_index(t) for word in words for t in word)
        doc_len = float(len(words))
        return SparseVector.from_mapping(
            {index: bm25_weight(tf, doc_len, self.config) for index, tf in counts.items()}
        )

    def encode_query(self, text: str) -> SparseVector:
        """Unique tokens with weight 1 (the engine applies IDF)."""
        return SparseVector.from_mapping({token_index(t): 1.0 for t in self.tokenize(text)})


def idf(n_docs: int, doc_freq: int) -> float:
    """BM25's IDF as Qdrant's IDF modifier computes it: ln(1 + (N - n + 0.5) / (n + 0.5))."""
    return math.log(1.0 + (n_docs - doc_freq + 0.5) / (doc_freq + 0.5))
