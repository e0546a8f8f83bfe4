"""Build the shared parts from settings, in one place (both services and the CLI use this)."""

from __future__ import annotations

import logging
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Protocol

from ragcore.embedders import build_embedder
from ragcore.embedders.base import Embedder
from ragcore.errors import ConfigError
from ragcore.mapping import TableCatalog
from ragcore.plan import ContentHasher, PlanConfig
from ragcore.prepare import Preparer
from ragcore.settings import ServiceSettings, SorSettings, StoreSettings
from ragcore.sor.base import SystemOfRecord
from ragcore.sor.sql import PostgresSor, SqliteSor
from ragcore.sparse import Bm25Encoder
from ragcore.store.base import PayloadSchema, Placement, VectorStore
from ragcore.store.edge import EdgeStore
from ragcore.store.host import HostedStore, advertised_store
from ragcore.store.qdrant_remote import (
    CatalogEntries,
    QdrantRemoteStore,
    ServerPlacementCatalog,
)
from ragcore.store.registry import (
    FileIndexRegistry,
    IndexRegistry,
    QdrantIndexRegistry,
)
from ragcore.store.tiered import FilePlacementCatalog, TieredStore

if TYPE_CHECKING:
    from prometheus_client import CollectorRegistry

    from ragcore.embedders.cache import EmbeddingCacheConfig

log = logging.getLogger(__name__)


def payload_schema(plan: PlanConfig) -> PayloadSchema:
    """Indexed payload fields: the keyword fields every table mapping copies to the payload."""
    keywords = tuple(dict.fromkeys(f for m in plan.tables for f in m.keyword_fields))
    return PayloadSchema(keyword_fields=keywords)


def build_store(settings: StoreSettings, schema: PayloadSchema) -> TieredStore:
    """The tiered store (dedicated collections and shared partitions,
    docs/decisions/tiered-tenancy.md) over qdrant-edge under `data_dir`, or over a Qdrant
    server at `url` (its partitions recorded in ragstream's catalog collection there)."""
    if settings.backend == "edge":
        engine = EdgeStore(
            settings.data_dir,
            schema=schema,
            payload_in_ram=settings.edge_payload_in_ram,
            max_search_threads=settings.edge_search_threads,
        )
        return TieredStore(
            engine,
            FilePlacementCatalog(settings.data_dir),
            default_placement=settings.placement_for_new_tenants,
        )
    if not settings.url:
        raise ConfigError("store.backend=qdrant needs store.url (RAGSTREAM_STORE__URL)")
    key = settings.api_key.get_secret_value() if settings.api_key else None
    remote = QdrantRemoteStore.connect(
        settings.url,
        api_key=key,
        prefer_grpc=settings.prefer_grpc,
        timeout=int(settings.timeout_s),
        schema=schema,
    )
    return TieredStore(
        remote,
        ServerPlacementCatalog(CatalogEntries(remote)),
        default_placement=settings.placement_for_new_tenants,
    )


def open_store(settings: StoreSettings, schema: PayloadSchema) -> VectorStore:
    """The store for a command: with the embedded backend, the one a live process (e.g.
    `ragstream dev`) holds open and advertises in the data dir, through its store host;
    otherwise the store `build_store` opens."""
    if settings.backend == "edge":
        hosted = advertised_store(settings.data_dir)
        if hosted is not None:
            return hosted
    return build_store(settings, schema)


def new_tenant_placement(settings: StoreSettings, store: VectorStore) -> Placement:
    """Where a tenant's first version goes: the configured placement, else the store's default;
    an engine adapter handed in by the caller (not a `TieredStore`) holds dedicated collections
    only, and asking it for shared ones is a configuration error."""
    if isinstance(store, TieredStore):
        return settings.new_tenants or store.default_placement
    if isinstance(store, HostedStore):  # the store of a live process (ragcore/store/host.py)
        hosted = store.default_placement
        if hosted is not None:
            return settings.new_tenants or hosted
    if settings.new_tenants == "shared":
        raise ConfigError(
            "store.new_tenants=shared needs the tiered store that build_store makes; the store "
            f"given ({type(store).__name__}) holds dedicated collections only"
        )
    return "dedicated"


