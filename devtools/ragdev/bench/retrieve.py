"""Retrieve benchmark: client-side latency (p50/p95/p99) and QPS of the gRPC Retrieve server.

What runs is the product's: the gRPC server of `retrieval_api.app.build_app` (auth by bearer
token, validation, hybrid dense + BM25 search, calibration, ranking, SoR verification, evidence
pack) with the real local ONNX embedder (`LocalOnnxEmbedder`, all-MiniLM-L6-v2 int8) embedding
every query, on a loopback port in a background event loop of this process; a qdrant-edge
`EdgeStore` holding one tenant's index of `points` chunks, registered with `FileIndexRegistry`
(created with `MINILM_SPEC` and `Bm25Encoder().model_version`, marked ready, activated: the
server's manifest check passes) and optimized (HNSW) after loading.

What is synthetic, and why: embedding 100k chunks with the local model takes ~1.5 h on this
machine, so the indexed chunk *vectors* are synthetic. They are not arbitrary: the chunk texts
are English prose of the machine (Python stdlib docstrings, then the licences of
/usr/share/common-licenses), 2-5 sentences out of a window of consecutive ones; every unique
sentence is embedded for real once (a few thousand short texts), and a chunk's vector is the
unit mean of its sentences' real embeddings plus Gaussian noise. So real query embeddings land
near the chunks holding the words they were written from, dense hits score like real ones, and
the cosine thresholds, the SoR check and the evidence pack see realistic survivors. Chunk
texts, BM25 sparse vectors (`Bm25Encoder.encode_document`), payloads and SoR rows are
real-shaped and consistent with each other.

Two variants on the same index: with SoR verification (the real `SqliteSor` on the
`schemas/sql/entities.sqlite.sql` table holding every entity with the indexed content hash, so
every verdict is OK) and without (`_NoVerification`: every id exists and is fresh, answered
from memory without any I/O). Each variant runs with one server process (the store, the
pipeline and the gRPC server in this process) and with several (`RetrieveProcesses`: this
process hosts the store, the server processes share the port), a warm-up, then `queries`
calls at each concurrency (client threads with a connection each, one blocking call in flight
per thread; a fresh query list per concurrency, so no query-vector cache hits carry over).

Run: `ragstream bench retrieve` or `python -m ragdev.bench.retrieve` (prints JSON).
"""

from __future__ import annotations

import argparse
import asyncio
import hashlib
import json
import logging
import math
import os
import re
import sqlite3
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from collections import Counter
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import ExitStack, contextmanager
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any, Literal

import numpy as np
from numpy.typing import NDArray
from prometheus_client import CollectorRegistry

from ragcore.embedders.base import Embedder
from ragcore.embedders.local_onnx import MINILM_SPEC, LocalEmbedderConfig, LocalOnnxEmbedder
from ragcore.embedders.spec import EmbeddingSpec
from ragcore.errors import ConfigError, RagstreamError
from ragcore.mapping import TableCatalog, TableMapping
from ragcore.normalize import content_sha256
from ragcore.plan import PlanConfig
from ragcore.resources import package_dir
from ragcore.settings import SorSettings, StoreSettings
from ragcore.sor.base import SorVerdict
from ragcore.sparse import ENGLISH_STOPWORDS, Bm25Encoder
from ragcore.store.base import (
    PointRecord,
)
from ragcore.store.edge import EdgeStore
from ragcore.store.points import rfc3339, row_fields
from ragcore.store.registry import FileIndexRegistry
from ragcore.wiring import payload_schema
from ragdev.bench.floor import FloorProcesses, FloorSpec, serve_in_thread
from ragdev.bench.ingest import prose_paragraphs
from ragdev.bench.machine import emit, flat, int_list, machine_info, percentiles, run_dir
from ragdev.bench.reconcile import paragraph_points
from ragstream.cli import HelpFormatter
from retrieval_api.admission import AdmissionSettings, QuotaBook, TenantQuota
from retrieval_api.app import RetrieveApp, build_app
from retrieval_api.processes import RetrieveProcesses, serving_settings
from retrieval_api.settings import AuthSettings, GrpcSettings, RetrieveSettings
from schemas.entities import Entity, EntityVersion

__all__ = ["GOAL_P95_MS", "run", "server_settings"]


#: The local embedder's executions (`LocalEmbedderConfig.execution`).
Execution = Literal["float", "int8"]

log = logging.getLogger(__name__)

TENANT = "bench"
TOKEN = "bench-retrieve-token"  # a throwaway credential of the loopback server
ENTITY_TYPES = ("KNOWLEDGE_ARTIFACT", "ticket", "runbook", "faq")
WARMUP_CALLS = 20
BATCH = 512
#: Noise norm relative to the mean of a chunk's sentence embeddings (cosine ~ 1/sqrt(1+0.3^2)).
NOISE = 0.3
#: A chunk's sentences come from this many consecutive sentences of the prose.
WINDOW = 12
CALL_TIMEOUT_S = 30.0
WARMUP_TIMEOUT_S = 600.0

#: The issue's goal on this 2-core machine (issue 5, Benchmark).
GOAL_P95_MS = 30.0
GOAL_TEXT = "p95 <= 30 ms at concurrency 1 without a reranker (local embedder, 100k chunks)"
#: Issue 17: near the machine's CPU limit under load, with SoR verification.
LOAD_GOAL_CONCURRENCY = 8
LOAD_GOAL_RATIO = 0.8
LOAD_GOAL_P95_MS = 60.0
LOAD_GOAL_TEXT = (
    "concurrency 8, SoR verification on, 100k chunks: QPS >= 0.8 of the implied CPU limit and "
    "p95 <= 60 ms"
)

