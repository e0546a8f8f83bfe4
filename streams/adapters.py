"""The ingest worker's adapters of its ports: index targets from the registry (write to the
active version and every version being built), and TOAST refetches from the SoR reader."""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Sequence

from ragcore.embedders.spec import EmbeddingSpec
from ragcore.errors import ManifestMismatchError, MappingError, SorRowError
from ragcore.plan import Plan
from ragcore.sor.base import SystemOfRecord
from ragcore.sparse import Bm25Encoder
from ragcore.store.base import Placement, VectorStore
from ragcore.store.ids import TenantId
from ragcore.store.registry import IndexManifest, IndexRegistry, manifest_matches
from schemas.entities import Entity
from streams.ingest import TargetIndex

log = logging.getLogger(__name__)


class RegistryTargets:
    """`streams.ingest.IndexTargets` over the index registry.

    A tenant's writes go to its active version and to every other version that is not retired
    and was built with one of the embedders this worker holds: the version a reindex builds
    (also across a model change when the worker holds the next model), and after a switch the
    previous version while its grace period lasts, so pinned readers and a rollback see current
    data. Each target names its model. A tenant
    seen for the first time gets version 1, created, marked ready and activated at once: a
    live-built index has no batch build to wait for. Resolutions are cached briefly to keep
    registry reads off the hot path.
    """

    def __init__(
        self,
        registry: IndexRegistry,
        specs: Sequence[EmbeddingSpec],
        sparse: Bm25Encoder,
        store: VectorStore,
        *,
        ttl_s: float = 2.0,
        new_tenants: Placement = "dedicated",
    ) -> None:
        if not specs:
            raise ValueError("RegistryTargets needs at least one embedding spec")
        self._registry = registry
        self._store = store
        self._specs = tuple(specs)
        self._spec = specs[0]
        self._sparse_version = sparse.model_version
        self._ttl = ttl_s
        self._new_tenants: Placement = new_tenants
        self._cache: dict[str, tuple[float, list[TargetIndex]]] = {}
        self._warned: set[str] = set()
        self._lock = threading.Lock()

    def write_targets(self, tenant_id: str) -> Sequence[TargetIndex]:
        """The tenant's active version (created on first sight) and its other live versions."""
        now = time.monotonic()
        with self._lock:
            cached = self._cache.get(tenant_id)
            if cached is not None and now - cached[0] < self._ttl:
                return cached[1]
            targets = self._resolve(tenant_id)
            self._cache[tenant_id] = (now, targets)
            return targets

    def _resolve(self, tenant_id: str) -> list[TargetIndex]:
        manifests = self._registry.list_versions(tenant_id)
        active = self._registry.active_version(tenant_id)
        if active is None:
            active = self._bootstrap(tenant_id, manifests)
            manifests = self._registry.list_versions(tenant_id)
        targets: list[TargetIndex] = []
        for manifest in manifests:
            is_active = manifest.version == active
            if manifest.status == "retired":
                continue
            spec = self._matching(manifest)
            if spec is None:
                held = ", ".join(s.model_version for s in self._specs)
                if is_active:
                    # never write another model's vectors into this index
                    raise ManifestMismatchError(
                        f"{manifest.index_name} (active) was built with "
                        f"{manifest.embedding_model_version} (dimension {manifest.dimension}, "
                        f"sparse encoder {manifest.sparse_encoder}); this worker holds {held} "
                        f"with sparse encoder {self._sparse_version}"
                    )
                if manifest.index_name not in self._warned:
                    self._warned.add(manifest.index_name)
                    log.warning(
                        "%s is being built with %s but this worker holds %s: its live changes "
                        "reach it only through the reindex job's catch-up pass (configure "
                        "RAGSTREAM_NEXT_EMBEDDER on the workers to dual-write)",
                        manifest.index_name,
                        manifest.embedding_model_version,
                        held,
                    )
                continue
            # A crash between writing a manifest and creating its collection leaves the
            # manifest alone; creating the collection here (idempotent) heals that.
            self._store.ensure_collection(
                manifest.index_name, manifest.dimension, sparse=True, placement=manifest.placement
            )
            targets.append(TargetIndex(manifest.index_name, manifest.version, spec.model_version))
        return targets

    def _matching(self, manifest: IndexManifest) -> EmbeddingSpec | None:
        matches = (s for s in self._specs if manifest_matches(manifest, s, self._sparse_version))
        return next(matches, None)

    def _bootstrap(self, tenant_id: str, manifests: Sequence[IndexManifest]) -> int:
        """Give a tenant without an active version one, resuming an interrupted bootstrap.

        create -> mark ready -> activate is three steps; a crash between them leaves a version
        that is not active. The newest version built with this embedder is finished and
        activated instead of creating another, so a crash never strands a tenant's writes.
        """
        for manifest in reversed(manifests):
            if manifest.status == "retired":
                continue
            if not manifest_matches(manifest, self._spec, self._sparse_version):
                continue
            if manifest.status == "building":
                self._registry.mark_ready(tenant_id, manifest.version, total_vectors=0)
            self._registry.activate(tenant_id, manifest.version)
            return manifest.version
        created = self._registry.create_version(
            tenant_id,
            self._spec,
            sparse_encoder=self._sparse_version,
            placement=self._new_tenants,
        )
        self._registry.mark_ready(tenant_id, created.version, total_vectors=0)
        self._registry.activate(tenant_id, created.version)
        return created.version

    def existing_targets(self, tenant_id: str) -> Sequence[TargetIndex]:
        """`write_targets` of a tenant that has an index version; none for one that has none
        (no index is created for it)."""
        with self._lock:
            cached = self._cache.get(tenant_id)
            if cached is not None and time.monotonic() - cached[0] < self._ttl:
                return cached[1]
        if not self._registry.list_versions(tenant_id):
            return []
        return self.write_targets(tenant_id)

    def known_tenants(self) -> Sequence[TenantId]:
        """Every tenant with an index."""
        return [TenantId(t) for t in self._registry.list_tenants()]

    def invalidate(self) -> None:
        """Forget cached resolutions (after a switch)."""
        with self._lock:
            self._cache.clear()


class SorRows:
    """`streams.ingest.RowSource` over a `SystemOfRecord` (refetch of TOAST-placeholder rows)."""

    def __init__(self, sor: SystemOfRecord) -> None:
        self._sor = sor

    def fetch_entity(self, plan: Plan) -> Entity | None:
        """The row as the SoR has it now, or None when it is gone or soft-deleted; MappingError
        when the entity's table is not mapped (nothing can be said about it), and its
        `SorRowError` (a MappingError) when the row is there but cannot be mapped."""
        if plan.entity_id is None:
            return None
        if self._sor.catalog.for_entity(plan.entity_id) is None:
            raise MappingError(
                f"{plan.entity_id!r} belongs to no mapped SoR table "
                f"(mapped: {', '.join(m.label for m in self._sor.catalog)})"
            )
        found = self._sor.fetch_entities(plan.tenant_id, [plan.entity_id]).get(plan.entity_id)
        if isinstance(found, SorRowError):
            raise found  # an unreadable row is not a gone one: never delete its entity
        return found
