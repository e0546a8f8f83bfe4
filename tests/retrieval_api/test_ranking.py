"""Ranking: calibrated scores (never RRF) against thresholds, dedup, filters, order, NO_EVIDENCE."""

from __future__ import annotations

import math
from collections.abc import Iterable
from dataclasses import replace
from datetime import UTC, datetime
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import retrieval_api.ranking as ranking_module
from ragcore.errors import StoreError
from ragcore.fusion import fuse
from ragcore.store.base import EVENT_DATE, Range, ScoredHit, StoreFilter
from ragcore.textsim import Signature, signature, similarity
from retrieval_api.ranking import (
    Candidate,
    Confidence,
    Excluded,
    ExclusionReason,
    RankedChunk,
    ScoreKind,
    Thresholds,
    calibrate,
    explains,
    matches_filter,
    needs_similarity,
    rank,
)
from tests.retrieval_api.helpers import TENANT, cand, fused, payload

pytestmark = pytest.mark.unit

T = Thresholds(hard=0.25, medium=0.40, high=0.60)
ANY = StoreFilter(tenant_id=TENANT)


def ids(chunks: Iterable[RankedChunk]) -> list[str]:
    return [c.chunk_id for c in chunks]


def test_threshold_applies_to_cosine_not_to_the_rrf_score() -> None:
    # Hand-computed RRF (k=60): "a" is first in both lists -> 1/61 + 1/61 = 0.03279;
    # "b" is second in dense only -> 1/62 = 0.01613. Cosine: a 0.20, b 0.31.
    dense = [
        ScoredHit("pt-a", 0.20, payload("a:chunk:0", "a")),
        ScoredHit("pt-b", 0.31, payload("b:chunk:0", "b")),
    ]
    sparse = [ScoredHit("pt-a", 7.5, payload("a:chunk:0", "a"))]
    fused_hits = fuse(dense, sparse)
    assert [h.chunk_id for h in fused_hits] == ["a:chunk:0", "b:chunk:0"]
    assert fused_hits[0].score == pytest.approx(2 / 61)

    # Sorted by dense similarity first: b (0.31) then a (0.20).
    ranking = rank(calibrate(fused_hits), store_filter=ANY, top_k=5, thresholds=T)
    assert ids(ranking.results) == ["b:chunk:0"]
    assert ranking.results[0].final == pytest.approx(0.31)
    [excluded] = ranking.excluded
    assert (excluded.chunk_id, excluded.entity_id) == ("a:chunk:0", "a")
    assert excluded.reason is ExclusionReason.BELOW_THRESHOLD
    assert excluded.score == pytest.approx(0.20)
    assert ranking.counters.rejected_by_threshold == 1


def test_sparse_only_hit_needs_an_explicit_cosine() -> None:
    hits = [fused("a:chunk:0", dense=0.5, score=0.03), fused("s:chunk:0", sparse=9.0, score=0.02)]
    assert [h.chunk_id for h in needs_similarity(hits)] == ["s:chunk:0"]
    with pytest.raises(ValueError, match="sparse branch only"):
        calibrate(hits)
    candidates = calibrate(hits, similarity_for_sparse_only={"pt-s:chunk:0": 0.7})
    assert [c.similarity for c in candidates] == [0.5, 0.7]
    # The recomputed cosine, not the sparse or fused score, orders and thresholds the hit.
    ranking = rank(candidates, store_filter=ANY, top_k=5, thresholds=T)
    assert ids(ranking.results) == ["s:chunk:0", "a:chunk:0"]
    assert ranking.results[0].final == 0.7


def test_per_entity_dedup_keeps_the_best_chunk() -> None:
    candidates = [cand("e:chunk:1", 0.7), cand("e:chunk:0", 0.8), cand("f:chunk:0", 0.6)]
    ranking = rank(candidates, store_filter=ANY, top_k=5, thresholds=T, answering_chunks=False)
    assert ids(ranking.results) == ["e:chunk:0", "f:chunk:0"]
    assert ranking.excluded == (Excluded("e:chunk:1", "e", ExclusionReason.DUPLICATE, 0.7),)
    assert ranking.counters.deduplicated == 1


