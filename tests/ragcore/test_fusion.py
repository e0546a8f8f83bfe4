"""Weighted RRF, convex and distribution-based fusion, checked against hand-computed values."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from ragcore.fusion import FusedHit, FusionMethod, fuse, fuse_scores, ranks_of

pytestmark = pytest.mark.unit


@dataclass(frozen=True)
class Hit:
    point_id: str
    score: float
    payload: Mapping[str, Any] = field(default_factory=dict)


def hit(name: str, score: float) -> Hit:
    return Hit(f"id-{name}", score, {"chunk_id": f"{name}:chunk:0"})


DENSE = [hit("a", 0.9), hit("b", 0.8), hit("c", 0.7)]
SPARSE = [hit("c", 12.0), hit("d", 5.0)]


def test_rrf_equal_weights_sums_reciprocal_ranks() -> None:
    fused = fuse(DENSE, SPARSE)
    assert [h.chunk_id for h in fused] == ["c:chunk:0", "a:chunk:0", "b:chunk:0", "d:chunk:0"]
    scores = {h.chunk_id: h.score for h in fused}
    assert scores["c:chunk:0"] == pytest.approx(1 / 63 + 1 / 61)
    assert scores["a:chunk:0"] == pytest.approx(1 / 61)
    # b and d tie at 1/62: chunk_id ascending decides.
    assert scores["b:chunk:0"] == scores["d:chunk:0"] == pytest.approx(1 / 62)


def test_rrf_keeps_each_branch_score_and_rank() -> None:
    by_chunk = {h.chunk_id: h for h in fuse(DENSE, SPARSE)}
    c = by_chunk["c:chunk:0"]
    assert (c.dense_rank, c.dense_score, c.sparse_rank, c.sparse_score) == (3, 0.7, 1, 12.0)
    d = by_chunk["d:chunk:0"]
    assert (d.dense_rank, d.dense_score, d.sparse_rank, d.sparse_score) == (None, None, 2, 5.0)
    assert d.point_id == "id-d"
    assert d.payload == {"chunk_id": "d:chunk:0"}


def test_rrf_weights_and_k_change_the_order() -> None:
    fused = fuse(DENSE, SPARSE, dense_weight=2.0, sparse_weight=1.0, k=1)
    # a: 2/2 = 1.0; c: 2/4 + 1/2 = 1.0 (tie -> chunk_id); b: 2/3; d: 1/3.
    assert [h.chunk_id for h in fused] == ["a:chunk:0", "c:chunk:0", "b:chunk:0", "d:chunk:0"]
    assert [h.score for h in fused] == pytest.approx([1.0, 1.0, 2 / 3, 1 / 3])


def test_zero_weight_ignores_a_branch_but_keeps_its_evidence() -> None:
    fused = fuse(DENSE, SPARSE, dense_weight=0.0, sparse_weight=1.0)
    assert [h.chunk_id for h in fused][:2] == ["c:chunk:0", "d:chunk:0"]
    assert fused[0].dense_rank == 3
    assert {h.chunk_id: h.score for h in fused}["a:chunk:0"] == 0.0


def test_convex_uses_min_max_normalized_scores() -> None:
    fused = fuse(DENSE, SPARSE, dense_weight=0.7, sparse_weight=0.3, method="convex")
    # dense norm: a 1, b 0.5, c 0; sparse norm: c 1, d 0.
    assert [h.chunk_id for h in fused] == ["a:chunk:0", "b:chunk:0", "c:chunk:0", "d:chunk:0"]
    assert [h.score for h in fused] == pytest.approx([0.7, 0.35, 0.3, 0.0])


def test_convex_gives_a_single_or_flat_list_full_credit() -> None:
    fused = fuse([hit("a", 0.4)], [hit("b", 3.0), hit("c", 3.0)], method="convex")
    assert {h.chunk_id: h.score for h in fused} == {
        "a:chunk:0": 1.0,
        "b:chunk:0": 1.0,
        "c:chunk:0": 1.0,
    }
    assert [h.chunk_id for h in fused] == ["a:chunk:0", "b:chunk:0", "c:chunk:0"]


def test_limit_truncates_after_sorting() -> None:
    assert [h.chunk_id for h in fuse(DENSE, SPARSE, limit=2)] == ["c:chunk:0", "a:chunk:0"]
    assert fuse(DENSE, SPARSE, limit=0) == []


def test_repeated_point_keeps_its_best_rank() -> None:
    fused = fuse([hit("a", 0.9), hit("a", 0.1)], [])
    assert len(fused) == 1
    assert (fused[0].dense_rank, fused[0].dense_score) == (1, 0.9)


def test_missing_chunk_id_falls_back_to_point_id() -> None:
    fused = fuse([Hit("z", 1.0), Hit("y", 1.0)], [Hit("x", 1.0)], sparse_weight=0.5)
    # z 1/61 > y 1/62 > x 0.5/61; without a chunk_id the point id stands in.
    assert [h.chunk_id for h in fused] == ["z", "y", "x"]


def test_empty_inputs_fuse_to_nothing() -> None:
    assert fuse([], []) == []


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"dense_weight": -1.0}, "dense_weight"),
        ({"sparse_weight": float("nan")}, "sparse_weight"),
        ({"dense_weight": 0.0, "sparse_weight": 0.0}, "at least one"),
        ({"k": -1.0}, "k"),
        ({"method": "max"}, "unknown fusion method"),
        ({"limit": -1}, "limit"),
    ],
)
def test_invalid_parameters_are_refused(kwargs: dict[str, Any], message: str) -> None:
    with pytest.raises(ValueError, match=message):
        fuse(DENSE, SPARSE, **kwargs)


names = st.lists(st.sampled_from("abcdefgh"), unique=True, max_size=8)


@given(dense=names, sparse=names, method=st.sampled_from(["rrf", "convex"]))
def test_fusion_is_a_deterministic_union_in_score_order(
    dense: list[str], sparse: list[str], method: FusionMethod
) -> None:
    dense_hits = [hit(n, 1.0 - i / 10) for i, n in enumerate(dense)]
    sparse_hits = [hit(n, 10.0 - i) for i, n in enumerate(sparse)]
    fused = fuse(dense_hits, sparse_hits, method=method)
    assert {h.point_id for h in fused} == {f"id-{n}" for n in [*dense, *sparse]}
    keys = [(-h.score, h.chunk_id) for h in fused]
    assert keys == sorted(keys)
    assert fuse(dense_hits, sparse_hits, method=method) == fused


def test_dbsf_normalises_each_list_by_mean_and_three_standard_deviations() -> None:
    fused = {h.chunk_id: h.score for h in fuse(DENSE, SPARSE, method="dbsf")}
    # dense 0.9, 0.8, 0.7: mean 0.8, sd 0.0816 -> a = (0.9 - (0.8 - 0.245)) / 0.49 = 0.7041
    sd = (2 * 0.01 / 3) ** 0.5
    low = 0.8 - 3 * sd
    a = (0.9 - low) / (6 * sd)
    assert fused["a:chunk:0"] == pytest.approx(a)
    # sparse 12 and 5: mean 8.5, sd 3.5 -> c = (12 - (8.5 - 10.5)) / 21 = 0.6667
    c_dense = (0.7 - low) / (6 * sd)
    assert fused["c:chunk:0"] == pytest.approx(c_dense + 14 / 21)


def test_ranks_of_ties_keep_input_order() -> None:
    assert ranks_of([0.2, 0.9, 0.2, 0.5]) == [3, 1, 4, 2]


@pytest.mark.parametrize("method", ["rrf", "convex", "dbsf"])
def test_fuse_scores_ranks_candidates_that_carry_both_channels(method: FusionMethod) -> None:
    dense = [0.9, 0.5, 0.1]
    sparse = [0.0, 8.0, 9.0]
    scores = fuse_scores(dense, sparse, method=method)
    assert len(scores) == 3 and all(s >= 0 for s in scores)
    only_dense = fuse_scores(dense, sparse, method=method, sparse_weight=0.0)
    assert sorted(range(3), key=lambda i: -only_dense[i]) == [0, 1, 2]
    only_sparse = fuse_scores(dense, sparse, method=method, dense_weight=0.0)
    assert sorted(range(3), key=lambda i: -only_sparse[i]) == [2, 1, 0]


def test_fuse_scores_rrf_by_hand() -> None:
    scores = fuse_scores([0.9, 0.5], [1.0, 3.0], k=60)
    assert scores == pytest.approx([1 / 61 + 1 / 62, 1 / 62 + 1 / 61])


def test_fuse_scores_refuses_misaligned_or_unknown_input() -> None:
    with pytest.raises(ValueError, match="length"):
        fuse_scores([0.1], [0.1, 0.2])
    with pytest.raises(ValueError, match="unknown fusion method"):
        fuse_scores([0.1], [0.1], method="max")  # type: ignore[arg-type]


def test_with_score_changes_only_the_score() -> None:
    hit = FusedHit(
        point_id="p",
        chunk_id="e:chunk:0",
        score=0.1,
        dense_score=0.8,
        dense_rank=2,
        sparse_score=None,
        sparse_rank=None,
        payload={"text": "t"},
    )
    assert hit.with_score(0.7) == replace(hit, score=0.7)
