"""Conformance suite every `PlacementCatalog` implementation must pass.

Subclass `PlacementCatalogContract` and override `catalog_factory`: a callable that opens the
catalog on one fixed location, so durability can be checked by opening it again.
"""

from __future__ import annotations

from collections.abc import Callable

import pytest

from ragcore.store.tiered import PlacementCatalog, pool_name

CatalogFactory = Callable[[], PlacementCatalog]
POOL = pool_name(8)
OTHER_POOL = pool_name(8, sparse=False)


class PlacementCatalogContract:
    """What `TieredStore` relies on: partitions recorded durably, looked up, listed, forgotten."""

    @pytest.fixture
    def catalog_factory(self) -> CatalogFactory:
        raise NotImplementedError("subclasses provide the catalog_factory fixture")

    def test_an_empty_catalog_holds_no_partition(self, catalog_factory: CatalogFactory) -> None:
        catalog = catalog_factory()
        assert catalog.partitions() == {}
        assert catalog.pool_of("rag__acme__v1") is None

    def test_an_added_partition_is_found_and_listed_with_its_pool(
        self, catalog_factory: CatalogFactory
    ) -> None:
        catalog = catalog_factory()
        catalog.add("rag__acme__v1", POOL)
        catalog.add("rag__globex__v2", OTHER_POOL)
        assert catalog.pool_of("rag__acme__v1") == POOL
        assert catalog.pool_of("rag__globex__v2") == OTHER_POOL
        assert catalog.pool_of("rag__acme__v2") is None
        assert catalog.partitions() == {"rag__acme__v1": POOL, "rag__globex__v2": OTHER_POOL}

    def test_a_removed_partition_is_forgotten_and_removing_an_unknown_one_is_no_error(
        self, catalog_factory: CatalogFactory
    ) -> None:
        catalog = catalog_factory()
        catalog.add("rag__acme__v1", POOL)
        catalog.add("rag__acme__v2", POOL)
        catalog.remove("rag__acme__v1")
        catalog.remove("rag__nobody__v9")
        assert catalog.pool_of("rag__acme__v1") is None
        assert catalog.partitions() == {"rag__acme__v2": POOL}

    def test_partitions_outlive_the_catalog_object(self, catalog_factory: CatalogFactory) -> None:
        first = catalog_factory()
        first.add("rag__acme__v1", POOL)
        first.add("rag__acme__v2", POOL)
        first.remove("rag__acme__v2")
        again = catalog_factory()
        assert again.partitions() == {"rag__acme__v1": POOL}
        assert again.pool_of("rag__acme__v1") == POOL
        assert again.pool_of("rag__acme__v2") is None
