"""Fit an index version's evidence calibration without labels from people.

`fit_calibration` runs, for one index version:
1. *Statistics*: one scan of the version's chunks counts its lexical statistics (chunks,
   average length, document frequencies: `ragcore.sparse.LexiconStats`).
2. *Queries*: positives and negatives built from those chunks (`retrieval_api.selfsupervised`).
3. *Signals*: every query goes through the real candidate stage (`CandidateSearch.gather`:
   hybrid search, identifier search, cosines, exact BM25, the reranker when configured); every
   candidate becomes a row of features with a label: 1 when it answers (the chunk the query
   came from, another chunk holding the same passage, a chunk holding the queried identifier),
   0 when it does not (any chunk, for a negative), left out when undecidable (another chunk of
   the answer's entity).
4. *Fit* on the training queries (70 %, split by query, stratified) two L2 logistic
   regressions: the query model (answerable or not, one row per query) and the chunk model (the
   candidates of the answerable queries: answer or not).
5. *Choose* the result order (fusions of the cosine and BM25 and the evidence score itself,
   by nDCG@10 of the paraphrase positives of step 2 and of step 6's extra queries; the
   configured fusion, convex 0.5/0.5 by default, is kept unless another order is better with
   paired-bootstrap p < 0.05; the evidence order, scored on the queries its models were not
   fitted on alone, must also beat the chosen fusion on them).
6. *Threshold*, cross-fitted: the queries of step 2 and `threshold_queries - 1` times as many
   more, generated for the threshold alone, in K folds (split by query, stratified); each
   fold's max evidence scored by both models fitted on the other folds; on these out-of-fold
   scores, the hard threshold with the highest balanced accuracy of abstention, with at most
   `max_false_abstention` of the positives abstaining. The served models are those of step 4.
The report holds the held-out expected calibration error, abstention precision/recall (the
served models on the held-out queries, at the cross-fitted threshold) and the order table.
The same index, settings and seed give the same calibration (`fingerprint`).
"""

from __future__ import annotations

import math
import time
from bisect import bisect_left
from collections import Counter
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field, replace
from datetime import UTC, datetime
from functools import cached_property
from typing import Any

import numpy as np
from numpy.typing import NDArray

from ragcore.embedders.base import Embedder, embed_queries
from ragcore.quality.metrics import expected_calibration_error
from ragcore.quality.significance import compare
from ragcore.sparse import LexiconStats
from ragcore.store.base import CHUNK_ID, ENTITY_ID, StoreFilter, VectorStore
from ragcore.store.registry import IndexRegistry, ResolvedIndex
from retrieval_api.candidates import CandidateSearch, RawPool, channel_pools
from retrieval_api.evidence_score import (
    CHUNK_FEATURES,
    QUERY_FEATURES,
    RERANK_FEATURE,
    EvidenceCalibration,
    EvidenceThresholds,
    LogisticModel,
    RankingChoice,
    Signals,
    feature_matrix,
    fit_logistic,
)
from retrieval_api.selfsupervised import CalibrationQuery, IndexedChunk, QueryGenerator, squash

#: Orders compared at calibration time, besides the configured fusion (the baseline, which
#: `fit_calibration` puts first; this first entry is the baseline of `_choose_order` alone).
ORDER_CHOICES: tuple[RankingChoice, ...] = (
    RankingChoice("fused", "rrf", 1.0, 1.0),
    RankingChoice("fused", "rrf", 1.0, 0.5),
    RankingChoice("fused", "rrf", 0.5, 1.0),
    RankingChoice("fused", "convex", 0.5, 0.5),
    RankingChoice("fused", "convex", 0.7, 0.3),
    RankingChoice("fused", "convex", 0.3, 0.7),
    RankingChoice("fused", "dbsf", 1.0, 1.0),
    RankingChoice("fused", "rrf", 1.0, 0.0),
    RankingChoice("fused", "rrf", 0.0, 1.0),
    RankingChoice("evidence"),
)
#: The positives whose nDCG@10 chooses the order (`_choose_order`): the paraphrases, which
#: share few words with their chunk, as real questions do.
ORDER_KINDS: frozenset[str] = frozenset({"paraphrase"})
MEDIUM_EVIDENCE = 0.6
HIGH_EVIDENCE = 0.85


