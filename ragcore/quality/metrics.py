"""Ranking, abstention and latency metrics of one evaluation run (pure).

Input: per query, what Retrieve returned (`QueryRun`: status, ranked entity ids, ranked chunk
ids, latency). Output: per-query rows and aggregates (`EvalResult`).

Definitions (k is a cut-off; `ranked` is the entity list de-duplicated keeping first occurrence;
`rel(d)` is the judged grade of entity d, 0 when unjudged; R = the set of entities with grade >= 1):
- recall@k      = |R ∩ ranked[:k]| / |R|
- precision@k   = |R ∩ ranked[:k]| / k  (k, not len(ranked): returning fewer results is no bonus)
- hit@k         = 1 if R ∩ ranked[:k] else 0   (HitRate@1 is hit@1)
- mrr@k         = 1 / rank of the first entity of R within ranked[:k], else 0
- ndcg@k        = DCG@k / IDCG@k with LINEAR gain: DCG@k = Σ_{i=1..k} rel(ranked[i]) / log2(i + 1),
                  IDCG@k the DCG of the judged grades sorted descending. Linear gain is what
                  trec_eval / pytrec_eval (and so published BEIR numbers) use, so BEIR runs are
                  comparable; with binary judgments it equals exponential gain (2^rel - 1).
- chunk_mrr@k   = 1 / rank of `expected_top_chunk` within the de-duplicated chunk list[:k], else 0,
                  over queries that have an expected chunk (the passage-level figure: a chunk of
                  a document is one page, DOCX section or row block, or a piece of one).
- chunk_hit@k   = 1 when `expected_top_chunk` is within the chunk list[:k], else 0 (same queries).
- page_mrr@k    = 1 / rank of `expected_passage` within the de-duplicated passage list[:k], else
                  0, over queries that have an expected passage. A result's passage is its
                  entity and its citation after the file name (`QueryRun.passages`: a PDF page,
                  DOCX section or spreadsheet row block), so two chunks of one page are one
                  passage; unlike a chunk id it survives rechunking. A spreadsheet chunk
                  cites its own rows: rows inside the expected row block are that block
                  (`ragcore.quality.dataset.passage_within`).
- page_hit@k    = 1 when `expected_passage` is within the passage list[:k], else 0 (same queries).
- success_rate  = answerable queries whose status is SUCCESS (a result at or above the hard
                  threshold) / answerable queries: IDENTIFIER_MATCH and NO_EVIDENCE are not.
Ranking metrics are averaged over *answerable* queries only; an answerable query that abstained
or failed counts with an empty ranking (all zeros) — failing must never raise a score.

Abstention (positive class = "the system abstained", i.e. status NO_EVIDENCE):
- abstention_precision = abstentions on unanswerable queries / all abstentions
- abstention_recall    = unanswerable queries that abstained / all unanswerable queries
A FAILED query is not an abstention (it is counted in `failed_rate`). A ratio with a zero
denominator is None (undefined), never a made-up 0 or 1.
How far a threshold *could* go, whatever rule chose it (over the queries that did not fail; a
query's best evidence is its best-scored item's, 0 when nothing was scored):
- abstention_auc = P(an answerable query's best evidence > an unanswerable one's), ties half:
                   how well the evidence score separates the two, independent of the threshold;
- abstention_recall_ceiling = the highest abstention_recall of any one threshold on the best
                   evidence whose abstention precision is >= `CEILING_PRECISION`, chosen on the
                   set itself: a diagnostic bound, never a result (a rule tuned on the set is).

Calibration of the evidence score (`QueryRun.scored`: every entity the pack scored, i.e. the
results and the below-threshold exclusions, with its evidence score; an item is positive when its
entity is judged grade >= `ANSWER_GRADE` for the query, or >= the query's best grade when that is
lower (binary judgments such as BEIR qrels), so every item of an unanswerable query is negative):
- ece       = Σ_b |B_b| / n · |observed positive rate in B_b - mean score in B_b| over
              `CALIBRATION_BINS` equal-width bins of [0, 1], over all scored items;
- ece_top1  = the same over each query's best-scored item only (what abstention decides on);
- `reliability` gives the bins (count, mean score, observed rate) for the reliability plot.

Distinct evidence (`QueryRun.texts`: the text of each result, in rank order):
- near_duplicate_share@5 = top-5 slots whose text is a near-duplicate of a text ranked above it
                           (`ragcore.textsim`: Jaccard of word 3-shingles, numbers masked,
                           >= 0.9) / top-5 slots filled, over every query that returned texts.

Cost of the context step: context_p95_ms = the 95th percentile of the server's `context` stage
time (`QueryRun.context_ms`), over the queries that sent a token budget.

Latency percentiles use linear interpolation between closest ranks (numpy's default "linear"
method, Excel's PERCENTILE.INC) over every query that reports a latency.
"""

