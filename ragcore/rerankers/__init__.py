"""Rerankers: score (query, passage) pairs with a cross-encoder (one port, two adapters).

- `HttpReranker`: a TEI-compatible `POST /rerank` or Cohere-compatible `POST /v1/rerank` endpoint.
- `OnnxCrossEncoder`: a local cross-encoder export (model.onnx + tokenizer.json) on onnxruntime.

Both satisfy `retrieval_api.retriever.Reranker` (`score(query, passages) -> list[float]`, relevance
probabilities in [0, 1]) and add `check()` / `close()`. No weights ship with ragstream and
nothing is downloaded at run time: the ONNX adapter loads a directory
the deployment provides. `build_reranker` wires one from configuration; the configs live with
their adapters.

Adapters load lazily (PEP 562), as the embedders do: importing the errors must not pull in
onnxruntime or httpx.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, Protocol, TypeAlias

from ragcore.errors import RagstreamError, UnavailableError
from ragcore.lazy import kind_union, lazy_attributes

if TYPE_CHECKING:
    from ragcore.rerankers.http import HttpReranker, HttpRerankerConfig
    from ragcore.rerankers.onnx_cross_encoder import OnnxCrossEncoder, OnnxRerankerConfig

    #: Either reranker's settings, told apart by `kind` ("http" | "onnx").
    RerankerConfig: TypeAlias = HttpRerankerConfig | OnnxRerankerConfig

__all__ = [
    "HttpReranker",
    "HttpRerankerConfig",
    "OnnxCrossEncoder",
    "OnnxRerankerConfig",
    "RerankError",
    "RerankUnavailableError",
    "RerankerAdapter",
    "RerankerConfig",
    "build_reranker",
]


class RerankError(RagstreamError):
    """The reranker failed for a reason retrying will not fix (bad answer, rejected request)."""

    code = "RERANK_FAILED"


class RerankUnavailableError(RerankError, UnavailableError):
    """The reranker is overloaded or unreachable; retry later."""

    code = "RERANK_UNAVAILABLE"


class RerankerAdapter(Protocol):
    """What `build_reranker` returns: the `Reranker` port plus a health check and close."""

    def score(self, query: str, passages: Sequence[str]) -> list[float]:
        """One relevance probability in [0, 1] per passage, in order."""
        ...

    def check(self) -> None:
        """Score one pair; raises a `RerankError` when the reranker is unusable."""
        ...

    def close(self) -> None:
        """Release the session or connection pool. Idempotent."""
        ...


_LAZY = {
    "HttpReranker": "ragcore.rerankers.http",
    "HttpRerankerConfig": "ragcore.rerankers.http",
    "OnnxCrossEncoder": "ragcore.rerankers.onnx_cross_encoder",
    "OnnxRerankerConfig": "ragcore.rerankers.onnx_cross_encoder",
}


#: Loads adapters (and their heavy dependencies) on first use.
__getattr__ = lazy_attributes(
    __name__,
    _LAZY,
    {"RerankerConfig": kind_union(_LAZY, "HttpRerankerConfig", "OnnxRerankerConfig")},
)


def build_reranker(config: RerankerConfig) -> RerankerAdapter:
    """The reranker `config` describes. Loading is eager: a missing model file or an unreadable
    key file fails here, at startup (no request is sent to an HTTP endpoint)."""
    if config.kind == "onnx":
        from ragcore.rerankers.onnx_cross_encoder import OnnxCrossEncoder  # noqa: PLC0415

        return OnnxCrossEncoder(config)
    from ragcore.rerankers.http import HttpReranker  # noqa: PLC0415

    return HttpReranker(config)
