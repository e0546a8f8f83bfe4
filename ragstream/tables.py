"""`ragstream tables discover` and `ragstream tables check`: map your own PostgreSQL tables.

discover reads a live database's catalog (and the first rows of each table) and prints a
proposed `RAGSTREAM_PLAN__TABLES`, the reason for every choice, the problems the proposal
still has with their fixes, and (`--connector`) the Debezium connector that matches it.
check validates mappings (`RAGSTREAM_PLAN__TABLES` or `--tables FILE`) against the live
database, a connector configuration (`--connector FILE`) and the broker before anything runs.
Both only read: the session is read-only and every statement has a timeout.

Exit codes (check): 0 no problem (notes allowed), 1 problems found (errors, and warnings
unless `--errors-only`), 2 a usage or configuration error, 3 the database or the broker
unreachable. discover: 0 at least one table proposed, 1 none, 2 and 3 as check.
"""

from __future__ import annotations

import json
import os
import sys
from collections.abc import Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import psycopg
from psycopg.conninfo import conninfo_to_dict
from psycopg.rows import dict_row
from pydantic import TypeAdapter, ValidationError

from ragcore.errors import ConfigError, RagstreamError
from ragcore.kafka_config import KafkaSettings
from ragcore.mapping import TableMapping
from ragcore.plan import PlanConfig
from ragcore.sor.mapcheck import (
    Problem,
    Query,
    Severity,
    check_mappings,
    qualified_sql,
    quote,
    sample_rows,
)
from ragcore.sor.pgcatalog import ColumnKind, DatabaseInfo, TableInfo, read_catalog
from ragcore.sor.sql import describe, redact
from ragstream.connector import (
    ConnectorTarget,
    LoadedConnector,
    check_connector,
    check_topics,
    debezium_server_properties,
    kafka_connect_config,
    publication_of,
)
from ragstream.discover import DiscoverOptions, Discovery, TableSample, propose

EXIT_OK = 0
EXIT_PROBLEMS = 1
EXIT_USAGE = 2
EXIT_UNREACHABLE = 3
#: Every statement of a session may take this long (a lock held elsewhere fails it instead of
#: hanging the command).
STATEMENT_TIMEOUT_MS = 30_000


class UnreachableError(RagstreamError):
    """The database or the broker cannot be reached (exit code 3)."""

    code = "UNREACHABLE"


def dsn_from(given: str | None) -> str:
    """`--dsn`, else `RAGSTREAM_SOR__DSN`; a ConfigError naming both when neither is set."""
    dsn = given or os.environ.get("RAGSTREAM_SOR__DSN")
    if not dsn:
        raise ConfigError(
            "no database: pass --dsn 'host=... dbname=... user=...' or set RAGSTREAM_SOR__DSN"
        )
    return dsn


@contextmanager
def connect(dsn: str) -> Iterator[psycopg.Connection[dict[str, Any]]]:
    """A read-only session with a statement timeout and no JIT; UnreachableError (the
    password redacted) when the database cannot be reached."""
    try:
        conn = psycopg.connect(dsn, autocommit=True, connect_timeout=10, row_factory=dict_row)
    except psycopg.Error as exc:
        where = describe(dsn) or "the database"
        raise UnreachableError(redact(f"cannot connect to {where}: {exc}".strip(), dsn)) from exc
    try:
        conn.execute(f"SET statement_timeout = {STATEMENT_TIMEOUT_MS}".encode())
        conn.execute(b"SET default_transaction_read_only = on")
        # short catalog and sample queries: compiling them (JIT) costs more than running them
        conn.execute(b"SET jit = off")
        yield conn
    finally:
        conn.close()


def query_of(conn: psycopg.Connection[dict[str, Any]], dsn: str) -> Query:
    """The `Query` of a session: psycopg's operational errors become UnreachableError."""

    def query(sql: str, params: Sequence[Any]) -> list[dict[str, Any]]:
        try:
            return conn.execute(sql.encode(), list(params)).fetchall()
        except psycopg.errors.QueryCanceled as exc:
            raise UnreachableError(
                f"the database did not answer within {STATEMENT_TIMEOUT_MS // 1000} s "
                f"(statement_timeout): {exc}"
            ) from exc
        except psycopg.OperationalError as exc:
            raise UnreachableError(redact(f"the database failed: {exc}", dsn)) from exc

    return query


