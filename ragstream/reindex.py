"""`ragstream reindex`: build a new index version of a tenant from the system of record, gate
it on retrieval parity, switch to it atomically and retire the old one after a grace period.

The steps, and why they are safe while the active version keeps serving and changes stream in:

1. *Create* version N+1 (`building`) with the chosen model and placement, or resume the newest
   building version of that model and placement left by an interrupted run (every write is
   idempotent). The placement (docs/decisions/tiered-tenancy.md) is asked for, or with `auto`:
   its own collection once the active version holds more than `dedicated_above_points`
   points (a promotion), else the active version's (never a silent demotion).
2. *Settle*: wait for the ingest workers' target cache (2 s) to see the new version. From then
   on every change a worker applies goes to the active version and to N+1 (workers must hold
   the new model: `RAGSTREAM_NEXT_EMBEDDER` during a model change).
3. *Snapshot*: scan the tenant's live SoR rows and write them to N+1 through the worker's own
   write path (the same chunking, hashing, version ordering and unchanged-content skip). A
   snapshot row has no source position, so it is applied over what a worker streamed into
   N+1 meanwhile (docs/decisions/change-ordering.md); the catch-up repairs that.
4. *Catch up*: reconcile N+1 against the SoR and repair until no drift is left. This closes
   the races a snapshot cannot (a delete applied before the snapshot's older copy landed, a
   change a worker applied before it saw N+1, a SoR without `updated_at`).
5. *Calibrate* N+1's evidence score (`ragstream calibrate`'s fit: self-supervised queries from
   its own chunks) and store it with the version, so the gate and then the callers see the
   version as it will serve.
   *Parity gate*: the same queries through Retrieve against both versions, scored by the
   evaluation harness; a drop beyond the tolerance refuses the switch (and retires N+1)
   unless overridden.
6. *Switch*: a last catch-up round, mark N+1 ready, move the active pointer (one atomic file
   replace, or one alias swap on a Qdrant server). Retrieve reads the pointer per request, so
   each request sees one version, never a mix; requests pinned to N keep working.
7. *Grace and retire*: the workers keep writing N (not retired) so pinned readers and a
   rollback (`ragstream index activate`) see current data; after the grace period N is
   retired (and with `drop`, once the workers had `settle_s` to stop writing it, its
   collection or partition deleted).
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Literal

from ragcore.embedders.base import Embedder
from ragcore.errors import SorRowError
from ragcore.prepare import Preparer
from ragcore.quality.dataset import EvalQuery
from ragcore.quality.metrics import QueryRun, Status
from ragcore.sor.base import SystemOfRecord
from ragcore.store.base import Placement, StoreFilter, VectorStore
from ragcore.store.ids import TenantId
from ragcore.store.registry import IndexManifest, IndexRegistry, manifest_matches
from ragstream.parity import (
    ParityReport,
    ParitySettings,
    SearchFn,
    known_item_queries,
    load_queries,
    parity_check,
)
from retrieval_api.calibration import calibrate_version
from retrieval_api.retriever import Retriever
from retrieval_api.validate import validate_request
from schemas.entities import Entity
from schemas.proto.ragstream.retrieval.v1 import retrieval_pb2 as pb
from streams.ingest import Rejection, SorBatch, SorWriter, TargetIndex
from streams.reconcile import entity_states

Outcome = Literal["switched", "built", "parity_failed", "drift"]
PlacementChoice = Literal["auto", "shared", "dedicated"]
Progress = Callable[[str], None]
#: Fits and stores the evidence calibration of one version of the tenant; returns a summary.
CalibrateFn = Callable[[str, int, Progress], dict[str, Any]]


@dataclass(frozen=True)
class ReindexOptions:
    """What the operator chose (`ragstream reindex` flags)."""

    parity: ParitySettings = field(default_factory=ParitySettings)
    parity_queries: Path | None = None
    force: bool = False  # switch even when the parity gate fails
    switch: bool = True  # False: build (and gate) only, leave the version ready
    grace_s: float = 600.0
    retire: bool = True
    drop_retired: bool = False
    settle_s: float = 3.0
    batch: int = 64
    max_catchup_rounds: int = 5
    placement: PlacementChoice = "auto"
    dedicated_above_points: int = 100_000
    new_tenants: Placement = "dedicated"  # auto, for a tenant without an active version


@dataclass
class ReindexReport:
    """What one reindex did."""

    tenant: str
    model: str
    old_version: int | None
    new_version: int
    resumed: bool
    placement: Placement = "dedicated"
    placement_reason: str = ""
    sor_entities: int = 0
    written: int = 0
    rejected: list[Rejection] = field(default_factory=list)
    #: SoR rows that cannot be mapped, by entity id (or their error when the key forms none):
    #: not written, left out of the catch-up (the SoR reader logged each)
    unreadable_rows: list[str] = field(default_factory=list)
    snapshot_seconds: float = 0.0
    catchup: list[dict[str, Any]] = field(default_factory=list)
    parity: dict[str, Any] | None = None
    parity_overridden: bool = False
    calibration: dict[str, Any] | None = None
    points: int = 0
    outcome: Outcome = "built"
    retired: list[int] = field(default_factory=list)
    dropped: list[str] = field(default_factory=list)
    seconds: float = 0.0

    def to_dict(self) -> dict[str, Any]:
        """JSON form."""
        return {
            "tenant": self.tenant,
            "model": self.model,
            "old_version": self.old_version,
            "new_version": self.new_version,
            "resumed": self.resumed,
            "placement": self.placement,
            "placement_reason": self.placement_reason,
            "outcome": self.outcome,
            "sor_entities": self.sor_entities,
            "written": self.written,
            "rejected": [asdict(r) for r in self.rejected[:50]],
            "rejected_count": len(self.rejected),
            "unreadable_rows": self.unreadable_rows[:50],
            "unreadable_rows_count": len(self.unreadable_rows),
            "snapshot_seconds": round(self.snapshot_seconds, 3),
            "catchup": self.catchup,
            "parity": self.parity,
            "parity_overridden": self.parity_overridden,
            "calibration": self.calibration,
            "points": self.points,
            "retired": self.retired,
            "dropped": self.dropped,
            "seconds": round(self.seconds, 3),
        }


class _OneVersion:
    """`IndexTargets` of a reindex job's writer: only the version being built."""

    def __init__(self, target: TargetIndex, tenant: str) -> None:
        self._target = target
        self._tenant = tenant

    def write_targets(self, tenant_id: str) -> Sequence[TargetIndex]:
        """The version being built (this job writes one tenant only)."""
        if tenant_id != self._tenant:
            raise ValueError(f"a reindex of {self._tenant!r} got an entity of {tenant_id!r}")
        return [self._target]

    def existing_targets(self, tenant_id: str) -> Sequence[TargetIndex]:
        """The version being built: it exists."""
        return self.write_targets(tenant_id)

    def known_tenants(self) -> Sequence[TenantId]:
        """The tenant being rebuilt."""
        return [TenantId(self._tenant)]

    def invalidate(self) -> None:
        """Nothing cached: the version being built is the only target."""


