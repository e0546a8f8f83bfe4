"""`build_embedder` over the discriminated embedder config."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
from prometheus_client import CollectorRegistry
from pydantic import ValidationError

from ragcore.embedders import (
    MINILM_SPEC,
    CachedEmbedder,
    EmbeddingCacheConfig,
    LocalEmbedderConfig,
    LocalOnnxEmbedder,
    OpenAIEmbedder,
    OpenAIEmbedderConfig,
    build_embedder,
    embedder_config_adapter,
)
from ragcore.errors import ConfigError
from ragcore.settings import ServiceSettings


@pytest.mark.unit
def test_config_is_discriminated_by_kind() -> None:
    local = embedder_config_adapter.validate_python({"kind": "local", "batch_size": 16})
    assert isinstance(local, LocalEmbedderConfig) and local.batch_size == 16
    remote = embedder_config_adapter.validate_python(
        {"kind": "openai", "base_url": "http://127.0.0.1:1/v1", "model": "m", "dimension": 8}
    )
    assert isinstance(remote, OpenAIEmbedderConfig)
    with pytest.raises(ValidationError):
        embedder_config_adapter.validate_python({"kind": "torch"})
    with pytest.raises(ValidationError):
        embedder_config_adapter.validate_python({"kind": "local", "bogus": 1})


@pytest.mark.unit
def test_a_config_without_a_kind_is_the_local_embedder(monkeypatch: pytest.MonkeyPatch) -> None:
    """Setting one field of the default embedder does not also need its kind (pydantic's bare
    discriminator refused that with "Unable to extract tag using discriminator 'kind'")."""
    local = embedder_config_adapter.validate_python({"execution": "int8"})
    assert local == LocalEmbedderConfig(execution="int8")
    monkeypatch.delenv("RAGSTREAM_EMBEDDER__KIND", raising=False)
    monkeypatch.setenv("RAGSTREAM_EMBEDDER__FUSED_ATTENTION", "false")
    monkeypatch.setenv("RAGSTREAM_NEXT_EMBEDDER__EXECUTION", "int8")
    settings = ServiceSettings()
    assert settings.embedder == LocalEmbedderConfig(fused_attention=False)
    assert settings.next_embedder == LocalEmbedderConfig(execution="int8")
    with pytest.raises(ValidationError, match="'local', 'openai'"):
        embedder_config_adapter.validate_python({"kind": "torch"})


@pytest.mark.unit
def test_build_local_with_cache_exports_metrics(tmp_path: Path) -> None:
    registry = CollectorRegistry()
    embedder = build_embedder(
        LocalEmbedderConfig(),
        cache=EmbeddingCacheConfig(path=tmp_path / "cache.db"),
        registry=registry,
    )
    assert isinstance(embedder, CachedEmbedder)
    assert isinstance(embedder.inner, LocalOnnxEmbedder)
    assert embedder.spec == MINILM_SPEC
    embedder.embed_documents(["hello"])
    embedder.embed_documents(["hello"])
    assert registry.get_sample_value("ragstream_embedding_cache_hits_total") == 1
    embedder.close()


@pytest.mark.unit
def test_build_openai_without_cache_and_bad_cache_path(tmp_path: Path) -> None:
    config = OpenAIEmbedderConfig(base_url="http://127.0.0.1:1/v1", model="m", dimension=8)
    embedder = build_embedder(config)
    assert isinstance(embedder, OpenAIEmbedder)
    embedder.close()
    blocker = tmp_path / "file"
    blocker.write_text("not a directory")
    with pytest.raises(ConfigError, match="cannot open embedding cache"):
        build_embedder(config, cache=EmbeddingCacheConfig(path=blocker / "cache.db"))


@pytest.mark.unit
def test_importing_the_spec_loads_no_adapter_dependency() -> None:
    # Pure logic (the chunker) imports ragcore.embedders.spec: no onnxruntime, openai, etc.
    code = (
        "import sys, ragcore.embedders.spec, ragcore.embedders.base; "
        "print(sorted(m for m in ('onnxruntime', 'openai', 'prometheus_client', 'tokenizers') "
        "if m in sys.modules))"
    )
    result = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=True, timeout=60
    )
    assert result.stdout.strip() == "[]"
