"""The reranker contract against every implementation: the HTTP client over a loopback stub of
both wire formats (TEI `/rerank`, Cohere `/v1/rerank`) and the local ONNX cross-encoder on the
tiny generated model (no real weights ship with ragstream)."""

from __future__ import annotations

import functools
from collections.abc import Iterator
from pathlib import Path

import pytest

from ragcore.rerankers import RerankerAdapter
from ragcore.rerankers.onnx_cross_encoder import OnnxCrossEncoder, OnnxRerankerConfig
from tests.ragcore.rerankers.contract import RerankerContract
from tests.ragcore.rerankers.test_http import Reply, Stub, _answer, make
from tests.ragcore.rerankers.tiny_model import write_model_dir


@pytest.mark.unit
class TestHttpRerankerTei(RerankerContract):
    @pytest.fixture
    def reranker(self) -> Iterator[RerankerAdapter]:
        stub = Stub(Reply)
        with stub.serving(functools.partial(_answer, stub)):
            yield make(stub, api="tei")


@pytest.mark.unit
class TestHttpRerankerCohere(RerankerContract):
    @pytest.fixture
    def reranker(self) -> Iterator[RerankerAdapter]:
        stub = Stub(Reply)
        with stub.serving(functools.partial(_answer, stub)):
            yield make(stub, api="cohere")


@pytest.mark.unit
class TestOnnxCrossEncoder(RerankerContract):
    @pytest.fixture
    def reranker(self, tmp_path: Path) -> Iterator[RerankerAdapter]:
        reranker = OnnxCrossEncoder(OnnxRerankerConfig(model_dir=write_model_dir(tmp_path)))
        yield reranker
        reranker.close()
