"""The evidence score: one calibrated estimate in [0, 1] that a chunk answers the query.

A raw cosine cannot carry that promise (all-MiniLM-L6-v2 puts paraphrases and near-domain
questions the corpus does not answer in the same band), and neither can an RRF value. The
evidence score factors into two logistic models over every signal Retrieve has:

    evidence(chunk) = P(the index answers the query) x P(this chunk is an answer | it does)

The *query model* decides answerability from the pool's first candidate, the dense branch's
best hit (what abstention is about). Its `max_*` and `id_found` features are that candidate's,
not the best over the pool: measured both ways (`ragstream eval --configs default`, seeds 0
and 1), the pool's best separated no better (AUC golden 0.935/0.928 against 0.944 at seed 0,
`neardomain` 0.805/0.806 against 0.818/0.828) and cut golden's abstention recall from
0.613/0.548 to 0.516/0.387. The *chunk model* tells the answers apart from the other
candidates of an answerable query (what ordering and per-chunk exclusion are about). Fitting
them apart keeps the one from learning the other's shortcut (most candidates of an answerable
query are not answers).

| query feature | what |
|---|---|
| `max_cosine` | the cosine of query and the first candidate (the dense branch's best hit) |
| `max_coverage`, `max_bm25_norm` | its IDF-weighted term coverage / normalised BM25 |
| `id_query` | the query has identifier-like words |
| `id_found`, `id_unknown` | share of them in the first candidate / occurring nowhere in the index |
| `query_missing` | IDF-weighted share of the query's terms that occur nowhere in the index |
| `query_log_len` | ln(1 + number of query tokens) |

| chunk feature | what |
|---|---|
| `cosine`, `cosine_gap` | cosine of query and chunk; minus the best cosine among the candidates |
| `dense_log_rank` | ln of the candidate's rank by cosine among the candidates |
| `bm25_norm` | exact BM25 divided by the query's summed IDF (per-query normalisation) |
| `bm25_gap` | `bm25_norm` minus the best among the candidates |
| `lexical_log_rank` | ln of the rank by BM25 among the candidates |
| `coverage` | IDF-weighted share of the query's terms the chunk contains |
| `id_match` | share of the query's identifiers the chunk contains |
| `agree_top3` | both channels rank the candidate in their top 3 |
| `rerank` | the reranker's score (only in models fitted with a reranker) |

Its coefficients are fitted per index without labels from people (`retrieval_api.calibration`):
known-item queries sampled from the tenant's own chunks are the positives, queries from other
sources (a bundled background set, identifiers and focus terms the index does not contain,
mixtures of unrelated chunks) the negatives. An `EvidenceCalibration` holds the model, the
result order chosen with the same queries, the thresholds, the index's lexical statistics and
a fit report; it is stored with the index version (`IndexRegistry.save_calibration`).

`PRIOR` is the model an index uses before it was ever calibrated (fitted the same way on the
golden corpus' chunks, never on its queries): the pack says `calibration.source = "prior"`.
"""

from __future__ import annotations

import hashlib
import json
import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import datetime
from functools import cached_property
from typing import Any, Literal

import numpy as np
from numpy.typing import NDArray

from ragcore.fusion import FUSION_METHODS, FusionMethod, fuse_scores
from ragcore.sparse import LexicalMatch, LexicalQuery, LexiconStats

#: Bump when a feature's definition changes: a stored model of another version is refused.
FEATURE_SET_VERSION = 2
CHUNK_FEATURES: tuple[str, ...] = (
    "cosine",
    "cosine_gap",
    "dense_log_rank",
    "bm25_norm",
    "bm25_gap",
    "lexical_log_rank",
    "coverage",
    "id_match",
    "agree_top3",
)
QUERY_FEATURES: tuple[str, ...] = (
    "max_cosine",
    "max_coverage",
    "max_bm25_norm",
    "id_query",
    "id_found",
    "id_unknown",
    "query_missing",
    "query_log_len",
)
RERANK_FEATURE = "rerank"
ALL_FEATURES = frozenset({*CHUNK_FEATURES, *QUERY_FEATURES, RERANK_FEATURE})
#: bm25_norm above this is clipped (a term repeated in a short chunk says no more).
_BM25_NORM_CAP = 3.0

