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
5. *Choose*, on the held-out queries: the result order (fusions of the cosine and BM25 and the
   evidence score itself, by nDCG@10 of the positives; the configured fusion, convex 0.5/0.5
   by default, is kept unless another order is better with paired-bootstrap p < 0.05) and the
   hard threshold (the highest balanced accuracy of abstention, with at most
   `max_false_abstention` of the positives abstaining).
The report holds the held-out expected calibration error, abstention precision/recall and the
order table. The same index, settings and seed give the same calibration (`fingerprint`).
"""

from __future__ import annotations

import math
import time
from collections import Counter
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field, replace
from datetime import UTC, datetime
from typing import Any

import numpy as np
from numpy.typing import NDArray

from ragcore.embedders.base import Embedder
from ragcore.quality.metrics import expected_calibration_error
from ragcore.quality.significance import compare
from ragcore.sparse import LexiconStats
from ragcore.store.base import CHUNK_ID, ENTITY_ID, StoreFilter, VectorStore
from ragcore.store.registry import IndexRegistry, ResolvedIndex
from retrieval_api.candidates import CandidateSearch, RawPool, finish, pool_evidence
from retrieval_api.evidence_score import (
    CHUNK_FEATURES,
    QUERY_FEATURES,
    RERANK_FEATURE,
    EvidenceCalibration,
    EvidenceThresholds,
    LogisticModel,
    RankingChoice,
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
    significance: float = 0.05
    choices: tuple[RankingChoice, ...] = ORDER_CHOICES


@dataclass
class _Example:
    query: CalibrationQuery
    raw: RawPool
    labels: list[float | None]
    train: bool = True


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


def _query_rows(
    examples: Sequence[_Example], names: Sequence[str]
) -> tuple[NDArray[np.float64], NDArray[np.float64]]:
    xs = [feature_matrix(e.raw.query, e.raw.signals[:1], names) for e in examples if len(e.raw)]
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
        x = feature_matrix(e.raw.query, e.raw.signals, names)
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
    """The order with the largest significant gain over the baseline (`settings.choices[0]`)
    in nDCG@10 of the answerable queries, or the baseline.

    A fusion has no fitted parameter, so fusions are compared on every answerable query
    (training and held-out: ~2x the held-out share's power); the evidence order uses the model
    fitted on the training queries and is compared on the held-out ones only. Identifier
    queries are left out: the identifier rule orders them, not the fusion, and their exact
    tokens would tilt the choice to the lexical channel (issue 26 item 5).
    """
    per_choice: list[dict[str, float]] = []
    for choice in settings.choices:
        values: dict[str, float] = {}
        for n, e in enumerate(examples):
            if not e.query.answerable or e.query.kind == "identifier":
                continue
            if choice.order == "evidence" and e.train:
                continue
            pool = finish(e.raw, calibration, choice)
            value = _ndcg10(e, [h.score for h in pool.hits], protect)
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
            if test.p_value < settings.significance and test.mean_diff > best_gain:
                best, best_gain = i, test.mean_diff
        table.append(row)
    return settings.choices[best], table


def _max_evidence(examples: Sequence[_Example], calibration: EvidenceCalibration) -> list[float]:
    out = []
    for e in examples:
        evidence = pool_evidence(e.raw, calibration)
        out.append(max(evidence, default=0.0))
    return out


def _choose_hard(
    best: Sequence[float], answerable: Sequence[bool], max_false: float
) -> tuple[float, dict[str, Any]]:
    positives = sum(answerable)
    negatives = len(answerable) - positives
    if not positives or not negatives:
        return 0.5, {"reason": "held-out queries lack a class: 0.5"}
    candidates = sorted({round(v, 4) for v in best} | {0.5})
    chosen, chosen_score = 0.0, -1.0
    for t in candidates:
        false_abstain = sum(1 for b, a in zip(best, answerable, strict=True) if a and b < t)
        true_abstain = sum(1 for b, a in zip(best, answerable, strict=True) if not a and b < t)
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
    limit = candidate_k or search.config.candidate_k(settings.top_k)
    tenant_filter = StoreFilter(tenant_id=index.tenant)
    examples: list[_Example] = []
    for n, query in enumerate(queries):
        vector = embedder.embed_query(query.text)
        raw = search.gather(
            index.collection,
            query.text,
            vector,
            tenant_filter,
            limit=limit,
            lexicon=lexicon,
            with_rerank=with_rerank,
        )
        examples.append(_Example(query, raw, label_pool(query, raw)))
        if (n + 1) % 100 == 0:
            progress(f"{index.collection}: {n + 1}/{len(queries)} calibration queries")
    _split(examples, settings.holdout, settings.seed)
    train = [e for e in examples if e.train]
    held = [e for e in examples if not e.train]
    names = (*CHUNK_FEATURES, RERANK_FEATURE) if with_rerank else CHUNK_FEATURES
    x, y = _rows([e for e in train if e.query.answerable], names)
    model: LogisticModel = fit_logistic(x, y, names, l2=settings.l2)
    qx, qy = _query_rows(train, QUERY_FEATURES)
    query_model = fit_logistic(qx, qy, QUERY_FEATURES, l2=settings.l2)
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
    choice, order_table = _choose_order(examples, draft, settings, protect)
    # a positive whose answer is not among the candidates has no evidence to lose: the threshold
    # is chosen on the queries with an answer in the pool and on the negatives
    decidable = [e for e in held if not e.query.answerable or 1.0 in e.labels]
    best = _max_evidence(decidable, draft)
    answerable = [e.query.answerable for e in decidable]
    hard, hard_info = _choose_hard(best, answerable, settings.max_false_abstention)
    thresholds = EvidenceThresholds(
        hard, max(hard, MEDIUM_EVIDENCE), max(hard, MEDIUM_EVIDENCE, HIGH_EVIDENCE)
    )
    held_p: list[float] = []
    held_y: list[float] = []
    for e in held:
        for p, label in zip(pool_evidence(e.raw, draft), e.labels, strict=True):
            if label is not None:
                held_p.append(p)
                held_y.append(label)
    report: dict[str, Any] = {
        "queries": {
            "total": len(queries),
            "by_kind": dict(sorted(Counter(q.kind for q in queries).items())),
            "train": len(train),
            "held_out": len(held),
        },
        "rows": {
            "chunk_model": len(y),
            "chunk_model_positive": int(y.sum()),
            "query_model": len(qy),
            "held_out": len(held_y),
        },
        "held_out": {
            "ece": _round(expected_calibration_error(held_p, held_y)),
            "abstention": _abstention(best, answerable, hard),
            "hard_threshold": hard_info,
        },
        "order": {"chosen": choice.label, "table": order_table},
        "lexicon": {"chunks": lexicon.n_docs, "avgdl": round(lexicon.avgdl, 3)},
        "settings": {
            "positives": settings.positives,
            "negatives": settings.negatives,
            "holdout": settings.holdout,
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