def test_dedup_can_be_turned_off_but_a_repeated_chunk_is_still_dropped() -> None:
    candidates = [cand("e:chunk:1", 0.7), cand("e:chunk:0", 0.8), cand("f:chunk:0", 0.6)]
    # The same chunk under a second point id (e.g. a leftover of a botched migration).
    repeated = Candidate(replace(fused("e:chunk:0", dense=0.8), point_id="another-point"), 0.8)
    ranking = rank(
        [*candidates, repeated],
        store_filter=ANY,
        top_k=5,
        thresholds=T,
        dedup_per_entity=False,
    )
    assert ids(ranking.results) == ["e:chunk:0", "e:chunk:1", "f:chunk:0"]
    assert [(x.chunk_id, x.reason) for x in ranking.excluded] == [
        ("e:chunk:0", ExclusionReason.DUPLICATE)
    ]


def test_equal_scores_are_ordered_by_chunk_id() -> None:
    candidates = [cand("c:chunk:0", 0.5), cand("a:chunk:0", 0.5), cand("b:chunk:0", 0.9)]
    for order in (candidates, candidates[::-1]):
        ranking = rank(order, store_filter=ANY, top_k=5, thresholds=T)
        assert ids(ranking.results) == ["b:chunk:0", "a:chunk:0", "c:chunk:0"]


def test_nothing_above_the_hard_threshold_is_no_evidence() -> None:
    candidates = [cand("a:chunk:0", 0.24), cand("b:chunk:0", -0.1)]
    ranking = rank(candidates, store_filter=ANY, top_k=5, thresholds=T)
    assert ranking.no_evidence
    assert ranking.results == () and ranking.reserve == ()
    assert {x.reason for x in ranking.excluded} == {ExclusionReason.BELOW_THRESHOLD}
    assert ranking.counters.rejected_by_threshold == 2


def test_no_candidates_is_no_evidence() -> None:
    ranking = rank([], store_filter=ANY, top_k=5, thresholds=T)
    assert ranking.no_evidence and ranking.counters.candidates == 0


def test_hard_threshold_is_inclusive() -> None:
    ranking = rank([cand("a:chunk:0", 0.25)], store_filter=ANY, top_k=5, thresholds=T)
    assert ids(ranking.results) == ["a:chunk:0"]


def test_results_are_truncated_to_top_k_and_the_rest_kept_in_reserve() -> None:
    candidates = [cand(f"e{i}:chunk:0", 0.9 - i / 100) for i in range(6)]
    ranking = rank(candidates, store_filter=ANY, top_k=2, thresholds=T)
    assert ids(ranking.results) == ["e0:chunk:0", "e1:chunk:0"]
    assert ids(ranking.reserve) == ["e2:chunk:0", "e3:chunk:0", "e4:chunk:0", "e5:chunk:0"]
    assert len(ranking.survivors) == 6 and ranking.excluded == ()


def test_rerank_score_is_the_final_score_when_a_reranker_ran() -> None:
    rerank_t = Thresholds(hard=0.1, medium=0.5, high=0.8)
    candidates = [cand("a:chunk:0", 0.9, rerank=0.05), cand("b:chunk:0", 0.3, rerank=0.85)]
    ranking = rank(
        candidates, store_filter=ANY, top_k=5, thresholds=rerank_t, score_kind=ScoreKind.RERANK
    )
    assert ids(ranking.results) == ["b:chunk:0"]
    assert ranking.results[0].final == 0.85
    assert ranking.excluded[0].reason is ExclusionReason.BELOW_THRESHOLD
    with pytest.raises(ValueError, match="no rerank score"):
        rank([cand("c:chunk:0", 0.9)], store_filter=ANY, top_k=1, thresholds=rerank_t,
             score_kind=ScoreKind.RERANK)  # fmt: skip


def test_calibrate_attaches_rerank_scores_and_requires_all_of_them() -> None:
    hits = [fused("a:chunk:0", dense=0.5), fused("b:chunk:0", dense=0.4)]
    scored = calibrate(hits, rerank_scores={"pt-a:chunk:0": 0.2, "pt-b:chunk:0": 0.9})
    assert [c.rerank for c in scored] == [0.2, 0.9]
    with pytest.raises(ValueError, match="no rerank score"):
        calibrate(hits, rerank_scores={"pt-a:chunk:0": 0.2})


