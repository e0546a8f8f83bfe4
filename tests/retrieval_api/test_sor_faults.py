"""Retrieve when the SoR misbehaves, over real gRPC on loopback (PostgreSQL SoR, qdrant-edge,
the real embedder and ingest path): a row that cannot be judged is one excluded hit, never a
failed call; an unreachable SoR is UNAVAILABLE with a correlation id and nothing of where the
SoR is."""

from __future__ import annotations

import logging
import uuid
from collections.abc import Iterator
from pathlib import Path

import grpc
import psycopg
import pytest

from ragcore.documents import DocumentSource
from ragcore.embedders.local_onnx import LocalOnnxEmbedder
from ragcore.mapping import TableMapping
from ragdev.services.postgres import PostgresCluster
from ragdev.services.tansu import free_port
from schemas.events import Op
from schemas.proto.ragstream.retrieval.v1 import retrieval_pb2 as pb
from tests.retrieval_api.stack import Stack
from tests.streams.support import eid

pytestmark = pytest.mark.integration

PUMP = (
    "The centrifugal pump P-200 must be primed before start-up. Open the vent valve, fill the "
    "casing with water until it flows from the vent, then close the valve and start the motor."
)
SHEET = (
    "part,instruction\n"
    "P-200,Prime the centrifugal pump P-200 before start-up: fill the casing with water\n"
)
QUERY = "how do I prime the centrifugal pump P-200 before start-up?"


@pytest.fixture
def documents(tmp_path: Path) -> Path:
    root = tmp_path / "documents"
    root.mkdir()
    return root


@pytest.fixture
def sheets(postgres: PostgresCluster) -> str:
    """A document table whose rows reference CSV files (under `documents`)."""
    table = f"sheets_{uuid.uuid4().hex[:8]}"
    with psycopg.connect(postgres.dsn, autocommit=True) as conn:
        conn.execute(
            f"CREATE TABLE {table} (id text PRIMARY KEY, company_id text NOT NULL, title text,"
            " kind text, path text)".encode()
        )
    return table


@pytest.fixture
def faulty(
    postgres: PostgresCluster,
    tmp_path: Path,
    embedder: LocalOnnxEmbedder,
    documents: Path,
    sheets: str,
) -> Iterator[Stack]:
    mapping = TableMapping(
        table=f"public.{sheets}",
        name="sheets",
        key_columns=("id",),
        type_column=None,
        title_column="title",
        metadata_column=None,
        content_hash_column=None,  # the hash is computed from the file: a verdict reads it
        created_at_column=None,
        updated_at_column=None,
        deleted_at_column=None,
        document=DocumentSource(
            column="path", kind="reference", root=documents, format_column="kind"
        ),
    )
    stack = Stack(postgres.dsn, tmp_path / "store", embedder, tables=[mapping])
    yield stack
    stack.close()


def add_sheet(stack: Stack, table: str, documents: Path, key: str) -> None:
    """A sheets row and its file, ingested."""
    row = {"id": key, "company_id": "acme", "title": f"Sheet {key}", "kind": "csv"}
    (documents / f"{key}.csv").write_text(SHEET)
    with psycopg.connect(stack.dsn, autocommit=True) as conn:
        conn.execute(
            f"INSERT INTO {table} (id, company_id, title, kind, path)"
            " VALUES (%s, %s, %s, %s, %s)".encode(),
            (*row.values(), f"{key}.csv"),
        )
    stack.ingest(stack.record(table, Op.CREATE, {**row, "path": f"{key}.csv"}, key))


def test_unreadable_rows_are_excluded_and_the_other_hits_served(
    faulty: Stack, sheets: str, documents: Path, caplog: pytest.LogCaptureFixture
) -> None:
    stack = faulty
    for key in ("ent-good", "ent-json", "ent-also"):
        stack.write(key, "acme", PUMP.replace("P-200", "P-200 " + key))
    add_sheet(stack, sheets, documents, "s1")
    before = stack.retrieve("acme", QUERY, top_k=5)
    served = {r.entity_id for r in before.results}
    assert {eid("ent-json"), "sheets:s1"} <= served, served  # both are hits while readable
    # the SoR changes behind the index: metadata that is not JSON, a deleted file
    with psycopg.connect(stack.dsn, autocommit=True) as conn:
        conn.execute(
            f"UPDATE {stack.table} SET metadata = to_jsonb(%s::text) WHERE id = %s".encode(),
            ('{"format": "text"', "ent-json"),
        )
    (documents / "s1.csv").unlink()

    with caplog.at_level(logging.WARNING, logger="ragcore.sor.base"):
        pack = stack.retrieve("acme", QUERY, top_k=5)
    assert pack.status == pb.RETRIEVAL_STATUS_SUCCESS
    unreadable = {
        e.entity_id for e in pack.excluded if e.reason == pb.EXCLUSION_REASON_SOR_ROW_UNREADABLE
    }
    assert unreadable == {eid("ent-json"), "sheets:s1"}
    results = {r.entity_id for r in pack.results}
    assert results == served - unreadable and eid("ent-good") in results
    # never asked to be reindexed: a re-read fails the same way
    assert stack.publisher.on("ragstream.reindex-requests") == []
    chunks = sum(e.reason == pb.EXCLUSION_REASON_SOR_ROW_UNREADABLE for e in pack.excluded)
    excluded = stack.sample("ragstream_retrieve_excluded_total", reason="sor_row_unreadable")
    assert excluded == chunks >= 2
    # one log line per row, with its table, entity id and reason
    lines = [r.getMessage() for r in caplog.records if "SoR row unreadable" in r.getMessage()]
    assert len(lines) == 2, lines
    (json_line,) = [x for x in lines if f"entity {eid('ent-json')}," in x]
    assert f"table public.{stack.table}" in json_line and "reason MAPPING_ERROR" in json_line
    (file_line,) = [x for x in lines if "entity sheets:s1," in x]
    assert f"table public.{sheets}" in file_line and "reason DOCUMENT_UNAVAILABLE" in file_line


