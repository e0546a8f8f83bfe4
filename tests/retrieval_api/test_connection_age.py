"""Connection ageing of the Retrieve server (`grpc.max_connection_age_s`): on by default only
with several server processes, where the kernel spreads connections, not calls (the loopback
behaviour is tested in test_processes.py)."""

from __future__ import annotations

import pytest
from pydantic import ValidationError

from retrieval_api.grpc_server import server_options
from retrieval_api.settings import DEFAULT_MAX_CONNECTION_AGE_S, GrpcSettings

pytestmark = pytest.mark.unit


def test_several_processes_age_connections_by_default_and_one_process_does_not() -> None:
    assert server_options(GrpcSettings()) == []
    assert server_options(GrpcSettings(processes=2)) == [
        ("grpc.max_connection_age_ms", round(DEFAULT_MAX_CONNECTION_AGE_S * 1000)),
        ("grpc.max_connection_age_grace_ms", 30_000),
    ]


def test_a_configured_age_applies_to_any_process_count_and_zero_means_never() -> None:
    assert server_options(GrpcSettings(max_connection_age_s=2.5, max_connection_age_grace_s=4)) == [
        ("grpc.max_connection_age_ms", 2500),
        ("grpc.max_connection_age_grace_ms", 4000),
    ]
    assert server_options(GrpcSettings(processes=4, max_connection_age_s=0)) == []
    # below a millisecond still ages (gRPC takes whole milliseconds)
    assert server_options(GrpcSettings(max_connection_age_s=0.0001))[0] == (
        "grpc.max_connection_age_ms",
        1,
    )


def test_negative_ages_and_a_zero_grace_are_refused() -> None:
    with pytest.raises(ValidationError):
        GrpcSettings(max_connection_age_s=-1)
    with pytest.raises(ValidationError):
        GrpcSettings(max_connection_age_grace_s=0)
