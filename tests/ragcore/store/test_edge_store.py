"""The store and registry contracts on qdrant-edge (embedded), plus edge-only behaviour."""

from __future__ import annotations

import pickle
import random
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
import qdrant_edge as qe

from ragcore.store.base import VectorStore
from ragcore.store.edge import EdgeStore
from ragcore.store.registry import FileIndexRegistry, IndexRegistry
from ragcore.store.tiered import FilePlacementCatalog, TieredStore
from tests.ragcore.store.contract import (
    COLLECTION,
    DIM,
    DOCS,
    ENCODER,
    SCHEMA,
    SPEC,
    RegistryContract,
    RegistryFactory,
    StoreFactory,
    VectorStoreContract,
    acme,
    axis,
    record,
)

pytestmark = pytest.mark.integration


class TestEdgeStore(VectorStoreContract):
    @pytest.fixture
    def store_factory(self, tmp_path: Path) -> StoreFactory:
        return lambda: EdgeStore(tmp_path / "data", schema=SCHEMA)

    def test_stores_on_one_data_dir_share_open_shards(self, tmp_path: Path) -> None:
        first = EdgeStore(tmp_path, schema=SCHEMA)
        second = EdgeStore(tmp_path, schema=SCHEMA)
        try:
            first.ensure_collection(COLLECTION, DIM)
            first.upsert(COLLECTION, [record(d) for d in DOCS])
            # No WAL-lock error: the second store uses the shard the first one opened.
            assert second.count(COLLECTION, acme()) == 6
            first.close()
            assert second.count(COLLECTION, acme()) == 6
        finally:
            first.close()
            second.close()
        assert (tmp_path / "collections" / COLLECTION / "edge_config.json").is_file()

    def test_second_process_gets_a_store_error_naming_the_lock(self, tmp_path: Path) -> None:
        store = EdgeStore(tmp_path, schema=SCHEMA)
        try:
            store.ensure_collection(COLLECTION, DIM)
            script = (
                "import sys\n"
                "from ragcore.errors import StoreError\n"
                "from ragcore.store.edge import EdgeStore\n"
                "from ragcore.store.base import StoreFilter\n"
                f"s = EdgeStore({str(tmp_path)!r})\n"
                "try:\n"
                f"    s.count({COLLECTION!r}, StoreFilter('acme'))\n"
                "except StoreError as e:\n"
                "    print(e); sys.exit(3)\n"
            )
            done = subprocess.run(
                [sys.executable, "-c", script],
                check=False,
                capture_output=True,
                text=True,
                timeout=60,
            )
            assert done.returncode == 3, done.stderr
            assert "one process" in done.stdout
        finally:
            store.close()

    def test_optimize_builds_indexes_and_keeps_results(self, tmp_path: Path) -> None:
        store = EdgeStore(tmp_path, schema=SCHEMA)
        try:
            store.ensure_collection(COLLECTION, DIM)
            store.upsert(COLLECTION, [record(d) for d in DOCS])
            before = [
                h.point_id
                for h in store.search_dense(COLLECTION, [1.0] + [0.0] * (DIM - 1), acme(), limit=6)
            ]
            assert isinstance(store.optimize(COLLECTION), bool)
            after = [
                h.point_id
                for h in store.search_dense(COLLECTION, [1.0] + [0.0] * (DIM - 1), acme(), limit=6)
            ]
            assert after == before
        finally:
            store.close()

    def test_a_point_both_hybrid_branches_found_is_read_and_pickled_once(
        self, tmp_path: Path
    ) -> None:
        # the sparse branch's hit of a point the dense branch found shares its payload: one
        # conversion from the engine, one copy in the store host's pickled reply
        store = EdgeStore(tmp_path, schema=SCHEMA)
        try:
            store.ensure_collection(COLLECTION, DIM)
            store.upsert(COLLECTION, [record(d) for d in DOCS])
            result = store.search_hybrid(
                COLLECTION,
                axis(0),
                ENCODER.encode_query("billing"),
                acme(),
                limit=6,
                prefetch_limit=6,
                sparse_dense_scores=True,
            )
            dense = {h.point_id: h for h in result.dense}
            shared = [h for h in result.sparse if h.point_id in dense]
            assert shared and len(shared) < len(result.sparse) + len(result.dense)
            for hit in shared:
                assert hit.payload is dense[hit.point_id].payload
            back = pickle.loads(pickle.dumps(result))
            again = {h.point_id: h for h in back.dense}
            for hit in back.sparse:
                if hit.point_id in again:
                    assert hit.payload is again[hit.point_id].payload
            assert back.sparse == result.sparse and back.dense == result.dense
        finally:
            store.close()

    def test_a_shard_half_created_in_place_is_removed_and_created(self, tmp_path: Path) -> None:
        # what an in-place creation killed before the engine wrote its config leaves (and what
        # a worker killed during a tenant's first write left before creation was staged)
        path = tmp_path / "collections" / COLLECTION
        config = qe.EdgeConfig(
            vectors={"dense": qe.EdgeVectorParams(size=DIM, distance=qe.Distance.Cosine)}
        )
        qe.EdgeShard.create(str(path), config).close()
        (path / "edge_config.json").unlink()
        store = EdgeStore(tmp_path, schema=SCHEMA)
        try:
            assert not store.collection_exists(COLLECTION)
            store.ensure_collection(COLLECTION, DIM)
            store.upsert(COLLECTION, [record(d) for d in DOCS])
            assert store.count(COLLECTION, acme()) == 6
        finally:
            store.close()

    def test_a_process_killed_while_creating_shards_leaves_every_one_creatable(
        self, tmp_path: Path
    ) -> None:
        # Real SIGKILLs at random moments of a loop of creations: the engine writes its config
        # last, so most kills land inside a creation (14 of 20 left a directory without a config
        # when shards were created in place, and the engine refuses to create over one).
        script = (
            "import sys\n"
            "from ragcore.store.edge import EdgeStore\n"
            f"s = EdgeStore({str(tmp_path)!r})\n"
            "print('ready', flush=True)\n"
            "for i in range(100000):\n"
            "    name = f'rag__k{sys.argv[1]}x{i}__v1'\n"
            "    print(name, flush=True)\n"
            f"    s.ensure_collection(name, {DIM})\n"
        )
        rng = random.Random(7)
        attempted: list[str] = []
        for round_ in range(12):
            proc = subprocess.Popen(
                [sys.executable, "-c", script, str(round_)], stdout=subprocess.PIPE, text=True
            )
            assert proc.stdout is not None
            assert proc.stdout.readline().strip() == "ready"
            time.sleep(rng.uniform(0.05, 0.6))
            proc.send_signal(signal.SIGKILL)
            proc.wait(10)
            attempted += proc.stdout.read().split()
        assert len(attempted) >= 12  # each round was killed inside or after a creation
        store = EdgeStore(tmp_path, schema=SCHEMA)
        try:
            for name in attempted:
                store.ensure_collection(name, DIM)
            store.upsert(attempted[-1], [record(d) for d in DOCS])
            assert store.count(attempted[-1], acme()) == 6
            assert set(store.list_collections()) == set(attempted)
        finally:
            store.close()

    def test_collection_names_cannot_escape_the_data_dir(self, tmp_path: Path) -> None:
        from ragcore.errors import StoreError

        store = EdgeStore(tmp_path / "data")
        try:
            for name in ("../evil", "a/b", ".hidden", ""):
                with pytest.raises(StoreError, match="invalid collection name"):
                    store.ensure_collection(name, DIM)
        finally:
            store.close()
        assert not (tmp_path / "evil").exists()


