"""The embedders one process holds: the primary model and, during a model change, the next one.

A blue-green model change (issue 8) needs two models live at once: the ingest worker writes
every change to the active version with the model it was built with *and* to the version being
built with the new model; Retrieve embeds each query with the model of the version it searches
(the active one, or an older one a caller pinned). Every index version's manifest names its
model, so the right embedder is found by matching manifests, never by guessing.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence

from ragcore.embedders.base import Embedder
from ragcore.errors import ConfigError, ManifestMismatchError
from ragcore.store.registry import IndexManifest, check_manifest


class EmbeddingModels:
    """An ordered set of embedders with distinct model versions; the first is the primary
    (it bootstraps new tenants' first index versions)."""

    def __init__(self, primary: Embedder, others: Sequence[Embedder] = ()) -> None:
        """Hold `primary` and `others`; ConfigError when two share a model version."""
        self._all = [primary, *others]
        seen: set[str] = set()
        for embedder in self._all:
            version = embedder.spec.model_version
            if version in seen:
                raise ConfigError(f"embedding model {version} is configured twice")
            seen.add(version)

    @property
    def primary(self) -> Embedder:
        """The model new tenants' indexes are built with."""
        return self._all[0]

    def __iter__(self) -> Iterator[Embedder]:
        return iter(self._all)

    def __len__(self) -> int:
        return len(self._all)

    def versions(self) -> list[str]:
        """Model versions held, primary first."""
        return [e.spec.model_version for e in self._all]

    def get(self, model: str) -> Embedder | None:
        """The embedder whose model version (`name@version`) or spec name is `model`;
        ConfigError when a name is held in several versions (e.g. one model's float and int8
        executions): the version must be given then."""
        for embedder in self._all:
            if model == embedder.spec.model_version:
                return embedder
        named = [e for e in self._all if e.spec.name == model]
        if len(named) > 1:
            raise ConfigError(
                f"model {model!r} is held in versions "
                f"{', '.join(e.spec.model_version for e in named)}: name one of them"
            )
        return named[0] if named else None

    def for_manifest(self, manifest: IndexManifest, sparse_encoder: str | None = None) -> Embedder:
        """The embedder `manifest` was built with; ManifestMismatchError when none is held
        (the message is the primary's mismatch plus the models this process holds)."""
        first: ManifestMismatchError | None = None
        for embedder in self._all:
            try:
                check_manifest(manifest, embedder.spec, sparse_encoder)
            except ManifestMismatchError as exc:
                first = first or exc
                continue
            return embedder
        assert first is not None
        if len(self._all) == 1:
            raise first
        raise ManifestMismatchError(
            f"{first.message}; this process holds models {', '.join(self.versions())}"
        )

    def close(self) -> None:
        """Close every embedder."""
        for embedder in self._all:
            embedder.close()
