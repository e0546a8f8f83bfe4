"""BM25 for the lexical channel: tokenizer, engine sparse vectors, and exact per-index scoring.

Two halves, one tokenizer:

- *Engine vectors* (`Bm25Encoder`). Documents carry BM25's term-frequency part,
  `tf * (k1 + 1) / (tf + k1 * (1 - b + b * len / avgdl))`, with the configured constant `avgdl`
  (the corpus is not known when a chunk is written); the engine multiplies by IDF at query time
  (sparse vector with `Modifier.IDF`), so the collection's statistics stay current without
  re-encoding. Queries are the unique tokens with weight 1. These vectors *generate candidates*.
- *Exact scoring* (`LexiconStats`, `Bm25Scorer`). Retrieve re-scores every candidate with Okapi
  BM25 computed from the chunk text and the index's own statistics: the number of chunks, their
  average length (per index, not a constant) and each token's document frequency, collected
  from the index by `LexiconStats.build` (at calibration time, stored with the index). The
  same pass gives the per-query normalisation (the score divided by the query's summed IDF),
  the IDF-weighted query-term coverage and the identifier matches that the evidence score uses.
  A chunk's term counts are stored in its payload when it is written (`TERM_COUNTS`,
  `Bm25Encoder.encode_chunk`), so Retrieve reads them instead of tokenizing ~40 candidate texts
  a request; a chunk written without them (or by another tokenization) has its text counted.

Tokens map to indices through a stable 31-bit hash (blake2b), never Python's salted `hash()`:
the same token must get the same index in every process, forever. Changing the tokenizer or the
hash re-keys an index, so `Bm25Encoder.model_version` goes into every index manifest (an index
built with another version is refused with MANIFEST_MISMATCH rather than silently mixed).

Tokenization keeps identifiers whole *and* split: `E-1042` gives `e-1042`, `e`, `1042`;
`ERR_TIMEOUT` gives `err_timeout`, `err`, `timeout`; `v2.3.1` gives `v2.3.1`, `v2`, `3`, `1`.
So an exact identifier query matches exactly, and a query for one part still matches. Words and
the parts of identifiers are reduced to their Snowball stem (PyStemmer, English by default:
`bearings` -> `bear`, `refunded` -> `refund`); a whole identifier is never stemmed.
"""

from __future__ import annotations

import base64
import hashlib
import math
import re
import threading
import zlib
from collections import Counter
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from functools import lru_cache
from itertools import chain
from typing import Any, Protocol

import numpy as np
import Stemmer  # type: ignore[import-not-found]
from numpy.typing import NDArray

from ragcore.store.base import SparseVector

# The stored counts' format (`TermCounts`' text; t1 was a binary form that never shipped): bump
# when it changes.
_COUNTS_FORMAT = "t2"

#: Bump when tokenization or hashing changes: it is part of `Bm25Encoder.model_version`.
#: 2: Snowball stemming of words and identifier parts.
TOKENIZER_VERSION = 2

# A word, optionally joined to more words by - _ . / : (identifiers, versions, paths). The
# quantifiers are possessive: a match ends where no word character or joined word follows, so
# backtracking never changes one, and skipping it is faster. On ASCII text `\w` is
# [A-Za-z0-9_] under either flag, and the ASCII pattern is faster (`_words`).
_COMPOUND = re.compile(r"\w++(?:[-./:]\w++)*+")
_COMPOUND_ASCII = re.compile(r"\w++(?:[-./:]\w++)*+", re.ASCII)
_SEPARATORS = re.compile(r"[-_./:]+")
_INNER_SEPARATOR = re.compile(r"\w[_.:]\w")
# a number with a unit or suffix: 30-day, 24h, 5kg, 2nd, 10am (quantities, not identifiers)
_NUMBER_UNIT = re.compile(r"^\d+(?:[.,]\d+)?-?[^\W\d_]+$")

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


