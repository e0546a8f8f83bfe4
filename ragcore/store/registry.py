"""The index registry: each tenant's index versions, their manifests and the active pointer.

docs/decisions/collections-per-tenant-and-version.md: one collection per tenant and version, an
*active version* per tenant, and an
immutable manifest per version that a reader checks against the embedder it would use.

Two implementations behind one base class:
- `FileIndexRegistry` (embedded): JSON files under `<data_dir>/registry/<tenant>/`:
  `v<N>.json` per version and an `active` pointer file, both replaced atomically (write a temp
  file, fsync, `os.replace`, fsync the directory).
- `QdrantIndexRegistry` (server): the alias `rag__<tenant>` is the active pointer (switched
  atomically by one `update_collection_aliases` request) and each manifest lives in its own
  collection's metadata (`ragstream_manifest`; collection metadata exists since Qdrant 1.16 /
  qdrant-client 1.16 and in local mode), so a manifest can never outlive or miss its collection.
  A *shared* version (a partition of a pool, docs/decisions/tiered-tenancy.md) has no
  collection of its own: its manifest and calibration are entries of ragstream's catalog
  collection (`SharedEntries`), deleted with the partition, and a tenant whose active version
  is shared has no alias but an `active` entry. The alias wins when both exist, so every switch
  is still one atomic step: to a dedicated version, creating the alias; to a shared one, writing
  the entry and then dropping the alias.

Manifest lifecycle (the "immutable" rule made precise):
- `create_version` writes the manifest once with status `building`, `total_vectors=0` and the
  identity fields (tenant, index name, version, model + version, dimension, metric,
  normalization, sparse encoder), and creates the collection. Identity fields never change.
- `mark_ready(total_vectors)` is the one rewrite: status `ready`, the count at build completion
  and the build timestamp. From then on the manifest is frozen; the live point count is
  `VectorStore.count`, not the manifest (streaming keeps changing it).
- `retire` only moves status to `retired` (the active version cannot be retired). Data is not
  dropped: `VectorStore.drop_collection` does that (and, on a server, drops the manifest too).
Only `ready` versions can be activated. Version creation assumes one creator per tenant at a
time (the reindex job); within a process a lock serializes it, and on disk `O_EXCL` does.

Beside each manifest the registry keeps the version's *evidence calibration*
(`retrieval_api.evidence_score.EvidenceCalibration` as JSON text: the evidence model, the chosen
result order, thresholds and the index's lexical statistics). Unlike the manifest it is refitted
(`ragstream calibrate`, every reindex), so it is stored apart: `v<N>.calibration.json` next to
`v<N>.json`, or the collection metadata key `ragstream_calibration` on a server.

Nothing here imports a vendor module: the server variant talks to a `ServerCatalog`, which
`ragcore.store.qdrant_remote.QdrantRemoteStore` implements.
"""

from __future__ import annotations

import contextlib
import os
import tempfile
import threading
from abc import ABC, abstractmethod
from collections.abc import Mapping
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any, Literal, Protocol

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from ragcore.embedders.spec import EmbeddingSpec
from ragcore.errors import IndexNotFoundError, ManifestMismatchError, StoreError
from ragcore.store.base import Placement, VectorStore
from ragcore.store.ids import (
    alias_name,
    collection_name,
    parse_collection_name,
    validate_tenant,
)

IndexStatus = Literal["building", "ready", "retired"]
MANIFEST_KEY = "ragstream_manifest"
CALIBRATION_KEY = "ragstream_calibration"


