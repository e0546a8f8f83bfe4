"""A running `ragstream dev` stack on free ports, shared by the suites that run commands beside
it (admin commands, `ragstream status`) or watch it (the shipped alert rules in Prometheus)."""

from __future__ import annotations

import os
import shlex
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.ragdev.test_dev_stack import DevProcess


class RunningDev:
    """The stack and the environment its `dev.env` gives commands run beside it."""

    def __init__(self, dev: DevProcess) -> None:
        self.dev = dev
        self.env = dict(dev.env)
        for line in (dev.data_dir / "dev.env").read_text().splitlines():
            name, _, value = line.partition("=")
            self.env[name] = shlex.split(value)[0]

    def run(self, *args: str, timeout: float = 300) -> subprocess.CompletedProcess[str]:
        """`ragstream ARGS` in a fresh process with the stack's environment."""
        return subprocess.run(
            [sys.executable, "-m", "ragstream.cli", *args],
            capture_output=True,
            text=True,
            env=self.env,
            timeout=timeout,
            check=False,
        )


@pytest.fixture(scope="package")
def running_dev(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RunningDev]:
    dev = DevProcess(tmp_path_factory.mktemp("dev") / "data")
    try:
        dev.wait_up()
        yield RunningDev(dev)
        assert dev.stop() == 0
        assert "stopped cleanly" in dev.output()
        assert not (dev.data_dir / "store" / "store-host.json").exists()
    finally:
        if dev.proc.poll() is None:
            dev.proc.kill()


def dev_env_mode(path: Path) -> int:
    """The permission bits of a file."""
    return os.stat(path).st_mode & 0o777
