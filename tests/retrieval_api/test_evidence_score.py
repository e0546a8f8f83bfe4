"""The evidence score: features, the two logistic models, the stored calibration."""

from __future__ import annotations

import dataclasses
import json
import math
from datetime import UTC, datetime

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from ragcore.fusion import FusedHit
from ragcore.sparse import Bm25Encoder, LexicalMatch, LexicalQuery, LexiconStats
from retrieval_api.candidates import RawPool, pool_evidence
from retrieval_api.evidence_score import (
    CHUNK_FEATURES,
    QUERY_FEATURES,
    CalibrationError,
    EvidenceCalibration,
    EvidenceThresholds,
    LogisticModel,
    RankingChoice,
    Signals,
    feature_matrix,
    fit_logistic,
    pool_ranks,
)
from retrieval_api.prior import prior_calibration

pytestmark = pytest.mark.unit

QUERY = LexicalQuery(
    tokens=("error", "e-2113", "e", "2113"),
    idf=(1.0, 3.0, 0.5, 3.0),
    identifiers=("e-2113",),
    unknown_identifiers=(),
    missing_share=0.0,
)


def signal(cosine: float, score: float, coverage: float, ids: tuple[str, ...] = ()) -> Signals:
    return Signals(cosine, LexicalMatch(score, score / 7.5, coverage, ids))


def test_features_are_absolute_relative_and_query_level() -> None:
    signals = [signal(0.2, 15.0, 1.0, ("e-2113",)), signal(0.6, 1.0, 0.13)]
    x = feature_matrix(QUERY, signals, (*CHUNK_FEATURES, *QUERY_FEATURES))
    row = dict(zip((*CHUNK_FEATURES, *QUERY_FEATURES), x[0], strict=True))
    assert row["cosine"] == 0.2 and row["cosine_gap"] == pytest.approx(-0.4)
    assert row["dense_log_rank"] == pytest.approx(math.log(2))
    assert row["lexical_log_rank"] == 0.0 and row["bm25_gap"] == 0.0
    assert row["bm25_norm"] == pytest.approx(2.0) and row["coverage"] == 1.0
    assert row["id_match"] == 1.0 and row["agree_top3"] == 1.0
    # query-level features are the same on every row
    assert row["max_cosine"] == 0.6 and row["id_found"] == 1.0 and row["id_query"] == 1.0
    assert x[1][list((*CHUNK_FEATURES, *QUERY_FEATURES)).index("max_cosine")] == 0.6
    assert pool_ranks(signals).dense == (2, 1) and pool_ranks(signals).lexical == (1, 2)


def _reference_feature_matrix(
    query: LexicalQuery, signals: list[Signals], names: tuple[str, ...]
) -> np.ndarray:
    """The features as first written: a dict of every feature per row."""
    if not signals:
        return np.zeros((0, len(names)), dtype=np.float64)
    ranks = pool_ranks(signals)
    best_cos = max(s.cosine for s in signals)
    norms = [min(s.lexical.normalized, 3.0) for s in signals]
    best_norm = max(norms)
    n_ids = len(query.identifiers)
    found = {t for s in signals for t in s.lexical.identifiers}
    shared = {
        "max_cosine": best_cos,
        "max_coverage": max(s.lexical.coverage for s in signals),
        "max_bm25_norm": best_norm,
        "id_query": 1.0 if n_ids else 0.0,
        "id_found": len(found) / n_ids if n_ids else 0.0,
        "id_unknown": len(query.unknown_identifiers) / n_ids if n_ids else 0.0,
        "query_missing": query.missing_share,
        "query_log_len": math.log1p(len(query.tokens)),
    }
    rows = []
    for i, s in enumerate(signals):
        values = {
            **shared,
            "cosine": s.cosine,
            "cosine_gap": s.cosine - best_cos,
            "dense_log_rank": math.log(ranks.dense[i]),
            "bm25_norm": norms[i],
            "bm25_gap": norms[i] - best_norm,
            "lexical_log_rank": math.log(ranks.lexical[i]),
            "coverage": s.lexical.coverage,
            "id_match": len(s.lexical.identifiers) / n_ids if n_ids else 0.0,
            "agree_top3": 1.0 if ranks.dense[i] <= 3 and ranks.lexical[i] <= 3 else 0.0,
            "rerank": s.rerank,
        }
        rows.append([values[name] for name in names])
    return np.asarray(rows, dtype=np.float64)


_UNIT = st.floats(min_value=-1.0, max_value=1.0, allow_nan=False)
_IDS = st.lists(st.sampled_from(["e-2113", "gx-300", "kb-7"]), max_size=3, unique=True)


