"""Rows for a mapped table from the few fields a person types (`ragstream sor put`).

The mapping says which column is the key, the tenant, the title, the type and the content;
the last content column takes the text (the others keep what the row had, or the title when it
is one of them), and `--set column=value` sets any column.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any, Protocol

from ragcore.errors import ConfigError
from ragcore.mapping import TableMapping
from schemas.events import Op


def key_values(mapping: TableMapping, key: str) -> list[str]:
    """The key column values of `key` as typed: the values joined by commas, or a whole entity
    id (`<table>:<key>`)."""
    if key.startswith(f"{mapping.label}:"):
        return list(mapping.key_of(key))
    parts = key.split(",")
    if len(parts) != len(mapping.key_columns) or not all(parts):
        raise ConfigError(
            f"{mapping.table}: the key is {len(mapping.key_columns)} comma-separated values "
            f"({', '.join(mapping.key_columns)}), got {key!r}"
        )
    return parts


def row_for_put(
    mapping: TableMapping,
    *,
    key: str,
    tenant: str | None,
    text: str | bytes,
    title: str | None = None,
    entity_type: str | None = None,
    content_format: str | None = None,
    values: Mapping[str, Any] | None = None,
) -> dict[str, Any]:
    """The column values a put writes (the writer fills timestamps and keeps other columns).
    A table with a document column takes the file's bytes as `text`."""
    row: dict[str, Any] = dict(zip(mapping.key_columns, key_values(mapping, key), strict=True))
    if mapping.tenant_column is not None:
        if not tenant:
            raise ConfigError(f"{mapping.table}: give the tenant ({mapping.tenant_column})")
        row[mapping.tenant_column] = tenant
    elif tenant not in (None, mapping.tenant):
        raise ConfigError(f"{mapping.table} belongs to tenant {mapping.tenant!r} only")
    if mapping.title_column is not None:
        row[mapping.title_column] = title or key
    if mapping.document is not None:
        if not isinstance(text, bytes):
            raise ConfigError(f"{mapping.table} holds files: give the file (--file)")
        row[mapping.document.column] = text
    elif isinstance(text, bytes):
        raise ConfigError(f"{mapping.table} holds text, not a file's bytes")
    else:
        row[mapping.content_columns[-1]] = text
    if entity_type is not None and mapping.type_column is not None:
        row[mapping.type_column] = entity_type
    if (
        content_format is not None
        and mapping.metadata_column is not None
        and mapping.format_metadata_key is not None
    ):
        row[mapping.metadata_column] = {mapping.format_metadata_key: content_format}
    if content_format is not None and mapping.format_column is not None:
        row[mapping.format_column] = content_format
    row.update(values or {})
    unknown = sorted(set(row) - set(mapping.columns()) - set(values or {}))
    if unknown:
        raise ConfigError(f"{mapping.table}: unknown columns {unknown}")
    return row


class SorWriter(Protocol):
    """Writes rows of mapped tables the way an application would (`ragstream sor`): the
    embedded SQLite SoR (which publishes the change events itself) or PostgreSQL (where
    Debezium captures them)."""

    def mapping(self, table: str) -> TableMapping:
        """The mapped table named `table`."""
        ...

    def topic(self, table: str) -> str:
        """The topic the table's change events reach."""
        ...

    def row(self, table: str, key: Sequence[object]) -> dict[str, Any] | None:
        """The row as stored, or None."""
        ...

    def put(self, table: str, values: Mapping[str, Any]) -> Op:
        """Insert or update a row (clearing a soft delete)."""
        ...

    def soft_delete(self, table: str, key: Sequence[object]) -> bool:
        """Set the soft-delete column; False when there is no such row."""
        ...

    def delete(self, table: str, key: Sequence[object]) -> bool:
        """Delete the row; False when there is no such row."""
        ...

    def close(self) -> None:
        """Release connections."""
        ...
