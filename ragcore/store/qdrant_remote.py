"""`VectorStore` on qdrant-client: a Qdrant server in production, local mode in tests.

`QdrantRemoteStore.connect(url, api_key)` talks to a server (gRPC preferred);
`QdrantRemoteStore.local(path)` uses qdrant-client's local mode (`:memory:` or a directory),
which implements the server's API semantics by brute force: the contract tests run on it, but it
is far too slow to serve (docs/decisions/vector-store-qdrant-edge-and-server.md).

Beyond the port, this adapter offers what the server-mode index registry needs: collection
metadata (where index manifests live), aliases and the list of collections.

Errors: connection refused, timeouts, gRPC UNAVAILABLE/DEADLINE_EXCEEDED/RESOURCE_EXHAUSTED and
HTTP 429/502/503/504 become StoreUnavailableError (with Retry-After when the server sent one);
everything else becomes StoreError with the vendor's message.
"""

from __future__ import annotations

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
from ragcore.store.engine import QdrantEngine
from ragcore.store.ids import validate_collection_name

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

    def upsert(self, name: str, points: Sequence[PointRecord], wait: bool = True) -> None:
        """Insert or overwrite points; with `wait` they are searchable on return."""
        if not points:
            return
        structs = []
        for p in points:
            vector: dict[str, Any] = {DENSE_VECTOR: p.dense_array().tolist()}
            if p.sparse is not None and len(p.sparse):
                vector[SPARSE_VECTOR] = _to_sparse(p.sparse)
            structs.append(
                models.PointStruct(id=p.point_id, vector=vector, payload=dict(p.payload))
            )
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
        self, query: Any, using: str, condition: models.Filter, limit: int, with_vectors: bool
    ) -> models.QueryRequest:
        return models.QueryRequest(
            query=query,
            using=using,
            filter=condition,
            limit=limit,
            with_payload=True,
            with_vector=[DENSE_VECTOR] if with_vectors else False,
        )

    def _run(self, name: str, requests: Sequence[models.QueryRequest]) -> list[Sequence[Any]]:
        # A search of one branch is a batch of one: one request type, one code path.
        label = f"{'query' if len(requests) == 1 else 'query_batch'} {name}"
        responses = _vendor(
            label, lambda: self._client.query_batch_points(name, requests=list(requests))
        )
        return [list(response.points) for response in responses]

    def _fetch(self, name: str, ids: Sequence[str], with_vectors: bool) -> Sequence[Any]:
        return _vendor(
            f"retrieve {name}",
            lambda: self._client.retrieve(
                name, ids=list(ids), with_payload=True, with_vectors=with_vectors
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
