"""Exact BM25 reads the term counts stored with a chunk, and counts the text of a chunk written
without them (or by another tokenization) to the same result."""

from __future__ import annotations

import logging

import pytest

from ragcore.fusion import FusedHit
from ragcore.sparse import Bm25Config, Bm25Encoder, Bm25Scorer, LexiconStats
from ragcore.store.base import CHUNK_ID, TERM_COUNTS, StoreFilter
from retrieval_api.candidates import term_counts
from tests.retrieval_api.stack import Stack

TEXTS = [
    "Pump GX-300 bearings fail after 30 days; replace the bearings.",
    "Error E-2113 means the SAML clock skew is too large.",
    "",
    "Release notes 2.3: E-2113 fixed, bearings of GX-310 improved.",
]


def _hit(n: int, payload: dict[str, object]) -> FusedHit:
    return FusedHit(f"p{n}", f"c{n}", 0.0, None, None, None, None, payload)


@pytest.mark.unit
def test_stored_counts_and_counted_texts_score_alike() -> None:
    encoder = Bm25Encoder()
    other = Bm25Encoder(Bm25Config(stemmer=None))
    stored = [
        _hit(n, {"text": t, TERM_COUNTS: encoder.encode_chunk(t)[1]}) for n, t in enumerate(TEXTS)
    ]
    bare = [_hit(n, {"text": t}) for n, t in enumerate(TEXTS)]
    foreign = [
        _hit(n, {"text": t, TERM_COUNTS: other.encode_chunk(t)[1]}) for n, t in enumerate(TEXTS)
    ]
    scorer = Bm25Scorer(encoder, LexiconStats.build(TEXTS, encoder))
    query = scorer.query("GX-300 bearings E-2113")
    results = []
    for hits, from_text in ((stored, 0), (bare, len(TEXTS)), (foreign, len(TEXTS))):
        counts, counted = term_counts(encoder, hits)
        assert counted == from_text
        results.append(scorer.match_counts(query, counts))
    assert results[0] == results[1] == results[2] == scorer.match_all(query, TEXTS)
    assert results[0][0].identifiers == ("gx-300",) and results[0][0].score > 0
    assert results[0][2].score == 0.0  # the empty text


@pytest.mark.unit
def test_unreadable_stored_counts_are_logged_and_the_text_counted(
    caplog: pytest.LogCaptureFixture,
) -> None:
    encoder = Bm25Encoder()
    broken = _hit(0, {"text": TEXTS[0], CHUNK_ID: "c0", TERM_COUNTS: encoder.counts_tag + "AAAA"})
    with caplog.at_level(logging.WARNING, logger="retrieval_api.candidates"):
        counts, counted = term_counts(encoder, [broken])
    assert counted == 1
    assert counts[0].to_mapping() == encoder.term_counts(TEXTS[0]).to_mapping()
    assert "chunk c0: stored term counts unreadable" in caplog.text


@pytest.mark.integration
def test_retrieve_reads_the_stored_counts_and_counts_the_text_of_older_chunks(
    stack: Stack,
) -> None:
    stack.write("sso-1", "acme", "Single sign-on with Okta uses SAML assertions (E-2113).")
    stack.write("pump-1", "acme", "The GX-300 pump needs new bearings every 30 days.")

    def count(source: str) -> float:
        return stack.sample("ragstream_retrieve_term_counts_total", source=source)

    question = "what does E-2113 mean for single sign-on?"
    first = stack.retrieve("acme", question)
    assert first.results and count("stored") > 0 and count("text") == 0
    # chunks written before the counts were stored: the same pack, counted from the texts
    index = stack.app.retriever.registry.lookup("acme", None)
    points = list(stack.store.scroll(index.collection, StoreFilter(tenant_id="acme")))
    assert all(TERM_COUNTS in p.payload for p in points)
    stack.store.update_payload(
        index.collection, [p.point_id for p in points], {}, unset=[TERM_COUNTS]
    )
    stored = count("stored")
    again = stack.retrieve("acme", question)
    assert count("stored") == stored and count("text") > 0
    assert [(r.chunk_id, r.scores) for r in again.results] == [
        (r.chunk_id, r.scores) for r in first.results
    ]
