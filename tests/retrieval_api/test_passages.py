"""The passage that answers is the passage in the pack (issue 43), over real gRPC on loopback
(PostgreSQL SoR, qdrant-edge, the real embedder and ingest path): a PDF's pages are distinct
passages, and of one entity's chunks the one with the best evidence is the result."""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Literal

import psycopg
import pytest

from ragcore.documents import DocumentSource
from ragcore.embedders.local_onnx import LocalOnnxEmbedder
from ragcore.mapping import TableMapping
from ragdev.docgen import pdf_bytes
from ragdev.services.postgres import PostgresCluster
from retrieval_api.pipeline_settings import RetrievalConfig
from schemas.events import Op
from schemas.proto.ragstream.retrieval.v1 import retrieval_pb2 as pb
from tests.retrieval_api.stack import Stack

pytestmark = pytest.mark.integration

#: The manual of issue 43: a cover, then one fact per page; every page names the Hydra-7.
HYDRA_PAGES = [
    [
        "Hydra-7",
        "Water-cooled chiller - service manual",
        "Northwind Cooling Systems, edition 3",
    ],
    [
        "Service manual, page 2: refrigerant circuit.",
        "The Hydra-7 circuit holds 4.2 kg of R-1234ze refrigerant. Recover the charge into a",
        "certified cylinder before opening the circuit; never vent it to the atmosphere.",
    ],
    [
        "Service manual, page 3: electrical supply.",
        "The Hydra-7 takes a 400 V three-phase supply at 50 Hz. Fit a 63 A type C breaker and",
        "a residual-current device of 300 mA on the feeder.",
    ],
    [
        "Service manual, page 4: condenser cleaning.",
        "Clean the Hydra-7 condenser tubes every 12 months with a nylon brush; descale them",
        "with a mild citric acid solution when the approach temperature rises above 3 K.",
    ],
]


@pytest.fixture
def documents(tmp_path: Path) -> Path:
    root = tmp_path / "documents"
    root.mkdir()
    return root


@pytest.fixture
def manuals(postgres: PostgresCluster) -> str:
    """A document table whose rows reference PDF files (under `documents`)."""
    table = f"manuals_{uuid.uuid4().hex[:8]}"
    with psycopg.connect(postgres.dsn, autocommit=True) as conn:
        conn.execute(
            f"CREATE TABLE {table} (id text PRIMARY KEY, company_id text NOT NULL, title text,"
            " kind text, path text)".encode()
        )
    return table


def _stack(  # noqa: PLR0917 - the fixtures a stack of manuals needs
    postgres: PostgresCluster,
    tmp_path: Path,
    embedder: LocalOnnxEmbedder,
    documents: Path,
    table: str,
    config: RetrievalConfig,
) -> Stack:
    mapping = TableMapping(
        table=f"public.{table}",
        name="manuals",
        key_columns=("id",),
        type_column=None,
        title_column="title",
        metadata_column=None,
        content_hash_column=None,
        created_at_column=None,
        updated_at_column=None,
        deleted_at_column=None,
        document=DocumentSource(
            column="path", kind="reference", root=documents, format_column="kind"
        ),
    )
    return Stack(postgres.dsn, tmp_path / "store", embedder, tables=[mapping], retrieval=config)


@pytest.fixture
def manual_stack(
    postgres: PostgresCluster,
    tmp_path: Path,
    embedder: LocalOnnxEmbedder,
    documents: Path,
    manuals: str,
) -> Iterator[Stack]:
    stack = _stack(postgres, tmp_path, embedder, documents, manuals, RetrievalConfig())
    add_manual(stack, manuals, documents)
    yield stack
    stack.close()


def add_manual(stack: Stack, table: str, documents: Path) -> None:
    """The Hydra-7 manual as a row and its PDF, ingested."""
    key = "hydra-7"
    row = {"id": key, "company_id": "acme", "title": "Hydra-7 service manual", "kind": "pdf"}
    (documents / "hydra-7.pdf").write_bytes(pdf_bytes(HYDRA_PAGES, title="Hydra-7"))
    with psycopg.connect(stack.dsn, autocommit=True) as conn:
        conn.execute(
            f"INSERT INTO {table} (id, company_id, title, kind, path)"
            " VALUES (%s, %s, %s, %s, %s)".encode(),
            (*row.values(), "hydra-7.pdf"),
        )
    stack.ingest(stack.record(table, Op.CREATE, {**row, "path": "hydra-7.pdf"}, key))


def page(result: pb.Result) -> str:
    """The citation of a result's page, e.g. 'p. 2'."""
    return result.locator.section_path[-1]


@pytest.mark.parametrize(
    ("query", "expected"),
    [
        ("how much refrigerant does the Hydra-7 hold?", "p. 2"),
        ("what breaker does the Hydra-7 supply need?", "p. 3"),
        ("how often are the Hydra-7 condenser tubes cleaned?", "p. 4"),
    ],
)
def test_the_page_that_answers_is_the_first_result(
    manual_stack: Stack, query: str, expected: str
) -> None:
    pack = manual_stack.retrieve("acme", query, top_k=5)
    assert pack.status == pb.RETRIEVAL_STATUS_SUCCESS
    top = pack.results[0]
    assert (top.entity_id, page(top)) == ("manuals:hydra-7", expected), [
        (page(r), round(r.scores.evidence, 3)) for r in pack.results
    ]
    # the best-evidence passage leads: no page of the document that scores higher is left out
    # or ranked below it
    assert top.scores.evidence == max(r.scores.evidence for r in pack.results)
    duplicates = [e for e in pack.excluded if e.reason == pb.EXCLUSION_REASON_DUPLICATE]
    assert all(e.score <= top.scores.evidence for e in duplicates)


def test_pages_are_never_each_others_duplicates(manual_stack: Stack) -> None:
    pack = manual_stack.retrieve("acme", "how much refrigerant does the Hydra-7 hold?", top_k=5)
    assert not [e for e in pack.excluded if e.reason == pb.EXCLUSION_REASON_DUPLICATE]
    pages = [page(r) for r in pack.results]
    assert len(pages) == len(set(pages)) and pages[0] == "p. 2"


@pytest.mark.parametrize(("lead", "expected"), [("evidence", "p. 2"), ("order", "p. 1")])
def test_one_chunk_per_document_leads_with_its_best_evidence_page(  # noqa: PLR0917
    postgres: PostgresCluster,
    tmp_path: Path,
    embedder: LocalOnnxEmbedder,
    documents: Path,
    manuals: str,
    lead: Literal["evidence", "order"],
    expected: str,
) -> None:
    """With one chunk per entity (pages folded into their document), the document's result is
    its best-evidence page; the rule before issue 43 (`order`: the entity's first chunk in the
    fused order) returns the cover, which names the Hydra-7 in its first line, and drops the
    page that answers as a duplicate."""
    config = RetrievalConfig(
        distinct_document_parts=False, answering_chunks=False, passage_lead=lead
    )
    stack = _stack(postgres, tmp_path, embedder, documents, manuals, config)
    try:
        add_manual(stack, manuals, documents)
        pack = stack.retrieve("acme", "how much refrigerant does the Hydra-7 hold?", top_k=5)
        assert [page(r) for r in pack.results] == [expected]
        dropped = [e for e in pack.excluded if e.reason == pb.EXCLUSION_REASON_DUPLICATE]
        assert len(dropped) == 3
        if lead == "order":  # the bug: the answer scored best and was excluded as a duplicate
            assert max(e.score for e in dropped) > pack.results[0].scores.evidence
    finally:
        stack.close()
