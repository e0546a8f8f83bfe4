"""The system the live-Prometheus tests watch: the real-CDC stack (PostgreSQL, real Debezium
through Kafka Connect, the tansu broker, the ingest worker, qdrant-edge, the gRPC Retrieve
server), each service's `/metrics` on its own loopback port, plus the parts an SRE's faults
need: a TCP proxy between Retrieve and PostgreSQL (cut it: the SoR is down; slow it: the SoR is
slow), a consumer-group lag exporter (what kafka-exporter is in production), a Retrieve load
generator, and a second worker for the stall scenario.

The embedder is `HashEmbedder` behind the real embedding cache (what the worker's cache metrics
report); its `fail_with` makes it raise what an unreachable embedding service raises.
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import itertools
import json
import logging
import select
import socket
import threading
import time
import uuid
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import grpc
import psycopg
from confluent_kafka import Consumer, KafkaException, Producer, TopicPartition
from confluent_kafka.admin import AdminClient
from prometheus_client import CollectorRegistry, start_http_server
from prometheus_client.core import GaugeMetricFamily, Metric
from prometheus_client.registry import Collector
from pydantic import SecretStr

from ragcore.embedders.cache import CachedEmbedder, EmbeddingCache
from ragcore.errors import StoreUnavailableError
from ragcore.kafka_config import KafkaSettings
from ragcore.mapping import TableMapping
from ragcore.plan import PlanConfig
from ragcore.settings import SorSettings, StoreSettings
from ragcore.store.edge import EdgeStore
from ragcore.wiring import build_store, payload_schema
from ragdev.services.debezium import DebeziumConnect, PostgresSource
from ragdev.services.postgres import PostgresCluster
from ragdev.services.tansu import TansuBroker, free_port
from retrieval_api.app import RetrieveApp, build_app
from retrieval_api.settings import AuthSettings, GrpcSettings, RetrieveSettings
from schemas.proto.ragstream.retrieval.v1 import retrieval_pb2 as pb
from schemas.proto.ragstream.retrieval.v1 import retrieval_pb2_grpc as pb_grpc
from streams.app import IngestWorker, build_worker
from streams.settings import IngestSettings, ReconcileSettings
from tests.conftest import REPO_ROOT
from tests.streams.support import HashEmbedder, create_topics, fast_consumer

log = logging.getLogger(__name__)

TOKENS = {"acme": "acme-live-token", "globex": "globex-live-token"}
#: acme's rows: more than the drift alert's 100, fewer points than the promotion threshold.
ACME_ROWS = 130
GLOBEX_ROWS = 20
#: A shared tenant above this many points is due for promotion (the scenario adds rows).
PROMOTE_ABOVE = 200
TOPICS_OF = ("Refunds", "VPN tokens", "Pump seals", "Invoices", "Error codes")


def tokens_json() -> str:
    """The Retrieve server's tokens file: each tenant's token digest."""
    return json.dumps({t: hashlib.sha256(v.encode()).hexdigest() for t, v in TOKENS.items()})


def row_text(n: int) -> str:
    """Content of seeded row n: one of a few topics, with the row's own number."""
    topic = TOPICS_OF[n % len(TOPICS_OF)]
    return f"{topic} note {n}: {topic.lower()} are handled by the desk within {n % 9 + 1} days."


