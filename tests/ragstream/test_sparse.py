"""Tokenization, stable hashing and BM25 weights of the sparse encoder."""

from __future__ import annotations

import hashlib
import math

import pytest

import ragstream.sparse as sparse_module
from ragstream.sparse import Bm25Config, Bm25Encoder, bm25_weight, idf, token_index

pytestmark = pytest.mark.unit


def test_identifiers_are_kept_whole_and_split() -> None:
    tokens = Bm25Encoder().tokenize("Error E-1042 in ERR_TIMEOUT since v2.3.1.")
    assert tokens == [
        "error",
        "e-1042", "e", "1042",
        "err_timeout", "err", "timeout",
        "since",
        "v2.3.1", "v2", "3", "1",
    ]  # fmt: skip


def test_stopwords_drop_alone_but_not_inside_identifiers() -> None:
    encoder = Bm25Encoder()
    assert encoder.tokenize("the cause of the-end") == ["cause", "the-end", "the", "end"]
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
    assert default.startswith("ragstream-bm25@1;k1=1.2;b=0.75;avgdl=256")
    assert Bm25Encoder(Bm25Config(avgdl=100)).model_version != default
    assert Bm25Encoder(Bm25Config(stopwords=frozenset())).model_version != default


@pytest.mark.parametrize("kwargs", [{"k1": -0.1}, {"b": 1.5}, {"avgdl": 0.0}, {"max_token_len": 0}])
def test_invalid_config_is_refused(kwargs: dict[str, float]) -> None:
    with pytest.raises(ValueError):
        Bm25Config(**kwargs)  # type: ignore[arg-type]


def test_bm25_weight_and_idf_formulas() -> None:
    config = Bm25Config(k1=1.5, b=0.0)
    assert bm25_weight(3, 999, config) == pytest.approx(3 * 2.5 / (3 + 1.5))
    assert idf(10, 1) == pytest.approx(math.log(1 + 9.5 / 1.5))
