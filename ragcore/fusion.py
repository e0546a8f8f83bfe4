"""Fusion of a dense and a sparse ranked list into one, keeping each branch's evidence.

Why fuse here and not in the engine: Qdrant's prefetch + fusion returns only the fused score,
and the evidence pack must report every hit's dense and sparse score and rank
(docs/decisions/retrieval-contract.md). qdrant-client 1.20 (`models.Rrf(k, weights)`) and
qdrant-edge 0.9 (`Fusion.Rrf(k, weights)`)
do accept per-branch weights now, but still hide the branch scores, so the store returns both
lists (one batch round trip) and this pure module fuses them.

Fused scores are *ranking* scores: RRF values are not calibrated and must never be compared to
a relevance threshold (docs/decisions/retrieval-contract.md); the calibrated evidence score
(`retrieval_api.evidence_score`) is what thresholds use.

Three methods, each over two lists (`fuse`) or over candidates that carry both channels' scores
(`fuse_scores`: Retrieve re-scores every candidate of either branch with the cosine and exact
BM25, so no candidate is missing a channel there):
- `rrf`: reciprocal rank fusion, `w_d / (k + rank_d) + w_s / (k + rank_s)`;
- `convex`: a convex combination of min-max normalised scores, `w_d * mm(d) + w_s * mm(s)`;
- `dbsf`: distribution-based score fusion (as Qdrant's DBSF): each score normalised by its
  list's mean +- 3 standard deviations, `(s - (mu - 3 sigma)) / (6 sigma)` clipped to [0, 1],
  then weighted and summed.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Literal, Protocol

FusionMethod = Literal["rrf", "convex", "dbsf"]
FUSION_METHODS: tuple[FusionMethod, ...] = ("rrf", "convex", "dbsf")


class RankedHit(Protocol):
    """What fusion needs of a search hit (ragcore.store.base.ScoredHit satisfies it)."""

    @property
    def point_id(self) -> str:
        """The point's id, unique within one list."""
        ...

    @property
    def score(self) -> float:
        """The branch's own score (higher is better)."""
        ...

    @property
    def payload(self) -> Mapping[str, Any]:
        """The point's payload; its `chunk_id` is the tie-breaker."""
        ...


@dataclass(frozen=True, slots=True)
class FusedHit:
    """One fused hit with the evidence of both branches (ranks are 1-based, None if absent)."""

    point_id: str
    chunk_id: str
    score: float
    dense_score: float | None
    dense_rank: int | None
    sparse_score: float | None
    sparse_rank: int | None
    payload: Mapping[str, Any]

    def with_score(self, score: float) -> FusedHit:
        """This hit with another score (`dataclasses.replace` without its per-call field
        introspection: Retrieve rescores every candidate of every request)."""
        return FusedHit(
            self.point_id,
            self.chunk_id,
            score,
            self.dense_score,
            self.dense_rank,
            self.sparse_score,
            self.sparse_rank,
            self.payload,
        )


@dataclass(slots=True)
class _Acc:
    hit: RankedHit
    dense_score: float | None = None
    dense_rank: int | None = None
    sparse_score: float | None = None
    sparse_rank: int | None = None


def _chunk_id(hit: RankedHit) -> str:
    value = hit.payload.get("chunk_id")
    return value if isinstance(value, str) else hit.point_id


def _min_max(score: float, low: float, high: float) -> float:
    # A list whose scores are all equal carries rank information only: every hit gets 1.0.
    return 1.0 if high == low else (score - low) / (high - low)


@dataclass(frozen=True, slots=True)
class _Normalizer:
    """Per-list score normalisation of `convex` (min-max) or `dbsf` (mean +- 3 sigma)."""

    method: FusionMethod
    low: float
    high: float

    @classmethod
    def of(cls, method: FusionMethod, scores: Sequence[float]) -> _Normalizer:
        if not scores:
            return cls(method, 0.0, 0.0)
        if method == "dbsf":
            mean = math.fsum(scores) / len(scores)
            sigma = math.sqrt(math.fsum((s - mean) ** 2 for s in scores) / len(scores))
            return cls(method, mean - 3 * sigma, mean + 3 * sigma)
        return cls(method, min(scores), max(scores))

    def __call__(self, score: float) -> float:
        value = _min_max(score, self.low, self.high)
        return min(1.0, max(0.0, value))


