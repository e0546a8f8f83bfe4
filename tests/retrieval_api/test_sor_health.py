"""A SoR table Retrieve cannot read (a renamed mapped column) is reported through gRPC health
(`sor:<table>` NOT_SERVING, the service itself SERVING), a gauge and one log line; fixing the
schema brings it back."""

from __future__ import annotations

import asyncio
import logging

import psycopg
import pytest
from grpc_health.v1 import health_pb2, health_pb2_grpc

from tests.retrieval_api.stack import Stack


def _status(stack: Stack, service: str) -> int:
    stub = health_pb2_grpc.HealthStub(stack.channel)
    reply = stub.Check(health_pb2.HealthCheckRequest(service=service), timeout=10)
    status: int = reply.status
    return status


def _refresh(stack: Stack) -> None:
    asyncio.run_coroutine_threadsafe(stack.app.server.refresh_health(), stack._loop).result(30)


def _rename(stack: Stack, old: str, new: str) -> None:
    with psycopg.connect(stack.dsn, autocommit=True) as conn:
        conn.execute(f"ALTER TABLE {stack.table} RENAME COLUMN {old} TO {new}".encode())


@pytest.mark.integration
def test_a_renamed_mapped_column_makes_the_table_not_serving_and_visible(
    stack: Stack, caplog: pytest.LogCaptureFixture
) -> None:
    table = f"public.{stack.table}"
    gauge = {"table": table}
    serving = health_pb2.HealthCheckResponse.SERVING
    assert _status(stack, f"sor:{table}") == serving
    assert stack.registry.get_sample_value("ragstream_retrieve_sor_table_unreadable", gauge) == 0

    caplog.set_level(logging.INFO, logger="retrieval_api.sorwatch")
    _rename(stack, "content", "body")
    _refresh(stack)
    _refresh(stack)
    assert _status(stack, f"sor:{table}") == health_pb2.HealthCheckResponse.NOT_SERVING
    assert _status(stack, "") == serving  # the other tables still answer
    assert stack.registry.get_sample_value("ragstream_retrieve_sor_table_unreadable", gauge) == 1
    errors = [r for r in caplog.records if r.levelno == logging.ERROR]
    assert len(errors) == 1 and table in errors[0].getMessage()
    assert "content" in errors[0].getMessage()

    _rename(stack, "body", "content")
    _refresh(stack)
    assert _status(stack, f"sor:{table}") == serving
    assert stack.registry.get_sample_value("ragstream_retrieve_sor_table_unreadable", gauge) == 0
    assert any("readable again" in r.getMessage() for r in caplog.records)