class TcpProxy:
    """A loopback TCP proxy in front of `target_port`: `cut()` refuses and drops every
    connection (the server is down), `restore()` accepts again on the same port, `delay_s`
    holds every chunk the server sends (a slow server)."""

    def __init__(self, target_port: int) -> None:
        self.target_port = target_port
        self.port = free_port()
        self.delay_s = 0.0
        self._lock = threading.Lock()
        self._conns: list[socket.socket] = []
        self._listener: socket.socket | None = None
        self.restore()

    def restore(self) -> None:
        """Listen again (no-op while listening)."""
        with self._lock:
            if self._listener is not None:
                return
            listener = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
            listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            listener.bind(("127.0.0.1", self.port))
            listener.listen(64)
            self._listener = listener
        threading.Thread(target=self._accept, args=(listener,), daemon=True).start()

    def cut(self) -> None:
        """Stop listening and reset every open connection."""
        with self._lock:
            listener, self._listener = self._listener, None
            conns, self._conns = self._conns, []
        # shutdown() first: close() alone does not wake a thread blocked in accept() or
        # select() on Linux, and the socket would keep accepting (and forwarding)
        for sock in ([listener] if listener is not None else []) + conns:
            with contextlib.suppress(OSError):  # not connected (any more)
                sock.shutdown(socket.SHUT_RDWR)
            sock.close()

    def _accept(self, listener: socket.socket) -> None:
        while True:
            try:
                client, _ = listener.accept()
            except OSError:
                return  # shut down by cut()
            if self._listener is not listener:
                client.close()  # accepted while being cut
                return
            try:
                server = socket.create_connection(("127.0.0.1", self.target_port), timeout=5)
            except OSError:
                client.close()
                continue
            with self._lock:
                self._conns += [client, server]
            threading.Thread(target=self._pump, args=(client, server), daemon=True).start()

    def _pump(self, client: socket.socket, server: socket.socket) -> None:
        peers = {client: server, server: client}
        try:
            while True:
                readable, _, _ = select.select(list(peers), [], [], 1.0)
                for sock in readable:
                    data = sock.recv(65536)
                    if not data:
                        return
                    if sock is server and self.delay_s:
                        time.sleep(self.delay_s)
                    peers[sock].sendall(data)
        except (OSError, ValueError):
            return  # a side was closed (cut() or the peer)
        finally:
            client.close()
            server.close()


class GroupLag(Collector):
    """`kafka_consumergroup_lag{consumergroup, topic, partition}` as danielqsj/kafka-exporter
    exports it (high watermark minus the group's committed offset), for the alert that must
    work when no worker is alive. On tansu the high watermark is right when the last record
    batch held one record, which Debezium's one-row transactions here produce."""

    def __init__(self, bootstrap: str, group: str, topics: Sequence[str]) -> None:
        self._group = group
        self._topics = list(topics)
        self._consumer = Consumer(
            {"bootstrap.servers": bootstrap, "group.id": group, "enable.auto.commit": False}
        )
        self._lock = threading.Lock()

    def collect(self) -> Iterator[Metric]:
        family = GaugeMetricFamily(
            "kafka_consumergroup_lag",
            "Records behind the high watermark per group and partition.",
            labels=["consumergroup", "topic", "partition"],
        )
        with self._lock:
            tps = [TopicPartition(t, 0) for t in self._topics]
            try:
                committed = self._consumer.committed(tps, timeout=2)
                for tp in committed:
                    low, high = self._consumer.get_watermark_offsets(tp, timeout=2)
                    lag = high - (tp.offset if tp.offset >= 0 else low)
                    family.add_metric([self._group, tp.topic, str(tp.partition)], max(0, lag))
            except KafkaException as exc:
                log.warning("lag exporter: broker did not answer: %s", exc)
        yield family

    def close(self) -> None:
        with self._lock:
            self._consumer.close()


class Load:
    """Background Retrieve traffic: every `period_s` one request of the current query list,
    round robin (errors are counted, not raised: the metrics are what is being watched)."""

    def __init__(self, client: pb_grpc.RetrievalServiceStub, period_s: float = 0.1) -> None:
        self._client = client
        self._period = period_s
        # words of the seeded rows (row_text): hits pass the evidence threshold, so every
        # request reaches the SoR verification
        self.queries: list[tuple[str, str]] = [
            ("acme", "refunds note handled by the desk"),
            ("globex", "vpn tokens note handled by the desk"),
            ("acme", "pump seals note handled by the desk"),
        ]
        self.ok = 0
        self.failed: dict[str, int] = {}
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def _run(self) -> None:
        for n in itertools.count():
            if self._stop.wait(self._period):
                return
            queries = self.queries
            tenant, text = queries[n % len(queries)]
            try:
                ask(self._client, tenant, text)
                self.ok += 1
            except grpc.RpcError as exc:
                name = exc.code().name
                self.failed[name] = self.failed.get(name, 0) + 1

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(30)


def ask(
    client: pb_grpc.RetrievalServiceStub, tenant: str, text: str, *, token: str | None = None
) -> pb.EvidencePack:
    """One Retrieve call authenticated as `tenant` (or with `token`)."""
    request = pb.RetrieveRequest(query_text=text, top_k=5, tenant=tenant)
    metadata = (("authorization", f"Bearer {token or TOKENS[tenant]}"),)
    pack: pb.EvidencePack = client.Retrieve(request, metadata=metadata, timeout=30)
    return pack


