"""`ragstream reconcile`: compare a tenant's system of record with its active index and report
(and with `--repair`, fix) the drift: entities missing from the index, ghosts the SoR no longer
has, and stale or incomplete ones (another content hash, or a partial chunk set).

The comparison streams both sides once (a keyset scan of each mapped table's live rows, a scroll
of the index's points), so its cost is linear in rows + points, and it is made table by table.
Repairs go through the worker's normal write path: each drifted entity is re-read from the SoR
and upserted, or deleted when gone. Reconcile never repairs what it cannot see: indexed entities
of a table that is not mapped (`unmapped`) or that the SoR reader cannot read (`unreadable`)
are reported and left alone, and so is a SoR row that is there but cannot be mapped
(`unreadable_rows`: its metadata is not JSON, its document cannot be read, ...): an
unreadable row is not a missing one, so its indexed entity is neither extra nor stale.
"""

from __future__ import annotations

import time
from collections.abc import Iterable, Sequence
from dataclasses import asdict, dataclass, field
from typing import Any

from prometheus_client import CollectorRegistry, Gauge

from ragcore.calibration_state import (
    CALIBRATION_STATES,
    DEFAULT_STALE_RATIO,
    CalibrationState,
    calibration_state,
)
from ragcore.errors import SorRowError, SorTableError
from ragcore.mapping import table_of_entity
from ragcore.sor.base import SystemOfRecord, tables_of
from ragcore.store.base import (
    CHUNK_ID,
    ENTITY_ID,
    PLACEMENTS,
    SOURCE_HASH,
    Placement,
    StoreFilter,
    VectorStore,
)
from ragcore.store.ids import TenantId
from ragcore.store.points import CHUNK_COUNT
from ragcore.store.registry import IndexRegistry
from schemas.entities import Entity
from streams.ingest import SorBatch, SorWriter

#: Drift that repair fixes (re-read from the SoR).
DRIFT_KINDS = ("missing", "extra", "stale")
#: What reconcile cannot judge: indexed entities whose table is not mapped or cannot be read,
#: and SoR rows that cannot be mapped (each logged by the SoR reader with its table and reason).
BLIND_KINDS = ("unmapped", "unreadable", "unreadable_rows")


@dataclass
class TableCounts:
    """One table's share of a reconciliation."""

    sor_entities: int = 0
    indexed_entities: int = 0
    missing: int = 0
    extra: int = 0
    stale: int = 0
    #: SoR rows that cannot be mapped (neither missing nor stale; never repaired)
    unreadable_rows: int = 0
    #: why the SoR reader could not read the table (its entities were left alone)
    error: str | None = None


@dataclass
class ReconcileReport:
    """What one reconciliation found (and repaired)."""

    tenant: str
    index: str
    sor_entities: int
    indexed_entities: int
    points_scanned: int
    #: where the reconciled version lives (None: the tenant has no index version)
    placement: Placement | None = None
    missing: list[str] = field(default_factory=list)
    extra: list[str] = field(default_factory=list)
    stale: list[str] = field(default_factory=list)
    #: indexed entities of tables that are not mapped (never repaired)
    unmapped: list[str] = field(default_factory=list)
    #: indexed entities of mapped tables the SoR reader cannot read (never repaired)
    unreadable: list[str] = field(default_factory=list)
    #: SoR rows of the tenant that cannot be mapped, by entity id (a row whose key forms
    #: none: its error); indexed or not, never repaired
    unreadable_rows: list[str] = field(default_factory=list)
    tables: dict[str, TableCounts] = field(default_factory=dict)
    sor_seconds: float = 0.0
    index_seconds: float = 0.0
    #: drifted entities the repair changed (written or deleted)
    repaired: int = 0
    #: drifted entities whose re-read changed nothing (what the SoR holds is indexed already:
    #: the drift is in how the two sides are compared, not in the index)
    repair_unchanged: int = 0
    #: drifted entities a streamed change rewrote while they were re-read (left to it)
    repair_raced: int = 0
    #: drifted entities the SoR holds but that cannot be indexed (see the worker's log)
    repair_rejected: int = 0
    repair_seconds: float = 0.0
    #: the version's evidence calibration against its chunks now (a run over every table of a
    #: version only: `ragcore.calibration_state`)
    calibration: CalibrationState | None = None

    @property
    def drift(self) -> int:
        """Entities out of step with the SoR (what repair fixes)."""
        return len(self.missing) + len(self.extra) + len(self.stale)

    @property
    def blind(self) -> int:
        """What reconcile could not judge: indexed entities of unmapped or unreadable tables,
        and unreadable SoR rows."""
        return len(self.unmapped) + len(self.unreadable) + len(self.unreadable_rows)

    def to_dict(self, *, sample: int = 20) -> dict[str, Any]:
        """JSON form with counts and the first `sample` ids of each kind."""
        doc = asdict(self)
        doc["calibration"] = None if self.calibration is None else self.calibration.to_dict()
        for kind in (*DRIFT_KINDS, *BLIND_KINDS):
            ids = doc.pop(kind)
            doc[kind] = {"count": len(ids), "ids": sorted(ids)[:sample]}
        doc["drift"] = self.drift
        return doc


