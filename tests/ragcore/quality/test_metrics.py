"""Metrics cross-checked against a hand computation.

The toy run below has six queries; every expected number is derived by hand in the comments
from the definitions in `ragcore.quality.metrics` (linear-gain nDCG, precision divided by k,
ranking means over answerable queries only, abstention = NO_EVIDENCE).
"""

from __future__ import annotations

import math
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from ragcore.quality.dataset import EvalQuery, QueryKind
from ragcore.quality.errors import EvalError
from ragcore.quality.metrics import (
    EvalResult,
    QueryRun,
    Status,
    dedup,
    evaluate,
    evaluate_query,
    hit_at,
    ndcg_at,
    percentile,
    precision_at,
    recall_at,
    reciprocal_rank_at,
)

pytestmark = pytest.mark.unit

LOG2_3 = math.log2(3)  # 1.5849625...


def query(query_id: str, kind: QueryKind, relevant: dict[str, int], **extra: Any) -> EvalQuery:
    return EvalQuery(
        query_id=query_id,
        text=f"text of {query_id}",
        tenant="t",
        kind=kind,
        answerable=bool(relevant),
        relevant=relevant,
        **extra,
    )


QUERIES = [
    # q1: two relevant entities, A (grade 3) and B (grade 1); the answer is chunk 2 of A.
    query(
        "q1",
        QueryKind.PARAPHRASE,
        {"A": 3, "B": 1},
        expected_top_chunk="A:chunk:2",
        hard_negatives=("C",),
    ),
    # q2: one relevant entity E (grade 2).
    query("q2", QueryKind.EXACT_IDENTIFIER, {"E": 2}, hard_negatives=("F",)),
    # q3: three relevant entities; the system will (wrongly) abstain.
    query("q3", QueryKind.PARAPHRASE, {"G": 1, "H": 2, "I": 3}),
    # q4..q6: unanswerable.
    query("q4", QueryKind.UNANSWERABLE, {}),
    query("q5", QueryKind.UNANSWERABLE, {}),
    query("q6", QueryKind.UNANSWERABLE, {}),
]

RUNS = [
    # Entity list has A twice (two chunks of A): de-duplicated to [C, A, B, D].
    QueryRun(
        "q1",
        Status.SUCCESS,
        entity_ids=("C", "A", "A", "B", "D"),
        chunk_ids=("C:chunk:0", "A:chunk:1", "A:chunk:2", "B:chunk:0", "D:chunk:0"),
        latency_ms=10.0,
    ),
    QueryRun(
        "q2", Status.SUCCESS, entity_ids=("E", "F"), chunk_ids=("E:chunk:0",), latency_ms=20.0
    ),
    # An answerable query that abstained: whatever it lists is ignored, it scores 0 everywhere.
    QueryRun("q3", Status.NO_EVIDENCE, entity_ids=("G",), latency_ms=30.0),
    QueryRun("q4", Status.NO_EVIDENCE, latency_ms=40.0),  # correct abstention
    QueryRun("q5", Status.SUCCESS, entity_ids=("C",), latency_ms=50.0),  # answered the unanswerable
    QueryRun("q6", Status.FAILED, error_code="STORE_UNAVAILABLE"),  # failed: not an abstention
]

KS = (1, 3, 5)


@pytest.fixture(scope="module")
def result() -> EvalResult:
    return evaluate(QUERIES, RUNS, KS)


