"""`VectorStore` on qdrant-client: a Qdrant server in production, local mode in tests.

`QdrantRemoteStore.connect(url, api_key)` talks to a server (gRPC preferred);
`QdrantRemoteStore.local(path)` uses qdrant-client's local mode (`:memory:` or a directory),
which implements the server's API semantics by brute force: the contract tests run on it, but it
is far too slow to serve (docs/decisions/vector-store-qdrant-edge-and-server.md).

Beyond the port, this adapter offers what the server-mode index registry needs: collection
metadata (where dedicated versions' manifests live), aliases and the list of collections; and
`CatalogEntries` / `ServerPlacementCatalog`, ragstream's catalog collection on the server where
shared placement is recorded (docs/decisions/tiered-tenancy.md).

Errors: connection refused, timeouts, gRPC UNAVAILABLE/DEADLINE_EXCEEDED/RESOURCE_EXHAUSTED and
HTTP 429/502/503/504 become StoreUnavailableError (with Retry-After when the server sent one);
everything else becomes StoreError with the vendor's message.
"""

from __future__ import annotations

import json
import threading
import time
import uuid
import warnings
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any, TypeVar

import grpc
import httpx
from qdrant_client import QdrantClient, models
from qdrant_client.common.client_exceptions import ResourceExhaustedResponse
from qdrant_client.http.exceptions import ResponseHandlingException, UnexpectedResponse

