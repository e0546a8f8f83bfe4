"""A benchmark stopped by SIGTERM or Ctrl-C (SIGINT) stops the services it started:
`unwind_on_signals` turns either into an unwinding of the benchmark's `with` blocks. The
service here is a process in a session of its own, as PostgreSQL, tansu and the Connect JVM
are started (so a terminal's Ctrl-C does not reach it)."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
import time

import pytest

from tests.conftest import REPO_ROOT
from tests.processes import alive

pytestmark = [pytest.mark.unit]

BENCH = textwrap.dedent(
    """
    import subprocess, sys, time
    from contextlib import ExitStack
    from ragdev.bench.machine import unwind_on_signals

    def stop(proc):
        time.sleep(0.3)  # a stop that takes a while; a second signal must not cut it short
        proc.terminate()
        proc.wait(10)
        print("stopped", flush=True)

    with unwind_on_signals(), ExitStack() as stack:
        service = subprocess.Popen(["sleep", "300"], start_new_session=True)
        stack.callback(stop, service)
        print(service.pid, flush=True)
        while True:
            time.sleep(0.05)
    """
)


@pytest.mark.parametrize("signum", [signal.SIGTERM, signal.SIGINT])
def test_a_signal_stops_the_services_started(signum: int) -> None:
    bench = subprocess.Popen(
        [sys.executable, "-c", BENCH],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env={
            **os.environ,
            "PYTHONPATH": os.pathsep.join([str(REPO_ROOT), str(REPO_ROOT / "devtools")]),
        },
    )
    assert bench.stdout is not None
    service = int(bench.stdout.readline())
    assert alive(service)
    bench.send_signal(signum)
    time.sleep(0.1)
    bench.send_signal(signum)  # a second one while the service stops is ignored
    out, err = bench.communicate(timeout=30)
    assert "stopped" in out, err[-2000:]
    assert "KeyboardInterrupt" in err and "stopping the services" in err
    assert bench.returncode != 0
    deadline = time.monotonic() + 5
    while alive(service) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert not alive(service)
