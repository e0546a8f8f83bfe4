"""A throwaway PostgreSQL cluster from the installed server binaries (tests, local runs).

initdb refuses to run as root, so as root the cluster is created and run as the `postgres`
system user, in directories it owns.
"""

from __future__ import annotations

import glob
import os
import shutil
import subprocess
import tempfile
from pathlib import Path

from ragcore.errors import ConfigError
from ragdev.services.base import LocalService
from ragdev.services.tansu import free_port


def postgres_bindir() -> Path:
    """The newest installed PostgreSQL server bin dir ($RAGSTREAM_PG_BINDIR overrides)."""
    override = os.environ.get("RAGSTREAM_PG_BINDIR")
    if override:
        return Path(override)
    found = sorted(
        glob.glob("/usr/lib/postgresql/*/bin/initdb"),
        key=lambda p: int(Path(p).parts[-3]) if Path(p).parts[-3].isdigit() else 0,
    )
    if not found:
        initdb = shutil.which("initdb")
        if initdb is None:
            raise ConfigError("PostgreSQL server binaries (initdb, pg_ctl) are not installed")
        return Path(initdb).parent
    return Path(found[-1]).parent


class PostgresCluster(LocalService):
    """initdb + pg_ctl start on a loopback port; `stop()` removes everything.

    `logical=True` starts it ready for logical replication (Debezium): `wal_level=logical` and
    room for replication slots and WAL senders. `stop(keep_data=True)` then `start()` restarts
    the same cluster on the same port (an SoR outage in tests).
    """

    def __init__(
        self,
        *,
        logical: bool = False,
        settings: dict[str, str] | None = None,
        root: Path | None = None,
        port: int | None = None,
    ) -> None:
        """`root`: a directory kept across runs (the dev stack's SoR); by default a temp
        directory removed by `stop()`."""
        self.port = port or free_port()
        self.logical = logical
        #: extra server settings (`-c name=value`)
        self.settings = dict(settings or {})
        self.bindir = postgres_bindir()
        self._persistent = root is not None
        self._root = (
            root.resolve() if root is not None else Path(tempfile.mkdtemp(prefix="ragstream-pg-"))
        )
        self._data = self._root / "data"
        self._sock = self._root / "sock"
        self._log = self._root / "postgres.log"
        self._as_root = os.geteuid() == 0
        self._started = False
        self._initialized = (self._data / "PG_VERSION").is_file()

    @property
    def dsn(self) -> str:
        """A libpq connection string for the `postgres` superuser."""
        return f"host=127.0.0.1 port={self.port} user=postgres dbname=postgres"

    @property
    def pid(self) -> int | None:
        """The server's (postmaster's) process id while it runs."""
        pid_file = self._data / "postmaster.pid"
        if not pid_file.is_file():
            return None
        return int(pid_file.read_text().split("\n", 1)[0])

    def _run(self, *args: str) -> None:
        cmd = [str(a) for a in args]
        if self._as_root:
            cmd = ["su", "postgres", "-s", "/bin/sh", "-c", " ".join(_quote(c) for c in cmd)]
        # A session of its own: the terminal's Ctrl-C reaches ragstream, which stops the
        # services in order (the worker before what it reads), not the server directly.
        result = subprocess.run(
            cmd, capture_output=True, text=True, check=False, start_new_session=True
        )
        if result.returncode != 0:
            log = self._log.read_text(errors="replace")[-2000:] if self._log.exists() else ""
            raise ConfigError(
                f"{args[0]} failed ({result.returncode}): {result.stderr.strip()}\n{log}"
            )

    def start(self) -> PostgresCluster:
        """Create the cluster (once) and start the server; returns when it accepts
        connections."""
        if not self._initialized:
            self._sock.mkdir(parents=True, exist_ok=True)
            if self._as_root:
                shutil.chown(self._root, "postgres", "postgres")
                shutil.chown(self._sock, "postgres", "postgres")
                self._check_reachable()
            self._run(
                str(self.bindir / "initdb"),
                "-D",
                str(self._data),
                "-U",
                "postgres",
                "--auth=trust",
                "-E",
                "UTF8",
                "--no-sync",
            )
            self._initialized = True
        # a throwaway cluster need not survive a power cut; a kept one must
        settings = {**({} if self._persistent else {"fsync": "off"}), **self.settings}
        if self.logical:
            settings = {
                "wal_level": "logical",
                "max_replication_slots": "20",
                "max_wal_senders": "20",
                **settings,
            }
        extra = " ".join(f"-c {k}={v}" for k, v in settings.items())
        opts = f"-c listen_addresses=127.0.0.1 -p {self.port} -k {self._sock} {extra}"
        self._run(
            str(self.bindir / "pg_ctl"),
            "-D",
            str(self._data),
            "-o",
            opts,
            "-l",
            str(self._log),
            "-w",
            "start",
        )
        self._started = True
        return self

    def _check_reachable(self) -> None:
        """As root the server runs as `postgres`, which must be able to reach the directory."""
        probe = subprocess.run(
            ["su", "postgres", "-s", "/bin/sh", "-c", f"test -w {_quote(str(self._root))}"],
            capture_output=True,
            check=False,
        )
        if probe.returncode != 0:
            raise ConfigError(
                f"PostgreSQL runs as the postgres user, which cannot reach {self._root}: make "
                "its parent directories traversable (chmod o+x) or use another directory"
            )

    def base_backup(self, name: str) -> Path:
        """A physical base backup of the running cluster (`pg_basebackup`, the WAL it needs
        included) in the cluster's own directory; `restore()` takes it."""
        dest = self._root / f"backup-{name}"
        self._run(
            str(self.bindir / "pg_basebackup"),
            "-D",
            str(dest),
            "-X",
            "stream",
            "-h",
            "127.0.0.1",
            "-p",
            str(self.port),
            "-U",
            "postgres",
            "--checkpoint=fast",
            "--no-sync",
        )
        return dest

    def restore(self, backup: Path) -> None:
        """A physical restore: stop the server, replace its data directory with `backup` (taken
        by `base_backup`, consumed here) and start it on the same port. As after a PITR, what
        was committed since the backup is gone, replication slots are not restored (a base
        backup has none), and new commits get WAL positions from the backup's point on, below
        those the abandoned history reached."""
        self.stop(keep_data=True)
        shutil.rmtree(self._data)
        backup.rename(self._data)
        self.start()

    def stop(self, *, keep_data: bool = False) -> None:
        """Stop the server (immediately, like a crash) and delete its files unless
        `keep_data` (then `start()` brings the same cluster back on the same port)."""
        if self._started:
            self._run(str(self.bindir / "pg_ctl"), "-D", str(self._data), "-m", "immediate", "stop")
            self._started = False
        if not keep_data and not self._persistent:
            shutil.rmtree(self._root, ignore_errors=True)
            self._initialized = False


def _quote(arg: str) -> str:
    return "'" + arg.replace("'", "'\"'\"'") + "'"
