"""Issue 28's measurement tools: the per-thread CPU reader of `ragdev.bench.retrieve_threads`
and `ragdev.bench.grpc_overhead` end to end (both servers, the real load generator)."""

from __future__ import annotations

import json
import os
import threading
import time

import pytest

from ragdev.bench.grpc_overhead import VARIANTS, run, stand_in_pack
from ragdev.bench.retrieve_threads import thread_cpu_seconds

pytestmark = [pytest.mark.integration, pytest.mark.slow]


def test_thread_cpu_counts_a_busy_thread_apart_from_the_main_thread() -> None:
    started, stop = threading.Event(), threading.Event()

    def burn() -> None:
        started.set()
        end = time.thread_time() + 0.2
        while time.thread_time() < end:
            sum(range(1000))
        stop.wait(30)  # alive until read: an ended thread is not counted

    worker = threading.Thread(target=burn)
    before = thread_cpu_seconds(os.getpid())
    worker.start()
    started.wait(10)
    time.sleep(0.5)
    after = thread_cpu_seconds(os.getpid())
    stop.set()
    worker.join(10)
    assert "main" in after
    others = sum(v for k, v in after.items() if k != "main") - sum(
        v for k, v in before.items() if k != "main"
    )
    assert others >= 0.15  # the 0.2 s the worker burnt (10 ms ticks)


def test_the_stand_in_pack_is_the_size_of_a_real_one() -> None:
    pack = stand_in_pack()
    assert len(pack.results) == 5 and len(pack.excluded) == 7 and len(pack.sources) == 5
    assert 2_000 < pack.ByteSize() < 10_000


def test_both_servers_answer_and_their_cpu_per_call_is_reported() -> None:
    report = run(calls=20, concurrency=2, work_ms=2.0, rounds=1)

    json.dumps(report)
    assert set(report["cpu_ms_per_call"]) == set(VARIANTS)
    for variant in VARIANTS:
        (cpu,) = report["cpu_ms_per_call"][variant]
        assert cpu >= 2.0  # at least the stand-in's own work per call
