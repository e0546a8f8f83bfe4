"""Reconcile benchmark: the cost of `streams.reconcile.reconcile` (no repair) at scale.

What runs is the product's: `reconcile()` against a qdrant-edge `EdgeStore` collection
registered with `FileIndexRegistry` (created, marked ready, activated for one tenant) and the
embedded SQLite SoR reader `SqliteSor` over `schemas/sql/entities.sqlite.sql`. It scrolls the
tenant's points (`_indexed`), keyset-scans the tenant's SoR rows (`SqliteSor.scan`, which maps
every row to an `Entity`) and compares the two.

Data (synthetic, built in a scratch directory): `points` chunks, `chunks_per_entity` per entity
(the last entity takes the remainder), shaped as `streams.ingest` writes them: the payload of
`streams.ingest.write` (tenant, entity and chunk ids, chunk_index, chunk_count, source_hash,
entity_type, title, locator, 800-1000 characters of text, content format, timestamps, model and
index version, source version fields, event_date), a random unit dense vector and a BM25-weighted
sparse vector of the chunk's words. Texts are pseudo-words drawn from a Zipf vocabulary, already
in normal form, so an entity's content (its chunks joined by blank lines) hashes to the same
SHA-256 raw or normalized. Every entity has its SoR row (content = the joined chunks) whose
content hash equals the points' `source_hash`: reconciliation finds no drift.

Variants (each in a fresh spawned process, so the peak RSS is the variant's own; the shard is
opened and its points counted before the timed runs; then `repeats` runs of `reconcile()`):
- `selector`: the index scroll reads only the keys reconcile compares (`fields=`, the
  product's code); the SoR rows carry their content hash.
- `full_payload`: the same through an `EdgeStore` whose scroll ignores `fields` (whole
  payloads, texts included: the behaviour before the selector existed).
- `selector_computed_hash`: the selector, against a view of the same table whose
  `content_hash` is NULL, so the SoR reader normalizes and hashes every entity's content (what
  happens with a SoR without a hash column, such as the embedded `ragstream dev` SoR).

Run: `python -m ragdev.bench.reconcile --points 100000` (prints JSON).
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import resource
import sqlite3
import statistics
import sys
import time
from collections.abc import Iterator, Mapping, Sequence
from concurrent.futures import ProcessPoolExecutor
from contextlib import ExitStack
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from multiprocessing import get_context
from pathlib import Path
from typing import Any, Literal

import numpy as np

from ragcore.embedders.spec import EmbeddingSpec
from ragcore.errors import ConfigError
from ragcore.mapping import TableCatalog, TableMapping, table_of_entity
from ragcore.normalize import content_sha256, normalized_sha256
from ragcore.plan import PlanConfig
from ragcore.resources import package_dir
from ragcore.sor.sql import SqliteSor
from ragcore.sparse import Bm25Config, Bm25Encoder, bm25_weight, token_index
from ragcore.store.base import (
    CHUNK_ID,
    ENTITY_ID,
    SOURCE_HASH,
    TENANT_ID,
    PointRecord,
    SparseVector,
    StoredPoint,
    StoreFilter,
)
from ragcore.store.edge import EdgeStore
from ragcore.store.points import CHUNK_COUNT, chunk_point, rfc3339, row_fields
from ragcore.store.registry import FileIndexRegistry
from ragcore.wiring import payload_schema
from ragdev.bench.machine import emit, machine_info, proc_status_mib, run_dir
from ragstream.cli import HelpFormatter
from schemas.entities import ContentFormat, EntityVersion
from streams.reconcile import reconcile

__all__ = ["VARIANTS", "VARIANT_NAMES", "main", "run"]

log = logging.getLogger(__name__)

TENANT = "bench"
ENTITY_TYPES = ("KNOWLEDGE_ARTIFACT", "ticket", "runbook", "faq")
SOR_TABLE = "entities"
#: Both SoR variants (table and view) map as the `entities` table: the same entity ids.
SOR_MAPPING = TableMapping(name="entities")
#: The same rows with a NULL content hash: the SoR reader hashes the content itself.
SOR_VIEW = "entities_unhashed"
#: The payload keys `streams.reconcile._indexed` selects.
RECONCILE_FIELDS = (ENTITY_ID, CHUNK_ID, SOURCE_HASH, CHUNK_COUNT)
#: One SoR row in this many has its content normalized and hashed at build time as a check.
HASH_CHECK_EVERY = 997
# fmt: off
_SYLLABLES = (
    "ka", "ri", "to", "mo", "ne", "sa", "lu", "vi", "de", "pa", "ro", "mi", "ta", "su", "ke",
    "lo", "na", "fi", "gu", "be", "ra", "tel", "mon", "dor", "vin", "sal", "per", "cos", "tri",
    "lan", "mer", "gol", "fen", "dal", "bri", "stor", "plen", "qua", "zen", "hol", "var", "tin",
)
# fmt: on
#: The ingest worker's content hash (default options): the `ContentHasher` of the SoR reader
#: in the `computed` variant.
content_hash = normalized_sha256


def chunk_locator(index: int, offset: int, text: str) -> dict[str, Any]:
    """The locator of a generated chunk (paragraphs joined by a blank line)."""
    return {
        "chunk_index": index,
        "char_start": offset,
        "char_end": offset + len(text),
        "section_path": [],
        "extracted_from": None,
    }


def paragraph_points(
    fields: Mapping[str, Any],
    entity_id: str,
    chunks: Sequence[tuple[str, Any, SparseVector]],
    index_version: int,
    term_counts: Sequence[str] | None = None,
) -> list[PointRecord]:
    """The points of a generated entity whose content is its chunks' texts joined by blank
    lines: (text, dense vector, sparse vector) per chunk, in order, under the worker's payload
    layout (`ragcore.store.points.chunk_point`), with each chunk's stored term counts when
    given (`Bm25Encoder.encode_chunk`)."""
    points = []
    offset = 0
    for index, (text, dense, sparse) in enumerate(chunks):
        points.append(
            chunk_point(
                fields,
                tenant_id=TENANT,
                entity_id=entity_id,
                source_table=table_of_entity(entity_id),
                chunk_id=f"{entity_id}:chunk:{index}",
                chunk_index=index,
                chunk_count=len(chunks),
                locator=chunk_locator(index, offset, text),
                text=text,
                index_version=index_version,
                dense=dense,
                sparse=sparse,
                term_counts=term_counts[index] if term_counts is not None else None,
            )
        )
        offset += len(text) + 2
    return points


# --- variants --------------------------------------------------------------------------------


@dataclass(frozen=True)
class Variant:
    """One configuration of the measured reconciliation."""

    name: str
    payload: Literal["selected", "full"]
    sor_hash: Literal["column", "computed"]
    description: str


VARIANTS: tuple[Variant, ...] = (
    Variant(
        "selector",
        "selected",
        "column",
        f"index scroll with the payload selector {list(RECONCILE_FIELDS)} (+ tenant_id); "
        "SoR rows carry their content hash",
    ),
    Variant(
        "full_payload",
        "full",
        "column",
        "index scroll of whole payloads (texts included), as before the selector; SoR rows "
        "carry their content hash",
    ),
    Variant(
        "selector_computed_hash",
        "selected",
        "computed",
        "index scroll with the payload selector; SoR rows without a content hash (NULL column): "
        "the reader normalizes and hashes every entity's content",
    ),
)
_BY_NAME = {v.name: v for v in VARIANTS}
VARIANT_NAMES: tuple[str, ...] = tuple(_BY_NAME)


class _FullPayloadStore(EdgeStore):
    """An `EdgeStore` whose scroll ignores the payload selection (reads whole payloads)."""

    def scroll(
        self,
        name: str,
        filter: StoreFilter,
        batch: int = 256,
        with_vectors: bool = False,
        *,
        fields: Sequence[str] | None = None,
    ) -> Iterator[StoredPoint]:
        """`EdgeStore.scroll` with `fields=None` whatever the caller asked."""
        return super().scroll(name, filter, batch, with_vectors, fields=None)


# --- data --------------------------------------------------------------------------------------


class _Texts:
    """Chunk texts of pseudo-words drawn from a Zipf vocabulary, and their sparse vectors."""

    def __init__(self, rng: np.random.Generator, *, vocab: int, zipf_s: float) -> None:
        self.rng = rng
        words: list[str] = []
        seen: set[str] = set()
        while len(words) < vocab:
            n = int(rng.integers(1, 5))
            word = "".join(_SYLLABLES[int(i)] for i in rng.integers(0, len(_SYLLABLES), size=n))
            if word not in seen:
                seen.add(word)
                words.append(word)
        self.words = words
        self.cost = np.array([len(w) + 1 for w in words], dtype=np.int64)  # word + a space
        self.index = np.array([token_index(w) for w in words], dtype=np.int64)
        weights = np.arange(1, vocab + 1, dtype=np.float64) ** -zipf_s
        self.cdf = np.cumsum(weights / weights.sum())
        self.bm25 = Bm25Config()

    def chunk(self, low: int, high: int) -> tuple[str, SparseVector]:
        """A text of `low`..`high` characters ending with a full stop, and its BM25 weights."""
        target = int(self.rng.integers(low, high + 1))
        draws = target // 3 + 8  # enough: every word costs >= 3 characters with its space
        ids = np.minimum(np.searchsorted(self.cdf, self.rng.random(draws)), len(self.words) - 1)
        spent = np.cumsum(self.cost[ids])
        ids = ids[: max(1, int(np.searchsorted(spent, target, side="right")))]
        text = " ".join([self.words[i] for i in ids.tolist()]) + "."
        unique, counts = np.unique(ids, return_counts=True)
        weights: dict[int, float] = {}
        for word, tf in zip(unique.tolist(), counts.tolist(), strict=True):
            key = int(self.index[word])
            weights[key] = weights.get(key, 0.0) + bm25_weight(tf, len(ids), self.bm25)
        return text, SparseVector.from_mapping(weights)


@dataclass
class _Built:
    collection: str
    version: int
    entities: int
    seconds: dict[str, float]
    optimize_changed: bool | None
    mean_text_chars: float
    hash_checks: int
    store_mib: float
    sor_mib: float


def _disk_mib(path: Path) -> float:
    """Space allocated on disk (preallocated, still sparse WAL and segment files count less
    than their apparent size)."""
    files = [path] if path.is_file() else [p for p in path.rglob("*") if p.is_file()]
    return round(sum(f.stat().st_blocks * 512 for f in files) / 2**20, 1)


def _create_sor(path: Path) -> sqlite3.Connection:
    ddl = (package_dir("schemas") / "sql" / "entities.sqlite.sql").read_text(encoding="utf-8")
    conn = sqlite3.connect(path)
    conn.executescript(ddl)
    conn.execute(
        f"CREATE VIEW {SOR_VIEW} AS SELECT id, company_id, entity_type, name, content, metadata,"
        f" NULL AS content_hash, created_at, updated_at, deleted_at FROM {SOR_TABLE}"
    )
    return conn


def _build(
    root: Path,
    *,
    points: int,
    chunks_per_entity: int,
    dim: int,
    upsert_batch: int,
    text_chars: tuple[int, int],
    optimize: bool,
    payload_in_ram: bool,
    rng: np.random.Generator,
) -> _Built:
    """Load the index and the SoR, register and activate the index, close the store."""
    spec = _spec(dim)
    texts = _Texts(rng, vocab=30_000, zipf_s=1.1)
    seconds = dict.fromkeys(("generate", "upsert", "sor_insert"), 0.0)
    store = EdgeStore(
        root / "store", schema=payload_schema(PlanConfig()), payload_in_ram=payload_in_ram
    )
    try:
        registry = FileIndexRegistry(root / "store", store)
        manifest = registry.create_version(TENANT, spec, sparse_encoder=Bm25Encoder().model_version)
        collection, index_version = manifest.index_name, manifest.version
        sor = _create_sor(root / "sor.sqlite")
        clock = datetime(2026, 1, 1, tzinfo=UTC)
        made = entities = hash_checks = text_chars_total = 0
        lsn = 1_000
        try:
            while made < points:
                began = time.perf_counter()
                batch: list[PointRecord] = []
                rows: list[tuple[Any, ...]] = []
                while made < points and len(batch) < upsert_batch:
                    n_chunks = min(chunks_per_entity, points - made)
                    key = f"doc-{entities:08d}"
                    entity_id = SOR_MAPPING.entity_id([key])
                    chunks = [texts.chunk(*text_chars) for _ in range(n_chunks)]
                    content = "\n\n".join(text for text, _ in chunks)
                    digest = content_sha256(content)
                    if entities % HASH_CHECK_EVERY == 0:
                        if content_hash(content, ContentFormat.TEXT) != digest:
                            raise RuntimeError(f"{entity_id}: generated content is not normal")
                        hash_checks += 1
                    clock += timedelta(seconds=7)
                    lsn += 16
                    stamp = rfc3339(clock)
                    entity_type = ENTITY_TYPES[entities % len(ENTITY_TYPES)]
                    title = " ".join(chunks[0][0].split()[:6]).rstrip(".").capitalize()
                    vectors = rng.normal(size=(n_chunks, dim))
                    vectors = (vectors / np.linalg.norm(vectors, axis=1, keepdims=True)).astype(
                        np.float32
                    )
                    fields = row_fields(
                        content_hash=digest,
                        entity_type=entity_type,
                        title=title,
                        content_format=ContentFormat.TEXT.value,
                        created_at=stamp,
                        updated_at=stamp,
                        spec=spec,
                        index_version=index_version,
                        indexed_at=stamp,
                        event_date=stamp,
                        version=EntityVersion(
                            updated_at_us=int(clock.timestamp() * 1_000_000), lsn=lsn
                        ),
                    )
                    batch.extend(
                        paragraph_points(
                            fields,
                            entity_id,
                            [(t, vectors[i], sp) for i, (t, sp) in enumerate(chunks)],
                            index_version,
                        )
                    )
                    text_chars_total += sum(len(text) for text, _ in chunks)
                    rows.append(
                        (
                            key,
                            TENANT,
                            entity_type,
                            title,
                            content,
                            json.dumps({"format": "text"}),
                            digest,
                            stamp,
                            stamp,
                        )
                    )
                    made += n_chunks
                    entities += 1
                seconds["generate"] += time.perf_counter() - began
                began = time.perf_counter()
                store.upsert(collection, batch, wait=True)
                seconds["upsert"] += time.perf_counter() - began
                began = time.perf_counter()
                with sor:
                    sor.executemany(
                        f"INSERT INTO {SOR_TABLE} (id, company_id, entity_type, name, content,"
                        " metadata, content_hash, created_at, updated_at)"
                        " VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?)",
                        rows,
                    )
                seconds["sor_insert"] += time.perf_counter() - began
                if made // 50_000 != (made - len(batch)) // 50_000:
                    log.info("loaded %d/%d points", made, points)
        finally:
            sor.close()
        changed: bool | None = None
        if optimize:
            began = time.perf_counter()
            changed = store.optimize(collection)
            seconds["optimize"] = time.perf_counter() - began
        registry.mark_ready(TENANT, index_version, total_vectors=points)
        registry.activate(TENANT, index_version)
    finally:
        began = time.perf_counter()
        store.close()  # flushes; the variants' processes open the shard next
        seconds["flush_and_close"] = time.perf_counter() - began
    log.info("built: %s", {k: round(v, 1) for k, v in seconds.items()})
    return _Built(
        collection=collection,
        version=index_version,
        entities=entities,
        seconds={k: round(v, 2) for k, v in seconds.items()},
        optimize_changed=changed,
        mean_text_chars=round(text_chars_total / points, 1),
        hash_checks=hash_checks,
        store_mib=_disk_mib(root / "store"),
        sor_mib=_disk_mib(root / "sor.sqlite"),
    )


def _spec(dim: int) -> EmbeddingSpec:
    return EmbeddingSpec(
        name="bench-random",
        version="1",
        dimension=dim,
        max_input_tokens=512,
        tokenizer="tiktoken:cl100k_base",
    )


# --- measuring ---------------------------------------------------------------------------------


def _ru_maxrss_mib() -> float:
    """`getrusage(RUSAGE_SELF).ru_maxrss`. On Linux it survives fork + exec: a spawned process
    reports at least its parent's RSS at the fork, so it is no per-variant measure there."""
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss  # KiB on Linux, bytes on macOS
    return round(peak / (2**20 if sys.platform == "darwin" else 2**10), 1)