CalibrationSource = Literal["fitted", "prior"]
OrderKind = Literal["fused", "evidence"]


class CalibrationError(ValueError):
    """A stored calibration cannot be used (corrupt, another feature set, another encoder)."""


@dataclass(frozen=True, slots=True)
class Signals:
    """What Retrieve measured for one candidate of one query."""

    cosine: float
    lexical: LexicalMatch
    rerank: float | None = None


@dataclass(frozen=True, slots=True)
class PoolRanks:
    """Ranks of each candidate within the pool, by cosine and by BM25 (1-based)."""

    dense: tuple[int, ...]
    lexical: tuple[int, ...]


def _ranks(values: Sequence[float]) -> tuple[int, ...]:
    if any(map(math.isnan, values)):
        order = sorted(range(len(values)), key=lambda i: (-values[i], i))
    else:
        # descending, ties in input order: a stable sort keeps equal values in order under
        # `reverse` too, so this is the order of the key (-value, index) without its tuples
        order = sorted(range(len(values)), key=values.__getitem__, reverse=True)
    out = [0] * len(values)
    for rank, i in enumerate(order, start=1):
        out[i] = rank
    return tuple(out)


def pool_ranks(signals: Sequence[Signals]) -> PoolRanks:
    """Ranks by cosine and by exact BM25 among the candidates (ties keep input order)."""
    return PoolRanks(
        _ranks([s.cosine for s in signals]), _ranks([s.lexical.score for s in signals])
    )


#: The features that need the candidates' ranks (`pool_ranks`).
_RANK_FEATURES = frozenset({"dense_log_rank", "lexical_log_rank", "agree_top3"})
_NO_RANKS = PoolRanks((), ())


def feature_matrix(
    query: LexicalQuery, signals: Sequence[Signals], names: Sequence[str]
) -> NDArray[np.float64]:
    """One row per candidate, one column per feature name (see the module docstring)."""
    out = np.empty((len(signals), len(names)), dtype=np.float64)
    if not signals:
        return out
    # only what the model names is computed (it runs six times a Retrieve request: the query
    # model's row of one candidate and the chunk model's rows, for the pool and each channel):
    # the ranks only for a rank feature, the query's features only for the query model
    ranks = pool_ranks(signals) if not _RANK_FEATURES.isdisjoint(names) else _NO_RANKS
    cosines = [s.cosine for s in signals]
    best_cos = max(cosines)
    norms = [min(s.lexical.normalized, _BM25_NORM_CAP) for s in signals]
    best_norm = max(norms)
    n_ids = len(query.identifiers)

    def id_found() -> float:
        found = {t for s in signals for t in s.lexical.identifiers}
        return len(found) / n_ids if n_ids else 0.0

    columns: dict[str, Callable[[], float | list[float]]] = {
        "max_cosine": lambda: best_cos,
        "max_coverage": lambda: max(s.lexical.coverage for s in signals),
        "max_bm25_norm": lambda: best_norm,
        "id_query": lambda: 1.0 if n_ids else 0.0,
        "id_found": id_found,
        "id_unknown": lambda: len(query.unknown_identifiers) / n_ids if n_ids else 0.0,
        "query_missing": lambda: query.missing_share,
        "query_log_len": lambda: math.log1p(len(query.tokens)),
        "cosine": lambda: cosines,
        "cosine_gap": lambda: [c - best_cos for c in cosines],
        "dense_log_rank": lambda: [math.log(r) for r in ranks.dense],
        "bm25_norm": lambda: norms,
        "bm25_gap": lambda: [v - best_norm for v in norms],
        "lexical_log_rank": lambda: [math.log(r) for r in ranks.lexical],
        "coverage": lambda: [s.lexical.coverage for s in signals],
        "id_match": lambda: [len(s.lexical.identifiers) / n_ids if n_ids else 0.0 for s in signals],
        "agree_top3": lambda: [
            1.0 if d <= 3 and x <= 3 else 0.0
            for d, x in zip(ranks.dense, ranks.lexical, strict=True)
        ],
        RERANK_FEATURE: lambda: _reranks(signals),
    }
    for j, name in enumerate(names):
        out[:, j] = columns[name]()
    return out


