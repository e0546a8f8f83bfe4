"""`ragstream dev`: the whole system on one machine, on its embedded defaults.

One process runs: a tansu broker (Kafka protocol, loopback), the embedded SQLite SoR (two
tables: `entities` and `tickets`) that publishes Debezium-format events, qdrant-edge storage
under the data directory, the ingest worker, the gRPC Retrieve server and `/metrics`.
qdrant-edge allows one opener per shard, so the worker and the server share this process and
its store. Restarting reuses the data directory: the SoR and the index persist; the broker
(memory-only) gets a fresh snapshot of the SoR, which costs no embedding for unchanged rows.
"""

from __future__ import annotations

import asyncio
import functools
import hashlib
import json
import logging
import os
import secrets
import shlex
import shutil
import signal
import tempfile
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

import psycopg
from confluent_kafka.admin import AdminClient
from confluent_kafka.cimpl import NewTopic
from grpc_health.v1 import health_pb2
from prometheus_client import CollectorRegistry, start_http_server
from pydantic import SecretStr

from ragcore.embedders import build_embedder
from ragcore.embedders.base import Embedder
from ragcore.embedders.cache import EmbeddingCacheConfig
from ragcore.embedders.local_onnx import LocalEmbedderConfig
from ragcore.errors import ConfigError, RagstreamError
from ragcore.kafka_config import KafkaSettings
from ragcore.resources import package_dir
from ragcore.settings import SorSettings, StoreSettings, settings_report
from ragcore.store.host import StoreHost, advertise, new_host_key, withdraw
from ragcore.wiring import build_store, payload_schema
from ragdev.sample import SAMPLE_DDL, sample_rows
from ragdev.services.debezium import DebeziumConnect, PostgresSource
from ragdev.services.postgres import PostgresCluster
from ragdev.services.tansu import TansuBroker
from ragdev.sor.embedded import EmbeddedSor
from ragdev.sor.postgres_writer import PostgresWriter
from ragdev.stack import DEV_PLAN, STACK_FILE
from ragstream.query import QueryError, print_pack, query
from ragstream.reindex import calibrate_with
from retrieval_api.app import build_app, warm_calibrations
from retrieval_api.grpc_server import SERVICE_NAME
from retrieval_api.retriever import Retriever
from retrieval_api.settings import AuthSettings, GrpcSettings, RetrieveSettings
from streams.app import build_worker
from streams.consumer import ConsumerConfig
from streams.liveness import LivenessSettings
from streams.settings import IngestSettings, ReconcileSettings

log = logging.getLogger("ragdev.dev")

TOKENS_FILE = "dev-tokens.json"
#: The variables for admin commands beside the running stack (see `_write_env`).
ENV_FILE = "dev.env"
#: The topics the stack creates besides one per mapped table.
SERVICE_TOPICS = (
    "ragstream.dlq",
    # where `ragstream dlq replay` parks the letters it can never replay
    "ragstream.dlq.parked",
    "ragstream.audit",
    "ragstream.reindex-requests",
    # Debezium's heartbeats (`topic.heartbeat.prefix`.`topic.prefix`): created up front, so the
    # worker's pattern subscription finds it at once
    "__debezium-heartbeat.sor",
)
EXAMPLES = (
    ("acme", "If a client cancels a yearly plan after a few weeks, do they get money back?"),
    ("globex", "how often should the seal of the GX-300 be checked?"),
    ("acme", "what does error E-2113 mean?"),
    ("globex", "which customers reported a leaking seal?"),
)


@dataclass(frozen=True)
class DevPorts:
    """Loopback ports of the embedded stack."""

    kafka: int = 19092
    grpc: int = 50051
    metrics: int = 9464
    postgres: int = 15432


def _tokens(data_dir: Path, tenants: list[str]) -> dict[str, str]:
    """Demo API tokens per tenant, created once and kept (0600) in the data directory."""
    path = data_dir / TOKENS_FILE
    tokens: dict[str, str] = json.loads(path.read_text()) if path.exists() else {}
    for tenant in tenants:
        tokens.setdefault(tenant, secrets.token_urlsafe(24))
    path.write_text(json.dumps(tokens, indent=2))
    os.chmod(path, 0o600)
    return tokens