# --- discover --------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class DiscoverRequest:
    """What `ragstream tables discover` was asked."""

    dsn: str
    schemas: tuple[str, ...] = ()
    tables: tuple[str, ...] = ()
    exclude: tuple[str, ...] = ()
    options: DiscoverOptions = field(default_factory=DiscoverOptions)
    sample_rows: int = 1000
    connector: bool = False
    target: ConnectorTarget = field(default_factory=ConnectorTarget)
    #: the publication was given (else an existing one covering every proposed table is used)
    publication_given: bool = False
    bootstrap_servers: str = "127.0.0.1:9092"


def sample_tables(query: Query, db: DatabaseInfo, rows: int) -> dict[str, TableSample]:
    """The first `rows` rows of each readable table: the average length of its text columns
    and whether its JSON columns hold objects."""
    samples: dict[str, TableSample] = {}
    if rows <= 0:
        return samples
    for qualified, table in db.tables.items():
        if not table.readable:
            continue
        found = _sample(query, table, rows)
        if found is not None:
            samples[qualified] = found
    return samples


def _sample(query: Query, table: TableInfo, rows: int) -> TableSample | None:
    text = [
        c.name
        for c in table.columns
        if c.kind in (ColumnKind.TEXT, ColumnKind.ENUM) and c.readable and not c.generated
    ]
    json_cols = [
        c.name
        for c in table.columns
        if c.kind is ColumnKind.JSON and c.readable and not c.generated
    ]
    columns = text + json_cols
    if not columns:
        return None
    parts = ["count(*) AS n"]
    parts += [f"avg(length({quote(c)}::text)) AS t{n}" for n, c in enumerate(text)]
    parts += [
        f"bool_and(jsonb_typeof({quote(c)}::jsonb) IN ('object', 'null')) AS j{n}"
        for n, c in enumerate(json_cols)
    ]
    sql = (
        f"SELECT {', '.join(parts)} FROM (SELECT {', '.join(quote(c) for c in columns)} "
        f"FROM {qualified_sql(table.qualified)} LIMIT %s) AS s"
    )
    try:
        row = query(sql, [rows])[0]
    except psycopg.Error as exc:
        # e.g. a json column holding text that is no JSON: the proposal says so in a note
        return TableSample(rows=0, error=f"{type(exc).__name__}: {str(exc).strip()}")
    return TableSample(
        rows=int(row["n"]),
        avg_chars={c: float(row[f"t{n}"]) for n, c in enumerate(text) if row[f"t{n}"] is not None},
        objects={c: row[f"j{n}"] is not False for n, c in enumerate(json_cols)},
    )


def discover(request: DiscoverRequest) -> dict[str, Any]:
    """The discover report (JSON fields); UnreachableError when the database is unreachable."""
    with connect(request.dsn) as conn:
        query = query_of(conn, request.dsn)
        db = read_catalog(query, schemas=request.schemas or None, tables=request.tables or None)
        excluded = {t if "." in t else f"public.{t}" for t in request.exclude}
        db = replace(db, tables={k: v for k, v in db.tables.items() if k not in excluded})
        samples = sample_tables(query, db, request.sample_rows)
        discovery = propose(db, request.options, samples)
        mappings = [p.mapping for p in discovery.proposals]
        target = request.target
        if not request.publication_given:
            target = replace(target, publication=_publication_for(db, mappings, target.publication))
        problems = check_mappings(mappings, db, publication=target.publication)
        problems += sample_rows(query, mappings, db, request.sample_rows)
    report = _discover_report(
        request.dsn,
        db=db,
        discovery=discovery,
        problems=problems,
        samples=samples,
        target=target,
    )
    if request.connector:
        config = kafka_connect_config(mappings, target) if mappings else {}
        report["connector"] = {
            "kafka_connect": {"name": config.get("name"), "config": config} if config else None,
            "debezium_server": (
                debezium_server_properties(config, request.bootstrap_servers) if config else None
            ),
        }
    return report


def _publication_for(db: DatabaseInfo, mappings: Sequence[TableMapping], default: str) -> str:
    """An existing publication of the database that publishes every mapped table (one of
    exactly those tables first), else `default`."""
    names = {f"{m.schema_name}.{m.table_name}" for m in mappings}
    covering = [p for p in db.publications if names and names <= set(p.tables)]
    covering.sort(key=lambda p: (p.all_tables, len(p.tables), p.name))
    return covering[0].name if covering else default