from ragcore.errors import StoreError, StoreUnavailableError
from ragcore.store.base import (
    DENSE_VECTOR,
    ENTITY_ID,
    ENTITY_TYPE,
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
from ragcore.store.ids import (
    CATALOG_COLLECTION,
    parse_collection_name,
    validate_collection_name,
)

T = TypeVar("T")

_UNAVAILABLE_HTTP = {429, 502, 503, 504}
_UNAVAILABLE_GRPC = {
    grpc.StatusCode.UNAVAILABLE,
    grpc.StatusCode.DEADLINE_EXCEEDED,
    grpc.StatusCode.RESOURCE_EXHAUSTED,
}


def translate_error(what: str, exc: Exception) -> StoreError:
    """The ragstream error for a qdrant-client exception raised while doing `what`."""
    if isinstance(exc, StoreError):
        return exc
    if isinstance(exc, ResourceExhaustedResponse):
        return StoreUnavailableError(
            f"qdrant {what}: rate limited: {exc}", retry_after=float(exc.retry_after_s)
        )
    if isinstance(exc, UnexpectedResponse):
        if exc.status_code in _UNAVAILABLE_HTTP:
            retry = exc.headers.get("Retry-After")
            retry_after = float(retry) if retry and retry.isdigit() else None
            return StoreUnavailableError(f"qdrant {what}: {exc}", retry_after=retry_after)
        return StoreError(f"qdrant {what}: {exc}")
    if isinstance(exc, ResponseHandlingException | httpx.TransportError | ConnectionError):
        source = getattr(exc, "source", exc)
        return StoreUnavailableError(f"qdrant {what}: unreachable: {source}")
    if isinstance(exc, TimeoutError):
        return StoreUnavailableError(f"qdrant {what}: timed out: {exc}")
    if isinstance(exc, grpc.RpcError):
        code = exc.code() if callable(getattr(exc, "code", None)) else None
        details = exc.details() if callable(getattr(exc, "details", None)) else str(exc)
        if code in _UNAVAILABLE_GRPC:
            return StoreUnavailableError(f"qdrant {what}: {code}: {details}")
        return StoreError(f"qdrant {what}: {code}: {details}")
    return StoreError(f"qdrant {what}: {exc}")


def _vendor(what: str, fn: Callable[[], T]) -> T:
    try:
        return fn()
    except Exception as exc:  # translated at the adapter boundary, never swallowed
        raise translate_error(what, exc) from exc


def _to_sparse(vector: SparseVector) -> models.SparseVector:
    return models.SparseVector(indices=list(vector.indices), values=list(vector.values))


class QdrantRemoteStore(QdrantEngine):
    """`VectorStore` over a `QdrantClient` (server or local mode)."""

    def __init__(
        self,
        client: QdrantClient,
        *,
        schema: PayloadSchema | None = None,
        owns_client: bool = False,
    ) -> None:
        """Wrap `client`; `owns_client` makes `close()` close it."""
        self._client = client
        self._schema = schema or PayloadSchema()
        self._owns_client = owns_client
        self._closed = False

    @classmethod
    def connect(
        cls,
        url: str,
        *,
        api_key: str | None = None,
        prefer_grpc: bool = True,
        timeout: int = 10,
        schema: PayloadSchema | None = None,
    ) -> QdrantRemoteStore:
        """A store on a Qdrant server (no request is made until the first operation)."""
        client = _vendor(
            "connect",
            lambda: QdrantClient(
                url=url,
                api_key=api_key,
                prefer_grpc=prefer_grpc,
                timeout=timeout,
                check_compatibility=False,
            ),
        )
        return cls(client, schema=schema, owns_client=True)

    @classmethod
    def local(
        cls, path: str | Path | None = None, *, schema: PayloadSchema | None = None
    ) -> QdrantRemoteStore:
        """A store on qdrant-client local mode: in memory, or persisted under `path`."""
        client = _vendor(
            "open local",
            lambda: QdrantClient(path=str(path)) if path else QdrantClient(location=":memory:"),
        )
        return cls(client, schema=schema, owns_client=True)

    @property
    def client(self) -> QdrantClient:
        """The wrapped client."""
        return self._client

    @property
    def schema(self) -> PayloadSchema:
        """Which payload fields are indexed."""
        return self._schema

    # --- collections ---------------------------------------------------------------------

    def ensure_collection(
        self,
        name: str,
        dimension: int,
        sparse: bool = True,
        *,
        placement: Placement = "dedicated",
        metadata: Mapping[str, Any] | None = None,
    ) -> None:
        """Create the collection (with `metadata`) if absent, else check its vectors; add indexes.

        `metadata` is only written at creation; use `set_collection_metadata` to change it.
        Dedicated placement only: `TieredStore` makes shared ones.
        """
        validate_collection_name(name)
        refuse_shared(name, placement)
        if dimension <= 0:
            raise ValueError(f"dimension must be > 0, got {dimension}")
        if _vendor(f"exists {name}", lambda: self._client.collection_exists(name)):
            self._check_config(name, dimension, sparse)
        else:
            _vendor(
                f"create {name}",
                lambda: self._client.create_collection(
                    name,
                    vectors_config={
                        DENSE_VECTOR: models.VectorParams(
                            size=dimension, distance=models.Distance.COSINE
                        )
                    },
                    sparse_vectors_config=(
                        {SPARSE_VECTOR: models.SparseVectorParams(modifier=models.Modifier.IDF)}
                        if sparse
                        else None
                    ),
                    metadata=dict(metadata) if metadata is not None else None,
                ),
            )
        self._ensure_indexes(name)

    def _check_config(self, name: str, dimension: int, sparse: bool) -> None:
        info = _vendor(f"get {name}", lambda: self._client.get_collection(name))
        vectors = info.config.params.vectors
        dense = vectors.get(DENSE_VECTOR) if isinstance(vectors, dict) else None
        if dense is None or dense.size != dimension or dense.distance != models.Distance.COSINE:
            raise StoreError(
                f"collection {name!r} exists with dense vector {dense!r}, "
                f"not size {dimension} cosine"
            )
        sparse_vectors = info.config.params.sparse_vectors or {}
        if sparse and SPARSE_VECTOR not in sparse_vectors:
            raise StoreError(f"collection {name!r} exists without a sparse vector")

    def _ensure_indexes(self, name: str) -> None:
        wanted: dict[str, Any] = {
            key: models.KeywordIndexParams(type=models.KeywordIndexType.KEYWORD, is_tenant=True)
            for key in TENANT_KEY_FIELDS
        }
        for key in self._schema.all_keyword_fields():
            wanted.setdefault(key, models.PayloadSchemaType.KEYWORD)
        kinds = {
            "datetime": models.PayloadSchemaType.DATETIME,
            "float": models.PayloadSchemaType.FLOAT,
            "integer": models.PayloadSchemaType.INTEGER,
        }
        for key, kind in self._schema.range_fields.items():
            wanted[key] = kinds[kind]
        existing = _vendor(f"get {name}", lambda: self._client.get_collection(name)).payload_schema
        with warnings.catch_warnings():
            # Local mode warns that payload indexes have no effect there; the server needs them.
            warnings.filterwarnings("ignore", message="Payload indexes have no effect")
            for key, schema in wanted.items():
                if key not in existing:
                    _vendor(
                        f"index {name}.{key}",
                        lambda k=key, s=schema: self._client.create_payload_index(  # type: ignore[misc]
                            name, field_name=k, field_schema=s, wait=True
                        ),
                    )

    def drop_collection(self, name: str) -> bool:
        """Delete the collection; False if it did not exist."""
        validate_collection_name(name)
        if not self.collection_exists(name):
            return False
        return bool(_vendor(f"drop {name}", lambda: self._client.delete_collection(name)))

    def collection_exists(self, name: str) -> bool:
        """True when the collection (or an alias of that name) exists."""
        return bool(_vendor(f"exists {name}", lambda: self._client.collection_exists(name)))

    def list_collections(self) -> list[str]:
        """Names of every collection, sorted."""
        response = _vendor("list collections", self._client.get_collections)
        return sorted(c.name for c in response.collections)

    def collection_metadata(self, name: str) -> dict[str, Any]:
        """The collection's metadata (empty when none was set)."""
        info = _vendor(f"get {name}", lambda: self._client.get_collection(name))
        return dict(info.config.metadata or {})

    def set_collection_metadata(self, name: str, metadata: Mapping[str, Any]) -> None:
        """Set top-level metadata keys (the server merges them with the existing keys)."""
        _vendor(
            f"update {name}",
            lambda: self._client.update_collection(name, metadata=dict(metadata)),
        )

    def alias_target(self, alias: str) -> str | None:
        """The collection `alias` points at, or None."""
        response = _vendor("list aliases", self._client.get_aliases)
        for description in response.aliases:
            if description.alias_name == alias:
                return description.collection_name
        return None

    def alias_metadata(self, alias: str) -> dict[str, Any] | None:
        """The metadata of the collection `alias` names (the server resolves aliases in every
        collection request), or None when no alias or collection has that name."""
        if not self.collection_exists(alias):
            return None
        try:
            return self.collection_metadata(alias)
        except StoreError:
            if not self.collection_exists(alias):
                return None  # dropped between the two requests (a switch to shared placement)
            raise

    def drop_alias(self, alias: str) -> None:
        """Delete `alias` if it exists."""
        if self.alias_target(alias) is None:
            return
        operation = models.DeleteAliasOperation(delete_alias=models.DeleteAlias(alias_name=alias))
        _vendor(
            f"drop alias {alias}",
            lambda: self._client.update_collection_aliases(change_aliases_operations=[operation]),
        )

    def switch_alias(self, alias: str, collection: str) -> None:
        """Point `alias` at `collection` in one atomic request (delete + create)."""
        operations: list[Any] = []
        if self.alias_target(alias) is not None:
            operations.append(
                models.DeleteAliasOperation(delete_alias=models.DeleteAlias(alias_name=alias))
            )
        operations.append(
            models.CreateAliasOperation(
                create_alias=models.CreateAlias(collection_name=collection, alias_name=alias)
            )
        )
        _vendor(
            f"switch alias {alias}",
            lambda: self._client.update_collection_aliases(change_aliases_operations=operations),
        )

    # --- writes --------------------------------------------------------------------------

    def upsert(
        self,
        name: str,
        points: Sequence[PointRecord],
        wait: bool = True,
        *,
        partition: str | None = None,
    ) -> None:
        """Insert or overwrite points; with `wait` they are searchable on return."""
        if not points:
            return
        structs = [
            models.PointStruct(
                id=p.point_id, vector=engine_vectors(p, _to_sparse), payload=_payload(p, partition)
            )
            for p in points
        ]
        _vendor(f"upsert {name}", lambda: self._client.upsert(name, points=structs, wait=wait))

    def _selection(self, ids: Sequence[str] | None, partition: str | None) -> models.Filter:
        must: list[Any] = []
        if ids is not None:
            must.append(models.HasIdCondition(has_id=list(ids)))
        if partition is not None:
            must.append(
                models.FieldCondition(key=PARTITION, match=models.MatchValue(value=partition))
            )
        if not must:
            raise ValueError("a selection needs ids or a partition")
        return models.Filter(must=must)

    def _delete(self, name: str, selection: models.Filter, wait: bool) -> None:
        selector = models.FilterSelector(filter=selection)
        _vendor(
            f"delete {name}",
            lambda: self._client.delete(name, points_selector=selector, wait=wait),
        )

    def _set_payload(
        self, name: str, selection: models.Filter, values: Mapping[str, Any], wait: bool
    ) -> None:
        _vendor(
            f"set payload {name}",
            lambda: self._client.set_payload(name, dict(values), points=selection, wait=wait),
        )

    def _unset_payload(
        self, name: str, selection: models.Filter, keys: list[str], wait: bool
    ) -> None:
        _vendor(
            f"delete payload {name}",
            lambda: self._client.delete_payload(name, keys, points=selection, wait=wait),
        )

    def optimize(self, name: str) -> bool:
        """No-op: a server optimizes in the background; local mode has no indexes."""
        return False

    # --- reads ---------------------------------------------------------------------------

    def _filter(self, store_filter: StoreFilter) -> models.Filter:
        self._schema.check_filter(store_filter)
        must: list[Any] = [
            models.FieldCondition(
                key=TENANT_ID, match=models.MatchValue(value=store_filter.tenant_id)
            )
        ]
        if store_filter.partition is not None:
            must.append(
                models.FieldCondition(
                    key=PARTITION, match=models.MatchValue(value=store_filter.partition)
                )
            )
        if store_filter.entity_types:
            must.append(
                models.FieldCondition(
                    key=ENTITY_TYPE, match=models.MatchAny(any=list(store_filter.entity_types))
                )
            )
        if store_filter.entity_ids:
            must.append(
                models.FieldCondition(
                    key=ENTITY_ID, match=models.MatchAny(any=list(store_filter.entity_ids))
                )
            )
        for key, values in store_filter.keywords.items():
            if isinstance(values[0], bool):
                # MatchAny takes str or int lists only: booleans become a `should` of values.
                should: list[Any] = [
                    models.FieldCondition(key=key, match=models.MatchValue(value=v))
                    for v in set(values)
                ]
                must.append(models.Filter(should=should))
            elif isinstance(values[0], str):
                texts = [v for v in values if isinstance(v, str)]
                must.append(models.FieldCondition(key=key, match=models.MatchAny(any=texts)))
            else:
                ints = [v for v in values if isinstance(v, int)]
                must.append(models.FieldCondition(key=key, match=models.MatchAny(any=ints)))
        for key, bounds in store_filter.ranges.items():
            if bounds.is_datetime:
                gte, gt, lte, lt = datetime_bounds(bounds)
                must.append(
                    models.FieldCondition(
                        key=key, range=models.DatetimeRange(gte=gte, gt=gt, lte=lte, lt=lt)
                    )
                )
            else:
                fgte, fgt, flte, flt = numeric_bounds(bounds)
                must.append(
                    models.FieldCondition(
                        key=key, range=models.Range(gte=fgte, gt=fgt, lte=flte, lt=flt)
                    )
                )
        return models.Filter(must=must)

    def _sparse_query(self, sparse: SparseVector) -> models.SparseVector:
        return _to_sparse(sparse)

    def _request(
        self,
        query: Any,
        using: str,
        condition: models.Filter,
        limit: int,
        with_vectors: bool,
        *,
        with_payload: bool | list[str] = True,
    ) -> models.QueryRequest:
        return models.QueryRequest(
            query=query,
            using=using,
            filter=condition,
            limit=limit,
            with_payload=with_payload,
            with_vector=[DENSE_VECTOR] if with_vectors else False,
        )

    def _among(self, condition: models.Filter, ids: Sequence[Any]) -> models.Filter:
        return models.Filter(must=[condition, models.HasIdCondition(has_id=list(ids))])

    def _run(self, name: str, requests: Sequence[models.QueryRequest]) -> list[Sequence[Any]]:
        # A search of one branch is a batch of one: one request type, one code path.
        label = f"{'query' if len(requests) == 1 else 'query_batch'} {name}"
        responses = _vendor(
            label, lambda: self._client.query_batch_points(name, requests=list(requests))
        )
        return [list(response.points) for response in responses]

    def _fetch(
        self, name: str, ids: Sequence[str], vectors: bool | list[str], keys: list[str] | None
    ) -> Sequence[Any]:
        return _vendor(
            f"retrieve {name}",
            lambda: self._client.retrieve(
                name,
                ids=list(ids),
                with_payload=True if keys is None else keys,
                with_vectors=vectors,
            ),
        )

    def _scroll_page(
        self,
        name: str,
        condition: models.Filter,
        *,
        limit: int,
        offset: Any,
        keys: list[str] | None,
        with_vectors: bool,
    ) -> tuple[Sequence[Any], Any]:
        return _vendor(
            f"scroll {name}",
            lambda: self._client.scroll(
                name,
                scroll_filter=condition,
                limit=limit,
                offset=offset,
                with_payload=True if keys is None else keys,
                with_vectors=with_vectors,
            ),
        )

    def count(self, name: str, filter: StoreFilter) -> int:
        """Exact number of points matching the filter."""
        condition = self._filter(filter)
        result = _vendor(
            f"count {name}",
            lambda: self._client.count(name, count_filter=condition, exact=True),
        )
        return int(result.count)

    def close(self) -> None:
        """Close the client if this store created it (idempotent)."""
        if self._closed:
            return
        self._closed = True
        if self._owns_client:
            _vendor("close", self._client.close)


_CATALOG_NAMESPACE = uuid.UUID("0b7f8c1e-2f4a-4f7e-9a51-3d2c6e8b9a10")


class CatalogEntries:
    """Small JSON documents keyed by (kind, key) in the `rag_catalog` collection of a Qdrant
    server: what the server keeps about shared placement (docs/decisions/tiered-tenancy.md):
    `partition` (logical collection -> pool), `manifest` and `calibration` (of a shared index
    version) and `active` (a shared tenant's active version).

    One point per entry, its id a uuid5 of (kind, key), so a read or write is one request by id
    and entries of different keys never contend (collection metadata would be one document
    rewritten by every tenant). Each point carries `kind`, `key`, `tenant` (keyword-indexed) and
    the JSON `value`; the vector is a 1-dimensional placeholder the engine requires.
    """

    def __init__(self, store: QdrantRemoteStore) -> None:
        """Keep the catalog in `store`'s server (the collection is created on first use)."""
        self._client = store.client
        self._ready = False
        self._lock = threading.Lock()

    @staticmethod
    def _id(kind: str, key: str) -> str:
        return str(uuid.uuid5(_CATALOG_NAMESPACE, json.dumps([kind, key])))

    def _present(self) -> bool:
        """True once the catalog collection exists (reads never create it: a deployment
        without shared versions, or a reader without the right to create, has none)."""
        if not self._ready:
            name = CATALOG_COLLECTION
            self._ready = _vendor(f"exists {name}", lambda: self._client.collection_exists(name))
        return self._ready

    def _ensure(self) -> None:
        with self._lock:
            if self._present():
                return
            name = CATALOG_COLLECTION
            if not _vendor(f"exists {name}", lambda: self._client.collection_exists(name)):
                _vendor(
                    f"create {name}",
                    lambda: self._client.create_collection(
                        name,
                        vectors_config={
                            "_": models.VectorParams(size=1, distance=models.Distance.DOT)
                        },
                    ),
                )
                with warnings.catch_warnings():
                    warnings.filterwarnings("ignore", message="Payload indexes have no effect")
                    for key in ("kind", "key", "tenant"):
                        _vendor(
                            f"index {name}.{key}",
                            lambda k=key: self._client.create_payload_index(  # type: ignore[misc]
                                name,
                                field_name=k,
                                field_schema=models.PayloadSchemaType.KEYWORD,
                                wait=True,
                            ),
                        )
            self._ready = True

    def get(self, kind: str, key: str) -> Any:
        """The entry's value, or None."""
        if not self._present():
            return None
        records = _vendor(
            f"catalog get {kind}:{key}",
            lambda: self._client.retrieve(
                CATALOG_COLLECTION, [self._id(kind, key)], with_payload=True
            ),
        )
        if not records:
            return None
        try:
            return json.loads((records[0].payload or {})["value"])
        except (KeyError, TypeError, ValueError) as exc:
            raise StoreError(f"corrupt catalog entry {kind}:{key}: {exc}") from exc

    def put(self, kind: str, key: str, value: Any, *, tenant: str) -> None:
        """Create or replace the entry (waits until it is readable)."""
        self._ensure()
        point = models.PointStruct(
            id=self._id(kind, key),
            vector={"_": [1.0]},
            payload={"kind": kind, "key": key, "tenant": tenant, "value": json.dumps(value)},
        )
        _vendor(
            f"catalog put {kind}:{key}",
            lambda: self._client.upsert(CATALOG_COLLECTION, points=[point], wait=True),
        )

    def delete(self, *, key: str, kind: str | None = None) -> None:
        """Delete the entry of (kind, key), or with no kind every entry of `key`."""
        if not self._present():
            return
        must: list[Any] = [models.FieldCondition(key="key", match=models.MatchValue(value=key))]
        if kind is not None:
            must.append(models.FieldCondition(key="kind", match=models.MatchValue(value=kind)))
        selector = models.FilterSelector(filter=models.Filter(must=must))
        _vendor(
            f"catalog delete {key}",
            lambda: self._client.delete(CATALOG_COLLECTION, points_selector=selector, wait=True),
        )

    def scan(self, kind: str, tenant: str | None = None) -> dict[str, Any]:
        """key -> value of every entry of `kind` (of one tenant, when given)."""
        if not self._present():
            return {}
        must: list[Any] = [models.FieldCondition(key="kind", match=models.MatchValue(value=kind))]
        if tenant is not None:
            must.append(models.FieldCondition(key="tenant", match=models.MatchValue(value=tenant)))
        condition = models.Filter(must=must)
        found: dict[str, Any] = {}
        offset: Any = None
        while True:
            page, offset = _vendor(
                f"catalog scan {kind}",
                lambda o=offset: self._client.scroll(  # type: ignore[misc]
                    CATALOG_COLLECTION,
                    scroll_filter=condition,
                    limit=1000,
                    offset=o,
                    with_payload=True,
                ),
            )
            for record in page:
                payload = record.payload or {}
                found[str(payload.get("key"))] = json.loads(str(payload.get("value")))
            if offset is None:
                return found


class ServerPlacementCatalog:
    """`ragcore.store.tiered.PlacementCatalog` on a Qdrant server (`CatalogEntries`).

    Several processes share it, so lookups are cached briefly: a partition found is kept for
    `positive_ttl_s` (it changes only when dropped, after the workers stopped writing it), a
    name found to be no partition for `negative_ttl_s` (the worker creating a partition sees
    it at once; others within that time).
    """

    def __init__(
        self,
        entries: CatalogEntries,
        *,
        positive_ttl_s: float = 60.0,
        negative_ttl_s: float = 2.0,
    ) -> None:
        """Look partitions up in `entries`."""
        self._entries = entries
        self._ttl = (positive_ttl_s, negative_ttl_s)
        self._cache: dict[str, tuple[float, str | None]] = {}
        self._lock = threading.Lock()

    def pool_of(self, name: str) -> str | None:
        """The pool of a partition, or None."""
        now = time.monotonic()
        with self._lock:
            cached = self._cache.get(name)
        if cached is not None:
            ttl = self._ttl[0] if cached[1] is not None else self._ttl[1]
            if now - cached[0] < ttl:
                return cached[1]
        value = self._entries.get("partition", name)
        pool = value.get("pool") if isinstance(value, dict) else None
        if value is not None and not isinstance(pool, str):
            raise StoreError(f"corrupt partition entry {name!r}: {value!r}")
        with self._lock:
            self._cache[name] = (now, pool)
        return pool

    def add(self, name: str, pool: str) -> None:
        """Record a partition."""
        parsed = parse_collection_name(name)
        tenant = parsed[0] if parsed is not None else ""
        self._entries.put("partition", name, {"pool": pool}, tenant=tenant)
        with self._lock:
            self._cache[name] = (time.monotonic(), pool)

    def remove(self, name: str) -> None:
        """Forget a partition, with its manifest and calibration entries."""
        self._entries.delete(key=name)
        with self._lock:
            self._cache[name] = (time.monotonic(), None)

    def partitions(self) -> dict[str, str]:
        """Every partition: logical name -> pool."""
        return {k: str(v["pool"]) for k, v in self._entries.scan("partition").items()}