def _create_topics(bootstrap: str, table_topics: list[str], partitions: int) -> None:
    admin = AdminClient({"bootstrap.servers": bootstrap})
    futures = admin.create_topics(
        [NewTopic(t, num_partitions=partitions, replication_factor=1) for t in table_topics]
        + [NewTopic(t, num_partitions=1, replication_factor=1) for t in SERVICE_TOPICS]
    )
    for topic, future in futures.items():
        try:
            future.result(15)
        except Exception as exc:  # confluent raises KafkaException(TOPIC_ALREADY_EXISTS)
            if "already exists" not in str(exc).lower():
                raise ConfigError(f"cannot create topic {topic}: {exc}") from exc


def _write_env(
    data_dir: Path, store: StoreSettings, sor: SorSettings, bootstrap: str, ports: DevPorts
) -> None:
    """`<data_dir>/dev.env` (0600): the RAGSTREAM_* variables that point `ragstream reconcile`,
    `reindex`, `calibrate`, `index` and `status` at this stack (`set -a; . data/dev.env`)."""
    tables = [m.model_dump(mode="json") for m in DEV_PLAN.tables]
    env = {
        "RAGSTREAM_STORE__DATA_DIR": str(store.data_dir),
        "RAGSTREAM_SOR__KIND": sor.kind,
        "RAGSTREAM_PLAN__TABLES": json.dumps(tables, separators=(",", ":")),
        "RAGSTREAM_KAFKA__BOOTSTRAP_SERVERS": bootstrap,
        "RAGSTREAM_EMBEDDING_CACHE__PATH": str(data_dir / "embedding-cache.sqlite"),
        "RAGSTREAM_METRICS_PORT": str(ports.metrics),
    }
    if sor.sqlite_path is not None:
        env["RAGSTREAM_SOR__SQLITE_PATH"] = str(sor.sqlite_path)
    if sor.dsn is not None:
        env["RAGSTREAM_SOR__DSN"] = sor.dsn.get_secret_value()
    path = data_dir / ENV_FILE
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w", encoding="utf-8") as out:
        out.writelines(f"{k}={shlex.quote(v)}\n" for k, v in env.items())


class _DevSor(Protocol):
    """The dev stack's system of record and how its rows reach the broker."""

    settings: SorSettings

    def publish(self) -> int:
        """Send every row to the broker as a snapshot; the number of records to expect."""
        ...

    def describe(self) -> dict[str, Any]:
        """What `ragstream sor` needs to write to it (the stack file)."""
        ...

    @property
    def has_connector(self) -> bool:
        """Whether a Debezium connector (with heartbeats) captures the changes."""
        ...

    def supervise(self, stop: threading.Event) -> None:
        """Until `stop`: restart what captures changes when it dies, or say why it cannot."""
        ...

    def close(self) -> None:
        """Stop what it started."""
        ...


class _SqliteDevSor:
    """The embedded SQLite SoR: it publishes Debezium-format events itself."""

    def __init__(self, data_dir: Path, bootstrap: str, samples: dict[str, list[Any]]) -> None:
        ddl = [(package_dir("schemas") / "sql" / f).read_text() for f in SAMPLE_DDL["sqlite"]]
        self.sor = EmbeddedSor(data_dir / "sor.sqlite", bootstrap, plan=DEV_PLAN, ddl=ddl)
        if self.sor.count() == 0:
            for table, rows in samples.items():
                loaded = self.sor.load(table, rows)
                print(f"loaded {loaded} sample rows into table {table} ({self.sor.path})")
        self.settings = SorSettings(kind="sqlite", sqlite_path=self.sor.path)

    def publish(self) -> int:
        total = self.sor.snapshot()
        topics = ", ".join(DEV_PLAN.catalog.topics())
        print(f"published a snapshot of {total} rows to {topics}", flush=True)
        return total

    def describe(self) -> dict[str, Any]:
        return {"sor_kind": "sqlite", "sor": str(self.sor.path)}

    @property
    def has_connector(self) -> bool:
        return False  # the embedded SoR publishes its own events, in this process

    def supervise(self, stop: threading.Event) -> None:
        return None

    def close(self) -> None:
        self.sor.close()