_SENTENCE = re.compile(r"(?<=[.!?])\s+(?=[A-Z])")
_WORD = re.compile(r"[A-Za-z]{4,}")
_QUESTIONS = (
    "how does {0} {1} work",
    "what is the {0} {1}",
    "why would {0} {1} fail",
    "when should I use {0} {1}",
    "where are {0} and {1} {2} described",
    "what happens to {0} {1} {2}",
)
_VARIANTS = (
    ("sor_verification", True),
    ("no_verification", False),
)
#: The baseline variant: embed + the engine's hybrid query only (`ragdev.bench.floor`).
FLOOR = "floor"
#: Issue 28: Retrieve's server CPU per request over the floor's, SoR verification on.
FLOOR_GOAL_RATIO = 1.5
FLOOR_GOAL_TEXT = (
    "server CPU per request <= 1.5x the floor's (same embedding and engine hybrid query, "
    "nothing else), SoR verification on, same processes and concurrency"
)


# --- the SoR stand-in of the variant without verification ----------------------------------


class _NoVerification:
    """A `SystemOfRecord` that does no verification work: every id exists and is fresh.

    `verify` answers from an in-memory map of the content hashes the benchmark indexed (a dict
    lookup, no I/O), so every verdict is OK exactly as with the real SoR; the difference
    between the variants is the cost of the SoR round trip. Nothing else is supported.
    """

    def __init__(self, hashes: Mapping[str, str], catalog: TableCatalog) -> None:
        self._hashes = hashes
        self._catalog = catalog

    @property
    def catalog(self) -> TableCatalog:
        """The mapped tables (Retrieve's own)."""
        return self._catalog

    def verify(self, tenant_id: str, entity_ids: Sequence[str]) -> dict[str, SorVerdict]:
        """Every id exists, is not deleted and carries the indexed content hash."""
        return {
            i: SorVerdict(entity_id=i, exists=True, content_hash=self._hashes.get(i))
            for i in dict.fromkeys(entity_ids)
        }

    def fetch_entities(self, tenant_id: str | None, entity_ids: Sequence[str]) -> dict[str, Entity]:
        """Not part of Retrieve: no entities."""
        return {}

    def scan(self, tenant_id: str, batch: int = 500, table: str | None = None) -> Iterator[Entity]:
        """Not part of Retrieve: no entities."""
        return iter(())

    def count(self, tenant_id: str, table: str | None = None) -> int:
        """Not part of Retrieve: no entities."""
        return 0

    def check(self) -> None:
        """Always healthy."""

    def close(self) -> None:
        """Nothing to release."""


# --- data --------------------------------------------------------------------------------------


@dataclass(frozen=True)
class _Prose:
    """Unique prose sentences in source order, their content words and REAL embeddings."""

    sentences: tuple[str, ...]
    words: tuple[tuple[str, ...], ...]
    vectors: NDArray[np.float32]


def _content_words(sentence: str) -> tuple[str, ...]:
    return tuple(w.lower() for w in _WORD.findall(sentence) if w.lower() not in ENGLISH_STOPWORDS)


def _sentences(limit: int) -> list[str]:
    """Up to `limit` unique prose sentences of 5-40 words, in source order (neighbours share a
    docstring, a module or a licence)."""
    seen: set[str] = set()
    out: list[str] = []
    for paragraph in prose_paragraphs():
        for sentence in _SENTENCE.split(paragraph):
            if 5 <= len(sentence.split()) <= 40 and sentence not in seen:
                seen.add(sentence)
                out.append(sentence)
                if len(out) == limit:
                    return out
    if len(out) < 4 * WINDOW:
        raise ConfigError(f"the machine's prose yields {len(out)} sentences: too few")
    return out


def _questions(prose: _Prose, n: int, rng: np.random.Generator) -> list[str]:
    """Short natural questions: a template over consecutive content words of one sentence."""
    out: list[str] = []
    while len(out) < n:
        words = prose.words[int(rng.integers(len(prose.words)))]
        template = _QUESTIONS[int(rng.integers(len(_QUESTIONS)))]
        needed = template.count("{")
        if len(words) < needed:
            continue
        start = int(rng.integers(len(words) - needed + 1))
        text = template.format(*words[start : start + needed])
        out.append(text[0].upper() + text[1:] + "?")
    return out


@dataclass
class _Built:
    """The index and SoR as built, with what the report needs."""

    collection: str
    version: int
    entities: int
    hashes: dict[str, str]
    seconds: dict[str, float]
    optimize_changed: bool
    mean_chunk_words: float
    prose: _Prose
    mean_cosine_to_sentence_mean: float