def fuse(
    dense_hits: Sequence[RankedHit],
    sparse_hits: Sequence[RankedHit],
    *,
    dense_weight: float = 1.0,
    sparse_weight: float = 1.0,
    k: float = 60.0,
    method: FusionMethod = "rrf",
    limit: int | None = None,
) -> list[FusedHit]:
    """Fuse two ranked lists (best first) into one, deterministically ordered.

    - `rrf`: score = dense_weight / (k + dense_rank) + sparse_weight / (k + sparse_rank), ranks
      1-based; a branch that did not return the hit contributes 0.
    - `convex`: score = dense_weight * norm(dense) + sparse_weight * norm(sparse), where norm is
      the min-max normalization of a score within its own list (all-equal lists give 1.0); a
      missing branch contributes 0. Weights are used as given (pass e.g. 0.7 / 0.3).
    - `dbsf`: as `convex` with norm = (s - (mean - 3 sd)) / (6 sd) of the list, clipped to [0, 1].

    Order: fused score descending, then chunk_id ascending, then point id ascending. A point id
    repeated within one list keeps its first (best) occurrence.
    """
    _check(method, dense_weight, sparse_weight, k)
    if limit is not None and limit < 0:
        raise ValueError(f"limit must be >= 0, got {limit!r}")

    acc: dict[str, _Acc] = {}
    for rank, hit in enumerate(dense_hits, start=1):
        entry = acc.setdefault(hit.point_id, _Acc(hit))
        if entry.dense_rank is None:
            entry.dense_rank, entry.dense_score = rank, float(hit.score)
    for rank, hit in enumerate(sparse_hits, start=1):
        entry = acc.setdefault(hit.point_id, _Acc(hit))
        if entry.sparse_rank is None:
            entry.sparse_rank, entry.sparse_score = rank, float(hit.score)

    dense_norm = _Normalizer.of(
        method, [e.dense_score for e in acc.values() if e.dense_score is not None]
    )
    sparse_norm = _Normalizer.of(
        method, [e.sparse_score for e in acc.values() if e.sparse_score is not None]
    )

    fused: list[FusedHit] = []
    for pid, e in acc.items():
        score = 0.0
        if method == "rrf":
            if e.dense_rank is not None:
                score += dense_weight / (k + e.dense_rank)
            if e.sparse_rank is not None:
                score += sparse_weight / (k + e.sparse_rank)
        else:
            if e.dense_score is not None:
                score += dense_weight * dense_norm(e.dense_score)
            if e.sparse_score is not None:
                score += sparse_weight * sparse_norm(e.sparse_score)
        fused.append(
            FusedHit(
                point_id=pid,
                chunk_id=_chunk_id(e.hit),
                score=score,
                dense_score=e.dense_score,
                dense_rank=e.dense_rank,
                sparse_score=e.sparse_score,
                sparse_rank=e.sparse_rank,
                payload=e.hit.payload,
            )
        )
    fused.sort(key=lambda h: (-h.score, h.chunk_id, h.point_id))
    return fused if limit is None else fused[:limit]


def _check(method: str, dense_weight: float, sparse_weight: float, k: float) -> None:
    if method not in FUSION_METHODS:
        raise ValueError(f"unknown fusion method {method!r}: expected one of {FUSION_METHODS}")
    for label, weight in (("dense_weight", dense_weight), ("sparse_weight", sparse_weight)):
        if not math.isfinite(weight) or weight < 0:
            raise ValueError(f"{label} must be a finite number >= 0, got {weight!r}")
    if dense_weight == 0 and sparse_weight == 0:
        raise ValueError("at least one fusion weight must be > 0")
    if not math.isfinite(k) or k < 0:
        raise ValueError(f"rrf k must be a finite number >= 0, got {k!r}")


def ranks_of(scores: Sequence[float]) -> list[int]:
    """1-based rank of each score within `scores` (higher is better; ties keep input order)."""
    order = sorted(range(len(scores)), key=lambda i: (-scores[i], i))
    ranks = [0] * len(scores)
    for rank, i in enumerate(order, start=1):
        ranks[i] = rank
    return ranks


def fuse_scores(
    dense: Sequence[float],
    sparse: Sequence[float],
    *,
    dense_weight: float = 1.0,
    sparse_weight: float = 1.0,
    k: float = 60.0,
    method: FusionMethod = "rrf",
) -> list[float]:
    """Fused score of candidates that carry both channels' scores (`dense[i]`, `sparse[i]`).

    Ranks and normalisation are taken over the given candidates: `rrf` ranks each channel's
    scores (ties keep input order), `convex` min-max normalises them, `dbsf` normalises them by
    mean +- 3 sd; see `fuse`. A zero weight removes a channel from the score.
    """
    _check(method, dense_weight, sparse_weight, k)
    if len(dense) != len(sparse):
        raise ValueError("dense and sparse scores differ in length")
    if method == "rrf":
        d_ranks, s_ranks = ranks_of(dense), ranks_of(sparse)
        return [
            dense_weight / (k + d) + sparse_weight / (k + s)
            for d, s in zip(d_ranks, s_ranks, strict=True)
        ]
    d_norm, s_norm = _Normalizer.of(method, dense), _Normalizer.of(method, sparse)
    return [
        dense_weight * d_norm(d) + sparse_weight * s_norm(s)
        for d, s in zip(dense, sparse, strict=True)
    ]