def _peak_rss_mib() -> float:
    """This process's own peak RSS: VmHWM (reset by exec, unlike ru_maxrss) where Linux has it,
    else ru_maxrss."""
    hwm = proc_status_mib("VmHWM")
    return hwm if hwm is not None else _ru_maxrss_mib()


def _rss_mib() -> float | None:
    return proc_status_mib("VmRSS")


def _reset_peak_rss() -> bool:
    """Reset VmHWM to the current RSS (Linux: `5` into /proc/self/clear_refs); False if not."""
    try:
        Path("/proc/self/clear_refs").write_text("5", encoding="ascii")
    except OSError:
        return False
    return True


def _measure_variant(
    root: str, name: str, *, repeats: int, batch: int, payload_in_ram: bool
) -> dict[str, Any]:
    """Run in a fresh process: open the store and the SoR, then `repeats` reconciliations."""
    variant = _BY_NAME[name]
    rss_start = _rss_mib()
    store_type = EdgeStore if variant.payload == "selected" else _FullPayloadStore
    with ExitStack() as stack:
        store = store_type(
            Path(root) / "store", schema=payload_schema(PlanConfig()), payload_in_ram=payload_in_ram
        )
        stack.callback(store.close)
        table = SOR_TABLE if variant.sor_hash == "column" else SOR_VIEW
        mapping = SOR_MAPPING.model_copy(update={"table": f"public.{table}"})
        sor = SqliteSor(
            Path(root) / "sor.sqlite",
            catalog=TableCatalog([mapping], "sor"),
            hasher=content_hash,
        )
        stack.callback(sor.close)
        registry = FileIndexRegistry(Path(root) / "store", store)
        version_ = registry.active_version(TENANT)
        if version_ is None:
            raise ConfigError(f"tenant {TENANT!r} has no active index under {root}")
        collection = registry.manifest(TENANT, version_).index_name
        began = time.perf_counter()
        counted = store.count(collection, StoreFilter(tenant_id=TENANT))
        open_s = time.perf_counter() - began
        # What reconcile's scroll call returns for one point in this variant.
        first = next(store.scroll(collection, StoreFilter(TENANT), 1, fields=RECONCILE_FIELDS))
        rss_open, peak_open = _rss_mib(), _peak_rss_mib()
        reset = _reset_peak_rss()
        runs: list[dict[str, Any]] = []
        for _ in range(repeats):
            began = time.perf_counter()
            report = reconcile(TENANT, sor=sor, store=store, registry=registry, batch=batch)
            total = time.perf_counter() - began
            runs.append(
                {
                    "total_seconds": round(total, 3),
                    "index_scroll_seconds": report.index_seconds,
                    "sor_scan_seconds": report.sor_seconds,
                    "compare_seconds": round(total - report.index_seconds - report.sor_seconds, 3),
                    "points_scanned": report.points_scanned,
                    "indexed_entities": report.indexed_entities,
                    "sor_entities": report.sor_entities,
                    "drift": report.drift,
                    "index_points_per_s": round(report.points_scanned / report.index_seconds, 1)
                    if report.index_seconds
                    else None,
                    "points_per_s": round(report.points_scanned / total, 1),
                }
            )
        peak_runs = _peak_rss_mib() if reset else None
        rss_runs = _rss_mib()
    return {
        "counted_points": counted,
        "payload_keys_per_point": sorted(first.payload),
        "open_and_count_seconds": round(open_s, 3),
        "rss_mib_at_start": rss_start,
        "rss_mib_after_open": rss_open,
        "rss_mib_after_runs": rss_runs,
        "peak_rss_mib": max(peak_open, peak_runs or 0.0),
        "peak_rss_mib_during_runs": peak_runs,
        "ru_maxrss_mib": _ru_maxrss_mib(),
        "runs": runs,
    }


