"""The store and registry contracts on qdrant-client: local mode always, a server when asked.

Local mode implements the server's API semantics (brute force). The `TestQdrantServer*` classes
run the same contracts against a real server when `TEST_QDRANT_URL` is set (e.g.
`http://localhost:6333`, with `TEST_QDRANT_API_KEY` if needed); they are `external`.
"""

from __future__ import annotations

import os
import socket
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
from qdrant_client import models
from qdrant_client.common.client_exceptions import ResourceExhaustedResponse
from qdrant_client.http.exceptions import UnexpectedResponse

from ragcore.embedders.spec import EmbeddingSpec
from ragcore.errors import ManifestMismatchError, StoreError, StoreUnavailableError
from ragcore.store.base import Placement, StoreFilter, VectorStore
from ragcore.store.ids import CATALOG_COLLECTION
from ragcore.store.qdrant_remote import (
    CatalogEntries,
    QdrantRemoteStore,
    ServerPlacementCatalog,
    translate_error,
)
from ragcore.store.registry import (
    MANIFEST_KEY,
    IndexManifest,
    IndexRegistry,
    QdrantIndexRegistry,
)
from ragcore.store.tiered import TieredStore
from tests.ragcore.store.contract import (
    DIM,
    SCHEMA,
    SPEC,
    RegistryContract,
    RegistryFactory,
    StoreFactory,
    VectorStoreContract,
)

SERVER_URL = os.environ.get("TEST_QDRANT_URL")
SERVER_API_KEY = os.environ.get("TEST_QDRANT_API_KEY")
TEST_TENANTS = ("acme", "globex", "bulk")


@pytest.mark.integration
class TestQdrantLocalStore(VectorStoreContract):
    @pytest.fixture
    def store_factory(self, tmp_path: Path) -> StoreFactory:
        # `path=` mode persists (one SQLite write per point: keep point counts small).
        return lambda: QdrantRemoteStore.local(tmp_path / "qdrant", schema=SCHEMA)

    @pytest.fixture
    def store(self) -> Iterator[VectorStore]:
        store = QdrantRemoteStore.local(schema=SCHEMA)  # in memory: fast
        yield store
        store.close()


def tiered(remote: QdrantRemoteStore) -> TieredStore:
    """The store `build_store` makes for a Qdrant server, new collections shared."""
    return TieredStore(
        remote, ServerPlacementCatalog(CatalogEntries(remote)), default_placement="shared"
    )


@pytest.mark.integration
class TestTieredStoreOnQdrantLocal(VectorStoreContract):
    """The contract with every collection a partition of one shared pool on qdrant-client,
    partitions recorded in the server's catalog collection: the engine-side scoping of the
    server adapter (filters, ids within a partition) and the server catalog."""

    one_tenant_per_collection = True

    @pytest.fixture
    def store_factory(self, tmp_path: Path) -> StoreFactory:
        return lambda: tiered(QdrantRemoteStore.local(tmp_path / "qdrant", schema=SCHEMA))

    @pytest.fixture
    def store(self) -> Iterator[VectorStore]:
        store = tiered(QdrantRemoteStore.local(schema=SCHEMA))  # in memory: fast
        yield store
        store.close()

    def test_the_catalog_collection_is_reserved(self, loaded: VectorStore) -> None:
        assert isinstance(loaded, TieredStore)
        assert CATALOG_COLLECTION in loaded.engine.list_collections()
        assert CATALOG_COLLECTION not in loaded.list_collections()
        with pytest.raises(StoreError, match="reserved"):
            loaded.count(CATALOG_COLLECTION, StoreFilter("acme"))


class SharedFirstRegistry(QdrantIndexRegistry):
    """The server registry creating shared versions unless told otherwise (for the contract,
    whose calls name no placement)."""

    def create_version(
        self,
        tenant: str,
        spec: EmbeddingSpec,
        *,
        sparse_encoder: str | None = None,
        placement: Placement = "shared",
    ) -> IndexManifest:
        return super().create_version(
            tenant, spec, sparse_encoder=sparse_encoder, placement=placement
        )


def shared_registry(remote: QdrantRemoteStore) -> SharedFirstRegistry:
    store = tiered(remote)
    return SharedFirstRegistry(remote, store=store, entries=CatalogEntries(remote))