def _discover_report(
    dsn: str,
    *,
    db: DatabaseInfo,
    discovery: Discovery,
    problems: Sequence[Problem],
    samples: Mapping[str, TableSample],
    target: ConnectorTarget,
) -> dict[str, Any]:
    by_table: dict[str, list[Problem]] = {}
    for problem in problems:
        by_table.setdefault(problem.table, []).append(problem)
    tables = []
    for p in discovery.proposals:
        info = db.tables[p.table]
        sample = samples.get(p.table)
        tables.append(
            {
                "table": p.table,
                "name": p.mapping.label,
                "topic": p.mapping.topic_name(target.topic_prefix),
                "rows_estimate": info.rows_estimate,
                "rows_read": sample.rows if sample is not None else 0,
                "replica_identity": info.replica_identity.value,
                "publications": [x.name for x in db.publications_of(p.table)],
                "reasons": dict(p.reasons),
                "unused_columns": dict(p.unused),
                "notes": list(p.notes),
                "problems": [x.to_dict() for x in by_table.get(p.table, [])],
            }
        )
    return {
        "database": {
            "server": describe(dsn),
            "version": db.version,
            "wal_level": db.wal_level,
            "publications": [
                {
                    "name": p.name,
                    "all_tables": p.all_tables,
                    "tables": sorted(p.tables),
                    "operations": [
                        op
                        for op, on in (
                            ("insert", p.inserts),
                            ("update", p.updates),
                            ("delete", p.deletes),
                            ("truncate", p.truncates),
                        )
                        if on
                    ],
                }
                for p in db.publications
            ],
            "slots": [
                {"name": s.name, "plugin": s.plugin, "active": s.active, "wal_status": s.wal_status}
                for s in db.slots
            ],
        },
        "RAGSTREAM_PLAN__TABLES": discovery.tables_json(),
        "tables": tables,
        "left_out": [
            {"table": x.table, "reason": x.reason, "fix": x.fix} for x in discovery.left_out
        ],
        "problems": [x.to_dict() for x in by_table.get("", [])],
        "publication": target.publication,
        "slot": target.slot,
        "topic_prefix": target.topic_prefix,
    }


def write_files(report: Mapping[str, Any], directory: Path) -> list[Path]:
    """The report's parts as files a deployment takes: tables.json (RAGSTREAM_PLAN__TABLES),
    fixes.sql (every SQL fix, to review and run), kafka-connect.json and
    debezium-server.properties (with --connector), report.json (all of it)."""
    directory.mkdir(parents=True, exist_ok=True)
    written: list[Path] = []

    def put(name: str, text: str) -> None:
        path = directory / name
        path.write_text(text, encoding="utf-8")
        written.append(path)

    put("tables.json", json.dumps(report["RAGSTREAM_PLAN__TABLES"], indent=2) + "\n")
    put("fixes.sql", fixes_sql(report))
    connector = report.get("connector")
    if connector and connector.get("kafka_connect"):
        put("kafka-connect.json", json.dumps(connector["kafka_connect"], indent=2) + "\n")
        put("debezium-server.properties", connector["debezium_server"])
    put("report.json", json.dumps(report, indent=2, ensure_ascii=False) + "\n")
    return written


def fixes_sql(report: Mapping[str, Any]) -> str:
    """Every problem's SQL fix once, each under a comment naming the problem."""
    problems = list(report.get("problems", []))
    for table in report.get("tables", []):
        problems += table.get("problems", [])
    lines = [
        "-- Fixes proposed by `ragstream tables discover`: review each before running it.",
        "-- (Run as the tables' owner; ALTER SYSTEM needs a superuser and a restart.)",
    ]
    seen: set[str] = set()
    for problem in problems:
        sql = problem.get("sql")
        if not sql or sql in seen:
            continue
        seen.add(sql)
        where = " ".join(p for p in (problem.get("table"), problem.get("field")) if p)
        lines += ["", f"-- {problem['code']} {where}: {problem['message']}", f"{sql};"]
    return "\n".join(lines) + "\n"


# --- check -----------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class CheckRequest:
    """What `ragstream tables check` was asked."""

    dsn: str
    plan: PlanConfig
    kafka: KafkaSettings | None
    required_topics: tuple[str, ...] = ()
    heartbeat_prefix: str = "__debezium-heartbeat"
    connector: LoadedConnector | None = None
    publication: str | None = None
    partitions: int | None = None
    sample_rows: int = 10_000
    errors_only: bool = False