class TestFileIndexRegistry(RegistryContract):
    @pytest.fixture
    def registry_factory(self, tmp_path: Path) -> Iterator[RegistryFactory]:
        stores: list[EdgeStore] = []

        def make() -> IndexRegistry:
            store = EdgeStore(tmp_path, schema=SCHEMA)
            stores.append(store)
            return FileIndexRegistry(tmp_path, store)

        yield make
        for store in stores:
            store.close()

    def test_active_pointer_is_a_file_replaced_atomically(
        self, registry: IndexRegistry, tmp_path: Path
    ) -> None:
        registry.create_version("acme", SPEC)
        registry.mark_ready("acme", 1, total_vectors=0)
        registry.activate("acme", 1)
        tenant_dir = tmp_path / "registry" / "acme"
        assert (tenant_dir / "active").read_text() == "1\n"
        assert sorted(p.name for p in tenant_dir.iterdir()) == ["active", "v1.json"]
        assert (tmp_path / "collections" / "rag__acme__v1").is_dir()

    def test_corrupt_manifest_is_a_store_error(
        self, registry: IndexRegistry, tmp_path: Path
    ) -> None:
        from ragcore.errors import StoreError

        registry.create_version("acme", SPEC)
        (tmp_path / "registry" / "acme" / "v1.json").write_text("{not json")
        with pytest.raises(StoreError, match="corrupt manifest"):
            registry.open_version("acme", 1, SPEC)

    def test_rejected_tenant_leaves_nothing_on_disk(
        self, registry: IndexRegistry, tmp_path: Path
    ) -> None:
        from ragcore.errors import InvalidTenantError

        with pytest.raises(InvalidTenantError):
            registry.create_version("../escape", SPEC)
        assert not (tmp_path / "escape").exists()
        assert not (tmp_path / "registry").exists()


class TestTieredStoreShared(VectorStoreContract):
    """The same contract with every collection a partition of one shared pool."""

    one_tenant_per_collection = True

    @pytest.fixture
    def store_factory(self, tmp_path: Path) -> StoreFactory:
        return lambda: TieredStore(
            EdgeStore(tmp_path / "data", schema=SCHEMA),
            FilePlacementCatalog(tmp_path / "data"),
            default_placement="shared",
        )

    def test_all_tenants_share_one_engine_collection(self, loaded: VectorStore) -> None:
        assert isinstance(loaded, TieredStore)
        assert loaded.engine.list_collections() == ["rag_pool__d8"]
        assert loaded.list_collections() == [COLLECTION, "rag__globex__v1"]