def test_non_finite_scores_are_refused() -> None:
    with pytest.raises(ValueError, match="not finite"):
        Candidate(fused("a:chunk:0", dense=0.5), math.nan)
    with pytest.raises(ValueError, match="not finite"):
        Candidate(fused("a:chunk:0", dense=0.5), 0.5, math.inf)


# --- filter re-check -----------------------------------------------------------------------------


def test_filter_recheck_excludes_what_the_store_should_not_have_returned() -> None:
    store_filter = StoreFilter(
        tenant_id=TENANT,
        entity_types=("SOP",),
        keywords={"line": (1,)},
        ranges={EVENT_DATE: Range(gte=datetime(2024, 1, 1, tzinfo=UTC))},
    )
    good = cand("a:chunk:0", 0.9, entity_type="SOP", line=1)
    wrong_type = cand("b:chunk:0", 0.8, entity_type="INCIDENT", line=1)
    bool_not_int = cand("c:chunk:0", 0.7, entity_type="SOP", line=True)
    too_old = cand("d:chunk:0", 0.6, entity_type="SOP", line=1, event_date="2023-12-31T23:59:59Z")
    no_date = cand("e:chunk:0", 0.5, entity_type="SOP", line=1, event_date=None)
    ranking = rank(
        [good, wrong_type, bool_not_int, too_old, no_date],
        store_filter=store_filter,
        top_k=5,
        thresholds=T,
    )
    assert ids(ranking.results) == ["a:chunk:0"]
    assert [x.reason for x in ranking.excluded] == [ExclusionReason.FILTERED] * 4
    assert ranking.counters.rejected_by_filter == 4


def test_filter_recheck_of_entity_ids_and_numeric_ranges() -> None:
    store_filter = StoreFilter(
        tenant_id=TENANT, entity_ids=("a",), ranges={"priority": Range(gt=1, lte=3)}
    )
    assert matches_filter(payload("a:chunk:0", "a", priority=3), store_filter)
    assert not matches_filter(payload("a:chunk:0", "a", priority=1), store_filter)
    assert not matches_filter(payload("a:chunk:0", "a", priority="2"), store_filter)
    assert not matches_filter(payload("b:chunk:0", "b", priority=2), store_filter)


def test_a_chunk_of_another_tenant_raises() -> None:
    leaked = cand("a:chunk:0", 0.9, tenant_id="globex")
    with pytest.raises(StoreError, match="tenant isolation"):
        rank([leaked], store_filter=ANY, top_k=5, thresholds=T)


# --- thresholds ----------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("score", "confidence"),
    [
        (0.60, Confidence.HIGH),
        (0.59, Confidence.MEDIUM),
        (0.40, Confidence.MEDIUM),
        (0.39, Confidence.LOW),
        (0.25, Confidence.LOW),
        (0.24, Confidence.NONE),
    ],
)
def test_soft_thresholds_classify_confidence(score: float, confidence: Confidence) -> None:
    assert T.classify(score) is confidence


def test_thresholds_must_be_ordered_and_finite() -> None:
    with pytest.raises(ValueError, match="hard <= medium <= high"):
        Thresholds(0.5, 0.4, 0.6)
    with pytest.raises(ValueError, match="finite"):
        Thresholds(math.nan, 0.4, 0.6)


def test_top_k_must_be_positive() -> None:
    with pytest.raises(ValueError, match="top_k"):
        rank([], store_filter=ANY, top_k=0, thresholds=T)


def _evidence(chunk_id: str, evidence: float, order: float, ids: tuple[str, ...] = ()) -> Candidate:
    hit = replace(fused(chunk_id, dense=0.5), score=order)
    return Candidate(hit, 0.5, evidence=evidence, identifiers=ids)


E = Thresholds(hard=0.4, medium=0.6, high=0.85, floor=0.1)


