"""The `VectorStore` port and its value types, free of any vendor type.

Two adapters implement it: `ragcore.store.edge` (qdrant-edge, embedded, the default) and
`ragcore.store.qdrant_remote` (qdrant-client: a Qdrant server, or local mode in tests). One
contract suite (tests/ragstream/store/contract.py) runs against both.

Layout of every collection (docs/decisions/collections-per-tenant-and-version.md,
docs/decisions/chunk-ids-and-versions.md):
- named dense vector `dense` (cosine) and named sparse vector `sparse` (BM25-style document
  weights; the engine applies IDF at query time through the IDF modifier);
- payload indexes on `tenant_id` (tenant index), `source_entity_id`, `entity_type`, `chunk_id`,
  the configured keyword fields, and the range fields (`event_date` by default, as datetime).

Tenancy: every read takes a `StoreFilter`, whose `tenant_id` is required; adapters always add
`tenant_id == X` to the engine filter and re-check the tenant of each hit they return.
"""

from __future__ import annotations

import math
import uuid
from collections.abc import Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any, Literal, Protocol, TypeAlias, runtime_checkable

import numpy as np
from numpy.typing import NDArray

from ragcore.errors import StoreError
from ragcore.fusion import FusedHit, FusionMethod, fuse
from ragcore.store.ids import validate_tenant

DENSE_VECTOR = "dense"
SPARSE_VECTOR = "sparse"

# Payload fields every point carries (the first three are required by `PointRecord`).
TENANT_ID = "tenant_id"
CHUNK_ID = "chunk_id"
ENTITY_ID = "source_entity_id"
ENTITY_TYPE = "entity_type"
SOURCE_HASH = "source_hash"
#: The mapped SoR table an entity comes from (`TableMapping.label`; a TRUNCATE filters on it).
SOURCE_TABLE = "source_table"
EVENT_DATE = "event_date"
#: A chunk's BM25 term counts as `ragcore.sparse.Bm25Encoder.encode_chunk` stores them: written
#: with the chunk, so Retrieve's exact BM25 need not tokenize the text of every candidate.
TERM_COUNTS = "bm25_terms"
#: In a shared collection, the logical collection (`rag__<tenant>__v<N>`) a point belongs to;
#: set and filtered by `ragcore.store.tiered.TieredStore` only (docs/decisions/tiered-tenancy.md).
PARTITION = "ragstream_partition"

#: Fields with a keyword index in every collection.
CORE_KEYWORD_FIELDS: tuple[str, ...] = (
    TENANT_ID,
    ENTITY_ID,
    ENTITY_TYPE,
    CHUNK_ID,
    SOURCE_TABLE,
    PARTITION,
)
#: Keyword fields indexed as the engine's tenant key (`is_tenant`): stored and searched per value.
TENANT_KEY_FIELDS: tuple[str, ...] = (TENANT_ID, PARTITION)

#: Where an index version lives: its own collection, or a partition of a shared one.
Placement = Literal["dedicated", "shared"]
PLACEMENTS: tuple[Placement, ...] = ("dedicated", "shared")

RangeKind = Literal["datetime", "float", "integer"]
DenseVector: TypeAlias = NDArray[np.float32] | Sequence[float]
PayloadValue: TypeAlias = str | int | bool


@dataclass(frozen=True, slots=True)
class PayloadSchema:
    """Which payload fields get an index (beyond the core keyword fields).

    `range_fields` maps a field to its kind: `datetime` fields hold RFC 3339 strings (e.g.
    `2024-05-01T12:00:00Z`) and are filtered with datetime bounds; `float`/`integer` fields hold
    numbers and are filtered with numeric bounds.
    """

    keyword_fields: tuple[str, ...] = ()
    range_fields: Mapping[str, RangeKind] = field(default_factory=lambda: {EVENT_DATE: "datetime"})

    def __post_init__(self) -> None:
        overlap = set(self.keyword_fields) & set(self.range_fields)
        if overlap:
            raise ValueError(f"fields cannot be both keyword and range fields: {sorted(overlap)}")
        for name, kind in self.range_fields.items():
            if kind not in ("datetime", "float", "integer"):
                raise ValueError(f"range field {name!r}: unknown kind {kind!r}")

    def all_keyword_fields(self) -> tuple[str, ...]:
        """Core keyword fields followed by the configured ones, without duplicates."""
        return tuple(dict.fromkeys((*CORE_KEYWORD_FIELDS, *self.keyword_fields)))

    def check_filter(self, store_filter: StoreFilter) -> None:
        """Raise ValueError when a filter names an undeclared field or a range of the wrong kind.

        An undeclared field would be filtered without an index (slow on a server) and a typo
        would silently match nothing; a datetime range on a numeric field matches nothing.
        """
        keyword_fields = self.all_keyword_fields()
        for name in store_filter.keywords:
            if name not in keyword_fields:
                raise ValueError(f"keyword filter on undeclared field {name!r}")
        for name, bounds in store_filter.ranges.items():
            kind = self.range_fields.get(name)
            if kind is None:
                raise ValueError(f"range filter on undeclared field {name!r}")
            if bounds.is_datetime != (kind == "datetime"):
                raise ValueError(f"range filter on {name!r}: bounds do not fit a {kind} field")