class _PostgresDevSor:
    """PostgreSQL (kept under the data directory, logical decoding on) and real Debezium
    (Kafka Connect standalone with the shipped connector configuration): the production
    topology on one machine. Each start snapshots afresh (the broker keeps nothing)."""

    def __init__(
        self, data_dir: Path, bootstrap: str, port: int, samples: dict[str, list[Any]]
    ) -> None:
        self.cluster = PostgresCluster(logical=True, root=data_dir / "postgres", port=port)
        try:
            self.cluster.start()
        except ConfigError as exc:
            raise ConfigError(f"cannot start PostgreSQL on 127.0.0.1:{port}: {exc}") from exc
        self.dsn = self.cluster.dsn
        self.settings = SorSettings(kind="postgres", dsn=SecretStr(self.dsn))
        with psycopg.connect(self.dsn, autocommit=True) as conn:
            for name in SAMPLE_DDL["postgres"]:
                conn.execute((package_dir("schemas") / "sql" / name).read_bytes())
        writer = PostgresWriter(self.dsn, DEV_PLAN)
        try:
            for table, rows in samples.items():
                if writer.count(table) == 0:
                    for row in rows:
                        writer.put(table, row)
                    print(f"loaded {len(rows)} sample rows into table {table} (PostgreSQL)")
            self.rows = sum(writer.count(t) for t in samples)
        finally:
            writer.close()
        self.debezium = DebeziumConnect(
            bootstrap_servers=bootstrap,
            source=PostgresSource("127.0.0.1", port, "postgres", "postgres"),
            tables=[m.table for m in DEV_PLAN.tables],
            topic_prefix=DEV_PLAN.topic_prefix,
            name="ragstream-dev",
            work_dir=data_dir / "connect",
        )

    def publish(self) -> int:
        # fresh offsets: the memory-only broker lost every topic, Debezium snapshots again
        (self.debezium.work_dir / "offsets.dat").unlink(missing_ok=True)
        began = time.monotonic()
        self.debezium.start()
        print(
            f"Debezium (Kafka Connect, pid {self.debezium.pid}) running after "
            f"{time.monotonic() - began:.1f}s: snapshot of {self.rows} rows",
            flush=True,
        )
        return self.rows

    def describe(self) -> dict[str, Any]:
        return {
            "sor_kind": "postgres",
            "sor_dsn": self.dsn,
            "debezium_rest": self.debezium.rest_url,
            "debezium_log": str(self.debezium.log_path),
        }

    @property
    def has_connector(self) -> bool:
        return True

    def supervise(self, stop: threading.Event, every_s: float = 2.0) -> None:
        """Watch the Kafka Connect JVM; when it exits, reap it, say so and restart it (it
        resumes from its offsets and the kept slot), backing off from 5 s to 5 min while a
        restart fails; each failure is printed with the log's causes."""
        backoff = 5.0
        while not stop.wait(every_s):
            code = self.debezium.exited()
            if code is None:
                continue
            print(
                f"Debezium (Kafka Connect) exited with status {code}: changes are not captured "
                f"until it runs again; restarting (log: {self.debezium.log_path})",
                flush=True,
            )
            while not stop.is_set():
                try:
                    self.debezium.restart()
                except RagstreamError as exc:
                    print(
                        f"Debezium could not be restarted, next try in {backoff:.0f} s: {exc}",
                        flush=True,
                    )
                    if stop.wait(backoff):
                        return
                    backoff = min(backoff * 2, 300.0)
                    continue
                print(f"Debezium restarted (pid {self.debezium.pid})", flush=True)
                backoff = 5.0
                break

    def close(self) -> None:
        try:
            self.debezium.stop()
        finally:
            self.cluster.stop()


