"""A small index built as `ragstream bench retrieve` builds one, for the benchmark tools'
tests (never calibrated: the prior scores it)."""

from __future__ import annotations

from pathlib import Path

import numpy as np

from ragcore.embedders.local_onnx import LocalEmbedderConfig, LocalOnnxEmbedder
from ragcore.plan import PlanConfig
from ragcore.store.edge import EdgeStore
from ragcore.wiring import payload_schema
from ragdev.bench.retrieve import WINDOW, _build


def build_small_bench_index(root: Path, points: int = 200) -> None:
    """Build `points` chunks, the SoR and the registry under `root` (`--data-dir` layout)."""
    store = EdgeStore(root / "store", schema=payload_schema(PlanConfig()))
    embedder = LocalOnnxEmbedder(LocalEmbedderConfig())
    try:
        _build(
            root,
            store,
            embedder,
            points=points,
            n_sentences=2 * WINDOW,
            rng=np.random.default_rng(0),
        )
    finally:
        embedder.close()
        store.close()
