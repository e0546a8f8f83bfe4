"""Build the shared parts from settings, in one place (both services and the CLI use this)."""

from __future__ import annotations

import logging

from ragcore.errors import ConfigError
from ragcore.mapping import TableCatalog
from ragcore.plan import ContentHasher, PlanConfig
from ragcore.settings import SorSettings, StoreSettings
from ragcore.sor.base import SystemOfRecord
from ragcore.sor.sql import PostgresSor, SqliteSor
from ragcore.store.base import PayloadSchema, VectorStore
from ragcore.store.edge import EdgeStore
from ragcore.store.qdrant_remote import QdrantRemoteStore
from ragcore.store.registry import (
    FileIndexRegistry,
    IndexRegistry,
    QdrantIndexRegistry,
)

log = logging.getLogger(__name__)


def payload_schema(plan: PlanConfig) -> PayloadSchema:
    """Indexed payload fields: the keyword fields every table mapping copies to the payload."""
    keywords = tuple(dict.fromkeys(f for m in plan.tables for f in m.keyword_fields))
    return PayloadSchema(keyword_fields=keywords)


def build_store(settings: StoreSettings, schema: PayloadSchema) -> VectorStore:
    """qdrant-edge under `data_dir`, or a Qdrant server at `url`."""
    if settings.backend == "edge":
        return EdgeStore(settings.data_dir, schema=schema)
    if not settings.url:
        raise ConfigError("store.backend=qdrant needs store.url (RAGSTREAM_STORE__URL)")
    key = settings.api_key.get_secret_value() if settings.api_key else None
    return QdrantRemoteStore.connect(
        settings.url,
        api_key=key,
        prefer_grpc=settings.prefer_grpc,
        timeout=int(settings.timeout_s),
        schema=schema,
    )


def build_registry(settings: StoreSettings, store: VectorStore) -> IndexRegistry:
    """The index registry matching the store backend."""
    if isinstance(store, QdrantRemoteStore):
        return QdrantIndexRegistry(store)
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