from __future__ import annotations

import math
from collections.abc import Container, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from enum import StrEnum
from typing import Any

from ragcore.quality.dataset import EvalQuery, EvalSet, parse_chunk_id, passage_within
from ragcore.quality.errors import EvalError
from ragcore.textsim import duplicate_slots

DEFAULT_KS: tuple[int, ...] = (1, 3, 5, 10)
LATENCY_PERCENTILES: tuple[int, ...] = (50, 95, 99)
#: Per-query ranking metric families; each is reported as "<family>@<k>".
RANKING_FAMILIES: tuple[str, ...] = ("recall", "precision", "hit", "mrr", "ndcg")
#: Judged grade from which a scored item counts as answering the query (calibration metrics).
ANSWER_GRADE = 2
CALIBRATION_BINS = 10
#: The cut-off of the near-duplicate share.
DUPLICATE_K = 5
#: Abstention precision at which `abstention_recall_ceiling` is read (issue 26's criterion).
CEILING_PRECISION = 0.85


class Status(StrEnum):
    """Outcome of one Retrieve call (the evidence pack status, without the proto prefix)."""

    SUCCESS = "SUCCESS"
    NO_EVIDENCE = "NO_EVIDENCE"
    FAILED = "FAILED"
    #: results kept only for an identifier of the query, none at the hard threshold
    IDENTIFIER_MATCH = "IDENTIFIER_MATCH"

    @property
    def has_results(self) -> bool:
        """The pack lists results the metrics rank (SUCCESS or IDENTIFIER_MATCH): the eval
        scores what a caller is shown; only NO_EVIDENCE is an abstention."""
        return self in (Status.SUCCESS, Status.IDENTIFIER_MATCH)

    @classmethod
    def parse(cls, value: str) -> Status:
        """Accept 'SUCCESS' or the proto enum name 'RETRIEVAL_STATUS_SUCCESS' (any case)."""
        name = value.strip().upper().removeprefix("RETRIEVAL_STATUS_")
        try:
            return cls(name)
        except ValueError:
            raise ValueError(f"unknown retrieval status {value!r}") from None


@dataclass(frozen=True)
class QueryRun:
    """What the system returned for one query: the runner's only input to the metrics.

    `entity_ids` and `chunk_ids` are in rank order (best first) and may repeat; use
    `from_chunk_ids` when only chunk ids are at hand. `latency_ms` is the client-side wall time.
    `scored` holds (entity id, evidence score) of every entity the pack scored (results first,
    then below-threshold exclusions), for the calibration metrics. `texts` are the results'
    texts in rank order (for the near-duplicate share; empty when not collected);
    `context_ms` the server's time of the context (token budget) stage, when it ran.
    `passages` are the results' passage ids in rank order (`ragcore.quality.dataset.passage_id`:
    entity and citation locator), empty when not collected.
    """

    query_id: str
    status: Status
    entity_ids: tuple[str, ...] = ()
    chunk_ids: tuple[str, ...] = ()
    latency_ms: float | None = None
    error_code: str | None = None
    scored: tuple[tuple[str, float], ...] = ()
    texts: tuple[str, ...] = ()
    context_ms: float | None = None
    passages: tuple[str, ...] = ()

    @classmethod
    def from_chunk_ids(
        cls,
        query_id: str,
        status: Status | str,
        chunk_ids: Iterable[str],
        *,
        latency_ms: float | None = None,
        error_code: str | None = None,
    ) -> QueryRun:
        """A run whose entity ranking is derived from `<entity_id>:chunk:<n>` chunk ids."""
        chunks = tuple(chunk_ids)
        return cls(
            query_id=query_id,
            status=status if isinstance(status, Status) else Status.parse(status),
            entity_ids=tuple(parse_chunk_id(c)[0] for c in chunks),
            chunk_ids=chunks,
            latency_ms=latency_ms,
            error_code=error_code,
        )