def run_dev(
    data_dir: Path,
    *,
    ports: DevPorts | None = None,
    sample_limit: int | None = None,
    sor: str = "sqlite",
) -> int:
    """Start everything, load the sample corpus, serve until Ctrl-C, shut down cleanly."""
    if sor not in ("sqlite", "postgres"):
        raise ConfigError(f"--sor must be sqlite or postgres, not {sor!r}")
    ports = ports or DevPorts()
    data_dir = data_dir.resolve()
    data_dir.mkdir(parents=True, exist_ok=True)
    registry = CollectorRegistry()
    broker = TansuBroker(port=ports.kafka, log_path=data_dir / "tansu.log")
    try:
        broker.start()
    except RagstreamError as exc:  # a port in use surfaces as a dead process: say which
        raise ConfigError(f"cannot start the broker on 127.0.0.1:{ports.kafka}: {exc}") from exc
    started = time.monotonic()
    try:
        return _run(
            data_dir, ports, registry, broker, sample_limit=sample_limit, started=started, sor=sor
        )
    finally:
        broker.stop()
        (data_dir / STACK_FILE).unlink(missing_ok=True)


def _run(
    data_dir: Path,
    ports: DevPorts,
    registry: CollectorRegistry,
    broker: TansuBroker,
    *,
    sample_limit: int | None,
    started: float,
    sor: str,
) -> int:
    bootstrap = broker.bootstrap_servers
    samples = sample_rows(sample_limit)
    # Debezium writes each table to one partition (its TRUNCATE is key-less); the embedded
    # SoR keys every event, so its topics take 4
    _create_topics(bootstrap, DEV_PLAN.catalog.topics(), partitions=1 if sor == "postgres" else 4)
    source: _DevSor = (
        _PostgresDevSor(data_dir, bootstrap, ports.postgres, samples)
        if sor == "postgres"
        else _SqliteDevSor(data_dir, bootstrap, samples)
    )
    try:
        return _serve_stack(
            data_dir,
            ports,
            registry=registry,
            bootstrap=bootstrap,
            source=source,
            samples=samples,
            started=started,
        )
    finally:
        source.close()