@dataclass
class Served:
    """A registry served on a loopback `/metrics` port."""

    registry: CollectorRegistry
    port: int
    _server: Any = None

    def start(self) -> None:
        server, _thread = start_http_server(self.port, "127.0.0.1", registry=self.registry)
        self._server = server

    def stop(self) -> None:
        if self._server is not None:
            self._server.shutdown()
            self._server.server_close()
            self._server = None

    @property
    def target(self) -> str:
        return f"127.0.0.1:{self.port}"


@dataclass
class LiveStack:
    """The running system and its fault switches."""

    pg: PostgresCluster
    broker: TansuBroker
    schema: str
    topic: str
    dbz: DebeziumConnect
    settings: IngestSettings
    store: Any
    embedder: HashEmbedder
    worker: IngestWorker
    app: RetrieveApp
    client: pb_grpc.RetrievalServiceStub
    sor_proxy: TcpProxy
    ingest_metrics: Served
    retrieve_metrics: Served
    lag_metrics: Served
    stall_metrics: Served
    work_dir: Path
    tokens_file: Path
    thread: threading.Thread | None = None
    load: Load | None = None
    cleanups: list[Callable[[], None]] = field(default_factory=list)

    # --- the SoR ------------------------------------------------------------------------------

    def sql(self, statement: str, params: Sequence[Any] = ()) -> None:
        with psycopg.connect(self.pg.dsn, autocommit=True) as conn:
            conn.execute(f'SET search_path TO "{self.schema}"'.encode())
            conn.execute(statement.encode(), params)

    def put_rows(self, tenant: str, keys: Sequence[str], text: Callable[[int], str]) -> None:
        """Insert or update rows one transaction each (one change event each)."""
        with psycopg.connect(self.pg.dsn, autocommit=True) as conn:
            conn.execute(f'SET search_path TO "{self.schema}"'.encode())
            for n, key in enumerate(keys):
                conn.execute(
                    "INSERT INTO entities (id, company_id, name, content) VALUES (%s, %s, %s, %s)"
                    " ON CONFLICT (id) DO UPDATE SET content = EXCLUDED.content,"
                    " updated_at = now()",
                    (key, tenant, key, text(n)),
                )

    def delete_rows(self, keys: Sequence[str]) -> None:
        with psycopg.connect(self.pg.dsn, autocommit=True) as conn:
            conn.execute(f'SET search_path TO "{self.schema}"'.encode())
            for key in keys:
                conn.execute("DELETE FROM entities WHERE id = %s", (key,))

    # --- the worker -----------------------------------------------------------------------------

    def start_worker(self) -> None:
        self.worker.stop.clear()
        self.worker.loop.start()
        self.thread = threading.Thread(
            target=self.worker.loop.run, args=(self.worker.stop,), daemon=True
        )
        self.thread.start()
        # the source watch (liveness log lines, replication slots, WAL gaps), as `worker.run`
        threading.Thread(target=self.worker.watch_sources, daemon=True).start()

    def stop_worker(self) -> None:
        self.worker.stop.set()
        if self.thread is not None:
            self.thread.join(30)
            assert not self.thread.is_alive()
            self.thread = None

    def move_group_offsets_past_the_end(self, timeout: float = 30.0) -> dict[int, int]:
        """While the worker is stopped: wait until Debezium wrote the pending changes (the
        high watermark stops moving), then commit the group's offset of each partition of the
        change topic 5,000 past its end (beyond the consumer's high-watermark slack for tansu);
        returns partition -> the offset committed."""
        probe = Consumer(
            {
                "bootstrap.servers": self.broker.bootstrap_servers,
                "group.id": self.settings.consumer.group_id,
                "enable.auto.commit": False,
            }
        )
        try:
            partitions = probe.list_topics(self.topic, timeout=10).topics[self.topic].partitions
            deadline = time.monotonic() + timeout
            ends: dict[int, int] = {}
            while time.monotonic() < deadline:
                time.sleep(2)
                now = {
                    p: probe.get_watermark_offsets(TopicPartition(self.topic, p), timeout=5)[1]
                    for p in partitions
                }
                if now == ends:
                    break
                ends = now
            moved = {p: end + 5_000 for p, end in ends.items()}
            probe.commit(
                offsets=[TopicPartition(self.topic, p, o) for p, o in moved.items()],
                asynchronous=False,
            )
            return moved
        finally:
            probe.close()

    def caught_up(self, timeout: float = 60.0) -> None:
        """Until the worker's own lag is 0 on every partition and nothing is held."""
        deadline = time.monotonic() + timeout
        registry = self.worker.metrics.registry
        while time.monotonic() < deadline:
            lag = registry.get_sample_value(
                "ragstream_ingest_consumer_lag_records",
                {"topic": self.topic, "partition": "0"},
            )
            age = registry.get_sample_value(
                "ragstream_ingest_backlog_age_seconds", {"topic": self.topic, "partition": "0"}
            )
            if lag == 0 and age == 0:
                return
            time.sleep(0.3)
        raise AssertionError(f"worker not caught up after {timeout}s (lag {lag}, age {age})")

    def wait_indexed(self, tenant: str, key: str, *, present: bool = True) -> None:
        """Until the row `key` of `tenant` is in the index (or, `present=False`, gone)."""
        registry = self.worker.registry
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            version = registry.active_version(tenant)
            if version is not None:
                name = registry.manifest(tenant, version).index_name
                if bool(self.store.entity_chunks(name, tenant, f"entities:{key}")) == present:
                    return
            time.sleep(0.2)
        raise AssertionError(f"{tenant}/{key} {'not indexed' if present else 'still indexed'}")

    def start_stalled_worker(self, store_down: bool = True) -> Callable[[], None]:
        """A second deployment of the worker (own group, own fresh store, own /metrics on
        `stall_metrics`) whose store is unreachable from the start; returns `recover`, which
        brings its store back, waits until it committed, and stops it."""
        data_dir = self.work_dir / f"stall-store-{uuid.uuid4().hex[:6]}"
        inner = EdgeStore(data_dir)
        store = DownStore(inner, down=store_down)
        registry = CollectorRegistry()
        settings = self.settings.model_copy(
            update={
                "consumer": self.settings.consumer.model_copy(
                    update={"group_id": f"stall-{uuid.uuid4().hex[:6]}"}
                ),
                "store": StoreSettings(data_dir=data_dir),
                "sor": SorSettings(),
            }
        )
        worker = build_worker(settings, registry, store=store, embedder=HashEmbedder())
        worker.check()
        worker.loop.start()
        thread = threading.Thread(target=worker.loop.run, args=(worker.stop,), daemon=True)
        thread.start()
        self.stall_metrics.registry = registry
        self.stall_metrics.start()

        def recover() -> None:
            store.down = False
            deadline = time.monotonic() + 60
            while not registry.get_sample_value("ragstream_ingest_last_commit_timestamp_seconds"):
                assert time.monotonic() < deadline, "the stalled worker never committed"
                time.sleep(0.2)
            # stays up until the alert resolved; `stop_stalled` ends it
            self.cleanups.append(lambda: _stop_worker(worker, thread, inner, self.stall_metrics))

        return recover