def dedup(ids: Iterable[str]) -> list[str]:
    """`ids` without repeats, keeping each id's first (best) position."""
    return list(dict.fromkeys(ids))


# --- per-query metrics -----------------------------------------------------------------------


def recall_at(ranked: Sequence[str], relevant: Mapping[str, int], k: int) -> float:
    """|relevant ∩ ranked[:k]| / |relevant| (ranked already de-duplicated)."""
    _check_k(k)
    if not relevant:
        raise ValueError("recall is undefined without relevant entities")
    return sum(1 for d in ranked[:k] if relevant.get(d, 0) > 0) / len(relevant)


def precision_at(ranked: Sequence[str], relevant: Mapping[str, int], k: int) -> float:
    """|relevant ∩ ranked[:k]| / k (ranked already de-duplicated)."""
    _check_k(k)
    return sum(1 for d in ranked[:k] if relevant.get(d, 0) > 0) / k


def hit_at(ranked: Sequence[str], relevant: Mapping[str, int], k: int) -> float:
    """1.0 when some relevant entity is in ranked[:k], else 0.0."""
    _check_k(k)
    return 1.0 if any(relevant.get(d, 0) > 0 for d in ranked[:k]) else 0.0


def reciprocal_rank_at(ranked: Sequence[str], targets: Container[str], k: int) -> float:
    """1 / (1-based rank of the first target within ranked[:k]), 0.0 when none is there.

    `targets` may be the `relevant` mapping (its keys: grades are >= 1) or a set of chunk ids.
    """
    _check_k(k)
    for rank, item in enumerate(ranked[:k], start=1):
        if item in targets:
            return 1.0 / rank
    return 0.0


def dcg(gains: Sequence[int | float]) -> float:
    """Σ_i gain_i / log2(i + 1), i 1-based (linear gain: the grade itself)."""
    return sum(g / math.log2(i + 1) for i, g in enumerate(gains, start=1))


def ndcg_at(ranked: Sequence[str], relevant: Mapping[str, int], k: int) -> float:
    """DCG@k / IDCG@k with linear gains (see the module docstring)."""
    _check_k(k)
    ideal = dcg(sorted(relevant.values(), reverse=True)[:k])
    if ideal <= 0:
        raise ValueError("nDCG is undefined without relevant entities")
    return dcg([relevant.get(d, 0) for d in ranked[:k]]) / ideal


def percentile(values: Sequence[float], q: float) -> float:
    """The q-th percentile (0..100) with linear interpolation between closest ranks."""
    if not values:
        raise ValueError("percentile of no values")
    if not 0 <= q <= 100:
        raise ValueError(f"percentile must be in [0, 100], got {q}")
    ordered = sorted(values)
    position = (len(ordered) - 1) * q / 100
    low = math.floor(position)
    high = min(low + 1, len(ordered) - 1)
    return ordered[low] + (ordered[high] - ordered[low]) * (position - low)


def _check_k(k: int) -> None:
    if k < 1:
        raise ValueError(f"k must be >= 1, got {k}")


# --- rows and aggregates ---------------------------------------------------------------------