def _building_version(
    registry: IndexRegistry,
    tenant: str,
    embedder: Embedder,
    sparse_encoder: str,
    placement: Placement,
) -> IndexManifest | None:
    """The newest building version made with this model and placement (an interrupted run)."""
    for manifest in reversed(registry.list_versions(tenant)):
        if (
            manifest.status == "building"
            and manifest.placement == placement
            and manifest_matches(manifest, embedder.spec, sparse_encoder)
        ):
            return manifest
    return None


def choose_placement(
    registry: IndexRegistry, store: VectorStore, tenant: str, options: ReindexOptions
) -> tuple[Placement, str]:
    """The new version's placement and why (see the module docstring, step 1)."""
    if options.placement != "auto":
        return options.placement, "asked for"
    active = registry.active_version(tenant)
    if active is None:
        return options.new_tenants, "the placement of new tenants (no active version)"
    current = registry.manifest(tenant, active)
    points = store.count(current.index_name, StoreFilter(tenant_id=tenant))
    if current.placement == "shared" and points > options.dedicated_above_points:
        return "dedicated", (
            f"promotion: v{active} holds {points} points, more than "
            f"{options.dedicated_above_points}"
        )
    return current.placement, f"as v{active} ({points} points)"


def _batches(entities: Iterator[Entity], size: int) -> Iterator[list[Entity]]:
    batch: list[Entity] = []
    for entity in entities:
        batch.append(entity)
        if len(batch) >= size:
            yield batch
            batch = []
    if batch:
        yield batch