def _reranks(signals: Sequence[Signals]) -> list[float]:
    scores = [s.rerank for s in signals]
    if any(score is None for score in scores):
        raise CalibrationError("the model needs a reranker score the pipeline lacks")
    return [score for score in scores if score is not None]


def _sigmoid(z: NDArray[np.float64]) -> NDArray[np.float64]:
    out: NDArray[np.float64] = 0.5 * (1.0 + np.tanh(0.5 * z))
    return out


@dataclass(frozen=True)
class LogisticModel:
    """P(answers) = sigmoid(intercept + coef . (x - mean) / scale)."""

    features: tuple[str, ...]
    mean: tuple[float, ...]
    scale: tuple[float, ...]
    coef: tuple[float, ...]
    intercept: float
    _arrays: tuple[NDArray[np.float64], ...] = field(
        init=False, repr=False, compare=False, hash=False
    )

    def __post_init__(self) -> None:
        n = len(self.features)
        if not (len(self.mean) == len(self.scale) == len(self.coef) == n):
            raise CalibrationError("logistic model: arrays differ in length")
        values = [*self.mean, *self.scale, *self.coef, self.intercept]
        if not all(math.isfinite(v) for v in values) or any(s <= 0 for s in self.scale):
            raise CalibrationError("logistic model: non-finite value or non-positive scale")
        unknown = set(self.features) - ALL_FEATURES
        if unknown:
            raise CalibrationError(f"logistic model: unknown features {sorted(unknown)}")
        # the arrays `predict` needs, made once (it runs six times a Retrieve request)
        object.__setattr__(
            self, "_arrays", tuple(map(np.asarray, (self.mean, self.scale, self.coef)))
        )

    def predict(self, x: NDArray[np.float64]) -> NDArray[np.float64]:
        """Probabilities for rows of features in `self.features` order."""
        if x.shape[0] == 0:
            return np.zeros(0, dtype=np.float64)
        mean, scale, coef = self._arrays
        z = (x - mean) / scale
        return _sigmoid(z @ coef + self.intercept)

    def to_dict(self) -> dict[str, Any]:
        """JSON form."""
        return {
            "features": list(self.features),
            "mean": list(self.mean),
            "scale": list(self.scale),
            "coef": list(self.coef),
            "intercept": self.intercept,
        }

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> LogisticModel:
        """Inverse of `to_dict`."""
        return cls(
            features=tuple(str(f) for f in data["features"]),
            mean=tuple(float(v) for v in data["mean"]),
            scale=tuple(float(v) for v in data["scale"]),
            coef=tuple(float(v) for v in data["coef"]),
            intercept=float(data["intercept"]),
        )


def fit_logistic(
    x: NDArray[np.float64],
    y: NDArray[np.float64],
    features: Sequence[str],
    *,
    weights: NDArray[np.float64] | None = None,
    l2: float = 1.0,
    iterations: int = 100,
) -> LogisticModel:
    """L2-regularised logistic regression by Newton's method (IRLS) on standardised features.

    Deterministic: the same rows give the same coefficients. The intercept is not penalised.
    """
    n, k = x.shape
    if n == 0 or k != len(features):
        raise ValueError(f"cannot fit {len(features)} features on a {x.shape} matrix")
    if not np.all((y == 0) | (y == 1)) or y.min() == y.max():
        raise ValueError("labels must be 0/1 and contain both classes")
    w = np.ones(n) if weights is None else weights.astype(np.float64)
    mean = np.average(x, axis=0, weights=w)
    scale = np.sqrt(np.average((x - mean) ** 2, axis=0, weights=w))
    scale = np.where(scale > 1e-9, scale, 1.0)
    design = np.hstack([np.ones((n, 1)), (x - mean) / scale])
    beta = np.zeros(k + 1)
    penalty = np.full(k + 1, l2)
    penalty[0] = 0.0
    for _ in range(iterations):
        p = _sigmoid(design @ beta)
        gradient = design.T @ (w * (p - y)) + penalty * beta
        hessian = (design * (w * p * (1 - p))[:, None]).T @ design + np.diag(penalty + 1e-9)
        step = np.linalg.solve(hessian, gradient)
        beta -= step
        if float(np.max(np.abs(step))) < 1e-10:
            break
    return LogisticModel(
        features=tuple(features),
        mean=tuple(float(v) for v in mean),
        scale=tuple(float(v) for v in scale),
        coef=tuple(float(v) for v in beta[1:]),
        intercept=float(beta[0]),
    )