@dataclass(frozen=True)
class QueryRow:
    """Everything measured for one query (for diagnosis and significance tests)."""

    query_id: str
    kind: str
    tenant: str
    answerable: bool
    status: Status
    abstained: bool
    latency_ms: float | None
    returned: int  # distinct entities returned
    first_relevant_rank: int | None  # 1-based, in the de-duplicated entity list; None if absent
    expected_chunk_rank: int | None  # 1-based, None when absent or not judged
    hard_negative_above_relevant: bool | None  # None when the query has no hard negatives
    metrics: dict[str, float] = field(default_factory=dict)  # empty for unanswerable queries
    top_entities: tuple[str, ...] = ()
    #: (evidence score, 1 if the entity answers else 0) per scored entity, best-scored first
    calibration: tuple[tuple[float, int], ...] = ()
    #: (top-5 slots held by a near-duplicate of a better result, top-5 slots with a text)
    duplicate_slots: tuple[int, int] = (0, 0)
    context_ms: float | None = None
    expected_passage_rank: int | None = None  # 1-based, None when absent or not judged
    top_passages: tuple[str, ...] = ()

    def to_dict(self) -> dict[str, Any]:
        """JSON-serializable form."""
        return {
            "query_id": self.query_id,
            "kind": self.kind,
            "tenant": self.tenant,
            "answerable": self.answerable,
            "status": self.status.value,
            "abstained": self.abstained,
            "latency_ms": self.latency_ms,
            "returned": self.returned,
            "first_relevant_rank": self.first_relevant_rank,
            "expected_chunk_rank": self.expected_chunk_rank,
            "expected_passage_rank": self.expected_passage_rank,
            "hard_negative_above_relevant": self.hard_negative_above_relevant,
            "metrics": dict(self.metrics),
            "top_entities": list(self.top_entities),
            "top_passages": list(self.top_passages),
            "best_evidence": self.calibration[0][0] if self.calibration else None,
            "near_duplicate_slots@5": self.duplicate_slots[0],
        }


@dataclass(frozen=True)
class EvalResult:
    """Per-query rows plus aggregates, overall and per query kind."""

    rows: tuple[QueryRow, ...]
    aggregates: dict[str, float | None]
    by_kind: dict[str, dict[str, float | None]]
    ks: tuple[int, ...]

    def row(self, query_id: str) -> QueryRow:
        """The row of one query (KeyError when absent)."""
        for row in self.rows:
            if row.query_id == query_id:
                return row
        raise KeyError(query_id)

    def metric_values(self, metric: str) -> dict[str, float]:
        """query_id -> value of a per-query metric, over the rows that have it."""
        return {r.query_id: r.metrics[metric] for r in self.rows if metric in r.metrics}

    def to_dict(self) -> dict[str, Any]:
        """JSON-serializable form."""
        return {
            "ks": list(self.ks),
            "aggregates": dict(self.aggregates),
            "by_kind": {kind: dict(values) for kind, values in self.by_kind.items()},
            "rows": [row.to_dict() for row in self.rows],
        }


