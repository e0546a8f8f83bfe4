"""Fixtures of the Retrieve suites: the real local embedder and a running stack."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from ragcore.embedders.local_onnx import LocalEmbedderConfig, LocalOnnxEmbedder
from ragdev.services.postgres import PostgresCluster
from tests.retrieval_api.stack import Stack


@pytest.fixture(scope="session")
def embedder() -> Iterator[LocalOnnxEmbedder]:
    model = LocalOnnxEmbedder(LocalEmbedderConfig())
    yield model
    model.close()


@pytest.fixture
def stack(
    postgres: PostgresCluster, tmp_path: Path, embedder: LocalOnnxEmbedder
) -> Iterator[Stack]:
    s = Stack(postgres.dsn, tmp_path / "store", embedder)
    yield s
    s.close()