def test_q1_by_hand(result: EvalResult) -> None:
    m = result.row("q1").metrics
    # ranked = [C, A, B, D]; relevant = {A: 3, B: 1}
    assert m["recall@1"] == 0.0  # C is not relevant: 0/2
    assert m["recall@3"] == 1.0  # A and B in the top 3: 2/2
    assert m["precision@1"] == 0.0
    assert m["precision@3"] == pytest.approx(2 / 3)
    assert m["precision@5"] == pytest.approx(2 / 5)  # divided by k = 5, not by 4 returned
    assert m["hit@1"] == 0.0
    assert m["hit@3"] == 1.0
    assert m["mrr@1"] == 0.0
    assert m["mrr@3"] == 0.5  # first relevant (A) at rank 2
    # DCG@3 = 0/log2(2) + 3/log2(3) + 1/log2(4) = 1.89279 + 0.5 = 2.39279
    # IDCG@3 = 3/log2(2) + 1/log2(3) = 3 + 0.63093 = 3.63093  ->  nDCG@3 = 0.65900
    assert m["ndcg@3"] == pytest.approx((3 / LOG2_3 + 1 / 2) / (3 + 1 / LOG2_3))
    assert m["ndcg@3"] == pytest.approx(0.65900, abs=1e-5)
    assert m["ndcg@1"] == 0.0
    # nDCG@5 adds D (gain 0): same as @3; the ideal list has only two gains.
    assert m["ndcg@5"] == pytest.approx(m["ndcg@3"])
    # chunks: [C:0, A:1, A:2, B:0, D:0]; expected A:chunk:2 at rank 3.
    assert m["chunk_mrr@1"] == 0.0
    assert m["chunk_mrr@3"] == pytest.approx(1 / 3)
    row = result.row("q1")
    assert row.first_relevant_rank == 2
    assert row.expected_chunk_rank == 3
    assert row.returned == 4
    assert row.hard_negative_above_relevant is True  # C (rank 1) above A (rank 2)


def test_q2_and_q3_by_hand(result: EvalResult) -> None:
    m2 = result.row("q2").metrics
    # ranked = [E, F]; relevant = {E: 2}: perfect at every k, precision = 1/k.
    assert (m2["recall@1"], m2["mrr@5"], m2["ndcg@5"], m2["hit@1"]) == (1.0, 1.0, 1.0, 1.0)
    assert m2["precision@3"] == pytest.approx(1 / 3)
    assert "chunk_mrr@3" not in m2  # no expected chunk
    assert result.row("q2").hard_negative_above_relevant is False  # F below E
    m3 = result.row("q3").metrics
    assert all(value == 0.0 for value in m3.values())  # abstained: empty ranking
    assert result.row("q3").abstained is True
    assert result.row("q3").returned == 0
    assert result.row("q4").metrics == {}  # unanswerable: no ranking metrics


def test_aggregates_by_hand(result: EvalResult) -> None:
    a = result.aggregates
    assert (a["n_queries"], a["n_answerable"], a["n_unanswerable"]) == (6, 3, 3)
    # Ranking metrics: mean over the answerable q1, q2, q3 only.
    assert a["recall@1"] == pytest.approx((0 + 1 + 0) / 3)
    assert a["recall@3"] == pytest.approx((1 + 1 + 0) / 3)
    assert a["precision@3"] == pytest.approx((2 / 3 + 1 / 3 + 0) / 3)
    assert a["precision@5"] == pytest.approx((0.4 + 0.2 + 0) / 3)
    assert a["hit@1"] == pytest.approx(1 / 3)
    assert a["mrr@3"] == pytest.approx((0.5 + 1 + 0) / 3)
    assert a["ndcg@3"] == pytest.approx((0.65900 + 1 + 0) / 3, abs=1e-5)
    # Chunk MRR: only q1 has an expected chunk.
    assert a["n_expected_chunk"] == 1
    assert a["chunk_mrr@3"] == pytest.approx(1 / 3)
    # Abstentions: q3 (answerable, wrong) and q4 (unanswerable, right).
    assert a["abstention_precision"] == pytest.approx(1 / 2)  # 1 right of 2 abstentions
    assert a["abstention_recall"] == pytest.approx(1 / 3)  # q4 of q4, q5, q6
    assert a["abstention_rate"] == pytest.approx(2 / 6)
    assert a["false_abstention_rate"] == pytest.approx(1 / 3)  # q3 of 3 answerable
    assert a["failed_rate"] == pytest.approx(1 / 6)  # q6
    assert a["hard_negative_rate"] == pytest.approx(1 / 2)  # q1 yes, q2 no
    # Latencies [10, 20, 30, 40, 50] (q6 has none). Linear interpolation:
    # p50 at position 4 * 0.50 = 2.0 -> 30; p95 at 3.8 -> 40 + 0.8 * 10 = 48; p99 at 3.96 -> 49.6.
    assert a["latency_p50_ms"] == pytest.approx(30.0)
    assert a["latency_p95_ms"] == pytest.approx(48.0)
    assert a["latency_p99_ms"] == pytest.approx(49.6)
    assert a["latency_mean_ms"] == pytest.approx(30.0)
    assert a["latency_max_ms"] == 50.0