def evaluate_query(query: EvalQuery, run: QueryRun, ks: Sequence[int] = DEFAULT_KS) -> QueryRow:
    """Score one query's run (see the module docstring for the definitions)."""
    if run.query_id != query.query_id:
        raise EvalError(f"run of {run.query_id!r} scored against query {query.query_id!r}")
    succeeded = run.status.has_results
    # Only a pack with results carries them; anything listed on NO_EVIDENCE/FAILED is ignored.
    ranked = dedup(run.entity_ids) if succeeded else []
    chunks = dedup(run.chunk_ids) if succeeded else []
    expected_passage = query.expected_passage
    passages = (
        dedup(
            expected_passage
            if expected_passage is not None and passage_within(p, expected_passage)
            else p
            for p in run.passages
        )
        if succeeded
        else []
    )
    relevant = query.relevant
    metrics: dict[str, float] = {}
    first_relevant: int | None = None
    chunk_rank: int | None = None
    passage_rank: int | None = None
    if query.answerable:
        for k in ks:
            metrics[f"recall@{k}"] = recall_at(ranked, relevant, k)
            metrics[f"precision@{k}"] = precision_at(ranked, relevant, k)
            metrics[f"hit@{k}"] = hit_at(ranked, relevant, k)
            metrics[f"mrr@{k}"] = reciprocal_rank_at(ranked, relevant, k)
            metrics[f"ndcg@{k}"] = ndcg_at(ranked, relevant, k)
        first_relevant = next(
            (i for i, d in enumerate(ranked, start=1) if relevant.get(d, 0) > 0), None
        )
        if query.expected_top_chunk is not None:
            for k in ks:
                metrics[f"chunk_mrr@{k}"] = reciprocal_rank_at(
                    chunks, {query.expected_top_chunk}, k
                )
                metrics[f"chunk_hit@{k}"] = 1.0 if query.expected_top_chunk in chunks[:k] else 0.0
            if query.expected_top_chunk in chunks:
                chunk_rank = chunks.index(query.expected_top_chunk) + 1
        if query.expected_passage is not None:
            for k in ks:
                metrics[f"page_mrr@{k}"] = reciprocal_rank_at(passages, {query.expected_passage}, k)
                metrics[f"page_hit@{k}"] = 1.0 if query.expected_passage in passages[:k] else 0.0
            if query.expected_passage in passages:
                passage_rank = passages.index(query.expected_passage) + 1
    negative_above: bool | None = None
    if query.hard_negatives:
        negatives = set(query.hard_negatives)
        first_negative = next((i for i, d in enumerate(ranked, start=1) if d in negatives), None)
        negative_above = first_negative is not None and (
            first_relevant is None or first_negative < first_relevant
        )
    scored: dict[str, float] = {}
    for entity_id, score in run.scored:
        scored.setdefault(entity_id, score)
    # binary judgments (BEIR qrels: grade 1 = relevant) count their relevant entities as answers
    answer_grade = min(ANSWER_GRADE, max(relevant.values(), default=ANSWER_GRADE))
    calibration = tuple(
        sorted(
            (
                (score, 1 if relevant.get(e, 0) >= answer_grade else 0)
                for e, score in scored.items()
            ),
            key=lambda item: -item[0],
        )
    )
    texts = list(run.texts) if succeeded else []
    slots = (duplicate_slots(texts, DUPLICATE_K), min(len(texts), DUPLICATE_K)) if texts else (0, 0)
    return QueryRow(
        query_id=query.query_id,
        kind=query.kind.value,
        tenant=query.tenant,
        answerable=query.answerable,
        status=run.status,
        abstained=run.status is Status.NO_EVIDENCE,
        latency_ms=run.latency_ms,
        returned=len(ranked),
        first_relevant_rank=first_relevant,
        expected_chunk_rank=chunk_rank,
        hard_negative_above_relevant=negative_above,
        metrics=metrics,
        top_entities=tuple(ranked[: max(ks)]),
        top_passages=tuple(passages[: max(ks)]),
        calibration=calibration,
        duplicate_slots=slots,
        context_ms=run.context_ms,
        expected_passage_rank=passage_rank,
    )


def evaluate(
    evalset: EvalSet | Sequence[EvalQuery],
    runs: Mapping[str, QueryRun] | Iterable[QueryRun],
    ks: Sequence[int] = DEFAULT_KS,
) -> EvalResult:
    """Score every query of the set; EvalError when runs are missing, unknown or repeated."""
    queries = evalset.queries if isinstance(evalset, EvalSet) else tuple(evalset)
    ks = tuple(sorted(set(ks)))
    if not ks or ks[0] < 1:
        raise EvalError(f"cut-offs must be >= 1, got {ks}")
    by_id = _runs_by_id(runs)
    known = {q.query_id for q in queries}
    missing = [q.query_id for q in queries if q.query_id not in by_id]
    unknown = sorted(set(by_id) - known)
    if missing or unknown:
        raise EvalError(f"runs do not match the queries: missing {missing}, unknown {unknown}")
    rows = tuple(evaluate_query(q, by_id[q.query_id], ks) for q in queries)
    by_kind = {
        kind: aggregate([r for r in rows if r.kind == kind], ks)
        for kind in sorted({r.kind for r in rows})
    }
    return EvalResult(rows=rows, aggregates=aggregate(rows, ks), by_kind=by_kind, ks=ks)