def _stop_worker(
    worker: IngestWorker, thread: threading.Thread, store: EdgeStore, served: Served
) -> None:
    worker.stop.set()
    thread.join(30)
    served.stop()
    worker.close()
    store.close()


class DownStore:
    """Wraps a real store; while `down`, every write raises what an unreachable store's client
    raises (StoreUnavailableError), so the worker backs off and commits nothing."""

    def __init__(self, inner: Any, *, down: bool) -> None:
        self.inner = inner
        self.down = down

    def upsert(self, name: str, points: Any, wait: bool = True) -> None:
        if self.down:
            raise StoreUnavailableError("store unreachable (live-stack fault)")
        self.inner.upsert(name, points, wait)

    def __getattr__(self, name: str) -> Any:
        return getattr(self.inner, name)


def start_live_stack(
    postgres: PostgresCluster, broker: TansuBroker, work_dir: Path
) -> Iterator[LiveStack]:
    """Build, start and (after the `yield`) stop the whole system."""
    suffix = uuid.uuid4().hex[:8]
    schema, prefix = f"live_{suffix}", f"live{suffix}"
    with psycopg.connect(postgres.dsn, autocommit=True) as conn:
        conn.execute(f'CREATE SCHEMA "{schema}"'.encode())
        conn.execute(f'SET search_path TO "{schema}"'.encode())
        conn.execute((REPO_ROOT / "schemas" / "sql" / "entities.postgres.sql").read_bytes())
        for tenant, count in (("acme", ACME_ROWS), ("globex", GLOBEX_ROWS)):
            for n in range(count):
                conn.execute(
                    "INSERT INTO entities (id, company_id, name, content) VALUES (%s, %s, %s, %s)",
                    (f"{tenant}-{n:03d}", tenant, f"{tenant} {n}", row_text(n)),
                )
    table = f"{schema}.entities"
    topic = f"{prefix}.{table}"
    dbz = DebeziumConnect(
        bootstrap_servers=broker.bootstrap_servers,
        source=PostgresSource("127.0.0.1", postgres.port, "postgres", "postgres"),
        tables=[table],
        topic_prefix=prefix,
        name=prefix,
        work_dir=work_dir / "connect",
        connector={"poll.interval.ms": "50"},
    )
    dbz.start()
    try:
        yield from _with_services(postgres, broker, work_dir, schema, prefix, table, topic, dbz)
    finally:
        dbz.stop()
        with psycopg.connect(postgres.dsn, autocommit=True) as conn:
            conn.execute(f'DROP SCHEMA "{schema}" CASCADE'.encode())