def test_by_kind_aggregates(result: EvalResult) -> None:
    paraphrase = result.by_kind["paraphrase"]  # q1 and q3
    assert paraphrase["recall@3"] == pytest.approx((1 + 0) / 2)
    unanswerable = result.by_kind["unanswerable"]
    assert unanswerable["recall@3"] is None  # no answerable query of that kind
    assert unanswerable["abstention_recall"] == pytest.approx(1 / 3)
    assert unanswerable["abstention_precision"] == 1.0  # its only abstention (q4) is right


def test_metric_values_and_json(result: EvalResult) -> None:
    assert result.metric_values("mrr@3") == {"q1": 0.5, "q2": 1.0, "q3": 0.0}
    data = result.to_dict()
    assert data["rows"][0]["status"] == "SUCCESS"
    assert data["aggregates"]["recall@3"] == pytest.approx(2 / 3)


def test_numpy_percentile_agrees() -> None:
    import numpy as np

    values = [3.0, 1.0, 7.5, 2.25, 10.0, 4.0]
    for q in (0, 5, 50, 90, 95, 99, 100):
        assert percentile(values, q) == pytest.approx(float(np.percentile(values, q)))


def test_undefined_ratios_are_none() -> None:
    result = evaluate(
        [query("q", QueryKind.KEYWORD, {"A": 1})], [QueryRun("q", Status.SUCCESS, ("A",))]
    )
    assert result.aggregates["abstention_precision"] is None  # no abstention at all
    assert result.aggregates["abstention_recall"] is None  # no unanswerable query
    assert result.aggregates["latency_p95_ms"] is None
    assert result.aggregates["chunk_mrr@10"] is None


def test_status_parse_and_runs_from_chunk_ids() -> None:
    assert Status.parse("RETRIEVAL_STATUS_NO_EVIDENCE") is Status.NO_EVIDENCE
    assert Status.parse("success") is Status.SUCCESS
    with pytest.raises(ValueError, match="unknown retrieval status"):
        Status.parse("MAYBE")
    run = QueryRun.from_chunk_ids(
        "q", "RETRIEVAL_STATUS_SUCCESS", ["doc:1:chunk:0", "doc:2:chunk:3"], latency_ms=3.0
    )
    assert run.entity_ids == ("doc:1", "doc:2")
    assert run.status is Status.SUCCESS


def test_runs_must_match_queries() -> None:
    queries = [query("q1", QueryKind.KEYWORD, {"A": 1}), query("q2", QueryKind.KEYWORD, {"A": 1})]
    with pytest.raises(EvalError, match=r"missing \['q2'\], unknown \['zz'\]"):
        evaluate(queries, [QueryRun("q1", Status.SUCCESS), QueryRun("zz", Status.SUCCESS)])
    with pytest.raises(EvalError, match="two runs"):
        evaluate(queries[:1], [QueryRun("q1", Status.SUCCESS), QueryRun("q1", Status.SUCCESS)])
    with pytest.raises(EvalError, match="under key"):
        evaluate(queries[:1], {"q2": QueryRun("q1", Status.SUCCESS)})