@dataclass(frozen=True, slots=True)
class SparseVector:
    """A sparse vector: strictly increasing non-negative 32-bit indices and finite values."""

    indices: tuple[int, ...]
    values: tuple[float, ...]

    def __post_init__(self) -> None:
        indices = tuple(map(int, self.indices))
        values = tuple(map(float, self.values))
        object.__setattr__(self, "indices", indices)
        object.__setattr__(self, "values", values)
        if len(indices) != len(values):
            raise ValueError("sparse vector: indices and values differ in length")
        if indices and (
            indices[0] < 0
            or indices[-1] > 0xFFFFFFFF
            or not all(map(int.__lt__, indices, indices[1:]))
        ):
            raise ValueError("sparse vector: indices must be increasing u32 values")
        if not all(map(math.isfinite, values)):
            raise ValueError("sparse vector: values must be finite")

    @classmethod
    def from_mapping(cls, weights: Mapping[int, float]) -> SparseVector:
        """Build from {index: weight}, sorting the indices."""
        items = sorted(weights.items())
        return cls(tuple(i for i, _ in items), tuple(w for _, w in items))

    def __len__(self) -> int:
        return len(self.indices)


def _is_uuid(value: str) -> bool:
    try:
        return str(uuid.UUID(value)) == value
    except (ValueError, AttributeError, TypeError):
        return False


@dataclass(frozen=True, slots=True, eq=False)
class PointRecord:
    """A point to write: canonical UUID string id, dense vector, optional sparse vector, payload.

    The payload must hold the string fields `tenant_id`, `chunk_id` and `source_entity_id`: a
    point without them could escape tenant filters or the per-entity chunk manifest.
    """

    point_id: str
    dense: DenseVector
    sparse: SparseVector | None
    payload: Mapping[str, Any]

    def __post_init__(self) -> None:
        if not _is_uuid(self.point_id):
            raise ValueError(f"point id must be a canonical UUID string, got {self.point_id!r}")
        for key in (TENANT_ID, CHUNK_ID, ENTITY_ID):
            if not isinstance(self.payload.get(key), str) or not self.payload[key]:
                raise ValueError(f"point {self.point_id}: payload needs a non-empty {key!r}")
        validate_tenant(self.payload[TENANT_ID])

    @property
    def tenant_id(self) -> str:
        """The owning tenant (from the payload)."""
        return str(self.payload[TENANT_ID])

    @property
    def chunk_id(self) -> str:
        """The chunk id (from the payload)."""
        return str(self.payload[CHUNK_ID])

    def dense_array(self) -> NDArray[np.float32]:
        """The dense vector as a 1-D float32 array."""
        return np.asarray(self.dense, dtype=np.float32).reshape(-1)


@dataclass(frozen=True, slots=True)
class Range:
    """Bounds on a range field; all bounds are datetimes (timezone-aware) or all numbers."""

    gte: datetime | float | None = None
    gt: datetime | float | None = None
    lte: datetime | float | None = None
    lt: datetime | float | None = None

    def __post_init__(self) -> None:
        bounds = [b for b in (self.gte, self.gt, self.lte, self.lt) if b is not None]
        if not bounds:
            raise ValueError("a range needs at least one bound")
        kinds = {isinstance(b, datetime) for b in bounds}
        if len(kinds) != 1:
            raise ValueError("a range mixes datetime and numeric bounds")
        for b in bounds:
            if isinstance(b, datetime) and b.utcoffset() is None:
                raise ValueError(f"datetime bound {b!r} has no timezone")
            if isinstance(b, bool) or (not isinstance(b, datetime | int | float)):
                raise ValueError(f"range bound {b!r} is neither a datetime nor a number")

    @property
    def is_datetime(self) -> bool:
        """True when the bounds are datetimes."""
        return any(isinstance(b, datetime) for b in (self.gte, self.gt, self.lte, self.lt))