def _runs_by_id(runs: Mapping[str, QueryRun] | Iterable[QueryRun]) -> dict[str, QueryRun]:
    if isinstance(runs, Mapping):
        for key, run in runs.items():
            if key != run.query_id:
                raise EvalError(f"run under key {key!r} is for query {run.query_id!r}")
        return dict(runs)
    by_id: dict[str, QueryRun] = {}
    for run in runs:
        if run.query_id in by_id:
            raise EvalError(f"two runs for query {run.query_id!r}")
        by_id[run.query_id] = run
    return by_id


def _mean(values: Sequence[float]) -> float | None:
    return sum(values) / len(values) if values else None


def _ratio(numerator: int, denominator: int) -> float | None:
    return numerator / denominator if denominator else None


def aggregate(rows: Sequence[QueryRow], ks: Sequence[int] = DEFAULT_KS) -> dict[str, float | None]:
    """Aggregate metrics of `rows` (ranking means over answerable rows; None when undefined)."""
    answerable = [r for r in rows if r.answerable]
    unanswerable = [r for r in rows if not r.answerable]
    abstained = [r for r in rows if r.abstained]
    out: dict[str, float | None] = {
        "n_queries": float(len(rows)),
        "n_answerable": float(len(answerable)),
        "n_unanswerable": float(len(unanswerable)),
    }
    for family in RANKING_FAMILIES:
        for k in ks:
            name = f"{family}@{k}"
            out[name] = _mean([r.metrics[name] for r in answerable])
    with_chunk = [r for r in answerable if any(m.startswith("chunk_mrr@") for m in r.metrics)]
    out["n_expected_chunk"] = float(len(with_chunk))
    for k in ks:
        out[f"chunk_mrr@{k}"] = _mean([r.metrics[f"chunk_mrr@{k}"] for r in with_chunk])
        out[f"chunk_hit@{k}"] = _mean([r.metrics[f"chunk_hit@{k}"] for r in with_chunk])
    with_passage = [r for r in answerable if any(m.startswith("page_mrr@") for m in r.metrics)]
    out["n_expected_passage"] = float(len(with_passage))
    for k in ks:
        out[f"page_mrr@{k}"] = _mean([r.metrics[f"page_mrr@{k}"] for r in with_passage])
        out[f"page_hit@{k}"] = _mean([r.metrics[f"page_hit@{k}"] for r in with_passage])
    out["success_rate"] = _ratio(
        sum(1 for r in answerable if r.status is Status.SUCCESS), len(answerable)
    )
    correct_abstentions = sum(1 for r in abstained if not r.answerable)
    out["abstention_precision"] = _ratio(correct_abstentions, len(abstained))
    out["abstention_recall"] = _ratio(correct_abstentions, len(unanswerable))
    best = [
        (r.calibration[0][0] if r.calibration else 0.0, r.answerable)
        for r in rows
        if r.status is not Status.FAILED
    ]
    out["abstention_auc"] = _separation(best)
    out["abstention_recall_ceiling"] = _recall_ceiling(best, len(unanswerable), CEILING_PRECISION)
    out["abstention_rate"] = _ratio(len(abstained), len(rows))
    out["false_abstention_rate"] = _ratio(
        sum(1 for r in answerable if r.abstained), len(answerable)
    )
    out["failed_rate"] = _ratio(sum(1 for r in rows if r.status is Status.FAILED), len(rows))
    out["identifier_match_rate"] = _ratio(
        sum(1 for r in rows if r.status is Status.IDENTIFIER_MATCH), len(rows)
    )
    with_negatives = [r for r in rows if r.hard_negative_above_relevant is not None]
    out["hard_negative_rate"] = _ratio(
        sum(1 for r in with_negatives if r.hard_negative_above_relevant), len(with_negatives)
    )
    items = [item for r in rows for item in r.calibration]
    out["n_scored"] = float(len(items))
    out["ece"] = expected_calibration_error([p for p, _ in items], [y for _, y in items])
    tops = [r.calibration[0] for r in rows if r.calibration]
    out["ece_top1"] = expected_calibration_error([p for p, _ in tops], [y for _, y in tops])
    out[f"near_duplicate_share@{DUPLICATE_K}"] = _ratio(
        sum(r.duplicate_slots[0] for r in rows), sum(r.duplicate_slots[1] for r in rows)
    )
    context = [r.context_ms for r in rows if r.context_ms is not None]
    out["context_p95_ms"] = percentile(context, 95) if context else None
    latencies = [r.latency_ms for r in rows if r.latency_ms is not None]
    for q in LATENCY_PERCENTILES:
        out[f"latency_p{q}_ms"] = percentile(latencies, q) if latencies else None
    out["latency_mean_ms"] = _mean(latencies)
    out["latency_max_ms"] = max(latencies) if latencies else None
    return out