class ReconcileMetrics:
    """`ragstream_reconcile_*` gauges (the drift alert reads them) and, from the same pass over
    every tenant, the tenants by placement and those due for promotion to their own collection
    (docs/decisions/tiered-tenancy.md)."""

    def __init__(
        self, registry: CollectorRegistry, *, dedicated_above_points: int = 100_000
    ) -> None:
        self._threshold = dedicated_above_points
        self.tenants = Gauge(
            "ragstream_tenants",
            "Tenants with an active index at the last reconciliation, by placement.",
            ["placement"],
            registry=registry,
        )
        self.due = Gauge(
            "ragstream_tenants_due_for_promotion",
            "Shared tenants above RAGSTREAM_STORE__DEDICATED_ABOVE_POINTS at the last "
            "reconciliation (`ragstream index placement` names them).",
            registry=registry,
        )
        self.drift = Gauge(
            "ragstream_reconcile_drift_entities",
            "Entities out of step with the SoR at the last reconciliation, by kind: missing, "
            "extra, stale (drift); unmapped, unreadable (indexed entities of tables the SoR "
            "reader cannot see) and unreadable_rows (SoR rows that cannot be mapped), never "
            "repaired.",
            ["kind"],
            registry=registry,
        )
        self.calibration = Gauge(
            "ragstream_tenants_calibration",
            "Tenants with an active index at the last reconciliation, by the state of its "
            "evidence calibration: fitted, stale (its chunk count moved more than "
            "RAGSTREAM_RECONCILE__CALIBRATION_STALE_RATIO since), prior (never calibrated), "
            "unreadable. `ragstream calibrate --stale` refits the stale and the uncalibrated.",
            ["state"],
            registry=registry,
        )
        self.last_run = Gauge(
            "ragstream_reconcile_last_run_timestamp_seconds",
            "Unix time of the last reconciliation (0: none yet).",
            registry=registry,
        )
        # 0 until the first run (last_run 0 says none ran): a dashboard shows values, not
        # "no data", and the alerts (drift > 100, stale calibrations > 0) read nothing into it
        for kind in (*DRIFT_KINDS, *BLIND_KINDS):
            self.drift.labels(kind)
        for state in CALIBRATION_STATES:
            self.calibration.labels(state)

    def record(self, report: ReconcileReport) -> None:
        """Export a report's counts."""
        self.record_all([report])

    def record_all(self, reports: Sequence[ReconcileReport]) -> None:
        """Export the counts of one run over several tenants (summed per kind)."""
        for kind in (*DRIFT_KINDS, *BLIND_KINDS):
            self.drift.labels(kind).set(sum(len(getattr(r, kind)) for r in reports))
        for placement in PLACEMENTS:
            self.tenants.labels(placement).set(sum(r.placement == placement for r in reports))
        self.due.set(
            sum(r.placement == "shared" and r.points_scanned > self._threshold for r in reports)
        )
        for state in CALIBRATION_STATES:
            self.calibration.labels(state).set(
                sum(r.calibration is not None and r.calibration.state == state for r in reports)
            )
        self.last_run.set(time.time())