def _words(text: str) -> list[str]:
    """The surface words of `text` (`_COMPOUND`'s matches, with the ASCII pattern when the text
    is ASCII: `str.isascii` is a flag of the string, not a scan)."""
    return (_COMPOUND_ASCII if text.isascii() else _COMPOUND).findall(text)


@lru_cache(maxsize=1 << 18)
def token_index(token: str) -> int:
    """The sparse index of a token: the first 31 bits of its blake2b digest (memoized: words
    follow a Zipf distribution)."""
    digest = hashlib.blake2b(token.encode("utf-8"), digest_size=8).digest()
    return int.from_bytes(digest, "big") & 0x7FFFFFFF


def is_identifier(word: str) -> bool:
    """True for an identifier-like surface word (case preserved), e.g. an error code, ticket or
    part number, SKU, version or configuration key.

    Identifier-like: letters and digits mixed (`E-2113`, `v2`, `GX-PMP-4200`, `INC-2291`) except
    a number with a unit or suffix (`30-day`, `24h`, `2nd`); an inner `_ . :` between word
    characters (`ERR_TIMEOUT`, `auth.saml.allowed_clock_skew_seconds`) unless every part is one
    character (`e.g`) or there is no letter (`0.67`, `12:30`); an upper-case hyphenated code
    (`ACM-TEAM-ANNUAL`). Plain words, acronyms (`SAML`), numbers, units (`mm/s`) and hyphenated
    words (`sign-in`, `Retry-After`) are not.
    """
    has_digit = any(c.isdigit() for c in word)
    has_alpha = any(c.isalpha() for c in word)
    if has_digit and has_alpha:
        return _NUMBER_UNIT.match(word) is None
    if _INNER_SEPARATOR.search(word) and has_alpha:
        return any(len(part) > 1 for part in _SEPARATORS.split(word))
    return "-" in word and has_alpha and word.upper() == word and len(word) >= 5


@dataclass(frozen=True, slots=True)
class Bm25Config:
    """Tokenization and BM25 parameters (k1=1.2, b=0.75; `avgdl` is the engine vectors'
    constant, 256 as in Qdrant: exact scoring uses the index's own average)."""

    k1: float = 1.2
    b: float = 0.75
    avgdl: float = 256.0
    stopwords: frozenset[str] = field(default=ENGLISH_STOPWORDS)
    max_token_len: int = 64
    #: Snowball stemmer language (PyStemmer), or None for no stemming.
    stemmer: str | None = "english"

    def __post_init__(self) -> None:
        if self.k1 < 0:
            raise ValueError(f"k1 must be >= 0, got {self.k1}")
        if not 0.0 <= self.b <= 1.0:
            raise ValueError(f"b must be within [0, 1], got {self.b}")
        if not self.avgdl > 0:
            raise ValueError(f"avgdl must be > 0, got {self.avgdl}")
        if self.max_token_len < 1:
            raise ValueError(f"max_token_len must be >= 1, got {self.max_token_len}")
        if self.stemmer is not None and self.stemmer not in Stemmer.algorithms():
            raise ValueError(f"unknown Snowball stemmer {self.stemmer!r}")


def bm25_weight(tf: float, doc_len: float, config: Bm25Config, avgdl: float | None = None) -> float:
    """BM25's term-frequency saturation (without IDF) for one term of a document, with the
    config's constant `avgdl` unless another average is given."""
    norm = 1.0 - config.b + config.b * doc_len / (avgdl or config.avgdl)
    return tf * (config.k1 + 1.0) / (tf + config.k1 * norm)


class _Stems:
    """Snowball stems with a shared cache; PyStemmer objects are not thread-safe, so each
    thread gets its own."""

    def __init__(self, language: str) -> None:
        self._language = language
        self._local = threading.local()
        self.stem = lru_cache(maxsize=200_000)(self._stem)

    def _stem(self, word: str) -> str:
        stemmer = getattr(self._local, "stemmer", None)
        if stemmer is None:
            stemmer = Stemmer.Stemmer(self._language)
            self._local.stemmer = stemmer
        stem: str = stemmer.stemWord(word)
        return stem


