"""`ragdev.bench.store_calls`: the CPU of Retrieve's hybrid search through a store host, by
side, on a small index built as `ragstream bench retrieve` builds one."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from ragcore.embedders.local_onnx import LocalEmbedderConfig, LocalOnnxEmbedder
from ragcore.plan import PlanConfig
from ragcore.store.edge import EdgeStore
from ragcore.wiring import payload_schema
from ragdev.bench.retrieve import WINDOW, _build
from ragdev.bench.store_calls import run

pytestmark = [pytest.mark.integration, pytest.mark.slow]


def test_each_side_of_a_hosted_search_is_reported(tmp_path: Path) -> None:
    store = EdgeStore(tmp_path / "store", schema=payload_schema(PlanConfig()))
    embedder = LocalOnnxEmbedder(LocalEmbedderConfig())
    try:
        _build(
            tmp_path,
            store,
            embedder,
            points=200,
            n_sentences=2 * WINDOW,
            rng=np.random.default_rng(0),
        )
    finally:
        embedder.close()
        store.close()
    retrieve = run(tmp_path, call="retrieve", call_kwargs={}, queries=20, rounds=1)
    floor = run(tmp_path, call="floor", call_kwargs={}, queries=20, rounds=1)
    assert retrieve["kwargs"]["sparse_dense_scores"] is True
    assert "text" in retrieve["kwargs"]["fields"]
    assert floor["kwargs"] == {"limit": 20, "prefetch_limit": 20}
    for report in (retrieve, floor):
        # the calling thread pickles and unpickles; the host's threads serve (10 ms ticks:
        # 20 calls may round the host's share to 0, never below)
        assert report["calling_thread_ms"] > 0
        assert report["host_python_ms"] >= 0 and report["host_engine_threads_ms"] >= 0
        assert report["host_python_ms"] + report["host_engine_threads_ms"] > 0
