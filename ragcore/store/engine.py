"""What both Qdrant adapters share (qdrant-edge shards and a Qdrant server/client).

The engines differ in their request types and calls, not in what a search, a fetch by id, a
scroll or a scoped delete means: `QdrantEngine` holds that meaning once (argument checks, the
dense and sparse branches of a hybrid search in one round trip, the tenant check on every hit
and point, the order of fetched ids, the scroll loop and its payload selection, and the
partition scope of writes to a shared collection) and asks the adapter only for the engine's
primitives.

Partitions (docs/decisions/tiered-tenancy.md): `ragcore.store.tiered.TieredStore` places small
tenants' index versions in one shared collection, each version a partition named by the
`PARTITION` payload key. It passes `partition=` to the writes and fetches by id below and
`StoreFilter.partition` to everything filtered, so the engine itself confines every operation
to the partition; the key is never returned in a payload.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Callable, Iterator, Mapping, Sequence
from typing import Any

import numpy as np

from ragcore.store.base import (
    DENSE_VECTOR,
    PARTITION,
    SPARSE_VECTOR,
    TENANT_ID,
    ChunkRef,
    DenseVector,
    HybridResult,
    PointRecord,
    ScoredHit,
    SparseVector,
    StoredPoint,
    StoreFilter,
    check_payload_update,
    check_tenant,
    chunk_manifest,
    payload_selection,
    split_engine_vectors,
)
from ragcore.store.ids import validate_tenant


def dense_list(vector: DenseVector) -> list[float]:
    """A dense vector as the engines take it: a flat list of float32 values."""
    return np.asarray(vector, dtype=np.float32).reshape(-1).tolist()


class QdrantEngine(ABC):
    """Searches, fetches, scrolls and scoped writes of a `VectorStore` over a Qdrant engine; the
    adapter supplies the engine's requests and calls."""

    # --- the engine's primitives -----------------------------------------------------------

    @abstractmethod
    def _filter(self, store_filter: StoreFilter) -> Any:
        """The engine's filter for a `StoreFilter` (always holding the tenant condition)."""

    @abstractmethod
    def _sparse_query(self, sparse: SparseVector) -> Any:
        """The engine's sparse query vector."""

    @abstractmethod
    def _request(
        self,
        query: Any,
        using: str,
        condition: Any,
        limit: int,
        with_vectors: bool,
        *,
        with_payload: bool | list[str] = True,
    ) -> Any:
        """One nearest-neighbour request on the named vector `using`; `with_payload` a list:
        only those payload keys."""

    @abstractmethod
    def _among(self, condition: Any, ids: Sequence[Any]) -> Any:
        """The engine filter `condition` narrowed to the points `ids` (ids as the engine
        returns them in its hits)."""

    @abstractmethod
    def _run(self, name: str, requests: Sequence[Any]) -> list[Sequence[Any]]:
        """The scored points of each request, run in one round trip."""

    @abstractmethod
    def _fetch(
        self, name: str, ids: Sequence[str], vectors: bool | list[str], keys: list[str] | None
    ) -> Sequence[Any]:
        """The records among `ids` (any order; missing ids absent), with the payload keys
        `keys` (None: the whole payload) and the named `vectors` (True: all, False: none)."""

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

    @abstractmethod
    def _selection(self, ids: Sequence[str] | None, partition: str | None) -> Any:
        """The engine's filter `id in ids` and/or `PARTITION == partition` (one is given)."""

    @abstractmethod
    def _delete(self, name: str, selection: Any, wait: bool) -> None:
        """Delete the points matching this engine filter."""

    @abstractmethod
    def _set_payload(
        self, name: str, selection: Any, values: Mapping[str, Any], wait: bool
    ) -> None:
        """Set payload keys of the points matching this engine filter."""

    @abstractmethod
    def _unset_payload(self, name: str, selection: Any, keys: list[str], wait: bool) -> None:
        """Remove payload keys of the points matching this engine filter."""

    # --- the shared meaning ----------------------------------------------------------------

    def delete_partition(self, name: str, partition: str) -> None:
        """Delete every point of one partition of a shared collection, whatever its tenant."""
        self._delete(name, self._selection(None, partition), True)

    def delete_points(
        self, name: str, ids: Sequence[str], wait: bool = True, *, partition: str | None = None
    ) -> None:
        """Delete points by id (only those of `partition`, when given); absent ids are
        ignored."""
        if ids:
            self._delete(name, self._selection(ids, partition), wait)

    def update_payload(
        self,
        name: str,
        ids: Sequence[str],
        values: Mapping[str, Any],
        unset: Sequence[str] = (),
        wait: bool = True,
        *,
        partition: str | None = None,
    ) -> None:
        """Set and remove payload keys of the given points (only those of `partition`, when
        given; absent ids are ignored); vectors untouched."""
        check_payload_update(values, unset)
        if not ids:
            return
        selection = self._selection(ids, partition)
        if values:
            self._set_payload(name, selection, values, wait)
        if unset:
            self._unset_payload(name, selection, list(unset), wait)

    def delete_by_entity(
        self, name: str, tenant_id: str, entity_id: str, *, partition: str | None = None
    ) -> None:
        """Delete every point of one entity of one tenant (in `partition`, when given)."""
        scope = StoreFilter(tenant_id=tenant_id, entity_ids=(entity_id,), partition=partition)
        self._delete(name, self._filter(scope), True)

    def _query(
        self,
        query: Any,
        using: str,
        store_filter: StoreFilter,
        limit: int,
        with_vectors: bool,
        *,
        fields: Sequence[str] | None,
    ) -> Any:
        if limit <= 0:
            raise ValueError(f"limit must be > 0, got {limit}")
        return self._request(
            query,
            using,
            self._filter(store_filter),
            limit,
            with_vectors,
            with_payload=_keys(fields),
        )

    @staticmethod
    def _hits(
        points: Sequence[Any], tenant_id: str, known: Mapping[str, ScoredHit] | None = None
    ) -> list[ScoredHit]:
        """The engine's points as hits; a point among `known` (hits of the same round trip)
        shares that hit's payload: one conversion from the engine, and a hybrid result's
        pickle (the store host's reply) carries a payload both branches found once."""
        hits: list[ScoredHit] = []
        for p in points:
            point_id = str(p.id)
            seen = known.get(point_id) if known else None
            payload = seen.payload if seen is not None else _visible(p.payload)
            hits.append(
                ScoredHit(point_id, float(p.score), payload, split_engine_vectors(p.vector)[0])
            )
        check_tenant(hits, tenant_id)  # a hit of another tenant is an engine error, never data
        return hits

    @staticmethod
    def _stored(record: Any) -> StoredPoint:
        dense, sparse = split_engine_vectors(record.vector)
        return StoredPoint(str(record.id), _visible(record.payload), dense, sparse)

    def search_dense(
        self,
        name: str,
        vector: DenseVector,
        filter: StoreFilter,
        *,
        limit: int,
        with_vectors: bool = False,
        fields: Sequence[str] | None = None,
    ) -> list[ScoredHit]:
        """Nearest points by cosine similarity, best first (`fields`: the payload keys)."""
        request = self._query(
            dense_list(vector), DENSE_VECTOR, filter, limit, with_vectors, fields=fields
        )
        return self._hits(self._run(name, [request])[0], filter.tenant_id)

    def search_sparse(
        self,
        name: str,
        sparse: SparseVector,
        filter: StoreFilter,
        *,
        limit: int,
        fields: Sequence[str] | None = None,
    ) -> list[ScoredHit]:
        """Best points by sparse dot product with IDF, best first (empty query: no hits;
        `fields`: the payload keys)."""
        if not len(sparse):
            return []
        request = self._query(
            self._sparse_query(sparse), SPARSE_VECTOR, filter, limit, False, fields=fields
        )
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
        sparse_dense_scores: bool = False,
        fields: Sequence[str] | None = None,
    ) -> HybridResult:
        """Dense and sparse branches in one round trip (an empty sparse query: dense only);
        `sparse_dense_scores`: the sparse hits carry their cosine with `dense` (see
        `_dense_scores`); `fields`: the payload keys of the hits."""
        if prefetch_limit < limit:
            raise ValueError(f"prefetch_limit ({prefetch_limit}) must be >= limit ({limit})")
        if prefetch_limit <= 0:
            raise ValueError(f"limit must be > 0, got {prefetch_limit}")
        vector = dense_list(dense)
        condition = self._filter(filter)
        keys = _keys(fields)
        requests = [
            self._request(vector, DENSE_VECTOR, condition, prefetch_limit, False, with_payload=keys)
        ]
        if len(sparse):
            query = self._sparse_query(sparse)
            requests.append(
                self._request(
                    query, SPARSE_VECTOR, condition, prefetch_limit, False, with_payload=keys
                )
            )
        results = self._run(name, requests)
        dense_hits = self._hits(results[0], filter.tenant_id)
        sparse_hits = (
            self._hits(results[1], filter.tenant_id, {h.point_id: h for h in dense_hits})
            if len(results) > 1
            else []
        )
        if sparse_dense_scores and sparse_hits:
            # the sparse hits' cosine: the dense branch's score of the points it found too,
            # one dense query restricted to the others (see `_dense_scores`)
            scores = {h.point_id: h.score for h in dense_hits}
            others = [
                p.id  # the engine's own id: it parses it faster than the string
                for p, h in zip(results[1], sparse_hits, strict=True)
                if h.point_id not in scores
            ]
            if others:
                scores.update(self._dense_scores(name, vector, condition, others))
            sparse_hits = [
                ScoredHit(h.point_id, h.score, h.payload, h.dense, scores.get(h.point_id))
                for h in sparse_hits
            ]
        return HybridResult(tuple(dense_hits), tuple(sparse_hits), limit)

    def _dense_scores(
        self, name: str, vector: list[float], condition: Any, ids: Sequence[Any]
    ) -> dict[str, float]:
        """The cosine of `vector` with each of the points `ids` that `condition` lets through,
        by one dense query restricted to them, without payload or vectors: only ids and scores
        cross into Python (reading each point's 384 floats into an array cost more than the
        query). A point deleted meanwhile is absent."""
        request = self._request(
            vector, DENSE_VECTOR, self._among(condition, ids), len(ids), False, with_payload=False
        )
        return {str(p.id): float(p.score) for p in self._run(name, [request])[0]}

    def retrieve(
        self,
        name: str,
        ids: Sequence[str],
        tenant_id: str,
        with_vectors: bool = False,
        *,
        partition: str | None = None,
        fields: Sequence[str] | None = None,
        sparse: bool = True,
    ) -> list[StoredPoint]:
        """The tenant's points among `ids`, in the order of `ids` (missing ids, other tenants'
        points and, when `partition` is given, other partitions' points are omitted); `fields`
        selects the payload keys (None: all; the tenant and partition keys are always read);
        `sparse=False` reads only the dense vector of each point."""
        validate_tenant(tenant_id)
        if not ids:
            return []
        keys = payload_selection(fields)
        if keys is not None and partition is not None:
            keys.append(PARTITION)
        vectors: bool | list[str] = with_vectors and (True if sparse else [DENSE_VECTOR])
        by_id = {str(r.id): r for r in self._fetch(name, ids, vectors, keys)}
        found = [by_id[i] for i in dict.fromkeys(ids) if i in by_id]
        return [
            self._stored(r)
            for r in found
            if (r.payload or {}).get(TENANT_ID) == tenant_id
            and (partition is None or (r.payload or {}).get(PARTITION) == partition)
        ]

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

    def entity_chunks(
        self, name: str, tenant_id: str, entity_id: str, *, partition: str | None = None
    ) -> dict[str, ChunkRef]:
        """chunk_id -> ChunkRef for every point of the entity (StoreError on duplicate chunks)."""
        scope = StoreFilter(tenant_id=tenant_id, entity_ids=(entity_id,), partition=partition)
        return chunk_manifest(self.scroll(name, scope))


