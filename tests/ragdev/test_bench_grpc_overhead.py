"""Issue 28's measurement tools: the per-thread CPU reader of `ragdev.bench.retrieve_threads`
and `ragdev.bench.grpc_overhead` end to end (both servers, the real load generator)."""

from __future__ import annotations

import json
import os
import threading
import time

import pytest

from ragdev.bench.grpc_overhead import VARIANTS, run, stand_in_pack
from ragdev.bench.retrieve_threads import EXITED, cpu_used, thread_cpu

pytestmark = [pytest.mark.integration, pytest.mark.slow]


def _burn(seconds: float) -> None:
    end = time.thread_time() + seconds
    while time.thread_time() < end:
        sum(range(1000))


def test_thread_cpu_counts_live_and_ended_threads_apart_from_the_main_thread() -> None:
    started, stop = threading.Event(), threading.Event()

    def busy_then_alive() -> None:
        _burn(0.2)
        started.set()
        stop.wait(30)  # alive at the second reading

    before = thread_cpu(os.getpid())
    alive = threading.Thread(target=busy_then_alive, name="alive")
    alive.start()
    ended = threading.Thread(target=_burn, args=(0.2,), name="ended")
    ended.start()
    ended.join(30)
    started.wait(30)
    used = cpu_used(before, thread_cpu(os.getpid()))
    stop.set()
    alive.join(10)
    assert "main" in used
    # (Python 3.11 does not name OS threads: both burners are named as the process is)
    live = sum(v for k, v in used.items() if k not in ("main", EXITED))
    assert live >= 0.15  # the 0.2 s the live burner used (10 ms ticks)
    # a thread that ended between the readings is gone from /proc: its CPU is what the
    # process total holds beyond its live threads
    assert used[EXITED] >= 0.15
    assert live < 0.35  # the ended thread's time is not counted as a live thread's too


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
