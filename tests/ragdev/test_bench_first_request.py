"""`ragdev.bench.first_request`: the first requests after a start, per warm-up mode, on a small
index built as `ragstream bench retrieve` builds one (never calibrated)."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from ragcore.embedders.local_onnx import LocalEmbedderConfig, LocalOnnxEmbedder
from ragcore.errors import ConfigError
from ragcore.plan import PlanConfig
from ragcore.store.edge import EdgeStore
from ragcore.wiring import payload_schema
from ragdev.bench.first_request import measure
from ragdev.bench.retrieve import WINDOW, _build
from schemas.proto.ragstream.retrieval.v1 import retrieval_pb2 as pb

pytestmark = [pytest.mark.integration, pytest.mark.slow]


def test_each_mode_reports_the_first_two_requests(tmp_path: Path) -> None:
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
    for mode in ("none", "dedicated"):
        report = measure(tmp_path, mode, after_s=0.5, timeout_s=30)
        assert report["warm_calibrations"] == mode and report["ready_s"] > 0
        for call in (report["first"], report["next"]):
            assert "error" not in call, call
            assert call["status"] in {pb.RETRIEVAL_STATUS_SUCCESS, pb.RETRIEVAL_STATUS_NO_EVIDENCE}
            assert call["ms"] > 0


def test_a_dir_without_an_index_is_refused(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="holds no benchmark index"):
        measure(tmp_path, "none", after_s=0, timeout_s=1)
