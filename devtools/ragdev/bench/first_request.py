"""The first Retrieve request after a start, with and without the calibration warm-up.

A never-calibrated index is scored by the prior, whose lexical statistics count every text
of the index: at 100k chunks ~13 s on 2 cores. Without `retrieval.warm_calibrations` that
scan lands on the index's first request after every start; with it, a background thread runs
it as the server starts. This tool serves a data dir built by `ragstream bench retrieve
--data-dir DIR` (its index is never calibrated) with one Retrieve server process per mode,
waits `--after` seconds once the server is ready, and times two requests (the client's
`--timeout-s` applies; a timed-out request is reported as such).

Run: `python -m ragdev.bench.first_request --data-dir DIR [--after 20] [--modes none,dedicated]`.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from ragcore.errors import ConfigError
from ragcore.plan import PlanConfig
from ragcore.store.edge import EdgeStore
from ragcore.wiring import payload_schema
from ragdev.bench.machine import machine_info
from ragdev.bench.retrieve import TENANT, TOKEN, server_settings
from ragstream.query import QueryError, query
from retrieval_api.processes import RetrieveProcesses

QUESTIONS = ("how do pumps fail in winter?", "what is the maintenance interval?")


def _timed(port: int, question: str, timeout_s: float) -> dict[str, Any]:
    started = time.perf_counter()
    try:
        pack = query(f"127.0.0.1:{port}", TOKEN, question, tenant=TENANT, timeout_s=timeout_s)
    except QueryError as exc:
        return {"ms": round((time.perf_counter() - started) * 1000, 1), "error": str(exc)}
    return {"ms": round((time.perf_counter() - started) * 1000, 1), "status": pack.status}


def measure(data_dir: Path, mode: str, *, after_s: float, timeout_s: float) -> dict[str, Any]:
    """Start one server with `warm_calibrations=mode`, wait `after_s`, time two requests."""
    if not (data_dir / "store").exists():
        raise ConfigError(
            f"{data_dir} holds no benchmark index: build it with `ragstream bench retrieve "
            "--data-dir DIR` first"
        )
    plan = PlanConfig()
    settings = server_settings(data_dir, plan)
    retrieval = settings.retrieval.model_copy(update={"warm_calibrations": mode})
    settings = settings.model_copy(update={"retrieval": retrieval})
    store = EdgeStore(data_dir / "store", schema=payload_schema(plan))
    group = RetrieveProcesses(settings, processes=1, store=store)
    try:
        started = time.monotonic()
        group.start()
        ready_s = time.monotonic() - started
        time.sleep(after_s)
        first = _timed(group.port, QUESTIONS[0], timeout_s)
        second = _timed(group.port, QUESTIONS[1], timeout_s)
    finally:
        group.stop()
        store.close()
    return {"warm_calibrations": mode, "ready_s": round(ready_s, 2), "first": first, "next": second}


def main(argv: Sequence[str] | None = None) -> int:
    """Print the JSON report."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--data-dir", type=Path, required=True)
    parser.add_argument("--after", type=float, default=20.0, help="seconds after ready")
    parser.add_argument("--timeout-s", type=float, default=10.0)
    parser.add_argument("--modes", default="none,dedicated")
    args = parser.parse_args(argv)
    load_before = os.getloadavg()
    runs = [
        measure(args.data_dir, m, after_s=args.after, timeout_s=args.timeout_s)
        for m in args.modes.split(",")
    ]
    report = {
        "what": "the first two Retrieve requests after a server start, per warm_calibrations "
        "mode (one server process, SoR verification on, the index never calibrated)",
        "after_s": args.after,
        "timeout_s": args.timeout_s,
        "runs": runs,
        "machine": machine_info(load_before, os.getloadavg(), ["qdrant-edge-py", "grpcio"]),
    }
    json.dump(report, sys.stdout, indent=2)
    print()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
