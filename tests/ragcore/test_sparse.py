"""Tokenization, stable hashing and BM25 weights of the sparse encoder."""

from __future__ import annotations

import hashlib
import math
import re
from collections import Counter

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import ragcore.sparse as sparse_module
from ragcore.sparse import (
    Bm25Config,
    Bm25Encoder,
    Bm25Scorer,
    LexicalMatch,
    LexicalQuery,
    LexiconStats,
    bm25_weight,
    idf,
    is_identifier,
    term,
    token_index,
)
from ragcore.store.base import SparseVector

pytestmark = pytest.mark.unit


def test_identifiers_are_kept_whole_and_split() -> None:
    tokens = Bm25Encoder().tokenize("Error E-1042 in ERR_TIMEOUT since v2.3.1.")
    assert tokens == [
        "error",
        "e-1042", "e", "1042",
        "err_timeout", "err", "timeout",
        "sinc",
        "v2.3.1", "v2", "3", "1",
    ]  # fmt: skip


def test_stopwords_drop_alone_but_not_inside_identifiers() -> None:
    encoder = Bm25Encoder()
    assert encoder.tokenize("the cause of the-end") == ["caus", "the-end", "the", "end"]
    assert Bm25Encoder(Bm25Config(stopwords=frozenset())).tokenize("the end") == ["the", "end"]


def test_unicode_words_are_lowercased_and_kept() -> None:
    assert Bm25Encoder().tokenize("Café DÉJÀ-vu Straße") == [
        "café",
        "déjà-vu",
        "déjà",
        "vu",
        "straße",
    ]


def test_overlong_tokens_are_dropped() -> None:
    encoder = Bm25Encoder(Bm25Config(max_token_len=5))
    assert encoder.tokenize("short toolongword ab-cd") == ["short", "ab-cd", "ab", "cd"]


def test_token_index_is_a_stable_31_bit_blake2b_hash() -> None:
    digest = hashlib.blake2b(b"e-1042", digest_size=8).digest()
    assert token_index("e-1042") == int.from_bytes(digest, "big") & 0x7FFFFFFF
    # Pinned: a change here silently re-keys every index ever built.
    assert token_index("e-1042") == EXPECTED_E1042
    assert all(0 <= token_index(t) < 2**31 for t in ("", "a", "ünïcode", "x" * 1000))


EXPECTED_E1042 = 1929332010


def test_document_weights_follow_bm25_saturation() -> None:
    encoder = Bm25Encoder(Bm25Config(k1=1.2, b=0.75, avgdl=3.0))
    vector = encoder.encode_document("alpha beta alpha")
    weights = dict(zip(vector.indices, vector.values, strict=True))
    # len == avgdl: norm 1; alpha tf 2 -> 2*2.2/(2+1.2) = 1.375; beta tf 1 -> 1.0.
    assert weights[token_index("alpha")] == pytest.approx(1.375)
    assert weights[token_index("beta")] == pytest.approx(1.0)
    longer_avg = Bm25Encoder(Bm25Config(avgdl=6.0)).encode_document("alpha beta alpha")
    weights = dict(zip(longer_avg.indices, longer_avg.values, strict=True))
    # norm = 0.25 + 0.75 * 3/6 = 0.625: alpha 4.4/2.75 = 1.6; beta 2.2/1.75.
    assert weights[token_index("alpha")] == pytest.approx(1.6)
    assert weights[token_index("beta")] == pytest.approx(2.2 / 1.75)


def test_document_length_counts_surface_words() -> None:
    vector = Bm25Encoder(Bm25Config(avgdl=2.0)).encode_document("E-1042 fails")
    assert len(vector) == 4  # e-1042, e, 1042, fails
    assert vector.values == pytest.approx([1.0] * 4)
    assert list(vector.indices) == sorted(vector.indices)


def test_query_is_unique_tokens_with_weight_one() -> None:
    vector = Bm25Encoder().encode_query("Foo foo BAR")
    assert sorted(vector.indices) == sorted({token_index("foo"), token_index("bar")})
    assert vector.values == (1.0, 1.0)


def test_empty_or_stopword_only_text_encodes_to_an_empty_vector() -> None:
    encoder = Bm25Encoder()
    assert len(encoder.encode_document("")) == 0
    assert len(encoder.encode_query("the of and")) == 0