@settings(max_examples=200, deadline=None)
@given(
    st.lists(
        st.tuples(
            _UNIT,
            st.floats(min_value=0.0, max_value=40.0),
            st.floats(min_value=0.0, max_value=6.0),
            st.floats(min_value=0.0, max_value=1.0),
            _IDS,
            st.floats(min_value=0.0, max_value=1.0),
        ),
        max_size=12,
    ),
    _IDS,
    st.permutations([*CHUNK_FEATURES, *QUERY_FEATURES, "rerank"]),
)
def test_features_equal_the_row_by_row_definition(
    rows: list[tuple[float, float, float, float, list[str], float]],
    identifiers: list[str],
    names: list[str],
) -> None:
    query = LexicalQuery(
        tokens=("error", "e-2113", "pump"),
        idf=(1.0, 3.0, 2.0),
        identifiers=tuple(identifiers),
        unknown_identifiers=tuple(identifiers[:1]),
        missing_share=0.25,
    )
    signals = [
        Signals(cos, LexicalMatch(score, norm, cov, tuple(ids)), rerank)
        for cos, score, norm, cov, ids, rerank in rows
    ]
    chosen = tuple(names[: 1 + len(rows) % len(names)])
    got = feature_matrix(query, signals, chosen)
    assert got.shape == (len(signals), len(chosen))
    assert np.array_equal(got, _reference_feature_matrix(query, signals, chosen))


def _reference_ranks(values: list[float]) -> tuple[int, ...]:
    """1-based ranks by the definition: descending value, ties in input order."""
    order = sorted(range(len(values)), key=lambda i: (-values[i], i))
    return tuple(order.index(i) + 1 for i in range(len(values)))


# few distinct values, so ties are common; signed zeros, infinities and NaN among them
_RANKED = st.sampled_from([0.0, -0.0, 0.25, 0.5, -0.5, 1e-300, math.inf, -math.inf, math.nan])


@settings(max_examples=300, deadline=None)
@given(st.lists(_RANKED | st.floats(), max_size=16), st.lists(_RANKED, max_size=16))
def test_pool_ranks_are_the_definitions(cosines: list[float], scores: list[float]) -> None:
    """`pool_ranks` (a stable reverse sort, without key tuples) ranks as the definition does."""
    scores = (scores + cosines)[: len(cosines)]
    signals = [
        Signals(c, LexicalMatch(s, 0.0, 0.0, ())) for c, s in zip(cosines, scores, strict=True)
    ]
    ranks = pool_ranks(signals)
    assert ranks.dense == _reference_ranks(cosines)
    assert ranks.lexical == _reference_ranks(scores)


def test_a_rerank_feature_needs_a_rerank_score() -> None:
    with pytest.raises(CalibrationError, match="reranker"):
        feature_matrix(QUERY, [signal(0.5, 1.0, 1.0)], ("cosine", "rerank"))


def test_logistic_fit_is_deterministic_and_separates_classes() -> None:
    rng = np.random.default_rng(7)
    x = np.vstack([rng.normal(0.2, 0.1, (200, 2)), rng.normal(0.7, 0.1, (200, 2))])
    y = np.array([0.0] * 200 + [1.0] * 200)
    first = fit_logistic(x, y, ("cosine", "coverage"))
    again = fit_logistic(x, y, ("cosine", "coverage"))
    assert first == again
    p = first.predict(np.array([[0.2, 0.2], [0.7, 0.7]]))
    assert p[0] < 0.1 and p[1] > 0.9
    assert all(c > 0 for c in first.coef)
    assert LogisticModel.from_dict(first.to_dict()) == first


def test_fit_refuses_a_single_class_or_unknown_features() -> None:
    with pytest.raises(ValueError, match="both classes"):
        fit_logistic(np.zeros((3, 1)), np.zeros(3), ("cosine",))
    with pytest.raises(CalibrationError, match="unknown features"):
        LogisticModel(("shoe_size",), (0.0,), (1.0,), (1.0,), 0.0)


def test_evidence_is_answerability_times_the_chunk_probability() -> None:
    calibration = prior_calibration(LexiconStats.build(["a"], Bm25Encoder()))
    signals = [signal(0.7, 20.0, 1.0, ("e-2113",)), signal(0.1, 0.0, 0.0)]
    answerable = calibration.answerable(QUERY, signals)
    evidence = calibration.evidence(QUERY, signals)
    chunk = calibration.model.predict(feature_matrix(QUERY, signals, calibration.model.features))
    assert evidence == pytest.approx([answerable * float(c) for c in chunk])
    assert evidence[0] > evidence[1]
    assert all(0.0 <= e <= 1.0 for e in evidence)
    assert calibration.evidence(QUERY, []) == [] and calibration.answerable(QUERY, []) == 0.0