def test_a_chunk_holding_a_query_identifier_ranks_first_and_is_never_below_threshold() -> None:
    # The dev stack's showcase: BM25 finds the E-2113 chunks, their evidence is low, an
    # unrelated error-code chunk scores higher. The identifier chunks must come first.
    candidates = [
        _evidence("codes:chunk:5", 0.55, order=0.05),
        _evidence("release-1:chunk:0", 0.02, order=0.03, ids=("e-2113",)),
        _evidence("release-2:chunk:0", 0.01, order=0.02, ids=("e-2113",)),
    ]
    ranking = rank(
        candidates, store_filter=ANY, top_k=5, thresholds=E, score_kind=ScoreKind.EVIDENCE,
        order="fused",
    )  # fmt: skip
    assert ids(ranking.results) == ["release-1:chunk:0", "release-2:chunk:0", "codes:chunk:5"]
    assert ranking.counters.rejected_by_threshold == 0


def test_identifier_protection_can_be_turned_off() -> None:
    candidates = [_evidence("a:chunk:0", 0.05, order=0.9, ids=("e-2113",))]
    ranking = rank(
        candidates, store_filter=ANY, top_k=5, thresholds=E, score_kind=ScoreKind.EVIDENCE,
        order="fused", protect_identifiers=False,
    )  # fmt: skip
    assert ranking.no_evidence


def test_supporting_chunks_are_kept_down_to_the_floor_only_once_one_chunk_has_evidence() -> None:
    answered = [
        _evidence("a:chunk:0", 0.70, order=0.9),
        _evidence("b:chunk:0", 0.15, order=0.8),  # supporting: above the floor
        _evidence("c:chunk:0", 0.05, order=0.7),  # below the floor
    ]
    ranking = rank(
        answered, store_filter=ANY, top_k=5, thresholds=E, score_kind=ScoreKind.EVIDENCE,
        order="fused",
    )  # fmt: skip
    assert ids(ranking.results) == ["a:chunk:0", "b:chunk:0"]
    assert [x.chunk_id for x in ranking.excluded] == ["c:chunk:0"]
    unanswered = [_evidence("b:chunk:0", 0.35, order=0.8), _evidence("c:chunk:0", 0.3, order=0.7)]
    ranking = rank(
        unanswered, store_filter=ANY, top_k=5, thresholds=E, score_kind=ScoreKind.EVIDENCE,
        order="fused",
    )  # fmt: skip
    assert ranking.no_evidence  # nothing reaches hard: the floor does not apply


def test_evidence_order_sorts_by_the_evidence_score_not_the_fused_one() -> None:
    candidates = [_evidence("a:chunk:0", 0.5, order=0.9), _evidence("b:chunk:0", 0.8, order=0.1)]
    ranking = rank(
        candidates, store_filter=ANY, top_k=5, thresholds=E, score_kind=ScoreKind.EVIDENCE,
        order="evidence",
    )  # fmt: skip
    assert ids(ranking.results) == ["b:chunk:0", "a:chunk:0"]
    assert ranking.results[0].final == 0.8


def test_evidence_kind_needs_an_evidence_score() -> None:
    with pytest.raises(ValueError, match="no evidence score"):
        cand("a:chunk:0", 0.5).final(ScoreKind.EVIDENCE)


def test_floor_must_not_exceed_hard() -> None:
    with pytest.raises(ValueError, match="floor"):
        Thresholds(hard=0.3, medium=0.4, high=0.5, floor=0.35)
    assert Thresholds(hard=0.3, medium=0.4, high=0.5).supporting == 0.3


# --- near-duplicates, diversity, an answer above a mention ------------------------------------

TICKET = "Login fails with E-2113 (#{n})\n\nThe login page shows error E-2113. Account {n}7."
NOTE = "# Acme Flow 2.{n} release notes\n\n## Fixes\n\n- E-2113: fixed SAML logins"


def _texted(chunk_id: str, score: float, text: str, **kw: Any) -> Candidate:
    return Candidate(fused(chunk_id, dense=score, score=score, text=text), score, **kw)