class IndexManifest(BaseModel):
    """What one index version is: enough to refuse vectors from another embedder."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    tenant: str
    index_name: str = Field(description="The collection, e.g. rag__acme__v3.")
    version: int = Field(ge=1)
    embedding_model: str = Field(description="EmbeddingSpec.name")
    embedding_model_version: str = Field(description="EmbeddingSpec.model_version")
    dimension: int = Field(gt=0)
    metric: str
    normalization: str
    sparse_encoder: str | None = Field(
        default=None, description="Sparse encoder identity, e.g. Bm25Encoder.model_version."
    )
    placement: Placement = Field(
        default="dedicated",
        description="dedicated: its own collection; shared: a partition of a shared pool "
        "(docs/decisions/tiered-tenancy.md). Manifests written before tiering are dedicated.",
    )
    total_vectors: int = Field(default=0, ge=0, description="Points when the build completed.")
    created_at: datetime
    built_at: datetime | None = Field(default=None, description="Set when marked ready.")
    status: IndexStatus = "building"


@dataclass(frozen=True, slots=True)
class ResolvedIndex:
    """An index version that exists and is not retired: its collection and manifest."""

    tenant: str
    version: int
    collection: str
    manifest: IndexManifest
    active: bool


def manifest_differences(
    manifest: IndexManifest, spec: EmbeddingSpec, sparse_encoder: str | None = None
) -> list[str]:
    """How `manifest` differs from `spec` (and the sparse encoder, when given); [] = match."""
    expected: dict[str, tuple[object, object]] = {
        "embedding model version": (manifest.embedding_model_version, spec.model_version),
        "dimension": (manifest.dimension, spec.dimension),
        "metric": (manifest.metric, spec.metric),
        "normalization": (manifest.normalization, spec.normalization),
    }
    if sparse_encoder is not None:
        expected["sparse encoder"] = (manifest.sparse_encoder, sparse_encoder)
    return [
        f"{what}: index has {have!r}, embedder has {want!r}"
        for what, (have, want) in expected.items()
        if have != want
    ]


def manifest_matches(
    manifest: IndexManifest, spec: EmbeddingSpec, sparse_encoder: str | None = None
) -> bool:
    """True when `manifest` was built with `spec` (and the sparse encoder, when given)."""
    return not manifest_differences(manifest, spec, sparse_encoder)


def check_manifest(
    manifest: IndexManifest, spec: EmbeddingSpec, sparse_encoder: str | None = None
) -> None:
    """Raise ManifestMismatchError when `manifest` was not built with `spec` (and encoder)."""
    diffs = manifest_differences(manifest, spec, sparse_encoder)
    if diffs:
        raise ManifestMismatchError(
            f"index {manifest.index_name} (tenant {manifest.tenant!r}, v{manifest.version}) "
            f"does not match the embedder: " + "; ".join(diffs)
        )


class IndexRegistry(ABC):
    """Versions, manifests and the active pointer of every tenant (see the module docstring)."""

    def __init__(self) -> None:
        self._lock = threading.RLock()

    # --- storage primitives, per implementation --------------------------------------------

    @abstractmethod
    def _versions(self, tenant: str) -> list[int]:
        """Existing version numbers of the tenant, ascending."""

    @abstractmethod
    def _read(self, tenant: str, version: int) -> IndexManifest | None:
        """The stored manifest, or None when the version does not exist."""

    @abstractmethod
    def _create(self, manifest: IndexManifest) -> None:
        """Create the version's collection and store its first manifest (fail if it exists)."""

    @abstractmethod
    def _rewrite(self, manifest: IndexManifest) -> None:
        """Replace the stored manifest of an existing version."""

    @abstractmethod
    def _tenants(self) -> list[str]:
        """Every tenant that has at least one version."""

    @abstractmethod
    def _active(self, tenant: str) -> int | None:
        """The active version number, or None."""

    def _active_manifest(self, tenant: str) -> tuple[int | None, IndexManifest | None]:
        """The active version and, when reading it costs nothing more, its manifest (the
        server registry reads both in one step; None: `lookup` reads the manifest)."""
        return self._active(tenant), None

    @abstractmethod
    def _set_active(self, manifest: IndexManifest) -> None:
        """Atomically point the manifest's tenant at its version."""

    @abstractmethod
    def _write_calibration(self, manifest: IndexManifest, text: str) -> None:
        """Replace the version's stored calibration."""

    @abstractmethod
    def _read_calibration(self, manifest: IndexManifest) -> str | None:
        """The version's stored calibration, or None."""

    # --- public API ------------------------------------------------------------------------

    def list_tenants(self) -> list[str]:
        """Every tenant with an index version, sorted."""
        return sorted(self._tenants())

    def list_versions(self, tenant: str) -> list[IndexManifest]:
        """The tenant's manifests, by version ascending (empty for an unknown tenant)."""
        validate_tenant(tenant)
        manifests = (self._read(tenant, v) for v in self._versions(tenant))
        return [m for m in manifests if m is not None]

    def active_version(self, tenant: str) -> int | None:
        """The tenant's active version, or None."""
        validate_tenant(tenant)
        return self._active(tenant)

    def manifest(self, tenant: str, version: int) -> IndexManifest:
        """The manifest of one version; IndexNotFoundError when absent."""
        validate_tenant(tenant)
        found = self._read(tenant, version)
        if found is None:
            raise IndexNotFoundError(f"tenant {tenant!r} has no index version {version}")
        return found

    def create_version(
        self,
        tenant: str,
        spec: EmbeddingSpec,
        *,
        sparse_encoder: str | None = None,
        placement: Placement = "dedicated",
    ) -> IndexManifest:
        """Create the next version (collection or shared partition + `building` manifest) and
        return its manifest."""
        validate_tenant(tenant)
        with self._lock:
            existing = self._versions(tenant)
            version = (existing[-1] if existing else 0) + 1
            manifest = IndexManifest(
                tenant=tenant,
                index_name=collection_name(tenant, version),
                version=version,
                embedding_model=spec.name,
                embedding_model_version=spec.model_version,
                dimension=spec.dimension,
                metric=spec.metric,
                normalization=spec.normalization,
                sparse_encoder=sparse_encoder,
                placement=placement,
                created_at=datetime.now(UTC),
            )
            self._create(manifest)
            return manifest

    def mark_ready(self, tenant: str, version: int, *, total_vectors: int) -> IndexManifest:
        """Freeze a `building` version: status ready, build count and timestamp."""
        with self._lock:
            current = self.manifest(tenant, version)
            if current.status != "building":
                raise StoreError(
                    f"{current.index_name} is {current.status}: only a building version "
                    f"can be marked ready (manifests are immutable once ready)"
                )
            ready = IndexManifest.model_validate(
                {
                    **current.model_dump(),
                    "status": "ready",
                    "total_vectors": total_vectors,
                    "built_at": datetime.now(UTC),
                }
            )
            self._rewrite(ready)
            return ready

    def activate(self, tenant: str, version: int) -> None:
        """Make a `ready` version the tenant's active one (atomic switch)."""
        with self._lock:
            current = self.manifest(tenant, version)
            if current.status != "ready":
                raise StoreError(f"{current.index_name} is {current.status}, not ready")
            self._set_active(current)

    def retire(self, tenant: str, version: int) -> IndexManifest:
        """Mark a non-active version retired (its data stays until dropped)."""
        with self._lock:
            current = self.manifest(tenant, version)
            if self._active(tenant) == version:
                raise StoreError(f"{current.index_name} is active: activate another first")
            if current.status == "retired":
                return current
            retired = current.model_copy(update={"status": "retired"})
            self._rewrite(retired)
            return retired

    def save_calibration(self, tenant: str, version: int, text: str) -> None:
        """Store (replace) the evidence calibration of an existing version (JSON text)."""
        with self._lock:
            self._write_calibration(self.manifest(tenant, version), text)

    def load_calibration(self, tenant: str, version: int) -> str | None:
        """The version's evidence calibration (JSON text), or None when never calibrated."""
        return self._read_calibration(self.manifest(tenant, version))

    def lookup(self, tenant: str, version: int | None) -> ResolvedIndex:
        """Resolve `version` (None: the active one) without checking who may read it.

        IndexNotFoundError: unknown tenant or version, no active version, or a retired version.
        Callers check the manifest against their embedder (`open_version`, or
        `EmbeddingModels.for_manifest` when a process holds several models).
        """
        validate_tenant(tenant)
        active, active_manifest = self._active_manifest(tenant)
        if version is None:
            if active is None:
                raise IndexNotFoundError(f"tenant {tenant!r} has no active index version")
            version = active
        if active_manifest is not None and version == active:
            manifest: IndexManifest | None = active_manifest
        else:
            manifest = self._read(tenant, version)
        if manifest is None:
            raise IndexNotFoundError(f"tenant {tenant!r} has no index version {version}")
        if manifest.status == "retired":
            raise IndexNotFoundError(f"{manifest.index_name} is retired")
        return ResolvedIndex(tenant, version, manifest.index_name, manifest, version == active)

    def open_version(
        self,
        tenant: str,
        version: int | None,
        spec: EmbeddingSpec,
        *,
        sparse_encoder: str | None = None,
    ) -> ResolvedIndex:
        """Resolve `version` (None: the active one) and check its manifest against `spec`.

        IndexNotFoundError: as `lookup`.
        ManifestMismatchError: model version, dimension, metric, normalization (or the sparse
        encoder, when given) differ; the message names both sides.
        """
        resolved = self.lookup(tenant, version)
        check_manifest(resolved.manifest, spec, sparse_encoder)
        return resolved