@dataclass(frozen=True, slots=True)
class StoreFilter:
    """What a read may see. `tenant_id` is required; every other criterion narrows further.

    - `entity_types` / `entity_ids`: empty means "any"; otherwise the point must match one.
    - `keywords`: field -> allowed values (the point must match one value of every field).
    - `ranges`: field -> `Range` on a range field of the payload schema (e.g. `event_date`).
    - `partition`: the logical collection inside a shared one; set by `TieredStore`, which
      owns the placement, never by callers (docs/decisions/tiered-tenancy.md).
    """

    tenant_id: str
    entity_types: tuple[str, ...] = ()
    entity_ids: tuple[str, ...] = ()
    keywords: Mapping[str, tuple[PayloadValue, ...]] = field(default_factory=dict)
    ranges: Mapping[str, Range] = field(default_factory=dict)
    partition: str | None = None

    def __post_init__(self) -> None:
        validate_tenant(self.tenant_id)
        object.__setattr__(self, "entity_types", tuple(self.entity_types))
        object.__setattr__(self, "entity_ids", tuple(self.entity_ids))
        keywords = {k: tuple(v) for k, v in self.keywords.items()}
        for name, values in keywords.items():
            if name == TENANT_ID:
                raise ValueError("tenant_id is set by StoreFilter.tenant_id, not by keywords")
            if name == PARTITION:
                raise ValueError(f"{PARTITION} is set by StoreFilter.partition, not by keywords")
            if not values:
                raise ValueError(f"keyword filter {name!r} has no allowed values")
            kinds = {type(v) for v in values}
            if len(kinds) != 1 or not kinds <= {str, int, bool}:
                raise ValueError(f"keyword filter {name!r}: values must be all str, int or bool")
        object.__setattr__(self, "keywords", keywords)
        object.__setattr__(self, "ranges", dict(self.ranges))
        if TENANT_ID in self.ranges:
            raise ValueError("tenant_id cannot be a range filter")


@dataclass(frozen=True, slots=True)
class ScoredHit:
    """A search hit: point id, the branch's score, payload, the dense vector if asked, and
    (a sparse hybrid hit, when asked) the engine's cosine of the dense query and the point."""

    point_id: str
    score: float
    payload: Mapping[str, Any]
    dense: NDArray[np.float32] | None = None
    dense_score: float | None = None

    @property
    def chunk_id(self) -> str:
        """The chunk id from the payload (the point id when absent)."""
        value = self.payload.get(CHUNK_ID)
        return value if isinstance(value, str) else self.point_id

    def __reduce__(self) -> tuple[type[ScoredHit], tuple[Any, ...]]:
        # pickled by its fields in order: a frozen slotted dataclass's default state looks its
        # fields up for every instance, and the store host pickles ~40 hits a search each way
        # (42 hits: 83 -> 37 us to pickle, 89 -> 54 us to unpickle)
        return (ScoredHit, (self.point_id, self.score, self.payload, self.dense, self.dense_score))


@dataclass(frozen=True, slots=True)
class StoredPoint:
    """A point read back by `retrieve` or `scroll` (vectors only when asked)."""

    point_id: str
    payload: Mapping[str, Any]
    dense: NDArray[np.float32] | None = None
    sparse: SparseVector | None = None

    def __reduce__(self) -> tuple[type[StoredPoint], tuple[Any, ...]]:
        # by its fields in order, as `ScoredHit` (a scroll pickles hundreds a page)
        return (StoredPoint, (self.point_id, self.payload, self.dense, self.sparse))


@dataclass(frozen=True, slots=True)
class ChunkRef:
    """One entry of an entity's chunk manifest, read from the points' payloads."""

    point_id: str
    chunk_id: str
    source_hash: str | None
    payload: Mapping[str, Any]


@dataclass(frozen=True, slots=True)
class HybridResult:
    """Both ranked lists of a hybrid search (each up to `prefetch_limit` hits, best first)."""

    dense: tuple[ScoredHit, ...]
    sparse: tuple[ScoredHit, ...]
    limit: int

    def fused(
        self,
        *,
        dense_weight: float = 1.0,
        sparse_weight: float = 1.0,
        k: float = 60.0,
        method: FusionMethod = "rrf",
    ) -> list[FusedHit]:
        """The top `limit` of `ragcore.fusion.fuse` over both lists."""
        return fuse(
            self.dense,
            self.sparse,
            dense_weight=dense_weight,
            sparse_weight=sparse_weight,
            k=k,
            method=method,
            limit=self.limit,
        )