def reindex(
    tenant: str,
    *,
    embedder: Embedder,
    preparer: Preparer,
    handler: SorWriter,
    registry: IndexRegistry,
    store: VectorStore,
    sor: SystemOfRecord,
    sparse_encoder: str,
    search: SearchFn | None,
    options: ReindexOptions | None = None,
    progress: Progress = lambda _line: None,
    sleep: Callable[[float], None] = time.sleep,
    calibrate: CalibrateFn | None = None,
) -> ReindexReport:
    """Run the steps of the module docstring; `search` runs parity queries (None: no gate),
    `calibrate` fits the new version's evidence score (None: the prior model scores it).

    `handler` is an ingest worker's handler: its decoding, planning and SoR reader are reused,
    writing only to the new version with `embedder` and `preparer`.
    """
    options = options or ReindexOptions()
    started = time.perf_counter()
    old = registry.active_version(tenant)
    placement, reason = choose_placement(registry, store, tenant, options)
    existing = _building_version(registry, tenant, embedder, sparse_encoder, placement)
    manifest = existing or registry.create_version(
        tenant, embedder.spec, sparse_encoder=sparse_encoder, placement=placement
    )
    report = ReindexReport(
        tenant=tenant,
        model=embedder.spec.model_version,
        old_version=old,
        new_version=manifest.version,
        resumed=existing is not None,
        placement=placement,
        placement_reason=reason,
    )
    store.ensure_collection(
        manifest.index_name, manifest.dimension, sparse=True, placement=manifest.placement
    )
    target = TargetIndex(manifest.index_name, manifest.version, embedder.spec.model_version)
    job = _Job(
        report=report,
        writer=handler.for_targets(_OneVersion(target, tenant), embedder, preparer),
        registry=registry,
        store=store,
        sor=sor,
        options=options,
        progress=progress,
        calibrate=calibrate,
    )
    try:
        job.run(manifest.index_name, search, sleep)
    finally:
        report.seconds = time.perf_counter() - started
    return report