@dataclass(frozen=True)
class CalibrationSettings:
    """How many queries, which seed, and the fitting knobs."""

    positives: int = 150
    negatives: int = 150
    seed: int = 0
    holdout: float = 0.3
    top_k: int = 10
    l2: float = 1.0
    max_false_abstention: float = 0.2
    #: folds of the cross-fitted hard threshold (`_cross_fitted_best`)
    threshold_folds: int = 5
    #: the threshold is chosen on this many times the models' queries (the others are generated
    #: for it alone; docs/decisions/abstention-threshold.md)
    threshold_queries: int = 4
    significance: float = 0.05
    choices: tuple[RankingChoice, ...] = ORDER_CHOICES

    @classmethod
    def from_command(
        cls,
        queries: int,
        *,
        seed: int,
        max_false_abstention: float,
        threshold_queries: int | None,
    ) -> CalibrationSettings:
        """The settings of a command's options: `queries` positives and as many negatives;
        `threshold_queries` None keeps the default multiple."""
        return cls(
            positives=queries,
            negatives=queries,
            seed=seed,
            max_false_abstention=max_false_abstention,
            threshold_queries=threshold_queries or cls.threshold_queries,
        )

    def __post_init__(self) -> None:
        if self.threshold_folds < 2 or self.threshold_queries < 1:
            raise ValueError(
                f"threshold_folds must be >= 2 and threshold_queries >= 1, got "
                f"{self.threshold_folds} and {self.threshold_queries}"
            )


@dataclass(frozen=True)
class _PoolRows:
    """The feature rows of one query's pool (`pool_evidence`'s inputs), computed once.

    The features depend on the pool alone, not on the model, and the calibration scores each
    pool with up to six models (the draft, the fold models) and fits on the same rows six
    times: computing them once per pool instead of per model and fit was most of the
    calibration's own CPU besides the search (docs/decisions/abstention-threshold.md)."""

    #: the chunk model's features, the columns of `rows`
    names: tuple[str, ...]
    #: the query model's row (the pool's first candidate) and the chunk model's rows
    query_row: NDArray[np.float64]
    rows: NDArray[np.float64]
    #: the same for each channel's own pool (`channel_pools`), with its candidates' indexes
    channels: tuple[tuple[list[int], NDArray[np.float64], NDArray[np.float64]], ...]

    @classmethod
    def of(cls, raw: RawPool, names: Sequence[str]) -> _PoolRows:
        """The rows of `raw` for a chunk model over `names`."""

        def rows(signals: Sequence[Signals]) -> tuple[NDArray[np.float64], NDArray[np.float64]]:
            return (
                feature_matrix(raw.query, signals[:1], QUERY_FEATURES),
                feature_matrix(raw.query, signals, names),
            )

        channels = tuple(
            (found, *rows([raw.signals[i] for i in found])) for found in channel_pools(raw)
        )
        return cls(tuple(names), *rows(raw.signals), channels)

    def evidence(self, calibration: EvidenceCalibration) -> list[float]:
        """`candidates.pool_evidence` of the pool, from these rows."""
        if not self.rows.shape[0]:
            return []
        if (calibration.query_model.features, calibration.model.features) != (
            QUERY_FEATURES,
            self.names,
        ):
            raise ValueError("the pool's rows were computed for other model features")
        evidence = calibration.evidence_of_rows(self.query_row, self.rows)
        for found, query_row, rows in self.channels:
            alone = calibration.evidence_of_rows(query_row, rows)
            for i, p in zip(found, alone, strict=True):
                evidence[i] = max(evidence[i], p)
        return evidence


@dataclass
class _Example:
    query: CalibrationQuery
    raw: RawPool
    labels: list[float | None]
    train: bool = True
    #: the chunk model's features (with the reranker's when it runs)
    names: tuple[str, ...] = CHUNK_FEATURES

    @cached_property
    def features(self) -> _PoolRows:
        """The pool's feature rows, computed on first use and kept."""
        return _PoolRows.of(self.raw, self.names)