def test_calibration_round_trips_as_json_with_a_stable_fingerprint() -> None:
    prior = prior_calibration(LexiconStats.build(["pump seal", "refund"], Bm25Encoder()))
    fitted = EvidenceCalibration(
        model=prior.model,
        query_model=prior.query_model,
        ranking=RankingChoice("fused", "dbsf", 0.7, 0.3),
        thresholds=EvidenceThresholds(0.2, 0.6, 0.85),
        lexicon=prior.lexicon,
        source="fitted",
        fitted_at=datetime(2026, 1, 2, tzinfo=UTC),
        seed=3,
        report={"held_out": {"ece": 0.01}},
    )
    text = fitted.to_json()
    again = EvidenceCalibration.from_json(text)
    assert again.to_json() == text
    assert again.fingerprint == fitted.fingerprint
    assert again.ranking.label == "dbsf(dense 0.7, lexical 0.3)"
    later = EvidenceCalibration.from_json(text.replace("2026-01-02", "2027-05-06"))
    assert later.fingerprint == fitted.fingerprint  # the time is not part of the identity
    # computed once per calibration; a changed copy has its own
    assert fitted.fingerprint is fitted.fingerprint
    moved = dataclasses.replace(fitted, thresholds=EvidenceThresholds(0.25, 0.6, 0.85))
    assert moved.fingerprint != fitted.fingerprint


def test_a_calibration_of_another_feature_set_or_garbage_is_refused() -> None:
    prior = prior_calibration(LexiconStats.build(["a"], Bm25Encoder()))
    doc = json.loads(prior.to_json())
    doc["feature_set"] = 1
    with pytest.raises(CalibrationError, match="feature set"):
        EvidenceCalibration.from_json(json.dumps(doc))
    with pytest.raises(CalibrationError, match="unreadable"):
        EvidenceCalibration.from_json("{}")


def test_thresholds_must_be_ordered_probabilities() -> None:
    with pytest.raises(CalibrationError):
        EvidenceThresholds(0.7, 0.5, 0.9)
    with pytest.raises(CalibrationError):
        EvidenceThresholds(-0.1, 0.5, 0.9)


def test_ranking_choice_orders_by_fusion_or_evidence() -> None:
    cosines, bm25, evidence = [0.9, 0.1], [0.0, 9.0], [0.2, 0.8]
    assert RankingChoice("evidence").scores(cosines, bm25, evidence) == evidence
    dense_only = RankingChoice("fused", "rrf", 1.0, 0.0).scores(cosines, bm25, evidence)
    assert dense_only[0] > dense_only[1]
    assert RankingChoice().label == "rrf(dense 1, lexical 1, k 60)"
    with pytest.raises(CalibrationError):
        RankingChoice.from_dict({"order": "fused", "method": "max", "dense_weight": 1,
                                 "sparse_weight": 1, "k": 60})  # fmt: skip


def _hit(n: int, dense_rank: int | None, sparse_rank: int | None) -> FusedHit:
    return FusedHit(f"p{n}", f"c{n}", 0.0, None, dense_rank, None, sparse_rank, {})


def test_pool_evidence_is_never_below_the_evidence_in_the_finding_channels_own_pool() -> None:
    calibration = prior_calibration(LexiconStats.build(["a"], Bm25Encoder()))
    query = LexicalQuery(("pump",), (2.0,), (), (), 0.0)
    # c0: the dense branch's answer with little BM25; c1, c2: the lexical branch's matches
    signals = (signal(0.8, 1.0, 0.2), signal(0.3, 12.0, 1.0), signal(0.2, 9.0, 1.0))
    raw = RawPool(query, (_hit(0, 1, None), _hit(1, 2, 1), _hit(2, None, 2)), signals)
    whole = calibration.evidence(query, signals)
    dense_pool = calibration.evidence(query, signals[:2])
    lexical_pool = calibration.evidence(query, signals[1:])
    got = pool_evidence(raw, calibration)
    assert got == pytest.approx(
        [
            max(whole[0], dense_pool[0]),
            max(whole[1], dense_pool[1], lexical_pool[0]),
            max(whole[2], lexical_pool[1]),
        ]
    )
    # the pool-relative features made the dense answer weaker beside the lexical best match
    assert dense_pool[0] > whole[0]
    assert got[0] == pytest.approx(dense_pool[0])


def test_a_single_channel_pool_keeps_the_evidence_of_the_whole_pool() -> None:
    calibration = prior_calibration(LexiconStats.build(["a"], Bm25Encoder()))
    query = LexicalQuery(("pump",), (2.0,), (), (), 0.0)
    signals = (signal(0.8, 1.0, 0.2), signal(0.3, 12.0, 1.0))
    raw = RawPool(query, (_hit(0, 1, None), _hit(1, 2, None)), signals)
    assert pool_evidence(raw, calibration) == pytest.approx(calibration.evidence(query, signals))