# --- embedded: JSON files ----------------------------------------------------------------------


def fsync_dir(path: Path) -> None:
    """Make the entries of directory `path` (a create, a rename) durable."""
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def atomic_write(path: Path, data: str) -> None:
    """Replace `path` with `data` atomically and durably (temp file, fsync, rename, fsync dir)."""
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", dir=path.parent)
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as fh:
            fh.write(data)
            fh.flush()
            os.fsync(fh.fileno())
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(FileNotFoundError):  # the temp file may already be renamed
            os.unlink(tmp)
        raise
    fsync_dir(path.parent)


class FileIndexRegistry(IndexRegistry):
    """Embedded registry: `<data_dir>/registry/<tenant>/v<N>.json` and `active`.

    `store` creates each version's collection (the embedded `EdgeStore` on the same data dir).
    """

    def __init__(self, data_dir: str | Path, store: VectorStore) -> None:
        """Keep the registry under `data_dir` and create collections in `store`."""
        super().__init__()
        self._root = Path(data_dir).resolve() / "registry"
        self._store = store
        # path -> (its file identity, the manifest parsed from it): Retrieve resolves the
        # index on every request, and parsing the manifest was most of that
        self._parsed: dict[Path, tuple[tuple[int, int, int, int], IndexManifest]] = {}
        self._files: dict[tuple[str, int], Path] = {}

    def _dir(self, tenant: str) -> Path:
        return self._root / validate_tenant(tenant)

    def _file(self, tenant: str, version: int) -> Path:
        # memoized: pathlib joins were half of a lookup's CPU (Retrieve resolves every request)
        key = (tenant, version)
        path = self._files.get(key)
        if path is None:
            path = self._files[key] = self._dir(tenant) / f"v{version}.json"
        return path

    def _versions(self, tenant: str) -> list[int]:
        directory = self._dir(tenant)
        if not directory.is_dir():
            return []
        versions = []
        for path in directory.glob("v*.json"):
            number = path.stem[1:]
            if number.isdigit() and not number.startswith("0"):
                versions.append(int(number))
        return sorted(versions)

    def _read(self, tenant: str, version: int) -> IndexManifest | None:
        """The manifest, parsed again only when its file changed. Every write replaces the
        file (`atomic_write`: a new inode) or creates it (`O_EXCL`), and every rewrite changes
        its status and so its size; another process's write shows in the stat like our own.
        The stat is taken before the read, so a replacement in between is read again later,
        never missed."""
        path = self._file(tenant, version)
        try:
            st = path.stat()
        except FileNotFoundError:
            self._parsed.pop(path, None)
            return None
        except OSError as exc:
            raise StoreError(f"cannot read manifest {path}: {exc}") from exc
        identity = (st.st_ino, st.st_size, st.st_mtime_ns, st.st_ctime_ns)
        cached = self._parsed.get(path)
        if cached is not None and cached[0] == identity:
            return cached[1]
        manifest = self._parse(path, tenant, version)
        if manifest is not None:
            self._parsed[path] = (identity, manifest)
        return manifest

    def _parse(self, path: Path, tenant: str, version: int) -> IndexManifest | None:
        try:
            text = path.read_text(encoding="utf-8")
        except FileNotFoundError:
            return None
        except OSError as exc:
            raise StoreError(f"cannot read manifest {path}: {exc}") from exc
        try:
            manifest = IndexManifest.model_validate_json(text)
        except ValidationError as exc:
            raise StoreError(f"corrupt manifest {path}: {exc}") from exc
        if manifest.tenant != tenant or manifest.version != version:
            raise StoreError(
                f"manifest {path} names tenant {manifest.tenant!r} v{manifest.version}"
            )
        return manifest

    def _create(self, manifest: IndexManifest) -> None:
        if self._store.collection_exists(manifest.index_name):
            # Data without a manifest (e.g. left by a crashed attempt): never adopt it silently.
            raise StoreError(f"collection {manifest.index_name} exists without a manifest")
        directory = self._dir(manifest.tenant)
        directory.mkdir(parents=True, exist_ok=True)
        path = self._file(manifest.tenant, manifest.version)
        try:
            # O_EXCL reserves the version number even against another process.
            fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644)
        except FileExistsError as exc:
            raise StoreError(f"index version {manifest.index_name} already exists") from exc
        try:
            with os.fdopen(fd, "w", encoding="utf-8") as fh:
                fh.write(manifest.model_dump_json(indent=2))
                fh.flush()
                os.fsync(fh.fileno())
            fsync_dir(directory)
            self._store.ensure_collection(
                manifest.index_name, manifest.dimension, sparse=True, placement=manifest.placement
            )
        except BaseException:
            # Neither a manifest without its collection nor a half-made collection (which the
            # next attempt would refuse as data without a manifest): both were absent before.
            path.unlink(missing_ok=True)
            self._store.drop_collection(manifest.index_name)
            raise

    def _tenants(self) -> list[str]:
        if not self._root.is_dir():
            return []
        return [p.name for p in self._root.iterdir() if p.is_dir() and self._versions(p.name)]

    def _rewrite(self, manifest: IndexManifest) -> None:
        atomic_write(
            self._file(manifest.tenant, manifest.version), manifest.model_dump_json(indent=2)
        )

    def _active(self, tenant: str) -> int | None:
        path = self._dir(tenant) / "active"
        try:
            # read on every Retrieve request (a switch must show at once): raw bytes, no
            # text-file machinery
            with open(path, "rb", buffering=0) as fh:
                text = fh.read().decode("ascii", errors="replace").strip()
        except FileNotFoundError:
            return None
        except OSError as exc:
            raise StoreError(f"cannot read active pointer {path}: {exc}") from exc
        if not text.isdigit():
            raise StoreError(f"corrupt active pointer {path}: {text!r}")
        return int(text)

    def _set_active(self, manifest: IndexManifest) -> None:
        atomic_write(self._dir(manifest.tenant) / "active", f"{manifest.version}\n")

    def _calibration_file(self, manifest: IndexManifest) -> Path:
        return self._dir(manifest.tenant) / f"v{manifest.version}.calibration.json"

    def _write_calibration(self, manifest: IndexManifest, text: str) -> None:
        atomic_write(self._calibration_file(manifest), text)

    def _read_calibration(self, manifest: IndexManifest) -> str | None:
        path = self._calibration_file(manifest)
        try:
            return path.read_text(encoding="utf-8")
        except FileNotFoundError:
            return None
        except OSError as exc:
            raise StoreError(f"cannot read calibration {path}: {exc}") from exc