@dataclass
class CalibrationReport:
    """What a fit measured, stored in the calibration's `report`."""

    data: dict[str, Any] = field(default_factory=dict)


def index_chunks(store: VectorStore, collection: str, tenant: str) -> list[IndexedChunk]:
    """Every chunk of a version (id, entity, title, text), by chunk id."""
    points = store.scroll(
        collection,
        StoreFilter(tenant_id=tenant),
        batch=512,
        fields=[CHUNK_ID, ENTITY_ID, "title", "text", "locator"],
    )
    chunks = [
        IndexedChunk(
            chunk_id=str(p.payload.get(CHUNK_ID, p.point_id)),
            entity_id=str(p.payload.get(ENTITY_ID, "")),
            title=str(p.payload.get("title") or ""),
            text=str(p.payload.get("text") or ""),
            heading=_heading(p.payload.get("locator")),
        )
        for p in points
    ]
    return sorted(chunks, key=lambda c: c.chunk_id)


def _heading(locator: Any) -> str:
    if isinstance(locator, dict):
        path = locator.get("section_path")
        if isinstance(path, list) and path and isinstance(path[-1], str):
            return path[-1]
    return ""


def _entity(hit_payload: Any, chunk_id: str) -> str:
    value = hit_payload.get(ENTITY_ID)
    return value if isinstance(value, str) and value else chunk_id


def label_pool(query: CalibrationQuery, raw: RawPool) -> list[float | None]:
    """1 answers, 0 does not, None undecidable (see the module docstring)."""
    if not query.answerable:
        return [0.0] * len(raw)
    passage = squash(query.passage) if query.passage else None
    out: list[float | None] = []
    for hit, signal in zip(raw.hits, raw.signals, strict=True):
        text = str(hit.payload.get("text", ""))
        same_chunk = hit.chunk_id == query.chunk_id
        same_passage = passage is not None and passage in squash(text)
        same_id = query.identifier is not None and query.identifier in signal.lexical.identifiers
        if same_chunk or same_passage or same_id:
            out.append(1.0)
        elif _entity(hit.payload, hit.chunk_id) == query.entity_id:
            out.append(None)
        else:
            out.append(0.0)
    return out


def _split(examples: Sequence[_Example], holdout: float, seed: int) -> None:
    rng = np.random.default_rng(seed)
    for answerable in (True, False):
        group = [e for e in examples if e.query.answerable is answerable]
        order = rng.permutation(len(group))
        cut = round(len(group) * holdout)
        for rank, i in enumerate(order):
            group[int(i)].train = rank >= cut


def _folds(examples: Sequence[_Example], k: int, seed: int) -> list[int]:
    """A fold in [0, k) for every example: by query, stratified by answerability, each class
    dealt round-robin in a seeded random order (fold sizes differ by at most one per class)."""
    rng = np.random.default_rng([seed, k])
    fold = [0] * len(examples)
    for answerable in (True, False):
        group = [n for n, e in enumerate(examples) if e.query.answerable is answerable]
        for rank, i in enumerate(rng.permutation(len(group))):
            fold[group[int(i)]] = rank % k
    return fold


def _query_rows(
    examples: Sequence[_Example], names: Sequence[str]
) -> tuple[NDArray[np.float64], NDArray[np.float64]]:
    if tuple(names) != QUERY_FEATURES:
        raise ValueError(f"the query rows are computed for {QUERY_FEATURES}, not {names}")
    xs = [e.features.query_row for e in examples if len(e.raw)]
    ys = [1.0 if e.query.answerable else 0.0 for e in examples if len(e.raw)]
    if not xs:
        return np.zeros((0, len(names))), np.zeros(0)
    return np.vstack(xs), np.asarray(ys)


