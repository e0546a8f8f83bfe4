"""`ragdev.bench.first_request`: the first requests after a start, per warm-up mode, on a small
index built as `ragstream bench retrieve` builds one (never calibrated)."""

from __future__ import annotations

from pathlib import Path

import pytest

from ragcore.errors import ConfigError
from ragdev.bench.first_request import measure
from schemas.proto.ragstream.retrieval.v1 import retrieval_pb2 as pb
from tests.ragdev.bench_index import build_small_bench_index

pytestmark = [pytest.mark.integration, pytest.mark.slow]


def test_each_mode_reports_the_first_two_requests(tmp_path: Path) -> None:
    build_small_bench_index(tmp_path)
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
