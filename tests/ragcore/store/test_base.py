"""Validation of the port's value types."""

from __future__ import annotations

import pickle
from datetime import UTC, datetime

import numpy as np
import pytest

from ragcore.errors import InvalidTenantError, StoreError
from ragcore.store.base import (
    HybridResult,
    PayloadSchema,
    PointRecord,
    Range,
    ScoredHit,
    SparseVector,
    StoredPoint,
    StoreFilter,
    check_tenant,
    chunk_manifest,
)
from ragcore.store.ids import point_id

pytestmark = pytest.mark.unit

PAYLOAD = {"tenant_id": "acme", "chunk_id": "e1:chunk:0", "source_entity_id": "e1"}


def test_sparse_vector_requires_increasing_indices() -> None:
    assert SparseVector.from_mapping({5: 1.0, 2: 0.5}).indices == (2, 5)
    for indices, values in (((2, 2), (1.0, 1.0)), ((3, 1), (1.0, 1.0)), ((1,), (1.0, 2.0))):
        with pytest.raises(ValueError):
            SparseVector(indices, values)
    with pytest.raises(ValueError, match="finite"):
        SparseVector((1,), (float("inf"),))
    with pytest.raises(ValueError):
        SparseVector((2**32,), (1.0,))


def test_point_record_requires_uuid_and_identity_payload() -> None:
    pid = point_id("acme", "e1:chunk:0", 1)
    record = PointRecord(pid, [1.0, 0.0], None, PAYLOAD)
    assert record.dense_array().dtype == np.float32
    assert (record.tenant_id, record.chunk_id) == ("acme", "e1:chunk:0")
    with pytest.raises(ValueError, match="UUID"):
        PointRecord("e1:chunk:0", [1.0], None, PAYLOAD)
    with pytest.raises(ValueError, match="UUID"):
        PointRecord(pid.upper(), [1.0], None, PAYLOAD)
    for missing in PAYLOAD:
        payload = {k: v for k, v in PAYLOAD.items() if k != missing}
        with pytest.raises(ValueError, match=missing):
            PointRecord(pid, [1.0], None, payload)
    with pytest.raises(InvalidTenantError):
        PointRecord(pid, [1.0], None, {**PAYLOAD, "tenant_id": "../x"})


def test_range_bounds_must_be_one_kind_and_timezone_aware() -> None:
    assert Range(gte=datetime(2024, 1, 1, tzinfo=UTC)).is_datetime
    assert not Range(lt=3).is_datetime
    with pytest.raises(ValueError, match="at least one"):
        Range()
    with pytest.raises(ValueError, match="mixes"):
        Range(gte=1.0, lt=datetime(2024, 1, 1, tzinfo=UTC))
    with pytest.raises(ValueError, match="timezone"):
        Range(gte=datetime(2024, 1, 1))


def test_store_filter_requires_a_tenant_and_sane_criteria() -> None:
    with pytest.raises(InvalidTenantError):
        StoreFilter(tenant_id="Acme")
    with pytest.raises(ValueError, match="tenant_id"):
        StoreFilter("acme", keywords={"tenant_id": ("globex",)})
    with pytest.raises(ValueError, match="no allowed values"):
        StoreFilter("acme", keywords={"priority": ()})
    with pytest.raises(ValueError, match="all str"):
        StoreFilter("acme", keywords={"priority": ("high", 1)})
    with pytest.raises(ValueError, match="tenant_id"):
        StoreFilter("acme", ranges={"tenant_id": Range(gte=1)})


def test_payload_schema_checks_filters() -> None:
    schema = PayloadSchema(keyword_fields=("priority",))
    schema.check_filter(StoreFilter("acme", keywords={"priority": ("high",)}))
    schema.check_filter(StoreFilter("acme", keywords={"entity_type": ("doc",)}))
    with pytest.raises(ValueError, match="undeclared"):
        schema.check_filter(StoreFilter("acme", keywords={"colour": ("red",)}))
    with pytest.raises(ValueError, match="undeclared"):
        schema.check_filter(StoreFilter("acme", ranges={"price": Range(gte=1)}))
    with pytest.raises(ValueError, match="both"):
        PayloadSchema(keyword_fields=("event_date",))


def test_check_tenant_raises_on_a_foreign_hit() -> None:
    hits = [ScoredHit("p1", 1.0, {"tenant_id": "acme"}), ScoredHit("p2", 0.5, {"tenant_id": "x"})]
    check_tenant(hits[:1], "acme")
    with pytest.raises(StoreError, match="tenant isolation"):
        check_tenant(hits, "acme")


def test_chunk_manifest_refuses_two_points_for_one_chunk() -> None:
    points = [
        StoredPoint("p1", {**PAYLOAD, "source_hash": "h"}),
        StoredPoint("p2", PAYLOAD),
    ]
    manifest = chunk_manifest(points[:1])
    assert manifest["e1:chunk:0"].source_hash == "h"
    with pytest.raises(StoreError, match="held by points p1 and p2"):
        chunk_manifest(points)


def test_hybrid_result_fuses_to_its_limit() -> None:
    dense = tuple(ScoredHit(f"d{i}", 1.0 - i / 10, {"chunk_id": f"d{i}"}) for i in range(5))
    sparse = tuple(ScoredHit(f"s{i}", 5.0 - i, {"chunk_id": f"s{i}"}) for i in range(5))
    fused = HybridResult(dense, sparse, limit=3).fused(dense_weight=1.0, sparse_weight=0.5)
    assert [h.point_id for h in fused] == ["d0", "d1", "d2"]


def test_hits_and_points_pickle_to_equal_values() -> None:
    # the store host sends them to other processes by pickle (`ScoredHit.__reduce__`)
    vector = np.arange(4, dtype=np.float32)
    sparse = SparseVector((1, 7), (0.5, 2.0))
    values: list[ScoredHit | StoredPoint] = [
        ScoredHit("p1", 0.25, PAYLOAD),
        ScoredHit("p2", 0.5, PAYLOAD, vector, 0.125),
        StoredPoint("p1", PAYLOAD),
        StoredPoint("p2", PAYLOAD, vector, sparse),
    ]
    for value in values:
        back = pickle.loads(pickle.dumps(value))
        assert type(back) is type(value)
        for name in value.__dataclass_fields__:
            mine, theirs = getattr(value, name), getattr(back, name)
            if isinstance(mine, np.ndarray):
                assert isinstance(theirs, np.ndarray) and np.array_equal(theirs, mine)
            else:
                assert theirs == mine