def _serve_stack(
    data_dir: Path,
    ports: DevPorts,
    *,
    registry: CollectorRegistry,
    bootstrap: str,
    source: _DevSor,
    samples: dict[str, list[Any]],
    started: float,
) -> int:
    store_settings = StoreSettings(data_dir=data_dir / "store")
    store = build_store(store_settings, payload_schema(DEV_PLAN))
    embedder = build_embedder(
        LocalEmbedderConfig(),
        cache=EmbeddingCacheConfig(path=data_dir / "embedding-cache.sqlite"),
        registry=registry,
    )
    kafka = KafkaSettings(bootstrap_servers=bootstrap)
    sor_settings = source.settings
    ingest_settings = IngestSettings(
        kafka=kafka,
        consumer=ConsumerConfig(
            session_timeout_ms=6000,
            heartbeat_interval_ms=1000,
            reindex_topic="ragstream.reindex-requests",
            # tansu under-reports its high watermark (the base offset of the last record batch
            # + 1) and keeps nothing across restarts: no log here can be truncated under the
            # worker, so only an offset below the log start counts as lost
            high_watermark_slack=1_000_000,
        ),
        store=store_settings,
        sor=sor_settings,
        plan=DEV_PLAN,
        embedding_cache=None,
        reconcile=ReconcileSettings(interval_s=600.0),
        liveness=LivenessSettings(heartbeats=source.has_connector),
    )
    worker = build_worker(ingest_settings, registry, store=store, embedder=embedder)
    tenants = sorted({r["company_id"] for rows in samples.values() for r in rows})
    tokens = _tokens(data_dir, tenants)
    retrieve_settings = RetrieveSettings(
        grpc=GrpcSettings(port=ports.grpc),
        auth=AuthSettings(
            tokens={t: hashlib.sha256(v.encode()).hexdigest() for t, v in tokens.items()}
        ),
        store=store_settings,
        sor=sor_settings,
        plan=DEV_PLAN,
        kafka=kafka,
    )
    app = build_app(retrieve_settings, registry, store=store, embedder=embedder)
    start_http_server(ports.metrics, "127.0.0.1", registry=registry)
    # admin commands (reconcile, reindex, calibrate, index) use the store through this host
    # while the stack holds it open (ragcore/store/host.py)
    host_dir = Path(tempfile.mkdtemp(prefix="ragstream-dev-"))  # mode 0700
    host_key = new_host_key()
    host = StoreHost(store, host_dir / "store.sock", authkey=host_key)
    host.start()
    advertise(store_settings.data_dir, host, host_key)
    threads: list[threading.Thread] = []
    failures: list[BaseException] = []

    def ingest() -> None:
        try:
            worker.loop.run(worker.stop)
        except BaseException as exc:  # noqa: BLE001 - reported by the watchdog in `_serve`
            failures.append(exc)

    def ingest_lost() -> str | None:
        """Why the ingest worker's loop is gone (None while it runs)."""
        if failures:
            return f"{type(failures[0]).__name__}: {failures[0]}"
        if threads and not threads[0].is_alive() and not worker.stop.is_set():
            return "the ingest thread ended"
        return None

    try:
        worker.check()
        worker.loop.start()
        threads.append(threading.Thread(target=ingest, name="ingest", daemon=True))
        threads.append(
            threading.Thread(target=worker.reconcile_forever, name="reconcile", daemon=True)
        )
        for thread in threads:
            thread.start()
        total = source.publish()
        if source.has_connector:
            watchers = [
                threading.Thread(target=worker.watch_sources, name="liveness", daemon=True),
                threading.Thread(
                    target=source.supervise, args=(worker.stop,), name="debezium", daemon=True
                ),
            ]
            for thread in watchers:
                thread.start()
            threads += watchers
        _wait_indexed(registry, total)
        _calibrate(app.retriever, embedder, tenants)
        _write_env(data_dir, store_settings, sor_settings, bootstrap, ports)
        (data_dir / STACK_FILE).write_text(
            json.dumps(
                {
                    "kafka": bootstrap,
                    "grpc": f"127.0.0.1:{ports.grpc}",
                    "metrics": f"http://127.0.0.1:{ports.metrics}/metrics",
                    "topics": DEV_PLAN.catalog.topics(),
                    **source.describe(),
                    # what `ragstream config --dev` shows: the settings the stack runs with
                    # (built in code, not from the environment), secrets masked
                    "settings": {
                        "ingest": settings_report(ingest_settings),
                        "retrieve": settings_report(retrieve_settings),
                    },
                },
                indent=2,
            )
        )
        lost = asyncio.run(_serve(app, tokens, ports, started, data_dir, ingest_lost=ingest_lost))
    finally:
        worker.stop.set()
        for thread in threads:
            thread.join(30)
        withdraw(store_settings.data_dir)
        host.close()
        shutil.rmtree(host_dir, ignore_errors=True)
        app.close()
        embedder.close()
        store.close()
        (data_dir / ENV_FILE).unlink(missing_ok=True)
    if lost is not None:
        print(f"stopped: the ingest worker lost its processing loop ({lost})", flush=True)
        return 1
    print("stopped cleanly", flush=True)
    return 0


def _calibrate(retriever: Retriever, embedder: Embedder, tenants: Sequence[str]) -> None:
    """Fit the evidence calibration of each tenant's active index once it is indexed, as a
    reindex does (`ragstream calibrate`), so that the stack scores with a fitted model rather
    than the prior; a version calibrated by an earlier start is kept."""
    calibrate = calibrate_with(retriever, embedder)
    for tenant in tenants:
        index = retriever.registry.lookup(tenant, None)
        if retriever.registry.load_calibration(tenant, index.version) is not None:
            continue
        started = time.perf_counter()
        fitted = calibrate(tenant, index.version, lambda _line: None)
        print(
            f"  calibrated {index.collection}: order {fitted['order']}, hard threshold "
            f"{fitted['hard_threshold']:.3f} ({time.perf_counter() - started:.1f} s)",
            flush=True,
        )


