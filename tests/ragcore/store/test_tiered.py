"""`TieredStore`: placement rules, and isolation between partitions of one pool as a property.

The property test drives random writes at every collection with ids, tenants and partition
names taken from every other collection, then reads each collection as every tenant through
every read of the port; a model says what each must return. Real qdrant-edge shards.
"""

from __future__ import annotations

import tempfile
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from ragcore.errors import StoreError
from ragcore.sparse import Bm25Encoder
from ragcore.store.base import PARTITION, PointRecord, StoreFilter
from ragcore.store.edge import EdgeStore
from ragcore.store.ids import collection_name, parse_collection_name, point_id
from ragcore.store.qdrant_remote import CatalogEntries, QdrantRemoteStore, ServerPlacementCatalog
from ragcore.store.tiered import FilePlacementCatalog, TieredStore, is_pool, pool_name

pytestmark = pytest.mark.integration

DIM = 8
ENCODER = Bm25Encoder()
A1 = collection_name("acme", 1)
A2 = collection_name("acme", 2)
G1 = collection_name("globex", 1)
I1 = collection_name("initech", 1)
#: Three partitions of one pool (two versions of one tenant among them) and a dedicated one.
PLACED = {A1: "shared", A2: "shared", G1: "shared", I1: "dedicated"}
COLLECTIONS = tuple(PLACED)
TENANTS = ("acme", "globex", "initech")
KEYS = range(4)


def owner(collection: str) -> tuple[str, int]:
    parsed = parse_collection_name(collection)
    assert parsed is not None
    return parsed


def pid(collection: str, key: int) -> str:
    tenant, version = owner(collection)
    return point_id(tenant, f"e{key}:chunk:0", version)


def point(collection: str, key: int, tag: int) -> PointRecord:
    tenant, _ = owner(collection)
    vector = np.random.default_rng(key).normal(size=DIM).astype(np.float32)
    return PointRecord(
        pid(collection, key),
        vector,
        ENCODER.encode_document(f"entity e{key} tag {tag}"),
        {
            "tenant_id": tenant,
            "chunk_id": f"e{key}:chunk:0",
            "source_entity_id": f"e{key}",
            "tag": tag,
        },
    )


def open_store(root: Path, engine: str = "edge") -> TieredStore:
    """The tiered store on qdrant-edge (catalog in files) or on qdrant-client's local mode,
    which implements the server's API (catalog in the `rag_catalog` collection)."""
    if engine == "edge":
        return TieredStore(EdgeStore(root), FilePlacementCatalog(root))
    remote = QdrantRemoteStore.local()
    return TieredStore(remote, ServerPlacementCatalog(CatalogEntries(remote)))


@pytest.fixture
def store(tmp_path: Path) -> Iterator[TieredStore]:
    opened = open_store(tmp_path)
    for name, placement in PLACED.items():
        opened.ensure_collection(name, DIM, placement=placement)  # type: ignore[arg-type]
    yield opened
    opened.close()


# --- placement --------------------------------------------------------------------------------


def test_partitions_live_in_one_pool_and_dedicated_collections_apart(store: TieredStore) -> None:
    assert store.engine.list_collections() == [I1, pool_name(DIM)]
    assert store.list_collections() == sorted(COLLECTIONS)
    assert {name: store.placement_of(name) for name in COLLECTIONS} == PLACED
    assert store.placement_of(collection_name("nobody", 1)) is None
    assert is_pool(pool_name(DIM)) and not is_pool(A1)


def test_a_placement_changes_only_by_a_new_version(store: TieredStore) -> None:
    with pytest.raises(StoreError, match=r"is shared, not dedicated.*reindex"):
        store.ensure_collection(A1, DIM, placement="dedicated")
    with pytest.raises(StoreError, match="is dedicated, not shared"):
        store.ensure_collection(I1, DIM, placement="shared")
    with pytest.raises(StoreError, match="do not fit size 16"):
        store.ensure_collection(A1, 16, placement="shared")
    store.ensure_collection(A1, DIM, placement="shared")  # as it is: fine


def test_only_tenant_versions_can_be_shared(store: TieredStore) -> None:
    with pytest.raises(StoreError, match="cannot be shared"):
        store.ensure_collection("scratch", DIM, placement="shared")


def test_pools_cannot_be_addressed(store: TieredStore) -> None:
    pool = pool_name(DIM)
    with pytest.raises(StoreError, match="reserved"):
        store.count(pool, StoreFilter("acme"))
    with pytest.raises(StoreError, match="reserved"):
        store.drop_collection(pool)
    with pytest.raises(StoreError, match="reserved"):
        store.ensure_collection(pool, DIM)


def test_a_partition_holds_its_own_tenant_and_version_only(store: TieredStore) -> None:
    with pytest.raises(StoreError, match="partition of tenant 'acme'"):
        store.upsert(A1, [point(G1, 0, 1)])
    with pytest.raises(StoreError, match="its id is not"):
        store.upsert(A2, [point(A1, 0, 1)])  # version 1's id in version 2
    assert store.count(A1, StoreFilter("globex")) == 0
    assert store.count(A2, StoreFilter("acme")) == 0


