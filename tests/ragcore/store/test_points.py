"""The payload layout of an indexed chunk (ragcore.store.points)."""

from __future__ import annotations

import pytest

from ragcore.embedders.spec import EmbeddingSpec
from ragcore.sparse import Bm25Encoder
from ragcore.store.base import SOURCE_HASH, SOURCE_TABLE, TENANT_ID, TERM_COUNTS, ChunkRef
from ragcore.store.ids import point_id
from ragcore.store.points import (
    CHUNK_COUNT,
    VERSION_LSN,
    VERSION_UPDATED_AT,
    chunk_point,
    indexed_version,
    row_fields,
)
from ragcore.textsim import SIGNATURE_WORDS, payload_signature, signature
from schemas.entities import EntityVersion

pytestmark = pytest.mark.unit

SPEC = EmbeddingSpec(name="m", version="1", dimension=2, max_input_tokens=8, tokenizer="t")


def _row(**overrides: object) -> dict[str, object]:
    values: dict[str, object] = {
        "content_hash": "abc",
        "entity_type": "NOTE",
        "title": None,
        "content_format": "text",
        "created_at": None,
        "updated_at": "2026-11-25T10:00:00.000000Z",
        "spec": SPEC,
        "index_version": 3,
        "indexed_at": "2026-11-25T10:00:01.000000Z",
        "event_date": None,
        "version": EntityVersion(updated_at_us=5, lsn=7),
    }
    values.update(overrides)
    return row_fields(**values)  # type: ignore[arg-type]


def test_row_fields_keep_none_values_so_a_refresh_can_unset_them() -> None:
    row = _row()
    assert row["title"] is None and row[SOURCE_HASH] == "abc"
    assert row["embedding_version"] == SPEC.model_version and row["index_version"] == 3
    assert row[VERSION_UPDATED_AT] == 5 and row[VERSION_LSN] == 7


def test_a_point_drops_none_fields_and_carries_identity_and_its_deterministic_id() -> None:
    point = chunk_point(
        _row(),
        tenant_id="acme",
        entity_id="entities:e1",
        source_table=None,
        chunk_id="entities:e1:chunk:0",
        chunk_index=0,
        chunk_count=2,
        locator={"chunk_index": 0, "char_start": 0, "char_end": 4},
        text="text",
        index_version=3,
        dense=[1.0, 0.0],
        sparse=None,
    )
    assert point.point_id == point_id("acme", "entities:e1:chunk:0", 3)
    assert point.payload[TENANT_ID] == "acme" and point.payload[CHUNK_COUNT] == 2
    assert "title" not in point.payload and SOURCE_TABLE not in point.payload
    assert TERM_COUNTS not in point.payload  # none given


def test_a_point_stores_its_texts_term_counts_for_exact_bm25() -> None:
    encoder = Bm25Encoder()
    text = "Pump GX-300 bearings fail after 30 days; bearings replaced"
    sparse, counts = encoder.encode_chunk(text)
    point = chunk_point(
        _row(),
        tenant_id="acme",
        entity_id="entities:e1",
        source_table="entities",
        chunk_id="entities:e1:chunk:0",
        chunk_index=0,
        chunk_count=1,
        locator={"chunk_index": 0, "char_start": 0, "char_end": len(text)},
        text=text,
        index_version=3,
        dense=[1.0, 0.0],
        sparse=sparse,
        term_counts=counts,
    )
    read = encoder.read_counts(point.payload[TERM_COUNTS])
    assert read is not None and read.to_mapping() == encoder.term_counts(text).to_mapping()
    assert read.length == 8  # "after" is a stopword
    assert payload_signature(point.payload) == signature(text)
    assert point.payload[SIGNATURE_WORDS].startswith("w1:pump gx-300 bearings fail after <n>")


def test_the_indexed_version_is_the_newest_among_the_chunks() -> None:
    refs = {
        "c0": ChunkRef("p0", "c0", None, {VERSION_UPDATED_AT: 5, VERSION_LSN: 7}),
        "c1": ChunkRef("p1", "c1", None, {VERSION_UPDATED_AT: 9, VERSION_LSN: 1}),
    }
    # commit order (the LSN), not the application clock, says which chunk is newest
    assert indexed_version(refs) == EntityVersion(updated_at_us=5, lsn=7)
    assert indexed_version({}) is None