_STEMS: dict[str, _Stems] = {}
_STEMS_LOCK = threading.Lock()


def _stems(language: str) -> _Stems:
    with _STEMS_LOCK:
        found = _STEMS.get(language)
        if found is None:
            found = _STEMS[language] = _Stems(language)
        return found


@dataclass(frozen=True, slots=True)
class Word:
    """One surface word of a text: its tokens (the whole word first) and whether it is an
    identifier (see `is_identifier`)."""

    tokens: tuple[str, ...]
    identifier: bool


_INDEX = re.compile(r",([0-9a-f]++):")

#: A query token as exact BM25 looks it up in term counts: its key in stored counts (`term`)
#: and its sparse index.
Term = tuple[str, int]


def term(index: int) -> Term:
    """The lookup of a token index in any `TermCounts` (make it once per query token)."""
    return f",{index:x}:", index


class TermCounts(Protocol):
    """How often each token index occurs in a text, and the text's BM25 length (its surface
    words that have tokens). Tokens are counted by their sparse index (`token_index`), as the
    engine's vectors and `LexiconStats` count them: two tokens whose 31-bit indices collide
    count as one."""

    @property
    def length(self) -> int:
        """The text's surface words that have tokens."""
        ...

    def count(self, term: Term) -> int:
        """How often the token occurs (0: not at all)."""
        ...

    def __contains__(self, term: Term) -> bool: ...

    def indices(self) -> list[int]:
        """The token indices that occur."""
        ...

    def to_mapping(self) -> dict[int, int]:
        """{token index: count}."""
        ...


class CountedTerms:
    """`TermCounts` counted from a text (`Bm25Encoder.term_counts`)."""

    __slots__ = ("_counts", "length")

    def __init__(self, counts: Mapping[int, int], length: int) -> None:
        """From {token index: count} and the text's length."""
        self._counts = counts
        self.length = length

    def count(self, term: Term) -> int:
        """How often the token occurs (0: not at all)."""
        return self._counts.get(term[1], 0)

    def __contains__(self, term: Term) -> bool:
        return term[1] in self._counts

    def indices(self) -> list[int]:
        """The token indices that occur."""
        return list(self._counts)

    def to_mapping(self) -> dict[int, int]:
        """{token index: count}."""
        return dict(self._counts)


class StoredTerms:
    """`TermCounts` as a chunk's payload stores them (`TERM_COUNTS`):
    `<length>,<index>:<count>,<index>:<count>,...,` with the indices in hexadecimal.

    Exact BM25 asks a handful of query tokens of ~40 candidates a request: each is one
    `str.find` in that text, with nothing decoded first."""

    __slots__ = ("_start", "_text", "length")

    def __init__(self, text: str, start: int = 0) -> None:
        """Read the counts in `text` from `start` on; ValueError when it holds no length or
        does not end with a separator."""
        comma = text.find(",", start)
        if comma < 0 or not text.endswith(","):
            raise ValueError("stored term counts: no '<length>,' or no final ','")
        try:
            self.length = int(text[start:comma])
        except ValueError:
            raise ValueError(f"stored term counts: bad length {text[start:comma]!r}") from None
        self._text = text
        self._start = comma  # every entry, the first too, follows a ','

    @staticmethod
    def text_of(counts: Mapping[int, int], length: int) -> str:
        """The stored text of {token index: count} and a length (indices in sorted order)."""
        return f"{length}," + "".join([f"{i:x}:{counts[i]}," for i in sorted(counts)])

    def count(self, term: Term) -> int:
        """How often the token occurs (0: not at all); ValueError when its entry is
        malformed."""
        key = term[0]
        at = self._text.find(key, self._start)
        if at < 0:
            return 0
        begin = at + len(key)
        return int(self._text[begin : self._text.index(",", begin)])

    def __contains__(self, term: Term) -> bool:
        return self._text.find(term[0], self._start) >= 0

    def indices(self) -> list[int]:
        """The token indices that occur."""
        return [int(i, 16) for i in _INDEX.findall(self._text, self._start)]

    def to_mapping(self) -> dict[int, int]:
        """{token index: count}; ValueError when an entry is malformed."""
        out: dict[int, int] = {}
        for entry in self._text[self._start + 1 : -1].split(","):
            if entry:
                index, _, count = entry.partition(":")
                out[int(index, 16)] = int(count)
        return out