def test_near_duplicates_collapse_into_the_best_one() -> None:
    candidates = [_texted(f"t{n}:chunk:0", 0.9 - n / 100, TICKET.format(n=n)) for n in range(4)] + [
        _texted("note:chunk:0", 0.5, NOTE.format(n=1))
    ]
    ranking = rank(
        candidates,
        store_filter=ANY,
        top_k=2,
        thresholds=T,
        order="fused",
        near_duplicate_similarity=0.9,
    )
    assert ids(ranking.results) == ["t0:chunk:0", "note:chunk:0"]
    assert ids(ranking.results[0].similar) == ["t1:chunk:0", "t2:chunk:0", "t3:chunk:0"]
    assert ranking.counters.collapsed == 3
    assert ids(ranking.to_verify) == [c.chunk_id for c in candidates]
    # off: every ticket is its own result
    plain = rank(candidates, store_filter=ANY, top_k=2, thresholds=T, order="fused")
    assert ids(plain.results) == ["t0:chunk:0", "t1:chunk:0"]
    assert plain.counters.collapsed == 0


def test_diversity_moves_a_repeated_fact_down_but_not_across_identifier_tiers() -> None:
    base = "The pump GX-300 seal must be checked every 1000 operating hours by maintenance"
    candidates = [
        _texted("a:chunk:0", 0.90, base),
        _texted("b:chunk:0", 0.89, base + " staff on site"),
        _texted("c:chunk:0", 0.80, "Bearings are regreased every 4000 hours with lithium grease"),
    ]
    kw: dict[str, Any] = {"store_filter": ANY, "top_k": 2, "thresholds": T, "order": "fused"}
    assert ids(rank(candidates, **kw).results) == ["a:chunk:0", "b:chunk:0"]
    assert ids(rank(candidates, **kw, diversity_lambda=1.0).results) == ["a:chunk:0", "b:chunk:0"]
    diverse = rank(candidates, **kw, diversity_lambda=0.7)
    assert ids(diverse.results) == ["a:chunk:0", "c:chunk:0"]
    assert ids(diverse.reserve) == ["b:chunk:0"]
    # a chunk holding the query's identifier stays first, however similar
    held = [replace(candidates[1], identifiers=("gx-300",)), candidates[0], candidates[2]]
    assert ids(rank(held, **kw, diversity_lambda=0.0).results)[0] == "b:chunk:0"
    with pytest.raises(ValueError, match="diversity_lambda"):
        rank(candidates, **kw, diversity_lambda=1.5)


def _reference_collapse(
    survivors: list[RankedChunk], signatures: list[Signature], cut: float
) -> tuple[list[RankedChunk], list[Signature]]:
    """Near-duplicate collapse by its definition: each survivor folds into the first kept one
    that passes the size prefilter (the smaller set >= cut x the larger) and the Jaccard cut."""

    def near(a: Signature, b: Signature) -> bool:
        sizes = (len(a), len(b))
        return min(sizes) >= cut * max(sizes) and similarity(a, b) >= cut

    kept: list[int] = []
    folded: dict[int, list[RankedChunk]] = {}
    for j, sig in enumerate(signatures):
        into = next((i for i in kept if near(sig, signatures[i])), None)
        if into is None:
            kept.append(j)
            folded[j] = []
        else:
            folded[into].append(survivors[j])
    collapsed = [
        replace(survivors[i], similar=tuple(folded[i])) if folded[i] else survivors[i] for i in kept
    ]
    return collapsed, [signatures[i] for i in kept]


def _reference_diversify(
    survivors: list[RankedChunk], signatures: list[Signature], lam: float, top_k: int
) -> list[RankedChunk]:
    """MMR by its definition: each place chosen by (tier, marginal relevance, place)."""

    def tier(r: RankedChunk) -> tuple[int, int]:
        return (-len(r.candidate.identifiers), 0)

    window = min(len(survivors), 2 * top_k)
    if window < 2:
        return survivors
    pool = list(range(window))
    scores = [survivors[i].final for i in pool]
    low, high = min(scores), max(scores)
    if low >= 0 and high > 0:
        rel = [v / high for v in scores]
    else:
        spread = high - low
        rel = [(v - low) / spread if spread > 0 else 1.0 for v in scores]
    chosen: list[int] = []

    def mmr(i: int) -> tuple[tuple[int, int], float, int]:
        # the lowest tier, then the highest marginal relevance, then the earliest place
        redundancy = max((similarity(signatures[i], signatures[c]) for c in chosen), default=0.0)
        return (tier(survivors[i]), -(lam * rel[i] - (1 - lam) * redundancy), i)

    while pool and len(chosen) < top_k:
        best = min(pool, key=mmr)
        chosen.append(best)
        pool.remove(best)
    order = chosen + pool + list(range(window, len(survivors)))
    return [survivors[i] for i in order]


