"""`ragdev.bench.store_calls`: the CPU of Retrieve's hybrid search through a store host, by
side, on a small index built as `ragstream bench retrieve` builds one."""

from __future__ import annotations

from pathlib import Path

import pytest

from ragdev.bench.store_calls import run
from tests.ragdev.bench_index import build_small_bench_index

pytestmark = [pytest.mark.integration, pytest.mark.slow]


def test_each_side_of_a_hosted_search_is_reported(tmp_path: Path) -> None:
    build_small_bench_index(tmp_path)
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