def split_engine_vectors(vector: Any) -> tuple[NDArray[np.float32] | None, SparseVector | None]:
    """The dense and sparse vectors of a point as either engine returns them (a dict of named
    vectors; sparse ones with `.indices`/`.values` in storage order, which is not sorted)."""
    if not isinstance(vector, dict):
        return None, None
    dense_raw = vector.get(DENSE_VECTOR)
    sparse_raw = vector.get(SPARSE_VECTOR)
    dense = None if dense_raw is None else np.asarray(dense_raw, dtype=np.float32)
    sparse = None
    if sparse_raw is not None:
        sparse = SparseVector.from_mapping(
            dict(zip(sparse_raw.indices, sparse_raw.values, strict=True))
        )
    return dense, sparse


def refuse_shared(name: str, placement: Placement) -> None:
    """StoreError unless `placement` is dedicated: an engine adapter holds whole collections;
    partitions of a shared one are `ragcore.store.tiered.TieredStore`'s."""
    if placement not in PLACEMENTS:
        raise ValueError(f"placement must be one of {PLACEMENTS}, got {placement!r}")
    if placement != "dedicated":
        raise StoreError(
            f"collection {name!r}: shared placement needs a TieredStore over this adapter"
        )


def check_payload_update(values: Mapping[str, Any], unset: Sequence[str]) -> None:
    """Refuse payload updates that would move a point to another tenant, entity or chunk."""
    frozen = {TENANT_ID, ENTITY_ID, CHUNK_ID, PARTITION} & (set(values) | set(unset))
    if frozen:
        raise StoreError(f"payload fields {sorted(frozen)} cannot be updated in place")


def payload_selection(fields: Sequence[str] | None) -> list[str] | None:
    """The payload keys a read with `fields` asks the engine for: None (the whole payload), or
    the keys in order without duplicates, with `tenant_id` added when missing so that
    `check_tenant` still sees every point's tenant. ValueError on a bare string or empty key."""
    if fields is None:
        return None
    if isinstance(fields, str):
        raise ValueError(f"fields must be a sequence of payload keys, not the string {fields!r}")
    keys = list(fields)
    for key in keys:
        if not isinstance(key, str) or not key:
            raise ValueError(f"payload field names must be non-empty strings, got {key!r}")
    return list(dict.fromkeys((*keys, TENANT_ID)))


def check_tenant(hits: Sequence[ScoredHit] | Sequence[StoredPoint], tenant_id: str) -> None:
    """Defence in depth: raise StoreError if any hit belongs to another tenant.

    The engine filter already excludes other tenants; reaching this error means a filter was
    lost on the way, and returning the hit would leak data (docs/decisions/tenancy-and-access.md).
    """
    for hit in hits:
        if hit.payload.get(TENANT_ID) != tenant_id:
            raise StoreError(
                f"tenant isolation violated: point {hit.point_id} is not tenant {tenant_id!r}"
            )