def load_tables(path: Path) -> list[TableMapping]:
    """Table mappings from a JSON file (a list, as `RAGSTREAM_PLAN__TABLES` holds it, or
    discover's report with its `RAGSTREAM_PLAN__TABLES`); ConfigError naming the line of a
    JSON error, or the table and field of a mapping error."""
    try:
        text = path.read_text(encoding="utf-8")
    except OSError as exc:
        raise ConfigError(f"cannot read {path}: {exc}") from exc
    try:
        loaded = json.loads(text)
    except json.JSONDecodeError as exc:
        raise ConfigError(
            f"{path} is not JSON: {exc.msg} at line {exc.lineno} column {exc.colno}"
        ) from exc
    if isinstance(loaded, dict) and "RAGSTREAM_PLAN__TABLES" in loaded:
        loaded = loaded["RAGSTREAM_PLAN__TABLES"]
    try:
        plan = TypeAdapter(PlanConfig).validate_python({"tables": loaded})
    except ValidationError as exc:
        raise ConfigError(f"{path}: {_validation_text(exc)}") from exc
    return list(plan.tables)


def _validation_text(exc: ValidationError) -> str:
    return "; ".join(
        f"{'.'.join(str(p) for p in e['loc'])}: {e['msg']}" if e["loc"] else e["msg"]
        for e in exc.errors()
    )


def topic_partitions(kafka: KafkaSettings) -> dict[str, int]:
    """Every topic of the broker and its partition count; UnreachableError when the broker
    does not answer."""
    from confluent_kafka import KafkaException  # noqa: PLC0415 - only the check needs Kafka
    from confluent_kafka.admin import AdminClient  # noqa: PLC0415

    admin = AdminClient({**kafka.client_config(), "log_level": 0})
    try:
        metadata = admin.list_topics(timeout=10)
    except KafkaException as exc:
        raise UnreachableError(f"Kafka at {kafka.bootstrap_servers} unreachable: {exc}") from exc
    return {
        name: len(meta.partitions) for name, meta in metadata.topics.items() if meta.error is None
    }


def check(request: CheckRequest) -> tuple[dict[str, Any], int]:
    """The check report (JSON fields) and its exit code."""
    mappings = list(request.plan.tables)
    publication, created = publication_of(request.connector)
    if request.publication is not None:
        publication, created = request.publication, False
    with connect(request.dsn) as conn:
        query = query_of(conn, request.dsn)
        db = read_catalog(query, tables=[m.table for m in mappings], slots=False)
        problems = check_mappings(
            mappings, db, publication=publication, publication_created_by_connector=created
        )
        problems += sample_rows(query, mappings, db, request.sample_rows)
    if request.connector is not None:
        problems += check_connector(
            request.connector,
            mappings,
            topic_prefix=request.plan.topic_prefix,
            heartbeat_prefix=request.heartbeat_prefix,
            db=db,
        )
    if request.kafka is not None:
        problems += check_topics(
            topic_partitions(request.kafka),
            mappings,
            topic_prefix=request.plan.topic_prefix,
            required=request.required_topics,
            connector=request.connector.config if request.connector is not None else None,
            expected_partitions=request.partitions,
        )
    counts = {s.value: sum(1 for p in problems if p.severity is s) for s in Severity}
    failing = counts["error"] + (0 if request.errors_only else counts["warning"])
    report = {
        "ok": failing == 0,
        "checked": {
            "database": describe(request.dsn),
            "tables": [f"{m.schema_name}.{m.table_name}" for m in mappings],
            "publication": publication,
            "connector": str(request.connector.path) if request.connector else None,
            "broker": request.kafka.bootstrap_servers if request.kafka else None,
            "rows_read_per_table": request.sample_rows,
        },
        "counts": counts,
        "problems": [p.to_dict() for p in problems],
    }
    return report, EXIT_OK if failing == 0 else EXIT_PROBLEMS


def print_lines(problems: Sequence[Mapping[str, Any]]) -> None:
    """One line per problem on stderr, errors first (the JSON report goes to stdout)."""
    order = {"error": 0, "warning": 1, "note": 2}
    for p in sorted(problems, key=lambda p: order.get(str(p["severity"]), 3)):
        where = " ".join(x for x in (p.get("table"), p.get("field")) if x)
        print(
            f"{str(p['severity']).upper()} {where}: {p['message']}\n    fix: {p['fix']}",
            file=sys.stderr,
        )


def dsn_parts(dsn: str) -> dict[str, str]:
    """The host, port and database of a DSN (for the connector)."""
    try:
        parts = conninfo_to_dict(dsn)
    except psycopg.Error as exc:
        raise ConfigError(redact(f"the DSN cannot be parsed: {exc}", dsn)) from exc
    out = {k: str(parts[k]) for k in ("host", "port", "dbname") if parts.get(k)}
    out.setdefault("port", "5432")
    return out
