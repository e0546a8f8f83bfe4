"""The embedder contract against every implementation: the local ONNX model, the
OpenAI-compatible client over a loopback stub, the persistent cache around an embedder, and the
benchmarks' precomputed embedder."""

from __future__ import annotations

import functools
from collections.abc import Iterator
from pathlib import Path

import pytest

from ragcore.embedders.base import Embedder
from ragcore.embedders.cache import CachedEmbedder, EmbeddingCache
from ragcore.embedders.local_onnx import MINILM_SPEC, LocalOnnxEmbedder
from ragdev.bench.ingest import PrecomputedEmbedder
from tests.ragcore.embedders.contract import EmbedderContract, TextEmbedderContract
from tests.ragcore.embedders.test_openai_http import Reply, Stub, _answer, make


@pytest.mark.unit
class TestLocalOnnxEmbedder(TextEmbedderContract):
    @pytest.fixture
    def embedder(self) -> Iterator[Embedder]:
        embedder = LocalOnnxEmbedder()
        yield embedder
        embedder.close()


@pytest.mark.unit
class TestOpenAIEmbedderOverAStub(TextEmbedderContract):
    @pytest.fixture
    def embedder(self) -> Iterator[Embedder]:
        stub = Stub(Reply)
        with stub.serving(functools.partial(_answer, stub), "/v1"):
            yield make(stub)


@pytest.mark.unit
class TestCachedEmbedder(TextEmbedderContract):
    @pytest.fixture
    def embedder(self, tmp_path: Path) -> Iterator[Embedder]:
        stub = Stub(Reply)
        with stub.serving(functools.partial(_answer, stub), "/v1"):
            cache = EmbeddingCache(tmp_path / "cache.sqlite")
            embedder = CachedEmbedder(make(stub), cache, cache_queries=True)
            yield embedder
            embedder.close()


@pytest.mark.unit
class TestPrecomputedEmbedder(EmbedderContract):
    @pytest.fixture
    def embedder(self) -> Embedder:
        return PrecomputedEmbedder(MINILM_SPEC, pool=64)
