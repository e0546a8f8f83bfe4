"""The reranker in the Retrieve server's settings and wiring."""

from __future__ import annotations

from pathlib import Path

import pytest
from prometheus_client import CollectorRegistry
from pydantic import ValidationError

from ragcore.errors import ConfigError
from ragcore.rerankers.http import HttpRerankerConfig
from ragcore.rerankers.onnx_cross_encoder import OnnxRerankerConfig
from retrieval_api.app import build_app
from retrieval_api.pipeline_settings import RetrievalConfig
from retrieval_api.settings import RetrieveSettings

pytestmark = pytest.mark.unit


def test_no_reranker_by_default(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("RAGSTREAM_RERANKER", raising=False)
    settings = RetrieveSettings()
    assert settings.reranker is None
    assert not settings.retrieval.rerank_enabled


def test_reranker_settings_from_the_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("RAGSTREAM_RERANKER__KIND", "onnx")
    monkeypatch.setenv("RAGSTREAM_RERANKER__MODEL_DIR", "/models/ms-marco-MiniLM-L-6-v2")
    monkeypatch.setenv("RAGSTREAM_RERANKER__BATCH_SIZE", "8")
    monkeypatch.setenv("RAGSTREAM_RETRIEVAL__RERANK_ENABLED", "true")
    settings = RetrieveSettings()
    assert settings.reranker == OnnxRerankerConfig(
        model_dir=Path("/models/ms-marco-MiniLM-L-6-v2"), batch_size=8
    )
    assert settings.retrieval.rerank_enabled

    monkeypatch.setenv("RAGSTREAM_RERANKER__KIND", "http")
    monkeypatch.delenv("RAGSTREAM_RERANKER__MODEL_DIR")
    monkeypatch.delenv("RAGSTREAM_RERANKER__BATCH_SIZE")
    monkeypatch.setenv("RAGSTREAM_RERANKER__API", "cohere")
    monkeypatch.setenv("RAGSTREAM_RERANKER__BASE_URL", "http://rerank:8080")
    monkeypatch.setenv("RAGSTREAM_RERANKER__MODEL", "rerank-v3.5")
    monkeypatch.setenv("RAGSTREAM_RERANKER__API_KEY", "rk-env-secret")
    settings = RetrieveSettings()
    assert isinstance(settings.reranker, HttpRerankerConfig)
    assert settings.reranker.url == "http://rerank:8080/v1/rerank"
    assert "rk-env-secret" not in repr(settings)


def test_a_reranker_without_a_kind_is_refused_with_the_field_and_its_choices_named(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.delenv("RAGSTREAM_RERANKER__KIND", raising=False)
    monkeypatch.setenv("RAGSTREAM_RERANKER__MODEL_DIR", "/models/ms-marco-MiniLM-L-6-v2")
    with pytest.raises(ValidationError) as refused:
        RetrieveSettings()
    message = str(refused.value)
    assert "reranker" in message
    assert "'kind' is missing" in message
    assert "'http', 'onnx'" in message
    assert "Unable to extract tag" not in message


def test_rerank_enabled_without_a_reranker_is_a_config_error_before_anything_starts() -> None:
    settings = RetrieveSettings(retrieval=RetrievalConfig(rerank_enabled=True), reranker=None)
    with pytest.raises(ConfigError, match="RAGSTREAM_RERANKER__KIND"):
        build_app(settings, CollectorRegistry())
