"""The dev stack's watchdog: when the ingest worker loses its processing loop, the stack's gRPC
health says NOT_SERVING at once, it says why, and it stops (the command then exits 1)."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest
from grpc_health.v1 import health_pb2

from ragdev.dev import _watch_ingest
from retrieval_api.grpc_server import SERVICE_NAME

pytestmark = pytest.mark.unit


class Health:
    def __init__(self) -> None:
        self.status: dict[str, Any] = {}

    async def set(self, name: str, status: Any) -> None:
        self.status[name] = status


class App:
    def __init__(self) -> None:
        self.server = type("Server", (), {})()
        self.server.health = Health()


def test_a_lost_ingest_loop_turns_the_stack_not_serving_and_stops_it(
    capsys: pytest.CaptureFixture[str],
) -> None:
    app = App()
    reasons: list[str | None] = [None, None, "ConfigError: the model is gone"]

    def ingest_lost() -> str | None:
        return reasons.pop(0) if len(reasons) > 1 else reasons[0]

    async def scenario() -> list[str]:
        stop = asyncio.Event()
        lost: list[str] = []
        await asyncio.wait_for(_watch_ingest(app, ingest_lost, stop, lost), timeout=10)
        assert stop.is_set()
        return lost

    lost = asyncio.run(scenario())
    assert lost == ["ConfigError: the model is gone"]
    not_serving = health_pb2.HealthCheckResponse.NOT_SERVING
    assert app.server.health.status == {"": not_serving, SERVICE_NAME: not_serving}
    assert "lost its processing loop (ConfigError: the model is gone)" in capsys.readouterr().out


def test_a_running_loop_leaves_the_stack_alone() -> None:
    app = App()

    async def scenario() -> None:
        stop = asyncio.Event()
        task = asyncio.create_task(_watch_ingest(app, lambda: None, stop, []))
        await asyncio.sleep(1.2)  # two checks
        stop.set()
        await asyncio.wait_for(task, timeout=5)

    asyncio.run(scenario())
    assert app.server.health.status == {}