@dataclass(frozen=True)
class RankingChoice:
    """How results are ordered: a fusion of the cosine and exact BM25 over the candidates, or
    the evidence score itself."""

    order: OrderKind = "fused"
    method: FusionMethod = "rrf"
    dense_weight: float = 1.0
    sparse_weight: float = 1.0
    k: float = 60.0

    def __post_init__(self) -> None:
        if self.order not in ("fused", "evidence"):
            raise CalibrationError(f"unknown order {self.order!r}")
        if self.method not in FUSION_METHODS:
            raise CalibrationError(f"unknown fusion method {self.method!r}")

    @property
    def label(self) -> str:
        """e.g. 'rrf(dense 1, lexical 1, k 60)' or 'evidence'."""
        if self.order == "evidence":
            return "evidence"
        extra = f", k {self.k:g}" if self.method == "rrf" else ""
        return f"{self.method}(dense {self.dense_weight:g}, lexical {self.sparse_weight:g}{extra})"

    def scores(
        self, cosines: Sequence[float], bm25: Sequence[float], evidence: Sequence[float]
    ) -> list[float]:
        """The order score of each candidate (higher first)."""
        if self.order == "evidence":
            return list(evidence)
        return fuse_scores(
            cosines,
            bm25,
            dense_weight=self.dense_weight,
            sparse_weight=self.sparse_weight,
            k=self.k,
            method=self.method,
        )

    def to_dict(self) -> dict[str, Any]:
        """JSON form."""
        return {
            "order": self.order,
            "method": self.method,
            "dense_weight": self.dense_weight,
            "sparse_weight": self.sparse_weight,
            "k": self.k,
        }

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> RankingChoice:
        """Inverse of `to_dict`."""
        method = str(data["method"])
        order = str(data["order"])
        if method not in FUSION_METHODS or order not in ("fused", "evidence"):
            raise CalibrationError(f"unknown ranking {order!r} / {method!r}")
        return cls(
            order="evidence" if order == "evidence" else "fused",
            method=_method(method),
            dense_weight=float(data["dense_weight"]),
            sparse_weight=float(data["sparse_weight"]),
            k=float(data["k"]),
        )


def _method(name: str) -> FusionMethod:
    for method in FUSION_METHODS:
        if method == name:
            return method
    raise CalibrationError(f"unknown fusion method {name!r}")


@dataclass(frozen=True)
class EvidenceThresholds:
    """Thresholds on the evidence score: below `hard` a chunk is excluded; `medium`/`high`
    are the confidence classes."""

    hard: float
    medium: float
    high: float

    def __post_init__(self) -> None:
        values = (self.hard, self.medium, self.high)
        if not all(math.isfinite(v) and 0.0 <= v <= 1.0 for v in values):
            raise CalibrationError(f"evidence thresholds must be within [0, 1], got {values}")
        if not self.hard <= self.medium <= self.high:
            raise CalibrationError(f"evidence thresholds must be ordered, got {values}")