def test_hash_collisions_merge_term_frequencies(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(sparse_module, "token_index", lambda token: 7)
    vector = Bm25Encoder(Bm25Config(avgdl=2.0)).encode_document("one two")
    assert vector.indices == (7,)
    assert vector.values[0] == pytest.approx(2 * 2.2 / (2 + 1.2))


def test_model_version_names_the_encoding() -> None:
    default = Bm25Encoder().model_version
    # version 2: stemming; an index built with version 1 is refused (MANIFEST_MISMATCH)
    assert default == "ragstream-bm25@2;k1=1.2;b=0.75;avgdl=256;stop=en;stem=english;max=64"
    assert Bm25Encoder(Bm25Config(avgdl=100)).model_version != default
    assert Bm25Encoder(Bm25Config(stopwords=frozenset())).model_version != default
    assert Bm25Encoder(Bm25Config(stemmer=None)).model_version.endswith("stem=none;max=64")


def test_words_and_identifier_parts_are_stemmed_but_whole_identifiers_are_not() -> None:
    tokens = Bm25Encoder().tokenize("Bearings greased; RETRY_POLICIES and E-2113 errors")
    assert tokens == [
        "bear", "greas",
        "retry_policies", "retri", "polici",
        "e-2113", "e", "2113",
        "error",
    ]  # fmt: skip
    assert Bm25Encoder(Bm25Config(stemmer=None)).tokenize("bearings") == ["bearings"]


def test_unknown_stemmer_language_is_refused() -> None:
    with pytest.raises(ValueError, match="Snowball"):
        Bm25Config(stemmer="klingon")


@pytest.mark.parametrize(
    ("word", "expected"),
    [
        ("E-2113", True),
        ("v2", True),
        ("GX-PMP-4200", True),
        ("ACM-TEAM-ANNUAL", True),
        ("auth.saml.allowed_clock_skew_seconds", True),
        ("ERR_TIMEOUT", True),
        ("NCR-2024-118", True),
        ("SAML", False),
        ("sign-in", False),
        ("Retry-After", False),
        ("30-day", False),
        ("2nd", False),
        ("2024", False),
        ("0.67", False),
        ("e.g", False),
        ("mm/s", False),
    ],
)
def test_identifier_like_words(word: str, expected: bool) -> None:
    assert is_identifier(word) is expected


def test_identifiers_of_a_query_are_its_identifier_words_lowercased() -> None:
    encoder = Bm25Encoder()
    assert encoder.identifiers("what does error E-2113 mean, and v2?") == ["e-2113", "v2"]
    assert encoder.identifiers("how do refunds work?") == []


def test_lexicon_counts_chunks_average_length_and_document_frequencies() -> None:
    encoder = Bm25Encoder()
    stats = LexiconStats.build(["pump seal leaks", "seal kit GX-42", "refund policy"], encoder)
    assert stats.n_docs == 3
    assert stats.avgdl == pytest.approx(8 / 3)  # 3 + 3 + 2 surface words
    assert stats.doc_freq("seal") == 2
    assert stats.doc_freq("gx-42") == 1
    assert stats.doc_freq("absent") == 0
    assert stats.idf("seal") == pytest.approx(idf(3, 2))
    again = LexiconStats.from_dict(stats.to_dict())
    assert (again.n_docs, again.avgdl, again.doc_freq("seal")) == (3, stats.avgdl, 2)


def test_exact_bm25_uses_the_index_average_length_not_the_constant() -> None:
    encoder = Bm25Encoder()
    texts = ["alpha beta", "alpha gamma delta epsilon zeta eta theta iota"]
    stats = LexiconStats.build(texts, encoder)
    scorer = Bm25Scorer(encoder, stats)
    query = scorer.query("alpha")
    short, long = scorer.match_all(query, texts)
    weight = stats.idf("alpha")
    avgdl = stats.avgdl  # 5 words, not 256
    assert short.score == pytest.approx(weight * bm25_weight(1, 2, encoder.config, avgdl))
    assert long.score == pytest.approx(weight * bm25_weight(1, 8, encoder.config, avgdl))
    assert short.score > long.score
    assert short.coverage == 1.0 and short.normalized == pytest.approx(short.score / weight)


def test_coverage_is_idf_weighted_and_identifiers_are_matched_whole() -> None:
    encoder = Bm25Encoder()
    texts = ["pump pump pump seal", "pump E-2113 seal", "pump"]
    scorer = Bm25Scorer(encoder, LexiconStats.build(texts, encoder))
    query = scorer.query("pump E-2113")
    first, second, _ = scorer.match_all(query, texts)
    assert second.identifiers == ("e-2113",)
    assert first.identifiers == ()
    assert second.coverage == 1.0
    assert 0.0 < first.coverage < 0.2  # "pump" is in every chunk: almost no weight
    missing = scorer.query("pump E-9999")
    assert missing.unknown_identifiers == ("e-9999",)
    assert missing.missing_share > 0.5


def test_scorer_refuses_statistics_of_another_encoder() -> None:
    stats = LexiconStats.build(["a b"], Bm25Encoder(Bm25Config(stemmer=None)))
    with pytest.raises(ValueError, match="counted with"):
        Bm25Scorer(Bm25Encoder(), stats)


@pytest.mark.parametrize("kwargs", [{"k1": -0.1}, {"b": 1.5}, {"avgdl": 0.0}, {"max_token_len": 0}])
def test_invalid_config_is_refused(kwargs: dict[str, float]) -> None:
    with pytest.raises(ValueError):
        Bm25Config(**kwargs)  # type: ignore[arg-type]


def test_bm25_weight_and_idf_formulas() -> None:
    config = Bm25Config(k1=1.5, b=0.0)
    assert bm25_weight(3, 999, config) == pytest.approx(3 * 2.5 / (3 + 1.5))
    assert idf(10, 1) == pytest.approx(math.log(1 + 9.5 / 1.5))


_PIECES = [
    "a", "the", "and", "Pump", "pumps", "İstanbul", "straße", "ǅemal", "café", "E-2113",
    "GX-PMP-4200", "v2.3.1", "x_y", "config.key", "30-day", "24h", "0", "9", " ", " ", "-",
    ".", "/", ":", "_", ",", "\n",
]  # fmt: skip
_WORDY = st.lists(st.sampled_from(_PIECES), max_size=80).map("".join)


@settings(max_examples=300, deadline=None)
@given(text=_WORDY | st.text(max_size=200))
def test_document_encoding_equals_bm25_over_the_surface_words(text: str) -> None:
    """The encoder's fast path (a memo of indices per surface word, constants hoisted) gives the
    vector of the definition: BM25 term weights over `surface`'s tokens, its words the length."""
    encoder = Bm25Encoder()
    words = encoder.surface(text, identifiers=False)
    counts = Counter(token_index(t) for w in words for t in w.tokens)
    length = float(len(words))
    expected = SparseVector.from_mapping(
        {i: bm25_weight(tf, length, encoder.config) for i, tf in counts.items()}
    )
    got = encoder.encode_document(text)
    assert got.indices == expected.indices
    assert got.values == pytest.approx(expected.values, rel=1e-12)


@settings(max_examples=300, deadline=None)
@given(text=_WORDY | st.text(max_size=200))
def test_counts_equal_the_tokens_of_the_surface_words(text: str) -> None:
    """Exact BM25's counts (without `Word` objects) are the definition's: every token of
    `surface`'s words by its index, and their number as the length; stored in a payload and
    read back, they are the same."""
    encoder = Bm25Encoder()
    words = encoder.surface(text, identifiers=False)
    counts = encoder.term_counts(text)
    assert counts.to_mapping() == Counter(token_index(t) for w in words for t in w.tokens)
    assert counts.length == len(words)
    vector, stored = encoder.encode_chunk(text)
    assert vector == encoder.encode_document(text)
    read = encoder.read_counts(stored)
    assert read is not None
    assert read.to_mapping() == counts.to_mapping()
    assert read.length == counts.length


#: The surface-word pattern as first written (backtracking, Unicode `\w` on every text).
_COMPOUND_REFERENCE = re.compile(r"\w+(?:[-./:]\w+)*")


@settings(max_examples=500, deadline=None)
@given(text=_WORDY | st.text(max_size=200) | st.text(alphabet="aZ9_-./: \u00e9\u0130", max_size=60))
def test_surface_words_are_the_reference_pattern_matches(text: str) -> None:
    """The possessive pattern, and its ASCII twin on ASCII text, find the same words."""
    assert sparse_module._words(text) == _COMPOUND_REFERENCE.findall(text)


def _reference_match(
    encoder: Bm25Encoder, stats: LexiconStats, query: LexicalQuery, text: str
) -> LexicalMatch:
    """Exact BM25 by its definition: counts over `surface`'s words, `bm25_weight` per term."""
    words = encoder.surface(text, identifiers=False)
    counts = Counter(t for w in words for t in w.tokens)
    avgdl = stats.avgdl if stats.avgdl > 0 else encoder.config.avgdl
    score = covered = 0.0
    for token, weight in zip(query.tokens, query.idf, strict=True):
        tf = counts.get(token, 0)
        if tf:
            score += weight * bm25_weight(tf, float(len(words)), encoder.config, avgdl)
            covered += weight
    total = sum(query.idf)
    return LexicalMatch(
        score=score,
        normalized=score / total if total > 0 else 0.0,
        coverage=covered / total if total > 0 else 0.0,
        identifiers=tuple(t for t in query.identifiers if t in counts),
    )


@settings(max_examples=300, deadline=None)
@given(
    texts=st.lists(_WORDY | st.text(max_size=120), min_size=1, max_size=6),
    question=_WORDY | st.text(max_size=60),
    corpus=st.lists(_WORDY, max_size=4),
    # k1 = 0 and b = 1 make a term's denominator 0 where it is absent (never computed there)
    config=st.sampled_from([Bm25Config(), Bm25Config(k1=0.0), Bm25Config(b=1.0, avgdl=1.0)]),
)
def test_exact_bm25_is_bit_identical_to_its_definition(
    texts: list[str], question: str, corpus: list[str], config: Bm25Config
) -> None:
    """Retrieve's scorer (constants hoisted, counts from the memo) gives the definition's
    floats exactly, not approximately: ties and the order of candidates depend on them."""
    encoder = Bm25Encoder(config)
    stats = LexiconStats.build([*texts, *corpus], encoder)
    scorer = Bm25Scorer(encoder, stats)
    query = scorer.query(question)
    expected = [_reference_match(encoder, stats, query, t) for t in texts]
    assert scorer.match_all(query, texts) == expected
    assert scorer.match_all(query, texts) == expected  # again, from the count cache
    assert [scorer.match(query, t) for t in texts] == expected
    # the counts a chunk's payload stores give the same floats
    stored = [encoder.read_counts(encoder.encode_chunk(t)[1]) for t in texts]
    assert scorer.match_counts(query, [c for c in stored if c is not None]) == expected


def test_stored_counts_of_another_tokenization_or_format_are_not_read() -> None:
    """Counts stored by another tokenization (another stemmer, stopwords, version) or in another
    format are not this encoder's: Retrieve counts the text instead (None)."""
    text = "Pump GX-300 bearings fail after 30 days"
    english, unstemmed = Bm25Encoder(), Bm25Encoder(Bm25Config(stemmer=None))
    _, stored = unstemmed.encode_chunk(text)
    assert unstemmed.read_counts(stored) is not None
    assert english.read_counts(stored) is None
    assert english.read_counts(None) is None
    assert english.read_counts(42) is None
    tag = english.counts_tag
    _, own = english.encode_chunk(text)
    assert english.read_counts(own) is not None
    assert english.read_counts("t0" + own[2:]) is None
    # this encoder's tag with a broken text is an error, not a silent miss
    with pytest.raises(ValueError, match="no '<length>,'"):
        english.read_counts(tag + "12")
    with pytest.raises(ValueError, match="bad length"):
        english.read_counts(tag + "x,")
    broken = english.read_counts(tag + "3,1f:x,")
    assert broken is not None and broken.length == 3
    with pytest.raises(ValueError):
        broken.count(term(0x1F))


@settings(max_examples=100, deadline=None)
@given(texts=st.lists(_WORDY | st.text(max_size=120), max_size=8))
def test_lexicon_of_term_counts_equals_the_lexicon_of_the_texts(texts: list[str]) -> None:
    """Retrieve's prior counts an index's statistics from its stored term counts: the same
    statistics as from the texts."""
    encoder = Bm25Encoder()
    built = LexiconStats.build(texts, encoder)
    counted = LexiconStats.of_counts((encoder.count_terms(t) for t in texts), encoder)
    assert (counted.n_docs, counted.avgdl, counted.encoder_version) == (
        built.n_docs,
        built.avgdl,
        built.encoder_version,
    )
    assert counted.token_ids.tolist() == built.token_ids.tolist()
    assert counted.doc_freqs.tolist() == built.doc_freqs.tolist()
