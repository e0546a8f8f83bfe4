"""The retrieval configurations an eval run compares (`ragstream eval --configs`).

Plain data, apart from the runner, so `ragstream eval --help` can list the names without
loading the services.
"""

from __future__ import annotations

from typing import Any


def _evidence_threshold(hard: float) -> dict[str, Any]:
    return {
        "evidence_thresholds": {"hard": hard, "medium": max(hard, 0.6), "high": max(hard, 0.85)}
    }


#: A single channel: its own candidates, its own order, no identifier search or priority.
_SINGLE = {"order": "fused", "identifier_search": False, "identifier_priority": False}

#: The configurations one run compares; the first is the product default (convex 0.5 / 0.5
#: order, the thresholds the index's calibration chose). `dense_only` / `bm25_only` are one
#: channel alone; `rrf*`, `convex_*`, `dbsf`, `evidence_order` fix another order and
#: `calibrated_order` takes the one the calibration chose per index, `configured_fusion` the
#: configured fusion whatever the calibration chose; `thr_*` fix the hard
#: threshold on the evidence score (`no_threshold`, `*_no_threshold`: none, so a channel's
#: ranking is compared without abstention), `supporting_*` the floor of supporting chunks;
#: `no_identifier_rule` drops the identifier search and priority; `no_collapse`, `no_diversity`,
#: `no_explanations_first` turn one step of distinct evidence off, `plain_ranking` all three;
#: `entity_first_chunk` is per-entity dedup before issue 43 (an entity's first chunk in the
#: order, pages of a document each other's duplicates), `no_distinct_parts` folds a document's
#: pages into one result, `one_chunk_per_entity` also drops a further chunk of an entity that
#: reaches the hard threshold by itself (the evidence-led choice of the one chunk kept).
DEFAULT_CONFIGS: dict[str, dict[str, Any]] = {
    "default": {},
    "dense_only": {**_SINGLE, "hybrid": False, "sparse_weight": 0.0},
    "bm25_only": {**_SINGLE, "dense_weight": 0.0, "sparse_weight": 1.0},
    "rrf": {"order": "fused", "fusion_method": "rrf", "dense_weight": 1.0, "sparse_weight": 1.0},
    "rrf_1_0.5": {
        "order": "fused",
        "fusion_method": "rrf",
        "dense_weight": 1.0,
        "sparse_weight": 0.5,
    },
    "rrf_0.5_1": {
        "order": "fused",
        "fusion_method": "rrf",
        "dense_weight": 0.5,
        "sparse_weight": 1.0,
    },
    "convex_0.7_0.3": {
        "order": "fused",
        "fusion_method": "convex",
        "dense_weight": 0.7,
        "sparse_weight": 0.3,
    },
    "convex_0.3_0.7": {
        "order": "fused",
        "fusion_method": "convex",
        "dense_weight": 0.3,
        "sparse_weight": 0.7,
    },
    "dbsf": {"order": "fused", "fusion_method": "dbsf", "dense_weight": 1.0, "sparse_weight": 1.0},
    "evidence_order": {"order": "evidence"},
    "calibrated_order": {"order": "calibrated"},
    "configured_fusion": {"order": "fused"},
    "no_identifier_rule": {"identifier_search": False, "identifier_priority": False},
    "no_collapse": {"near_duplicate_collapse": False},
    "no_diversity": {"diversity": False},
    "diversity_0.5": {"diversity_lambda": 0.5},
    "no_explanations_first": {"explanations_first": False},
    "plain_ranking": {
        "near_duplicate_collapse": False,
        "diversity": False,
        "explanations_first": False,
    },
    "no_threshold": _evidence_threshold(0.0),
    "dense_only_no_threshold": {
        **_SINGLE,
        "hybrid": False,
        "sparse_weight": 0.0,
        **_evidence_threshold(0.0),
    },
    "bm25_only_no_threshold": {
        **_SINGLE,
        "dense_weight": 0.0,
        "sparse_weight": 1.0,
        **_evidence_threshold(0.0),
    },
    "entity_first_chunk": {
        "passage_lead": "order",
        "distinct_document_parts": False,
        "answering_chunks": False,
    },
    "no_distinct_parts": {"distinct_document_parts": False},
    "one_chunk_per_entity": {"answering_chunks": False, "distinct_document_parts": False},
    "supporting_1.0": {"supporting_ratio": 1.0},
    "supporting_0.5": {"supporting_ratio": 0.5},
    "supporting_0.1": {"supporting_ratio": 0.1},
    "supporting_0": {"supporting_ratio": 0.0},
    "thr_0.3": _evidence_threshold(0.3),
    "thr_0.5": _evidence_threshold(0.5),
    "thr_0.7": _evidence_threshold(0.7),
}
