"""`TieredStore`: index versions in their own collection or as partitions of a shared one.

docs/decisions/tiered-tenancy.md. Every caller names an index version by its logical
collection, `rag__<tenant>__v<N>` (`ragcore.store.ids.collection_name`), whatever its
placement:

- **dedicated**: the logical collection is an engine collection of that name (as before);
- **shared**: it is a *partition* of a pool collection, `rag_pool__d<dimension>`, one per vector
  dimension. Every point carries the `PARTITION` payload key (the logical name), indexed as the
  engine's tenant key (`is_tenant`), and every operation this store passes down is confined to
  the partition by the engine: filters get `partition=`, writes and fetches by id are scoped to
  it (`QdrantEngine.delete_points(..., partition=)` and friends). Callers never see or set the
  key, so a partition behaves exactly like a dedicated collection, tenant checks included.

The placement of each logical collection is recorded in a `PlacementCatalog`; only dedicated
collections exist as engine collections of their own name. Pool names are reserved: this store
refuses them as logical names, so no caller can address a pool as a whole.
"""

from __future__ import annotations

import dataclasses
import json
import os
import re
import threading
from collections.abc import Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any, Protocol

from ragcore.errors import StoreError
from ragcore.store.base import (
    PLACEMENTS,
    ChunkRef,
    DenseVector,
    HybridResult,
    PayloadSchema,
    Placement,
    PointRecord,
    ScoredHit,
    SparseVector,
    StoredPoint,
    StoreFilter,
    VectorStore,
)
from ragcore.store.ids import (
    CATALOG_COLLECTION,
    parse_collection_name,
    point_id,
    validate_collection_name,
)
from ragcore.store.registry import atomic_write

#: Prefix of the shared collections; reserved (no logical collection may use it).
POOL_PREFIX = "rag_pool__"
_POOL_RE = re.compile(r"^rag_pool__d(?P<dimension>[1-9][0-9]*)(?P<dense_only>_dense)?$")


def pool_name(dimension: int, sparse: bool = True) -> str:
    """The shared collection of every partition with this vector layout."""
    if dimension <= 0:
        raise ValueError(f"dimension must be > 0, got {dimension}")
    return f"{POOL_PREFIX}d{dimension}" + ("" if sparse else "_dense")


def is_pool(name: str) -> bool:
    """True for a shared collection's name."""
    return _POOL_RE.fullmatch(name) is not None


class PartitionedEngine(VectorStore, Protocol):
    """What `TieredStore` needs of an engine adapter (`EdgeStore`, `QdrantRemoteStore`): the
    port, with writes and fetches by id scoped to a partition, and a few catalog reads."""

    @property
    def schema(self) -> PayloadSchema:
        """Which payload fields are indexed."""
        ...

    def list_collections(self) -> list[str]:
        """Every engine collection."""
        ...

    def upsert(
        self,
        name: str,
        points: Sequence[PointRecord],
        wait: bool = True,
        *,
        partition: str | None = None,
    ) -> None:
        """Insert or overwrite points (with the partition key)."""
        ...

    def delete_points(
        self, name: str, ids: Sequence[str], wait: bool = True, *, partition: str | None = None
    ) -> None:
        """Delete points by id (within `partition`)."""
        ...

    def delete_partition(self, name: str, partition: str) -> None:
        """Delete every point of a partition."""
        ...

    def delete_by_entity(
        self, name: str, tenant_id: str, entity_id: str, *, partition: str | None = None
    ) -> None:
        """Delete an entity's points (within `partition`)."""
        ...

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
        """Update payloads by id (within `partition`)."""
        ...

    def entity_chunks(
        self, name: str, tenant_id: str, entity_id: str, *, partition: str | None = None
    ) -> dict[str, ChunkRef]:
        """An entity's chunk manifest (within `partition`)."""
        ...

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
        """Points by id (within `partition`), `fields` selecting the payload, `sparse=False`
        only the dense vector."""
        ...


