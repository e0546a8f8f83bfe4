"""Settings of the Retrieve pipeline: request bounds, candidate over-fetch, fusion, thresholds.

Everything a request may not override lives here (docs/decisions/retrieval-contract.md); the only
request-side knob is
`min_similarity_override` (the hard threshold on the evidence score), checked against
`min_similarity_override_min/max`.
"""

from __future__ import annotations

import math
import re
from typing import Literal, Self

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

from ragcore.fusion import FusionMethod
from ragcore.store.base import CHUNK_ID, ENTITY_ID, ENTITY_TYPE, EVENT_DATE, TENANT_ID
from retrieval_api.ranking import Order, ScoreKind, Thresholds

#: How a keyword filter field's values are typed in the payload (and parsed from the request).
KeywordKind = Literal["keyword", "integer", "bool"]

# Fields with their own filter (or none at all): never a configurable keyword filter.
_RESERVED_FIELDS = frozenset({TENANT_ID, CHUNK_ID, ENTITY_ID, ENTITY_TYPE, EVENT_DATE})
_FIELD_NAME_RE = re.compile(r"^[A-Za-z_][A-Za-z0-9_]{0,63}$")


class ThresholdConfig(BaseModel):
    """Hard and soft thresholds on one kind of calibrated score."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    hard: float = Field(description="Below it a chunk is excluded (BELOW_THRESHOLD).")
    medium: float = Field(description="At or above: confidence MEDIUM (else LOW).")
    high: float = Field(description="At or above: confidence HIGH.")

    @model_validator(mode="after")
    def _ordered(self) -> Self:
        # Thresholds builds the same checks; failing here names the setting at load time.
        Thresholds(self.hard, self.medium, self.high)
        return self


class RetrievalConfig(BaseModel):
    """Deployment settings of the Retrieve pipeline (defaults suit all-MiniLM-L6-v2 cosine)."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    # --- request bounds ---
    max_query_chars: int = Field(default=2000, ge=1, le=100_000, description="After trim and NFC.")
    default_top_k: int = Field(default=5, ge=1)
    max_top_k: int = Field(default=50, ge=1, le=1000)
    max_request_id_chars: int = Field(default=128, ge=8, le=1024)
    max_context_tokens: int = Field(
        default=32768,
        ge=1,
        le=1_000_000,
        description="Largest token budget a request may ask for (`max_context_tokens`).",
    )
    query_cache_entries: int = Field(
        default=4096,
        ge=0,
        le=1_000_000,
        description="Query vectors kept per (tenant, model, query) so a repeated question is "
        "not embedded again; 0: off.",
    )

    # --- candidates and fusion ---
    candidate_multiplier: int = Field(
        default=4, ge=1, le=100, description="candidate_k = top_k x this."
    )
    max_candidate_k: int = Field(default=200, ge=1, le=10_000, description="Cap on candidate_k.")
    hybrid: bool = Field(default=True, description="Run the sparse (BM25-style) branch and fuse.")
    # convex 0.5 / 0.5: the best fixed order on the golden, man-page and FAQ sets (README)
    fusion_method: FusionMethod = Field(
        default="convex",
        description="rrf, convex (min-max) or dbsf (mean +- 3 sd), over the cosine and exact "
        "BM25 of every candidate; used when `order` is `fused`.",
    )
    dense_weight: float = Field(
        default=0.5, ge=0, allow_inf_nan=False, description="0: no dense candidates."
    )
    sparse_weight: float = Field(
        default=0.5, ge=0, allow_inf_nan=False, description="0: no sparse candidates."
    )
    rrf_k: float = Field(default=60.0, ge=0, allow_inf_nan=False)
    identifier_search: bool = Field(
        default=True,
        description="Also fetch the chunks that contain an identifier of the query (error "
        "code, ticket or part number) that occurs in the index.",
    )

    # --- ranking ---
    dedup_per_entity: bool = Field(
        default=True,
        description="One result per entity (its chunk with the best evidence, in the entity's "
        "place), unless another chunk cites another part of a document or answers by itself "
        "(`distinct_document_parts`, `answering_chunks`).",
    )
    passage_lead: Literal["evidence", "order"] = Field(
        default="evidence",
        description="Which chunk of an entity is its result: `evidence` = the one holding most "
        "of the query's identifiers, then with the best evidence score; `order` = the entity's "
        "first chunk in the result order (the behaviour before issue 43).",
    )
    distinct_document_parts: bool = Field(
        default=True,
        description="Chunks of different pages, DOCX sections or row blocks of one document "
        "are distinct passages, never each other's duplicates (unless their texts are: "
        "near-duplicate collapse).",
    )
    answering_chunks: bool = Field(
        default=True,
        description="A further chunk of an entity that reaches the hard evidence threshold by "
        "itself is a result of its own (not a duplicate).",
    )
    # calibrated: the configured fusion unless the index's calibration queries show another
    # order better (docs/decisions/fusion-weights-from-held-out-evidence.md)
    order: Order = Field(
        default="calibrated",
        description=(
            "Result order: `fused` = `fusion_method` with these weights over the cosine and "
            "exact BM25 of every candidate; `calibrated` = that fusion unless the index's "
            "calibration found another order better on its self-supervised queries (paired "
            "bootstrap p < 0.05; an uncalibrated index uses the fusion); `evidence` "
            "(or `final`) = the evidence score. Thresholds and confidence always use the "
            "evidence score."
        ),
    )
    identifier_priority: bool = Field(
        default=True,
        description="Chunks holding an identifier of the query rank first and are never "
        "excluded as below threshold.",
    )
    explanations_first: bool = Field(
        default=True,
        description="Among chunks holding as many of the query's identifiers, those that "
        "explain one (a definition, an error-code table row, a release note's fix) rank before "
        "chunks that only repeat it (a ticket quoting the code).",
    )
    near_duplicate_collapse: bool = Field(
        default=True,
        description="Collapse results whose texts are the same or nearly the same into the best "
        "of them, which lists the others (`also_in`).",
    )
    near_duplicate_similarity: float = Field(
        default=0.9,
        gt=0.0,
        le=1.0,
        allow_inf_nan=False,
        description="Jaccard similarity of word 3-shingles (numbers masked) from which two "
        "chunk texts are near-duplicates.",
    )
    diversity: bool = Field(
        default=True,
        description="Reorder the best results by maximal marginal relevance so the top k do "
        "not repeat one fact (within the identifier tiers).",
    )
    diversity_lambda: float = Field(
        default=0.7,
        ge=0.0,
        le=1.0,
        allow_inf_nan=False,
        description="MMR trade-off: 1 = relevance only (no diversity), 0 = diversity only.",
    )
    rerank_enabled: bool = False
    evidence_thresholds: ThresholdConfig | None = Field(
        default=None,
        description="Thresholds on the evidence score (a probability); None: those the "
        "index's calibration chose.",
    )
    supporting_ratio: float = Field(
        default=0.1,
        ge=0.0,
        le=1.0,
        allow_inf_nan=False,
        description="Once a chunk reaches the hard evidence threshold, further chunks are kept "
        "down to hard x this (supporting evidence); 1 = every chunk needs the hard threshold.",
    )
    calibration_reload_s: float = Field(
        default=5.0,
        ge=0,
        allow_inf_nan=False,
        description="How long a loaded calibration is used before the registry is read again.",
    )
    warm_calibrations: Literal["none", "dedicated", "all"] = Field(
        default="dedicated",
        description="At start, load in the background the evidence calibration of each active "
        "index version with a collection of its own (dedicated: the large tenants; all: shared "
        "tenants too), so a first request does not wait for it (an uncalibrated 100k-chunk "
        "index's prior counts all its texts: ~13 s on 2 cores). none: on first request.",
    )
    # Legacy score kinds (a cosine or a reranker's score as the final score); the pipeline
    # thresholds the evidence score. hard 0.30: the cosine cut of the seed's golden-set floor.
    cosine_thresholds: ThresholdConfig = ThresholdConfig(hard=0.30, medium=0.40, high=0.60)
    # Rerankers are expected to report a relevance probability in [0, 1] (sigmoid of the logit).
    rerank_thresholds: ThresholdConfig = ThresholdConfig(hard=0.10, medium=0.50, high=0.80)
    min_similarity_override_min: float = Field(
        default=0.0, description="Lowest hard threshold allowed."
    )
    min_similarity_override_max: float = Field(
        default=0.95, description="Highest hard threshold allowed."
    )

    # --- filters ---
    keyword_filter_fields: dict[str, KeywordKind] = Field(
        default_factory=dict,
        description="Payload fields a request may filter on (e.g. equipment_id) and their type.",
    )
    max_filter_values: int = Field(default=100, ge=1, le=10_000, description="Per filter list.")
    max_filter_value_chars: int = Field(default=256, ge=1, le=4096)

    @field_validator("keyword_filter_fields")
    @classmethod
    def _check_fields(cls, fields: dict[str, KeywordKind]) -> dict[str, KeywordKind]:
        for name in fields:
            if not _FIELD_NAME_RE.fullmatch(name):
                raise ValueError(f"keyword filter field {name!r}: expected [A-Za-z_][A-Za-z0-9_]*")
            if name in _RESERVED_FIELDS:
                raise ValueError(f"keyword filter field {name!r} is reserved (own filter)")
        return fields

    @model_validator(mode="after")
    def _consistent(self) -> Self:
        if self.default_top_k > self.max_top_k:
            raise ValueError("default_top_k must be <= max_top_k")
        if self.max_candidate_k < self.max_top_k:
            raise ValueError("max_candidate_k must be >= max_top_k (never fetch fewer than asked)")
        if self.dense_weight == 0 and (self.sparse_weight == 0 or not self.hybrid):
            raise ValueError("at least one enabled fusion branch needs a weight > 0")
        low, high = self.min_similarity_override_min, self.min_similarity_override_max
        if not (math.isfinite(low) and math.isfinite(high) and low <= high):
            raise ValueError("min_similarity_override_min/max must be finite with min <= max")
        return self

    @property
    def score_kind(self) -> ScoreKind:
        """The calibrated score thresholds apply to: the evidence score (a reranker's score,
        when one runs, is one of its inputs)."""
        return ScoreKind.EVIDENCE

    def candidate_k(self, top_k: int) -> int:
        """Candidates to fetch for `top_k` results: top_k x multiplier, capped."""
        return min(top_k * self.candidate_multiplier, self.max_candidate_k)

    def thresholds(
        self,
        kind: ScoreKind,
        override: float | None = None,
        *,
        calibrated: Thresholds | None = None,
    ) -> Thresholds:
        """The thresholds of `kind`, the hard one replaced by a (validated) request override.

        Evidence thresholds are `evidence_thresholds` when set, else `calibrated` (those the
        index's calibration chose; ValueError when neither is given). An override above a soft
        threshold lifts it too, so the classes stay ordered.
        """
        base: ThresholdConfig | Thresholds
        if kind is ScoreKind.EVIDENCE:
            if self.evidence_thresholds is not None:
                base = self.evidence_thresholds
            elif calibrated is not None:
                base = calibrated
            else:
                raise ValueError("evidence thresholds come from the index's calibration")
        elif kind is ScoreKind.COSINE:
            base = self.cosine_thresholds
        else:
            base = self.rerank_thresholds
        hard = base.hard if override is None else override
        floor = hard * self.supporting_ratio if kind is ScoreKind.EVIDENCE else None
        return Thresholds(hard, max(base.medium, hard), max(base.high, hard), floor)
