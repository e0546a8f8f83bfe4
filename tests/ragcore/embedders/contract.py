"""Conformance suite every `Embedder` implementation must pass.

Subclass `TextEmbedderContract` (an embedder whose vectors come from the text) or, for a
stand-in that hands out precomputed rows, `EmbedderContract`, and override the `embedder`
fixture. `EmbedderContract` checks what the index and Retrieve rely on
(ragcore/embedders/base.py): float32 rows of exactly `spec.dimension` values, L2-normalized,
one per text, a query as one row, an empty batch as an empty array, a usable `check()` and an
idempotent `close()`. `TextEmbedderContract` adds: a text gets the same vector alone or in a
batch (rows follow the input order), and a bare string is refused.
"""

from __future__ import annotations

import numpy as np
import pytest

from ragcore.embedders.base import Embedder

TEXTS = [
    "Refunds are issued within thirty days.",
    "The VPN token expires after twelve hours.",
    "Pump seals are checked every thousand hours.",
    "Refunds are issued within thirty days.",  # a repeated text
]


class EmbedderContract:
    """The `Embedder` port's promises, for one implementation."""

    @pytest.fixture
    def embedder(self) -> Embedder:
        raise NotImplementedError("subclasses provide the embedder fixture")

    def test_it_is_an_embedder_with_a_usable_spec(self, embedder: Embedder) -> None:
        assert isinstance(embedder, Embedder)
        spec = embedder.spec
        assert spec.dimension > 0 and spec.max_input_tokens > 0
        assert spec.model_version == f"{spec.name}@{spec.version}"
        embedder.check()

    def test_documents_are_float32_unit_rows_of_the_spec_dimension(
        self, embedder: Embedder
    ) -> None:
        vectors = embedder.embed_documents(TEXTS)
        assert vectors.dtype == np.float32
        assert vectors.shape == (len(TEXTS), embedder.spec.dimension)
        assert np.all(np.isfinite(vectors))
        np.testing.assert_allclose(np.linalg.norm(vectors, axis=1), 1.0, atol=1e-5)

    def test_a_query_is_one_float32_unit_row(self, embedder: Embedder) -> None:
        vector = embedder.embed_query("when do refunds arrive?")
        assert vector.dtype == np.float32
        assert vector.shape == (embedder.spec.dimension,)
        assert abs(float(np.linalg.norm(vector)) - 1.0) < 1e-5

    def test_an_empty_batch_is_an_empty_array_of_the_right_width(self, embedder: Embedder) -> None:
        assert embedder.embed_documents([]).shape == (0, embedder.spec.dimension)

    def test_close_is_idempotent(self, embedder: Embedder) -> None:
        embedder.close()
        embedder.close()


class TextEmbedderContract(EmbedderContract):
    """The contract of an embedder whose vectors are a function of the text."""

    def test_rows_follow_the_input_order(self, embedder: Embedder) -> None:
        batch = embedder.embed_documents(TEXTS)
        alone = np.stack([embedder.embed_documents([t])[0] for t in reversed(TEXTS)])[::-1]
        np.testing.assert_allclose(batch, alone, atol=1e-5)
        np.testing.assert_allclose(batch[0], batch[3], atol=1e-6)
        assert float(batch[0] @ batch[1]) < 0.9999  # different texts, different vectors

    def test_a_bare_string_is_refused(self, embedder: Embedder) -> None:
        with pytest.raises(TypeError, match="single str"):
            embedder.embed_documents("not a list")