def _in_fresh_process(root: Path, name: str, **kwargs: Any) -> dict[str, Any]:
    with ProcessPoolExecutor(max_workers=1, mp_context=get_context("spawn")) as pool:
        result: dict[str, Any] = pool.submit(_measure_variant, str(root), name, **kwargs).result()
    return result


# --- the run -----------------------------------------------------------------------------------


def run(
    points: int,
    *,
    chunks_per_entity: int = 10,
    dim: int = 384,
    batch: int = 1000,
    upsert_batch: int = 512,
    repeats: int = 2,
    variants: Sequence[str] = VARIANT_NAMES,
    text_chars: tuple[int, int] = (800, 1000),
    optimize: bool = False,
    payload_in_ram: bool = True,
    data_dir: Path | None = None,
    seed: int = 0,
) -> dict[str, Any]:
    """Build the index and the SoR, measure `reconcile()` for each variant; a JSON-able report.

    `batch` is reconcile's page size (index scroll and SoR scan). `data_dir` receives the store,
    the registry and the SoR and is kept (a temporary directory, removed afterwards, when None;
    otherwise it must not hold a previous run). Each variant runs in a fresh spawned process.
    """
    if points < 1 or chunks_per_entity < 1 or repeats < 1 or batch < 1 or upsert_batch < 1:
        raise ConfigError("points, chunks_per_entity, repeats and batch sizes must be >= 1")
    if not variants or any(v not in _BY_NAME for v in variants):
        raise ConfigError(f"variants must be among {sorted(_BY_NAME)}, got {list(variants)}")
    if not 1 <= text_chars[0] <= text_chars[1]:
        raise ConfigError(f"text_chars must be (low, high) with 1 <= low <= high: {text_chars}")
    load_before = os.getloadavg()
    rng = np.random.default_rng(seed)
    with ExitStack() as stack:
        root = run_dir(stack, data_dir, "reconcile")
        began = time.perf_counter()
        built = _build(
            root,
            points=points,
            chunks_per_entity=chunks_per_entity,
            dim=dim,
            upsert_batch=upsert_batch,
            text_chars=text_chars,
            optimize=optimize,
            payload_in_ram=payload_in_ram,
            rng=rng,
        )
        build_s = time.perf_counter() - began
        build_peak = _peak_rss_mib()
        results: list[dict[str, Any]] = []
        for name in variants:
            log.info("variant %s: %d run(s) in a fresh process", name, repeats)
            measured = _in_fresh_process(
                root, name, repeats=repeats, batch=batch, payload_in_ram=payload_in_ram
            )
            runs = measured["runs"]
            best = min(runs, key=lambda r: r["total_seconds"])
            consistent = measured["counted_points"] == points and all(
                r["drift"] == 0
                and r["points_scanned"] == points
                and r["indexed_entities"] == built.entities
                and r["sor_entities"] == built.entities
                for r in runs
            )
            results.append(
                {
                    "variant": name,
                    "description": _BY_NAME[name].description,
                    "consistent": consistent,
                    "best_run": best,
                    "median_total_seconds": round(
                        statistics.median(r["total_seconds"] for r in runs), 3
                    ),
                    **measured,
                }
            )
    load_after = os.getloadavg()
    return {
        "benchmark": "ragstream bench reconcile: streams.reconcile.reconcile() cost, no repair",
        "what": (
            "wall time of reconcile(tenant, sor=SqliteSor, store=EdgeStore, registry="
            "FileIndexRegistry, batch) end to end: index_scroll_seconds (reconcile's scroll of "
            "the active index into entity -> chunk ids / source hashes / chunk counts), "
            "sor_scan_seconds (SqliteSor.scan of the tenant's live rows, mapped to entities), "
            "compare_seconds (the rest: the comparison); points_per_s = points scanned / total. "
            "Each variant runs in a fresh spawned process: the shard is opened and its points "
            "counted first (open_and_count_seconds, not part of the runs), then `repeats` runs; "
            "peak_rss_mib is that process's own peak RSS (VmHWM: imports, the open shard, all "
            "runs), peak_rss_mib_during_runs its peak while the runs ran (VmHWM reset after the "
            "open), so the runs' own memory is about peak_rss_mib_during_runs - "
            "rss_mib_after_open; ru_maxrss_mib is getrusage's figure, which on Linux includes the "
            "spawning parent's RSS at the fork. The data was written just before, so the OS "
            "page cache is warm (no cold-disk numbers)"
        ),
        "machine": machine_info(
            load_before,
            load_after,
            ("qdrant-edge-py", "numpy", "pydantic"),
            {"sqlite": sqlite3.sqlite_version},
        ),
        "data": {
            "points": points,
            "entities": built.entities,
            "chunks_per_entity": chunks_per_entity,
            "tenant": TENANT,
            "texts": (
                f"{text_chars[0]}-{text_chars[1]} characters of pseudo-words from a Zipf(1.1) "
                f"vocabulary of 30000 (mean {built.mean_text_chars} chars), in normal form; an "
                "entity's content is its chunks joined by blank lines"
            ),
            "dense": f"{dim}-d random unit float32 vectors",
            "sparse": "BM25 document weights (k1=1.2, b=0.75) of the chunk's words",
            "payload": (
                "as streams.ingest writes it: tenant_id, source_entity_id, chunk_id, "
                "chunk_index, chunk_count, source_hash, entity_type, title, locator, text, "
                "content_format, created_at, updated_at, embedding_model, embedding_version, "
                "index_version, indexed_at, event_date, source version fields"
            ),
            "sor": (
                "SQLite, schemas/sql/entities.sqlite.sql: one row per entity (content = the "
                "joined chunks, content_hash = the points' source_hash = SHA-256 of the "
                f"content, equal to the normalizer's hash on the {built.hash_checks} rows "
                f"checked, one in {HASH_CHECK_EVERY}); view {SOR_VIEW} = the same rows with "
                "content_hash NULL"
            ),
            "expected_drift": 0,
        },
        "index": {
            "collection": built.collection,
            "version": built.version,
            "store": "EdgeStore (qdrant-edge, embedded)",
            "registry": "FileIndexRegistry: created, marked ready, activated",
            "payload_in_ram": payload_in_ram,
            "optimized": optimize,
            "optimize_changed_segments": built.optimize_changed,
            "disk_mib": {"store": built.store_mib, "sor": built.sor_mib},
            "build_seconds": {**built.seconds, "total": round(build_s, 2)},
            "build_points_per_s": round(points / build_s, 1),
            "build_process_peak_rss_mib": build_peak,
        },
        "config": {
            "reconcile_batch": batch,
            "selected_fields": [*RECONCILE_FIELDS, TENANT_ID],
            "upsert_batch": upsert_batch,
            "repeats": repeats,
            "variants": list(variants),
            "seed": seed,
        },
        "results": results,
        "consistent": all(r["consistent"] for r in results),
    }


