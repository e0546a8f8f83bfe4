"""Request validation: every rule, its error code and field, and a fuzz of the whole request."""

from __future__ import annotations

import math
from datetime import UTC, datetime
from typing import Any

import pytest
from google.protobuf.timestamp_pb2 import Timestamp
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from ragcore.errors import InvalidTenantError
from ragcore.store.base import EVENT_DATE, Range
from retrieval_api.pipeline_settings import RetrievalConfig
from retrieval_api.ranking import ScoreKind
from retrieval_api.validate import (
    PermissionDeniedError,
    RequestValidationError,
    ValidatedRequest,
    ValidationCode,
    request_id_or_new,
    validate_request,
)
from schemas.proto.ragstream.retrieval.v1 import retrieval_pb2 as pb

pytestmark = pytest.mark.unit

CONFIG = RetrievalConfig(keyword_filter_fields={"equipment_id": "keyword", "line": "integer"})
TENANT = "acme"


def make(**fields: Any) -> pb.RetrieveRequest:
    fields.setdefault("query_text", "pump vibration alarm")
    return pb.RetrieveRequest(**fields)


def ok(req: pb.RetrieveRequest, config: RetrievalConfig = CONFIG) -> ValidatedRequest:
    return validate_request(req, config, TENANT, new_request_id=lambda: "generated-id")


def invalid(req: pb.RetrieveRequest, config: RetrievalConfig = CONFIG) -> RequestValidationError:
    with pytest.raises(RequestValidationError) as info:
        ok(req, config)
    return info.value


def ts(moment: datetime) -> Timestamp:
    stamp = Timestamp()
    stamp.FromDatetime(moment)
    return stamp


# --- defaults and normalization ----------------------------------------------------------------


def test_minimal_request_gets_defaults_and_callers_tenant() -> None:
    v = ok(make())
    assert v.tenant == TENANT
    assert v.store_filter.tenant_id == TENANT
    assert v.request_id == "generated-id"
    assert v.top_k == 5
    assert v.candidate_k == 20
    assert v.index_version is None
    assert v.min_similarity_override is None
    assert v.store_filter.entity_types == () and v.store_filter.keywords == {}


def test_default_request_id_is_a_uuid4() -> None:
    v = validate_request(make(), CONFIG, TENANT)
    assert len(v.request_id) == 36 and v.request_id[14] == "4"


def test_query_is_trimmed_and_nfc_normalized() -> None:
    v = ok(make(query_text="  \tcafe\u0301 menu\n "))
    assert v.query == "caf\u00e9 menu"


def test_whitespace_only_query_is_empty() -> None:
    err = invalid(make(query_text=" \t\r\n\u3000 "))
    assert err.code == ValidationCode.EMPTY_QUERY
    assert err.field == "query_text"
    assert str(err).startswith("query_text: ")


def test_query_length_is_counted_after_trimming() -> None:
    assert ok(make(query_text="  " + "x" * 2000 + "  ")).query == "x" * 2000
    err = invalid(make(query_text="x" * 2001))
    assert err.code == ValidationCode.QUERY_TOO_LONG
    assert "2001" in str(err) and "2000" in str(err)


@pytest.mark.parametrize("char", ["\x00", "\x07", "\x1b", "\x1f", "\x7f", "\x85", "\x9f"])
def test_control_characters_are_rejected_even_at_the_edges(char: str) -> None:
    for text in (f"pump{char}alarm", f"pump alarm{char}", f"{char}pump alarm"):
        err = invalid(make(query_text=text))
        assert err.code == ValidationCode.CONTROL_CHARACTERS
        assert f"U+{ord(char):04X}" in str(err)


def test_tab_newline_and_carriage_return_are_allowed_inside_the_query() -> None:
    assert ok(make(query_text="pump\talarm\r\nline 2")).query == "pump\talarm\r\nline 2"


def test_error_messages_never_echo_the_query() -> None:
    secret = "confidential-patient-name"
    for text in (f"{secret}\x07", secret * 200):
        assert secret not in str(invalid(make(query_text=text)))


# --- top_k ---------------------------------------------------------------------------------------


@pytest.mark.parametrize("top_k", [0, -1, 51, 2**31 - 1, -(2**31)])
def test_top_k_out_of_range(top_k: int) -> None:
    err = invalid(make(top_k=top_k))
    assert err.code == ValidationCode.TOP_K_OUT_OF_RANGE
    assert err.field == "top_k"