def test_single_metric_functions() -> None:
    relevant = {"a": 1, "b": 2}
    ranked = dedup(["x", "b", "x", "a"])
    assert ranked == ["x", "b", "a"]
    assert recall_at(ranked, relevant, 2) == 0.5
    assert precision_at(ranked, relevant, 2) == 0.5
    assert hit_at(ranked, relevant, 1) == 0.0
    assert reciprocal_rank_at(ranked, relevant, 10) == 0.5
    # DCG@3 = 0 + 2/log2(3) + 1/2; IDCG@3 = 2 + 1/log2(3)
    assert ndcg_at(ranked, relevant, 3) == pytest.approx((2 / LOG2_3 + 0.5) / (2 + 1 / LOG2_3))
    with pytest.raises(ValueError, match="k must be"):
        recall_at(ranked, relevant, 0)
    with pytest.raises(ValueError, match="undefined"):
        ndcg_at(ranked, {}, 3)


@given(
    grades=st.dictionaries(st.sampled_from("abcdefgh"), st.integers(1, 3), min_size=1),
    ranked=st.lists(st.sampled_from("abcdefghij"), unique=True, max_size=10),
)
def test_metric_bounds_and_monotonicity(grades: dict[str, int], ranked: list[str]) -> None:
    previous_recall = 0.0
    for k in range(1, 11):
        r = recall_at(ranked, grades, k)
        n = ndcg_at(ranked, grades, k)
        assert 0.0 <= r <= 1.0 and 0.0 <= n <= 1.0 + 1e-12
        assert r >= previous_recall  # recall never drops as k grows
        previous_recall = r
    ideal = sorted(grades, key=lambda d: -grades[d])
    assert ndcg_at(ideal, grades, 10) == pytest.approx(1.0)


def test_expected_calibration_error_by_hand() -> None:
    from ragcore.quality.metrics import expected_calibration_error, reliability_bins

    scores = [0.05, 0.15, 0.95, 0.95]
    labels = [0, 1, 1, 1]
    # bins: [0, .1): 0.05 vs 0 -> 0.05; [.1, .2): 0.15 vs 1 -> 0.85; [.9, 1]: 0.95 vs 1 -> 0.05
    expected = 0.25 * 0.05 + 0.25 * 0.85 + 0.5 * 0.05
    assert expected_calibration_error(scores, labels) == pytest.approx(expected)
    bins = reliability_bins(scores, labels)
    assert [b.count for b in bins] == [1, 1, 0, 0, 0, 0, 0, 0, 0, 2]
    assert bins[9].mean_score == pytest.approx(0.95) and bins[9].observed == 1.0
    assert bins[3].mean_score is None and bins[3].observed is None
    assert expected_calibration_error([], []) is None
    with pytest.raises(ValueError, match="within"):
        reliability_bins([1.5], [1])


def test_calibration_items_are_the_scored_entities_labelled_by_their_grade() -> None:
    from ragcore.quality.metrics import ANSWER_GRADE

    query = EvalQuery(
        query_id="q",
        text="t",
        tenant="acme",
        kind=QueryKind.MULTI_RELEVANT,
        answerable=True,
        relevant={"a": 3, "b": 1},
    )
    run = QueryRun(
        "q", Status.SUCCESS, entity_ids=("a",), scored=(("a", 0.9), ("b", 0.4), ("a", 0.2))
    )
    row = evaluate_query(query, run)
    assert ANSWER_GRADE == 2
    # first score of each entity; b is only related (grade 1): not an answer
    assert row.calibration == ((0.9, 1), (0.4, 0))
    result = evaluate([query], [run])
    assert result.aggregates["n_scored"] == 2.0
    assert result.aggregates["ece_top1"] == pytest.approx(0.1)


def test_binary_judgments_count_their_relevant_entities_as_answers() -> None:
    query = EvalQuery(
        query_id="q",
        text="t",
        tenant="beir",
        kind=QueryKind.BENCHMARK,
        answerable=True,
        relevant={"doc": 1},
    )
    row = evaluate_query(query, QueryRun("q", Status.SUCCESS, ("doc",), scored=(("doc", 0.7),)))
    assert row.calibration == ((0.7, 1),)