def test_a_pack_of_only_unreadable_rows_is_no_evidence_not_an_error(
    faulty: Stack, sheets: str, documents: Path
) -> None:
    stack = faulty
    add_sheet(stack, sheets, documents, "s1")
    (documents / "s1.csv").unlink()
    pack = stack.retrieve("acme", QUERY)
    assert pack.status == pb.RETRIEVAL_STATUS_NO_EVIDENCE
    assert [e.reason for e in pack.excluded if e.entity_id == "sheets:s1"] == [
        pb.EXCLUSION_REASON_SOR_ROW_UNREADABLE
    ]


def test_an_unreachable_sor_is_unavailable_with_a_correlation_id_and_no_address(
    postgres: PostgresCluster,
    tmp_path: Path,
    embedder: LocalOnnxEmbedder,
    caplog: pytest.LogCaptureFixture,
) -> None:
    port = free_port()  # nothing listens there: the SoR is down
    dsn = (
        f"host=127.0.0.1 port={port} user=sor_reader_q7 password=hunter2-secret "
        "dbname=erp_records_q7 connect_timeout=1"
    )
    stack = Stack(postgres.dsn, tmp_path / "store", embedder, retrieve_sor_dsn=dsn)
    try:
        stack.write("ent-good", "acme", PUMP)  # ingest reads the real SoR
        with (
            caplog.at_level(logging.WARNING, logger="retrieval_api.grpc_server"),
            pytest.raises(grpc.RpcError) as err,
        ):
            stack.retrieve("acme", QUERY, request_id="req-outage-7f3a")
    finally:
        stack.close()
    assert err.value.code() == grpc.StatusCode.UNAVAILABLE
    details = err.value.details() or ""
    assert details == (
        "SOR_UNAVAILABLE: the system of record is unavailable (correlation id req-outage-7f3a)"
    )
    for secret in ("127.0.0.1", str(port), "sor_reader_q7", "erp_records_q7", "hunter2"):
        assert secret not in details
    trailers = dict(err.value.trailing_metadata() or ())
    assert trailers["ragstream-error-code"] == "SOR_UNAVAILABLE"
    assert trailers["ragstream-correlation-id"] == "req-outage-7f3a"
    # the server log has the id and the detail (where the SoR is), never the password
    (line,) = [r for r in caplog.records if "req-outage-7f3a" in r.getMessage()]
    assert line.levelno == logging.WARNING
    assert f"host=127.0.0.1 port={port} user=sor_reader_q7" in line.getMessage()
    assert "hunter2" not in caplog.text


def test_an_unexpected_failure_is_internal_with_a_correlation_id_and_no_detail(
    stack: Stack, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    stack.write("ent-good", "acme", PUMP)

    def broken(*_args: object) -> pb.EvidencePack:
        raise KeyError("dsn=postgresql://bob@db.internal:5432/erp")

    monkeypatch.setattr(stack.app.retriever, "retrieve", broken)
    with (
        caplog.at_level(logging.ERROR, logger="retrieval_api.grpc_server"),
        pytest.raises(grpc.RpcError) as err,
    ):
        stack.retrieve("acme", QUERY, request_id="req-bug-1")
    assert err.value.code() == grpc.StatusCode.INTERNAL
    assert err.value.details() == "INTERNAL: internal error (correlation id req-bug-1)"
    (line,) = [r for r in caplog.records if "req-bug-1" in r.getMessage()]
    assert "db.internal" in line.getMessage() and line.exc_info is not None
    assert stack.sample("ragstream_retrieve_requests_total", status="FAILED", code="Internal") == 1