class Bm25Encoder:
    """Tokenizes text and encodes documents and queries as sparse vectors."""

    def __init__(self, config: Bm25Config | None = None) -> None:
        """Use `config` (defaults when None)."""
        self.config = config or Bm25Config()
        self._stem = _stems(self.config.stemmer).stem if self.config.stemmer else None
        self._term_counts = lru_cache(maxsize=4096)(self.count_terms)
        self._word_tokens = lru_cache(maxsize=1 << 17)(self._tokens_of)
        self._word_indices = lru_cache(maxsize=1 << 17)(self._indices_of)
        self._word_tokens_of_surface = lru_cache(maxsize=1 << 17)(self._surface_tokens_of)
        fingerprint = hashlib.blake2b(self.model_version.encode("utf-8"), digest_size=4)
        self._counts_tag = f"{_COUNTS_FORMAT}.{fingerprint.hexdigest()}:"

    @property
    def model_version(self) -> str:
        """Identity of the encoding, recorded in index manifests (a mismatch re-keys terms)."""
        c = self.config
        stop = "en" if c.stopwords == ENGLISH_STOPWORDS else f"custom{len(c.stopwords)}"
        return (
            f"ragstream-bm25@{TOKENIZER_VERSION};k1={c.k1:g};b={c.b:g};avgdl={c.avgdl:g};"
            f"stop={stop};stem={c.stemmer or 'none'};max={c.max_token_len}"
        )

    def _norm(self, token: str) -> str:
        if self._stem is None or not token.isalpha():
            return token
        return self._stem(token)

    def surface(self, text: str, *, identifiers: bool = True) -> list[Word]:
        """Surface words with their tokens: [whole, part, part...], stemmed (a whole identifier
        never is). Stopwords are dropped when they stand alone; parts of an identifier are
        always kept. `identifiers=False` skips the identifier test (`Word.identifier` False)."""
        out: list[Word] = []
        for original in _words(text):
            tokens = self._word_tokens_of_surface(original)
            if tokens:
                out.append(Word(tokens, identifiers and is_identifier(original)))
        return out

    def _tokens_of(self, word: str) -> tuple[str, ...]:
        """The tokens of one lowercased surface word (memoized per encoder in `_word_tokens`):
        () for a stopword standing alone."""
        parts = [p for p in _SEPARATORS.split(word) if p]
        if len(parts) == 1 and word == parts[0]:
            if word in self.config.stopwords:
                return ()
            tokens = [self._norm(word)]
        else:
            tokens = [word, *(self._norm(p) for p in parts)]
        limit = self.config.max_token_len
        return tuple(t for t in tokens if len(t) <= limit)

    def _surface_tokens_of(self, surface_word: str) -> tuple[str, ...]:
        """The tokens of one surface word as it stands in the text (memoized in
        `_word_tokens_of_surface`: one lookup per word, no lowercasing)."""
        return self._word_tokens(surface_word.lower())

    def _indices_of(self, surface_word: str) -> tuple[int, ...]:
        """The sparse indices of one surface word's tokens (memoized in `_word_indices`: the
        document encoder's hot path, one lookup per word instead of a `Word` and a hash per
        token)."""
        return tuple(token_index(t) for t in self._word_tokens_of_surface(surface_word))

    def term_counts(self, text: str) -> TermCounts:
        """How often each token index occurs in `text`, and its length (cached: Retrieve
        counts the texts of chunks stored without their counts, the same ones again and
        again)."""
        return self._term_counts(text)

    def count_terms(self, text: str) -> TermCounts:
        """`term_counts` without the cache (a scan over a whole index)."""
        return CountedTerms(*self._count(text))

    def _count(self, text: str) -> tuple[Counter[int], int]:
        # `surface(text, identifiers=False)` without its `Word` objects: every step runs in C
        # (the regex, the memo of each word's indices through `map`, the Counter); a stopword's
        # indices are ()
        per_word = list(map(self._word_indices, _words(text)))
        return Counter(chain.from_iterable(per_word)), len(per_word) - per_word.count(())

    def words(self, text: str) -> list[list[str]]:
        """Surface words (lowercased, stemmed), each with its derived tokens: [whole, part...]."""
        return [list(w.tokens) for w in self.surface(text)]

    def tokenize(self, text: str) -> list[str]:
        """Every token of `text` in order (identifiers followed by their parts)."""
        return [token for word in self.surface(text) for token in word.tokens]

    def identifiers(self, text: str) -> list[str]:
        """The identifier-like words of `text` as tokens (lowercased, unique, in order)."""
        return list(dict.fromkeys(w.tokens[0] for w in self.surface(text) if w.identifier))

    def encode_document(self, text: str) -> SparseVector:
        """BM25 document weights; the document length is its number of surface words (those
        with tokens: the words of `surface`)."""
        return self._document_vector(*self._count(text))

    def encode_chunk(self, text: str) -> tuple[SparseVector, str]:
        """A chunk's engine vector (`encode_document`) and its term counts as its payload
        stores them (`TERM_COUNTS`: `counts_tag`, then `TermCounts`' text), from one pass
        over the text."""
        counts, length = self._count(text)
        return (
            self._document_vector(counts, length),
            self._counts_tag + StoredTerms.text_of(counts, length),
        )

    def _document_vector(self, counts: Mapping[int, int], length: int) -> SparseVector:
        if not length:
            return SparseVector((), ())
        # bm25_weight with its constants hoisted out of the loop (same arithmetic)
        c = self.config
        k1_plus_1 = c.k1 + 1.0
        k1_norm = c.k1 * (1.0 - c.b + c.b * float(length) / c.avgdl)
        return SparseVector.from_mapping(
            {index: tf * k1_plus_1 / (tf + k1_norm) for index, tf in counts.items()}
        )

    @property
    def counts_tag(self) -> str:
        """The prefix of the term counts this encoder stores (`encode_chunk`): their format
        and a fingerprint of `model_version`, so counts made by another tokenization are never
        read as this one's."""
        return self._counts_tag

    def read_counts(self, value: object) -> TermCounts | None:
        """The term counts of a payload's `TERM_COUNTS` value; None when there is none or it
        was stored by another tokenization or format (count the text then). ValueError when
        the value carries this encoder's tag but is malformed."""
        tag = self._counts_tag
        if not isinstance(value, str) or not value.startswith(tag):
            return None
        return StoredTerms(value, len(tag))

    def encode_query(self, text: str) -> SparseVector:
        """Unique tokens with weight 1 (the engine applies IDF)."""
        return SparseVector.from_mapping({token_index(t): 1.0 for t in self.tokenize(text)})

    def encode_tokens(self, tokens: Iterable[str]) -> SparseVector:
        """A query vector of exactly these tokens (weight 1), e.g. one identifier alone."""
        return SparseVector.from_mapping({token_index(t): 1.0 for t in tokens})