# a few words, so texts repeat and their shingle sets often differ in a size near the cut
_SHORT_TEXT = st.lists(st.sampled_from(["pump", "seal", "gx-300", "leak", "7"]), max_size=9).map(
    " ".join
)


@settings(max_examples=300, deadline=None)
@given(
    texts=st.lists(st.tuples(_SHORT_TEXT, st.booleans()), max_size=12),
    cut=st.sampled_from([0.0, 0.5, 0.75, 0.9, 1.0]),
    lam=st.sampled_from([0.0, 0.3, 0.7]),
    top_k=st.integers(min_value=1, max_value=5),
)
def test_collapse_and_diversity_equal_their_definitions(
    texts: list[tuple[str, bool]], cut: float, lam: float, top_k: int
) -> None:
    """The collapse's size check without a sort per pair and MMR's tiers computed once choose
    what the definitions choose."""
    survivors = [
        RankedChunk(
            _texted(f"c{n}:chunk:0", 0.9 - n / 100, text, identifiers=("gx-300",) if held else ()),
            0.9 - n / 100,
        )
        for n, (text, held) in enumerate(texts)
    ]
    signatures = [signature(text) for text, _ in texts]
    expected = _reference_collapse(survivors, signatures, cut)
    assert ranking_module._collapse(survivors, signatures, cut) == expected
    kept, kept_signatures = expected
    got = ranking_module._diversify(
        kept,
        kept_signatures,
        lam=lam,
        top_k=top_k,
        relevance=lambda r: r.final,
        tier=lambda r: (-len(r.candidate.identifiers), 0),
    )
    assert got == _reference_diversify(kept, kept_signatures, lam, top_k)


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("- E-2113: fixed a bug where SAML logins failed.", True),
        ("- **E-1042 Webhook signature mismatch**: the signature we computed", True),
        ("| A-317 | Low suction pressure, test pump | red |", True),
        ("# Postmortem review: INC-2291\n\nDate: 2025-03-12.", True),
        ("E-3307 means the export timed out", True),
        ("Login fails with E-2113 (#1000)\n\nthe login page shows error E-2113. Our IdP", False),
        ("every webhook verification fails with E-1042 since their deploy", False),
        ("Use seal kit GX-SEAL-KIT-42, which contains the cartridge", False),
        ("- E-21130: another code", False),
        ("Tom: migration guide v1 to v2 — 15 July.", False),
    ],
)
def test_explains_tells_a_definition_from_a_mention(text: str, expected: bool) -> None:
    words = ("e-2113", "e-1042", "a-317", "inc-2291", "e-3307", "gx-seal-kit-42", "v2")
    code = next(w for w in words if w in text.lower())
    assert explains(text, code) is expected


def test_an_explanation_ranks_above_chunks_that_only_repeat_the_identifier() -> None:
    mention = _texted("t:chunk:0", 0.9, TICKET.format(n=1), identifiers=("e-2113",))
    note = NOTE.format(n=3)
    answer = _texted("n:chunk:0", 0.4, note, identifiers=("e-2113",), explained=("e-2113",))
    kw: dict[str, Any] = {"store_filter": ANY, "top_k": 2, "thresholds": T, "order": "fused"}
    assert ids(rank([mention, answer], **kw).results) == ["t:chunk:0", "n:chunk:0"]
    first = rank([mention, answer], **kw, explanations_first=True)
    assert ids(first.results) == ["n:chunk:0", "t:chunk:0"]
    # the identifier count still comes first
    two = replace(mention, identifiers=("e-2113", "e-2150"))
    assert ids(rank([two, answer], **kw, explanations_first=True).results)[0] == "t:chunk:0"