def test_near_duplicate_share_counts_top5_slots_repeating_a_better_text() -> None:
    ticket = "Seal leaking on GX-300 (#{n}): the mechanical seal leaks after {n} hours."
    queries = [
        query("d1", QueryKind.EXACT_IDENTIFIER, {"A": 3}),
        query("d2", QueryKind.KEYWORD, {"B": 3}),
    ]
    runs = [
        # 6 results, of which slots 2, 4 and 6 repeat slot 1's ticket: 2 of the top 5
        QueryRun(
            "d1",
            Status.SUCCESS,
            entity_ids=("A", "T1", "X", "T2", "Y", "T3"),
            texts=(
                ticket.format(n=1),
                ticket.format(n=2),
                "The GX-300 datasheet lists a seal check every 1000 hours.",
                ticket.format(n=3),
                "Bulletin SB-712 covers vibration at partial load.",
                ticket.format(n=4),
            ),
        ),
        QueryRun("d2", Status.SUCCESS, entity_ids=("B",), texts=("One distinct answer.",)),
    ]
    result = evaluate(queries, runs, KS)
    assert result.row("d1").duplicate_slots == (2, 5)
    assert result.row("d2").duplicate_slots == (0, 1)
    assert result.aggregates["near_duplicate_share@5"] == pytest.approx(2 / 6)
    assert result.row("d1").to_dict()["near_duplicate_slots@5"] == 2
    # runs without texts leave the share undefined, never a made-up 0
    bare = evaluate(queries, [QueryRun("d1", Status.SUCCESS), QueryRun("d2", Status.SUCCESS)], KS)
    assert bare.aggregates["near_duplicate_share@5"] is None


def test_context_p95_is_over_the_queries_that_sent_a_budget() -> None:
    queries = [query(f"c{i}", QueryKind.KEYWORD, {"A": 3}) for i in range(3)]
    runs = [
        QueryRun("c0", Status.SUCCESS, context_ms=1.0),
        QueryRun("c1", Status.SUCCESS, context_ms=3.0),
        QueryRun("c2", Status.SUCCESS),
    ]
    result = evaluate(queries, runs, KS)
    assert result.aggregates["context_p95_ms"] == pytest.approx(1.0 + 0.95 * 2.0)
    without = evaluate(queries[:1], [QueryRun("c0", Status.SUCCESS)], KS)
    assert without.aggregates["context_p95_ms"] is None


def test_abstention_separation_and_recall_ceiling_by_hand() -> None:
    # best evidence: answerable a1 0.9, a2 0.5, a3 0.2; unanswerable u1 0.6, u2 0.3, u3 0.1;
    # u4 failed (left out of both)
    best = {"a1": 0.9, "a2": 0.5, "a3": 0.2, "u1": 0.6, "u2": 0.3, "u3": 0.1}
    queries = [
        query(
            q,
            QueryKind.PARAPHRASE if q[0] == "a" else QueryKind.UNANSWERABLE,
            {"E": 3} if q[0] == "a" else {},
        )
        for q in (*best, "u4")
    ]
    runs = [
        QueryRun(q, Status.SUCCESS, entity_ids=("E",), scored=(("E", v),)) for q, v in best.items()
    ] + [QueryRun("u4", Status.FAILED, error_code="STORE_UNAVAILABLE")]
    a = evaluate(queries, runs).aggregates
    # pairs (answerable > unanswerable): a1 beats 3, a2 beats u2 and u3, a3 beats u3: 6 of 9
    assert a["abstention_auc"] == pytest.approx(6 / 9)
    # thresholds: < 0.2 abstains u3 only (P 1, R 1/4 of the four unanswerable, u4 included);
    # < 0.5 abstains u3, a3, u2 (P 2/3 < 0.85); so the ceiling is 1/4
    assert a["abstention_recall_ceiling"] == pytest.approx(1 / 4)


def test_abstention_separation_is_undefined_without_both_kinds() -> None:
    a = evaluate(QUERIES[:3], RUNS[:3]).aggregates
    assert a["abstention_auc"] is None and a["abstention_recall_ceiling"] is None


