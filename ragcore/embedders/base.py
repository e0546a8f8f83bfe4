"""The `Embedder` port and the vector checks every adapter shares.

Every embedder returns float32, L2-normalized vectors of exactly `spec.dimension` values, so the
index can use a dot product as cosine and a reader can trust the manifest
(docs/decisions/collections-per-tenant-and-version.md, docs/decisions/embedders-and-cache.md).
The helpers here turn a model's or a server's raw output into that shape or fail loudly: a zero or
non-finite vector is never stored, and a wrong dimension is an `EmbeddingDimensionError`.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Protocol, runtime_checkable

import numpy as np
import numpy.typing as npt

from ragcore.embedders.spec import EmbeddingSpec
from ragcore.errors import EmbeddingDimensionError, EmbeddingError

#: The array type every embedder returns: float32, shape (n, dim) or (dim,) for one query.
Vectors = npt.NDArray[np.float32]

# Below this norm a vector carries no direction worth indexing (float32 noise level).
_MIN_NORM = 1e-12


@runtime_checkable
class Embedder(Protocol):
    """Turns text into float32, L2-normalized vectors described by `spec`.

    Implementations apply `spec.document_prefix` to documents and `spec.query_prefix` to queries
    themselves: callers pass raw text. They raise `EmbeddingUnavailableError` when retrying later
    may help (backpressure) and `EmbeddingError` otherwise.
    """

    @property
    def spec(self) -> EmbeddingSpec:
        """The model contract: name, version, dimension, token limit, tokenizer, prefixes."""
        ...

    def embed_documents(self, texts: Sequence[str]) -> Vectors:
        """Vectors for `texts`, shape (len(texts), spec.dimension), in input order."""
        ...

    def embed_query(self, text: str) -> Vectors:
        """The vector of one query, shape (spec.dimension,)."""
        ...

    def check(self) -> None:
        """Raise (an `EmbeddingError` or `ConfigError`) when the embedder cannot work.

        Used by startup and health checks; may cost one small embedding call.
        """
        ...

    def close(self) -> None:
        """Release sessions, connections and files. Idempotent."""
        ...


@runtime_checkable
class QueryBatchEmbedder(Protocol):
    """An embedder that embeds many queries at once with the very vectors `embed_query` gives
    each (the calibration embeds ~1,200 queries per index: `embed_queries`)."""

    def embed_queries(self, texts: Sequence[str]) -> Vectors:
        """The vectors of `texts` as queries, shape (len(texts), dimension), each
        `embed_query`'s: bitwise for the local embedder; for an embeddings API, what the
        server returns for that input (it embeds each input of a request on its own)."""
        ...


def embed_queries(embedder: Embedder, texts: Sequence[str]) -> Vectors:
    """The vectors of `texts` as queries, each exactly `embedder.embed_query`'s: through the
    embedder's batch path when it has one that keeps them exact (`QueryBatchEmbedder`), else
    one query at a time."""
    if isinstance(embedder, QueryBatchEmbedder):
        return embedder.embed_queries(texts)
    if not texts:
        return empty_vectors(embedder.spec)
    return np.stack([embedder.embed_query(text) for text in texts])


def with_prefix(prefix: str, texts: Sequence[str]) -> list[str]:
    """`texts` with `prefix` prepended (the exact strings the model sees)."""
    _require_strings(texts)
    return [prefix + text for text in texts] if prefix else list(texts)


def _require_strings(texts: Sequence[str]) -> None:
    # A bare str is a Sequence[str] too: embedding its characters one by one is never meant.
    if isinstance(texts, str):
        raise TypeError("texts must be a sequence of strings, not a single str")
    for i, text in enumerate(texts):
        if not isinstance(text, str):
            raise TypeError(f"texts[{i}] is {type(text).__name__}, expected str")


def check_dimension(vectors: npt.NDArray[np.generic], spec: EmbeddingSpec, count: int) -> None:
    """Raise `EmbeddingDimensionError` unless `vectors` has shape (count, spec.dimension)."""
    if vectors.ndim != 2 or vectors.shape[1] != spec.dimension:
        raise EmbeddingDimensionError(
            f"{spec.model_version} returned vectors of shape {vectors.shape}, "
            f"expected (n, {spec.dimension})"
        )
    if vectors.shape[0] != count:
        raise EmbeddingError(
            f"{spec.model_version} returned {vectors.shape[0]} vectors for {count} inputs"
        )


def l2_normalize(vectors: npt.ArrayLike) -> Vectors:
    """Rows of `vectors` scaled to unit L2 norm, as float32.

    Raises `EmbeddingError` naming the first bad row when a row is non-finite (NaN/inf) or has
    (near) zero norm: such a vector has no direction, and storing it would poison search results.
    """
    array = np.asarray(vectors, dtype=np.float64)
    if array.ndim != 2:
        raise EmbeddingError(f"expected a 2-D array of vectors, got shape {array.shape}")
    finite = np.isfinite(array).all(axis=1)
    if not finite.all():
        row = int(np.argmin(finite))
        raise EmbeddingError(f"vector {row} contains NaN or infinite values")
    norms = np.linalg.norm(array, axis=1)
    if array.shape[0] and norms.min() < _MIN_NORM:
        row = int(np.argmin(norms))
        raise EmbeddingError(f"vector {row} has zero norm and cannot be normalized")
    # Normalize in float64, then cast: the float32 result has unit norm to ~1e-7.
    normalized: Vectors = (array / norms[:, None]).astype(np.float32)
    return normalized


def finalize(vectors: npt.ArrayLike, spec: EmbeddingSpec, count: int) -> Vectors:
    """Check shape against `spec` and `count`, then L2-normalize: the last step of every adapter."""
    array = np.asarray(vectors)
    check_dimension(array, spec, count)
    return l2_normalize(array)


def empty_vectors(spec: EmbeddingSpec) -> Vectors:
    """The (0, dimension) result for an empty input."""
    return np.zeros((0, spec.dimension), dtype=np.float32)
