"""`ragstream sor put` rows: a document table takes the file's bytes, a text table text."""

from __future__ import annotations

import pytest

from ragcore.errors import ConfigError
from ragcore.mapping import TableMapping
from ragdev.docgen import pdf_bytes
from ragdev.sample_documents import DOCUMENTS_TABLE
from ragdev.sor.rows import row_for_put

pytestmark = pytest.mark.unit


def test_a_document_table_row_carries_the_file_in_its_document_column() -> None:
    data = pdf_bytes([["Seal kit SK-950"]])
    row = row_for_put(
        DOCUMENTS_TABLE,
        key="globex-doc-9",
        tenant="globex",
        text=data,
        title="Seal kit note",
        values={"file_name": "note.pdf", "mime_type": "application/pdf"},
    )
    assert row["body"] == data and "content" not in row
    assert (row["id"], row["company_id"], row["title"]) == (
        "globex-doc-9",
        "globex",
        "Seal kit note",
    )


def test_text_and_bytes_go_to_their_own_kind_of_table() -> None:
    with pytest.raises(ConfigError, match="give the file"):
        row_for_put(DOCUMENTS_TABLE, key="d", tenant="globex", text="just text")
    with pytest.raises(ConfigError, match="holds text"):
        row_for_put(TableMapping(), key="e", tenant="acme", text=b"%PDF-1.4")