@pytest.mark.parametrize(("top_k", "candidate_k"), [(1, 4), (10, 40), (50, 200)])
def test_candidate_k_is_top_k_times_multiplier_capped(top_k: int, candidate_k: int) -> None:
    v = ok(make(top_k=top_k))
    assert (v.top_k, v.candidate_k) == (top_k, candidate_k)


def test_candidate_k_cap_applies() -> None:
    config = RetrievalConfig(candidate_multiplier=10, max_candidate_k=120)
    assert ok(make(top_k=50), config).candidate_k == 120


# --- tenant --------------------------------------------------------------------------------------


def test_matching_tenant_is_accepted() -> None:
    assert ok(make(tenant=TENANT)).store_filter.tenant_id == TENANT


@pytest.mark.parametrize("forged", ["globex", "ACME", "acme ", "acme__v1"])
def test_another_tenant_is_permission_denied(forged: str) -> None:
    with pytest.raises(PermissionDeniedError) as info:
        ok(make(tenant=forged))
    assert info.value.code == "TENANT_MISMATCH"
    assert forged not in str(info.value)


def test_empty_tenant_when_set_is_invalid() -> None:
    assert invalid(make(tenant="")).code == ValidationCode.BAD_TENANT


def test_unsafe_caller_tenant_is_a_server_fault() -> None:
    with pytest.raises(InvalidTenantError):
        validate_request(make(), CONFIG, "../other")


# --- index version -------------------------------------------------------------------------------


@pytest.mark.parametrize(("raw", "version"), [("3", 3), ("v7", 7), ("V12", 12)])
def test_index_version_is_parsed(raw: str, version: int) -> None:
    assert ok(make(index_version=raw)).index_version == version


@pytest.mark.parametrize("alias", ["latest", "LATEST", " latest ", "current", "active"])
def test_index_version_alias_is_rejected(alias: str) -> None:
    err = invalid(make(index_version=alias))
    assert err.code == ValidationCode.INDEX_VERSION_ALIAS_REJECTED
    assert err.field == "index_version"


@pytest.mark.parametrize("raw", ["", "0", "v0", "03", "3.1", "abc", "-1", "1" * 12])
def test_malformed_index_version(raw: str) -> None:
    assert invalid(make(index_version=raw)).code == ValidationCode.BAD_INDEX_VERSION


# --- threshold override --------------------------------------------------------------------------


def test_override_within_bounds_replaces_the_hard_threshold() -> None:
    v = ok(make(min_similarity_override=0.5))
    assert v.min_similarity_override == 0.5
    thresholds = v.thresholds(CONFIG, ScoreKind.COSINE)
    assert thresholds.hard == 0.5
    assert thresholds.medium == 0.5 and thresholds.high == 0.6  # medium lifted, stays ordered


@pytest.mark.parametrize("value", [-0.1, 0.96, 1.5, math.nan, math.inf, -math.inf])
def test_override_out_of_bounds(value: float) -> None:
    err = invalid(make(min_similarity_override=value))
    assert err.code == ValidationCode.OVERRIDE_OUT_OF_BOUNDS
    assert err.field == "min_similarity_override"


def test_override_bounds_are_inclusive() -> None:
    assert ok(make(min_similarity_override=0.0)).min_similarity_override == 0.0
    assert ok(make(min_similarity_override=0.95)).min_similarity_override == 0.95


# --- request id ----------------------------------------------------------------------------------


def test_well_formed_request_id_is_kept() -> None:
    assert ok(make(request_id="order-42:retry.1_a")).request_id == "order-42:retry.1_a"


@pytest.mark.parametrize("raw", ["has space", "-leading", "x" * 129, "semi;colon", "é"])
def test_malformed_request_id(raw: str) -> None:
    assert invalid(make(request_id=raw)).code == ValidationCode.BAD_REQUEST_ID


def test_request_id_or_new_keeps_good_ids_and_replaces_bad_ones() -> None:
    assert request_id_or_new("abc-1", CONFIG) == "abc-1"
    replaced = request_id_or_new("bad id", CONFIG)
    assert replaced != "bad id" and len(replaced) == 36


# --- filters -------------------------------------------------------------------------------------


def test_list_filters_are_deduplicated_and_sorted() -> None:
    filters = pb.Filters(entity_types=["sop", "incident", "sop"], entity_ids=["e2", "e1"])
    v = ok(make(filters=filters))
    assert v.store_filter.entity_types == ("incident", "sop")
    assert v.store_filter.entity_ids == ("e1", "e2")


