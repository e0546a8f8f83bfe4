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

from ragcore.errors import ManifestMismatchError, StoreError, StoreUnavailableError
from ragcore.store.base import StoreFilter, VectorStore
from ragcore.store.qdrant_remote import QdrantRemoteStore, translate_error
from ragcore.store.registry import MANIFEST_KEY, IndexRegistry, QdrantIndexRegistry
from ragcore.store.tiered import FilePlacementCatalog, TieredStore
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


@pytest.mark.integration
class TestTieredStoreOnQdrantLocal(VectorStoreContract):
    """The contract with every collection a partition of one shared pool on qdrant-client:
    the engine-side scoping of the server adapter (filters, ids within a partition)."""

    one_tenant_per_collection = True

    @pytest.fixture
    def store_factory(self, tmp_path: Path) -> StoreFactory:
        return lambda: TieredStore(
            QdrantRemoteStore.local(tmp_path / "qdrant", schema=SCHEMA),
            FilePlacementCatalog(tmp_path),
            default_placement="shared",
        )

    @pytest.fixture
    def store(self, tmp_path: Path) -> Iterator[VectorStore]:
        store = TieredStore(
            QdrantRemoteStore.local(schema=SCHEMA),
            FilePlacementCatalog(tmp_path),
            default_placement="shared",
        )
        yield store
        store.close()


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
