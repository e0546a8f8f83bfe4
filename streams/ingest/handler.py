"""`IngestHandler`: the ingest stages in order, for a batch of records (the consumer loop)
and for rows of the system of record (reconcile repairs, reindex snapshots and catch-ups).

decode and plan (`plan`) -> resolve deletes and re-reads (`resolve`) -> decide per write target
(`decide`) -> embed and write (`write`). The consumer loop commits only after `handle` returns.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Collection, Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass

from ragcore.embedders.base import Embedder
from ragcore.errors import ConfigError, MappingError, StoreError, StoreUnavailableError
from ragcore.plan import Action, Plan
from ragcore.store.base import VectorStore
from ragcore.store.ids import TenantId
from schemas.entities import Entity
from schemas.events import RawRecord, RecordPosition
from streams.consumer import RETRYABLE, DeadLetter, Routed
from streams.ingest.context import Stages
from streams.ingest.decide import Decision, decide
from streams.ingest.plan import Deferred, Locator, TopicTable, fault_reason, route_record
from streams.ingest.ports import (
    Decoder,
    EntityPreparer,
    IndexTargets,
    Planner,
    RowSource,
    SparseEncoder,
)
from streams.ingest.resolve import Resolved, resolve
from streams.ingest.work import Faults, Rejection, RereadOutcome, SorBatch, SorWritten, Work
from streams.ingest.write import Written, write
from streams.metrics import IngestMetrics
from streams.scheduler import Lane

log = logging.getLogger("streams.ingest")


@dataclass(frozen=True, slots=True)
class BatchApplied:
    """One handled batch of records, as its observers see it: the handler's clock when the
    batch reached it (`started`, right after the consumer's poll) and when the store had
    acknowledged its writes (`acked`, before the offsets are committed), the records it held
    and the work applied (each with its plan's `source_ts_ms` and its records' broker
    timestamps). What `ragstream_ingest_freshness_seconds` observes, per entity."""

    started: float
    acked: float
    records: int
    applied: tuple[Work, ...]


#: Told about every handled batch of records (benchmarks; must be quick and must not raise).
BatchObserver = Callable[[BatchApplied], None]


@dataclass(frozen=True, slots=True)
class Applied:
    """What applying one segment of work did: the work applied (written or deleted), what each
    entity read from the SoR became (`outcomes`, by entity id) and what could not be indexed."""

    applied: tuple[Work, ...]
    outcomes: Mapping[str, RereadOutcome]
    faults: Faults


class SharedLock:
    """Many holders in `shared` mode at once, or one in `exclusive` mode (which waits for the
    shared holders to leave and keeps new ones out while it waits: a reconciliation is never
    starved by a steady stream)."""

    def __init__(self) -> None:
        self._cond = threading.Condition()
        self._shared = 0
        self._exclusive = False
        self._waiting = 0

    @contextmanager
    def shared(self) -> Iterator[None]:
        """Hold the lock with the other shared holders."""
        with self._cond:
            self._cond.wait_for(lambda: not self._exclusive and not self._waiting)
            self._shared += 1
        try:
            yield
        finally:
            with self._cond:
                self._shared -= 1
                self._cond.notify_all()

    @contextmanager
    def exclusive(self) -> Iterator[None]:
        """Hold the lock alone."""
        with self._cond:
            self._waiting += 1
            self._cond.wait_for(lambda: not self._exclusive and not self._shared)
            self._waiting -= 1
            self._exclusive = True
        try:
            yield
        finally:
            with self._cond:
                self._exclusive = False
                self._cond.notify_all()


class IngestHandler:
    """Implements `streams.consumer.BatchHandler` and `streams.ingest.SorWriter` over the
    store and embedder ports."""

    def __init__(
        self,
        *,
        decode: Decoder,
        plan: Planner,
        preparer: EntityPreparer,
        embedder: Embedder,
        sparse: SparseEncoder,
        store: VectorStore,
        targets: IndexTargets,
        metrics: IngestMetrics,
        rows: RowSource | None = None,
        keyword_fields: Sequence[str] = (),
        event_date_fields: Mapping[str, str] | None = None,
        reindex_topic: str | None = None,
        other_models: Sequence[tuple[Embedder, EntityPreparer]] = (),
        clock: Callable[[], float] = time.time,
        locate: Locator | None = None,
        tenant_class: Callable[[str], str] = lambda _tenant: "default",
        documents: Collection[str] = (),
        topic_table: TopicTable | None = None,
    ) -> None:
        """`embedder`/`preparer` are the primary model; `other_models` are further models
        (embedder and its preparer) that targets may name, e.g. the next model during a
        blue-green model change; `locate` names the table, entity and tenant of a record that
        cannot be planned, `topic_table` the table of one that cannot be decoded (its dead
        letter's headers)."""
        self._decode = decode
        self._plan = plan
        self._locate = locate
        self._topic_table = topic_table
        self._tenant_class = tenant_class
        #: the labels of the document tables (their entities are heavy to apply)
        self._documents = frozenset(documents)
        self._reindex_topic = reindex_topic
        self._clock = clock
        self._stages = Stages(
            preparer=preparer,
            embedder=embedder,
            models={e.spec.model_version: (e, p) for e, p in [(embedder, preparer), *other_models]},
            sparse=sparse,
            store=store,
            targets=targets,
            metrics=metrics,
            rows=rows,
            keyword_fields=tuple(keyword_fields),
            event_date_fields=dict(event_date_fields or {}),
        )
        # the consumer's apply threads and the scheduled reconciliation share one handler: the
        # apply threads work on disjoint entities (the scheduler never gives one entity to two
        # of them) and may overlap; a write from the SoR (reconcile, reindex) runs alone
        self._lock = SharedLock()
        self._observers: list[BatchObserver] = []

    @property
    def models(self) -> Mapping[str, tuple[Embedder, EntityPreparer]]:
        """model version -> (embedder, preparer) of every model this handler writes with."""
        return self._stages.models

    def observe(self, observer: BatchObserver) -> None:
        """Call `observer` after each batch of records whose writes were acknowledged."""
        self._observers.append(observer)

    # --- RecordHandler (the consumer loop) --------------------------------------------------

    def route(self, record: RawRecord) -> Routed[Deferred] | None:
        """Decode `record` and say where it goes in the scheduler (tenant, lane, key,
        barrier); its planning waits for the apply thread (`Deferred`). None: it needs no
        work."""
        routed = route_record(
            record,
            decode=self._decode,
            plan=self._plan,
            reindex_topic=self._reindex_topic,
            locate=self._locate,
            stages=self._stages,
            clock=self._clock,
            documents=self._documents,
            topic_table=self._topic_table,
        )
        if routed is None:
            return None
        route, deferred = routed
        return Routed(route, lambda: deferred)

    def merge(self, earlier: Deferred, later: Deferred) -> Deferred:
        """One unit's records for two records of one key, planned together when applied."""
        return earlier.merge(later)

    def heavy(self, payload: Deferred) -> bool:
        """Whether applying the work reads a document (few go in one batch)."""
        return payload.heavy

    def apply(self, units: Sequence[Deferred]) -> Sequence[DeadLetter]:
        """Plan and apply a batch of units: their entities' work in one segment (one embedding
        call per model), each TRUNCATE in a segment of its own after it (the scheduler puts no
        later unit of a truncated partition in the same batch); return the dead letters."""
        payloads = [p for p in (unit.planned() for unit in units) if p is not None]
        if not payloads:
            return []
        letters = [letter for p in payloads for letter in p.letters]
        works = [w for p in payloads for w in p.works.values()]
        segments = [works] if works else []
        segments += [[p.truncate] for p in payloads if p.truncate is not None]
        lanes = {id(w): p.lane for p in payloads for w in p.works.values()}
        applied: list[Work] = []
        for segment in segments:
            # a TRUNCATE touches every entity of its table: it runs alone
            alone = segment[0].plan.action is Action.TRUNCATE
            with self._lock.exclusive() if alone else self._lock.shared():
                done = self._apply_contained(segment)
            applied += done.applied
            letters += done.faults.letters
        now = self._clock()
        self._observe_freshness(applied, lanes, now)
        if self._observers:
            started = min((p.started for p in payloads), default=now)
            records = sum(p.records for p in payloads)
            batch = BatchApplied(started, now, records, tuple(applied))
            for observer in self._observers:
                observer(batch)
        return letters

    def _observe_freshness(
        self, applied: Sequence[Work], lanes: Mapping[int, Lane], now: float
    ) -> None:
        """`ragstream_ingest_freshness_seconds` of every applied change, by tenant class and
        lane."""
        for item in applied:
            if item.plan.source_ts_ms is None:
                continue
            tenant = item.plan.tenant_id or ""
            lane = lanes.get(id(item), Lane.LIVE).label
            self._stages.metrics.freshness.labels(self._tenant_class(tenant), lane).observe(
                max(0.0, now - item.plan.source_ts_ms / 1000)
            )

    # --- BatchHandler (tools, tests and replays of raw records) -----------------------------

    def handle(self, records: Sequence[RawRecord]) -> Sequence[DeadLetter]:
        """Apply a batch of records in offset order, as the consumer loop would without read
        ahead: each barrier (a TRUNCATE...) between what came before and after it; return the
        dead letters."""
        letters: list[DeadLetter] = []
        by_key: dict[object, Deferred] = {}
        for rec in records:
            routed = self.route(rec)
            if routed is None:
                continue
            unit = routed.plan()
            if unit is None:
                continue
            if routed.route.barrier:
                # a TRUNCATE, a schema change or a tenant move: after what came before it
                letters += self.apply(list(by_key.values()))
                letters += self.apply([unit])
                by_key = {}
                continue
            key: object = routed.route.key if routed.route.key is not None else object()
            earlier = by_key.get(key)
            by_key[key] = earlier.merge(unit) if earlier is not None else unit
        letters += self.apply(list(by_key.values()))
        return letters

    # --- SorWriter --------------------------------------------------------------------------

    def apply_rows(self, batch: SorBatch) -> SorWritten:
        """Write what the SoR holds through the normal write path: `batch.entities` as read
        (version ordering, unchanged-content skips, one embedding call per model), then each id
        of `batch.reread` re-read now (upserted, or deleted when the row is gone). Returns the
        entities that could not be indexed (logged too: a SoR read has no record to DLQ), and
        which entities changed. Raises `ConfigError` for re-reads when no SoR is configured."""
        if batch.reread and self._stages.rows is None:
            raise ConfigError("re-reading entities needs a system of record (RAGSTREAM_SOR__KIND)")
        work = [
            Work(
                Plan(
                    Action.UPSERT,
                    batch.reason,
                    RecordPosition(f"snapshot:{batch.reason}", 0, n),
                    tenant_id=TenantId(entity.tenant_id),
                    entity_id=entity.entity_id,
                    version=entity.version,
                    entity=entity,
                )
            )
            for n, entity in enumerate(batch.entities)
        ]
        work += [
            Work(
                Plan(
                    Action.REFETCH,
                    batch.reason,
                    RecordPosition(f"reread:{batch.reason}", 0, n),
                    tenant_id=batch.tenant_id,
                    entity_id=entity_id,
                )
            )
            for n, entity_id in enumerate(dict.fromkeys(batch.reread))
        ]
        with self._lock.exclusive():
            done = self._apply_contained(work)
        by_outcome: dict[str, list[str]] = {"changed": [], "unchanged": [], "raced": []}
        for entity_id, outcome in done.outcomes.items():
            if outcome != "rejected":
                by_outcome[outcome].append(entity_id)
        return SorWritten(
            changed=tuple(by_outcome["changed"]),
            unchanged=tuple(by_outcome["unchanged"]),
            raced=tuple(by_outcome["raced"]),
            rejections=done.faults.rejections,
        )

    def reread(self, tenant_id: str, entity_ids: Sequence[str], reason: str) -> list[Rejection]:
        """Re-read entities from the SoR and apply what it says now (upsert, or delete when the
        row is gone): `apply_rows` of ids. Raises when no SoR is configured."""
        batch = SorBatch(TenantId(tenant_id), reason, reread=tuple(entity_ids))
        return list(self.apply_rows(batch).rejections)

    def upsert_entities(self, entities: Sequence[Entity], reason: str) -> list[Rejection]:
        """Write entities read from the SoR (a snapshot): `apply_rows` of entities."""
        if not entities:
            return []
        batch = SorBatch(TenantId(entities[0].tenant_id), reason, entities=tuple(entities))
        return list(self.apply_rows(batch).rejections)

    def for_targets(
        self, targets: IndexTargets, embedder: Embedder, preparer: EntityPreparer
    ) -> IngestHandler:
        """A handler with this one's decoding, planning, SoR reader and metrics that writes to
        `targets` with `embedder`: the writer of a reindex job (only the version it builds)."""
        s = self._stages
        return IngestHandler(
            decode=self._decode,
            plan=self._plan,
            preparer=preparer,
            embedder=embedder,
            sparse=s.sparse,
            store=s.store,
            targets=targets,
            metrics=s.metrics,
            rows=s.rows,
            keyword_fields=s.keyword_fields,
            event_date_fields=s.event_date_fields,
            clock=self._clock,
            locate=self._locate,
            tenant_class=self._tenant_class,
            documents=self._documents,
            topic_table=self._topic_table,
        )

    # --- the stages -------------------------------------------------------------------------

    def _apply_contained(self, segment: Sequence[Work]) -> Applied:
        """`_apply_refreshing`, with a failure that is not an outage (`RETRYABLE`, retried by
        the caller) or a configuration error isolated to the entity it came from: the segment
        is split in halves until the failing entity is alone, which is then dead-lettered (or
        reported, for a row read from the SoR) with the error's code, and the others are
        applied. The entities of a segment are independent (one work item each), and every
        write is idempotent, so applying a half again after a failure repeats nothing harmful.
        Bisection finds k failing entities of n in O(k log n) attempts."""
        try:
            return self._apply_refreshing(segment)
        except (*RETRYABLE, ConfigError):
            raise
        except Exception as exc:  # noqa: BLE001 - contained below: one entity's fault
            if len(segment) > 1:
                mid = len(segment) // 2
                first = self._apply_contained(segment[:mid])
                second = self._apply_contained(segment[mid:])
                return Applied(
                    first.applied + second.applied,
                    {**first.outcomes, **second.outcomes},
                    first.faults + second.faults,
                )
            return self._fault(segment[0], exc)

    def _fault(self, item: Work, exc: Exception) -> Applied:
        """One entity whose resolve, decide or write raised `exc`: its records dead-lettered (or
        the SoR row reported), so that nothing else waits for it."""
        where = f"entity {item.plan.entity_id} of tenant {item.plan.tenant_id}"
        code, message = fault_reason(exc, "apply", where)
        column = exc.column if isinstance(exc, MappingError) else None
        faults = self._stages.reject(item, code, message, stage="apply", column=column)
        sor_read = not item.records or item.plan.action is Action.REFETCH
        outcomes: dict[str, RereadOutcome] = {}
        if sor_read and item.plan.entity_id is not None:
            outcomes[item.plan.entity_id] = "rejected"
            self._stages.metrics.rereads.labels("rejected").inc()
        return Applied((), outcomes, faults)

    def _apply_refreshing(self, segment: Sequence[Work]) -> Applied:
        """`_apply`, retried once with fresh index targets after a store error: a version
        retired and dropped by a reindex may still be among the cached targets for a moment
        (every write is idempotent, so the retry repeats nothing harmful). A second failure,
        or a store outage, is the caller's (fatal, or retried with backoff)."""
        try:
            return self._apply(segment)
        except StoreUnavailableError:
            raise
        except StoreError as exc:
            log.warning("store error (%s): re-reading the index targets, retrying once", exc)
            self._stages.targets.invalidate()
            return self._apply(segment)

    def _apply(self, work: Sequence[Work]) -> Applied:
        """resolve -> decide -> write one segment; then the re-reads a truncate asked for."""
        resolved = resolve(work, self._stages)
        decision = decide(resolved.upserts, self._stages)
        written = write(decision, self._stages)
        faults = resolved.faults + decision.faults
        outcomes = _outcomes(work, resolved, decision, written, faults)
        for item in work:
            if item.plan.action is Action.REFETCH and item.plan.entity_id in outcomes:
                self._stages.metrics.rereads.labels(outcomes[item.plan.entity_id]).inc()
        if resolved.rereads:
            # rows indexed from SoR reads: their records are the truncate's, already counted
            faults += Faults(rejections=self._apply(resolved.rereads).faults.rejections)
        return Applied(resolved.applied + written.applied, outcomes, faults)


def _outcomes(
    work: Sequence[Work],
    resolved: Resolved,
    decision: Decision,
    written: Written,
    faults: Faults,
) -> dict[str, RereadOutcome]:
    """What became of each entity the SoR was read for (snapshot rows and re-reads), by id:
    changed beats rejected beats raced beats unchanged (an entity has several write targets)."""
    rank: dict[RereadOutcome, int] = {"unchanged": 0, "raced": 1, "rejected": 2, "changed": 3}
    sor_read = {
        item.plan.entity_id
        for item in work
        if item.plan.entity_id is not None
        and (not item.records or item.plan.action is Action.REFETCH)
    }
    out: dict[str, RereadOutcome] = {}

    def note(entity_id: str | None, outcome: RereadOutcome) -> None:
        if (
            entity_id in sor_read
            and entity_id is not None
            and (entity_id not in out or rank[outcome] > rank[out[entity_id]])
        ):
            out[entity_id] = outcome

    for item, left in decision.left:
        note(item.plan.entity_id, "raced" if left == "raced" else "unchanged")
    for item, outcome in resolved.gone:
        note(item.plan.entity_id, outcome)
    for rejection in faults.rejections:
        note(rejection.entity_id, "rejected")
    lettered = {id(letter.record) for letter in faults.letters}
    for item in work:
        if any(id(rec) in lettered for rec in item.records):
            note(item.plan.entity_id, "rejected")
    for item in written.applied:
        note(item.plan.entity_id, "changed")
    return out
