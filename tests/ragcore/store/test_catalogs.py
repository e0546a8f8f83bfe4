"""The placement catalog contract against both backends: the embedded data dir's files and a
Qdrant server's catalog collection (qdrant-client, persisted on disk)."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from ragcore.store.qdrant_remote import CatalogEntries, QdrantRemoteStore, ServerPlacementCatalog
from ragcore.store.tiered import FilePlacementCatalog
from tests.ragcore.store.catalog_contract import CatalogFactory, PlacementCatalogContract
from tests.ragcore.store.contract import SCHEMA


@pytest.mark.unit
class TestFilePlacementCatalog(PlacementCatalogContract):
    @pytest.fixture
    def catalog_factory(self, tmp_path: Path) -> CatalogFactory:
        return lambda: FilePlacementCatalog(tmp_path / "data")


@pytest.mark.integration
class TestServerPlacementCatalog(PlacementCatalogContract):
    @pytest.fixture
    def catalog_factory(self, tmp_path: Path) -> Iterator[CatalogFactory]:
        # One client per location (qdrant-client's local mode locks its directory); each
        # catalog object starts with an empty lookup cache, as another process would.
        remote = QdrantRemoteStore.local(tmp_path / "qdrant", schema=SCHEMA)
        yield lambda: ServerPlacementCatalog(CatalogEntries(remote))
        remote.close()
