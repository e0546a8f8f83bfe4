"""Names and identities in the vector store: tenants, collections, aliases and point ids.

docs/decisions/collections-per-tenant-and-version.md names one collection per tenant and index
version (`rag__<tenant>__v<N>`) and
an alias per tenant (`rag__<tenant>`); docs/decisions/chunk-ids-and-versions.md makes the point id
a uuid5 of (tenant,
chunk_id, index version) so re-delivery overwrites the same points. Everything here is pure.
"""

from __future__ import annotations

import json
import re
import uuid
from typing import Any

from pydantic import GetCoreSchemaHandler
from pydantic_core import core_schema

from ragcore.errors import InvalidTenantError, StoreError

#: Fixed namespace of every ragstream point id. Changing it re-keys every index: never do.
POINT_NAMESPACE = uuid.UUID("54fa6fe9-40c3-4caa-a290-139b6cbf54af")

#: Separates the parts of collection and alias names; hence forbidden inside a tenant name.
SEPARATOR = "__"
PREFIX = "rag"
#: ragstream's own catalog collection on a Qdrant server (shared placement); never an index.
CATALOG_COLLECTION = "rag_catalog"

_TENANT_RE = re.compile(r"^[a-z0-9][a-z0-9_-]{0,62}$")
# Collection names become directory names in embedded mode: no dots, slashes or leading dash.
_COLLECTION_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_-]{0,254}$")
_VERSIONED_RE = re.compile(
    r"^rag__(?P<tenant>[a-z0-9][a-z0-9_-]{0,62})__v(?P<version>[1-9][0-9]*)$"
)


class TenantId(str):
    """A tenant name that has been validated: `^[a-z0-9][a-z0-9_-]{0,62}$` without `__`, so it
    cannot climb out of a directory, spoof another tenant's alias or collection, or smuggle a
    separator. Constructing one validates it (`InvalidTenantError` otherwise): a value of this
    type never holds a bad name, so the code past the boundary (decode, plan, a request) trusts
    it. It is a `str` in every other respect (JSON, pickling, comparisons)."""

    __slots__ = ()

    def __new__(cls, name: object) -> TenantId:
        if type(name) is cls:
            return name  # validated when it was made
        if not isinstance(name, str) or not _TENANT_RE.fullmatch(name) or SEPARATOR in name:
            raise InvalidTenantError(
                f"invalid tenant name {name!r}: expected 1-63 chars of [a-z0-9_-], "
                f"starting with [a-z0-9], without {SEPARATOR!r}"
            )
        return super().__new__(cls, name)

    @classmethod
    def __get_pydantic_core_schema__(
        cls, _source: Any, _handler: GetCoreSchemaHandler
    ) -> core_schema.CoreSchema:
        """A string validated into a `TenantId` (settings and models may declare the type)."""
        return core_schema.no_info_after_validator_function(_tenant_value, core_schema.str_schema())


def _tenant_value(name: str) -> TenantId:
    """`TenantId(name)` for pydantic, which reports a ValueError as a validation error."""
    try:
        return TenantId(name)
    except InvalidTenantError as exc:
        raise ValueError(str(exc)) from None


def validate_tenant(name: str) -> TenantId:
    """`name` as a `TenantId` when it is a safe tenant name, else raise InvalidTenantError."""
    return TenantId(name)


def validate_collection_name(name: str) -> str:
    """Return `name` when it can be a collection (and a directory) name, else raise StoreError."""
    if not isinstance(name, str) or not _COLLECTION_RE.fullmatch(name):
        raise StoreError(f"invalid collection name {name!r}: expected [A-Za-z0-9_-], 1-255 chars")
    return name


def collection_name(tenant: str, version: int) -> str:
    """The collection of one index version: `rag__<tenant>__v<N>` (N >= 1)."""
    validate_tenant(tenant)
    if isinstance(version, bool) or not isinstance(version, int) or version < 1:
        raise ValueError(f"index version must be an int >= 1, got {version!r}")
    return f"{PREFIX}{SEPARATOR}{tenant}{SEPARATOR}v{version}"


def alias_name(tenant: str) -> str:
    """The tenant's alias, which points at its active version on a server: `rag__<tenant>`."""
    validate_tenant(tenant)
    return f"{PREFIX}{SEPARATOR}{tenant}"


def parse_collection_name(name: str) -> tuple[str, int] | None:
    """(tenant, version) of a versioned collection name, or None for any other name."""
    match = _VERSIONED_RE.fullmatch(name)
    if match is None or SEPARATOR in match["tenant"]:
        return None
    return match["tenant"], int(match["version"])


def point_id(tenant: str, chunk_id: str, index_version: int) -> str:
    """The deterministic point id of a chunk in one index version (a uuid5 string).

    The name hashed is the compact JSON array `[tenant, chunk_id, version]`: JSON quoting makes
    the encoding unambiguous whatever characters a chunk id holds.
    """
    validate_tenant(tenant)
    if not chunk_id:
        raise ValueError("chunk_id must not be empty")
    if isinstance(index_version, bool) or not isinstance(index_version, int) or index_version < 1:
        raise ValueError(f"index version must be an int >= 1, got {index_version!r}")
    name = json.dumps([tenant, chunk_id, index_version], ensure_ascii=False, separators=(",", ":"))
    return str(uuid.uuid5(POINT_NAMESPACE, name))