class _Builder:
    """Generates entities (1-3 chunks each) and their points and SoR rows."""

    def __init__(
        self,
        prose: _Prose,
        rng: np.random.Generator,
        tenant: str = TENANT,
        spec: EmbeddingSpec = MINILM_SPEC,
    ) -> None:
        self.prose = prose
        self.tenant = tenant
        self.spec = spec
        self.rng = rng
        self.sparse = Bm25Encoder()
        self.clock = datetime(2026, 1, 1, tzinfo=UTC)
        self.lsn = 1_000
        self.hashes: dict[str, str] = {}
        self.words = 0
        self.chunks = 0
        self.cosines: list[float] = []

    def chunk(self, window_start: int) -> tuple[str, NDArray[np.float32]]:
        """2-5 sentences, in order, from the `WINDOW` sentences at `window_start`; the vector is
        the unit mean of their real embeddings plus Gaussian noise."""
        size = min(WINDOW, len(self.prose.sentences) - window_start)
        k = min(size, int(self.rng.integers(2, 6)))
        picks = window_start + np.sort(self.rng.choice(size, size=k, replace=False))
        text = " ".join(self.prose.sentences[i] for i in picks.tolist())
        mean = self.prose.vectors[picks].mean(axis=0)
        dim = mean.shape[0]
        noisy = mean + self.rng.normal(
            scale=NOISE * float(np.linalg.norm(mean)) / math.sqrt(dim), size=dim
        )
        unit = (noisy / np.linalg.norm(noisy)).astype(np.float32)
        if len(self.cosines) < 1_000:
            self.cosines.append(float(unit @ (mean / np.linalg.norm(mean))))
        return text, unit

    def entity(
        self, number: int, n_chunks: int, version: int
    ) -> tuple[list[PointRecord], tuple[Any, ...]]:
        """One entity's points and its SoR row."""
        last_start = max(0, len(self.prose.sentences) - WINDOW * (n_chunks + 1) // 2)
        start = int(self.rng.integers(last_start + 1))
        chunks = [self.chunk(start + j * WINDOW // 2) for j in range(n_chunks)]
        texts = [text for text, _ in chunks]
        key = f"doc-{number:07d}"
        entity_id = TableMapping().entity_id([key])
        content = "\n\n".join(texts)
        content_hash = content_sha256(content)
        self.hashes[entity_id] = content_hash
        self.clock += timedelta(seconds=7)
        self.lsn += 16
        updated = rfc3339(self.clock)
        entity_type = ENTITY_TYPES[number % len(ENTITY_TYPES)]
        title = " ".join(self.prose.sentences[start].split()[:8]).rstrip(".,;:")
        fields = row_fields(
            content_hash=content_hash,
            entity_type=entity_type,
            title=title,
            content_format="text",
            created_at=updated,
            updated_at=updated,
            spec=self.spec,
            index_version=version,
            indexed_at=updated,
            event_date=updated,
            version=EntityVersion(
                updated_at_us=int(self.clock.timestamp() * 1_000_000), lsn=self.lsn
            ),
        )
        encoded = [self.sparse.encode_chunk(text) for text, _ in chunks]
        points = paragraph_points(
            fields,
            entity_id,
            [
                (text, vector, sparse)
                for (text, vector), (sparse, _) in zip(chunks, encoded, strict=True)
            ],
            version,
            term_counts=[counts for _, counts in encoded],
        )
        self.words += sum(len(text.split()) for text, _ in chunks)
        self.chunks += len(chunks)
        row = (
            key,
            self.tenant,
            entity_type,
            title,
            content,
            json.dumps({"format": "text"}),
            content_hash,
            updated,
            updated,
        )
        return points, row


def _create_sor(path: Path) -> sqlite3.Connection:
    ddl = (package_dir("schemas") / "sql" / "entities.sqlite.sql").read_text(encoding="utf-8")
    conn = sqlite3.connect(path)
    conn.executescript(ddl)
    return conn


def _build(
    root: Path,
    store: EdgeStore,
    embedder: Embedder,
    *,
    points: int,
    n_sentences: int,
    rng: np.random.Generator,
) -> _Built:
    """Sentences and their real embeddings, the registered index (loaded, optimized, active)
    and the SoR."""
    seconds: dict[str, float] = {}
    began = time.perf_counter()
    sentences = _sentences(n_sentences)
    seconds["read_prose"] = time.perf_counter() - began

    began = time.perf_counter()
    vectors = np.asarray(embedder.embed_documents(sentences), dtype=np.float32)
    seconds["embed_sentences"] = time.perf_counter() - began
    log.info("%d sentences embedded in %.1f s", len(sentences), seconds["embed_sentences"])
    prose = _Prose(tuple(sentences), tuple(_content_words(s) for s in sentences), vectors)

    registry = FileIndexRegistry(root / "store", store)
    manifest = registry.create_version(
        TENANT, embedder.spec, sparse_encoder=Bm25Encoder().model_version
    )
    builder = _Builder(prose, rng, spec=embedder.spec)
    sor = _create_sor(root / "sor.sqlite")
    generate_s = upsert_s = sor_s = 0.0
    made = entities = 0
    try:
        while made < points:
            began = time.perf_counter()
            batch: list[PointRecord] = []
            rows: list[tuple[Any, ...]] = []
            while made < points and len(batch) < BATCH:
                n_chunks = min(points - made, int(rng.integers(1, 4)))
                entity_points, row = builder.entity(entities, n_chunks, manifest.version)
                batch.extend(entity_points)
                rows.append(row)
                made += n_chunks
                entities += 1
            generate_s += time.perf_counter() - began
            began = time.perf_counter()
            store.upsert(manifest.index_name, batch, wait=True)
            upsert_s += time.perf_counter() - began
            began = time.perf_counter()
            with sor:
                sor.executemany(
                    "INSERT INTO entities (id, company_id, entity_type, name, content, metadata,"
                    " content_hash, created_at, updated_at) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?)",
                    rows,
                )
            sor_s += time.perf_counter() - began
            if made // 10_000 != (made - len(batch)) // 10_000:
                log.info("loaded %d/%d points", made, points)
    finally:
        sor.close()
    seconds["generate_texts_bm25_payloads"] = generate_s
    seconds["upsert"] = upsert_s
    seconds["sor_insert"] = sor_s

    began = time.perf_counter()
    changed = store.optimize(manifest.index_name)
    seconds["optimize"] = time.perf_counter() - began
    registry.mark_ready(TENANT, manifest.version, total_vectors=points)
    registry.activate(TENANT, manifest.version)
    log.info("index built: %s", {k: round(v, 1) for k, v in seconds.items()})

    return _Built(
        collection=manifest.index_name,
        version=manifest.version,
        entities=entities,
        hashes=builder.hashes,
        seconds={k: round(v, 2) for k, v in seconds.items()},
        optimize_changed=changed,
        mean_chunk_words=round(builder.words / max(1, builder.chunks), 1),
        prose=prose,
        mean_cosine_to_sentence_mean=round(statistics.fmean(builder.cosines), 3),
    )


# --- server and client -----------------------------------------------------------------------


@dataclass(frozen=True)
class _Server:
    """One variant's server under test: where it listens, its metrics and its CPU clocks."""

    variant: str
    verification: bool
    processes: int
    target: str
    #: None for the floor (it keeps no metrics)
    registry: CollectorRegistry | None
    #: CPU seconds the server used so far (every process of it)
    cpu_s: Callable[[], float]
    #: CPU seconds of each server process so far (the spread of the load over them)
    cpu_by_process: Callable[[], dict[int, float]]

    @property
    def name(self) -> str:
        return f"{self.variant}/p{self.processes}"


_Clocks = tuple[str, Callable[[], float], Callable[[], dict[int, float]]]


def _this_process() -> dict[int, float]:
    return {os.getpid(): time.process_time()}


@contextmanager
def _in_process(app: RetrieveApp) -> Iterator[_Clocks]:
    """The app's gRPC server on a loopback port in a background event loop of this process
    (`grpc.processes` = 1: the store, the pipeline and the server share one process)."""
    loop = asyncio.new_event_loop()
    thread = threading.Thread(target=loop.run_forever, name="retrieve-server", daemon=True)
    thread.start()
    try:
        asyncio.run_coroutine_threadsafe(app.server.start(), loop).result(60)
        yield f"127.0.0.1:{app.server.port}", time.process_time, _this_process
    finally:
        asyncio.run_coroutine_threadsafe(app.server.stop(), loop).result(60)
        loop.call_soon_threadsafe(loop.stop)
        thread.join(10)
        loop.close()
        app.close()


@contextmanager
def _in_processes(group: RetrieveProcesses) -> Iterator[_Clocks]:
    """`RetrieveProcesses`: its server processes, and this process hosting the store for them
    (what `ragstream serve` does with RAGSTREAM_GRPC__PROCESSES > 1)."""
    group.start()
    try:
        yield (
            f"127.0.0.1:{group.port}",
            lambda: time.process_time() + group.cpu_seconds(),
            group.cpu_seconds_by_process,
        )
    finally:
        group.stop()


@contextmanager
def _floor_in_process(spec: FloorSpec, embedder: Embedder, store: EdgeStore) -> Iterator[_Clocks]:
    """The floor server in this process (searching the store directly)."""
    server, port = serve_in_thread(spec, embedder, store, Bm25Encoder())
    try:
        yield f"127.0.0.1:{port}", time.process_time, _this_process
    finally:
        server.stop(5).wait()


@contextmanager
def _floor_in_processes(group: FloorProcesses) -> Iterator[_Clocks]:
    """The floor's server processes, and this process hosting the store for them."""
    group.start()
    try:
        yield (
            f"127.0.0.1:{group.port}",
            lambda: time.process_time() + sum(group.cpu_seconds_by_process().values()),
            group.cpu_seconds_by_process,
        )
    finally:
        group.stop()


@dataclass(frozen=True)
class _Sample:
    latency_s: float
    status: str
    timings_ms: Mapping[str, float]
    results: int
    excluded: Mapping[str, int]


@dataclass(frozen=True)
class _Slice:
    """One load-generator run: its samples, wall time and the CPU it cost on each side."""

    samples: list[_Sample]
    wall_s: float
    loadgen_cpu_s: float
    server_cpu_s: float
    #: CPU seconds of each server process over the run (this process for one)
    process_cpu_s: dict[int, float]
    stage_cpu_s: dict[str, float]
    query_cache: dict[str, float]


def _counter(registry: CollectorRegistry | None, family_name: str, label: str) -> dict[str, float]:
    out: dict[str, float] = {}
    if registry is None:
        return out
    for family in registry.collect():
        if family.name == family_name:
            for sample in family.samples:
                if sample.name.endswith("_total"):
                    key = sample.labels[label]
                    out[key] = out.get(key, 0.0) + sample.value
    return out


def _stage_cpu(registry: CollectorRegistry | None) -> dict[str, float]:
    return _counter(registry, "ragstream_retrieve_stage_cpu_seconds", "stage")


def _query_cache(registry: CollectorRegistry | None) -> dict[str, float]:
    return _counter(registry, "ragstream_retrieve_query_cache", "outcome")


def _drive(
    server: _Server,
    queries: Sequence[str],
    concurrency: int,
    tmp: Path,
    timeout_s: float = CALL_TIMEOUT_S,
) -> _Slice:
    """`queries` sent by the load generator in its own process (`ragdev.bench.loadgen`) with
    at most `concurrency` calls in flight; the server's CPU (all its processes) around it."""
    path = tmp / "queries.json"
    path.write_text(json.dumps(list(queries)), encoding="utf-8")
    stages = _stage_cpu(server.registry)
    cache = _query_cache(server.registry)
    cpu = server.cpu_s()
    by_process = server.cpu_by_process()
    done = subprocess.run(
        [
            sys.executable,
            "-m",
            "ragdev.bench.loadgen",
            "--target",
            server.target,
            "--token",
            TOKEN,
            "--concurrency",
            str(concurrency),
            "--timeout",
            str(timeout_s),
            str(path),
        ],
        capture_output=True,
        text=True,
        timeout=timeout_s * len(queries) + 60,
        check=False,
    )
    server_cpu = server.cpu_s() - cpu
    process_cpu = {pid: s - by_process.get(pid, 0.0) for pid, s in server.cpu_by_process().items()}
    if done.returncode != 0:
        raise RagstreamError(f"the load generator failed: {done.stderr[-2000:]}")
    after = _stage_cpu(server.registry)
    cache_after = _query_cache(server.registry)
    doc = json.loads(done.stdout)
    samples = [
        _Sample(
            s["latency_s"],
            s["status"],
            s.get("timings_ms", {}),
            s.get("results", 0),
            s.get("excluded", {}),
        )
        for s in doc["samples"]
    ]
    return _Slice(
        samples=samples,
        wall_s=doc["wall_s"],
        loadgen_cpu_s=doc["cpu_s"],
        server_cpu_s=server_cpu,
        process_cpu_s=process_cpu,
        stage_cpu_s={k: v - stages.get(k, 0.0) for k, v in after.items()},
        query_cache={k: v - cache.get(k, 0.0) for k, v in cache_after.items()},
    )


def _summary(
    slices: Sequence[_Slice], concurrency: int, loads: Sequence[Sequence[float]]
) -> dict[str, Any]:
    samples = [x for part in slices for x in part.samples]
    wall = sum(part.wall_s for part in slices)
    stages: dict[str, list[float]] = {}
    excluded: Counter[str] = Counter()
    for s in samples:
        for stage, ms in s.timings_ms.items():
            stages.setdefault(stage, []).append(ms)
        excluded.update(s.excluded)
    answered = [s for s in samples if s.timings_ms]
    n = len(samples)
    server_cpu = sum(part.server_cpu_s for part in slices)
    stage_cpu: Counter[str] = Counter()
    cache: Counter[str] = Counter()
    for part in slices:
        stage_cpu.update(part.stage_cpu_s)
        cache.update(part.query_cache)
    in_stages = sum(stage_cpu.values())
    by_process: Counter[int] = Counter()
    for part in slices:
        by_process.update(part.process_cpu_s)
    spread = sum(by_process.values())
    return {
        "concurrency": concurrency,
        "n": n,
        "wall_s": round(wall, 3),
        "qps": round(n / wall, 2),
        "latency_ms": percentiles([s.latency_s for s in samples], scale=1000.0, digits=2),
        "statuses": dict(Counter(s.status for s in samples)),
        "mean_results": round(statistics.fmean(s.results for s in answered), 2)
        if answered
        else 0.0,
        "excluded_by_reason": dict(excluded),
        "query_cache": {k: int(v) for k, v in sorted(cache.items())},
        "server_stage_ms_mean": {k: round(statistics.fmean(v), 3) for k, v in stages.items()},
        "cpu_ms_per_request": {
            "server_process": round(server_cpu / n * 1000, 3),
            "server_stages": {k: round(v / n * 1000, 3) for k, v in sorted(stage_cpu.items())},
            "server_outside_stages": round((server_cpu - in_stages) / n * 1000, 3),
            # this process hosting the store for the server processes (its searches and
            # pickling; 0 with one process, whose store is in the server's own process)
            "store_host": round((server_cpu - spread) / n * 1000, 3),
            "load_generator": round(sum(p.loadgen_cpu_s for p in slices) / n * 1000, 3),
        },
        "server_cores_busy": round(server_cpu / wall, 3),
        "load_generator_cores_busy": round(sum(p.loadgen_cpu_s for p in slices) / wall, 3),
        # how evenly the kernel spread the connections: each server process's share of the
        # server processes' CPU, largest first (one process: 1.0)
        "server_process_cpu_shares": sorted(
            (round(v / spread, 3) for v in by_process.values()), reverse=True
        )
        if spread > 0
        else [],
        "load_average_at_slice_starts": [[round(x, 2) for x in load] for load in loads],
    }


def _measure_variants(
    settings: RetrieveSettings,
    store: EdgeStore,
    embedder: Embedder,
    *,
    hashes: Mapping[str, str],
    warmup: Sequence[str],
    queries: Mapping[int, Sequence[str]],
    processes: Sequence[int],
    floor: FloorSpec,
) -> list[dict[str, Any]]:
    """Every (variant, processes) server at once, the floor's among them; at each concurrency
    its own query list (no query-vector cache hits carried over from a lower level) runs in
    two halves, servers in one order then the reverse, so drifting background load weighs on
    all of them alike."""
    with ExitStack() as stack:
        tmp = Path(stack.enter_context(tempfile.TemporaryDirectory(prefix="ragstream-loadgen-")))
        servers: list[_Server] = []
        for count in processes:
            for name, verification in (*_VARIANTS, (FLOOR, False)):
                registry: CollectorRegistry | None = None
                if name == FLOOR and count == 1:
                    clocks = stack.enter_context(_floor_in_process(floor, embedder, store))
                elif name == FLOOR:
                    floors = FloorProcesses(
                        floor,
                        store,
                        processes=count,
                        socket_dir=tmp,
                        embedder=_local(serving_settings(settings)),
                        grpc_settings=settings.grpc,
                    )
                    clocks = stack.enter_context(_floor_in_processes(floors))
                elif count == 1:
                    sor = None if verification else _NoVerification(hashes, settings.plan.catalog)
                    registry = CollectorRegistry()
                    app = build_app(settings, registry, store=store, embedder=embedder, sor=sor)
                    clocks = stack.enter_context(_in_process(app))
                else:
                    sor = None if verification else _NoVerification(hashes, settings.plan.catalog)
                    group = RetrieveProcesses(settings, processes=count, store=store, sor=sor)
                    clocks = stack.enter_context(_in_processes(group))
                    registry = group.metrics_registry()
                server = _Server(name, verification, count, clocks[0], registry, *clocks[1:])
                # one process: 1 connection; several: 8 per process, so that every process
                # (they get connections at random) is warmed up before it is measured
                # the warm-up's first calls count the uncalibrated index's lexicon (a scan of
                # every chunk text: over 30 s at 100k chunks on a loaded machine)
                warm = _drive(server, warmup, 1 if count == 1 else 8 * count, tmp, WARMUP_TIMEOUT_S)
                failed = Counter(s.status for s in warm.samples if s.status.startswith("GRPC_"))
                if failed:
                    raise ConfigError(f"{server.name}: warm-up calls failed: {dict(failed)}")
                servers.append(server)
        out: list[dict[str, Any]] = []
        for level, level_queries in queries.items():
            half = (len(level_queries) + 1) // 2
            slices = [(level_queries[:half], servers), (level_queries[half:], servers[::-1])]
            runs: dict[str, list[_Slice]] = {s.name: [] for s in servers}
            loads: dict[str, list[tuple[float, float, float]]] = {s.name: [] for s in servers}
            for part, order in slices:
                for server in order:
                    if not part:
                        continue
                    log.info("%s, concurrency %d: %d calls", server.name, level, len(part))
                    loads[server.name].append(os.getloadavg())
                    runs[server.name].append(_drive(server, part, level, tmp))
            for server in servers:
                if server.variant == FLOOR:
                    sor_text = "none: the floor embeds and runs the engine's hybrid query only"
                elif server.verification:
                    sor_text = "SqliteSor (the embedded SoR reader, one batched query per request)"
                else:
                    sor_text = "_NoVerification (in-memory: every id exists and is fresh, no I/O)"
                out.append(
                    {
                        "variant": server.variant,
                        "sor_verification": server.verification,
                        "sor": sor_text,
                        "processes": server.processes,
                        **_summary(runs[server.name], level, loads[server.name]),
                    }
                )
    _add_limits(out)
    _add_floor_ratios(out)
    return out


def _local(settings: RetrieveSettings) -> LocalEmbedderConfig:
    if not isinstance(settings.embedder, LocalEmbedderConfig):
        raise ConfigError("the benchmark's servers embed with the local model")
    return settings.embedder


def _add_floor_ratios(results: list[dict[str, Any]]) -> None:
    """Each Retrieve row's server CPU per request over the floor's in the same layout and at
    the same concurrency (`cpu_over_floor`), and what Retrieve adds in ms."""
    floors = {(r["processes"], r["concurrency"]): r for r in results if r["variant"] == FLOOR}
    for r in results:
        floor = floors.get((r["processes"], r["concurrency"]))
        if r["variant"] == FLOOR or floor is None:
            continue
        ours = r["cpu_ms_per_request"]["server_process"]
        base = floor["cpu_ms_per_request"]["server_process"]
        r["floor"] = {
            "floor_cpu_ms_per_request": base,
            "cpu_over_floor": round(ours / base, 3) if base > 0 else None,
            "cpu_ms_above_floor": round(ours - base, 3),
            "floor_latency_ms": floor["latency_ms"],
            "floor_qps": floor["qps"],
        }


def _add_limits(results: list[dict[str, Any]]) -> None:
    """The implied limit of each server: the machine's cores over its CPU per request at the
    lowest concurrency (its intrinsic cost), and each level's QPS as a ratio of it."""
    cores = os.cpu_count() or 1
    for key in {(r["variant"], r["processes"]) for r in results}:
        rows = [r for r in results if (r["variant"], r["processes"]) == key]
        base = min(rows, key=lambda r: r["concurrency"])
        cost_ms = base["cpu_ms_per_request"]["server_process"]
        limit = cores / (cost_ms / 1000) if cost_ms > 0 else None
        for r in rows:
            r["cpu_limit"] = {
                "cores": cores,
                "server_cpu_ms_per_request_at_lowest_concurrency": cost_ms,
                "implied_limit_qps": round(limit, 1) if limit else None,
                "qps_over_limit": round(r["qps"] / limit, 3) if limit else None,
                "implied_limit_qps_beside_the_load_generator": (
                    round((cores - r["load_generator_cores_busy"]) / (cost_ms / 1000), 1)
                    if cost_ms > 0
                    else None
                ),
            }


# --- the run ---------------------------------------------------------------------------------


def server_settings(
    root: Path,
    plan: PlanConfig,
    execution: Execution = "float",
    max_connection_age_s: float | None = None,
) -> RetrieveSettings:
    """The settings of the benchmark's Retrieve servers over the run directory `root`, with
    the local embedder's `execution` (`max_connection_age_s`:
    `GrpcSettings.max_connection_age_s`, None: its default)."""
    return RetrieveSettings(
        embedder=LocalEmbedderConfig(execution=execution),
        grpc=GrpcSettings(port=0, max_connection_age_s=max_connection_age_s),
        auth=AuthSettings(tokens={TENANT: hashlib.sha256(TOKEN.encode()).hexdigest()}),
        # one tenant, up to 8 connections per process at the warm-up: no per-tenant limit
        # (admission still runs; `ragstream bench noisy` measures its limits)
        admission=AdmissionSettings(quotas=QuotaBook(default=TenantQuota(concurrency=None))),
        store=StoreSettings(data_dir=root / "store"),
        sor=SorSettings(kind="sqlite", sqlite_path=root / "sor.sqlite"),
        plan=plan,
        publish_enabled=False,
        metrics_port=0,
    )


def run(
    *,
    points: int = 100_000,
    queries: int = 200,
    concurrency: Sequence[int] = (1, 8),
    data_dir: Path | None = None,
    seed: int = 0,
    processes: Sequence[int] | None = None,
    execution: Execution = "float",
    max_connection_age_s: float | None = None,
) -> dict[str, Any]:
    """Build the index and the SoR, run both variants at each concurrency with each number
    of server processes (default: 1 and the machine's cores); a JSON-able report. The local
    embedder runs with `execution` (index and queries alike: it is the index's model).

    `data_dir` receives the store, the registry and the SoR (a temporary directory, removed
    afterwards, when None; otherwise it must not hold a previous run).
    """
    counts = sorted(set(processes or (1, os.cpu_count() or 1)))
    if points < 1 or queries < 1 or not concurrency or min(concurrency) < 1 or min(counts) < 1:
        raise ConfigError("points, queries, concurrency and processes must all be >= 1")
    load_before = os.getloadavg()
    rng = np.random.default_rng(seed)
    # every sentence of the machine for 100k points; fewer (faster to embed) for small runs
    n_sentences = max(50 * WINDOW, points // 4)
    with ExitStack() as stack:
        root = run_dir(stack, data_dir, "retrieve")
        plan = PlanConfig()
        store = EdgeStore(root / "store", schema=payload_schema(plan))
        stack.callback(store.close)
        embedder_config = LocalEmbedderConfig(execution=execution)
        embedder = LocalOnnxEmbedder(embedder_config)
        stack.callback(embedder.close)
        if embedder.spec != embedder_config.effective_spec:
            raise ConfigError(f"the local embedder is {embedder.spec.model_version}, not MiniLM")

        built = _build(root, store, embedder, points=points, n_sentences=n_sentences, rng=rng)
        warmup = _questions(built.prose, max(WARMUP_CALLS, 16 * max(counts)), rng)
        levels = list(dict.fromkeys(concurrency))
        measured = {level: _questions(built.prose, queries, rng) for level in levels}

        settings = server_settings(root, plan, execution, max_connection_age_s)
        # the servers' own query embedder, configured as a Retrieve server configures it
        query_embedder = LocalOnnxEmbedder(_local(serving_settings(settings)))
        stack.callback(query_embedder.close)
        results = _measure_variants(
            settings,
            store,
            query_embedder,
            hashes=built.hashes,
            warmup=warmup,
            queries=measured,
            processes=counts,
            floor=FloorSpec(
                collection=built.collection,
                tenant=TENANT,
                candidate_k=settings.retrieval.candidate_k(settings.retrieval.default_top_k),
            ),
        )
    load_after = os.getloadavg()

    retrieval = settings.retrieval
    top_k = retrieval.default_top_k
    goals: list[dict[str, Any]] = [
        {
            "goal": GOAL_TEXT,
            "variant": r["variant"],
            "processes": r["processes"],
            "concurrency": 1,
            "target_p95_ms": GOAL_P95_MS,
            "measured_p95_ms": r["latency_ms"]["p95"],
            "met": r["latency_ms"]["p95"] <= GOAL_P95_MS,
        }
        for r in results
        if r["concurrency"] == 1 and r["variant"] != FLOOR
    ]
    goals += [
        {
            "goal": LOAD_GOAL_TEXT,
            "variant": r["variant"],
            "processes": r["processes"],
            "concurrency": r["concurrency"],
            "target_qps_over_limit": LOAD_GOAL_RATIO,
            "measured_qps_over_limit": r["cpu_limit"]["qps_over_limit"],
            "target_p95_ms": LOAD_GOAL_P95_MS,
            "measured_p95_ms": r["latency_ms"]["p95"],
            "met": (r["cpu_limit"]["qps_over_limit"] or 0) >= LOAD_GOAL_RATIO
            and r["latency_ms"]["p95"] <= LOAD_GOAL_P95_MS,
        }
        for r in results
        if r["concurrency"] == LOAD_GOAL_CONCURRENCY and r["sor_verification"]
    ]
    goals += [
        {
            "goal": FLOOR_GOAL_TEXT,
            "variant": r["variant"],
            "processes": r["processes"],
            "concurrency": r["concurrency"],
            "target_cpu_over_floor": FLOOR_GOAL_RATIO,
            "measured_cpu_over_floor": r["floor"]["cpu_over_floor"],
            "met": (r["floor"]["cpu_over_floor"] or math.inf) <= FLOOR_GOAL_RATIO,
        }
        for r in results
        if r["sor_verification"] and "floor" in r
    ]
    return {
        "benchmark": "ragstream bench retrieve: gRPC Retrieve latency and QPS, client side",
        "what": (
            "client-side latency of unary Retrieve calls (request built -> evidence pack "
            "decoded) over a loopback gRPC channel, and calls/s, after a warm-up of "
            f"{len(warmup)} unmeasured calls per server (over 8 connections per server process "
            "when there are several, so that each is warmed up). Every server (variant x "
            "processes) runs at once (same store); at each concurrency a fresh query list runs in"
            " two halves, servers in one order then the reverse. processes 1: the server in this "
            "process (one query embedder shared by its servers); processes N: "
            "RetrieveProcesses, N server processes on one port (SO_REUSEPORT), this process "
            "hosting the store for them; every server's embedder configured as Retrieve "
            "configures it (retrieval_api.processes.serving_settings). The load "
            "generator (ragdev.bench.loadgen: N client threads, a connection each, one blocking "
            "call in flight per thread) runs in a process of its own; its CPU is reported apart. "
            "cpu_ms_per_request: the server's CPU over the calls (this process, plus the server "
            "processes when there are several; onnxruntime's and qdrant-edge's threads included),"
            " store_host: the part of it this process spent hosting the store for the server "
            "processes (0 with one process);"
            " server_stages: the CPU of the thread running each stage "
            "(ragstream_retrieve_stage_cpu_seconds_total); query_cache: query vectors served from"
            " the cache (hit) or embedded (miss); cpu_limit: cores / the "
            "server's CPU per request at the lowest concurrency; floor: the baseline variant "
            "(ragdev.bench.floor) in the same process layout, a plain grpc.server that embeds "
            "the query with the same model and runs the same engine hybrid query (same "
            "collection, tenant filter, candidate_k, prefetch) and answers only a status: what "
            "a user calling the engine directly pays; cpu_over_floor: a Retrieve row's server "
            "CPU per request over the floor's at the same processes and concurrency; "
            "server_process_cpu_shares: each server process's share of the CPU (the spread of "
            "the connections over the processes)"
        ),
        "machine": machine_info(
            load_before, load_after, ("onnxruntime", "qdrant-edge-py", "grpcio")
        ),
        "data": {
            "vectors": (
                "synthetic (embedding 100k chunks with the local model takes ~1.5 h here): "
                "chunk vector = unit(mean of the REAL local-model embeddings of the chunk's "
                f"sentences + Gaussian noise of {NOISE:g} x its norm), mean cosine "
                f"{built.mean_cosine_to_sentence_mean} to that mean; "
                f"{len(built.prose.sentences)} sentences embedded"
            ),
            "texts": (
                "real English prose of the machine (Python stdlib docstrings, then "
                "/usr/share/common-licenses): each chunk is 2-5 sentences, in order, out of "
                f"{WINDOW} consecutive ones (mean {built.mean_chunk_words} words); an entity's "
                "1-3 chunks come from neighbouring windows"
            ),
            "sparse": (
                "Bm25Encoder.encode_chunk of each chunk text (IDF applied by the engine; the "
                "term counts stored in the payload)"
            ),
            "payload": (
                "as the ingest worker writes it: tenant_id, source_entity_id, chunk_id "
                "<entity>:chunk:<n>, source_hash (sha256 of the entity content), entity_type, "
                "chunk_index, chunk_count, locator, title, text, content_format, created_at, "
                "updated_at, embedding_model, embedding_version, index_version, indexed_at, "
                "source version fields, event_date"
            ),
            "sor": (
                "SQLite, schemas/sql/entities.sqlite.sql, every entity with content_hash = the "
                "payload's source_hash (verdicts OK)"
            ),
            "query_embedding": (
                "real local ONNX embedder in the server "
                f"({embedder_config.effective_spec.model_version}, "
                "intra-op threads "
                f"{_local(serving_settings(settings)).intra_op_threads or 'onnxruntime default'}; "
                "the index's sentences embedded with "
                f"{embedder_config.intra_op_threads or 'onnxruntime default'})"
            ),
            "queries": (
                f"{queries} short natural questions (templates over consecutive content words "
                "of an indexed sentence), one list per concurrency, the same for every server; "
                f"{len(warmup)} other ones for the warm-up"
            ),
        },
        "index": {
            "tenant": TENANT,
            "collection": built.collection,
            "version": built.version,
            "points": points,
            "entities": built.entities,
            "dimension": MINILM_SPEC.dimension,
            "store": "EdgeStore (qdrant-edge, embedded), payloads in RAM",
            "registry": "FileIndexRegistry: created, marked ready, activated",
            "build_seconds": built.seconds,
            "optimize_changed_segments": built.optimize_changed,
            "hnsw": "engine defaults (m=16, ef_construct=100)",
        },
        "config": {
            "top_k": top_k,
            "candidate_k": retrieval.candidate_k(top_k),
            "hybrid": retrieval.hybrid,
            "fusion": retrieval.fusion_method,
            "dense_weight": retrieval.dense_weight,
            "sparse_weight": retrieval.sparse_weight,
            "rrf_k": retrieval.rrf_k,
            "order": retrieval.order,
            "dedup_per_entity": retrieval.dedup_per_entity,
            "evidence_thresholds": (
                retrieval.evidence_thresholds.model_dump()
                if retrieval.evidence_thresholds is not None
                else "the index's calibration (built-in prior when uncalibrated)"
            ),
            "supporting_ratio": retrieval.supporting_ratio,
            "reranker": None,
            "workers": settings.grpc.workers,
            # GOAWAY after this age (None: never): one server process, several
            "connection_age_s": [
                settings.grpc.model_copy(update={"processes": n}).connection_age_s() for n in (1, 2)
            ],
            "max_concurrent_rpcs": settings.grpc.max_concurrent_rpcs,
            "publish": "disabled (no audit records, no reindex requests)",
            "client": (
                "ragdev.bench.loadgen in its own process: N client threads, each with its own "
                "grpc.insecure_channel on 127.0.0.1 (its own connection), one blocking call in "
                "flight per thread, "
                f"bearer token, timeout {CALL_TIMEOUT_S:g} s"
            ),
            "seed": seed,
        },
        "results": results,
        "goals": goals,
    }


def main(argv: Sequence[str] | None = None, prog: str | None = None) -> int:
    """Command line entry: print the report as JSON."""
    parser = argparse.ArgumentParser(
        prog=prog,
        formatter_class=HelpFormatter,
        description=(__doc__ or "").split("\n\n")[0],
    )
    parser.add_argument("--points", type=int, default=100_000)
    parser.add_argument("--queries", type=int, default=200)
    parser.add_argument("--concurrency", type=int_list, nargs="+", default=[[1, 8]])
    parser.add_argument("--data-dir", type=Path, default=None)
    parser.add_argument(
        "--processes",
        type=int_list,
        nargs="+",
        default=None,
        help="server process counts to measure side by side (default: 1 and the cores)",
    )
    parser.add_argument(
        "--embedder-execution",
        choices=("float", "int8"),
        default="float",
        help="the local embedder's execution, for the index and the queries "
        "(RAGSTREAM_EMBEDDER__EXECUTION)",
    )
    parser.add_argument(
        "--max-connection-age-s",
        type=float,
        default=None,
        help="the Retrieve servers' grpc.max_connection_age_s (0: never; default: the "
        "server's default, which ages connections only with several processes)",
    )
    args = parser.parse_args(argv)
    logging.basicConfig(
        level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s"
    )
    report = run(
        points=args.points,
        queries=args.queries,
        concurrency=tuple(flat(args.concurrency)),
        data_dir=args.data_dir,
        processes=tuple(flat(args.processes)) if args.processes else None,
        execution=args.embedder_execution,
        max_connection_age_s=args.max_connection_age_s,
    )
    return emit(report)


if __name__ == "__main__":
    # run the imported module's `main`: the server processes unpickle `_NoVerification` by
    # its module name, which `__main__` is not
    import importlib

    sys.exit(importlib.import_module("ragdev.bench.retrieve").main())
