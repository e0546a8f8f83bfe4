"""The calibration's order choice reads the paraphrase positives alone
(retrieval_api.calibration._choose_order, ORDER_KINDS; issue 26 item 5,
docs/decisions/fusion-weights-from-held-out-evidence.md)."""

from __future__ import annotations

import pytest

from ragcore.fusion import FusedHit
from ragcore.sparse import Bm25Encoder, LexicalMatch, LexicalQuery, LexiconStats
from retrieval_api import calibration
from retrieval_api.calibration import ORDER_CHOICES, CalibrationSettings, _choose_order, _Example
from retrieval_api.candidates import RawPool
from retrieval_api.evidence_score import RankingChoice, Signals
from retrieval_api.prior import prior_calibration
from retrieval_api.selfsupervised import CalibrationQuery

pytestmark = pytest.mark.unit

BASELINE = RankingChoice("fused", "convex", 0.5, 0.5)


def _example(n: int, kind: str) -> _Example:
    """A positive whose answer (candidate 0) one channel ranks first and the other last; a
    distractor (candidate 1) the other channel ranks first. A paraphrase's answer is the
    dense channel's (few of its words), a topic query's the lexical channel's (its words)."""
    dense_first = kind == "paraphrase"
    # (cosine, bm25) of the answer, the distractor and three weak candidates
    scored = [(0.9, 1.0), (0.5, 10.0)] if dense_first else [(0.5, 10.0), (0.9, 1.0)]
    scored += [(0.1 + 0.1 * i + 0.01 * (n % 7), 2.0 + i) for i in range(3)]
    signals = tuple(Signals(c, LexicalMatch(s, s / 7.5, 0.5, ())) for c, s in scored)
    hits = tuple(
        FusedHit(f"p{n}-{i}", f"c{n}-{i}", 0.0, None, i + 1, None, i + 1, {})
        for i in range(len(scored))
    )
    return _Example(
        CalibrationQuery(f"query {n}", kind, True, chunk_id=f"c{n}-0"),
        RawPool(LexicalQuery((f"w{n}",), (2.0,), (), (), 0.0), hits, signals),
        [1.0, *[0.0] * (len(scored) - 1)],
    )


def test_the_order_follows_the_paraphrases_not_the_positives_made_of_the_chunks_words() -> None:
    # as many topic queries, built from the chunk's words, prefer the lexical channel the other
    # way round: over all positives no order beats the balanced fusion, over the paraphrases a
    # dense-leaning one does
    examples = [_example(n, "paraphrase") for n in range(40)]
    examples += [_example(40 + n, "topic") for n in range(40)]
    settings = CalibrationSettings(choices=(BASELINE, *(c for c in ORDER_CHOICES if c != BASELINE)))
    prior = prior_calibration(LexiconStats.build(["a b c"], Bm25Encoder()))
    chosen, table = _choose_order(examples, prior, settings, protect=False)
    assert chosen != BASELINE
    assert chosen.dense_weight > chosen.sparse_weight
    assert {row["queries"] for row in table if row["order"] != "evidence"} == {40}
    # the chosen order ranks every paraphrase's answer first
    row = next(r for r in table if r["order"] == chosen.label)
    assert row["ndcg@10"] == 1.0


def test_the_evidence_order_must_beat_the_chosen_fusion_on_its_own_held_out_queries(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # an evidence score that orders like the cosine (the dense channel)
    monkeypatch.setattr(
        calibration._PoolRows,
        "evidence",
        lambda self, _calibration: [float(c) for c in self.rows[:, 0]],
    )
    # the held-out paraphrases are where the balanced fusion does worst (two distractors above
    # the answer): the evidence order's gain over it there is larger than the dense-leaning
    # fusion's over all paraphrases, yet no larger than that fusion's on the same queries
    examples = [_example(n, "paraphrase") for n in range(40)]
    for e in examples[:12]:
        e.train = False
        signals = list(e.raw.signals)
        signals[2] = Signals(0.55, LexicalMatch(9.0, 9.0 / 7.5, 0.5, ()))
        e.raw = RawPool(e.raw.query, e.raw.hits, tuple(signals))
    settings = CalibrationSettings(choices=(BASELINE, *(c for c in ORDER_CHOICES if c != BASELINE)))
    prior = prior_calibration(LexiconStats.build(["a b c"], Bm25Encoder()))
    chosen, table = _choose_order(examples, prior, settings, protect=False)
    evidence = next(r for r in table if r["order"] == "evidence")
    dense_leaning = RankingChoice("fused", "convex", 0.7, 0.3)
    fused = next(r for r in table if r["order"] == dense_leaning.label)
    assert evidence["queries"] == 12
    assert evidence["diff_vs_default"] > fused["diff_vs_default"] > 0
    assert evidence["p_value"] < 0.05
    assert chosen == dense_leaning
    assert evidence["diff_vs_chosen_fusion"] <= 0
