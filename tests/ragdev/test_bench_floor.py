"""The floor's server processes are configured as Retrieve's are (`ragdev.bench.floor`)."""

from __future__ import annotations

from pathlib import Path

import pytest

from ragcore.embedders.local_onnx import LocalEmbedderConfig
from ragcore.store.edge import EdgeStore
from ragdev.bench.floor import FloorProcesses, FloorSpec
from retrieval_api.grpc_server import server_options
from retrieval_api.settings import GrpcSettings

pytestmark = pytest.mark.unit


def _floor(tmp_path: Path, processes: int, grpc_settings: GrpcSettings) -> FloorProcesses:
    return FloorProcesses(
        FloorSpec("c", "t", 40),
        EdgeStore(tmp_path / "store"),
        processes=processes,
        socket_dir=tmp_path,
        embedder=LocalEmbedderConfig(),
        grpc_settings=grpc_settings,
    )


def test_floor_processes_age_their_connections_as_retrieves_processes_do(tmp_path: Path) -> None:
    """With several processes, a few long-lived clients would load the floor's processes
    unevenly while Retrieve's are evened out by connection ageing: the floor ages its
    connections with the same settings, and a single process ages none, as Retrieve."""
    floor = _floor(tmp_path, 2, GrpcSettings(max_connection_age_s=0.3))
    assert dict(floor.options)["grpc.max_connection_age_ms"] == 300
    retrieve = server_options(GrpcSettings(processes=2, max_connection_age_s=0.3))
    assert floor.options == tuple(retrieve)
    default = _floor(tmp_path, 2, GrpcSettings())
    assert dict(default.options)["grpc.max_connection_age_ms"] == 30_000
    assert _floor(tmp_path, 1, GrpcSettings()).options == ()
