"""The parity gate of a reindex: is the new index version at least as good as the active one?

The same queries run through Retrieve against both versions of the tenant (pinned by version),
are scored by the evaluation harness (`ragcore.quality.metrics.evaluate`) and compared metric
by metric; the switch is refused when any gated metric of the new version falls more than
`tolerance` (absolute) below the old one's. The paired bootstrap of the harness is reported
alongside, for people.

Queries come from the operator (a JSON list of `EvalQuery` objects with judgments for this
tenant's entities, `--parity-queries`) or, by default, are generated from the tenant's own data
as *known-item* queries: a sentence taken from a sampled entity must find that entity. That
needs no labels and catches what breaks a model change in practice: a wrong model file, wrong
prefixes, a tokenizer mismatch, truncation, or a model that is simply worse on this data.
"""

from __future__ import annotations

import random
import re
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from pydantic import BaseModel, ConfigDict, Field, TypeAdapter, ValidationError

from ragcore.quality.dataset import EvalQuery, QueryKind
from ragcore.quality.errors import EvalDataError
from ragcore.quality.metrics import EvalResult, QueryRun, evaluate
from ragcore.quality.significance import compare
from schemas.entities import Entity

_SENTENCE = re.compile(r"[^.!?\n]+[.!?]?")
_WORD = re.compile(r"\w+")


class ParitySettings(BaseModel):
    """How the gate decides."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    tolerance: float = Field(
        default=0.02, ge=0.0, le=1.0, description="Largest allowed drop of a gated metric."
    )
    metrics: tuple[str, ...] = ("recall@5", "mrr@10", "ndcg@5")
    sample: int = Field(default=200, ge=1, description="Known-item queries generated.")
    seed: int = 0
    top_k: int = Field(default=10, ge=1, le=100)
    min_query_words: int = Field(default=6, ge=1)
    max_query_words: int = Field(default=24, ge=1)


@dataclass
class ParityReport:
    """Both versions' scores and the decision."""

    old_version: int
    new_version: int
    queries: int
    source: str
    tolerance: float
    old: dict[str, float | None]
    new: dict[str, float | None]
    deltas: dict[str, float]
    significance: dict[str, dict[str, float]] = field(default_factory=dict)
    failures: list[str] = field(default_factory=list)

    @property
    def passed(self) -> bool:
        """True when no gated metric dropped beyond the tolerance."""
        return not self.failures

    def to_dict(self) -> dict[str, Any]:
        """JSON form."""
        return {
            "passed": self.passed,
            "old_version": self.old_version,
            "new_version": self.new_version,
            "queries": self.queries,
            "source": self.source,
            "tolerance": self.tolerance,
            "old": self.old,
            "new": self.new,
            "deltas": self.deltas,
            "significance": self.significance,
            "failures": self.failures,
        }


def load_queries(path: Path, tenant: str) -> list[EvalQuery]:
    """The answerable queries of `tenant` in a JSON list of `EvalQuery` objects."""
    try:
        queries = TypeAdapter(list[EvalQuery]).validate_json(path.read_bytes())
    except (OSError, ValidationError) as exc:
        raise EvalDataError(f"cannot read parity queries {path}: {exc}") from exc
    mine = [q for q in queries if q.tenant == tenant and q.answerable]
    if not mine:
        raise EvalDataError(f"{path} has no answerable queries for tenant {tenant!r}")
    return mine


def known_item_queries(
    entities: Iterable[Entity], tenant: str, settings: ParitySettings
) -> list[EvalQuery]:
    """Up to `settings.sample` known-item queries: one sentence of a sampled entity each.

    The sample is a reservoir sample (one pass, bounded memory) seeded by `settings.seed`, so
    the same SoR gives the same queries. Sentences shorter than `min_query_words` are skipped;
    longer ones are cut to `max_query_words`.
    """
    rng = random.Random(settings.seed)
    reservoir: list[tuple[str, str]] = []
    seen = 0
    for entity in entities:
        sentences = [
            words
            for words in (_WORD.findall(s) for s in _SENTENCE.findall(entity.content))
            if len(words) >= settings.min_query_words
        ]
        if not sentences:
            continue
        text = " ".join(rng.choice(sentences)[: settings.max_query_words])
        seen += 1
        if len(reservoir) < settings.sample:
            reservoir.append((entity.entity_id, text))
        else:
            slot = rng.randrange(seen)
            if slot < settings.sample:
                reservoir[slot] = (entity.entity_id, text)
    return [
        EvalQuery(
            query_id=f"known-item-{n:05d}",
            text=text,
            tenant=tenant,
            kind=QueryKind.KNOWN_ITEM,
            answerable=True,
            relevant={entity_id: 3},
        )
        for n, (entity_id, text) in enumerate(sorted(reservoir))
    ]


#: Runs one query against one pinned index version and returns the harness's `QueryRun`.
SearchFn = Callable[[EvalQuery, int], QueryRun]


def parity_check(
    queries: Sequence[EvalQuery],
    search: SearchFn,
    *,
    old_version: int,
    new_version: int,
    settings: ParitySettings,
    source: str,
) -> ParityReport:
    """Score `queries` on both versions and decide (see the module docstring)."""
    if not queries:
        raise EvalDataError("the parity gate has no queries to run")
    # interleaved, so under live traffic both versions answer each query over the same data
    runs = [(search(q, old_version), search(q, new_version)) for q in queries]
    old = evaluate(queries, [a for a, _ in runs])
    new = evaluate(queries, [b for _, b in runs])
    report = ParityReport(
        old_version=old_version,
        new_version=new_version,
        queries=len(queries),
        source=source,
        tolerance=settings.tolerance,
        old={m: old.aggregates.get(m) for m in settings.metrics},
        new={m: new.aggregates.get(m) for m in settings.metrics},
        deltas={},
    )
    for metric in settings.metrics:
        before, after = report.old[metric], report.new[metric]
        if before is None or after is None:
            raise EvalDataError(f"metric {metric!r} is not computed by the harness")
        delta = after - before
        report.deltas[metric] = round(delta, 6)
        report.significance[metric] = _paired(old, new, metric)
        if delta < -settings.tolerance:
            report.failures.append(
                f"{metric} fell from {before:.4f} (v{old_version}) to {after:.4f} "
                f"(v{new_version}): {delta:+.4f} is beyond the tolerance {settings.tolerance}"
            )
    return report


def _paired(old: EvalResult, new: EvalResult, metric: str) -> dict[str, float]:
    test = compare(old.metric_values(metric), new.metric_values(metric))
    return {
        "mean_diff": round(test.mean_diff, 6),
        "ci95_low": round(test.ci_low, 6),
        "ci95_high": round(test.ci_high, 6),
        "p_value": round(test.p_value, 6),
    }
