"""The SoR port and the SQL both readers share.

One batched query per call (never one per id): Retrieve verifies all hits of a request with
`verify`, the worker re-reads TOAST-placeholder rows with `fetch_entities`, reindex and
reconcile stream a tenant with `scan`. Column names come from the same `TableMapping` ingest
uses, so what Retrieve compares is what ingest indexed.
"""

from __future__ import annotations

import re
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Protocol

from ragstream.errors import ConfigError
from schemas.entities import Entity, EntityVersion
from streams.mapping import RowView, TableMapping, version_of
from streams.plan import ContentHasher, build_entity

_IDENT = re.compile(r"^[A-Za-z_][A-Za-z0-9_]{0,62}$")


@dataclass(frozen=True, slots=True)
class SorVerdict:
    """What the SoR says about one entity right now."""

    entity_id: str
    exists: bool
    deleted: bool = False
    content_hash: str | None = None
    entity_type: str | None = None


class SystemOfRecord(Protocol):
    """Read access to the SoR table that feeds the index."""

    def verify(self, tenant_id: str, entity_ids: Sequence[str]) -> dict[str, SorVerdict]:
        """Existence, soft deletion and content hash of each id, in one query."""
        ...

    def fetch_entities(self, tenant_id: str | None, entity_ids: Sequence[str]) -> dict[str, Entity]:
        """The live (not soft-deleted) entities among `entity_ids`, as ingest would map them."""
        ...

    def scan(self, tenant_id: str, batch: int = 500) -> Iterator[Entity]:
        """Every live entity of the tenant, in id order, `batch` rows per round trip."""
        ...

    def count(self, tenant_id: str) -> int:
        """How many live entities the tenant has (progress of a reindex)."""
        ...

    def check(self) -> None:
        """Raise when the SoR is unreachable (health checks, startup)."""
        ...

    def close(self) -> None:
        """Release connections."""
        ...


def quote_ident(name: str) -> str:
    """Quote a configured identifier after checking it is a plain one (no injection)."""
    if not _IDENT.match(name):
        raise ConfigError(f"not a plain SQL identifier: {name!r}")
    return f'"{name}"'


class SqlShape:
    """SQL text for one mapped table, with a driver-specific placeholder."""

    def __init__(self, table: str, mapping: TableMapping, placeholder: str) -> None:
        parts = table.split(".")
        if not 1 <= len(parts) <= 2:
            raise ConfigError(f"table must be 'name' or 'schema.name', got {table!r}")
        self.table = ".".join(quote_ident(p) for p in parts)
        self.mapping = mapping
        self.ph = placeholder
        m = mapping
        columns = [
            m.id_column,
            m.tenant_column,
            m.type_column,
            m.title_column,
            *m.content_columns,
            m.metadata_column,
            m.format_column,
            m.content_hash_column,
            m.created_at_column,
            m.updated_at_column,
            m.deleted_at_column,
        ]
        self.columns = list(dict.fromkeys(c for c in columns if c is not None))
        self.select_list = ", ".join(quote_ident(c) for c in self.columns)

    def by_ids(self, n: int, with_tenant: bool) -> str:
        """SELECT the mapped columns of `n` ids (optionally within one tenant)."""
        m = self.mapping
        marks = ", ".join([self.ph] * n)
        where = f"{quote_ident(m.id_column)} IN ({marks})"
        if with_tenant:
            where += f" AND {quote_ident(m.tenant_column)} = {self.ph}"
        return f"SELECT {self.select_list} FROM {self.table} WHERE {where}"

    def count_live(self) -> str:
        """SELECT the number of a tenant's live rows (column `n`)."""
        m = self.mapping
        where = f"{quote_ident(m.tenant_column)} = {self.ph}"
        if m.deleted_at_column is not None:
            where += f" AND {quote_ident(m.deleted_at_column)} IS NULL"
        return f"SELECT COUNT(*) AS n FROM {self.table} WHERE {where}"

    def scan_page(self, with_cursor: bool) -> str:
        """One keyset page of a tenant's live rows, ordered by id."""
        m = self.mapping
        where = f"{quote_ident(m.tenant_column)} = {self.ph}"
        if m.deleted_at_column is not None:
            where += f" AND {quote_ident(m.deleted_at_column)} IS NULL"
        if with_cursor:
            where += f" AND {quote_ident(m.id_column)} > {self.ph}"
        order = quote_ident(m.id_column)
        return (
            f"SELECT {self.select_list} FROM {self.table} WHERE {where} "
            f"ORDER BY {order} LIMIT {self.ph}"
        )


def row_to_verdict(
    row: Mapping[str, Any], mapping: TableMapping, hasher: ContentHasher, where: str
) -> SorVerdict:
    """Turn a selected row into a verdict, computing the hash when the table has none."""
    view = RowView(row, where)
    entity_id = view.required_text(mapping.id_column)
    deleted = (
        mapping.deleted_at_column is not None and row.get(mapping.deleted_at_column) is not None
    )
    if mapping.content_hash_column is not None and row.get(mapping.content_hash_column):
        content_hash: str | None = str(row[mapping.content_hash_column]).strip().lower()
    else:
        tenant = view.required_text(mapping.tenant_column)
        entity = row_to_entity(row, mapping, hasher, where, tenant_id=tenant)
        content_hash = entity.content_hash
    return SorVerdict(
        entity_id=entity_id,
        exists=True,
        deleted=deleted,
        content_hash=content_hash,
        entity_type=view.optional_text(mapping.type_column) or mapping.default_entity_type,
    )


def row_to_entity(
    row: Mapping[str, Any],
    mapping: TableMapping,
    hasher: ContentHasher,
    where: str,
    *,
    tenant_id: str | None = None,
) -> Entity:
    """Map a selected row exactly as ingest maps a change event's `after`."""
    view = RowView(row, where)
    version: EntityVersion = version_of(view, mapping, lsn=None, snapshot=False)
    return build_entity(
        view,
        mapping,
        tenant_id=tenant_id or view.required_text(mapping.tenant_column),
        entity_id=view.required_text(mapping.id_column),
        version=version,
        hasher=hasher,
        where=where,
    )