def idf(n_docs: int, doc_freq: int) -> float:
    """BM25's IDF as Qdrant's IDF modifier computes it: ln(1 + (N - n + 0.5) / (n + 0.5))."""
    return math.log(1.0 + (n_docs - doc_freq + 0.5) / (doc_freq + 0.5))


def _pack(array: NDArray[np.uint32]) -> str:
    return base64.b64encode(zlib.compress(array.astype("<u4").tobytes(), 6)).decode("ascii")


def _unpack(text: str) -> NDArray[np.uint32]:
    raw = zlib.decompress(base64.b64decode(text.encode("ascii")))
    return np.frombuffer(raw, dtype="<u4").astype(np.uint32)


@dataclass(frozen=True)
class LexiconStats:
    """One index's lexical statistics: chunks, their average length (surface words) and the
    document frequency of every token (by token index)."""

    n_docs: int
    avgdl: float
    token_ids: NDArray[np.uint32]  # sorted, unique
    doc_freqs: NDArray[np.uint32]  # aligned with token_ids
    encoder_version: str

    def __post_init__(self) -> None:
        if self.n_docs < 0 or not math.isfinite(self.avgdl) or self.avgdl < 0:
            raise ValueError("lexicon stats: n_docs and avgdl must be >= 0")
        if self.token_ids.shape != self.doc_freqs.shape:
            raise ValueError("lexicon stats: token ids and frequencies differ in length")

    @classmethod
    def build(cls, texts: Iterable[str], encoder: Bm25Encoder) -> LexiconStats:
        """Count chunks, surface words and document frequencies over `texts`."""
        freqs: Counter[int] = Counter()
        n_docs = 0
        words = 0
        for text in texts:
            surface = encoder.surface(text, identifiers=False)
            n_docs += 1
            words += len(surface)
            freqs.update({token_index(t) for w in surface for t in w.tokens})
        return cls._of(freqs, n_docs, words, encoder)

    @classmethod
    def of_counts(cls, counts: Iterable[TermCounts], encoder: Bm25Encoder) -> LexiconStats:
        """`build` over the chunks' term counts (stored with them, or counted from their
        texts by `encoder`): the same statistics without tokenizing the stored ones."""
        freqs: Counter[int] = Counter()
        n_docs = 0
        words = 0
        for c in counts:
            n_docs += 1
            words += c.length
            freqs.update(c.indices())
        return cls._of(freqs, n_docs, words, encoder)

    @classmethod
    def _of(
        cls, freqs: Mapping[int, int], n_docs: int, words: int, encoder: Bm25Encoder
    ) -> LexiconStats:
        ids = np.fromiter(sorted(freqs), dtype=np.uint32, count=len(freqs))
        dfs = np.fromiter((freqs[int(i)] for i in ids), dtype=np.uint32, count=len(ids))
        avgdl = words / n_docs if n_docs else 0.0
        return cls(n_docs, avgdl, ids, dfs, encoder.model_version)

    def doc_freq(self, token: str) -> int:
        """Chunks containing `token` (0 when it occurs nowhere)."""
        index = token_index(token)
        at = int(np.searchsorted(self.token_ids, index))
        if at < len(self.token_ids) and int(self.token_ids[at]) == index:
            return int(self.doc_freqs[at])
        return 0

    def idf(self, token: str) -> float:
        """BM25 IDF of `token` in this index (`idf`, with the index's counts)."""
        return idf(self.n_docs, min(self.doc_freq(token), self.n_docs))

    def to_dict(self) -> dict[str, Any]:
        """JSON form (frequency arrays zlib-compressed, base64)."""
        return {
            "n_docs": self.n_docs,
            "avgdl": self.avgdl,
            "encoder_version": self.encoder_version,
            "tokens": len(self.token_ids),
            "token_ids": _pack(self.token_ids),
            "doc_freqs": _pack(self.doc_freqs),
        }

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> LexiconStats:
        """Inverse of `to_dict`; ValueError when the data is inconsistent."""
        ids = _unpack(str(data["token_ids"]))
        dfs = _unpack(str(data["doc_freqs"]))
        if len(ids) != int(data["tokens"]):
            raise ValueError("lexicon stats: token count does not match the arrays")
        return cls(
            int(data["n_docs"]), float(data["avgdl"]), ids, dfs, str(data["encoder_version"])
        )