@dataclass(frozen=True)
class EvidenceCalibration:
    """Everything the evidence score of one index version needs (see the module docstring)."""

    model: LogisticModel  # the chunk model
    query_model: LogisticModel
    ranking: RankingChoice
    thresholds: EvidenceThresholds
    lexicon: LexiconStats
    source: CalibrationSource
    fitted_at: datetime
    seed: int
    report: dict[str, Any] = field(default_factory=dict)
    feature_set: int = FEATURE_SET_VERSION

    @property
    def uses_rerank(self) -> bool:
        """The model was fitted with a reranker's score."""
        return RERANK_FEATURE in self.model.features

    @cached_property
    def fingerprint(self) -> str:
        """A short hash of the model, ranking and thresholds (not the report or the time);
        computed once per calibration (every pack names it; all it hashes is frozen)."""
        doc = {
            "model": self.model.to_dict(),
            "query_model": self.query_model.to_dict(),
            "ranking": self.ranking.to_dict(),
            "thresholds": [self.thresholds.hard, self.thresholds.medium, self.thresholds.high],
            "n_docs": self.lexicon.n_docs,
            "avgdl": self.lexicon.avgdl,
        }
        text = json.dumps(doc, sort_keys=True, separators=(",", ":"))
        return hashlib.sha256(text.encode()).hexdigest()[:12]

    def answerable(self, query: LexicalQuery, signals: Sequence[Signals]) -> float:
        """P(the index answers the query), from the query model (0 without candidates)."""
        if not signals:
            return 0.0
        x = feature_matrix(query, signals[:1], self.query_model.features)
        return float(self.query_model.predict(x)[0])

    def evidence(self, query: LexicalQuery, signals: Sequence[Signals]) -> list[float]:
        """The evidence score of each candidate: P(answerable) x P(answer | answerable)."""
        if not signals:
            return []
        return self.evidence_of_rows(
            feature_matrix(query, signals[:1], self.query_model.features),
            feature_matrix(query, signals, self.model.features),
        )

    def evidence_of_rows(
        self, query_row: NDArray[np.float64], rows: NDArray[np.float64]
    ) -> list[float]:
        """`evidence` from feature rows already computed: the query model's row (of the pool's
        first candidate) and the chunk model's rows (the calibration scores each pool with
        several models and computes its features once)."""
        answerable = float(self.query_model.predict(query_row)[0])
        return [answerable * float(p) for p in self.model.predict(rows)]

    def to_json(self) -> str:
        """The stored form (JSON, keys sorted: identical calibrations give identical text)."""
        doc = {
            "feature_set": self.feature_set,
            "source": self.source,
            "fitted_at": self.fitted_at.isoformat(),
            "seed": self.seed,
            "model": self.model.to_dict(),
            "query_model": self.query_model.to_dict(),
            "ranking": self.ranking.to_dict(),
            "thresholds": {
                "hard": self.thresholds.hard,
                "medium": self.thresholds.medium,
                "high": self.thresholds.high,
            },
            "lexicon": self.lexicon.to_dict(),
            "report": self.report,
        }
        return json.dumps(doc, sort_keys=True, indent=1) + "\n"

    @classmethod
    def from_json(cls, text: str | bytes) -> EvidenceCalibration:
        """Inverse of `to_json`; CalibrationError when the text is not a usable calibration."""
        try:
            doc = json.loads(text)
            if int(doc["feature_set"]) != FEATURE_SET_VERSION:
                raise CalibrationError(
                    f"calibration of feature set {doc['feature_set']}, this server computes "
                    f"{FEATURE_SET_VERSION}: run `ragstream calibrate`"
                )
            source = str(doc["source"])
            if source not in ("fitted", "prior"):
                raise CalibrationError(f"unknown calibration source {source!r}")
            t = doc["thresholds"]
            return cls(
                model=LogisticModel.from_dict(doc["model"]),
                query_model=LogisticModel.from_dict(doc["query_model"]),
                ranking=RankingChoice.from_dict(doc["ranking"]),
                thresholds=EvidenceThresholds(
                    float(t["hard"]), float(t["medium"]), float(t["high"])
                ),
                lexicon=LexiconStats.from_dict(doc["lexicon"]),
                source="fitted" if source == "fitted" else "prior",
                fitted_at=datetime.fromisoformat(str(doc["fitted_at"])),
                seed=int(doc["seed"]),
                report=dict(doc.get("report") or {}),
            )
        except CalibrationError:
            raise
        except (KeyError, TypeError, ValueError) as exc:
            raise CalibrationError(f"unreadable calibration: {exc!r}") from exc