@pytest.mark.parametrize(
    "filters",
    [
        pb.Filters(entity_types=[""]),
        pb.Filters(entity_ids=["x" * 257]),
        pb.Filters(entity_ids=["e\x001"]),
    ],
)
def test_bad_list_filter_values(filters: pb.Filters) -> None:
    err = invalid(make(filters=filters))
    assert err.code in {ValidationCode.BAD_FILTER_VALUE, ValidationCode.CONTROL_CHARACTERS}
    assert err.field.startswith("filters.entity_")


def test_too_many_filter_values() -> None:
    err = invalid(make(filters=pb.Filters(entity_ids=[f"e{i}" for i in range(101)])))
    assert err.code == ValidationCode.TOO_MANY_FILTER_VALUES
    assert err.field == "filters.entity_ids"


def test_configured_keyword_fields_are_typed() -> None:
    filters = pb.Filters()
    filters.keywords["equipment_id"].values.extend(["P-101", "P-100", "P-101"])
    filters.keywords["line"].values.extend(["10", "9", "-3"])
    v = ok(make(filters=filters))
    assert v.store_filter.keywords == {"equipment_id": ("P-100", "P-101"), "line": (-3, 9, 10)}


def test_bool_keyword_field() -> None:
    config = RetrievalConfig(keyword_filter_fields={"safety_critical": "bool"})
    filters = pb.Filters()
    filters.keywords["safety_critical"].values.append("True")
    assert ok(make(filters=filters), config).store_filter.keywords == {"safety_critical": (True,)}
    filters.keywords["safety_critical"].values.append("yes")
    assert invalid(make(filters=filters), config).code == ValidationCode.BAD_FILTER_VALUE


def test_unknown_keyword_field_names_the_field_and_the_allowed_ones() -> None:
    filters = pb.Filters()
    filters.keywords["tenant_id"].values.append("globex")
    err = invalid(make(filters=filters))
    assert err.code == ValidationCode.UNKNOWN_FILTER_FIELD
    assert "'tenant_id'" in str(err) and "equipment_id, line" in str(err)


@pytest.mark.parametrize("values", [[], ["ten"], ["1.5"], [str(2**63)]])
def test_bad_keyword_values(values: list[str]) -> None:
    filters = pb.Filters()
    filters.keywords["line"].values.extend(values)
    err = invalid(make(filters=filters))
    assert err.code == ValidationCode.BAD_FILTER_VALUE
    assert err.field == "filters.keywords['line']"


def test_date_range_becomes_an_inclusive_event_date_range() -> None:
    start = datetime(2024, 1, 1, tzinfo=UTC)
    end = datetime(2024, 6, 30, 23, 59, 59, 123456, tzinfo=UTC)
    v = ok(make(filters=pb.Filters(event_date_start=ts(start), event_date_end=ts(end))))
    assert v.store_filter.ranges == {EVENT_DATE: Range(gte=start, lte=end)}


def test_open_ended_date_ranges() -> None:
    start = datetime(2024, 1, 1, tzinfo=UTC)
    v = ok(make(filters=pb.Filters(event_date_start=ts(start))))
    assert v.store_filter.ranges == {EVENT_DATE: Range(gte=start)}
    v = ok(make(filters=pb.Filters(event_date_end=ts(start))))
    assert v.store_filter.ranges == {EVENT_DATE: Range(lte=start)}


def test_equal_start_and_end_are_allowed() -> None:
    moment = ts(datetime(2024, 1, 1, tzinfo=UTC))
    assert ok(make(filters=pb.Filters(event_date_start=moment, event_date_end=moment)))


def test_start_after_end_is_a_bad_date_range() -> None:
    filters = pb.Filters(
        event_date_start=ts(datetime(2024, 2, 1, tzinfo=UTC)),
        event_date_end=ts(datetime(2024, 1, 1, tzinfo=UTC)),
    )
    err = invalid(make(filters=filters))
    assert err.code == ValidationCode.BAD_DATE_RANGE
    assert "filters.event_date_start" in str(err) and "filters.event_date_end" in str(err)


@pytest.mark.parametrize(
    ("seconds", "nanos"), [(0, -1), (0, 1_000_000_000), (253_402_300_800, 0), (-(2**62), 0)]
)
def test_invalid_timestamps(seconds: int, nanos: int) -> None:
    filters = pb.Filters(event_date_end=Timestamp(seconds=seconds, nanos=nanos))
    err = invalid(make(filters=filters))
    assert err.code == ValidationCode.BAD_TIMESTAMP
    assert err.field == "filters.event_date_end"