@dataclass(frozen=True, slots=True)
class LexicalMatch:
    """Exact BM25 of one chunk for one query, and what of the query it contains."""

    score: float  # Okapi BM25 with the index's avgdl and IDF
    normalized: float  # score / the query's summed IDF (1 ~ every term once, average length)
    coverage: float  # IDF-weighted share of the query's tokens found in the chunk
    identifiers: tuple[str, ...]  # the query's identifiers found whole in the chunk


@dataclass(frozen=True, slots=True)
class LexicalQuery:
    """A query as the exact scorer sees it."""

    tokens: tuple[str, ...]  # unique tokens
    idf: tuple[float, ...]  # aligned with tokens
    identifiers: tuple[str, ...]  # identifier-like words (whole tokens)
    unknown_identifiers: tuple[str, ...]  # identifiers that occur in no chunk of the index
    missing_share: float  # IDF-weighted share of tokens that occur in no chunk

    @property
    def idf_sum(self) -> float:
        """Summed IDF of the query's tokens."""
        return sum(self.idf)


class Bm25Scorer:
    """Exact Okapi BM25 of chunk texts with one index's `LexiconStats` (pure)."""

    def __init__(self, encoder: Bm25Encoder, stats: LexiconStats) -> None:
        """Score with `encoder`'s tokenizer and parameters over `stats`."""
        if stats.encoder_version != encoder.model_version:
            raise ValueError(
                f"lexicon stats were counted with {stats.encoder_version!r}, the encoder is "
                f"{encoder.model_version!r}"
            )
        self.encoder = encoder
        self.stats = stats

    def query(self, text: str) -> LexicalQuery:
        """Tokens, IDFs and identifiers of a query."""
        tokens = tuple(dict.fromkeys(self.encoder.tokenize(text)))
        idfs = tuple(self.stats.idf(t) for t in tokens)
        ids = tuple(self.encoder.identifiers(text))
        unknown = tuple(t for t in ids if self.stats.doc_freq(t) == 0)
        total = sum(idfs)
        missing = sum(w for t, w in zip(tokens, idfs, strict=True) if self.stats.doc_freq(t) == 0)
        return LexicalQuery(tokens, idfs, ids, unknown, missing / total if total > 0 else 0.0)

    def match(self, query: LexicalQuery, text: str) -> LexicalMatch:
        """BM25, normalised BM25, coverage and identifier matches of one chunk text."""
        return self.match_all(query, (text,))[0]

    def match_all(self, query: LexicalQuery, texts: Sequence[str]) -> list[LexicalMatch]:
        """`match` of every text, in order (`match_counts` of their term counts)."""
        return self.match_counts(query, [self.encoder.term_counts(t) for t in texts])

    def match_counts(self, query: LexicalQuery, counts: Sequence[TermCounts]) -> list[LexicalMatch]:
        """`match` of every text given its term counts, in order: `bm25_weight` with the
        query's and the index's constants hoisted out of the loops (the same operations in the
        same order, so the same floats; Retrieve scores ~40 candidates a request)."""
        config = self.encoder.config
        avgdl = self.stats.avgdl if self.stats.avgdl > 0 else config.avgdl
        k1, b = config.k1, config.b
        k1_plus_1 = k1 + 1.0
        terms = [(term(token_index(t)), w) for t, w in zip(query.tokens, query.idf, strict=True)]
        identifiers = [(t, term(token_index(t))) for t in query.identifiers]
        total = query.idf_sum
        out: list[LexicalMatch] = []
        for c in counts:
            k1_norm = k1 * (1.0 - b + b * float(c.length) / avgdl)
            score = covered = 0.0
            for looked_up, weight in terms:
                tf = c.count(looked_up)
                if tf:
                    score += weight * (tf * k1_plus_1 / (tf + k1_norm))
                    covered += weight
            found = tuple([t for t, k in identifiers if k in c]) if identifiers else ()
            out.append(
                LexicalMatch(
                    score=score,
                    normalized=score / total if total > 0 else 0.0,
                    coverage=covered / total if total > 0 else 0.0,
                    identifiers=found,
                )
            )
        return out