@dataclass
class _Job:
    report: ReindexReport
    writer: SorWriter
    registry: IndexRegistry
    store: VectorStore
    sor: SystemOfRecord
    options: ReindexOptions
    progress: Progress
    calibrate: CalibrateFn | None = None

    def run(self, collection: str, search: SearchFn | None, sleep: Callable[[float], None]) -> None:
        report, options, registry = self.report, self.options, self.registry
        tenant, old, new = report.tenant, report.old_version, report.new_version
        verb = "resuming" if report.resumed else "building"
        active = f"v{old}" if old is not None else "none"
        self.progress(
            f"{verb} {collection} with {report.model}, {report.placement} "
            f"({report.placement_reason}; active: {active})"
        )
        if options.settle_s > 0:
            self.progress(f"waiting {options.settle_s:g} s for the ingest workers to see v{new}")
            sleep(options.settle_s)
        self.snapshot()
        if not self.catch_up(options.max_catchup_rounds):
            return
        if self.calibrate is not None:
            report.calibration = self.calibrate(tenant, new, self.progress)
        if old is not None and old != new and search is not None:
            parity = self.parity(search, old)
            report.parity = parity.to_dict()
            if not parity.passed and not options.force:
                registry.retire(tenant, new)
                report.retired.append(new)
                report.outcome = "parity_failed"
                self.progress(
                    f"parity gate FAILED: {'; '.join(parity.failures)}; v{old} stays active, "
                    f"v{new} retired (rerun with --force to switch anyway)"
                )
                return
            if not parity.passed:
                report.parity_overridden = True
                self.progress(f"parity gate failed, overridden: {'; '.join(parity.failures)}")
            else:
                self.progress(f"parity gate passed: {_deltas(parity.deltas)}")
        # workers holding the new model kept it current during the gate; a last round closes
        # the gap for any that do not
        if not self.catch_up(1):
            return
        report.points = self.store.count(collection, StoreFilter(tenant_id=tenant))
        registry.mark_ready(tenant, new, total_vectors=report.points)
        if not options.switch:
            self.progress(f"v{new} is ready ({report.points} points); not switched")
            return
        registry.activate(tenant, new)
        report.outcome = "switched"
        self.progress(f"switched {tenant!r} to v{new} ({report.points} points)")
        if old is not None and old != new and options.retire:
            if options.grace_s > 0:
                self.progress(
                    f"v{old} stays readable for pinned requests for {options.grace_s:g} s"
                )
                sleep(options.grace_s)
            retired = registry.retire(tenant, old)
            report.retired.append(old)
            self.progress(f"retired v{old}")
            if options.drop_retired:
                if options.settle_s > 0:
                    # the workers' target cache still names v{old} for a moment: a write to a
                    # dropped collection fails (and, for a partition, would recreate nothing)
                    self.progress(
                        f"waiting {options.settle_s:g} s for the ingest workers to stop "
                        f"writing v{old}"
                    )
                    sleep(options.settle_s)
                self.store.drop_collection(retired.index_name)
                report.dropped.append(retired.index_name)
                self.progress(f"dropped {retired.index_name}")

    def readable(self, tenant: str, batch: int) -> Iterator[Entity]:
        """The tenant's live entities from a SoR scan; a row that cannot be mapped is noted in
        the report (once, however many scans meet it) and skipped."""
        noted = set(self.report.unreadable_rows)
        for row in self.sor.scan(tenant, batch=batch):
            if isinstance(row, SorRowError):
                name = row.entity_id or str(row)
                if name not in noted:
                    noted.add(name)
                    self.report.unreadable_rows.append(name)
                continue
            yield row

    def snapshot(self) -> None:
        """Write every live SoR row of the tenant to the new version, with progress."""
        report = self.report
        total = self.sor.count(report.tenant)
        report.sor_entities = total
        began = last = time.perf_counter()
        for batch in _batches(self.readable(report.tenant, 500), self.options.batch):
            rows = SorBatch(TenantId(report.tenant), "reindex", entities=tuple(batch))
            report.rejected.extend(self.writer.apply_rows(rows).rejections)
            report.written += len(batch)
            now = time.perf_counter()
            if now - last >= 2.0 or report.written >= total:
                last = now
                rate = report.written / max(now - began, 1e-9)
                left = max(total - report.written, 0) / rate if rate > 0 else 0.0
                share = 100.0 * report.written / total if total else 100.0
                self.progress(
                    f"snapshot {report.written}/{total} entities ({share:.0f}%), "
                    f"{rate:.1f} entities/s, ~{left:.0f} s left"
                )
        report.snapshot_seconds = time.perf_counter() - began
        if report.unreadable_rows:
            self.progress(
                f"snapshot: {len(report.unreadable_rows)} SoR rows cannot be mapped and were "
                f"left out (e.g. {report.unreadable_rows[:5]}; the log names each one's reason)"
            )

    def drifted(self) -> list[str]:
        """Entities the new version has wrong while the active version has them right.

        Under live traffic the SoR always runs a little ahead of every index (changes in
        flight to the workers), so "equal to the SoR" cannot be the test: a change in flight
        leaves the active version behind too, and the workers deliver it to both. What must
        not happen is the new version lagging where the active one does not: a change applied
        to the active version only, or a snapshot copy that landed after a newer write or a
        delete. The scans run active -> SoR -> new, so a change landing between them makes the
        new version look newer, never staler. Without an active version the SoR alone decides.
        """
        tenant, old = self.report.tenant, self.report.old_version
        started = time.perf_counter()
        active = (
            entity_states(self.store, self.registry.manifest(tenant, old).index_name, tenant)
            if old is not None and old != self.report.new_version
            else None
        )
        sor = {e.entity_id: e.content_hash for e in self.readable(tenant, 1000)}
        new_index = self.registry.manifest(tenant, self.report.new_version).index_name
        new = entity_states(self.store, new_index, tenant)
        unindexable = {r.entity_id for r in self.report.rejected} | set(self.report.unreadable_rows)
        drifted = []
        behind_sor = 0
        for entity_id in sorted(sor.keys() | new.keys()):
            truth = sor.get(entity_id)
            if new.get(entity_id) == truth or entity_id in unindexable:
                continue
            behind_sor += 1
            if active is None or active.get(entity_id) == truth:
                drifted.append(entity_id)
        self.report.catchup.append(
            {
                "behind_active": len(drifted),
                "behind_sor": behind_sor,
                "sor_entities": len(sor),
                "seconds": round(time.perf_counter() - started, 3),
            }
        )
        return drifted

    def catch_up(self, rounds: int) -> bool:
        """Reconcile the new version and repair, up to `rounds` times; False (outcome
        "drift") when entities still differ afterwards."""
        for _ in range(rounds):
            drifted = self.drifted()
            if not drifted:
                self.progress("catch-up: the new version matches the SoR")
                return True
            self.progress(f"catch-up: re-reading {len(drifted)} entities changed during the build")
            for start in range(0, len(drifted), 200):
                chunk = drifted[start : start + 200]
                rows = SorBatch(TenantId(self.report.tenant), "reindex", reread=tuple(chunk))
                self.report.rejected.extend(self.writer.apply_rows(rows).rejections)
        left = self.drifted()
        if not left:
            self.progress("catch-up: the new version matches the SoR")
            return True
        self.report.outcome = "drift"
        self.progress(
            f"catch-up did not converge: {len(left)} entities still differ from the SoR "
            f"(e.g. {sorted(left)[:5]}); not switching"
        )
        return False

    def parity(self, search: SearchFn, old: int) -> ParityReport:
        """Run the gate's queries on the old and the new version."""
        tenant, settings = self.report.tenant, self.options.parity
        queries: list[EvalQuery]
        if self.options.parity_queries is not None:
            queries = load_queries(self.options.parity_queries, tenant)
            source = str(self.options.parity_queries)
        else:
            queries = known_item_queries(self.readable(tenant, 500), tenant, settings)
            source = f"known-item queries sampled from the SoR (seed {settings.seed})"
        new = self.report.new_version
        self.progress(f"parity gate: {len(queries)} queries on v{old} and v{new}")
        return parity_check(
            queries, search, old_version=old, new_version=new, settings=settings, source=source
        )