def _rows(
    examples: Sequence[_Example], names: Sequence[str]
) -> tuple[NDArray[np.float64], NDArray[np.float64]]:
    xs: list[NDArray[np.float64]] = []
    ys: list[float] = []
    for e in examples:
        if e.features.names != tuple(names):
            raise ValueError(f"the pool's rows were computed for other features than {names}")
        x = e.features.rows
        keep = [i for i, label in enumerate(e.labels) if label is not None]
        if keep:
            xs.append(x[keep])
            ys.extend(float(e.labels[i] or 0.0) for i in keep)
    if not xs:
        return np.zeros((0, len(names))), np.zeros(0)
    return np.vstack(xs), np.asarray(ys)


def _ndcg10(example: _Example, scores: Sequence[float], protect: bool) -> float | None:
    hits, signals = example.raw.hits, example.raw.signals
    relevant = {
        _entity(h.payload, h.chunk_id)
        for h, label in zip(hits, example.labels, strict=True)
        if label == 1.0
    }
    if not relevant:
        return None
    order = sorted(
        range(len(hits)),
        key=lambda i: (
            -(len(signals[i].lexical.identifiers) if protect else 0),
            -scores[i],
            hits[i].chunk_id,
        ),
    )
    ranked = list(dict.fromkeys(_entity(hits[i].payload, hits[i].chunk_id) for i in order))
    gains = [1.0 if e in relevant else 0.0 for e in ranked[:10]]
    dcg = sum(g / math.log2(i + 2) for i, g in enumerate(gains))
    ideal = sum(1.0 / math.log2(i + 2) for i in range(min(len(relevant), 10)))
    return dcg / ideal


def _choose_order(
    examples: Sequence[_Example],
    calibration: EvidenceCalibration,
    settings: CalibrationSettings,
    protect: bool,
) -> tuple[RankingChoice, list[dict[str, Any]]]:
    """The fusion with the largest significant gain over the baseline (`settings.choices[0]`)
    in nDCG@10 of the paraphrase queries (`ORDER_KINDS`), or the baseline; the evidence order
    instead when it significantly beats that choice on its held-out queries.

    A fusion has no fitted parameter, so fusions are compared on every paraphrase query of
    `examples` (`fit_calibration` passes the models' queries and the threshold's extra ones:
    ~4x the paraphrases of the models' queries, ~13x the held-out share's); the evidence order
    uses the model fitted on the training queries (`train`) and is compared on the others
    only. The other
    positives are left out: the identifier rule orders identifier queries, not the fusion, and
    title, topic and sentence queries are the chunk's own words, which rank the lexical
    channel first by construction, whatever a corpus' real questions prefer (issue 26 item 5;
    docs/decisions/fusion-weights-from-held-out-evidence.md).
    """
    compared = [(n, e) for n, e in enumerate(examples) if e.query.kind in ORDER_KINDS]
    # the evidence does not depend on the order: scored once per query, for the evidence order
    # (a fusion's scores do not read it: `RankingChoice.scores`)
    evidence = {n: e.features.evidence(calibration) for n, e in compared if not e.train}
    per_choice: list[dict[str, float]] = []
    for choice in settings.choices:
        values: dict[str, float] = {}
        for n, e in compared:
            if choice.order == "evidence" and e.train:
                continue
            signals = e.raw.signals
            scores = choice.scores(
                [s.cosine for s in signals],
                [s.lexical.score for s in signals],
                evidence[n] if choice.order == "evidence" else (),
            )
            value = _ndcg10(e, scores, protect)
            if value is not None:
                values[f"q{n}"] = value
        per_choice.append(values)
    default = per_choice[0]
    table: list[dict[str, Any]] = []
    best, best_gain = 0, 0.0
    for i, (choice, values) in enumerate(zip(settings.choices, per_choice, strict=True)):
        mean = sum(values.values()) / len(values) if values else 0.0
        row: dict[str, Any] = {
            "order": choice.label,
            "ndcg@10": round(mean, 4),
            "queries": len(values),
        }
        if i > 0 and values:
            paired = {q: default[q] for q in values if q in default}
            test = compare(paired, values, seed=settings.seed, resamples=2000)
            row["diff_vs_default"] = round(test.mean_diff, 4)
            row["p_value"] = round(test.p_value, 4)
            fusion = choice.order != "evidence"
            if fusion and test.p_value < settings.significance and test.mean_diff > best_gain:
                best, best_gain = i, test.mean_diff
        table.append(row)
    # the evidence order is scored on the queries its models did not fit alone: its gain is
    # compared with the chosen fusion's on those same queries, not with one measured on all
    rows = zip(settings.choices, per_choice, table, strict=True)
    for i, (choice, values, row) in enumerate(rows):
        if i == 0 or choice.order != "evidence" or not values:
            continue
        test = compare(
            {q: per_choice[best][q] for q in values}, values, seed=settings.seed, resamples=2000
        )
        row["diff_vs_chosen_fusion"] = round(test.mean_diff, 4)
        row["p_value_vs_chosen_fusion"] = round(test.p_value, 4)
        if test.p_value < settings.significance and test.mean_diff > 0:
            best = i
    return settings.choices[best], table