# --- server: aliases and collection metadata --------------------------------------------------


class ServerCatalog(VectorStore, Protocol):
    """What the server registry needs beyond the port (QdrantRemoteStore provides it)."""

    def ensure_collection(
        self,
        name: str,
        dimension: int,
        sparse: bool = True,
        *,
        placement: Placement = "dedicated",
        metadata: Mapping[str, Any] | None = None,
    ) -> None:
        """Create the collection with `metadata` if absent."""
        ...

    def list_collections(self) -> list[str]:
        """Names of every collection."""
        ...

    def collection_metadata(self, name: str) -> dict[str, Any]:
        """The collection's metadata."""
        ...

    def set_collection_metadata(self, name: str, metadata: Mapping[str, Any]) -> None:
        """Set top-level metadata keys."""
        ...

    def alias_target(self, alias: str) -> str | None:
        """The collection an alias points at, or None."""
        ...

    def alias_metadata(self, alias: str) -> dict[str, Any] | None:
        """The metadata of the collection `alias` names, or None when nothing has that name
        (one or two requests, however many aliases exist)."""
        ...

    def switch_alias(self, alias: str, collection: str) -> None:
        """Atomically point an alias at a collection."""
        ...

    def drop_alias(self, alias: str) -> None:
        """Delete an alias if it exists."""
        ...