def main(argv: Sequence[str] | None = None, prog: str | None = None) -> int:
    """Command line: print the report as JSON (and write it to `--out`); 1 when inconsistent."""
    parser = argparse.ArgumentParser(
        prog=prog,
        formatter_class=HelpFormatter,
        description=(__doc__ or "").split("\n\n")[0],
    )
    parser.add_argument("--points", type=int, default=100_000)
    parser.add_argument("--chunks-per-entity", type=int, default=10)
    parser.add_argument("--dim", type=int, default=384)
    parser.add_argument("--batch", type=int, default=1000, help="reconcile's page size")
    parser.add_argument("--upsert-batch", type=int, default=512)
    parser.add_argument("--repeats", type=int, default=2)
    parser.add_argument("--variants", nargs="+", choices=VARIANT_NAMES, default=None)
    parser.add_argument("--optimize", action="store_true", help="build HNSW before measuring")
    parser.add_argument("--payload-on-disk", action="store_true", help="payload_in_ram=False")
    parser.add_argument("--data-dir", type=Path, default=None, help="kept after the run")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--out", type=Path, default=None)
    args = parser.parse_args(argv)
    logging.basicConfig(
        level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s"
    )
    report = run(
        args.points,
        chunks_per_entity=args.chunks_per_entity,
        dim=args.dim,
        batch=args.batch,
        upsert_batch=args.upsert_batch,
        repeats=args.repeats,
        variants=args.variants or VARIANT_NAMES,
        optimize=args.optimize,
        payload_in_ram=not args.payload_on_disk,
        data_dir=args.data_dir,
        seed=args.seed,
    )
    return emit(report, args.out, 0 if report["consistent"] else 1)


if __name__ == "__main__":
    raise SystemExit(main())
