"""The Retrieve metrics: the label values a healthy server's dashboard and the alerts read are
exported at 0 from the start."""

from __future__ import annotations

import pytest
from prometheus_client import CollectorRegistry

from ragcore.grpc_codes import SERVER_ERROR_CODES
from retrieval_api.metrics import RetrieveMetrics
from schemas.proto.ragstream.retrieval.v1 import retrieval_pb2 as pb

pytestmark = pytest.mark.unit


def _labels(registry: CollectorRegistry, sample: str) -> dict[tuple[str, ...], float]:
    return {
        tuple(s.labels.values()): s.value
        for family in registry.collect()
        for s in family.samples
        if s.name == sample
    }


def test_every_exclusion_reason_of_the_contract_is_exported_at_zero() -> None:
    registry = CollectorRegistry()
    RetrieveMetrics(registry)
    contract = {
        value.name.removeprefix("EXCLUSION_REASON_").lower()
        for value in pb.ExclusionReason.DESCRIPTOR.values
        if value.number != pb.EXCLUSION_REASON_UNSPECIFIED
    }
    exported = _labels(registry, "ragstream_retrieve_excluded_total")
    assert {reason for (reason,) in exported} == contract
    assert set(exported.values()) == {0.0}


def test_requests_start_at_zero_for_the_statuses_and_every_server_side_code() -> None:
    # the error-rate alert's rate() then sees the first burst of a server error in full
    registry = CollectorRegistry()
    metrics = RetrieveMetrics(registry)
    exported = _labels(registry, "ragstream_retrieve_requests_total")
    expected = {("SUCCESS", "OK"), ("NO_EVIDENCE", "OK"), ("IDENTIFIER_MATCH", "OK")}
    expected |= {("FAILED", code) for code in SERVER_ERROR_CODES}
    assert set(exported) == expected
    assert set(exported.values()) == {0.0}
    metrics.requests_of("FAILED", "Unavailable").inc()
    value = registry.get_sample_value
    labels = {"status": "FAILED", "code": "Unavailable"}
    assert value("ragstream_retrieve_requests_total", labels) == 1
