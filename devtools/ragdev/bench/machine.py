"""What every benchmark report says about the machine it ran on."""

from __future__ import annotations

import argparse
import json
import math
import os
import platform
import shutil
import signal
import statistics
import tempfile
from collections.abc import Iterator, Mapping, Sequence
from contextlib import ExitStack, contextmanager
from importlib.metadata import PackageNotFoundError, version
from pathlib import Path
from typing import Any

from ragcore.errors import ConfigError


@contextmanager
def unwind_on_signals() -> Iterator[None]:
    """SIGTERM and SIGINT raise `KeyboardInterrupt` in the main thread, so the benchmark's
    `with` blocks unwind and stop what they started. Its services run in sessions of their
    own, which a terminal's Ctrl-C does not reach, and SIGTERM's default action ends Python
    without unwinding: both left PostgreSQL, tansu and the Connect JVM running. Once the first
    signal arrived, later ones are ignored until the block is left: every stop is bounded,
    and a stop interrupted half-way would leave its process behind."""

    def interrupt(signum: int, _frame: object) -> None:
        for sig in (signal.SIGTERM, signal.SIGINT):
            signal.signal(sig, signal.SIG_IGN)
        raise KeyboardInterrupt(f"received {signal.strsignal(signum)}: stopping the services")

    previous = {sig: signal.signal(sig, interrupt) for sig in (signal.SIGTERM, signal.SIGINT)}
    try:
        yield
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)


def package_versions(packages: Sequence[str]) -> dict[str, str]:
    """Installed version of each distribution ("not installed" when absent)."""
    out: dict[str, str] = {}
    for package in packages:
        try:
            out[package] = version(package)
        except PackageNotFoundError:
            out[package] = "not installed"
    return out


def machine_info(
    load_before: Sequence[float],
    load_after: Sequence[float],
    packages: Sequence[str],
    extra_versions: Mapping[str, str] | None = None,
) -> dict[str, Any]:
    """CPU count, platform, Python, load averages around the run and package versions."""
    return {
        "cpu_count": os.cpu_count(),
        "platform": platform.platform(),
        "python": platform.python_version(),
        "load_average_before": [round(x, 2) for x in load_before],
        "load_average_after": [round(x, 2) for x in load_after],
        "packages": {**package_versions(packages), **(extra_versions or {})},
    }


def run_dir(stack: ExitStack, data_dir: Path | str | None, name: str) -> Path:
    """Where a benchmark builds its store and SoR: `data_dir` (kept; it must not hold a
    previous run) or a temporary directory removed when `stack` closes."""
    if data_dir is None:
        root = Path(tempfile.mkdtemp(prefix=f"ragstream-bench-{name}-"))
        stack.callback(shutil.rmtree, root, ignore_errors=True)
        return root
    root = Path(data_dir)
    if (root / "store").exists() or (root / "sor.sqlite").exists():
        raise ConfigError(f"{root} holds a previous run: use an empty directory")
    root.mkdir(parents=True, exist_ok=True)
    return root


def int_list(text: str) -> list[int]:
    """An argparse type: `1,8` -> [1, 8] (with nargs="+", `1 8` works too)."""
    try:
        return [int(part) for part in text.split(",") if part.strip()]
    except ValueError as exc:
        raise argparse.ArgumentTypeError(
            f"expected integers separated by commas: {text!r}"
        ) from exc


def flat(groups: Sequence[Sequence[int]]) -> list[int]:
    """The values of an `int_list` option given with nargs="+"."""
    return [value for group in groups for value in group]


def emit(report: Mapping[str, Any], out: Path | None = None, code: int = 0) -> int:
    """Print the report as the one JSON document on stdout (and write it to `out`)."""
    text = json.dumps(report, indent=2)
    print(text, flush=True)
    if out is not None:
        out.write_text(text + "\n", encoding="utf-8")
    return code


def percentiles(
    values: Sequence[float], *, scale: float = 1.0, digits: int = 3
) -> dict[str, float]:
    """p50/p95/p99 by nearest rank (the smallest sample with at least q of the samples at or
    below it), max and mean of `values` times `scale` (1000: seconds to milliseconds)."""
    ordered = sorted(v * scale for v in values)

    def pick(q: float) -> float:
        return ordered[max(0, math.ceil(q * len(ordered)) - 1)]

    return {
        "p50": round(pick(0.50), digits),
        "p95": round(pick(0.95), digits),
        "p99": round(pick(0.99), digits),
        "max": round(ordered[-1], digits),
        "mean": round(statistics.fmean(ordered), digits),
    }


def proc_status_mib(key: str) -> float | None:
    """A memory figure of this process from /proc/self/status (VmRSS, VmHWM...) in MiB; None
    where the file or the key does not exist."""
    try:
        lines = Path("/proc/self/status").read_text(encoding="ascii").splitlines()
    except OSError:
        return None
    for line in lines:
        if line.startswith(f"{key}:"):
            return round(int(line.split()[1]) / 2**10, 1)
    return None