def _fit_models(
    train: Sequence[_Example], names: Sequence[str], l2: float
) -> tuple[LogisticModel, LogisticModel]:
    """The chunk model (candidates of the answerable queries) and the query model (one row per
    query) fitted on `train`."""
    x, y = _rows([e for e in train if e.query.answerable], names)
    qx, qy = _query_rows(train, QUERY_FEATURES)
    return fit_logistic(x, y, names, l2=l2), fit_logistic(qx, qy, QUERY_FEATURES, l2=l2)


def _decidable(examples: Sequence[_Example]) -> list[_Example]:
    """The negatives and the positives with an answer among their candidates: a positive whose
    answer is not in the pool has no evidence a threshold could keep or lose."""
    return [e for e in examples if not e.query.answerable or 1.0 in e.labels]


def _cross_fitted_best(
    examples: Sequence[_Example],
    draft: EvidenceCalibration,
    names: Sequence[str],
    settings: CalibrationSettings,
) -> tuple[list[float], list[bool]]:
    """The out-of-fold max evidence of every decidable query, and whether it is answerable.

    On the held-out share alone (~90 of 300 queries) the chosen threshold moved with the
    seed. The balanced accuracy rises up to the false-abstention limit, so the threshold is in
    effect a quantile of the positives' max evidence, and its noise is that quantile's
    sampling noise: scoring every query (and the ones generated for the threshold alone) with
    models that did not see it gives the rule all of them
    (docs/decisions/abstention-threshold.md). The fold models are fitted like the served
    ones, on (k-1)/k of `examples` instead of 70% of the models' queries.
    """
    fold = _folds(examples, settings.threshold_folds, settings.seed)
    best: list[float] = []
    answerable: list[bool] = []
    for k in range(settings.threshold_folds):
        train = [e for e, f in zip(examples, fold, strict=True) if f != k]
        model, query_model = _fit_models(train, names, settings.l2)
        scorer = replace(draft, model=model, query_model=query_model)
        scored = _decidable([e for e, f in zip(examples, fold, strict=True) if f == k])
        best.extend(_max_evidence(scored, scorer))
        answerable.extend(e.query.answerable for e in scored)
    return best, answerable


def _max_evidence(examples: Sequence[_Example], calibration: EvidenceCalibration) -> list[float]:
    return [max(e.features.evidence(calibration), default=0.0) for e in examples]


def _choose_hard(
    best: Sequence[float], answerable: Sequence[bool], max_false: float
) -> tuple[float, dict[str, Any]]:
    positives = sum(answerable)
    negatives = len(answerable) - positives
    if not positives or not negatives:
        return 0.5, {"reason": "held-out queries lack a class: 0.5"}
    candidates = sorted({round(v, 4) for v in best} | {0.5})
    # how many of each class lie below t, by bisection (one pass per candidate over ~1,100
    # out-of-fold scores was quadratic)
    positive_best = sorted(b for b, a in zip(best, answerable, strict=True) if a)
    negative_best = sorted(b for b, a in zip(best, answerable, strict=True) if not a)
    chosen, chosen_score = 0.0, -1.0
    for t in candidates:
        false_abstain = bisect_left(positive_best, t)
        true_abstain = bisect_left(negative_best, t)
        if false_abstain / positives > max_false:
            continue
        balanced = 0.5 * ((positives - false_abstain) / positives + true_abstain / negatives)
        if balanced > chosen_score:
            chosen, chosen_score = t, balanced
    return min(max(chosen, 0.0), 1.0), {"balanced_accuracy": round(chosen_score, 4)}