def test_page_metrics_count_a_passage_once_whatever_its_chunks() -> None:
    """Page-level hit/MRR on a fixed example: the manual's p. 3 answers; p. 2 holds two chunks
    ranked above it (one passage, counted once), so p. 3 is the second passage."""
    queries = [
        query("p1", QueryKind.PARAPHRASE, {"man": 3}, expected_passage="man#p. 3"),
        query("p2", QueryKind.KEYWORD, {"sheet": 3}, expected_passage="sheet#Parts > rows 42-81"),
        query("p3", QueryKind.KEYWORD, {"man": 3}, expected_passage="man#p. 4"),
        query("p4", QueryKind.KEYWORD, {"man": 3}),  # no passage judged: not in page metrics
    ]
    runs = [
        QueryRun(
            "p1",
            Status.SUCCESS,
            entity_ids=("man", "man", "man"),
            passages=("man#p. 2", "man#p. 2", "man#p. 3"),
        ),
        QueryRun(
            "p2",
            Status.IDENTIFIER_MATCH,
            entity_ids=("sheet",),
            passages=("sheet#Parts > rows 42-81",),
        ),
        # right entity, wrong page: entity hit@1 = 1, page hit = 0
        QueryRun("p3", Status.SUCCESS, entity_ids=("man",), passages=("man#p. 1",)),
        QueryRun("p4", Status.NO_EVIDENCE),
    ]
    result = evaluate(queries, runs, (1, 3))
    p1 = result.row("p1")
    assert (p1.metrics["page_hit@1"], p1.metrics["page_hit@3"]) == (0.0, 1.0)
    assert p1.metrics["page_mrr@3"] == 0.5
    assert p1.expected_passage_rank == 2
    assert result.row("p2").metrics["page_mrr@1"] == 1.0
    assert result.row("p3").metrics["hit@1"] == 1.0
    assert result.row("p3").metrics["page_mrr@3"] == 0.0
    assert "page_hit@1" not in result.row("p4").metrics
    a = result.aggregates
    assert a["n_expected_passage"] == 3
    assert a["page_hit@1"] == pytest.approx(1 / 3)  # p2 only
    assert a["page_hit@3"] == pytest.approx(2 / 3)  # p1 and p2
    assert a["page_mrr@3"] == pytest.approx((0.5 + 1 + 0) / 3)
    # SUCCESS over the answerable: p1 and p3 (p2 is IDENTIFIER_MATCH, p4 abstained)
    assert a["success_rate"] == pytest.approx(2 / 4)
    assert result.to_dict()["rows"][0]["expected_passage_rank"] == 2


def test_page_metrics_are_none_without_expected_passages(result: EvalResult) -> None:
    assert result.aggregates["page_hit@1"] is None
    assert result.aggregates["n_expected_passage"] == 0
    assert result.aggregates["success_rate"] == pytest.approx(2 / 3)  # q1, q2 of q1..q3


def test_spreadsheet_rows_inside_the_expected_block_are_that_block() -> None:
    """A spreadsheet chunk cites its own rows; two chunks of the block are one passage, a
    chunk of another block or sheet is not it."""
    q = query("s", QueryKind.KEYWORD, {"sh": 3}, expected_passage="sh#Parts > rows 42-81")
    run = QueryRun(
        "s",
        Status.SUCCESS,
        entity_ids=("sh",) * 4,
        passages=(
            "sh#Parts > rows 2-9",  # another block
            "sh#Labour > rows 50-57",  # another sheet
            "sh#Parts > rows 50-57",  # inside: the expected block, rank 3
            "sh#Parts > row 81",  # inside too: the same passage again
        ),
    )
    row = evaluate([q], [run], (1, 3)).row("s")
    assert row.expected_passage_rank == 3
    assert row.metrics["page_mrr@3"] == pytest.approx(1 / 3)
    assert row.top_passages == ("sh#Parts > rows 2-9", "sh#Labour > rows 50-57", q.expected_passage)
