"""Self-supervised calibration queries: reproducible, labelled by construction, never leaking."""

from __future__ import annotations

from collections import Counter

import pytest

from ragcore.sparse import Bm25Encoder, LexiconStats, is_identifier
from retrieval_api.selfsupervised import (
    CalibrationQuery,
    IndexedChunk,
    QueryGenerator,
    squash,
)

pytestmark = pytest.mark.unit

TEXTS = {
    "kb-refund": "Annual subscriptions can be refunded on a prorated basis within 30 days of the "
    "start of the term. Monthly plans are billed in advance and are not refundable at all.",
    "kb-errors": "Error E-2113 means the identity provider clock drifted by more than sixty "
    "seconds. Error E-4001 means the card was declined by the bank during payment.",
    "kb-pump": "Grease the bearings of the GX-PMP-4200 every 2,000 operating hours with "
    "lithium grease. Replace the mechanical seal when the pump leaks at the shaft.",
    "kb-travel": "Hotel stays are reimbursed up to 250 dollars per night in major cities. Submit "
    "expense claims within thirty days with an itemised receipt for every item.",
    "kb-oncall": "Engineers on call receive a weekly stipend and time off in lieu after every "
    "night incident that paged them outside working hours.",
}


def chunks() -> list[IndexedChunk]:
    return [
        IndexedChunk(f"entities:{k}:chunk:0", f"entities:{k}", k.replace("-", " ").title(), v)
        for k, v in TEXTS.items()
    ]


def generator(seed: int = 0) -> QueryGenerator:
    encoder = Bm25Encoder()
    lexicon = LexiconStats.build(TEXTS.values(), encoder)
    return QueryGenerator(chunks(), encoder, lexicon, seed=seed)


def test_the_same_chunks_and_seed_give_the_same_queries() -> None:
    assert generator(3).generate(40, 40) == generator(3).generate(40, 40)
    assert generator(3).generate(40, 40) != generator(4).generate(40, 40)


def test_positives_and_negatives_of_every_kind_are_built() -> None:
    queries = generator().generate(60, 60)
    kinds = Counter(q.kind for q in queries)
    assert {"title", "topic", "sentence", "paraphrase", "identifier"} <= set(kinds)
    assert {"background", "absent_focus", "mixture", "unknown_identifier"} <= set(kinds)
    assert all(q.answerable == (q.chunk_id is not None) for q in queries)
    assert len({squash(q.text) for q in queries}) == len(queries)


def test_negatives_never_name_a_word_or_identifier_the_corpus_answers_with() -> None:
    encoder = Bm25Encoder()
    lexicon = LexiconStats.build(TEXTS.values(), encoder)
    for query in generator().generate(60, 60):
        if query.kind == "unknown_identifier":
            ids = [w for w in query.text.replace("?", " ").split() if is_identifier(w)]
            assert ids and all(lexicon.doc_freq(i.lower()) == 0 for i in ids)
        if query.kind == "absent_focus":
            assert lexicon.idf("x") > 0  # the index is not empty
            assert any(
                all(lexicon.doc_freq(t) == 0 for t in encoder.tokenize(w))
                for w in query.text.replace("?", " ").split()
            )


def test_identifier_positives_point_at_a_chunk_holding_the_identifier() -> None:
    by_chunk = {c.chunk_id: c.text.lower() for c in chunks()}
    found = [q for q in generator().generate(60, 0) if q.kind == "identifier"]
    assert found
    for query in found:
        assert isinstance(query, CalibrationQuery) and query.identifier
        assert query.chunk_id is not None and query.identifier in by_chunk[query.chunk_id]


def test_an_index_without_chunks_cannot_be_calibrated() -> None:
    encoder = Bm25Encoder()
    with pytest.raises(ValueError, match="without chunks"):
        QueryGenerator([], encoder, LexiconStats.build([], encoder))


def test_a_paraphrase_replaces_every_word_that_has_a_neighbour() -> None:
    # every content word of this chunk has a neighbour in the shipped table: no source word
    # may survive in a paraphrase (keeping some taught the model that answers share the words)
    text = "annual customer money password vacation weeks. " * 3
    chunk = IndexedChunk("entities:e:chunk:0", "entities:e", "annual customer money", text)
    other = IndexedChunk("entities:f:chunk:0", "entities:f", "Hotel stays", TEXTS["kb-travel"])
    encoder = Bm25Encoder()
    lexicon = LexiconStats.build([text, TEXTS["kb-travel"]], encoder)
    queries = QueryGenerator([chunk, other], encoder, lexicon, seed=1).generate(80, 0)
    found = [q for q in queries if q.kind == "paraphrase" and q.chunk_id == chunk.chunk_id]
    assert found
    source = {"annual", "customer", "money", "password", "vacation", "weeks"}
    for query in found:
        assert not source & set(squash(query.text).split()), query.text


def test_a_word_longer_than_any_token_is_no_topic_word() -> None:
    """A run-together word longer than `max_token_len` has no BM25 token (a DBpedia abstract
    holds one of 77 letters): the topic words skip it instead of failing the calibration."""
    long_word = "riatagallowayorkneypictsrhinnsstrathclydewalesdumnoniaelmetgwyneddpowysrheged"
    encoder = Bm25Encoder()
    assert len(long_word) > encoder.config.max_token_len and encoder.tokenize(long_word) == []
    text = f"Monarchs of {long_word} ruled the kingdoms of the islands before the union."
    chunk = IndexedChunk("entities:m:chunk:0", "entities:m", "Monarchs", text)
    lexicon = LexiconStats.build([text, *TEXTS.values()], encoder)
    found = QueryGenerator([chunk, *chunks()], encoder, lexicon).topic_words(chunk)
    assert long_word not in found
    assert {"monarchs", "kingdoms", "islands"} <= set(found)
