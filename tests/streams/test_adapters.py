"""Index targets resolved from the registry: first sight, interrupted bootstraps, mismatches."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from ragcore.embedders.spec import EmbeddingSpec
from ragcore.errors import ManifestMismatchError
from ragcore.sparse import Bm25Encoder
from ragcore.store.edge import EdgeStore
from ragcore.store.registry import FileIndexRegistry
from streams.adapters import RegistryTargets

SPEC = EmbeddingSpec(name="m", version="1", dimension=8, max_input_tokens=64, tokenizer="t")
OTHER = SPEC.model_copy(update={"version": "2"})
SPARSE = Bm25Encoder()

pytestmark = pytest.mark.integration


@pytest.fixture
def store(tmp_path: Path) -> Iterator[EdgeStore]:
    s = EdgeStore(tmp_path)
    yield s
    s.close()


def test_first_sight_of_a_tenant_creates_and_activates_version_one(
    store: EdgeStore, tmp_path: Path
) -> None:
    registry = FileIndexRegistry(tmp_path, store)
    targets = RegistryTargets(registry, [SPEC], SPARSE, store).write_targets("acme")
    assert [(t.collection, t.version) for t in targets] == [("rag__acme__v1", 1)]
    assert registry.active_version("acme") == 1
    assert store.collection_exists("rag__acme__v1")


def test_interrupted_bootstrap_is_resumed_not_duplicated(store: EdgeStore, tmp_path: Path) -> None:
    registry = FileIndexRegistry(tmp_path, store)
    registry.create_version("acme", SPEC, sparse_encoder=SPARSE.model_version)  # then: crash
    store.drop_collection("rag__acme__v1")  # even the collection creation was lost
    targets = RegistryTargets(registry, [SPEC], SPARSE, store).write_targets("acme")
    assert [t.version for t in targets] == [1]
    assert registry.active_version("acme") == 1
    assert [m.version for m in registry.list_versions("acme")] == [1]
    assert store.collection_exists("rag__acme__v1")


def test_building_version_of_the_same_model_is_written_too(
    store: EdgeStore, tmp_path: Path
) -> None:
    registry = FileIndexRegistry(tmp_path, store)
    resolver = RegistryTargets(registry, [SPEC], SPARSE, store, ttl_s=0)
    resolver.write_targets("acme")
    registry.create_version("acme", SPEC, sparse_encoder=SPARSE.model_version)
    registry.create_version("acme", OTHER, sparse_encoder=SPARSE.model_version)
    assert [t.version for t in resolver.write_targets("acme")] == [1, 2]


def test_worker_with_another_model_refuses_to_write_the_active_index(
    store: EdgeStore, tmp_path: Path
) -> None:
    registry = FileIndexRegistry(tmp_path, store)
    RegistryTargets(registry, [SPEC], SPARSE, store).write_targets("acme")
    with pytest.raises(ManifestMismatchError, match=r"built with m@1.*holds m@2"):
        RegistryTargets(registry, [OTHER], SPARSE, store).write_targets("acme")


def test_worker_holding_the_next_model_writes_both_versions_each_with_its_model(
    store: EdgeStore, tmp_path: Path
) -> None:
    registry = FileIndexRegistry(tmp_path, store)
    resolver = RegistryTargets(registry, [SPEC, OTHER], SPARSE, store, ttl_s=0)
    resolver.write_targets("acme")
    registry.create_version("acme", OTHER, sparse_encoder=SPARSE.model_version)
    targets = resolver.write_targets("acme")
    assert [(t.version, t.model_version) for t in targets] == [(1, "m@1"), (2, "m@2")]
    # after the switch the old version is still written during its grace period (pinned
    # readers, rollback), and no longer once it is retired
    registry.mark_ready("acme", 2, total_vectors=0)
    registry.activate("acme", 2)
    targets = resolver.write_targets("acme")
    assert [(t.version, t.model_version) for t in targets] == [(1, "m@1"), (2, "m@2")]
    registry.retire("acme", 1)
    assert [(t.version, t.model_version) for t in resolver.write_targets("acme")] == [(2, "m@2")]
    # a worker that was not given the next model refuses to write the active index
    with pytest.raises(
        ManifestMismatchError, match="rag__acme__v2 \\(active\\) was built with m@2"
    ):
        RegistryTargets(registry, [SPEC], SPARSE, store).write_targets("acme")
