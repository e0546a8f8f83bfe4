"""`VectorStore` on qdrant-edge: the Qdrant engine embedded in this process (the default).

Layout: one shard directory per collection, `<data_dir>/collections/<name>/`.

Single opener: a shard directory can be opened by one opener only (a second `EdgeShard.load`
fails on the WAL lock, even in the same process). So every `EdgeStore` on the same data dir in
one process shares a process-wide runtime that opens each shard once and keeps it open until the
last of those stores is closed. Consequence for deployments: in embedded mode the ingest worker
and the Retrieve server must run in the *same process*; a second process on the same data dir
gets a StoreError naming the lock. Use a Qdrant server (`qdrant_remote`) to split them.

Concurrency: the engine serves concurrent reads and writes; writes to one shard are serialized
by a per-shard lock so batches apply in call order. `optimize()` does not take that lock (it can
run for minutes and the engine keeps accepting writes meanwhile).

Indexing: qdrant-edge has no background optimizer. Points land in an appendable segment that is
searched by brute force until `optimize(name)` builds HNSW and payload-indexed segments; call it
after bulk loads and periodically while streaming (it is a no-op below the engine's indexing
threshold, about 10 MB of vectors).

Writes are applied synchronously (WAL + segment) before `update` returns, so `wait` needs no
handling here: every write behaves as `wait=True`.

Creation is atomic: a shard is built under `<data_dir>/.creating/<name>/`, closed and renamed
into `collections/`. The engine refuses to create a shard over a directory that holds segment
data, so a process killed half-way through creating one in place would leave a collection that
no later start could create or open (every write of that tenant failing for good).
"""

from __future__ import annotations

import json
import logging
import os
import shutil
import threading
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TypeVar

import qdrant_edge as qe

from ragcore.errors import StoreError
from ragcore.store.base import (
    DENSE_VECTOR,
    ENTITY_ID,
    PARTITION,
    SPARSE_VECTOR,
    TENANT_ID,
    TENANT_KEY_FIELDS,
    PayloadSchema,
    Placement,
    PointRecord,
    SparseVector,
    StoreFilter,
    datetime_bounds,
    numeric_bounds,
    refuse_shared,
)
from ragcore.store.engine import QdrantEngine, engine_vectors
from ragcore.store.engine import engine_payload as _payload
from ragcore.store.ids import validate_collection_name
from ragcore.store.registry import fsync_dir

T = TypeVar("T")

log = logging.getLogger(__name__)

_CONFIG_FILE = "edge_config.json"


def _vendor(what: str, fn: Callable[[], T]) -> T:
    """Run a qdrant-edge call, translating its (untyped) exceptions into StoreError."""
    try:
        return fn()
    except StoreError:
        raise
    except Exception as exc:  # qdrant-edge raises bare `Exception` for every engine error
        message = str(exc)
        if "failed to open WAL" in message:
            message += (
                " (the shard is open elsewhere: in embedded mode only one process may open a"
                " data dir; run worker and server in one process or use a Qdrant server)"
            )
        raise StoreError(f"qdrant-edge {what}: {message}") from exc


@dataclass
class _Shard:
    shard: qe.EdgeShard
    path: Path
    write_lock: threading.Lock = field(default_factory=threading.Lock)


@dataclass
class _Runtime:
    """The shards of one data dir opened by this process, shared by its EdgeStores."""

    root: Path
    refs: int = 0
    lock: threading.RLock = field(default_factory=threading.RLock)
    shards: dict[str, _Shard] = field(default_factory=dict)


_RUNTIMES: dict[Path, _Runtime] = {}
_RUNTIMES_LOCK = threading.Lock()


def _acquire_runtime(root: Path) -> _Runtime:
    with _RUNTIMES_LOCK:
        runtime = _RUNTIMES.get(root)
        if runtime is None:
            runtime = _RUNTIMES[root] = _Runtime(root)
        runtime.refs += 1
        return runtime