@pytest.mark.integration
class TestQdrantLocalSharedRegistry(RegistryContract):
    """The registry contract with every version a partition, on the server registry."""

    @pytest.fixture
    def registry_factory(self, tmp_path: Path) -> Iterator[RegistryFactory]:
        remote = QdrantRemoteStore.local(tmp_path / "qdrant", schema=SCHEMA)
        yield lambda: shared_registry(remote)
        remote.close()

    def test_a_shared_version_lives_in_catalog_entries_and_has_no_alias(
        self, registry: IndexRegistry
    ) -> None:
        assert isinstance(registry, SharedFirstRegistry)
        registry.create_version("acme", SPEC)
        registry.mark_ready("acme", 1, total_vectors=3)
        registry.activate("acme", 1)
        remote = registry._catalog
        assert isinstance(remote, QdrantRemoteStore)
        assert remote.alias_target("rag__acme") is None
        assert not remote.collection_exists("rag__acme__v1")
        entries = CatalogEntries(remote)
        assert entries.get("manifest", "rag__acme__v1")["status"] == "ready"
        assert entries.get("active", "acme") == 1
        assert entries.get("partition", "rag__acme__v1") == {"pool": "rag_pool__d8"}


@pytest.mark.integration
def test_the_active_pointer_moves_between_placements_atomically(tmp_path: Path) -> None:
    """Promotion (shared -> dedicated), rollback (-> shared) and dropping a shared version on
    the server registry; the alias decides whenever it exists."""
    remote = QdrantRemoteStore.local(schema=SCHEMA)
    try:
        registry = shared_registry(remote)
        store = registry._store
        assert isinstance(store, TieredStore)
        registry.create_version("acme", SPEC)  # shared
        registry.mark_ready("acme", 1, total_vectors=0)
        registry.activate("acme", 1)
        registry.save_calibration("acme", 1, '{"fitted": 1}')
        assert registry.create_version("acme", SPEC, placement="dedicated").version == 2
        registry.mark_ready("acme", 2, total_vectors=0)
        registry.activate("acme", 2)
        assert remote.alias_target("rag__acme") == "rag__acme__v2"
        assert CatalogEntries(remote).get("active", "acme") is None
        assert registry.lookup("acme", None).version == 2
        registry.activate("acme", 1)  # back to the shared version
        assert remote.alias_target("rag__acme") is None
        assert registry.lookup("acme", None).manifest.placement == "shared"
        assert registry.load_calibration("acme", 1) == '{"fitted": 1}'
        assert [m.placement for m in registry.list_versions("acme")] == ["shared", "dedicated"]
        registry.activate("acme", 2)
        registry.retire("acme", 1)
        assert store.drop_collection("rag__acme__v1") is True
        # the partition went with its manifest and calibration, as a collection's metadata does
        assert [m.version for m in registry.list_versions("acme")] == [2]
        assert registry.list_tenants() == ["acme"]
    finally:
        remote.close()


@pytest.mark.integration
class TestQdrantLocalRegistry(RegistryContract):
    @pytest.fixture
    def registry_factory(self, tmp_path: Path) -> Iterator[RegistryFactory]:
        store = QdrantRemoteStore.local(tmp_path / "qdrant", schema=SCHEMA)
        yield lambda: QdrantIndexRegistry(store)
        store.close()

    def test_manifest_lives_in_collection_metadata_and_alias_is_the_pointer(
        self, registry: IndexRegistry
    ) -> None:
        registry.create_version("acme", SPEC)
        registry.mark_ready("acme", 1, total_vectors=3)
        registry.activate("acme", 1)
        assert isinstance(registry, QdrantIndexRegistry)
        store = registry._catalog
        assert store.collection_metadata("rag__acme__v1")[MANIFEST_KEY]["status"] == "ready"
        assert store.alias_target("rag__acme") == "rag__acme__v1"

    def test_collection_without_manifest_cannot_be_opened(
        self, registry_factory: RegistryFactory
    ) -> None:
        registry = registry_factory()
        assert isinstance(registry, QdrantIndexRegistry)
        registry._catalog.ensure_collection("rag__acme__v1", DIM)  # made by someone else
        with pytest.raises(ManifestMismatchError, match="without a ragstream manifest"):
            registry.open_version("acme", 1, SPEC)
        # The next version number skips the foreign collection instead of adopting it.
        assert registry.create_version("acme", SPEC).version == 2

    def test_a_request_resolves_the_active_version_in_two_calls_whatever_the_aliases(
        self, registry: IndexRegistry, monkeypatch: pytest.MonkeyPatch
    ) -> None:
        assert isinstance(registry, QdrantIndexRegistry)
        for tenant in ("acme", *(f"t{n}" for n in range(6))):
            registry.create_version(tenant, SPEC)
            registry.mark_ready(tenant, 1, total_vectors=1)
            registry.activate(tenant, 1)
        client = registry._catalog._client  # type: ignore[attr-defined]
        calls: list[str] = []
        for name in ("get_aliases", "collection_exists", "get_collection", "get_collections"):
            original = getattr(client, name)

            def counted(*args: object, _name: str = name, _fn: object = original) -> object:
                calls.append(_name)
                return _fn(*args)  # type: ignore[operator]

            monkeypatch.setattr(client, name, counted)
        resolved = registry.lookup("acme", None)
        assert (resolved.version, resolved.active) == (1, True)
        # the server resolves the alias: no listing of every alias per request
        assert calls == ["collection_exists", "get_collection"]
        calls.clear()
        assert registry.lookup("acme", 1).active
        assert calls == ["collection_exists", "get_collection"]

    def test_an_alias_is_trusted_only_with_its_own_tenants_manifest(
        self, registry: IndexRegistry
    ) -> None:
        assert isinstance(registry, QdrantIndexRegistry)
        registry.create_version("globex", SPEC)
        catalog = registry._catalog
        catalog.switch_alias("rag__acme", "rag__globex__v1")  # pointed at another tenant's
        with pytest.raises(StoreError, match="foreign collection"):
            registry.lookup("acme", None)
        catalog.ensure_collection("other", DIM)  # no manifest
        catalog.switch_alias("rag__acme", "other")
        with pytest.raises(ManifestMismatchError, match="without a ragstream manifest"):
            registry.lookup("acme", None)


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