def _abstention(best: Sequence[float], answerable: Sequence[bool], hard: float) -> dict[str, Any]:
    abstained = [b < hard for b in best]
    correct = sum(1 for ab, a in zip(abstained, answerable, strict=True) if ab and not a)
    n_abstained = sum(abstained)
    n_unanswerable = sum(1 for a in answerable if not a)
    return {
        "precision": round(correct / n_abstained, 4) if n_abstained else None,
        "recall": round(correct / n_unanswerable, 4) if n_unanswerable else None,
        "false_abstention_rate": round(
            sum(1 for ab, a in zip(abstained, answerable, strict=True) if ab and a)
            / max(1, sum(answerable)),
            4,
        ),
    }


def fit_calibration(
    search: CandidateSearch,
    index: ResolvedIndex,
    embedder: Embedder,
    store: VectorStore,
    *,
    settings: CalibrationSettings | None = None,
    with_rerank: bool = False,
    candidate_k: int | None = None,
    progress: Callable[[str], None] = lambda _line: None,
    clock: Callable[[], datetime] = lambda: datetime.now(UTC),
) -> EvidenceCalibration:
    """Fit the evidence calibration of one index version (see the module docstring)."""
    settings = settings or CalibrationSettings()
    started = time.perf_counter()
    chunks = index_chunks(store, index.collection, index.tenant)
    lexicon = LexiconStats.build((c.text for c in chunks), search.encoder)
    progress(
        f"{index.collection}: {lexicon.n_docs} chunks, average {lexicon.avgdl:.1f} words, "
        f"{len(lexicon.token_ids)} distinct tokens"
    )
    generator = QueryGenerator(chunks, search.encoder, lexicon, seed=settings.seed)
    queries = generator.generate(settings.positives, settings.negatives)
    more = settings.threshold_queries - 1
    # the same generator goes on: other chunks and draws, same mix of kinds
    seen = {squash(q.text) for q in queries}
    extra = [
        q
        for q in generator.generate(settings.positives * more, settings.negatives * more)
        if squash(q.text) not in seen
    ]
    limit = candidate_k or search.config.candidate_k(settings.top_k)
    tenant_filter = StoreFilter(tenant_id=index.tenant)
    names = (*CHUNK_FEATURES, RERANK_FEATURE) if with_rerank else CHUNK_FEATURES
    gathered: list[_Example] = []
    everything = (*queries, *extra)
    # one batched call: the same vectors as one `embed_query` each, at less CPU
    vectors = embed_queries(embedder, [q.text for q in everything])
    for n, (query, vector) in enumerate(zip(everything, vectors, strict=True)):
        raw = search.gather(
            index.collection,
            query.text,
            vector,
            tenant_filter,
            limit=limit,
            lexicon=lexicon,
            with_rerank=with_rerank,
        )
        # a threshold-only query never trains the served models (`_split` sets the others)
        fits = n < len(queries)
        gathered.append(_Example(query, raw, label_pool(query, raw), names=names, train=fits))
        if (n + 1) % 100 == 0:
            progress(f"{index.collection}: {n + 1}/{len(queries) + len(extra)} calibration queries")
    examples, threshold_only = gathered[: len(queries)], gathered[len(queries) :]
    _split(examples, settings.holdout, settings.seed)
    train = [e for e in examples if e.train]
    held = [e for e in examples if not e.train]
    model, query_model = _fit_models(train, names, settings.l2)
    draft = EvidenceCalibration(
        model=model,
        query_model=query_model,
        ranking=settings.choices[0],
        thresholds=EvidenceThresholds(0.5, 0.5, 0.5),
        lexicon=lexicon,
        source="fitted",
        fitted_at=clock(),
        seed=settings.seed,
    )
    protect = search.config.identifier_priority
    # the configured fusion is the baseline another order must beat (p < significance)
    baseline = search.fused_choice()
    settings = replace(
        settings, choices=(baseline, *(c for c in settings.choices if c != baseline))
    )
    # the threshold's extra queries vote too (4x the paraphrases: ~55 alone could not detect
    # a gain of 0.03 nDCG@10 at p < 0.05): a fusion fits nothing, and the served models were
    # not fitted on them, so the evidence order is scored on them as on the held-out share
    choice, order_table = _choose_order([*examples, *threshold_only], draft, settings, protect)
    folded_best, folded_answerable = _cross_fitted_best(
        [*examples, *threshold_only], draft, names, settings
    )
    hard, hard_info = _choose_hard(folded_best, folded_answerable, settings.max_false_abstention)
    hard_info |= {
        "folds": settings.threshold_folds,
        "queries": len(folded_best),
        "false_abstention": _abstention(folded_best, folded_answerable, hard)[
            "false_abstention_rate"
        ],
    }
    decidable = _decidable(held)
    best = _max_evidence(decidable, draft)
    answerable = [e.query.answerable for e in decidable]
    thresholds = EvidenceThresholds(
        hard, max(hard, MEDIUM_EVIDENCE), max(hard, MEDIUM_EVIDENCE, HIGH_EVIDENCE)
    )
    chunk_labels = [
        label for e in train if e.query.answerable for label in e.labels if label is not None
    ]
    chunk_rows, chunk_positive = len(chunk_labels), int(sum(chunk_labels))
    held_p: list[float] = []
    held_y: list[float] = []
    for e in held:
        for p, label in zip(e.features.evidence(draft), e.labels, strict=True):
            if label is not None:
                held_p.append(p)
                held_y.append(label)
    report: dict[str, Any] = {
        "queries": {
            "total": len(queries),
            "by_kind": dict(sorted(Counter(q.kind for q in queries).items())),
            "train": len(train),
            "held_out": len(held),
            "threshold_only": len(threshold_only),
        },
        "rows": {
            "chunk_model": chunk_rows,
            "chunk_model_positive": chunk_positive,
            "query_model": sum(1 for e in train if len(e.raw)),
            "held_out": len(held_y),
        },
        "held_out": {
            "ece": _round(expected_calibration_error(held_p, held_y)),
            "abstention": _abstention(best, answerable, hard),
        },
        # chosen on the out-of-fold scores of every query, not on the held-out share
        "hard_threshold": {"value": hard, **hard_info},
        "order": {"chosen": choice.label, "table": order_table},
        "lexicon": {"chunks": lexicon.n_docs, "avgdl": round(lexicon.avgdl, 3)},
        "settings": {
            "positives": settings.positives,
            "negatives": settings.negatives,
            "holdout": settings.holdout,
            "threshold_folds": settings.threshold_folds,
            "threshold_queries": settings.threshold_queries,
            "candidate_k": limit,
            "l2": settings.l2,
            "reranker": with_rerank,
        },
        "seconds": round(time.perf_counter() - started, 2),
    }
    progress(
        f"{index.collection}: order {choice.label}, hard threshold {hard:.3f}, held-out ECE "
        f"{report['held_out']['ece']}"
    )
    return EvidenceCalibration(
        model=model,
        query_model=query_model,
        ranking=choice,
        thresholds=thresholds,
        lexicon=lexicon,
        source="fitted",
        fitted_at=clock(),
        seed=settings.seed,
        report=report,
    )


def _round(value: float | None) -> float | None:
    return None if value is None else round(value, 4)


def calibrate_version(
    search: CandidateSearch,
    registry: IndexRegistry,
    index: ResolvedIndex,
    embedder: Embedder,
    store: VectorStore,
    *,
    settings: CalibrationSettings | None = None,
    with_rerank: bool = False,
    progress: Callable[[str], None] = lambda _line: None,
) -> EvidenceCalibration:
    """Fit the version's calibration and store it with the index (`save_calibration`)."""
    calibration = fit_calibration(
        search,
        index,
        embedder,
        store,
        settings=settings,
        with_rerank=with_rerank,
        progress=progress,
    )
    registry.save_calibration(index.tenant, index.version, calibration.to_json())
    search.forget(index.collection)
    return calibration