def _deltas(deltas: dict[str, float]) -> str:
    return ", ".join(f"{m} {d:+.4f}" for m, d in deltas.items())


def calibrate_with(retriever: Retriever, embedder: Embedder) -> CalibrateFn:
    """Fit a version's evidence calibration with the Retrieve pipeline's own candidate stage
    (and reranker, when it runs one) and store it with the version."""

    def calibrate(tenant: str, version: int, progress: Progress) -> dict[str, Any]:
        index = retriever.registry.lookup(tenant, version)
        fitted = calibrate_version(
            retriever.search,
            retriever.registry,
            index,
            embedder,
            retriever.store,
            with_rerank=retriever.reranks,
            progress=progress,
        )
        return {
            "fingerprint": fitted.fingerprint,
            "order": fitted.ranking.label,
            "hard_threshold": fitted.thresholds.hard,
            "held_out": fitted.report.get("held_out"),
        }

    return calibrate


def retriever_search(retriever: Retriever, top_k: int) -> SearchFn:
    """Parity queries through the real Retrieve pipeline (validation, hybrid search, ranking,
    SoR verification), pinned to one version per call; no audit (no publisher). The hard
    threshold is off (override 0): each version's thresholds come from its own calibration, so
    the gate compares rankings, not two calibrations' abstentions."""

    def search(query: EvalQuery, version: int) -> QueryRun:
        request = pb.RetrieveRequest(
            query_text=query.text,
            top_k=top_k,
            index_version=str(version),
            request_id=f"parity-{query.query_id}",
            min_similarity_override=retriever.config.min_similarity_override_min,
        )
        validated = validate_request(request, retriever.config, query.tenant)
        pack = retriever.retrieve(validated)
        return QueryRun(
            query.query_id,
            Status.parse(pb.RetrievalStatus.Name(pack.status)),
            entity_ids=tuple(r.entity_id for r in pack.results),
            chunk_ids=tuple(r.chunk_id for r in pack.results),
            latency_ms=pack.timings_ms["total"],
        )

    return search
