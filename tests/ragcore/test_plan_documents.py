"""Document tables from change event to chunks: the file is the content, its SHA-256 the
content hash, a TOASTed file a re-read, and each chunk cites its page, section or rows."""

from __future__ import annotations

import base64
import hashlib
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from ragcore.documents import DocumentSource
from ragcore.embedders.local_onnx import MINILM_SPEC
from ragcore.errors import DocumentError
from ragcore.plan import Action, PlanConfig, plan_event
from ragcore.prepare import Preparer
from ragdev.docgen import docx_bytes, encrypted_pdf_bytes, pdf_bytes, xlsx_bytes
from ragdev.sample_documents import DOCUMENTS_TABLE
from schemas.entities import ContentFormat, Entity
from schemas.events import ChangeEvent, Op, RecordKind, RecordPosition, SourceInfo

pytestmark = pytest.mark.unit

DOCUMENTS = DOCUMENTS_TABLE  # the sample corpus's: file in `body`, MIME type, file name
CONFIG = PlanConfig(tables=(DOCUMENTS,))
DATASHEET = pdf_bytes(
    [
        ["P-100 centrifugal pump datasheet", "Flow up to 40 m3/h at 32 m head."],
        ["Materials: cast iron casing, stainless steel impeller."],
        ["Seal kit SK-9 fits every P-100 built after 2021."],
    ]
)


@pytest.fixture(scope="module")
def preparer() -> Iterator[Preparer]:
    preparer = Preparer(MINILM_SPEC)
    yield preparer
    preparer.close()


def event(body: object, *, unavailable: frozenset[str] = frozenset(), **row: Any) -> ChangeEvent:
    after = {
        "id": 7,
        "company_id": "globex",
        "title": "P-100 datasheet",
        "file_name": "p100-datasheet.pdf",
        "mime_type": "application/pdf",
        "body": body,
        # every column of schemas/sql/documents.*.sql: a mapped column missing from an event
        # is schema drift (ragcore.plan), present-but-null is not
        "created_at": None,
        "updated_at": None,
        "deleted_at": None,
        **row,
    }
    return ChangeEvent(
        kind=RecordKind.CHANGE,
        position=RecordPosition("sor.public.documents", 0, 1),
        op=Op.UPDATE,
        key={"id": 7},
        after=after,
        source=SourceInfo(schema="public", table="documents", ts_ms=1, lsn=9),
        unavailable_columns=unavailable,
    )


def upsert(preparer: Preparer, body: object, **row: Any) -> Entity:
    plan = plan_event(event(body, **row), CONFIG, preparer.content_hash)
    assert plan.action is Action.UPSERT and plan.entity is not None
    return plan.entity


def test_a_base64_bytea_pdf_becomes_a_pdf_entity_hashed_by_its_bytes(preparer: Preparer) -> None:
    entity = upsert(preparer, base64.b64encode(DATASHEET).decode())
    assert entity.entity_id == "documents:7" and entity.content_format is ContentFormat.PDF
    assert entity.content_hash == hashlib.sha256(DATASHEET).hexdigest()
    assert entity.metadata["document_name"] == "p100-datasheet.pdf"
    # a row change that leaves the file alone keeps the hash: nothing is re-embedded
    assert upsert(preparer, DATASHEET, title="renamed").content_hash == entity.content_hash


def test_pdf_chunks_cite_their_page(preparer: Preparer) -> None:
    chunks = preparer.chunks(upsert(preparer, DATASHEET))
    pages = {c.locator.page or 0: c for c in chunks}
    assert sorted(pages) == [1, 2, 3]
    third = pages[3].locator
    assert "SK-9" in pages[3].text and all("SK-9" not in pages[p].text for p in (1, 2))
    assert third.section_path == ("p100-datasheet.pdf", "p. 3")
    assert third.document == "p100-datasheet.pdf" and third.extracted_from == "pdf"
    assert third.describe().startswith("p100-datasheet.pdf p. 3, chunk 2")
    payload = third.model_dump(mode="json")
    assert payload["page"] == 3 and payload["document"] == "p100-datasheet.pdf"
    text = preparer.normalized(upsert(preparer, DATASHEET).content, ContentFormat.PDF).text
    assert all(text[c.locator.char_start : c.locator.char_end] == c.text for c in chunks)