def _wait_indexed(registry: CollectorRegistry, total: int) -> None:
    """Block until the worker has handled `total` records, printing counts and rates."""
    began = time.monotonic()
    last_print = 0.0
    while True:
        done = sum(
            sample.value
            for metric in registry.collect()
            if metric.name == "ragstream_ingest_events"
            for sample in metric.samples
            if sample.name == "ragstream_ingest_events_total"
            and sample.labels.get("op") != "heartbeat"
        )
        now = time.monotonic()
        if done >= total or now - last_print >= 2.0:
            rate = done / max(now - began, 1e-6)
            print(f"  ingested {int(done)}/{total} records ({rate:.1f}/s)", flush=True)
            last_print = now
        if done >= total:
            return
        time.sleep(0.25)


async def _serve(
    app: Any,
    tokens: dict[str, str],
    ports: DevPorts,
    started: float,
    data_dir: Path,
    *,
    ingest_lost: Callable[[], str | None],
) -> str | None:
    """Serve until Ctrl-C, or until the ingest worker loses its processing loop: then the
    health service says NOT_SERVING at once, the stack says why and stops (returned: why)."""
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    await app.server.start()
    lost: list[str] = []
    watchdog = asyncio.create_task(_watch_ingest(app, ingest_lost, stop, lost))
    warming = warm_calibrations(app)
    print(
        f"\nragstream is up ({time.monotonic() - started:.1f}s):\n"
        f"  gRPC Retrieve   127.0.0.1:{ports.grpc}  (ragstream.retrieval.v1.RetrievalService)\n"
        f"  metrics         http://127.0.0.1:{ports.metrics}/metrics\n"
        f"  Kafka (tansu)   127.0.0.1:{ports.kafka}\n"
        f"  data            {data_dir}\n"
        f"  tokens          {data_dir / TOKENS_FILE}",
        flush=True,
    )
    try:
        for tenant, question in EXAMPLES:
            if tenant not in tokens:
                continue
            print(f"\n$ ragstream query --tenant {tenant} {json.dumps(question)}", flush=True)
            call = functools.partial(
                query, f"127.0.0.1:{ports.grpc}", tokens[tenant], question, tenant=tenant
            )
            try:
                pack = await loop.run_in_executor(None, call)
            except QueryError as exc:
                print(f"query failed: {exc}", flush=True)
                continue
            print_pack(pack, as_json=False)
        print(
            "\nTry: ragstream sor put --tenant acme --id my-doc"
            " --text 'Our office dog is called Rex.'"
            "\n     ragstream query --tenant acme 'what is the name of the office dog?'"
            f"\nAdmin commands run beside it: set -a; . {data_dir / ENV_FILE}; set +a"
            "\n     ragstream reconcile --tenant acme; ragstream index list --tenant acme;"
            " ragstream status"
            "\nPress Ctrl-C to stop.",
            flush=True,
        )
        await stop.wait()
        print("\nshutting down...", flush=True)
    finally:
        watchdog.cancel()
        warming.set()
        await app.server.stop()
    return lost[0] if lost else None


async def _watch_ingest(
    app: Any, ingest_lost: Callable[[], str | None], stop: asyncio.Event, lost: list[str]
) -> None:
    """Every half second: has the ingest worker lost its loop? Then NOT_SERVING, say so, stop."""
    while not stop.is_set():
        await asyncio.sleep(0.5)
        reason = ingest_lost()
        if reason is None:
            continue
        for name in ("", SERVICE_NAME):
            await app.server.health.set(name, health_pb2.HealthCheckResponse.NOT_SERVING)
        print(
            f"\nERROR: the ingest worker lost its processing loop ({reason}): nothing is "
            "indexed any more; health is NOT_SERVING; stopping the dev stack (exit 1)",
            flush=True,
        )
        lost.append(reason)
        stop.set()