@runtime_checkable
class VectorStore(Protocol):
    """A vector store holding one collection per tenant and index version.

    Writes with `wait=True` return once the points are searchable. Every read takes a
    `StoreFilter` (tenant required). Vendor errors surface as `StoreError` /
    `StoreUnavailableError` (retry later).
    """

    def ensure_collection(
        self,
        name: str,
        dimension: int,
        sparse: bool = True,
        *,
        placement: Placement = "dedicated",
    ) -> None:
        """Create the collection (vectors + payload indexes) if absent; verify it if present.

        `placement="shared"` makes it a partition of a shared collection; only
        `ragcore.store.tiered.TieredStore` does that (the engine adapters raise StoreError).
        """
        ...

    def drop_collection(self, name: str) -> bool:
        """Delete the collection and its data; False if it did not exist."""
        ...

    def collection_exists(self, name: str) -> bool:
        """True when the collection exists."""
        ...

    def upsert(self, name: str, points: Sequence[PointRecord], wait: bool = True) -> None:
        """Insert or overwrite points by id."""
        ...

    def delete_points(self, name: str, ids: Sequence[str], wait: bool = True) -> None:
        """Delete points by id (absent ids are ignored)."""
        ...

    def delete_by_entity(self, name: str, tenant_id: str, entity_id: str) -> None:
        """Delete every point of one entity of one tenant (waits)."""
        ...

    def update_payload(
        self,
        name: str,
        ids: Sequence[str],
        values: Mapping[str, Any],
        unset: Sequence[str] = (),
        wait: bool = True,
    ) -> None:
        """Set `values` and remove the `unset` keys on the payload of every point in `ids`
        (vectors untouched). The tenant, entity and chunk ids cannot be changed this way."""
        ...

    def entity_chunks(self, name: str, tenant_id: str, entity_id: str) -> dict[str, ChunkRef]:
        """The entity's chunk manifest: chunk_id -> ChunkRef, read from the points' payloads."""
        ...

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
        """Nearest points by cosine similarity, best first; `fields` selects the payload keys
        of the hits as in `scroll` (None: the whole payload)."""
        ...

    def search_sparse(
        self,
        name: str,
        sparse: SparseVector,
        filter: StoreFilter,
        *,
        limit: int,
        fields: Sequence[str] | None = None,
    ) -> list[ScoredHit]:
        """Best points by sparse dot product (with the engine's IDF), best first; `fields` as
        in `search_dense`."""
        ...

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
        """Both branches in one round trip; fuse with `HybridResult.fused` or `fusion.fuse`.
        `fields` selects the payload keys of every hit as in `scroll` (None: all of them).
        `sparse_dense_scores`: each hit of the sparse branch carries its cosine with `dense`
        (`ScoredHit.dense_score`), computed by the engine as the dense branch's scores are, so
        a caller can score the hits the dense branch did not find without reading their
        vectors (a hit deleted meanwhile may lack it)."""
        ...

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
        """The tenant's points among `ids` (others are omitted), in the order of `ids`.
        `fields` selects the payload keys as in `scroll` (None: the whole payload);
        `sparse=False` with `with_vectors` reads only the dense vector (`sparse` is None)."""
        ...

    def count(self, name: str, filter: StoreFilter) -> int:
        """Exact number of points matching the filter."""
        ...

    def scroll(
        self,
        name: str,
        filter: StoreFilter,
        batch: int = 256,
        with_vectors: bool = False,
        *,
        fields: Sequence[str] | None = None,
    ) -> Iterator[StoredPoint]:
        """Every matching point, fetched `batch` at a time, ordered by point id.

        `fields` selects the payload: None returns the whole payload, otherwise only these
        top-level payload keys (absent ones are simply missing) plus `tenant_id`, which is
        always read so the tenant of every point can still be checked. Scans that need a few
        keys (reconcile) so avoid transferring the texts and converting them to Python objects.
        """
        ...

    def optimize(self, name: str) -> bool:
        """Build indexes now (after bulk loads); True if anything was optimized."""
        ...

    def close(self) -> None:
        """Release the store's resources (idempotent)."""
        ...


def datetime_bounds(
    bounds: Range,
) -> tuple[datetime | None, datetime | None, datetime | None, datetime | None]:
    """(gte, gt, lte, lt) of a datetime range, for engine filters."""

    def check(value: datetime | float | None) -> datetime | None:
        if value is not None and not isinstance(value, datetime):
            raise ValueError(f"{value!r} is not a datetime bound")
        return value

    return check(bounds.gte), check(bounds.gt), check(bounds.lte), check(bounds.lt)


def numeric_bounds(
    bounds: Range,
) -> tuple[float | None, float | None, float | None, float | None]:
    """(gte, gt, lte, lt) of a numeric range as floats, for engine filters."""

    def num(value: datetime | float | None) -> float | None:
        if value is None:
            return None
        if isinstance(value, datetime):
            raise ValueError(f"{value!r} is not a numeric bound")
        return float(value)

    return num(bounds.gte), num(bounds.gt), num(bounds.lte), num(bounds.lt)


def chunk_manifest(points: Iterable[StoredPoint]) -> dict[str, ChunkRef]:
    """chunk_id -> ChunkRef over an entity's points; StoreError if two points claim one chunk."""
    manifest: dict[str, ChunkRef] = {}
    for point in points:
        chunk_id = point.payload.get(CHUNK_ID)
        if not isinstance(chunk_id, str):
            raise StoreError(f"point {point.point_id} has no chunk_id in its payload")
        if chunk_id in manifest:
            raise StoreError(
                f"chunk {chunk_id!r} is held by points {manifest[chunk_id].point_id} and "
                f"{point.point_id}: point ids were not derived from ids.point_id"
            )
        source_hash = point.payload.get(SOURCE_HASH)
        manifest[chunk_id] = ChunkRef(
            point.point_id,
            chunk_id,
            source_hash if isinstance(source_hash, str) else None,
            point.payload,
        )
    return manifest