def engine_vectors(point: PointRecord, sparse: Callable[[SparseVector], Any]) -> dict[str, Any]:
    """The named vectors a point is written with: the dense row as a list (it converts faster
    than an ndarray into either engine's point, measured) and, when the point has a non-empty
    sparse vector, that vector through the engine's `sparse` constructor."""
    vectors: dict[str, Any] = {DENSE_VECTOR: point.dense_array().tolist()}
    if point.sparse is not None and len(point.sparse):
        vectors[SPARSE_VECTOR] = sparse(point.sparse)
    return vectors


def engine_payload(point: PointRecord, partition: str | None) -> dict[str, Any]:
    """The payload a point is written with: the caller's, plus the partition key in a shared
    collection (set here, so no caller's value for it survives)."""
    payload = dict(point.payload)
    if partition is not None:
        payload[PARTITION] = partition
    else:
        payload.pop(PARTITION, None)
    return payload


def _keys(fields: Sequence[str] | None) -> bool | list[str]:
    """A search's payload selection for the engine: True (all) or the keys (`payload_selection`:
    the tenant key always among them, so every hit's tenant is checked)."""
    keys = payload_selection(fields)
    return True if keys is None else keys


def _visible(payload: Mapping[str, Any] | None) -> Mapping[str, Any]:
    """A payload as callers see it: without the partition key a shared collection adds."""
    if not payload:
        return {}
    if PARTITION not in payload:
        return payload
    return {k: v for k, v in payload.items() if k != PARTITION}