def _release_runtime(runtime: _Runtime) -> None:
    with _RUNTIMES_LOCK:
        runtime.refs -= 1
        if runtime.refs > 0:
            return
        del _RUNTIMES[runtime.root]
    with runtime.lock:
        shards, runtime.shards = list(runtime.shards.values()), {}
    errors: list[str] = []
    for handle in shards:
        with handle.write_lock:
            try:  # close every shard, then report what failed
                _vendor(f"flush {handle.path}", handle.shard.flush)
                _vendor(f"close {handle.path}", handle.shard.close)
            except StoreError as exc:
                errors.append(str(exc))
    if errors:
        raise StoreError("qdrant-edge close failed: " + "; ".join(errors))


def _to_sparse(vector: SparseVector) -> qe.SparseVector:
    return qe.SparseVector(list(vector.indices), list(vector.values))


class EdgeStore(QdrantEngine):
    """`VectorStore` on qdrant-edge shards under `data_dir` (see the module docstring)."""

    def __init__(
        self,
        data_dir: str | Path,
        *,
        schema: PayloadSchema | None = None,
        payload_in_ram: bool = True,
        hnsw_ef: int | None = None,
        max_search_threads: int | None = None,
    ) -> None:
        """Open (lazily) the collections under `data_dir`.

        `payload_in_ram` keeps payloads cached in memory (queries read the payload of every
        candidate); `hnsw_ef` overrides the search-time beam width; `max_search_threads` sizes the
        engine's search pool (default: one per CPU). The shard options apply when this process
        first opens a shard.
        """
        self._root = Path(data_dir).resolve()
        self._collections = self._root / "collections"
        self._schema = schema or PayloadSchema()
        self._payload_memory = qe.Memory.Cached if payload_in_ram else qe.Memory.Cold
        self._search_params = qe.SearchParams(hnsw_ef=hnsw_ef) if hnsw_ef else None
        self._max_search_threads = max_search_threads
        self._runtime: _Runtime | None = _acquire_runtime(self._root)

    # --- shards --------------------------------------------------------------------------

    @property
    def schema(self) -> PayloadSchema:
        """Which payload fields are indexed."""
        return self._schema

    def _rt(self) -> _Runtime:
        if self._runtime is None:
            raise StoreError("EdgeStore is closed")
        return self._runtime

    def _path(self, name: str) -> Path:
        return self._collections / validate_collection_name(name)

    def _config(self, dimension: int | None, sparse: bool) -> qe.EdgeConfig:
        vectors = (
            {DENSE_VECTOR: qe.EdgeVectorParams(size=dimension, distance=qe.Distance.Cosine)}
            if dimension is not None
            else None
        )
        sparse_vectors = (
            {SPARSE_VECTOR: qe.EdgeSparseVectorParams(modifier=qe.Modifier.Idf)} if sparse else None
        )
        return qe.EdgeConfig(
            vectors=vectors,
            sparse_vectors=sparse_vectors,
            payload_memory=self._payload_memory,
            max_search_threads=self._max_search_threads,
        )

    def _open(self, name: str) -> _Shard:
        runtime = self._rt()
        path = self._path(name)
        with runtime.lock:
            handle = runtime.shards.get(name)
            if handle is not None:
                return handle
            if not (path / _CONFIG_FILE).is_file():
                raise StoreError(f"collection {name!r} does not exist under {self._collections}")
            # Loading with a config applies this process's options (payload memory, threads);
            # the engine requires the vectors in it, so they are read back from the shard.
            stored = self._read_config(name, path)
            dense = stored.get("vectors", {}).get(DENSE_VECTOR, {}).get("size")
            options = self._config(dense, SPARSE_VECTOR in stored.get("sparse_vectors", {}))
            shard = _vendor(f"open {name}", lambda: qe.EdgeShard.load(str(path), options))
            handle = runtime.shards[name] = _Shard(shard, path)
            return handle

    def _write(self, name: str, operation: qe.UpdateOperation) -> None:
        handle = self._open(name)
        with handle.write_lock:
            _vendor(f"update {name}", lambda: handle.shard.update(operation))

    # --- collections ---------------------------------------------------------------------

    def ensure_collection(
        self,
        name: str,
        dimension: int,
        sparse: bool = True,
        *,
        placement: Placement = "dedicated",
    ) -> None:
        """Create the shard if absent, else check its vectors; then add missing payload indexes
        (dedicated placement only: `TieredStore` makes shared ones)."""
        refuse_shared(name, placement)
        if dimension <= 0:
            raise ValueError(f"dimension must be > 0, got {dimension}")
        runtime = self._rt()
        path = self._path(name)
        with runtime.lock:
            if name in runtime.shards or (path / _CONFIG_FILE).is_file():
                self._check_config(name, path, dimension, sparse)
                handle = self._open(name)
            else:
                self._create_shard(name, path, self._config(dimension, sparse))
                handle = self._open(name)
            self._ensure_indexes(name, handle)

    def _create_shard(self, name: str, path: Path, config: qe.EdgeConfig) -> None:
        """Build the shard aside, close it and rename it to `path` (see the module docs); a
        directory at `path` without a shard config is what an in-place creation killed
        half-way left (nothing is ever written to a shard before its creation returns):
        removed. The caller holds the runtime lock."""
        staging = self._root / ".creating" / path.name
        try:
            if staging.exists():
                shutil.rmtree(staging)  # a creation killed before its rename
            staging.parent.mkdir(parents=True, exist_ok=True)
            if path.exists():
                log.warning("collection %r: removing a half-created shard directory", name)
                shutil.rmtree(path)
        except OSError as exc:
            raise StoreError(f"collection {name!r}: cannot prepare its creation: {exc}") from exc
        shard = _vendor(f"create {name}", lambda: qe.EdgeShard.create(str(staging), config))
        _vendor(f"close {name}", shard.close)
        try:
            path.parent.mkdir(parents=True, exist_ok=True)
            os.replace(staging, path)
            fsync_dir(path.parent)
        except OSError as exc:
            raise StoreError(f"collection {name!r}: cannot move its new shard: {exc}") from exc

    @staticmethod
    def _read_config(name: str, path: Path) -> dict[str, Any]:
        try:
            config = json.loads((path / _CONFIG_FILE).read_text(encoding="utf-8"))
        except (OSError, ValueError) as exc:
            raise StoreError(f"collection {name!r}: unreadable shard config: {exc}") from exc
        if not isinstance(config, dict):
            raise StoreError(f"collection {name!r}: shard config is not an object")
        return config

    def _check_config(self, name: str, path: Path, dimension: int, sparse: bool) -> None:
        config = self._read_config(name, path)
        dense = config.get("vectors", {}).get(DENSE_VECTOR)
        if dense is None or dense.get("size") != dimension or dense.get("distance") != "Cosine":
            raise StoreError(
                f"collection {name!r} exists with dense vector {dense!r}, "
                f"not size {dimension} cosine"
            )
        if sparse and SPARSE_VECTOR not in config.get("sparse_vectors", {}):
            raise StoreError(f"collection {name!r} exists without a sparse vector")

    def _ensure_indexes(self, name: str, handle: _Shard) -> None:
        existing = _vendor(f"info {name}", lambda: handle.shard.info().payload_schema)
        wanted: dict[str, Any] = {
            k: qe.KeywordIndexParams(is_tenant=True) for k in TENANT_KEY_FIELDS
        }
        for key in self._schema.all_keyword_fields():
            wanted.setdefault(key, qe.PayloadSchemaType.Keyword)
        kinds = {
            "datetime": qe.PayloadSchemaType.Datetime,
            "float": qe.PayloadSchemaType.Float,
            "integer": qe.PayloadSchemaType.Integer,
        }
        for key, kind in self._schema.range_fields.items():
            wanted[key] = kinds[kind]
        for key, schema in wanted.items():
            if key not in existing:
                self._write(name, qe.UpdateOperation.create_field_index(key, schema))

    def drop_collection(self, name: str) -> bool:
        """Close the shard (if open here) and delete its directory."""
        runtime = self._rt()
        path = self._path(name)
        with runtime.lock:
            handle = runtime.shards.pop(name, None)
            if handle is not None:
                with handle.write_lock:
                    _vendor(f"close {name}", handle.shard.close)
            if not path.exists():
                return False
            try:
                shutil.rmtree(path)
            except OSError as exc:
                raise StoreError(f"cannot delete collection {name!r}: {exc}") from exc
            return True

    def collection_exists(self, name: str) -> bool:
        """True when the shard directory holds a shard."""
        return name in self._rt().shards or (self._path(name) / _CONFIG_FILE).is_file()

    def list_collections(self) -> list[str]:
        """Names of the collections under the data dir, sorted."""
        if not self._collections.is_dir():
            return []
        return sorted(p.name for p in self._collections.iterdir() if (p / _CONFIG_FILE).is_file())

    # --- writes --------------------------------------------------------------------------

    def upsert(
        self,
        name: str,
        points: Sequence[PointRecord],
        wait: bool = True,
        *,
        partition: str | None = None,
    ) -> None:
        """Insert or overwrite points (always applied before returning, see module docs)."""
        if not points:
            return
        converted = [
            qe.Point(p.point_id, engine_vectors(p, _to_sparse), _payload(p, partition))
            for p in points
        ]
        self._write(name, qe.UpdateOperation.upsert_points(converted))

    def _selection(self, ids: Sequence[str] | None, partition: str | None) -> qe.Filter:
        must: list[Any] = []
        if ids is not None:
            must.append(qe.HasIdCondition(set(ids)))
        if partition is not None:
            must.append(qe.FieldCondition(PARTITION, match=qe.MatchValue(partition)))
        if not must:
            raise ValueError("a selection needs ids or a partition")
        return qe.Filter(must=must)

    def _delete(self, name: str, selection: qe.Filter, wait: bool) -> None:
        self._write(name, qe.UpdateOperation.delete_points_by_filter(selection))

    def _set_payload(
        self, name: str, selection: qe.Filter, values: Mapping[str, Any], wait: bool
    ) -> None:
        self._write(name, qe.UpdateOperation.set_payload_by_filter(selection, dict(values)))

    def _unset_payload(self, name: str, selection: qe.Filter, keys: list[str], wait: bool) -> None:
        self._write(name, qe.UpdateOperation.delete_payload_by_filter(selection, keys))

    def optimize(self, name: str) -> bool:
        """Run the engine's optimizers now (HNSW, payload indexes, vacuum); blocks until done."""
        handle = self._open(name)
        return _vendor(f"optimize {name}", handle.shard.optimize)

    def flush(self, name: str) -> None:
        """Flush the shard's pending changes to its segments on disk."""
        handle = self._open(name)
        _vendor(f"flush {name}", handle.shard.flush)

    # --- reads ---------------------------------------------------------------------------

    def _filter(self, store_filter: StoreFilter) -> qe.Filter:
        self._schema.check_filter(store_filter)
        must: list[Any] = [
            qe.FieldCondition(TENANT_ID, match=qe.MatchValue(store_filter.tenant_id))
        ]
        if store_filter.partition is not None:
            must.append(qe.FieldCondition(PARTITION, match=qe.MatchValue(store_filter.partition)))
        if store_filter.entity_types:
            must.append(
                qe.FieldCondition("entity_type", match=qe.MatchAny(list(store_filter.entity_types)))
            )
        if store_filter.entity_ids:
            must.append(
                qe.FieldCondition(ENTITY_ID, match=qe.MatchAny(list(store_filter.entity_ids)))
            )
        for key, values in store_filter.keywords.items():
            if isinstance(values[0], bool):
                # MatchAny takes str or int lists only: booleans become a `should` of values.
                should: list[Any] = [
                    qe.FieldCondition(key, match=qe.MatchValue(v)) for v in set(values)
                ]
                must.append(qe.Filter(should=should))
            elif isinstance(values[0], str):
                texts = [v for v in values if isinstance(v, str)]
                must.append(qe.FieldCondition(key, match=qe.MatchAny(texts)))
            else:
                ints = [v for v in values if isinstance(v, int)]
                must.append(qe.FieldCondition(key, match=qe.MatchAny(ints)))
        for key, bounds in store_filter.ranges.items():
            if bounds.is_datetime:
                iso = [None if b is None else b.isoformat() for b in datetime_bounds(bounds)]
                must.append(qe.FieldCondition(key, range=qe.RangeDateTime(*iso)))
            else:
                fgte, fgt, flte, flt = numeric_bounds(bounds)
                must.append(qe.FieldCondition(key, range=qe.RangeFloat(fgte, fgt, flte, flt)))
        return qe.Filter(must=must)

    def _sparse_query(self, sparse: SparseVector) -> qe.SparseVector:
        return _to_sparse(sparse)

    def _request(
        self,
        query: Any,
        using: str,
        condition: qe.Filter,
        limit: int,
        with_vectors: bool,
        *,
        with_payload: bool | list[str] = True,
    ) -> qe.QueryRequest:
        return qe.QueryRequest(
            limit=limit,
            query=qe.Query.Nearest(query, using=using),
            filter=condition,
            with_payload=(
                with_payload
                if isinstance(with_payload, bool)
                else qe.PayloadSelector.Include(with_payload)
            ),
            with_vector=[DENSE_VECTOR] if with_vectors else False,
            params=self._search_params,
        )

    def _among(self, condition: qe.Filter, ids: Sequence[Any]) -> qe.Filter:
        return qe.Filter(must=[condition, qe.HasIdCondition(set(ids))])

    def _run(self, name: str, requests: Sequence[qe.QueryRequest]) -> list[Sequence[Any]]:
        handle = self._open(name)
        if len(requests) == 1:
            (request,) = requests
            return [_vendor(f"query {name}", lambda: handle.shard.query(request))]
        batch = qe.QueryBatchRequest(list(requests))
        # one planned pass over the segments for both branches of a hybrid search
        return list(_vendor(f"query_batch {name}", lambda: handle.shard.query_batch(batch)))

    def _fetch(
        self, name: str, ids: Sequence[str], vectors: bool | list[str], keys: list[str] | None
    ) -> Sequence[Any]:
        handle = self._open(name)
        selector = True if keys is None else qe.PayloadSelector.Include(keys)
        return _vendor(
            f"retrieve {name}",
            lambda: handle.shard.retrieve(list(ids), with_payload=selector, with_vector=vectors),
        )

    def _scroll_page(
        self,
        name: str,
        condition: qe.Filter,
        *,
        limit: int,
        offset: Any,
        keys: list[str] | None,
        with_vectors: bool,
    ) -> tuple[Sequence[Any], Any]:
        handle = self._open(name)
        request = qe.ScrollRequest(
            offset=offset,
            limit=limit,
            filter=condition,
            with_payload=True if keys is None else qe.PayloadSelector.Include(keys),
            with_vector=bool(with_vectors),
        )
        return _vendor(f"scroll {name}", lambda: handle.shard.scroll(request))

    def count(self, name: str, filter: StoreFilter) -> int:
        """Exact number of points matching the filter."""
        request = qe.CountRequest(exact=True, filter=self._filter(filter))
        handle = self._open(name)
        return _vendor(f"count {name}", lambda: handle.shard.count(request))

    def close(self) -> None:
        """Release this store's hold; the last store of the data dir flushes and closes shards."""
        runtime, self._runtime = self._runtime, None
        if runtime is not None:
            _release_runtime(runtime)
