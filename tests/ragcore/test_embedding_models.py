"""`EmbeddingModels`: the embedders a process holds, looked up by model version or name."""

from __future__ import annotations

import pytest

from ragcore.embedding_models import EmbeddingModels
from ragcore.errors import ConfigError
from tests.streams.support import HASH_SPEC, HashEmbedder

pytestmark = pytest.mark.unit

FLOAT = HashEmbedder(HASH_SPEC)
INT8 = HashEmbedder(HASH_SPEC.model_copy(update={"version": "2-int8"}))
OTHER = HashEmbedder(HASH_SPEC.model_copy(update={"name": "other"}))


def test_a_model_is_found_by_version_or_by_a_name_only_it_has() -> None:
    models = EmbeddingModels(FLOAT, [OTHER])
    assert models.get(FLOAT.spec.model_version) is FLOAT
    assert models.get("other") is OTHER and models.get(HASH_SPEC.name) is FLOAT
    assert models.get("absent") is None


def test_a_name_held_in_two_versions_must_be_given_with_its_version() -> None:
    """One model's float and int8 executions share a name: `reindex --model <name>` would
    otherwise silently pick the primary and rebuild with the current model."""
    models = EmbeddingModels(FLOAT, [INT8])
    with pytest.raises(ConfigError, match="held in versions hash-test@1, hash-test@2-int8"):
        models.get(HASH_SPEC.name)
    assert models.get(INT8.spec.model_version) is INT8


def test_the_same_version_twice_is_refused() -> None:
    with pytest.raises(ConfigError, match="configured twice"):
        EmbeddingModels(FLOAT, [HashEmbedder(HASH_SPEC)])