@pytest.mark.integration
@pytest.mark.parametrize("prefer_grpc", [False, True])
def test_unreachable_server_is_store_unavailable(prefer_grpc: bool) -> None:
    port = _free_port()  # nothing listens there: connection refused
    store = QdrantRemoteStore.connect(
        f"http://127.0.0.1:{port}", prefer_grpc=prefer_grpc, timeout=2
    )
    try:
        with pytest.raises(StoreUnavailableError):
            store.count("rag__acme__v1", StoreFilter("acme"))
    finally:
        store.close()


@pytest.mark.unit
def test_vendor_errors_translate_by_kind() -> None:
    headers = httpx.Headers({"Retry-After": "7"})
    busy = translate_error("upsert", UnexpectedResponse(503, "Unavailable", b"", headers))
    assert isinstance(busy, StoreUnavailableError)
    assert busy.retry_after == 7.0
    bad = translate_error("upsert", UnexpectedResponse(400, "Bad Request", b"wrong dim", headers))
    assert type(bad) is StoreError
    assert "wrong dim" in bad.message
    limited = translate_error("upsert", ResourceExhaustedResponse("slow down", 3))
    assert isinstance(limited, StoreUnavailableError)
    assert limited.retry_after == 3.0
    assert isinstance(translate_error("x", TimeoutError("t")), StoreUnavailableError)
    other = translate_error("query", ValueError("Collection nope not found"))
    assert type(other) is StoreError
    assert "nope" in other.message


def _server_store() -> QdrantRemoteStore:
    assert SERVER_URL is not None
    return QdrantRemoteStore.connect(SERVER_URL, api_key=SERVER_API_KEY, schema=SCHEMA)


def _clean_server() -> None:
    store = _server_store()
    try:
        for tenant in TEST_TENANTS:
            alias = f"rag__{tenant}"
            if store.alias_target(alias) is not None:
                store.client.update_collection_aliases(
                    change_aliases_operations=[
                        models.DeleteAliasOperation(
                            delete_alias=models.DeleteAlias(alias_name=alias)
                        )
                    ]
                )
        for name in store.list_collections():
            if any(name.startswith(f"rag__{tenant}__") for tenant in TEST_TENANTS):
                store.drop_collection(name)
    finally:
        store.close()


needs_server = pytest.mark.skipif(
    SERVER_URL is None, reason="set TEST_QDRANT_URL to run the contracts against a Qdrant server"
)


@needs_server
@pytest.mark.external
class TestQdrantServerStore(VectorStoreContract):
    @pytest.fixture
    def store_factory(self) -> Iterator[StoreFactory]:
        _clean_server()
        yield _server_store
        _clean_server()


@needs_server
@pytest.mark.external
class TestQdrantServerRegistry(RegistryContract):
    @pytest.fixture
    def registry_factory(self) -> Iterator[RegistryFactory]:
        _clean_server()
        stores: list[QdrantRemoteStore] = []

        def make() -> IndexRegistry:
            stores.append(_server_store())
            return QdrantIndexRegistry(stores[-1])

        yield make
        for store in stores:
            store.close()
        _clean_server()


@pytest.mark.integration
def test_reads_of_dedicated_collections_never_create_the_catalog() -> None:
    """A server deployment without shared versions (or a reader without the right to create
    collections) never gets a `rag_catalog` collection from lookups alone."""
    remote = QdrantRemoteStore.local(schema=SCHEMA)
    try:
        store = TieredStore(remote, ServerPlacementCatalog(CatalogEntries(remote)))
        store.ensure_collection("rag__acme__v1", DIM, placement="dedicated")
        assert store.count("rag__acme__v1", StoreFilter("acme")) == 0
        assert store.placement_of("rag__acme__v1") == "dedicated"
        assert store.list_collections() == ["rag__acme__v1"]
        assert remote.list_collections() == ["rag__acme__v1"]
    finally:
        remote.close()
