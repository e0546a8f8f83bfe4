"""The Debezium connector that feeds mapped tables: written for them, and checked against them.

`kafka_connect_config` starts from the shipped configuration
(`schemas/debezium/entities-connector.json`: JSON converter without schemas, TRUNCATE emitted,
heartbeats, 100 ms polls) and sets what the mapped tables decide: `table.include.list`,
`topic.prefix`, the slot and publication, the database's address (Debezium's own user and
password stay `${file:...}` references), and with several partitions per topic Debezium's
PartitionRouting SMT by each table's tenant column. `debezium_server_properties` writes the
same connector as Debezium Server's `application.properties` (Kafka sink, JSON format).

`load_connector` reads either form back; `check_connector` says where a connector and the
mappings disagree (a table it does not capture, another topic prefix, TRUNCATE or deletes
skipped, a converter ragstream cannot read, a routing field that is not the tenant), and
`check_topics` where the broker does (a missing topic, a partition count other than expected).
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

from ragcore.errors import ConfigError
from ragcore.mapping import TableMapping
from ragcore.resources import package_dir
from ragcore.sor.mapcheck import Problem, Severity
from ragcore.sor.pgcatalog import ColumnKind, DatabaseInfo

#: The shipped connector configuration (docker-compose mounts it, Helm ships a copy).
SHIPPED = "debezium/entities-connector.json"
POSTGRES_CONNECTOR = "io.debezium.connector.postgresql.PostgresConnector"
MYSQL_CONNECTORS = (
    "io.debezium.connector.mysql.MySqlConnector",
    "io.debezium.connector.mariadb.MariaDbConnector",
)
JSON_CONVERTER = "org.apache.kafka.connect.json.JsonConverter"
PARTITION_ROUTING = "io.debezium.transforms.partitions.PartitionRouting"
TOPIC_NAME_MATCHES = "org.apache.kafka.connect.transforms.predicates.TopicNameMatches"
#: Connector properties that hold the database's address (filled in from the DSN). The user
#: and password stay `${file:...}` references: Debezium connects as a role of its own (with
#: REPLICATION), not as the role ragstream reads the SoR with.
_DATABASE_KEYS = {
    "database.hostname": "host",
    "database.port": "port",
    "database.dbname": "dbname",
}
_CREDENTIALS = ("database.user", "database.password")
#: Connector properties of Kafka Connect only (Debezium Server has its own sink and format).
_CONNECT_ONLY = ("name", "tasks.max", "key.converter", "value.converter", "topic.creation.")


def shipped_config() -> dict[str, str]:
    """The shipped connector configuration (schemas/debezium/entities-connector.json)."""
    path = package_dir("schemas") / SHIPPED
    loaded = json.loads(path.read_text(encoding="utf-8"))
    if not isinstance(loaded, dict) or not all(isinstance(v, str) for v in loaded.values()):
        raise ConfigError(f"{path}: expected a JSON object of string values")
    return loaded


@dataclass(frozen=True, slots=True)
class ConnectorTarget:
    """What the generated connector is named and points at."""

    name: str = "ragstream-sor"
    topic_prefix: str = "sor"
    publication: str = "ragstream"
    slot: str = "ragstream"
    #: partitions per table topic (more than one: routed by tenant)
    partitions: int = 1
    #: host, port and dbname of the database (from the DSN)
    database: Mapping[str, str] | None = None


def kafka_connect_config(
    mappings: Sequence[TableMapping], target: ConnectorTarget
) -> dict[str, str]:
    """The Kafka Connect configuration (POST /connectors `config`) for the mapped tables."""
    if not mappings:
        raise ConfigError("no table is mapped: there is nothing for a connector to capture")
    config = shipped_config()
    config["name"] = target.name
    for key, part in _DATABASE_KEYS.items():
        value = (target.database or {}).get(part)
        if value:
            config[key] = value
    config.update(
        {
            "topic.prefix": target.topic_prefix,
            "table.include.list": ",".join(f"{m.schema_name}.{m.table_name}" for m in mappings),
            "slot.name": target.slot,
            "publication.name": target.publication,
        }
    )
    if target.partitions > 1:
        config["topic.creation.default.partitions"] = str(target.partitions)
        config.update(_routing(mappings, target))
    return config


def _routing(mappings: Sequence[TableMapping], target: ConnectorTarget) -> dict[str, str]:
    """PartitionRouting by tenant: one transform per tenant column name, each restricted to
    the topics of the tables with that column (a field list naming several columns would hash
    another table's column too)."""
    by_column: dict[str, list[TableMapping]] = {}
    for m in mappings:
        if m.tenant_column is not None:
            by_column.setdefault(m.tenant_column, []).append(m)
    config: dict[str, str] = {}
    names: list[str] = []
    predicates: list[str] = []
    several = len(by_column) > 1
    for n, (column, tables) in enumerate(sorted(by_column.items())):
        route = f"routeByTenant{n}" if several else "routeByTenant"
        predicate = f"routedTopics{n}" if several else "routedTopics"
        topics = "|".join(re.escape(m.topic_name(target.topic_prefix)) for m in tables)
        config.update(
            {
                f"transforms.{route}.type": PARTITION_ROUTING,
                f"transforms.{route}.partition.payload.fields": f"change.{column}",
                f"transforms.{route}.partition.topic.num": str(target.partitions),
                f"transforms.{route}.predicate": predicate,
                f"predicates.{predicate}.type": TOPIC_NAME_MATCHES,
                f"predicates.{predicate}.pattern": topics,
            }
        )
        names.append(route)
        predicates.append(predicate)
    if names:
        config["transforms"] = ",".join(names)
        config["predicates"] = ",".join(predicates)
    return config


def debezium_server_properties(config: Mapping[str, str], bootstrap_servers: str) -> str:
    """The connector as Debezium Server's application.properties, writing to Kafka as JSON
    without schemas (what the worker reads)."""
    lines = [
        "# Debezium Server for ragstream (`ragstream tables discover --connector`).",
        "# Debezium's role (REPLICATION) and its password: set DEBEZIUM_SOURCE_DATABASE_USER and",
        "# DEBEZIUM_SOURCE_DATABASE_PASSWORD in the server's environment (MicroProfile Config",
        "# reads them), never in this file.",
        "debezium.sink.type=kafka",
        f"debezium.sink.kafka.producer.bootstrap.servers={bootstrap_servers}",
        "debezium.sink.kafka.producer.key.serializer="
        "org.apache.kafka.common.serialization.StringSerializer",
        "debezium.sink.kafka.producer.value.serializer="
        "org.apache.kafka.common.serialization.StringSerializer",
        "debezium.format.key=json",
        "debezium.format.key.schemas.enable=false",
        "debezium.format.value=json",
        "debezium.format.value.schemas.enable=false",
        "debezium.source.offset.storage.file.filename=data/offsets.dat",
        "debezium.source.offset.flush.interval.ms=1000",
    ]
    if "transforms" in config:
        lines.append(
            "# Debezium Server creates no topics: create each table's topic with "
            f"{config.get('topic.creation.default.partitions', '1')} partitions first."
        )
    for key, value in config.items():
        if key.startswith(_CONNECT_ONLY) or key in _CREDENTIALS:
            continue
        prefix = "debezium." if key.startswith(("transforms", "predicates")) else "debezium.source."
        lines.append(f"{prefix}{key}={_escape(value)}")
    return "\n".join(lines) + "\n"


def _escape(value: str) -> str:
    """A .properties value: a backslash escapes the next character there (a regular
    expression's `\\.` must be written `\\\\.`)."""
    out = value.replace("\\", "\\\\").replace("\n", "\\n").replace("\r", "\\r")
    return "\\" + out if out.startswith((" ", "\t")) else out


@dataclass(frozen=True, slots=True)
class LoadedConnector:
    """A connector configuration read from a file: its connector properties (Debezium
    Server's `debezium.source.*`, `debezium.transforms.*` and `debezium.predicates.*` with the
    prefix taken off) and, for Debezium Server, its own `debezium.sink.*`/`debezium.format.*`."""

    path: Path
    config: Mapping[str, str]
    server: Mapping[str, str] | None = None


def load_connector(path: Path) -> LoadedConnector:
    """A Kafka Connect JSON file (the object of properties, or `{"name", "config"}` as
    POST /connectors takes it) or a Debezium Server `.properties` file."""
    try:
        text = path.read_text(encoding="utf-8")
    except OSError as exc:
        raise ConfigError(f"cannot read the connector file {path}: {exc}") from exc
    if path.suffix == ".properties":
        props = _properties(text)
        config: dict[str, str] = {}
        server: dict[str, str] = {}
        for key, value in props.items():
            if key.startswith("debezium.source."):
                config[key.removeprefix("debezium.source.")] = value
            elif key.startswith(("debezium.transforms", "debezium.predicates")):
                config[key.removeprefix("debezium.")] = value
            elif key.startswith("debezium."):
                server[key.removeprefix("debezium.")] = value
        return LoadedConnector(path, config, server)
    try:
        loaded = json.loads(text)
    except json.JSONDecodeError as exc:
        raise ConfigError(
            f"{path} is not JSON: {exc.msg} at line {exc.lineno} column {exc.colno}"
        ) from exc
    if isinstance(loaded, dict) and isinstance(loaded.get("config"), dict):
        loaded = {"name": loaded.get("name", ""), **loaded["config"]}
    if not isinstance(loaded, dict):
        raise ConfigError(f"{path}: expected a JSON object of connector properties")
    return LoadedConnector(path, {str(k): str(v) for k, v in loaded.items()})


def _properties(text: str) -> dict[str, str]:
    """Java .properties: `key=value` or `key: value` lines, `#`/`!` comments, `\\` line
    continuations."""
    out: dict[str, str] = {}
    pending = ""
    for raw in text.splitlines():
        line = pending + raw.strip() if pending else raw.strip()
        pending = ""
        if not line or line.startswith(("#", "!")):
            continue
        if line.endswith("\\") and not line.endswith("\\\\"):
            pending = line[:-1]
            continue
        match = re.match(r"([^=:\s]+)\s*[=:\s]\s*(.*)", line)
        if match:
            out[match.group(1)] = _unescape(match.group(2))
    return out


_ESCAPES = {"n": "\n", "r": "\r", "t": "\t", "f": "\f"}


def _unescape(value: str) -> str:
    """A .properties value as Java reads it: `\\x` is `x` (`\\n` a newline, ...)."""
    return re.sub(r"\\(.)", lambda m: _ESCAPES.get(m.group(1), m.group(1)), value)


def _matches(patterns: str | None, name: str) -> bool | None:
    """Whether `name` fully matches one of the comma-separated regular expressions (Debezium's
    include and exclude lists); None when no list is set."""
    if patterns is None or not patterns.strip():
        return None
    for pattern in patterns.split(","):
        try:
            if re.fullmatch(pattern.strip(), name):
                return True
        except re.error:
            if pattern.strip() == name:
                return True
    return False


def publication_of(loaded: LoadedConnector | None) -> tuple[str | None, bool]:
    """The connector's publication and whether the connector creates or extends it itself
    (`publication.autocreate.mode` filtered or all_tables, Debezium's default); (None, False)
    without a connector or with a plugin other than pgoutput."""
    if loaded is None:
        return None, False
    config = loaded.config
    if config.get("plugin.name", "decoderbufs") != "pgoutput":
        return None, False
    mode = config.get("publication.autocreate.mode", "all_tables")
    return config.get("publication.name", "dbz_publication"), mode in ("filtered", "all_tables")


def check_connector(
    loaded: LoadedConnector,
    mappings: Sequence[TableMapping],
    *,
    topic_prefix: str,
    heartbeat_prefix: str,
    db: DatabaseInfo | None = None,
) -> list[Problem]:
    """Where the connector and the mappings (`topic_prefix`: RAGSTREAM_PLAN__TOPIC_PREFIX,
    `heartbeat_prefix`: RAGSTREAM_DECODE__HEARTBEAT_TOPIC_PREFIX) disagree. `db` adds the
    checks that need the columns' types."""
    config = loaded.config
    problems: list[Problem] = []

    def add(  # noqa: PLR0917 - a Problem's fields, in its order
        code: str, severity: Severity, key: str, message: str, fix: str, table: str = ""
    ) -> None:
        problems.append(Problem(code, severity, table, key, message, fix))

    cls = config.get("connector.class", "")
    if cls in MYSQL_CONNECTORS:
        add(
            "CONNECTOR_UNSUPPORTED",
            Severity.ERROR,
            "connector.class",
            f"{cls} is not supported yet: ragstream orders changes by PostgreSQL's LSN and "
            'reads its SoR through PostgreSQL (docs/configuration.md, "MySQL")',
            "use the Debezium PostgreSQL connector",
        )
        return problems
    if cls != POSTGRES_CONNECTOR:
        add(
            "CONNECTOR_UNSUPPORTED",
            Severity.ERROR,
            "connector.class",
            f"connector.class is {cls or 'not set'}; ragstream reads {POSTGRES_CONNECTOR}",
            f"set connector.class={POSTGRES_CONNECTOR}",
        )
        return problems
    prefix = config.get("topic.prefix")
    if prefix is None:
        add(
            "TOPIC_PREFIX",
            Severity.ERROR,
            "topic.prefix",
            "topic.prefix is not set (Debezium requires it: topics are <topic.prefix>.<schema>."
            "<table>)",
            f"set topic.prefix={topic_prefix}",
        )
    elif prefix != topic_prefix and any(m.topic is None for m in mappings):
        add(
            "TOPIC_PREFIX",
            Severity.ERROR,
            "topic.prefix",
            f"topic.prefix is {prefix!r} but RAGSTREAM_PLAN__TOPIC_PREFIX is {topic_prefix!r}: "
            "the worker would listen on topics nobody writes",
            f"set RAGSTREAM_PLAN__TOPIC_PREFIX={prefix} (or topic.prefix={topic_prefix})",
        )
    for m in mappings:
        name = f"{m.schema_name}.{m.table_name}"
        included = _matches(config.get("table.include.list"), name)
        schemas = _matches(config.get("schema.include.list"), m.schema_name)
        excluded = _matches(config.get("table.exclude.list"), name)
        if included is False or schemas is False or excluded:
            key = "table.exclude.list" if excluded else "table.include.list"
            add(
                "NOT_CAPTURED",
                Severity.ERROR,
                key,
                f"the connector does not capture {name} ({key}): its changes never reach Kafka",
                f"add {name} to table.include.list"
                if not excluded
                else f"remove {name} from table.exclude.list",
                name,
            )
        for column in m.columns():
            full = f"{name}.{column}"
            if _matches(config.get("column.exclude.list"), full) or (
                _matches(config.get("column.include.list"), full) is False
            ):
                add(
                    "COLUMN_NOT_CAPTURED",
                    Severity.ERROR,
                    "column.exclude.list"
                    if config.get("column.exclude.list")
                    else "column.include.list",
                    f"the connector leaves out the mapped column {column!r}: every change "
                    "event would go to the DLQ as SCHEMA_DRIFT",
                    f"capture {full}, or unmap the column",
                    name,
                )
    skipped = {
        s.strip()
        for s in config.get("skipped.operations", "t").split(",")
        if s.strip() and s.strip() != "none"
    }
    if skipped & {"c", "u", "d"}:
        add(
            "SKIPPED_OPERATIONS",
            Severity.ERROR,
            "skipped.operations",
            f"skipped.operations skips {sorted(skipped & {'c', 'u', 'd'})}: those changes never "
            "reach the index",
            "set skipped.operations=none",
        )
    elif "t" in skipped:
        add(
            "SKIPPED_OPERATIONS",
            Severity.WARNING,
            "skipped.operations",
            "TRUNCATE is skipped (Debezium's default skipped.operations=t): a truncated table's "
            "chunks stay searchable until reconcile",
            "set skipped.operations=none",
        )
    plugin = config.get("plugin.name", "decoderbufs")
    if plugin != "pgoutput":
        add(
            "PLUGIN",
            Severity.NOTE,
            "plugin.name",
            f"plugin.name is {plugin}: publications are not checked (pgoutput, PostgreSQL's "
            "built-in plugin, needs no server extension)",
            "set plugin.name=pgoutput",
        )
    if int(config.get("heartbeat.interval.ms", "0") or 0) <= 0:
        add(
            "HEARTBEATS",
            Severity.WARNING,
            "heartbeat.interval.ms",
            "no heartbeats: the worker cannot tell a dead connector from quiet tables "
            "(ragstream_source_heard_age_seconds), and an idle slot holds WAL",
            "set heartbeat.interval.ms=5000",
        )
    elif config.get("topic.heartbeat.prefix", "__debezium-heartbeat") != heartbeat_prefix:
        add(
            "HEARTBEATS",
            Severity.WARNING,
            "topic.heartbeat.prefix",
            f"topic.heartbeat.prefix is {config.get('topic.heartbeat.prefix')!r} but the worker "
            f"listens for {heartbeat_prefix!r} (RAGSTREAM_DECODE__HEARTBEAT_TOPIC_PREFIX)",
            f"set topic.heartbeat.prefix={heartbeat_prefix}",
        )
    problems += _check_format(loaded)
    if any(m.document is not None for m in mappings):
        mode = config.get("binary.handling.mode", "bytes")
        if mode not in ("bytes", "base64"):
            add(
                "BINARY_HANDLING",
                Severity.ERROR,
                "binary.handling.mode",
                f"binary.handling.mode={mode}: document columns are read as base64 (bytes or "
                "base64)",
                "set binary.handling.mode=bytes",
            )
    schemaless = _schemaless(loaded)
    if schemaless and db is not None:
        problems += _check_value_modes(config, mappings, db)
    snapshot = config.get("snapshot.mode", "initial")
    if snapshot in ("never", "no_data"):
        add(
            "SNAPSHOT_MODE",
            Severity.NOTE,
            "snapshot.mode",
            f"snapshot.mode={snapshot}: rows that exist before the connector starts are not "
            "streamed",
            "run `ragstream reconcile --tenant T --repair` for each tenant once the worker runs",
        )
    problems += _check_routing(config, mappings, topic_prefix)
    return problems


def _schemaless(loaded: LoadedConnector) -> bool:
    if loaded.server is not None:
        return loaded.server.get("format.value.schemas.enable", "true") == "false"
    return loaded.config.get("value.converter.schemas.enable", "true") == "false"


def _check_format(loaded: LoadedConnector) -> list[Problem]:
    if loaded.server is not None:
        problems = []
        if loaded.server.get("sink.type") != "kafka":
            problems.append(
                Problem(
                    "SINK",
                    Severity.ERROR,
                    "",
                    "debezium.sink.type",
                    f"debezium.sink.type is {loaded.server.get('sink.type')!r}: the worker reads "
                    "Kafka",
                    "set debezium.sink.type=kafka",
                )
            )
        for part in ("key", "value"):
            if loaded.server.get(f"format.{part}", "json") != "json":
                problems.append(
                    Problem(
                        "FORMAT",
                        Severity.ERROR,
                        "",
                        f"debezium.format.{part}",
                        f"debezium.format.{part} is {loaded.server.get(f'format.{part}')!r}: the "
                        "worker reads JSON",
                        f"set debezium.format.{part}=json",
                    )
                )
        return problems
    problems = []
    for part in ("key", "value"):
        converter = loaded.config.get(f"{part}.converter")
        if converter is None:
            problems.append(
                Problem(
                    "CONVERTER",
                    Severity.NOTE,
                    "",
                    f"{part}.converter",
                    f"{part}.converter is not set: the Connect worker's default applies",
                    f"set {part}.converter={JSON_CONVERTER} to be sure",
                )
            )
        elif converter != JSON_CONVERTER:
            problems.append(
                Problem(
                    "CONVERTER",
                    Severity.ERROR,
                    "",
                    f"{part}.converter",
                    f"{part}.converter is {converter}: the worker reads JSON",
                    f"set {part}.converter={JSON_CONVERTER}",
                )
            )
    return problems


def _check_value_modes(
    config: Mapping[str, str], mappings: Sequence[TableMapping], db: DatabaseInfo
) -> list[Problem]:
    """Schemaless JSON carries no logical types: numbers and times must arrive in the forms
    the worker reads without them."""
    problems: list[Problem] = []
    decimal = config.get("decimal.handling.mode", "precise")
    precision = config.get("time.precision.mode", "adaptive")
    for m in mappings:
        table = db.table(f"{m.schema_name}.{m.table_name}")
        if table is None:
            continue
        kinds = {c: col.kind for c in m.columns() if (col := table.column(c)) is not None}
        numeric = [c for c, k in kinds.items() if k is ColumnKind.NUMERIC]
        if numeric and decimal == "precise":
            problems.append(
                Problem(
                    "DECIMAL_HANDLING",
                    Severity.WARNING,
                    table.qualified,
                    "decimal.handling.mode",
                    f"numeric columns {numeric} arrive as base64 bytes (decimal.handling.mode="
                    "precise, Debezium's default) in JSON without schemas",
                    "set decimal.handling.mode=string",
                )
            )
        stamps = [
            c
            for c in (m.created_at_column, m.updated_at_column)
            if c is not None and kinds.get(c) is ColumnKind.TIMESTAMP
        ]
        if stamps and precision == "connect":
            problems.append(
                Problem(
                    "TIME_PRECISION",
                    Severity.ERROR,
                    table.qualified,
                    "time.precision.mode",
                    f"time.precision.mode=connect sends {stamps} as epoch milliseconds; without "
                    "schemas the worker reads epoch microseconds (Debezium's adaptive mode)",
                    "remove time.precision.mode (adaptive), or enable value.converter schemas",
                )
            )
    return problems


def routing_partitions(config: Mapping[str, str], topic: str) -> tuple[int, str] | None:
    """(partitions, payload fields) of the PartitionRouting transform applied to `topic`, or
    None when none is."""
    names = [t.strip() for t in config.get("transforms", "").split(",") if t.strip()]
    for name in names:
        if config.get(f"transforms.{name}.type") != PARTITION_ROUTING:
            continue
        predicate = config.get(f"transforms.{name}.predicate")
        if predicate:
            pattern = config.get(f"predicates.{predicate}.pattern")
            negate = config.get(f"transforms.{name}.negate", "false") == "true"
            if config.get(f"predicates.{predicate}.type") == TOPIC_NAME_MATCHES and pattern:
                try:
                    hit = re.fullmatch(pattern, topic) is not None
                except re.error:
                    hit = True  # a Java pattern Python cannot read: assume it applies
                if hit == negate:
                    continue
        try:
            partitions = int(config.get(f"transforms.{name}.partition.topic.num", "0"))
        except ValueError:
            partitions = 0
        return partitions, config.get(f"transforms.{name}.partition.payload.fields", "")
    return None


def _check_routing(
    config: Mapping[str, str], mappings: Sequence[TableMapping], topic_prefix: str
) -> list[Problem]:
    problems: list[Problem] = []
    for m in mappings:
        routed = routing_partitions(config, m.topic_name(topic_prefix))
        if routed is None:
            continue
        _, fields = routed
        wanted = {f"change.{m.tenant_column}", f"after.{m.tenant_column}"}
        given = {f.strip() for f in fields.split(",") if f.strip()}
        if m.tenant_column is None or not given or not given <= wanted:
            problems.append(
                Problem(
                    "ROUTING_FIELD",
                    Severity.WARNING,
                    f"{m.schema_name}.{m.table_name}",
                    "partition.payload.fields",
                    f"its topic is routed by {sorted(given)}, not by the tenant column "
                    f"{m.tenant_column!r}: a row whose routing value changes moves to another "
                    "partition, and its changes may be applied out of order",
                    f"route by change.{m.tenant_column}"
                    if m.tenant_column
                    else "route only tables with a tenant column",
                )
            )
    return problems


def check_topics(
    partitions: Mapping[str, int],
    mappings: Sequence[TableMapping],
    *,
    topic_prefix: str,
    required: Sequence[str],
    connector: Mapping[str, str] | None,
    expected_partitions: int | None,
) -> list[Problem]:
    """Where the broker's topics (`partitions`: topic -> partition count) and the mappings
    disagree: each table's topic exists with the expected partitions (one, or what the
    connector's PartitionRouting or `expected_partitions` says), and the `required` topics
    (the DLQ, the reindex-request topic) exist: the worker refuses to start without them."""
    problems: list[Problem] = []
    for m in mappings:
        topic = m.topic_name(topic_prefix)
        routed = routing_partitions(connector, topic) if connector is not None else None
        wanted = routed[0] if routed is not None else (expected_partitions or 1)
        count = partitions.get(topic)
        where = f"{m.schema_name}.{m.table_name}"
        if count is None:
            problems.append(
                Problem(
                    "TOPIC_MISSING",
                    Severity.WARNING,
                    where,
                    topic,
                    f"topic {topic} does not exist: the worker does not start without it",
                    f"create it with {wanted} partition(s) (kafka-topics.sh --create --topic "
                    f"{topic} --partitions {wanted}), or let the connector create it on its "
                    "first start",
                )
            )
        elif count != wanted:
            why = (
                "the connector routes it over that many"
                if routed is not None
                else "a table topic has one partition unless it is routed by tenant"
            )
            problems.append(
                Problem(
                    "TOPIC_PARTITIONS",
                    Severity.WARNING,
                    where,
                    topic,
                    f"topic {topic} has {count} partition(s), {wanted} expected ({why}): with "
                    "several partitions routed by key, a TRUNCATE or a tenant move can overtake "
                    "the row changes before it",
                    f"recreate the topic with {wanted} partition(s), or route it by tenant "
                    "(`ragstream tables discover --connector --partitions N`) and pass "
                    "--partitions N",
                )
            )
    for topic in required:
        if topic not in partitions:
            problems.append(
                Problem(
                    "TOPIC_MISSING",
                    Severity.WARNING,
                    "",
                    topic,
                    f"topic {topic} does not exist: the worker does not start without it",
                    f"create it (kafka-topics.sh --create --topic {topic} --partitions 1)",
                )
            )
    return problems