class SharedEntries(Protocol):
    """JSON entries keyed by (kind, key) on the server (`qdrant_remote.CatalogEntries`)."""

    def get(self, kind: str, key: str) -> Any:
        """The entry's value, or None."""
        ...

    def put(self, kind: str, key: str, value: Any, *, tenant: str) -> None:
        """Create or replace an entry."""
        ...

    def delete(self, *, key: str, kind: str | None = None) -> None:
        """Delete the entry of (kind, key), or every entry of `key`."""
        ...

    def scan(self, kind: str, tenant: str | None = None) -> dict[str, Any]:
        """key -> value of every entry of `kind` (of one tenant)."""
        ...


class QdrantIndexRegistry(IndexRegistry):
    """Server registry: alias `rag__<tenant>` = active version; manifests in collection metadata
    (dedicated versions) or in catalog entries (shared versions; see the module docstring).

    A collection named like a version but without a ragstream manifest (created by someone
    else) makes every read of that version raise ManifestMismatchError: nothing to verify.
    """

    def __init__(
        self,
        catalog: ServerCatalog,
        *,
        store: VectorStore | None = None,
        entries: SharedEntries | None = None,
    ) -> None:
        """Use `catalog` (a QdrantRemoteStore) for collections, metadata and aliases, `store`
        (a TieredStore over it) to create versions, and `entries` for shared versions (without
        them every version is dedicated)."""
        super().__init__()
        self._catalog = catalog
        self._store: VectorStore = store or catalog
        self._entries = entries

    def _shared(self, kind: str, tenant: str | None = None) -> dict[str, Any]:
        return {} if self._entries is None else self._entries.scan(kind, tenant)

    def _versions(self, tenant: str) -> list[int]:
        names = [*self._catalog.list_collections(), *self._shared("manifest", tenant)]
        versions = set()
        for name in names:
            parsed = parse_collection_name(name)
            if parsed is not None and parsed[0] == tenant:
                versions.add(parsed[1])
        return sorted(versions)

    def _tenants(self) -> list[str]:
        names = [*self._catalog.list_collections(), *self._shared("manifest")]
        parsed = (parse_collection_name(n) for n in names)
        return list({p[0] for p in parsed if p is not None})

    def _shared_manifest(self, name: str) -> IndexManifest | None:
        raw = None if self._entries is None else self._entries.get("manifest", name)
        if raw is None:
            return None
        try:
            return IndexManifest.model_validate(raw)
        except ValidationError as exc:
            raise StoreError(f"corrupt manifest entry of {name}: {exc}") from exc

    def _read(self, tenant: str, version: int) -> IndexManifest | None:
        name = collection_name(tenant, version)
        shared = self._shared_manifest(name)
        if shared is not None:
            if shared.tenant != tenant or shared.version != version:
                raise StoreError(f"catalog entry {name} holds the manifest of {shared.index_name}")
            return shared
        if not self._catalog.collection_exists(name):
            return None
        raw = self._catalog.collection_metadata(name).get(MANIFEST_KEY)
        if raw is None:
            raise ManifestMismatchError(
                f"collection {name} exists without a ragstream manifest: it cannot be verified"
            )
        try:
            manifest = IndexManifest.model_validate(raw)
        except ValidationError as exc:
            raise StoreError(f"corrupt manifest in collection {name}: {exc}") from exc
        if manifest.tenant != tenant or manifest.version != version:
            raise StoreError(f"collection {name} holds the manifest of {manifest.index_name}")
        return manifest

    def _create(self, manifest: IndexManifest) -> None:
        name = manifest.index_name
        if self._catalog.collection_exists(name) or self._shared_manifest(name) is not None:
            raise StoreError(f"index version {name} already exists")
        if manifest.placement == "shared":
            if self._entries is None:
                raise StoreError(f"{name}: this registry has no catalog for shared versions")
            # The manifest first: a crash before the partition exists leaves a version whose
            # collection the worker creates on first sight (as for a dedicated version).
            self._entries.put(
                "manifest", name, manifest.model_dump(mode="json"), tenant=manifest.tenant
            )
            try:
                self._store.ensure_collection(
                    name, manifest.dimension, sparse=True, placement="shared"
                )
            except BaseException:
                self._entries.delete(key=name)
                raise
            return
        self._catalog.ensure_collection(
            manifest.index_name,
            manifest.dimension,
            sparse=True,
            placement=manifest.placement,
            metadata={MANIFEST_KEY: manifest.model_dump(mode="json")},
        )

    def _rewrite(self, manifest: IndexManifest) -> None:
        if manifest.placement == "shared" and self._entries is not None:
            self._entries.put(
                "manifest",
                manifest.index_name,
                manifest.model_dump(mode="json"),
                tenant=manifest.tenant,
            )
            return
        self._catalog.set_collection_metadata(
            manifest.index_name, {MANIFEST_KEY: manifest.model_dump(mode="json")}
        )

    def _active(self, tenant: str) -> int | None:
        return self._active_manifest(tenant)[0]

    def _active_manifest(self, tenant: str) -> tuple[int | None, IndexManifest | None]:
        # Per request: the alias is resolved by the server itself (a request for the collection
        # it names returns that collection's metadata, our manifest), not by listing every
        # alias (O(dedicated tenants) per request)
        alias = alias_name(tenant)
        metadata = self._catalog.alias_metadata(alias)
        if metadata is None:
            raw = None if self._entries is None else self._entries.get("active", tenant)
            if raw is None:
                return None, None
            if isinstance(raw, bool) or not isinstance(raw, int) or raw < 1:
                raise StoreError(f"corrupt active entry of tenant {tenant!r}: {raw!r}")
            return raw, None
        raw_manifest = metadata.get(MANIFEST_KEY)
        if raw_manifest is None:
            raise ManifestMismatchError(
                f"alias {alias} points at a collection without a ragstream manifest: it "
                "cannot be verified"
            )
        try:
            manifest = IndexManifest.model_validate(raw_manifest)
        except ValidationError as exc:
            raise StoreError(f"corrupt manifest behind alias {alias}: {exc}") from exc
        if manifest.tenant != tenant:
            raise StoreError(f"alias {alias} points at foreign collection {manifest.index_name!r}")
        return manifest.version, manifest

    def _set_active(self, manifest: IndexManifest) -> None:
        tenant, version = manifest.tenant, manifest.version
        if manifest.placement == "shared":
            if self._entries is None:
                raise StoreError(f"{manifest.index_name}: no catalog for shared versions")
            self._entries.put("active", tenant, version, tenant=tenant)
            self._catalog.drop_alias(alias_name(tenant))  # the switch: the entry now decides
            return
        self._catalog.switch_alias(alias_name(tenant), collection_name(tenant, version))
        if self._entries is not None:
            self._entries.delete(key=tenant, kind="active")

    def _write_calibration(self, manifest: IndexManifest, text: str) -> None:
        if manifest.placement == "shared" and self._entries is not None:
            self._entries.put("calibration", manifest.index_name, text, tenant=manifest.tenant)
            return
        self._catalog.set_collection_metadata(manifest.index_name, {CALIBRATION_KEY: text})

    def _read_calibration(self, manifest: IndexManifest) -> str | None:
        if manifest.placement == "shared" and self._entries is not None:
            shared = self._entries.get("calibration", manifest.index_name)
            if shared is not None and not isinstance(shared, str):
                raise StoreError(f"corrupt calibration entry of {manifest.index_name}")
            return shared
        raw = self._catalog.collection_metadata(manifest.index_name).get(CALIBRATION_KEY)
        if raw is None:
            return None
        if not isinstance(raw, str):
            raise StoreError(f"corrupt calibration in collection {manifest.index_name}")
        return raw