class PlacementCatalog(Protocol):
    """Which logical collections are partitions, and of which pool."""

    def pool_of(self, name: str) -> str | None:
        """The pool holding the logical collection, or None when it is not a partition."""
        ...

    def add(self, name: str, pool: str) -> None:
        """Record a new partition (durably, before any point is written to it)."""
        ...

    def remove(self, name: str) -> None:
        """Forget a partition (after its points are deleted)."""
        ...

    def partitions(self) -> dict[str, str]:
        """Every partition: logical name -> pool."""
        ...


class FilePlacementCatalog:
    """The catalog of an embedded data dir: `<data_dir>/partitions/<logical>.json`.

    Read once and then kept in memory: an embedded data dir has one opening process (the shard
    lock, `ragcore.store.edge`), and every change goes through this object.
    """

    def __init__(self, data_dir: str | Path) -> None:
        """Use (and create on first write) `<data_dir>/partitions/`."""
        self._dir = Path(data_dir).resolve() / "partitions"
        self._lock = threading.Lock()
        self._members: dict[str, str] | None = None

    def _load(self) -> dict[str, str]:
        if self._members is not None:
            return self._members
        members: dict[str, str] = {}
        if self._dir.is_dir():
            for path in self._dir.glob("*.json"):
                try:
                    entry = json.loads(path.read_text(encoding="utf-8"))
                except (OSError, ValueError) as exc:
                    raise StoreError(f"unreadable partition entry {path}: {exc}") from exc
                pool = entry.get("pool") if isinstance(entry, dict) else None
                if not isinstance(pool, str) or not is_pool(pool):
                    raise StoreError(f"partition entry {path} names no pool: {entry!r}")
                members[path.stem] = pool
        self._members = members
        return members

    def pool_of(self, name: str) -> str | None:
        """The pool of a partition, or None."""
        with self._lock:
            return self._load().get(name)

    def add(self, name: str, pool: str) -> None:
        """Record `name` as a partition of `pool` (atomic, durable file)."""
        with self._lock:
            members = self._load()
            self._dir.mkdir(parents=True, exist_ok=True)
            atomic_write(
                self._dir / f"{validate_collection_name(name)}.json", json.dumps({"pool": pool})
            )
            members[name] = pool

    def remove(self, name: str) -> None:
        """Forget a partition (no error when it is not one)."""
        with self._lock:
            members = self._load()
            try:
                os.unlink(self._dir / f"{validate_collection_name(name)}.json")
            except FileNotFoundError:
                pass
            except OSError as exc:
                raise StoreError(f"cannot remove partition entry {name!r}: {exc}") from exc
            members.pop(name, None)

    def partitions(self) -> dict[str, str]:
        """Every partition: logical name -> pool."""
        with self._lock:
            return dict(self._load())


def _check_partition_points(partition: str, points: Sequence[PointRecord]) -> None:
    """StoreError unless every point belongs in the partition: a partition holds one tenant's
    version, and its point ids are derived from (tenant, chunk, version), so no write to one
    partition can overwrite a point of another in the same pool."""
    parsed = parse_collection_name(partition)
    if parsed is None:  # ensure_collection never makes such a partition
        raise StoreError(f"partition {partition!r} is not named rag__<tenant>__v<N>")
    tenant, version = parsed
    for point in points:
        if point.tenant_id != tenant:
            raise StoreError(
                f"point {point.point_id} of tenant {point.tenant_id!r} cannot be written to "
                f"{partition}, a partition of tenant {tenant!r}"
            )
        if point.point_id != point_id(tenant, point.chunk_id, version):
            raise StoreError(
                f"point {point.point_id} in {partition}: its id is not "
                f"ids.point_id({tenant!r}, {point.chunk_id!r}, {version})"
            )


