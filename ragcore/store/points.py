"""The payload layout of an indexed chunk, in one place: the ingest worker writes it, reconcile
and Retrieve read it, and the benchmarks that build indexes directly write the same.

A point's payload is the entity row's fields (`row_fields`: they may change in place, see
`streams.ingest.write`) plus the chunk's identity and text (`chunk_point`). Fields whose value
is None are left out. The version fields say how new the indexed row is
(docs/decisions/chunk-ids-and-versions.md).
"""

from __future__ import annotations

from collections.abc import Mapping
from datetime import UTC, datetime
from typing import Any

from ragcore.embedders.spec import EmbeddingSpec
from ragcore.store.base import (
    CHUNK_ID,
    ENTITY_ID,
    ENTITY_TYPE,
    EVENT_DATE,
    SOURCE_HASH,
    SOURCE_TABLE,
    TENANT_ID,
    TERM_COUNTS,
    ChunkRef,
    DenseVector,
    PointRecord,
    SparseVector,
)
from ragcore.store.ids import point_id
from ragcore.textsim import SIGNATURE_WORDS, stored_words
from schemas.entities import EntityVersion

VERSION_UPDATED_AT = "source_updated_at_us"
VERSION_LSN = "source_lsn"
VERSION_SNAPSHOT = "source_snapshot"
#: the size of the entity's whole chunk set, on every chunk: detects partial writes
CHUNK_COUNT = "chunk_count"


def rfc3339(moment: datetime) -> str:
    """The timestamp format of payload fields: UTC, microseconds, 'Z'."""
    return moment.astimezone(UTC).strftime("%Y-%m-%dT%H:%M:%S.%fZ")


def version_payload(version: EntityVersion) -> dict[str, Any]:
    """The payload fields that record an entity's indexed version."""
    return {
        VERSION_UPDATED_AT: version.updated_at_us,
        VERSION_LSN: version.lsn,
        VERSION_SNAPSHOT: version.snapshot,
    }


def indexed_version(refs: Mapping[str, ChunkRef]) -> EntityVersion | None:
    """The version stored with an entity's chunks (the newest among them, by the ordering rule
    of `EntityVersion.is_older_than`)."""
    versions = [
        EntityVersion(
            updated_at_us=ref.payload.get(VERSION_UPDATED_AT),
            lsn=ref.payload.get(VERSION_LSN),
            snapshot=bool(ref.payload.get(VERSION_SNAPSHOT, False)),
        )
        for ref in refs.values()
    ]
    newest: EntityVersion | None = None
    for version in versions:
        if newest is None or newest.is_older_than(version):
            newest = version
    return newest


def row_fields(
    *,
    content_hash: str | None,
    entity_type: str,
    title: str | None,
    content_format: str,
    created_at: str | None,
    updated_at: str | None,
    spec: EmbeddingSpec,
    index_version: int,
    indexed_at: str | None,
    event_date: str | None,
    version: EntityVersion,
) -> dict[str, Any]:
    """The payload fields that come from the entity row and the index version (None values
    included: a refresh unsets them)."""
    return {
        SOURCE_HASH: content_hash,
        ENTITY_TYPE: entity_type,
        "title": title,
        "content_format": content_format,
        "created_at": created_at,
        "updated_at": updated_at,
        "embedding_model": spec.name,
        "embedding_version": spec.model_version,
        "index_version": index_version,
        "indexed_at": indexed_at,
        EVENT_DATE: event_date,
        **version_payload(version),
    }


def chunk_point(
    row: Mapping[str, Any],
    *,
    tenant_id: str,
    entity_id: str,
    source_table: str | None,
    chunk_id: str,
    chunk_index: int,
    chunk_count: int,
    locator: Mapping[str, Any],
    text: str,
    index_version: int,
    dense: DenseVector,
    sparse: SparseVector | None,
    term_counts: str | None = None,
) -> PointRecord:
    """The point of one chunk: the row's fields, the chunk's identity, locator and text, the
    text's BM25 term counts as `Bm25Encoder.encode_chunk` stores them (`TERM_COUNTS`:
    Retrieve's exact BM25 reads them instead of tokenizing the text) and its near-duplicate
    signature's words (`ragcore.textsim.SIGNATURE_WORDS`)."""
    payload: dict[str, Any] = {
        **row,
        TENANT_ID: tenant_id,
        ENTITY_ID: entity_id,
        SOURCE_TABLE: source_table,
        CHUNK_ID: chunk_id,
        "chunk_index": chunk_index,
        CHUNK_COUNT: chunk_count,
        "locator": dict(locator),
        "text": text,
        TERM_COUNTS: term_counts,
        SIGNATURE_WORDS: stored_words(text),
    }
    return PointRecord(
        point_id=point_id(tenant_id, chunk_id, index_version),
        dense=dense,
        sparse=sparse,
        payload={k: v for k, v in payload.items() if v is not None},
    )
