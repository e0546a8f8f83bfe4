"""The ports the ingest stages depend on (implemented in `streams.adapters` and `ragcore`), and
`SorWriter`, the one entry point through which reconcile and reindex write what the system of
record holds."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Protocol

from ragcore.embedders.base import Embedder
from ragcore.plan import Plan
from ragcore.store.base import SparseVector
from ragcore.store.ids import TenantId
from schemas.entities import Chunk, Entity
from schemas.events import ChangeEvent, RawRecord
from streams.ingest.work import SorBatch, SorWritten


@dataclass(frozen=True, slots=True)
class TargetIndex:
    """A collection the worker writes a tenant's changes to, and its index version."""

    collection: str
    version: int
    #: the embedding model (`EmbeddingSpec.model_version`) its vectors come from; None means
    #: the handler's primary embedder
    model_version: str | None = None


class IndexTargets(Protocol):
    """Where a tenant's changes go: the active version and any version being built."""

    def write_targets(self, tenant_id: str) -> Sequence[TargetIndex]:
        """The tenant's write targets, creating its first index version if it has none."""
        ...

    def existing_targets(self, tenant_id: str) -> Sequence[TargetIndex]:
        """The tenant's write targets, none when it has no index yet (deletes and reads: an
        entity never indexed needs no index to be removed from)."""
        ...

    def known_tenants(self) -> Sequence[TenantId]:
        """Every tenant that has an index (to delete an entity whose tenant is unknown)."""
        ...

    def invalidate(self) -> None:
        """Forget cached resolutions (the next `write_targets` reads the registry)."""
        ...


class EntityPreparer(Protocol):
    """Normalization and chunking of one entity (`ragcore.prepare`)."""

    def chunks(self, entity: Entity) -> list[Chunk]:
        """The entity's chunks, each within the embedder's token budget."""
        ...

    def prime(self, entities: Sequence[Entity]) -> None:
        """Prepare the chunking of many entities at once (tokenize them in one batch)."""
        ...


class SparseEncoder(Protocol):
    """BM25-style document sparse vectors (`ragcore.sparse`)."""

    def encode_chunk(self, text: str) -> tuple[SparseVector, str]:
        """Sparse vector of a chunk's text, and its term counts as its payload stores them
        (`ragcore.sparse.TERM_COUNTS`)."""
        ...


class RowSource(Protocol):
    """Re-reads rows from the system of record (refetch after a TOAST placeholder)."""

    def fetch_entity(self, plan: Plan) -> Entity | None:
        """The entity as the SoR has it now; None when the row no longer exists. Raises
        `MappingError` when the entity's table is not mapped and `SorTableError` when it cannot
        be read (nothing can be said about the row then), `SorUnavailableError` when the SoR
        is unreachable."""
        ...


class SorWriter(Protocol):
    """Writes what the system of record holds to the index: the entry point of reconcile
    repairs and reindex snapshots and catch-ups (`IngestHandler` implements it)."""

    def apply_rows(self, batch: SorBatch) -> SorWritten:
        """Write `batch` through the ingest write path; say which entities changed and which
        could not be indexed."""
        ...

    def for_targets(
        self, targets: IndexTargets, embedder: Embedder, preparer: EntityPreparer
    ) -> SorWriter:
        """A writer with the same SoR reader that writes only to `targets` with `embedder`."""
        ...


Decoder = Callable[[RawRecord], ChangeEvent]
Planner = Callable[[ChangeEvent], Plan]