def build_registry(settings: StoreSettings, store: VectorStore) -> IndexRegistry:
    """The index registry matching the store backend."""
    if isinstance(store, QdrantRemoteStore):
        return QdrantIndexRegistry(store)  # an engine store given by the caller: dedicated
    if isinstance(store, TieredStore) and isinstance(store.engine, QdrantRemoteStore):
        engine = store.engine
        return QdrantIndexRegistry(engine, store=store, entries=CatalogEntries(engine))
    return FileIndexRegistry(settings.data_dir, store)


def build_sor(
    settings: SorSettings, catalog: TableCatalog, hasher: ContentHasher
) -> SystemOfRecord | None:
    """The SoR reader of every mapped table, or None when no SoR is configured."""
    if settings.kind == "none":
        return None
    if settings.kind == "postgres":
        if settings.dsn is None:
            raise ConfigError("sor.kind=postgres needs sor.dsn (RAGSTREAM_SOR__DSN)")
        return PostgresSor(settings.dsn.get_secret_value(), catalog=catalog, hasher=hasher)
    if settings.sqlite_path is None:
        raise ConfigError("sor.kind=sqlite needs sor.sqlite_path (RAGSTREAM_SOR__SQLITE_PATH)")
    return SqliteSor(settings.sqlite_path, catalog=catalog, hasher=hasher)


class Closable(Protocol):
    """A part a service closes when it stops."""

    def close(self) -> None:
        """Release the part's resources."""


@dataclass
class CoreParts:
    """What both services are built on, wired from their shared settings, and which of those
    parts were built here (`owned`: the service closes them; injected parts stay open)."""

    embedder: Embedder
    next_embedder: Embedder | None
    preparer: Preparer
    sparse: Bm25Encoder
    store: VectorStore
    registry: IndexRegistry
    sor: SystemOfRecord | None
    owned: list[Closable] = field(default_factory=list)

    def close(self) -> None:
        """Close the owned parts, last built first."""
        for part in reversed(self.owned):
            part.close()


def build_core(
    settings: ServiceSettings,
    *,
    embedder: Embedder | None = None,
    next_embedder: Embedder | None = None,
    store: VectorStore | None = None,
    sor: SystemOfRecord | None = None,
    cache: EmbeddingCacheConfig | None = None,
    metrics: CollectorRegistry | None = None,
) -> CoreParts:
    """The embedder(s), the preparer, the BM25 encoder, the store with its index registry and
    the SoR reader of `settings`; given parts are used as they are. `cache` puts the primary
    embedder behind the embedding cache (its metrics go to `metrics`). If a part fails to build,
    the ones built before it are closed."""
    owned: list[Closable] = []
    try:
        primary = embedder or build_embedder(settings.embedder, cache=cache, registry=metrics)
        if embedder is None:
            owned.append(primary)
        other = next_embedder
        if other is None and settings.next_embedder is not None:
            # uncached: the cache's metrics belong to the primary model (one registration), and
            # a model being rolled out has no cached vectors worth sharing yet
            other = build_embedder(settings.next_embedder)
            owned.append(other)
        preparer = Preparer(primary.spec, settings.chunking)
        owned.append(preparer)  # its document extraction child, once one started
        reader = sor or build_sor(settings.sor, settings.plan.catalog, preparer.content_hash)
        if sor is None and reader is not None:
            owned.append(reader)
        vectors = store or build_store(settings.store, payload_schema(settings.plan))
        if store is None:
            owned.append(vectors)
        return CoreParts(
            embedder=primary,
            next_embedder=other,
            preparer=preparer,
            sparse=Bm25Encoder(),
            store=vectors,
            registry=build_registry(settings.store, vectors),
            sor=reader,
            owned=owned,
        )
    except BaseException:
        for part in reversed(owned):
            part.close()
        raise