def reconcile(
    tenant: str,
    *,
    sor: SystemOfRecord,
    store: VectorStore,
    registry: IndexRegistry,
    handler: SorWriter | None = None,
    repair: bool = False,
    batch: int = 1000,
    version: int | None = None,
    table: str | None = None,
    calibration_stale_ratio: float = DEFAULT_STALE_RATIO,
) -> ReconcileReport:
    """Compare the tenant's SoR rows with an index version (default: the active one), table by
    table (or only `table`, a mapped table's name); repair through `handler`, which must write
    to that version (the worker's handler writes to the active and building versions; the
    reindex job's handler to the version it builds). A run over every table also judges the
    version's calibration against the chunks it scrolled (`report.calibration`)."""
    mappings = tables_of(sor.catalog, table)
    if version is None:
        version = registry.active_version(tenant)
    if version is None:
        index, placement = "", None
        indexed: dict[str, tuple[set[str], set[str | None], set[object]]] = {}
        points = 0
        index_s = 0.0
    else:
        manifest = registry.manifest(tenant, version)
        index, placement = manifest.index_name, manifest.placement
        started = time.perf_counter()
        indexed, points = _indexed(store, index, tenant, batch)
        index_s = time.perf_counter() - started
    report = ReconcileReport(
        tenant=tenant,
        index=index,
        sor_entities=0,
        indexed_entities=0,
        points_scanned=points,
        placement=placement,
        index_seconds=round(index_s, 3),
        calibration=(
            calibration_state(
                registry, tenant, version, points, stale_ratio=calibration_stale_ratio
            )
            if version is not None and table is None
            else None
        ),
    )
    by_table: dict[str, list[str]] = {}
    for entity_id in indexed:
        label = table_of_entity(entity_id)
        if table is None or label == table:
            by_table.setdefault(label, []).append(entity_id)
    started = time.perf_counter()
    for mapping in mappings:
        counts = report.tables.setdefault(mapping.label, TableCounts())
        ids = by_table.pop(mapping.label, [])
        counts.indexed_entities = len(ids)
        try:
            sor_hashes, bad_rows = _sor_side(sor.scan(tenant, batch=batch, table=mapping.label))
        except SorTableError as exc:
            counts.error = str(exc)
            report.unreadable.extend(ids)
            continue
        counts.sor_entities = len(sor_hashes)
        report.sor_entities += len(sor_hashes)
        counts.unreadable_rows = len(bad_rows)
        report.unreadable_rows.extend(e.entity_id or str(e) for e in bad_rows)
        for entity_id, digest in sor_hashes.items():
            found = indexed.get(entity_id)
            if found is None:
                report.missing.append(entity_id)
                counts.missing += 1
            elif _state(*found) != digest:
                report.stale.append(entity_id)
                counts.stale += 1
        unreadable = {e.entity_id for e in bad_rows}
        unseen = [e for e in ids if e not in sor_hashes and e not in unreadable]
        if None in unreadable:
            # a row whose key forms no entity id could be any of them: judge none
            report.unreadable.extend(unseen)
            continue
        report.extra.extend(unseen)
        counts.extra = len(unseen)
    for ids in by_table.values():
        report.unmapped.extend(ids)
    report.indexed_entities = sum(c.indexed_entities for c in report.tables.values()) + len(
        report.unmapped
    )
    report.sor_seconds = round(time.perf_counter() - started, 3)
    if repair and report.drift:
        if handler is None:
            raise ValueError("repair needs the ingest handler")
        started = time.perf_counter()
        drifted: Sequence[str] = [*report.missing, *report.stale, *report.extra]
        for start in range(0, len(drifted), 200):
            done = handler.apply_rows(
                SorBatch(TenantId(tenant), "reconcile", reread=tuple(drifted[start : start + 200]))
            )
            # only what the repair changed counts as repaired
            report.repaired += len(done.changed)
            report.repair_unchanged += len(done.unchanged)
            report.repair_raced += len(done.raced)
            report.repair_rejected += len(done.rejections)
        report.repair_seconds = round(time.perf_counter() - started, 3)
    return report


def _sor_side(rows: Iterable[Entity | SorRowError]) -> tuple[dict[str, str], list[SorRowError]]:
    """entity -> content hash of the rows scanned, and the rows that cannot be mapped."""
    hashes: dict[str, str] = {}
    bad: list[SorRowError] = []
    for row in rows:
        if isinstance(row, SorRowError):
            bad.append(row)
        else:
            hashes[row.entity_id] = row.content_hash
    return hashes, bad


def _indexed(
    store: VectorStore, index: str, tenant: str, batch: int
) -> tuple[dict[str, tuple[set[str], set[str | None], set[object]]], int]:
    """entity -> (chunk ids, source hashes, declared chunk counts), and the points scanned."""
    out: dict[str, tuple[set[str], set[str | None], set[object]]] = {}
    points = 0
    # Only the keys compared here: chunk texts and the rest are never converted to Python.
    fields = (ENTITY_ID, CHUNK_ID, SOURCE_HASH, CHUNK_COUNT)
    for point in store.scroll(index, StoreFilter(tenant_id=tenant), batch=batch, fields=fields):
        points += 1
        p = point.payload
        chunks, hashes, counts = out.setdefault(str(p[ENTITY_ID]), (set(), set(), set()))
        chunks.add(str(p[CHUNK_ID]))
        hashes.add(p.get(SOURCE_HASH))
        counts.add(p.get(CHUNK_COUNT))
    return out, points


#: The state of an entity whose chunk set is incomplete or mixes content versions.
INCONSISTENT = "<inconsistent>"


def _state(chunks: set[str], hashes: set[str | None], counts: set[object]) -> str:
    """The content hash of a complete, single-version chunk set, else INCONSISTENT."""
    if len(hashes) == 1 and counts == {len(chunks)}:
        (digest,) = hashes
        if digest is not None:
            return digest
    return INCONSISTENT


def entity_states(store: VectorStore, index: str, tenant: str, batch: int = 1000) -> dict[str, str]:
    """entity -> the content hash its chunks were made from (INCONSISTENT when its chunk set is
    partial or mixed), for every entity of the tenant in `index`: one payload-selected scroll."""
    indexed, _ = _indexed(store, index, tenant, batch)
    return {entity_id: _state(*found) for entity_id, found in indexed.items()}
