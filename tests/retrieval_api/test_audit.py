"""Audit records: the columns of docs/decisions/retrieval-contract.md, JSON-able, and never the raw
query text."""

from __future__ import annotations

import hashlib
import hmac
import json
from datetime import UTC, datetime

import pytest

from retrieval_api.audit import (
    REQUESTS_SCHEMA,
    RESULTS_SCHEMA,
    fingerprint_query,
    request_record,
    result_records,
)
from retrieval_api.evidence import IndexInfo, Verdict, build_pack, error_pack
from retrieval_api.pipeline_settings import RetrievalConfig
from retrieval_api.ranking import ScoreKind, rank
from schemas.proto.ragstream.retrieval.v1 import retrieval_pb2 as pb
from tests.retrieval_api.helpers import REQUEST_ID, TENANT, cand, request

pytestmark = pytest.mark.unit

QUERY = "  Vibration alarm on pump P-101 at Müller site  "
NORMALIZED = "Vibration alarm on pump P-101 at Müller site"
REQUESTED_AT = datetime(2024, 7, 1, 8, 30, 0, 250000, tzinfo=UTC)
CONFIG = RetrievalConfig(keyword_filter_fields={"equipment_id": "keyword"})


def success_pack() -> pb.EvidencePack:
    req = request(CONFIG, query=QUERY, top_k=2)
    ranking = rank(
        [
            cand("a:chunk:0", 0.8, equipment_id="P-101"),
            cand("b:chunk:0", 0.5),
            cand("c:chunk:0", 0.1),
        ],
        store_filter=req.store_filter,
        top_k=req.top_k,
        thresholds=req.thresholds(CONFIG, ScoreKind.COSINE),
    )
    return build_pack(
        req,
        IndexInfo("rag__acme__v3", 3, "all-MiniLM-L6-v2@onnx-int8-1.0.0"),
        ranking,
        {"a:chunk:0": Verdict.OK, "b:chunk:0": Verdict.OK},
        retrieved_at=REQUESTED_AT,
        timings_ms={"embed": 2.0, "search": 3.5, "verify": 1.0, "total": 7.25},
        attribute_fields=("equipment_id",),
    )


def test_fingerprint_hashes_the_normalized_query() -> None:
    fp = fingerprint_query(QUERY)
    assert fp.digest == hashlib.sha256(NORMALIZED.encode()).hexdigest()
    assert (fp.algorithm, fp.chars) == ("sha256", len(NORMALIZED))
    # Same normalized text (NFD input, other whitespace) -> same hash.
    assert fingerprint_query("Vibration alarm on pump P-101 at Mu\u0308ller site\n") == fp


def test_keyed_fingerprint_is_an_hmac() -> None:
    fp = fingerprint_query(QUERY, key=b"deployment-secret")
    expected = hmac.new(b"deployment-secret", NORMALIZED.encode(), hashlib.sha256).hexdigest()
    assert (fp.digest, fp.algorithm) == (expected, "hmac-sha256")
    assert fp.digest != fingerprint_query(QUERY).digest


def test_request_record_has_the_seed_columns_and_no_raw_query() -> None:
    record = request_record(
        success_pack(), query=fingerprint_query(QUERY), requested_at=REQUESTED_AT
    )
    text = json.dumps(record, allow_nan=False, ensure_ascii=False)
    for fragment in (QUERY, NORMALIZED, "Vibration alarm", "Müller"):
        assert fragment not in text
    assert record["query_text_hash"] == hashlib.sha256(NORMALIZED.encode()).hexdigest()
    assert record["query_chars"] == len(NORMALIZED)
    assert record["schema"] == REQUESTS_SCHEMA
    assert record["request_id"] == REQUEST_ID and record["tenant"] == TENANT
    assert record["requested_at"] == "2024-07-01T08:30:00.250000Z"
    assert (record["index_name"], record["index_version"]) == ("rag__acme__v3", 3)
    assert record["embedding_model_version"] == "all-MiniLM-L6-v2@onnx-int8-1.0.0"
    assert (record["top_k_requested"], record["candidate_k"]) == (2, 8)
    assert record["min_similarity_hard"] == RetrievalConfig().cosine_thresholds.hard
    assert (record["status"], record["confidence"], record["score_kind"]) == (
        "success",
        "high",
        "cosine",
    )
    assert record["results_returned"] == 2 and record["top_similarity"] == 0.8
    assert record["rejected_by_threshold"] == 1
    assert record["timings_ms"] == {"embed": 2.0, "search": 3.5, "total": 7.25, "verify": 1.0}
    assert record["total_ms"] == 7.25 and record["error_code"] is None
    assert json.loads(record["filters_json"]) == {
        "entity_types": [],
        "entity_ids": [],
        "keywords": {},
        "event_date_start": None,
        "event_date_end": None,
    }


def test_result_records_one_per_result_without_chunk_text() -> None:
    pack = success_pack()
    records = result_records(pack, requested_at=REQUESTED_AT)
    assert [(r["rank"], r["chunk_id"], r["entity_id"]) for r in records] == [
        (1, "a:chunk:0", "a"),
        (2, "b:chunk:0", "b"),
    ]
    first = records[0]
    assert first["schema"] == RESULTS_SCHEMA and first["request_id"] == REQUEST_ID
    assert (first["similarity"], first["dense"], first["final"]) == (0.8, 0.8, 0.8)
    assert first["sparse"] is None and first["rerank"] is None
    assert first["index_version"] == 3 and first["source_hash"] == "hash-a"
    assert first["event_date"] == "2024-05-01T12:00:00.000000Z"
    assert first["attributes"] == {"equipment_id": "P-101"}
    text = json.dumps(records, allow_nan=False, ensure_ascii=False)
    assert "Text of a:chunk:0" not in text and NORMALIZED not in text


def test_failed_request_record_is_json_with_the_error_code() -> None:
    pack = error_pack("req-7", "QUERY_TOO_LONG", "query_text: 2001 characters, at most 2000")
    record = request_record(pack, query=fingerprint_query(QUERY), requested_at=REQUESTED_AT)
    text = json.dumps(record, allow_nan=False, ensure_ascii=False)
    assert NORMALIZED not in text
    assert (record["status"], record["error_code"]) == ("failed", "QUERY_TOO_LONG")
    assert record["index_version"] is None and record["top_similarity"] is None
    assert result_records(pack, requested_at=REQUESTED_AT) == []


def test_naive_request_time_is_refused() -> None:
    with pytest.raises(ValueError, match="no timezone"):
        request_record(
            success_pack(), query=fingerprint_query(QUERY), requested_at=datetime(2024, 1, 1)
        )