class TieredStore:
    """`VectorStore` whose collections are dedicated engine collections or partitions of a
    shared pool (see the module docstring)."""

    def __init__(
        self,
        engine: PartitionedEngine,
        catalog: PlacementCatalog,
        *,
        default_placement: Placement = "dedicated",
    ) -> None:
        """Place collections in `engine`, recording partitions in `catalog`; a collection
        created without a placement gets `default_placement`."""
        if default_placement not in PLACEMENTS:
            raise ValueError(f"placement must be one of {PLACEMENTS}, got {default_placement!r}")
        self._engine = engine
        self._catalog = catalog
        self._default: Placement = default_placement
        self._lock = threading.RLock()

    @property
    def engine(self) -> PartitionedEngine:
        """The engine adapter underneath."""
        return self._engine

    @property
    def schema(self) -> PayloadSchema:
        """Which payload fields are indexed."""
        return self._engine.schema

    @property
    def default_placement(self) -> Placement:
        """The placement of a collection created without one."""
        return self._default

    # --- placement -----------------------------------------------------------------------

    def _where(self, name: str) -> tuple[str, str | None]:
        """(engine collection, partition or None) of a logical collection."""
        validate_collection_name(name)
        if is_pool(name) or name == CATALOG_COLLECTION:
            raise StoreError(
                f"{name!r} is reserved (a shared pool or ragstream's catalog), not a collection "
                f"a caller may address"
            )
        pool = self._catalog.pool_of(name)
        return (name, None) if pool is None else (pool, name)

    def _scoped(self, name: str, store_filter: StoreFilter) -> tuple[str, StoreFilter]:
        collection, partition = self._where(name)
        if store_filter.partition != partition:
            store_filter = dataclasses.replace(store_filter, partition=partition)
        return collection, store_filter

    def placement_of(self, name: str) -> Placement | None:
        """Where the logical collection lives, or None when it does not exist."""
        return self._placement(*self._where(name))

    def _placement(self, collection: str, partition: str | None) -> Placement | None:
        if partition is not None:
            return "shared"
        return "dedicated" if self._engine.collection_exists(collection) else None

    def partitions(self) -> dict[str, str]:
        """Every shared-placed logical collection -> its pool."""
        return self._catalog.partitions()

    # --- collections ---------------------------------------------------------------------

    def ensure_collection(
        self,
        name: str,
        dimension: int,
        sparse: bool = True,
        *,
        placement: Placement | None = None,
    ) -> None:
        """Create the logical collection with `placement` if absent, else verify it (its
        vectors, and that it is placed as asked: a placement changes only by reindexing into a
        new version). None: as it is, or the store's default for a new one."""
        if placement is not None and placement not in PLACEMENTS:
            raise ValueError(f"placement must be one of {PLACEMENTS}, got {placement!r}")
        with self._lock:
            collection, partition = self._where(name)
            current = self._placement(collection, partition)
            if placement is None:
                placement = current or self._default
            if current is not None and current != placement:
                raise StoreError(
                    f"collection {name!r} is {current}, not {placement}: a placement changes "
                    f"by reindexing into a new version (ragstream reindex --placement)"
                )
            if placement == "dedicated":
                self._engine.ensure_collection(name, dimension, sparse)
                return
            if parse_collection_name(name) is None:
                raise StoreError(
                    f"collection {name!r} cannot be shared: a partition is one tenant's index "
                    f"version, named rag__<tenant>__v<N>"
                )
            pool = collection if partition is not None else None
            wanted = pool_name(dimension, sparse)
            if pool is not None and pool != wanted:
                raise StoreError(
                    f"collection {name!r} is a partition of {pool}, whose vectors do not fit "
                    f"size {dimension}{'' if sparse else ' without a sparse vector'}"
                )
            self._engine.ensure_collection(wanted, dimension, sparse)
            if pool is None:
                self._catalog.add(name, wanted)

    def drop_collection(self, name: str) -> bool:
        """Delete the logical collection and its points; False if it did not exist."""
        with self._lock:
            collection, partition = self._where(name)
            if partition is None:
                return self._engine.drop_collection(collection)
            # Points first: a crash in between leaves an empty partition, dropped again later.
            self._engine.delete_partition(collection, partition)
            self._catalog.remove(name)
            return True

    def collection_exists(self, name: str) -> bool:
        """True when the logical collection exists (in either placement)."""
        return self.placement_of(name) is not None

    def list_collections(self) -> list[str]:
        """Every logical collection (dedicated and shared), sorted; pools are not listed."""
        dedicated = [
            n for n in self._engine.list_collections() if not is_pool(n) and n != CATALOG_COLLECTION
        ]
        return sorted({*dedicated, *self._catalog.partitions()})

    def optimize(self, name: str) -> bool:
        """Build the indexes of the engine collection holding `name` (for a partition: the
        whole pool)."""
        return self._engine.optimize(self._where(name)[0])

    # --- writes --------------------------------------------------------------------------

    def upsert(self, name: str, points: Sequence[PointRecord], wait: bool = True) -> None:
        """Insert or overwrite points; a partition's points get its key."""
        collection, partition = self._where(name)
        if partition is not None:
            _check_partition_points(partition, points)
        self._engine.upsert(collection, points, wait, partition=partition)

    def delete_points(self, name: str, ids: Sequence[str], wait: bool = True) -> None:
        """Delete points by id (of this logical collection only)."""
        collection, partition = self._where(name)
        self._engine.delete_points(collection, ids, wait, partition=partition)

    def delete_by_entity(self, name: str, tenant_id: str, entity_id: str) -> None:
        """Delete every point of one entity of one tenant."""
        collection, partition = self._where(name)
        self._engine.delete_by_entity(collection, tenant_id, entity_id, partition=partition)

    def update_payload(
        self,
        name: str,
        ids: Sequence[str],
        values: Mapping[str, Any],
        unset: Sequence[str] = (),
        wait: bool = True,
    ) -> None:
        """Set and remove payload keys of the given points of this logical collection."""
        collection, partition = self._where(name)
        self._engine.update_payload(collection, ids, values, unset, wait, partition=partition)

    # --- reads ---------------------------------------------------------------------------

    def entity_chunks(self, name: str, tenant_id: str, entity_id: str) -> dict[str, ChunkRef]:
        """The entity's chunk manifest."""
        collection, partition = self._where(name)
        return self._engine.entity_chunks(collection, tenant_id, entity_id, partition=partition)

    def retrieve(
        self,
        name: str,
        ids: Sequence[str],
        tenant_id: str,
        with_vectors: bool = False,
        *,
        fields: Sequence[str] | None = None,
        sparse: bool = True,
    ) -> list[StoredPoint]:
        """The tenant's points among `ids` in this logical collection, in the order of `ids`
        (`fields` selects the payload keys, `sparse=False` only the dense vector)."""
        collection, partition = self._where(name)
        return self._engine.retrieve(
            collection,
            ids,
            tenant_id,
            with_vectors,
            partition=partition,
            fields=fields,
            sparse=sparse,
        )

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
        """Nearest points by cosine similarity, best first."""
        collection, scoped = self._scoped(name, filter)
        return self._engine.search_dense(
            collection, vector, scoped, limit=limit, with_vectors=with_vectors, fields=fields
        )

    def search_sparse(
        self,
        name: str,
        sparse: SparseVector,
        filter: StoreFilter,
        *,
        limit: int,
        fields: Sequence[str] | None = None,
    ) -> list[ScoredHit]:
        """Best points by sparse dot product, best first."""
        collection, scoped = self._scoped(name, filter)
        return self._engine.search_sparse(collection, sparse, scoped, limit=limit, fields=fields)

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
        """Both branches in one round trip."""
        collection, scoped = self._scoped(name, filter)
        return self._engine.search_hybrid(
            collection,
            dense,
            sparse,
            scoped,
            limit=limit,
            prefetch_limit=prefetch_limit,
            sparse_dense_scores=sparse_dense_scores,
            fields=fields,
        )

    def count(self, name: str, filter: StoreFilter) -> int:
        """Exact number of points matching the filter."""
        collection, scoped = self._scoped(name, filter)
        return self._engine.count(collection, scoped)

    def scroll(
        self,
        name: str,
        filter: StoreFilter,
        batch: int = 256,
        with_vectors: bool = False,
        *,
        fields: Sequence[str] | None = None,
    ) -> Iterator[StoredPoint]:
        """Every matching point, `batch` at a time, ordered by point id."""
        collection, scoped = self._scoped(name, filter)
        return self._engine.scroll(collection, scoped, batch, with_vectors, fields=fields)

    def close(self) -> None:
        """Close the engine adapter."""
        self._engine.close()