def _with_services(  # noqa: PLR0917 - the parts start_live_stack made
    postgres: PostgresCluster,
    broker: TansuBroker,
    work_dir: Path,
    schema: str,
    prefix: str,
    table: str,
    topic: str,
    dbz: DebeziumConnect,
) -> Iterator[LiveStack]:
    admin = AdminClient({"bootstrap.servers": broker.bootstrap_servers})
    deadline = time.monotonic() + 60
    while topic not in admin.list_topics(timeout=5).topics:
        assert time.monotonic() < deadline, f"Debezium did not create {topic}"
        time.sleep(0.3)
    # the group the shipped NoActiveConsumer rule names (the default RAGSTREAM_CONSUMER__GROUP_ID)
    dlq, group = f"{prefix}.dlq", "ragstream-ingest"
    create_topics(broker.bootstrap_servers, dlq, partitions=1)
    plan = PlanConfig(tables=(TableMapping(table=table, name="entities"),), topic_prefix=prefix)
    store_settings = StoreSettings(
        data_dir=work_dir / "store", dedicated_above_points=PROMOTE_ABOVE
    )
    settings = IngestSettings(
        kafka=KafkaSettings(bootstrap_servers=broker.bootstrap_servers),
        # tansu reports the base offset of the last record batch + 1 as its high watermark:
        # a committed offset up to a batch past it is no gap (the lost-offsets scenario moves
        # the offsets far beyond that)
        consumer=fast_consumer(dlq, group, lag_refresh_s=0.5, high_watermark_slack=1_000),
        store=store_settings,
        sor=SorSettings(kind="postgres", dsn=SecretStr(postgres.dsn)),
        plan=plan,
        embedding_cache=None,
        reconcile=ReconcileSettings(interval_s=0),  # the scenarios run it by hand
    )
    store = build_store(store_settings, payload_schema(plan))
    ingest_registry = CollectorRegistry()
    hashing = HashEmbedder()
    cache = EmbeddingCache(
        work_dir / "embedding-cache.sqlite", max_entries=100, registry=ingest_registry
    )
    embedder = CachedEmbedder(hashing, cache)
    worker = build_worker(settings, ingest_registry, store=store, embedder=embedder)
    worker.check()
    proxy = TcpProxy(postgres.port)
    # credentials from a file, as in production: the reload scenario breaks and fixes it
    tokens_file = work_dir / "tokens.json"
    tokens_file.write_text(tokens_json(), encoding="utf-8")
    retrieve_registry = CollectorRegistry()
    app = build_app(
        RetrieveSettings(
            grpc=GrpcSettings(port=0),
            auth=AuthSettings(tokens_file=tokens_file, reload_interval_s=0.5),
            store=store_settings,
            sor=SorSettings(
                kind="postgres",
                dsn=SecretStr(f"host=127.0.0.1 port={proxy.port} user=postgres dbname=postgres"),
            ),
            plan=plan,
            publish_enabled=False,
        ),
        retrieve_registry,
        store=store,
        embedder=HashEmbedder(),
    )
    loop = asyncio.new_event_loop()
    loop_thread = threading.Thread(target=loop.run_forever, daemon=True)
    loop_thread.start()
    asyncio.run_coroutine_threadsafe(app.server.start(), loop).result(30)
    channel = grpc.insecure_channel(f"127.0.0.1:{app.server.port}")
    lag_registry = CollectorRegistry()
    lag = GroupLag(broker.bootstrap_servers, group, [topic])
    lag_registry.register(lag)
    stack = LiveStack(
        pg=postgres,
        broker=broker,
        schema=schema,
        topic=topic,
        dbz=dbz,
        settings=settings,
        store=store,
        embedder=hashing,
        worker=worker,
        app=app,
        client=pb_grpc.RetrievalServiceStub(channel),
        sor_proxy=proxy,
        ingest_metrics=Served(ingest_registry, free_port()),
        retrieve_metrics=Served(retrieve_registry, free_port()),
        lag_metrics=Served(lag_registry, free_port()),
        stall_metrics=Served(CollectorRegistry(), free_port()),
        work_dir=work_dir,
        tokens_file=tokens_file,
    )
    for served in (stack.ingest_metrics, stack.retrieve_metrics, stack.lag_metrics):
        served.start()
    stack.start_worker()
    try:
        yield stack
    finally:
        for cleanup in reversed(stack.cleanups):
            cleanup()
        if stack.load is not None:
            stack.load.stop()
        stack.stop_worker()
        for served in (stack.ingest_metrics, stack.retrieve_metrics, stack.lag_metrics):
            served.stop()
        channel.close()
        asyncio.run_coroutine_threadsafe(app.server.stop(), loop).result(30)
        loop.call_soon_threadsafe(loop.stop)
        loop_thread.join(10)
        app.close()
        worker.close()
        lag.close()
        proxy.cut()
        store.close()