def test_docx_and_xlsx_chunks_cite_headings_and_rows(preparer: Preparer) -> None:
    procedure = docx_bytes(
        [("h1", "Seal change"), ("p", "Drain the pump."), ("h2", "Lockout"), ("p", "Open Q1.")]
    )
    chunks = preparer.chunks(upsert(preparer, procedure, mime_type=None, file_name="seal.docx"))
    assert [c.locator.section_path for c in chunks] == [
        ("seal.docx", "Seal change"),
        ("seal.docx", "Seal change", "Lockout"),
    ]
    sheet = xlsx_bytes([("Prices", [["sku", "price"], ["SK-9", 12.5], ["SK-10", 14]])])
    (chunk,) = preparer.chunks(upsert(preparer, sheet, mime_type=None, file_name="prices.xlsx"))
    assert (chunk.locator.sheet, chunk.locator.rows) == ("Prices", (2, 3))
    assert chunk.locator.section_path == ("prices.xlsx", "Prices", "rows 2-3")


def test_text_locators_keep_their_payload_shape() -> None:
    entity = Entity(
        tenant_id="t", entity_id="e:1", entity_type="X", content="Hello there.", content_hash="h"
    )
    (chunk,) = Preparer(MINILM_SPEC).chunks(entity)
    assert set(chunk.locator.model_dump(mode="json")) == {
        "chunk_index",
        "char_start",
        "char_end",
        "section_path",
        "extracted_from",
    }


def test_an_encrypted_pdf_fails_once_per_batch_with_its_reason(preparer: Preparer) -> None:
    bad = upsert(preparer, encrypted_pdf_bytes([["secret"]]))
    good = upsert(preparer, DATASHEET, id=8)
    failed_before = preparer.extraction.failed
    preparer.prime([bad, good])  # the batch's tokenization pass skips it
    with pytest.raises(DocumentError) as info:
        preparer.chunks(bad)
    assert info.value.code == "PDF_ENCRYPTED"
    assert preparer.extraction.failed == failed_before + 1  # remembered, not re-extracted
    assert preparer.chunks(good)


def test_a_toasted_document_column_is_re_read() -> None:
    plan = plan_event(event(None, unavailable=frozenset({"body"})), CONFIG, lambda c, f: "unused")
    assert plan.action is Action.REFETCH and "body" in (plan.detail or "")


def test_a_table_with_a_document_reads_its_columns_not_content() -> None:
    columns = DOCUMENTS.columns()
    assert "content" not in columns
    assert {"body", "mime_type", "file_name"} <= set(columns)


def test_a_reference_column_is_hashed_by_the_file_it_names(
    preparer: Preparer, tmp_path: Path
) -> None:
    (tmp_path / "sheets").mkdir()
    path = tmp_path / "sheets" / "gx.pdf"
    path.write_bytes(DATASHEET)
    table = DOCUMENTS.model_copy(
        update={
            "document": DocumentSource(column="body", kind="reference", root=tmp_path),
        }
    )
    config = PlanConfig(tables=(table,))

    def entity(**row: Any) -> Entity:
        plan = plan_event(event("sheets/gx.pdf", **row), config, preparer.content_hash)
        assert plan.entity is not None
        return plan.entity

    first = entity(file_name=None)
    assert first.content_hash == hashlib.sha256(DATASHEET).hexdigest()
    assert first.metadata["document_name"] == "gx.pdf"  # the reference's file name
    assert entity(title="renamed", file_name=None).content_hash == first.content_hash
    path.write_bytes(pdf_bytes([["A new revision of the datasheet."]]))
    assert entity(file_name=None).content_hash != first.content_hash  # same row, new file
