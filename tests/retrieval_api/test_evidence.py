"""Evidence packs: SoR verdicts exclude with reasons, sources mirror results, bytes are stable."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime

import pytest
from google.protobuf.timestamp_pb2 import Timestamp
from hypothesis import given
from hypothesis import strategies as st

from retrieval_api.evidence import (
    CalibrationInfo,
    IndexInfo,
    Verdict,
    _timestamp,
    build_pack,
    entities_to_verify,
    error_pack,
    pack_status,
    reindex_requests,
    serialize_pack,
    verdicts_from_sor,
)
from retrieval_api.pipeline_settings import RetrievalConfig
from retrieval_api.ranking import (
    Candidate,
    ExclusionReason,
    Ranking,
    ScoreKind,
    Thresholds,
    rank,
)
from retrieval_api.validate import ValidatedRequest
from schemas.proto.ragstream.retrieval.v1 import retrieval_pb2 as pb
from tests.retrieval_api.helpers import REQUEST_ID, TENANT, cand, fused, request

pytestmark = pytest.mark.unit

CONFIG = RetrievalConfig(keyword_filter_fields={"equipment_id": "keyword"})
INDEX = IndexInfo("rag__acme__v3", 3, "all-MiniLM-L6-v2@onnx-int8-1.0.0")
NOW = datetime(2024, 7, 1, 8, 30, tzinfo=UTC)
TIMINGS = {"embed": 2.5, "search": 4.0, "verify": 1.25, "total": 9.0}


def candidates() -> list[Candidate]:
    return [
        cand("a:chunk:0", 0.81, equipment_id="P-101"),
        cand("b:chunk:2", 0.74),
        cand("c:chunk:0", 0.55),
        cand("d:chunk:1", 0.52),
        cand("e:chunk:0", 0.45),
    ]


def ranked(req: ValidatedRequest, items: Sequence[Candidate] | None = None) -> Ranking:
    return rank(
        candidates() if items is None else items,
        store_filter=req.store_filter,
        top_k=req.top_k,
        thresholds=req.thresholds(CONFIG, ScoreKind.COSINE),
        answering_chunks=False,  # one chunk per entity: these tests are about the pack
    )


def pack_for(
    verdicts: Mapping[str, Verdict],
    *,
    top_k: int = 3,
    items: Sequence[Candidate] | None = None,
    timings: Mapping[str, float] = TIMINGS,
) -> pb.EvidencePack:
    req = request(CONFIG, top_k=top_k)
    return build_pack(
        req,
        INDEX,
        ranked(req, items),
        verdicts,
        retrieved_at=NOW,
        timings_ms=timings,
        attribute_fields=("equipment_id",),
    )


ALL_OK = {c.chunk_id: Verdict.OK for c in candidates()}


def test_all_verified_is_success_with_top_k_results_in_order() -> None:
    pack = pack_for(ALL_OK)
    assert pack.status == pb.RETRIEVAL_STATUS_SUCCESS
    assert not pack.HasField("error")
    assert [r.chunk_id for r in pack.results] == ["a:chunk:0", "b:chunk:2", "c:chunk:0"]
    assert [r.rank for r in pack.results] == [1, 2, 3]
    assert pack.results_returned == 3 and pack.top_k_requested == 3
    assert pack.confidence == pb.CONFIDENCE_HIGH  # best final 0.81 >= 0.60
    assert pack.score_kind == pb.SCORE_KIND_COSINE
    assert pack.min_score == RetrievalConfig().cosine_thresholds.hard
    assert (pack.request_id, pack.tenant) == (REQUEST_ID, TENANT)
    assert (pack.index_name, pack.index_version) == ("rag__acme__v3", 3)
    assert pack.embedding_model_version == INDEX.embedding_model_version
    assert pack.similarity_metric == "cosine"
    assert pack.debug.candidate_k == 12 and pack.debug.candidates_returned == 5
    assert pack.debug.verified == 3
    assert dict(pack.timings_ms) == TIMINGS


def test_stale_deleted_and_missing_are_excluded_with_reasons_and_backfilled() -> None:
    verdicts = {
        **ALL_OK,
        "a:chunk:0": Verdict.STALE,
        "b:chunk:2": Verdict.DELETED,
        "d:chunk:1": Verdict.MISSING,
    }
    pack = pack_for(verdicts)
    # a, b and d fail the SoR check; c and e (e from the reserve beyond top_k=3) are returned.
    assert [r.chunk_id for r in pack.results] == ["c:chunk:0", "e:chunk:0"]
    assert [(x.chunk_id, x.entity_id, x.reason) for x in pack.excluded] == [
        ("a:chunk:0", "a", pb.EXCLUSION_REASON_STALE),
        ("b:chunk:2", "b", pb.EXCLUSION_REASON_DELETED),
        ("d:chunk:1", "d", pb.EXCLUSION_REASON_MISSING),
    ]
    assert pack.excluded[0].score == pytest.approx(0.81)
    debug = pack.debug
    assert (debug.excluded_stale, debug.excluded_deleted, debug.excluded_missing) == (1, 1, 1)
    assert debug.verified == 5
    assert pack.confidence == pb.CONFIDENCE_MEDIUM  # best verified final 0.55
    assert reindex_requests(pack) == [
        ("a", ExclusionReason.STALE),
        ("b", ExclusionReason.DELETED),
        ("d", ExclusionReason.MISSING),
    ]


def test_everything_stale_is_no_evidence_never_a_fallback() -> None:
    pack = pack_for({c.chunk_id: Verdict.STALE for c in candidates()})
    assert pack.status == pb.RETRIEVAL_STATUS_NO_EVIDENCE
    assert len(pack.results) == 0 and len(pack.sources) == 0
    assert pack.confidence == pb.CONFIDENCE_NONE
    assert pack.debug.excluded_stale == 5


def test_ranking_exclusions_come_first_in_the_pack() -> None:
    items = [*candidates(), cand("a:chunk:1", 0.70), cand("z:chunk:0", 0.10)]
    pack = pack_for(ALL_OK, items=items)
    assert [(x.chunk_id, x.reason) for x in pack.excluded] == [
        ("a:chunk:1", pb.EXCLUSION_REASON_DUPLICATE),
        ("z:chunk:0", pb.EXCLUSION_REASON_BELOW_THRESHOLD),
    ]
    assert pack.debug.deduplicated == 1 and pack.debug.rejected_by_threshold == 1


def test_nothing_survived_ranking_is_no_evidence() -> None:
    pack = pack_for({}, items=[cand("a:chunk:0", 0.1)])
    assert pack.status == pb.RETRIEVAL_STATUS_NO_EVIDENCE
    assert (
        pack.debug.verified == 0 and pack.excluded[0].reason == pb.EXCLUSION_REASON_BELOW_THRESHOLD
    )


def test_a_chunk_without_a_verdict_is_never_returned() -> None:
    with pytest.raises(ValueError, match="no SoR verdict for chunk 'a:chunk:0'"):
        pack_for({"b:chunk:2": Verdict.OK})


def test_sources_match_results_one_to_one() -> None:
    pack = pack_for(ALL_OK)
    assert len(pack.sources) == len(pack.results)
    retrieved_at = Timestamp()
    retrieved_at.FromDatetime(NOW)
    for result, source in zip(pack.results, pack.sources, strict=True):
        assert source.chunk_id == result.chunk_id
        assert source.entity_id == result.entity_id
        assert source.entity_type == result.entity_type
        assert source.source_hash == result.source_hash == f"hash-{result.entity_id}"
        assert source.locator == result.locator
        assert source.scores == result.scores
        assert source.source_reference == result.source_reference
        assert source.retrieved_at == retrieved_at


def test_result_fields_come_from_the_payload() -> None:
    first = pack_for(ALL_OK).results[0]
    assert first.entity_id == "a" and first.entity_type == "KNOWLEDGE_ARTIFACT"
    assert first.title == "Title of a" and first.text == "Text of a:chunk:0"
    assert first.locator == pb.Locator(
        chunk_index=0,
        char_start=0,
        char_end=90,
        section_path=["Setup", "Install"],
        extracted_from="markdown",
    )
    assert first.event_date.ToDatetime(tzinfo=UTC) == datetime(2024, 5, 1, 12, tzinfo=UTC)
    assert first.source_reference == "sor://acme/KNOWLEDGE_ARTIFACT/a"
    assert dict(first.attributes) == {"equipment_id": "P-101"}
    scores = first.scores
    assert scores.final == scores.similarity == scores.dense == 0.81
    assert not scores.HasField("sparse") and not scores.HasField("rerank")
    assert scores.dense_rank == 1 and not scores.HasField("sparse_rank")


def test_filters_applied_echo_the_store_filter() -> None:
    start, end = Timestamp(seconds=1_700_000_000), Timestamp(seconds=1_800_000_000)
    filters = pb.Filters(
        entity_types=["SOP", "INCIDENT"], event_date_start=start, event_date_end=end
    )
    filters.keywords["equipment_id"].values.extend(["P-2", "P-1"])
    req = request(CONFIG, filters=filters)
    pack = build_pack(req, INDEX, ranked(req, []), {}, retrieved_at=NOW, timings_ms={})
    applied = pack.filters_applied
    assert list(applied.entity_types) == ["INCIDENT", "SOP"]
    assert list(applied.keywords["equipment_id"].values) == ["P-1", "P-2"]
    assert (applied.event_date_start, applied.event_date_end) == (start, end)


def test_same_input_gives_byte_identical_packs_except_timings() -> None:
    first = pack_for(ALL_OK, timings={"total": 9.0, "embed": 1.0})
    # Same candidates in another order, other timings.
    req = request(CONFIG, top_k=3)
    second = build_pack(
        req,
        INDEX,
        ranked(req, candidates()[::-1]),
        dict(reversed(list(ALL_OK.items()))),
        retrieved_at=NOW,
        timings_ms={"embed": 3.0, "search": 5.0, "total": 12.0},
        attribute_fields=("equipment_id",),
    )
    assert serialize_pack(first) != serialize_pack(second)
    first.ClearField("timings_ms")
    second.ClearField("timings_ms")
    assert serialize_pack(first) == serialize_pack(second)


def test_error_pack_is_failed_with_a_code() -> None:
    pack = error_pack("req-9", "INDEX_NOT_FOUND", "tenant acme has no index v4", tenant=TENANT)
    assert pack.status == pb.RETRIEVAL_STATUS_FAILED
    assert (pack.error.code, pack.error.message) == (
        "INDEX_NOT_FOUND",
        "tenant acme has no index v4",
    )
    assert pack.confidence == pb.CONFIDENCE_NONE
    assert len(pack.results) == 0 and not pack.HasField("index_version")


def test_bad_timings_are_refused() -> None:
    with pytest.raises(ValueError, match="timing 'total'"):
        error_pack("r", "X", "y", timings_ms={"total": float("nan")})


# --- SoR verdicts --------------------------------------------------------------------------------


@dataclass(frozen=True)
class State:
    exists: bool = True
    deleted: bool = False
    content_hash: str | None = None
    mapped: bool = True
    row_error: str | None = None


def test_verdicts_from_the_sor_state_of_each_entity() -> None:
    req = request(CONFIG, top_k=5)
    ranking = ranked(req)
    assert entities_to_verify(ranking) == ["a", "b", "c", "d", "e"]
    states = {
        "a": State(content_hash="HASH-A"),  # same hash, other case
        "b": State(content_hash="changed"),
        "c": State(deleted=True, content_hash="hash-c"),
        "d": State(exists=False),
        "e": State(exists=False, mapped=False),  # its SoR table cannot be read
    }
    assert verdicts_from_sor(ranking.survivors, states) == {
        "a:chunk:0": Verdict.OK,
        "b:chunk:2": Verdict.STALE,
        "c:chunk:0": Verdict.DELETED,
        "d:chunk:1": Verdict.MISSING,
        "e:chunk:0": Verdict.UNVERIFIABLE,
    }
    del states["e"]
    assert verdicts_from_sor(ranking.survivors, states)["e:chunk:0"] is Verdict.MISSING
    # a row that cannot be judged is neither OK nor stale; a soft-deleted one is deleted
    states["a"] = State(row_error="MAPPING_ERROR")
    states["c"] = State(deleted=True, row_error="RecursionError")
    judged = verdicts_from_sor(ranking.survivors, states)
    assert (judged["a:chunk:0"], judged["c:chunk:0"]) == (Verdict.UNREADABLE, Verdict.DELETED)


def test_unverifiable_hits_are_excluded_and_never_asked_to_be_reindexed() -> None:
    pack = pack_for({**ALL_OK, "a:chunk:0": Verdict.UNVERIFIABLE})
    assert "a:chunk:0" not in [r.chunk_id for r in pack.results]
    assert [(x.chunk_id, x.reason) for x in pack.excluded] == [
        ("a:chunk:0", pb.EXCLUSION_REASON_UNVERIFIABLE)
    ]
    assert reindex_requests(pack) == []


def test_unreadable_rows_are_excluded_with_their_reason_and_never_asked_to_be_reindexed() -> None:
    pack = pack_for({**ALL_OK, "a:chunk:0": Verdict.UNREADABLE})
    assert "a:chunk:0" not in [r.chunk_id for r in pack.results]
    assert pack.results  # the other hits are served
    assert [(x.chunk_id, x.reason) for x in pack.excluded] == [
        ("a:chunk:0", pb.EXCLUSION_REASON_SOR_ROW_UNREADABLE)
    ]
    assert reindex_requests(pack) == []


def _evidence_ranking(items: Sequence[Candidate]) -> Ranking:
    req = request(CONFIG, top_k=3)
    thresholds = CONFIG.thresholds(
        ScoreKind.EVIDENCE, calibrated=Thresholds(0.4, 0.6, 0.85)
    )  # floor 0.4 x supporting_ratio
    return rank(
        items,
        store_filter=req.store_filter,
        top_k=3,
        thresholds=thresholds,
        score_kind=ScoreKind.EVIDENCE,
        order="fused",
        order_by="rrf(dense 1, lexical 1, k 60)",
    )


def _scored(chunk_id: str, evidence: float, ids: tuple[str, ...] = ()) -> Candidate:
    base = cand(chunk_id, 0.5)
    return Candidate(base.hit, 0.5, evidence=evidence, lexical=7.5, identifiers=ids)


def test_pack_reports_the_evidence_score_beside_the_channel_scores_and_the_calibration() -> None:
    req = request(CONFIG, top_k=3)
    ranking = _evidence_ranking([_scored("a:chunk:0", 0.9, ("p-101",)), _scored("b:chunk:0", 0.5)])
    pack = build_pack(
        req,
        INDEX,
        ranking,
        {"a:chunk:0": Verdict.OK, "b:chunk:0": Verdict.OK},
        retrieved_at=NOW,
        timings_ms=TIMINGS,
        calibration=CalibrationInfo("fitted", "abc123def456", NOW),
        lexical_details={"a:chunk:0": (1.5, 0.8)},
    )
    assert pack.score_kind == pb.SCORE_KIND_EVIDENCE
    assert pack.order_by == "rrf(dense 1, lexical 1, k 60)"
    assert (pack.calibration.source, pack.calibration.fingerprint) == ("fitted", "abc123def456")
    top = pack.results[0]
    assert top.scores.evidence == top.scores.final == 0.9
    assert top.scores.dense == 0.5 and top.scores.lexical == 7.5
    assert (top.scores.lexical_normalized, top.scores.coverage) == (1.5, 0.8)
    assert list(top.matched_identifiers) == ["p-101"]
    assert pack.confidence == pb.CONFIDENCE_HIGH
    assert pack.min_score == 0.4


def test_supporting_chunks_alone_are_no_evidence_when_the_sor_excludes_the_best_one() -> None:
    req = request(CONFIG, top_k=3)
    ranking = _evidence_ranking([_scored("a:chunk:0", 0.9), _scored("b:chunk:0", 0.2)])
    assert [r.chunk_id for r in ranking.results] == ["a:chunk:0", "b:chunk:0"]
    pack = build_pack(
        req,
        INDEX,
        ranking,
        {"a:chunk:0": Verdict.STALE, "b:chunk:0": Verdict.OK},
        retrieved_at=NOW,
        timings_ms=TIMINGS,
    )
    assert pack.status == pb.RETRIEVAL_STATUS_NO_EVIDENCE
    assert not pack.results
    reasons = {(x.chunk_id, x.reason) for x in pack.excluded}
    assert ("a:chunk:0", pb.EXCLUSION_REASON_STALE) in reasons
    assert ("b:chunk:0", pb.EXCLUSION_REASON_BELOW_THRESHOLD) in reasons


def test_near_duplicates_are_one_result_listing_the_others_after_the_sor_check() -> None:
    ticket = "Login fails with E-2113 (#{n})\n\nThe login page shows error E-2113. Account {n}."
    items = [cand(f"t{n}:chunk:0", 0.9 - n / 100, text=ticket.format(n=n)) for n in range(4)]
    items.append(cand("note:chunk:0", 0.5, text="Release 2.3 fixed E-2113 (SAML clock drift)."))
    req = request(CONFIG, top_k=2)
    ranking = rank(
        items,
        store_filter=req.store_filter,
        top_k=2,
        thresholds=req.thresholds(CONFIG, ScoreKind.COSINE),
        near_duplicate_similarity=0.9,
    )
    assert entities_to_verify(ranking) == ["note", "t0", "t1", "t2", "t3"]
    verdicts = {c.chunk_id: Verdict.OK for c in items} | {"t0:chunk:0": Verdict.STALE}
    verdicts["t2:chunk:0"] = Verdict.DELETED
    pack = build_pack(req, INDEX, ranking, verdicts, retrieved_at=NOW, timings_ms=TIMINGS)
    # t0 failed the SoR check: the best verified copy (t1) is the result, t3 its also_in;
    # the deleted copy is excluded (and reindexed), never listed
    assert [r.chunk_id for r in pack.results] == ["t1:chunk:0", "note:chunk:0"]
    [similar] = pack.results[0].also_in
    assert (similar.chunk_id, similar.entity_id) == ("t3:chunk:0", "t3")
    assert similar.similarity == 1.0
    assert similar.source_reference == "sor://acme/KNOWLEDGE_ARTIFACT/t3"
    assert not pack.results[1].also_in
    assert [(x.chunk_id, x.reason) for x in pack.excluded] == [
        ("t0:chunk:0", pb.EXCLUSION_REASON_STALE),
        ("t2:chunk:0", pb.EXCLUSION_REASON_DELETED),
    ]
    assert pack.debug.collapsed == 3 and pack.debug.verified == 5


@given(st.datetimes(timezones=st.timezones()))
def test_a_timestamp_is_what_the_protobuf_conversion_makes_of_the_moment(moment: datetime) -> None:
    reference = Timestamp()
    reference.FromDatetime(moment.astimezone(UTC))
    assert _timestamp(moment) == reference


def test_a_naive_moment_has_no_timestamp() -> None:
    with pytest.raises(ValueError, match="no timezone"):
        _timestamp(datetime(2024, 7, 1, 8, 30))


def test_identifier_only_results_are_identifier_match_never_success() -> None:
    """Issue 43 item 4: a pack whose results are there only because they hold an identifier
    of the query (none at the hard threshold) is IDENTIFIER_MATCH with confidence NONE."""
    below = Candidate(
        fused("rel:chunk:0", dense=0.1), 0.1, identifiers=("e-2113",)
    )  # cosine 0.1: under every hard threshold of the cosine kind
    pack = pack_for({"rel:chunk:0": Verdict.OK}, items=[below])
    assert pack.status == pb.RETRIEVAL_STATUS_IDENTIFIER_MATCH
    assert pack.confidence == pb.CONFIDENCE_NONE
    assert [r.matched_identifiers for r in pack.results] == [["e-2113"]]
    # one result at the threshold makes it SUCCESS, the identifier chunk still listed
    above = cand("ans:chunk:0", 0.81)
    pack = pack_for({"rel:chunk:0": Verdict.OK, "ans:chunk:0": Verdict.OK}, items=[below, above])
    assert pack.status == pb.RETRIEVAL_STATUS_SUCCESS
    assert pack.confidence != pb.CONFIDENCE_NONE
    assert {r.chunk_id for r in pack.results} == {"rel:chunk:0", "ans:chunk:0"}


@pytest.mark.parametrize(
    ("finals", "expected"),
    [
        ([], pb.RETRIEVAL_STATUS_NO_EVIDENCE),
        ([0.1, 0.2], pb.RETRIEVAL_STATUS_IDENTIFIER_MATCH),
        ([0.1, 0.3], pb.RETRIEVAL_STATUS_SUCCESS),  # inclusive
    ],
)
def test_pack_status_says_whether_a_result_reaches_the_threshold(
    finals: list[float], expected: int
) -> None:
    assert pack_status(finals, 0.3) == expected