def produce_poison(bootstrap: str, topic: str, count: int) -> None:
    """`count` records no decoder accepts (what a misconfigured producer writes)."""
    producer = Producer({"bootstrap.servers": bootstrap})
    for n in range(count):
        producer.produce(topic, key=f'{{"id": "poison-{n}"}}'.encode(), value=b"\x00not json")
    assert producer.flush(30) == 0


def produce_late_snapshot_row(
    bootstrap: str, topic: str, *, tenant: str, entity_id: str, text: str, age_s: float
) -> None:
    """A snapshot row of `tenant` (a new entity `entity_id` with content `text`) whose Kafka
    record was written `age_s` seconds ago: one of Debezium's own start-up snapshot records of
    `topic`, re-keyed and re-timestamped. The worker routes it to the bulk lane; its waiting
    age counts from that timestamp."""
    consumer = Consumer(
        {
            "bootstrap.servers": bootstrap,
            "group.id": f"late-snapshot-{uuid.uuid4().hex[:6]}",
            "enable.auto.commit": False,
        }
    )
    try:
        consumer.assign([TopicPartition(topic, 0, 0)])
        deadline = time.monotonic() + 30
        while True:
            assert time.monotonic() < deadline, f"no snapshot record in {topic}"
            msg = consumer.poll(1.0)
            raw = None if msg is None or msg.error() is not None else msg.value()
            if raw is None:
                continue
            value = json.loads(raw)
            payload = value["payload"] if "schema" in value else value
            if payload.get("op") == "r":
                break
    finally:
        consumer.close()
    assert msg is not None
    key = json.loads(msg.key() or b"{}")
    key_payload = key["payload"] if "schema" in key else key
    key_payload["id"] = entity_id
    after = payload["after"]
    after.update({"id": entity_id, "company_id": tenant, "name": entity_id, "content": text})
    producer = Producer({"bootstrap.servers": bootstrap})
    producer.produce(
        topic,
        key=json.dumps(key).encode(),
        value=json.dumps(value).encode(),
        timestamp=int((time.time() - age_s) * 1000),
    )
    assert producer.flush(30) == 0