# --- config --------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "kwargs",
    [
        {"default_top_k": 60},
        {"max_candidate_k": 10},
        {"keyword_filter_fields": {"tenant_id": "keyword"}},
        {"keyword_filter_fields": {"bad name": "keyword"}},
        {"min_similarity_override_min": 0.9, "min_similarity_override_max": 0.1},
        {"dense_weight": 0.0, "sparse_weight": 0.0},
        {"cosine_thresholds": {"hard": 0.5, "medium": 0.4, "high": 0.6}},
    ],
)
def test_inconsistent_config_is_rejected(kwargs: dict[str, Any]) -> None:
    with pytest.raises(ValueError, match="validation error"):
        RetrievalConfig(**kwargs)


# --- fuzz ----------------------------------------------------------------------------------------

_text = st.text(alphabet=st.characters(exclude_categories=["Cs"]), max_size=40)
_stamp = st.builds(
    Timestamp,
    seconds=st.integers(-(2**63), 2**63 - 1),
    nanos=st.integers(-(2**31), 2**31 - 1),
)
_plain_stamp = st.builds(
    Timestamp, seconds=st.integers(0, 4_102_444_800), nanos=st.integers(0, 999_999_999)
)


def _mostly(usual: st.SearchStrategy[Any], wild: st.SearchStrategy[Any]) -> st.SearchStrategy[Any]:
    """`usual` 3 times in 4, so later rules are reached as often as the first ones."""
    return st.integers(0, 3).flatmap(lambda i: wild if i == 0 else usual)


@st.composite
def _requests(draw: st.DrawFn) -> pb.RetrieveRequest:
    words = st.text(alphabet="abc \t\n\u0301\u00e9", min_size=1, max_size=30)
    req = pb.RetrieveRequest(
        query_text=draw(_mostly(words, st.one_of(_text, st.text("ab ", min_size=1990)))),
        request_id=draw(_mostly(st.sampled_from(["", "r-1", "a.b:c_d"]), _text)),
    )
    if draw(st.booleans()):
        req.tenant = draw(_mostly(st.just(TENANT), _text))
    if draw(st.booleans()):
        req.index_version = draw(_mostly(st.sampled_from(["3", "v2"]), _text))
    if draw(st.booleans()):
        req.top_k = draw(_mostly(st.integers(1, 50), st.integers(-(2**31), 2**31 - 1)))
    if draw(st.booleans()):
        req.min_similarity_override = draw(
            _mostly(st.floats(0.0, 0.95), st.floats(allow_nan=True, allow_infinity=True))
        )
    values = st.lists(_mostly(st.sampled_from(["x", "P-1", "7", "-2"]), _text), max_size=4)
    req.filters.entity_types.extend(draw(values))
    req.filters.entity_ids.extend(draw(values))
    names = _mostly(st.sampled_from(["equipment_id", "line"]), _text)
    for name, listed in draw(st.dictionaries(names, values, max_size=3)).items():
        req.filters.keywords[name].values.extend(listed)
    if draw(st.booleans()):
        req.filters.event_date_start.CopyFrom(draw(_mostly(_plain_stamp, _stamp)))
    if draw(st.booleans()):
        req.filters.event_date_end.CopyFrom(draw(_mostly(_plain_stamp, _stamp)))
    return req


@given(_requests())
@settings(max_examples=400, deadline=None, suppress_health_check=[HealthCheck.too_slow])
def test_fuzzed_requests_only_raise_validation_or_permission_errors(
    req: pb.RetrieveRequest,
) -> None:
    try:
        v = validate_request(req, CONFIG, TENANT)
    except RequestValidationError as err:
        assert err.code in set(ValidationCode) and str(err).startswith(f"{err.field}: ")
    except PermissionDeniedError:
        assert req.HasField("tenant") and req.tenant != TENANT
    else:
        # Whatever passes is normalized, bounded and scoped to the caller.
        assert v.store_filter.tenant_id == TENANT
        assert (
            1 <= v.top_k <= CONFIG.max_top_k and v.top_k <= v.candidate_k <= CONFIG.max_candidate_k
        )
        assert 0 < len(v.query) <= CONFIG.max_query_chars and v.query == v.query.strip()


def test_token_budget_is_absent_or_within_the_configured_maximum() -> None:
    assert ok(make()).max_context_tokens is None
    assert ok(make(max_context_tokens=2000)).max_context_tokens == 2000
    small = RetrievalConfig(max_context_tokens=100)
    assert ok(make(max_context_tokens=100), small).max_context_tokens == 100
    for value, config in ((0, CONFIG), (101, small)):
        err = invalid(make(max_context_tokens=value), config)
        assert err.code == ValidationCode.CONTEXT_BUDGET_OUT_OF_RANGE
        assert err.field == "max_context_tokens"