def _separation(best: Sequence[tuple[float, bool]]) -> float | None:
    """ROC AUC of the best evidence, answerable (positive) vs unanswerable (ties count half)."""
    pos = [b for b, answerable in best if answerable]
    neg = [b for b, answerable in best if not answerable]
    if not pos or not neg:
        return None
    wins = sum((p > n) + 0.5 * (p == n) for p in pos for n in neg)
    return wins / (len(pos) * len(neg))


def _recall_ceiling(
    best: Sequence[tuple[float, bool]], negatives: int, precision: float
) -> float | None:
    """The best abstention recall (of `negatives`, every unanswerable query, as
    `abstention_recall`) over every threshold (abstain below it) with at least `precision`; 0
    when none reaches it, None without unanswerable queries."""
    if not negatives:
        return None
    ceiling = 0.0
    for t in sorted({b for b, _ in best} | {math.inf}):
        correct = sum(1 for b, answerable in best if b < t and not answerable)
        wrong = sum(1 for b, answerable in best if b < t and answerable)
        if correct and correct / (correct + wrong) >= precision:
            ceiling = max(ceiling, correct / negatives)
    return ceiling


# --- calibration -----------------------------------------------------------------------------


@dataclass(frozen=True)
class ReliabilityBin:
    """One bin of a reliability diagram: [low, high), its items, mean score, observed rate."""

    low: float
    high: float
    count: int
    mean_score: float | None
    observed: float | None

    def to_dict(self) -> dict[str, Any]:
        """JSON-serializable form."""
        return {
            "low": self.low,
            "high": self.high,
            "count": self.count,
            "mean_score": self.mean_score,
            "observed": self.observed,
        }


def reliability_bins(
    scores: Sequence[float], labels: Sequence[float], bins: int = CALIBRATION_BINS
) -> list[ReliabilityBin]:
    """Equal-width bins of [0, 1] (the last one closed) with the items' mean score and observed
    positive rate (None for an empty bin)."""
    if len(scores) != len(labels):
        raise ValueError("scores and labels differ in length")
    if bins < 1:
        raise ValueError(f"bins must be >= 1, got {bins}")
    groups: list[list[tuple[float, float]]] = [[] for _ in range(bins)]
    for score, label in zip(scores, labels, strict=True):
        if not 0.0 <= score <= 1.0:
            raise ValueError(f"a calibrated score must be within [0, 1], got {score}")
        groups[min(int(score * bins), bins - 1)].append((score, float(label)))
    out = []
    for b, group in enumerate(groups):
        n = len(group)
        out.append(
            ReliabilityBin(
                low=b / bins,
                high=(b + 1) / bins,
                count=n,
                mean_score=sum(s for s, _ in group) / n if n else None,
                observed=sum(y for _, y in group) / n if n else None,
            )
        )
    return out


def expected_calibration_error(
    scores: Sequence[float], labels: Sequence[float], bins: int = CALIBRATION_BINS
) -> float | None:
    """Σ_b |B_b| / n · |observed rate - mean score| over equal-width bins; None without items."""
    if not scores:
        return None
    total = len(scores)
    return sum(
        b.count / total * abs((b.observed or 0.0) - (b.mean_score or 0.0))
        for b in reliability_bins(scores, labels, bins)
        if b.count
    )


def result_reliability(result: EvalResult, bins: int = CALIBRATION_BINS) -> list[ReliabilityBin]:
    """The reliability bins of every scored item of a run."""
    items = [item for r in result.rows for item in r.calibration]
    return reliability_bins([p for p, _ in items], [y for _, y in items], bins)