def _page(chunk_id: str, evidence: float, order: float, part: str, **kw: Any) -> Candidate:
    """A chunk of a PDF: its locator names the document and the page."""
    locator = {"chunk_index": 0, "document": "manual.pdf", "section_path": ["manual.pdf", part]}
    hit = replace(fused(chunk_id, dense=0.5, locator=locator), score=order)
    return Candidate(hit, 0.5, evidence=evidence, **kw)


EVIDENCE_KW: dict[str, Any] = {
    "store_filter": ANY,
    "top_k": 5,
    "thresholds": E,
    "score_kind": ScoreKind.EVIDENCE,
    "order": "fused",
}


def test_an_entity_is_represented_by_its_best_evidence_chunk_in_its_own_place() -> None:
    candidates = [
        _evidence("e:chunk:0", 0.30, order=0.9),  # first in the order: the entity's place
        _evidence("f:chunk:0", 0.50, order=0.8),
        _evidence("e:chunk:2", 0.95, order=0.7),  # answers: it leads its entity
    ]
    ranking = rank(candidates, **EVIDENCE_KW, answering_chunks=False)
    assert ids(ranking.results) == ["e:chunk:2", "f:chunk:0"]
    assert ranking.excluded == (Excluded("e:chunk:0", "e", ExclusionReason.DUPLICATE, 0.30),)
    # the rule before issue 43: the entity's first chunk in the order
    before = rank(candidates, **EVIDENCE_KW, answering_chunks=False, lead_by="order")
    assert ids(before.results) == ["e:chunk:0", "f:chunk:0"]


def test_a_further_chunk_that_answers_by_itself_is_a_result_in_its_own_place() -> None:
    candidates = [
        _evidence("e:chunk:0", 0.90, order=0.9),
        _evidence("f:chunk:0", 0.50, order=0.8),
        _evidence("e:chunk:1", 0.45, order=0.7),  # >= hard 0.4: answers something
        _evidence("e:chunk:2", 0.20, order=0.6),  # supporting only: a repeat of e
    ]
    ranking = rank(candidates, **EVIDENCE_KW)
    assert ids(ranking.results) == ["e:chunk:0", "f:chunk:0", "e:chunk:1"]
    assert [(x.chunk_id, x.reason) for x in ranking.excluded] == [
        ("e:chunk:2", ExclusionReason.DUPLICATE)
    ]


def test_pages_of_a_document_are_distinct_passages_best_evidence_first() -> None:
    candidates = [
        _page("m:chunk:0", 0.25, order=0.9, part="p. 1", identifiers=("hydra-7",)),
        _page("m:chunk:1", 0.97, order=0.8, part="p. 2", identifiers=("hydra-7",)),
        _page("m:chunk:2", 0.15, order=0.7, part="p. 2"),  # the same page again: a repeat
        _evidence("x:chunk:0", 0.60, order=0.75),
    ]
    ranking = rank(candidates, **EVIDENCE_KW)
    # the document keeps its places (1 and 2); the page that answers takes the first
    assert ids(ranking.results) == ["m:chunk:1", "m:chunk:0", "x:chunk:0"]
    assert [(x.chunk_id, x.reason) for x in ranking.excluded] == [
        ("m:chunk:2", ExclusionReason.DUPLICATE)
    ]
    folded = rank(candidates, **EVIDENCE_KW, distinct_parts=False, answering_chunks=False)
    assert ids(folded.results) == ["m:chunk:1", "x:chunk:0"]


def test_a_near_duplicate_group_is_led_by_its_best_evidence_copy() -> None:
    text = TICKET.format(n=1)
    candidates = [
        Candidate(replace(fused("t1:chunk:0", dense=0.5, text=text), score=0.9), 0.5, evidence=0.5),
        Candidate(replace(fused("t2:chunk:0", dense=0.5, text=text), score=0.8), 0.5, evidence=0.9),
    ]
    ranking = rank(candidates, **EVIDENCE_KW, near_duplicate_similarity=0.9)
    assert ids(ranking.results) == ["t2:chunk:0"]
    assert ids(ranking.results[0].similar) == ["t1:chunk:0"]
