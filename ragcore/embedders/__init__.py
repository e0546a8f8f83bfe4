"""Embedders: turn text into vectors (one `Embedder` port, several adapters).

- `LocalOnnxEmbedder`: all-MiniLM-L6-v2 (or a compatible export) on onnxruntime, offline.
- `OpenAIEmbedder`: any OpenAI-compatible `/embeddings` endpoint (OpenAI, vLLM, TEI, Ollama).
- `CachedEmbedder`: wraps either with a persistent (content hash, model_version) cache.

`build_embedder` wires them from configuration; the configs live with their adapters.

Adapters load lazily (PEP 562): `import ragcore.embedders.spec` from pure logic such as the
chunker must not pull in onnxruntime, openai or prometheus_client (docs/architecture.md).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from ragcore.embedders.base import (
    Embedder,
    Vectors,
    check_dimension,
    l2_normalize,
    with_prefix,
)
from ragcore.embedders.spec import EmbeddingSpec
from ragcore.lazy import kind_union, lazy_attributes

if TYPE_CHECKING:
    from prometheus_client import CollectorRegistry
    from pydantic import TypeAdapter

    from ragcore.embedders.cache import (
        CachedEmbedder,
        EmbeddingCache,
        EmbeddingCacheConfig,
        EmbeddingCacheMetrics,
        content_hash,
    )
    from ragcore.embedders.local_onnx import (
        MINILM_SPEC,
        LocalEmbedderConfig,
        LocalOnnxEmbedder,
    )
    from ragcore.embedders.openai_http import OpenAIEmbedder, OpenAIEmbedderConfig

    #: Either embedder's settings, told apart by `kind` ("local" | "openai").
    EmbedderConfig = LocalEmbedderConfig | OpenAIEmbedderConfig
    #: Validates a mapping (e.g. from settings or YAML) into an `EmbedderConfig`.
    embedder_config_adapter: TypeAdapter[EmbedderConfig]

__all__ = [
    "MINILM_SPEC",
    "CachedEmbedder",
    "Embedder",
    "EmbedderConfig",
    "EmbeddingCache",
    "EmbeddingCacheConfig",
    "EmbeddingCacheMetrics",
    "EmbeddingSpec",
    "LocalEmbedderConfig",
    "LocalOnnxEmbedder",
    "OpenAIEmbedder",
    "OpenAIEmbedderConfig",
    "Vectors",
    "build_embedder",
    "check_dimension",
    "content_hash",
    "embedder_config_adapter",
    "l2_normalize",
    "with_prefix",
]

_LAZY = {
    "CachedEmbedder": "ragcore.embedders.cache",
    "EmbeddingCache": "ragcore.embedders.cache",
    "EmbeddingCacheConfig": "ragcore.embedders.cache",
    "EmbeddingCacheMetrics": "ragcore.embedders.cache",
    "content_hash": "ragcore.embedders.cache",
    "MINILM_SPEC": "ragcore.embedders.local_onnx",
    "LocalEmbedderConfig": "ragcore.embedders.local_onnx",
    "LocalOnnxEmbedder": "ragcore.embedders.local_onnx",
    "OpenAIEmbedder": "ragcore.embedders.openai_http",
    "OpenAIEmbedderConfig": "ragcore.embedders.openai_http",
}


def _config_adapter() -> Any:
    from pydantic import TypeAdapter  # noqa: PLC0415

    return TypeAdapter(__getattr__("EmbedderConfig"))


#: Loads adapters (and their heavy dependencies) on first use.
__getattr__ = lazy_attributes(
    __name__,
    _LAZY,
    {
        "EmbedderConfig": kind_union(
            _LAZY, "LocalEmbedderConfig", "OpenAIEmbedderConfig", default="local"
        ),
        "embedder_config_adapter": _config_adapter,
    },
)


def build_embedder(
    config: EmbedderConfig,
    *,
    cache: EmbeddingCacheConfig | None = None,
    registry: CollectorRegistry | None = None,
) -> Embedder:
    """The embedder `config` describes, wrapped in a `CachedEmbedder` when `cache` is given.

    `registry` receives the cache metrics (pass the service's registry to export them).
    Loading is eager: a missing model file or a bad key file fails here, at startup.
    """
    # Lazy on purpose (see the module docstring): only the configured adapter is loaded.
    inner: Embedder
    if config.kind == "local":
        from ragcore.embedders.local_onnx import LocalOnnxEmbedder  # noqa: PLC0415

        inner = LocalOnnxEmbedder(config)
    else:
        from ragcore.embedders.openai_http import OpenAIEmbedder  # noqa: PLC0415

        inner = OpenAIEmbedder(config)
    if cache is None:
        return inner
    from ragcore.embedders.cache import CachedEmbedder, EmbeddingCache  # noqa: PLC0415

    try:
        store = EmbeddingCache.from_config(cache, registry=registry)
    except BaseException:
        inner.close()  # do not leak the session or connection pool on a bad cache config
        raise
    return CachedEmbedder(inner, store, cache_queries=cache.cache_queries)