def test_the_partition_key_is_neither_seen_nor_set_by_callers(store: TieredStore) -> None:
    forged = point(A1, 0, 1)
    forged = PointRecord(
        forged.point_id, forged.dense, forged.sparse, {**forged.payload, PARTITION: G1}
    )
    store.upsert(A1, [forged])  # the store sets the key: the point stays in A1
    assert store.count(G1, StoreFilter("acme")) == 0
    (back,) = store.retrieve(A1, [forged.point_id], "acme")
    assert PARTITION not in back.payload
    assert all(PARTITION not in p.payload for p in store.scroll(A1, StoreFilter("acme")))
    with pytest.raises(StoreError, match="cannot be updated"):
        store.update_payload(A1, [forged.point_id], {PARTITION: G1})
    with pytest.raises(ValueError, match=r"StoreFilter\.partition"):
        StoreFilter("acme", keywords={PARTITION: (G1,)})


def test_dropping_a_partition_keeps_its_neighbours(store: TieredStore) -> None:
    store.upsert(A1, [point(A1, k, 1) for k in KEYS])
    store.upsert(A2, [point(A2, k, 2) for k in KEYS])
    assert store.drop_collection(A1) is True
    assert not store.collection_exists(A1)
    assert store.count(A2, StoreFilter("acme")) == len(KEYS)
    with pytest.raises(StoreError, match="does not exist"):
        store.count(A1, StoreFilter("acme"))  # a dropped partition is gone, not empty


def test_placements_survive_a_reopen(tmp_path: Path) -> None:
    first = open_store(tmp_path)
    first.ensure_collection(A1, DIM, placement="shared")
    first.upsert(A1, [point(A1, 0, 1)])
    first.close()
    second = open_store(tmp_path)
    try:
        assert second.placement_of(A1) == "shared"
        assert second.count(A1, StoreFilter("acme")) == 1
    finally:
        second.close()


# --- isolation as a property ------------------------------------------------------------------

ids_anywhere = st.lists(
    st.tuples(st.sampled_from(COLLECTIONS), st.sampled_from(KEYS)), max_size=6
).map(lambda refs: [pid(c, k) for c, k in refs])
operation = st.one_of(
    st.tuples(st.just("upsert"), st.sampled_from(COLLECTIONS), st.sampled_from(KEYS)),
    st.tuples(st.just("delete"), st.sampled_from(COLLECTIONS), ids_anywhere),
    st.tuples(st.just("update"), st.sampled_from(COLLECTIONS), ids_anywhere),
    st.tuples(
        st.just("delete_entity"),
        st.sampled_from(COLLECTIONS),
        st.tuples(st.sampled_from(TENANTS), st.sampled_from(KEYS)),
    ),
)


@pytest.mark.parametrize("engine", ["edge", "qdrant-local"])
@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(operations=st.lists(operation, min_size=1, max_size=14))
def test_no_operation_reaches_across_partitions_or_tenants(
    engine: str, operations: list[tuple[str, str, object]]
) -> None:
    model: dict[str, dict[int, int]] = {c: {} for c in COLLECTIONS}
    with tempfile.TemporaryDirectory() as tmp:
        store = open_store(Path(tmp), engine)
        try:
            for name, placement in PLACED.items():
                store.ensure_collection(name, DIM, placement=placement)  # type: ignore[arg-type]
            for step, (kind, target, arg) in enumerate(operations, start=1):
                mine = {pid(target, k): k for k in KEYS}
                if kind == "upsert":
                    assert isinstance(arg, int)
                    store.upsert(target, [point(target, arg, step)])
                    model[target][arg] = step
                elif kind == "delete":
                    assert isinstance(arg, list)
                    store.delete_points(target, arg)
                    for k in (mine[i] for i in arg if i in mine):
                        model[target].pop(k, None)
                elif kind == "update":
                    assert isinstance(arg, list)
                    store.update_payload(target, arg, {"tag": -step})
                    for k in (mine[i] for i in arg if i in mine):
                        if k in model[target]:
                            model[target][k] = -step
                else:
                    assert isinstance(arg, tuple)
                    tenant, key = arg
                    store.delete_by_entity(target, tenant, f"e{key}")
                    if tenant == owner(target)[0]:
                        model[target].pop(key, None)
            check_reads(store, model)
        finally:
            store.close()


def check_reads(store: TieredStore, model: dict[str, dict[int, int]]) -> None:
    """Every collection read as every tenant (with a forged partition too) returns exactly the
    model's points of that collection and tenant, through every read of the port."""
    everyone = [pid(c, k) for c in COLLECTIONS for k in KEYS]
    for collection in COLLECTIONS:
        for tenant in TENANTS:
            expected = (
                {pid(collection, k): tag for k, tag in model[collection].items()}
                if tenant == owner(collection)[0]
                else {}
            )
            for forged in (None, *COLLECTIONS):
                scope = StoreFilter(tenant, partition=forged)
                scrolled = {p.point_id: p.payload["tag"] for p in store.scroll(collection, scope)}
                assert scrolled == expected, (collection, tenant, forged)
                assert store.count(collection, scope) == len(expected)
            fetched = store.retrieve(collection, everyone, tenant)
            assert {p.point_id: p.payload["tag"] for p in fetched} == expected
            scope = StoreFilter(tenant)
            dense = store.search_dense(collection, [1.0] * DIM, scope, limit=50)
            assert {h.point_id for h in dense} == set(expected)
            hybrid = store.search_hybrid(
                collection,
                [1.0] * DIM,
                ENCODER.encode_query("entity tag e0 e1 e2 e3"),
                scope,
                limit=20,
                prefetch_limit=50,
            )
            assert {h.point_id for h in (*hybrid.dense, *hybrid.sparse)} <= set(expected)
            assert {h.point_id for h in hybrid.dense} == set(expected)
            for key in KEYS:
                chunks = store.entity_chunks(collection, tenant, f"e{key}")
                assert {r.point_id for r in chunks.values()} == (
                    {pid(collection, key)} & set(expected)
                )
