"""Point ids, tenant names, collection and alias names."""

from __future__ import annotations

import uuid

import pytest

from ragcore.errors import InvalidTenantError, StoreError
from ragcore.store.ids import (
    POINT_NAMESPACE,
    alias_name,
    collection_name,
    parse_collection_name,
    point_id,
    validate_collection_name,
    validate_tenant,
)

pytestmark = pytest.mark.unit


def test_point_id_is_a_pinned_uuid5_of_the_triple() -> None:
    value = point_id("acme", "e1:chunk:0", 1)
    # Pinned: changing the namespace or encoding would re-key every index.
    assert value == "76eda3f3-5bea-5b3c-b863-22641537decd"
    assert value == str(uuid.uuid5(POINT_NAMESPACE, '["acme","e1:chunk:0",1]'))
    assert uuid.UUID(value).version == 5


def test_point_id_changes_with_each_part() -> None:
    base = point_id("acme", "e1:chunk:0", 1)
    assert point_id("globex", "e1:chunk:0", 1) != base
    assert point_id("acme", "e1:chunk:1", 1) != base
    assert point_id("acme", "e1:chunk:0", 2) != base
    assert point_id("acme", "e1:chunk:0", 1) == base


def test_point_id_encoding_is_unambiguous() -> None:
    # Separator-like characters inside a chunk id cannot forge another triple.
    assert point_id("a", 'x","1', 1) != point_id("a", "x", 1)
    assert point_id("a", "x,1", 1) != point_id("a", "x", 1)


def test_point_id_validates_its_inputs() -> None:
    with pytest.raises(InvalidTenantError):
        point_id("A", "c", 1)
    with pytest.raises(ValueError, match="chunk_id"):
        point_id("a", "", 1)
    for version in (0, -1, True):
        with pytest.raises(ValueError, match="version"):
            point_id("a", "c", version)


@pytest.mark.parametrize("name", ["a", "acme", "tenant-1", "t_2", "0abc", "a" * 63, "a_b-c"])
def test_valid_tenants(name: str) -> None:
    assert validate_tenant(name) == name


@pytest.mark.parametrize(
    "name", ["", "A", "Acme", "../x", "a__b", "a" * 64, "-a", "_a", "a/b", "a.b", "a b", "é"]
)
def test_invalid_tenants(name: str) -> None:
    with pytest.raises(InvalidTenantError):
        validate_tenant(name)


def test_collection_and_alias_names() -> None:
    assert collection_name("acme", 3) == "rag__acme__v3"
    assert alias_name("acme") == "rag__acme"
    assert parse_collection_name("rag__acme__v3") == ("acme", 3)
    assert parse_collection_name("rag__acme") is None
    assert parse_collection_name("rag__acme__v0") is None
    assert parse_collection_name("rag__a__b__v1") is None
    assert parse_collection_name("other") is None
    with pytest.raises(ValueError):
        collection_name("acme", 0)
    with pytest.raises(InvalidTenantError):
        alias_name("a__v1")


@pytest.mark.parametrize("name", ["../x", "a/b", ".x", "", "x" * 256, "a b"])
def test_invalid_collection_names(name: str) -> None:
    with pytest.raises(StoreError):
        validate_collection_name(name)
