"""The read path both Qdrant adapters share (qdrant-edge shards and a Qdrant server/client).

The engines differ in their request types and calls, not in what a search, a fetch by id or a
scroll means: `QdrantEngineReads` holds that meaning once (argument checks, the dense and sparse
branches of a hybrid search in one round trip, the tenant check on every hit and point, the
order of fetched ids, the scroll loop and its payload selection) and asks the adapter only for
the engine's primitives.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Iterator, Sequence
from typing import Any

import numpy as np

from ragcore.store.base import (
    DENSE_VECTOR,
    SPARSE_VECTOR,
    TENANT_ID,
    ChunkRef,
    DenseVector,
    HybridResult,
    ScoredHit,
    SparseVector,
    StoredPoint,
    StoreFilter,
    check_tenant,
    chunk_manifest,
    payload_selection,
    split_engine_vectors,
)
from ragcore.store.ids import validate_tenant


def dense_list(vector: DenseVector) -> list[float]:
    """A dense vector as the engines take it: a flat list of float32 values."""
    return np.asarray(vector, dtype=np.float32).reshape(-1).tolist()


class QdrantEngineReads(ABC):
    """Searches, fetches and scrolls of a `VectorStore` over a Qdrant engine; the adapter
    supplies the engine's requests and calls."""

    # --- the engine's primitives -----------------------------------------------------------

    @abstractmethod
    def _filter(self, store_filter: StoreFilter) -> Any:
        """The engine's filter for a `StoreFilter` (always holding the tenant condition)."""

    @abstractmethod
    def _sparse_query(self, sparse: SparseVector) -> Any:
        """The engine's sparse query vector."""

    @abstractmethod
    def _request(
        self, query: Any, using: str, condition: Any, limit: int, with_vectors: bool
    ) -> Any:
        """One nearest-neighbour request on the named vector `using`."""

    @abstractmethod
    def _run(self, name: str, requests: Sequence[Any]) -> list[Sequence[Any]]:
        """The scored points of each request, run in one round trip."""

    @abstractmethod
    def _fetch(self, name: str, ids: Sequence[str], with_vectors: bool) -> Sequence[Any]:
        """The records among `ids` (any order; missing ids absent)."""

    @abstractmethod
    def _scroll_page(
        self,
        name: str,
        condition: Any,
        *,
        limit: int,
        offset: Any,
        keys: list[str] | None,
        with_vectors: bool,
    ) -> tuple[Sequence[Any], Any]:
        """One page of a scroll ordered by point id and the next offset (None at the end);
        `keys` selects payload keys (None: the whole payload)."""

    # --- the shared meaning ----------------------------------------------------------------

    def _query(
        self, query: Any, using: str, store_filter: StoreFilter, limit: int, with_vectors: bool
    ) -> Any:
        if limit <= 0:
            raise ValueError(f"limit must be > 0, got {limit}")
        return self._request(query, using, self._filter(store_filter), limit, with_vectors)

    @staticmethod
    def _hits(points: Sequence[Any], tenant_id: str) -> list[ScoredHit]:
        hits = [
            ScoredHit(
                point_id=str(p.id),
                score=float(p.score),
                payload=p.payload or {},
                dense=split_engine_vectors(p.vector)[0],
            )
            for p in points
        ]
        check_tenant(hits, tenant_id)  # a hit of another tenant is an engine error, never data
        return hits

    @staticmethod
    def _stored(record: Any) -> StoredPoint:
        dense, sparse = split_engine_vectors(record.vector)
        return StoredPoint(str(record.id), record.payload or {}, dense, sparse)

    def search_dense(
        self,
        name: str,
        vector: DenseVector,
        filter: StoreFilter,
        *,
        limit: int,
        with_vectors: bool = False,
    ) -> list[ScoredHit]:
        """Nearest points by cosine similarity, best first."""
        request = self._query(dense_list(vector), DENSE_VECTOR, filter, limit, with_vectors)
        return self._hits(self._run(name, [request])[0], filter.tenant_id)

    def search_sparse(
        self, name: str, sparse: SparseVector, filter: StoreFilter, *, limit: int
    ) -> list[ScoredHit]:
        """Best points by sparse dot product with IDF, best first (empty query: no hits)."""
        if not len(sparse):
            return []
        request = self._query(self._sparse_query(sparse), SPARSE_VECTOR, filter, limit, False)
        return self._hits(self._run(name, [request])[0], filter.tenant_id)

    def search_hybrid(
        self,
        name: str,
        dense: DenseVector,
        sparse: SparseVector,
        filter: StoreFilter,
        *,
        limit: int,
        prefetch_limit: int,
    ) -> HybridResult:
        """Dense and sparse branches in one round trip (an empty sparse query: dense only)."""
        if prefetch_limit < limit:
            raise ValueError(f"prefetch_limit ({prefetch_limit}) must be >= limit ({limit})")
        requests = [self._query(dense_list(dense), DENSE_VECTOR, filter, prefetch_limit, False)]
        if len(sparse):
            sparse_query = self._sparse_query(sparse)
            requests.append(self._query(sparse_query, SPARSE_VECTOR, filter, prefetch_limit, False))
        results = self._run(name, requests)
        dense_hits = self._hits(results[0], filter.tenant_id)
        sparse_hits = self._hits(results[1], filter.tenant_id) if len(results) > 1 else []
        return HybridResult(tuple(dense_hits), tuple(sparse_hits), limit)

    def retrieve(
        self, name: str, ids: Sequence[str], tenant_id: str, with_vectors: bool = False
    ) -> list[StoredPoint]:
        """The tenant's points among `ids`, in the order of `ids` (missing ids and other
        tenants' points are omitted)."""
        validate_tenant(tenant_id)
        if not ids:
            return []
        by_id = {str(r.id): r for r in self._fetch(name, ids, with_vectors)}
        found = [self._stored(by_id[i]) for i in dict.fromkeys(ids) if i in by_id]
        return [p for p in found if p.payload.get(TENANT_ID) == tenant_id]

    def scroll(
        self,
        name: str,
        filter: StoreFilter,
        batch: int = 256,
        with_vectors: bool = False,
        *,
        fields: Sequence[str] | None = None,
    ) -> Iterator[StoredPoint]:
        """Every matching point, `batch` at a time, ordered by point id; `fields` selects the
        payload keys (None: the whole payload; `tenant_id` is always included)."""
        if batch <= 0:
            raise ValueError(f"batch must be > 0, got {batch}")
        keys = payload_selection(fields)
        condition = self._filter(filter)
        offset: Any = None
        while True:
            records, offset = self._scroll_page(
                name, condition, limit=batch, offset=offset, keys=keys, with_vectors=with_vectors
            )
            points = [self._stored(r) for r in records]
            check_tenant(points, filter.tenant_id)
            yield from points
            if offset is None:
                return

    def entity_chunks(self, name: str, tenant_id: str, entity_id: str) -> dict[str, ChunkRef]:
        """chunk_id -> ChunkRef for every point of the entity (StoreError on duplicate chunks)."""
        return chunk_manifest(
            self.scroll(name, StoreFilter(tenant_id=tenant_id, entity_ids=(entity_id,)))
        )
