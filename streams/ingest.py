"""The batch handler of the ingest worker: decode -> plan -> reduce -> normalize/chunk -> embed
-> write (wait) -> delete obsolete chunks. The consumer loop commits only after this returns.

Write order per entity (docs/decisions/chunk-ids-and-versions.md): the new chunks are upserted
first (wait), then the
entity's chunks that are no longer part of it are deleted by id. A crash in between leaves extra
chunks that the next delivery removes; never a gap. Re-delivery rewrites the same point ids
(uuid5 of tenant, chunk id, index version), so replaying a batch is harmless.
"""

from __future__ import annotations

import json
import logging
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any, Literal, Protocol

from ragcore.embedders.base import Embedder, Vectors
from ragcore.errors import (
    ChunkingError,
    ConfigError,
    DecodeError,
    InvalidTenantError,
    MappingError,
    RecordTooLargeError,
    SorTableError,
    StoreError,
    StoreUnavailableError,
)
from ragcore.mapping import table_of_entity
from ragcore.plan import Action, Plan
from ragcore.store.base import (
    CHUNK_ID,
    ENTITY_ID,
    ENTITY_TYPE,
    SOURCE_HASH,
    SOURCE_TABLE,
    ChunkRef,
    PointRecord,
    SparseVector,
    StoreFilter,
    VectorStore,
)
from ragcore.store.ids import validate_tenant
from ragcore.store.points import (
    CHUNK_COUNT,
    VERSION_LSN,
    VERSION_UPDATED_AT,
    chunk_point,
    indexed_version,
    rfc3339,
    row_fields,
)
from schemas.entities import Chunk, Entity, EntityVersion
from schemas.events import ChangeEvent, RawRecord, RecordPosition
from streams.consumer import DeadLetter
from streams.metrics import IngestMetrics

log = logging.getLogger(__name__)


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

    def known_tenants(self) -> Sequence[str]:
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

    def encode_document(self, text: str) -> SparseVector:
        """Sparse vector of a chunk's text."""
        ...


class RowSource(Protocol):
    """Re-reads rows from the system of record (refetch after a TOAST placeholder)."""

    def fetch_entity(self, plan: Plan) -> Entity | None:
        """The entity as the SoR has it now; None when the row no longer exists. Raises
        `MappingError` when the entity's table is not mapped and `SorTableError` when it cannot
        be read (nothing can be said about the row then), `SorUnavailableError` when the SoR
        is unreachable."""
        ...


Decoder = Callable[[RawRecord], ChangeEvent]
Planner = Callable[[ChangeEvent], Plan]


@dataclass(frozen=True, slots=True)
class Rejection:
    """An entity read from the SoR that cannot be indexed (e.g. its content cannot be chunked)."""

    entity_id: str
    code: str
    reason: str


@dataclass(slots=True)
class _Work:
    """The surviving plan of one entity in a batch, and the records it covers."""

    plan: Plan
    records: list[RawRecord] = field(default_factory=list)


#: What a write target needs for an entity (`IngestHandler._need`).
_Need = Literal["stale", "unchanged", "refresh", "chunks"]


@dataclass(slots=True)
class _TargetWrite:
    """New chunks of one entity for one write target (replacing `refs`, its indexed chunks)."""

    item: _Work
    entity: Entity
    target: TargetIndex
    refs: dict[str, ChunkRef]
    chunks: list[Chunk]


@dataclass(slots=True)
class _Decided:
    """What a batch of upserts needs: new chunks, payload refreshes, and the texts to embed
    per model (in the order of `writes`)."""

    writes: list[_TargetWrite] = field(default_factory=list)
    refresh: list[tuple[Entity, TargetIndex, dict[str, ChunkRef]]] = field(default_factory=list)
    refreshed: list[_Work] = field(default_factory=list)
    texts: dict[str, list[str]] = field(default_factory=dict)


def is_provably_older(incoming: EntityVersion, indexed: EntityVersion) -> bool:
    """True only when the indexed row is known to be newer than the incoming one.

    Versions compare by `updated_at` when both have it, then by LSN when both have it; at a
    full tie a snapshot row loses to a streamed one. Missing information never proves an event
    older (it is applied: at worst a stale hit that Retrieve's SoR check excludes).
    """
    a, b = incoming.updated_at_us, indexed.updated_at_us
    if a is not None and b is not None and a != b:
        return a < b
    if incoming.lsn is not None and indexed.lsn is not None and incoming.lsn != indexed.lsn:
        return incoming.lsn < indexed.lsn
    return incoming.snapshot and not indexed.snapshot


def _rfc3339(moment: datetime | None) -> str | None:
    return None if moment is None else rfc3339(moment)


class IngestHandler:
    """Implements `streams.consumer.BatchHandler` over the store and embedder ports."""

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
    ) -> None:
        """`embedder`/`preparer` are the primary model; `other_models` are further models
        (embedder and its preparer) that targets may name, e.g. the next model during a
        blue-green model change."""
        self._decode = decode
        self._plan = plan
        self._preparer = preparer
        self._embedder = embedder
        self._models: dict[str, tuple[Embedder, EntityPreparer]] = {
            e.spec.model_version: (e, p) for e, p in [(embedder, preparer), *other_models]
        }
        self._sparse = sparse
        self._store = store
        self._targets = targets
        self._metrics = metrics
        self._rows = rows
        self._keyword_fields = tuple(keyword_fields)
        #: table name -> the metadata key holding the event date (else `updated_at` is used)
        self._event_date_fields = dict(event_date_fields or {})
        self._reindex_topic = reindex_topic
        self._clock = clock
        self._rejections: list[Rejection] = []
        # the consumer loop and the scheduled reconciliation share one handler: writes of
        # one handler never interleave
        self._lock = threading.Lock()

    # --- BatchHandler -----------------------------------------------------------------------

    def handle(self, records: Sequence[RawRecord]) -> Sequence[DeadLetter]:
        """Apply a batch; return the records that belong in the DLQ."""
        letters: list[DeadLetter] = []
        applied: list[_Work] = []
        for segment in self._plan_batch(records, letters):
            with self._lock:
                applied += self._apply_refreshing(segment, letters)
        now = self._clock()
        for item in applied:
            if item.plan.source_ts_ms is not None:
                self._metrics.freshness.observe(max(0.0, now - item.plan.source_ts_ms / 1000))
        return letters

    def _apply_refreshing(self, segment: list[_Work], letters: list[DeadLetter]) -> list[_Work]:
        """`_apply`, retried once with fresh index targets after a store error: a version
        retired and dropped by a reindex may still be among the cached targets for a moment
        (every write is idempotent, so the retry repeats nothing harmful). A second failure,
        or a store outage, is the caller's (fatal, or retried with backoff)."""
        attempt: list[DeadLetter] = []
        try:
            done = self._apply(segment, attempt)
        except StoreUnavailableError:
            raise
        except StoreError as exc:
            log.warning("store error (%s): re-reading the index targets, retrying once", exc)
            self._targets.invalidate()
            attempt = []
            done = self._apply(segment, attempt)
        letters.extend(attempt)
        return done

    def reread(self, tenant_id: str, entity_ids: Sequence[str], reason: str) -> list[Rejection]:
        """Re-read entities from the SoR and apply what it says now (upsert, or delete when the
        row is gone): the write path of reindex requests and of `ragstream reconcile --repair`.
        Returns the entities that could not be indexed. Raises when no SoR is configured."""
        if self._rows is None:
            raise ConfigError("re-reading entities needs a system of record (RAGSTREAM_SOR__KIND)")
        work = []
        for n, entity_id in enumerate(dict.fromkeys(entity_ids)):
            where = RecordPosition(f"reread:{reason}", 0, n)
            plan = Plan(Action.REFETCH, reason, where, tenant_id=tenant_id, entity_id=entity_id)
            work.append(_Work(plan, []))
        with self._lock:
            self._rejections = []
            self._apply(work, [])
            return self._rejections

    def upsert_entities(self, entities: Sequence[Entity], reason: str) -> list[Rejection]:
        """Write entities read from the SoR (a reindex snapshot) through the normal write path:
        version ordering, unchanged-content skips, one embedding call per model. Returns the
        entities that could not be indexed (logged too: a snapshot has no record to DLQ)."""
        work = []
        for n, entity in enumerate(entities):
            where = RecordPosition(f"snapshot:{reason}", 0, n)
            plan = Plan(
                Action.UPSERT,
                reason,
                where,
                tenant_id=entity.tenant_id,
                entity_id=entity.entity_id,
                version=entity.version,
                entity=entity,
            )
            work.append(_Work(plan, []))
        with self._lock:
            self._rejections = []
            self._apply(work, [])
            return self._rejections

    def for_targets(
        self, targets: IndexTargets, embedder: Embedder, preparer: EntityPreparer
    ) -> IngestHandler:
        """A handler with this one's decoding, planning, SoR reader and metrics that writes to
        `targets` with `embedder`: the writer of a reindex job (only the version it builds)."""
        return IngestHandler(
            decode=self._decode,
            plan=self._plan,
            preparer=preparer,
            embedder=embedder,
            sparse=self._sparse,
            store=self._store,
            targets=targets,
            metrics=self._metrics,
            rows=self._rows,
            keyword_fields=self._keyword_fields,
            event_date_fields=self._event_date_fields,
            clock=self._clock,
        )

    # --- decode, plan, reduce ---------------------------------------------------------------

    def _plan_batch(
        self, records: Sequence[RawRecord], letters: list[DeadLetter]
    ) -> list[list[_Work]]:
        """The batch's work per entity, in segments: a TRUNCATE is a segment of its own, so
        what came before it is applied before it, and what came after, after."""
        segments: list[list[_Work]] = []
        by_entity: dict[tuple[str, bool], _Work] = {}
        decode_s = plan_s = 0.0
        for rec in records:
            if self._reindex_topic is not None and rec.topic == self._reindex_topic:
                request = self._reindex_plan(rec, letters)
                if request is not None:
                    self._reduce(by_entity, request, rec)
                continue
            t0 = time.perf_counter()
            try:
                event = self._decode(rec)
            except DecodeError as exc:
                letters.append(DeadLetter(rec, exc.code, str(exc), "decode"))
                self._count(rec.topic, "?", "dlq")
                continue
            finally:
                decode_s += time.perf_counter() - t0
            t1 = time.perf_counter()
            try:
                plan = self._plan(event)
            except (MappingError, RecordTooLargeError) as exc:
                letters.append(DeadLetter(rec, exc.code, str(exc), "plan"))
                self._count(rec.topic, event.op, "dlq")
                continue
            finally:
                plan_s += time.perf_counter() - t1
            if plan.action is Action.SKIP:
                self._count(rec.topic, event.op or event.kind.value, "skipped")
                continue
            if plan.action is Action.DLQ:
                letters.append(
                    DeadLetter(rec, f"POLICY_{plan.reason.upper()}", plan.detail, "plan")
                )
                self._count(rec.topic, event.op or event.kind.value, "dlq")
                continue
            if plan.action is Action.TRUNCATE:
                segments += [list(by_entity.values()), [_Work(plan, [rec])]]
                by_entity = {}
                continue
            self._reduce(by_entity, plan, rec)
        segments.append(list(by_entity.values()))
        self._metrics.stage_seconds.labels("decode").observe(decode_s)
        self._metrics.stage_seconds.labels("plan").observe(plan_s)
        return [s for s in segments if s]

    def _reindex_plan(self, rec: RawRecord, letters: list[DeadLetter]) -> Plan | None:
        """A reindex request from Retrieve -> re-read the entity from the SoR (a refetch)."""
        try:
            doc = json.loads(rec.value or b"")
            tenant, entity_id = doc["tenant"], doc["entity_id"]
            if not isinstance(tenant, str) or not isinstance(entity_id, str) or not entity_id:
                raise TypeError("tenant and entity_id must be strings")
            validate_tenant(tenant)
        except (ValueError, KeyError, TypeError, InvalidTenantError) as exc:
            letters.append(DeadLetter(rec, "BAD_REINDEX_REQUEST", str(exc), "decode"))
            self._count(rec.topic, "reindex", "dlq")
            return None
        return Plan(
            Action.REFETCH,
            "reindex_request",
            rec.position,
            tenant_id=tenant,
            entity_id=entity_id,
            detail=f"Retrieve found it {doc.get('reason', 'stale')}: re-read from the SoR",
        )

    @staticmethod
    def _reduce(by_entity: dict[tuple[str, bool], _Work], plan: Plan, rec: RawRecord) -> None:
        """Keep, per entity, the work that decides its state after this batch.

        Kafka keys changes by primary key, so one entity's events share a partition and arrive
        in commit order: the last full state (upsert or delete) supersedes everything before it.
        A refetch (TOAST placeholder) carries no content, so it does not supersede an earlier
        upsert of the batch: that upsert is applied, and the refetch after it.
        """
        assert plan.entity_id is not None  # every non-skip plan names its entity
        refetch = plan.action is Action.REFETCH
        superseded: list[RawRecord] = []
        for key in (
            [(plan.entity_id, True)]
            if refetch
            else [(plan.entity_id, False), (plan.entity_id, True)]
        ):
            previous = by_entity.pop(key, None)
            if previous is not None:
                superseded.extend(previous.records)
        by_entity[(plan.entity_id, refetch)] = _Work(plan, [*superseded, rec])

    # --- apply ------------------------------------------------------------------------------

    def _apply(self, work: Sequence[_Work], letters: list[DeadLetter]) -> list[_Work]:
        # by entity id: a refetched row (the SoR's current state) replaces an earlier upsert
        upserts: dict[str, tuple[_Work, Entity]] = {}
        applied: list[_Work] = []
        for item in work:
            plan = item.plan
            if plan.action is Action.TRUNCATE:
                self._truncate(item)
                applied.append(item)
                continue
            if plan.action is Action.DELETE:
                self._delete(plan)
                applied.append(item)
                self._count_all(item, "deleted")
            elif plan.action is Action.REFETCH:
                known, entity = self._refetch(item, letters)
                if known:
                    # the SoR's current row (or its absence) overrides an earlier upsert
                    replaced = upserts.pop(plan.entity_id or "", None)
                    if replaced is not None:
                        applied.append(replaced[0])
                if entity is not None:
                    upserts[entity.entity_id] = (item, entity)
            else:
                assert plan.entity is not None
                upserts[plan.entity.entity_id] = (item, plan.entity)
            if plan.previous_tenant_id is not None and plan.entity_id is not None:
                self._delete_in_tenant(plan.previous_tenant_id, plan.entity_id)
        applied.extend(self._upsert(list(upserts.values()), letters))
        return applied

    def _refetch(self, item: _Work, letters: list[DeadLetter]) -> tuple[bool, Entity | None]:
        """(whether the SoR could say, the entity it holds now). A row that is gone is deleted
        here; an entity whose table the SoR reader cannot read is left as it is."""
        plan = item.plan
        if self._rows is None:
            self._reject(item, letters, "CONTENT_UNAVAILABLE", plan.detail)
            return False, None
        try:
            entity = self._rows.fetch_entity(plan)
        except (MappingError, SorTableError) as exc:
            # nothing is known about the row: never delete what cannot be seen
            self._reject(item, letters, exc.code, f"cannot re-read {plan.entity_id}: {exc}")
            return False, None
        if entity is None:
            # The row is gone from the SoR: its chunks must go too.
            self._delete(plan)
            self._count_all(item, "deleted")
            return True, None
        self._count_all(item, "refetched")
        return True, entity

    def _reject(self, item: _Work, letters: list[DeadLetter], code: str, reason: str) -> None:
        """DLQ the item's records, or report it when it has none (a re-read, a snapshot)."""
        for rec in item.records:
            letters.append(DeadLetter(rec, code, reason, "plan"))
        if not item.records:
            log.warning("cannot index %s: %s %s", item.plan.entity_id, code, reason)
            self._rejections.append(Rejection(item.plan.entity_id or "?", code, reason))
        self._count_all(item, "dlq")

    def _truncate(self, item: _Work) -> None:
        """A TRUNCATE of a mapped table: remove, in every tenant and write target, the table's
        entities indexed from changes before it (their LSN is lower). Entities indexed without
        an LSN (from SoR reads) are re-read from the SoR when there is one, else removed; those
        indexed from later changes stay (a truncate is key-less: it may overtake or trail row
        events of other partitions)."""
        plan = item.plan
        assert plan.table is not None
        cutoff = plan.version.lsn if plan.version is not None else None
        started = time.perf_counter()
        removed = 0
        for tenant in self._targets.known_tenants():
            reread: set[str] = set()
            for target in self._targets.write_targets(tenant):
                flt = StoreFilter(tenant_id=tenant, keywords={SOURCE_TABLE: (plan.table,)})
                doomed: list[str] = []
                for point in self._store.scroll(
                    target.collection, flt, fields=(ENTITY_ID, VERSION_LSN)
                ):
                    lsn = point.payload.get(VERSION_LSN)
                    if cutoff is not None and isinstance(lsn, int):
                        if lsn < cutoff:
                            doomed.append(point.point_id)
                    elif self._rows is not None:
                        reread.add(str(point.payload[ENTITY_ID]))
                    else:
                        doomed.append(point.point_id)
                if doomed:
                    self._store.delete_points(target.collection, doomed, wait=True)
                    self._metrics.chunks_deleted.inc(len(doomed))
                    removed += len(doomed)
            if reread:
                self._apply(
                    [
                        _Work(
                            Plan(
                                Action.REFETCH,
                                "truncate",
                                plan.position,
                                tenant_id=tenant,
                                entity_id=entity_id,
                            )
                        )
                        for entity_id in sorted(reread)
                    ],
                    [],
                )
        self._metrics.stage_seconds.labels("write").observe(time.perf_counter() - started)
        log.info("truncate of %s: %d chunks removed", plan.table, removed)
        self._count_all(item, "truncated")

    def _delete(self, plan: Plan) -> None:
        assert plan.entity_id is not None
        tenants = [plan.tenant_id] if plan.tenant_id is not None else self._targets.known_tenants()
        for tenant in tenants:
            self._delete_in_tenant(tenant, plan.entity_id)

    def _delete_in_tenant(self, tenant_id: str, entity_id: str) -> None:
        started = time.perf_counter()
        for target in self._targets.write_targets(tenant_id):
            refs = self._store.entity_chunks(target.collection, tenant_id, entity_id)
            if refs:
                self._store.delete_points(target.collection, [r.point_id for r in refs.values()])
                self._metrics.chunks_deleted.inc(len(refs))
        self._metrics.stage_seconds.labels("write").observe(time.perf_counter() - started)

    def _upsert(
        self, upserts: Sequence[tuple[_Work, Entity]], letters: list[DeadLetter]
    ) -> list[_Work]:
        """Chunk, embed (one call per model for the whole batch) and write every entity to
        upsert: decide per write target, embed, refresh payloads, write points, drop the
        entity's obsolete chunks."""
        decided = self._decide(upserts, letters)
        if not decided.writes and not decided.refresh:
            return []
        vectors = {
            model: self._embed(self._models[model][0], texts)
            for model, texts in decided.texts.items()
            if texts
        }
        started = time.perf_counter()
        indexed_at = _rfc3339(datetime.now(UTC))
        self._refresh(decided.refresh, indexed_at)
        points, obsolete = self._points(decided.writes, vectors, indexed_at)
        self._write(points, obsolete)
        self._metrics.stage_seconds.labels("write").observe(time.perf_counter() - started)
        applied = list(
            {id(w): w for w in [*(w.item for w in decided.writes), *decided.refreshed]}.values()
        )
        for item in applied:
            self._count_all(item, "upserted")
        return applied

    def _decide(
        self, upserts: Sequence[tuple[_Work, Entity]], letters: list[DeadLetter]
    ) -> _Decided:
        """What each entity needs in each of its write targets: nothing (an older event, or the
        same content and metadata), a payload refresh (same content), or new chunks."""
        decided = _Decided()
        manifests = self._manifests([entity for _, entity in upserts])
        needs = [self._needs(entity, manifests) for _, entity in upserts]
        self._prime(upserts, needs)
        for (item, entity), per_target in zip(upserts, needs, strict=True):
            chunked: dict[str, list[Chunk] | None] = {}  # per model (tokenizer and budget)
            outcome: str | None = None
            for target, refs, need in per_target:
                if need == "stale":
                    outcome = "stale"
                elif need == "unchanged":
                    outcome = outcome or "unchanged"
                elif need == "refresh":
                    decided.refresh.append((entity, target, refs))
                    decided.refreshed.append(item)
                    outcome = "write"
                else:
                    embedder, preparer = self._model(target)
                    model = embedder.spec.model_version
                    if model not in chunked:
                        chunked[model] = self._chunk(item, entity, letters, preparer)
                    chunks = chunked[model]
                    if chunks is None:
                        break  # dead-lettered by `_chunk`
                    decided.writes.append(_TargetWrite(item, entity, target, refs, chunks))
                    decided.texts.setdefault(model, []).extend(c.text for c in chunks)
                    outcome = "write"
            if outcome == "stale":
                self._metrics.skipped_older.inc()
            if outcome in {"stale", "unchanged"}:
                self._count_all(item, outcome)
        return decided

    def _needs(
        self, entity: Entity, manifests: Mapping[tuple[str, str], dict[str, ChunkRef]]
    ) -> list[tuple[TargetIndex, dict[str, ChunkRef], _Need]]:
        """Each write target of the entity, its indexed chunks and what it needs."""
        out: list[tuple[TargetIndex, dict[str, ChunkRef], _Need]] = []
        for target in self._targets.write_targets(entity.tenant_id):
            refs = manifests.get((target.collection, entity.entity_id), {})
            out.append((target, refs, self._need(entity, refs)))
        return out

    def _prime(
        self,
        upserts: Sequence[tuple[_Work, Entity]],
        needs: Sequence[Sequence[tuple[TargetIndex, dict[str, ChunkRef], _Need]]],
    ) -> None:
        """Tokenize, per model, every entity that needs new chunks in one batch."""
        by_model: dict[str, tuple[EntityPreparer, list[Entity]]] = {}
        for (_, entity), per_target in zip(upserts, needs, strict=True):
            for target, _, need in per_target:
                if need == "chunks":
                    embedder, preparer = self._model(target)
                    by_model.setdefault(embedder.spec.model_version, (preparer, []))[1].append(
                        entity
                    )
        started = time.perf_counter()
        for preparer, entities in by_model.values():
            preparer.prime(entities)
        self._metrics.stage_seconds.labels("chunk").observe(time.perf_counter() - started)

    def _need(self, entity: Entity, refs: Mapping[str, ChunkRef]) -> _Need:
        """What a write target needs for `entity`, given the chunks it indexes (`refs`)."""
        current = indexed_version(refs)
        if current is not None and is_provably_older(entity.version, current):
            return "stale"
        if refs and self._unchanged(refs, entity):
            return "unchanged"
        if refs and self._same_content(refs, entity):
            return "refresh"
        return "chunks"

    def _points(
        self,
        writes: Sequence[_TargetWrite],
        vectors: Mapping[str, Vectors],
        indexed_at: str | None,
    ) -> tuple[dict[str, list[PointRecord]], dict[str, list[str]]]:
        """The points to upsert and the obsolete point ids to delete, per collection; the
        vectors of each model are consumed in the order their texts were queued."""
        offsets = dict.fromkeys(vectors, 0)
        points: dict[str, list[PointRecord]] = {}
        obsolete: dict[str, list[str]] = {}
        for write in writes:
            model = self._model(write.target)[0].spec.model_version
            for chunk in write.chunks:
                point = self._point(
                    write.entity,
                    chunk=chunk,
                    target=write.target,
                    vector=vectors[model][offsets[model]],
                    indexed_at=indexed_at,
                    chunk_count=len(write.chunks),
                )
                points.setdefault(write.target.collection, []).append(point)
                offsets[model] += 1
            keep = {c.chunk_id for c in write.chunks}
            gone = [ref.point_id for cid, ref in write.refs.items() if cid not in keep]
            obsolete.setdefault(write.target.collection, []).extend(gone)
        return points, obsolete

    def _write(
        self, points: Mapping[str, list[PointRecord]], obsolete: Mapping[str, list[str]]
    ) -> None:
        """New chunks first (acknowledged), then the chunks no longer part of their entity:
        a crash in between leaves extra chunks for the next event or reconcile, never a gap."""
        for collection, batch in points.items():
            for start in range(0, len(batch), 256):
                self._store.upsert(collection, batch[start : start + 256], wait=True)
            self._metrics.chunks_upserted.inc(len(batch))
        for collection, ids in obsolete.items():
            if ids:
                self._store.delete_points(collection, ids, wait=True)
                self._metrics.chunks_deleted.inc(len(ids))

    def _manifests(self, entities: Sequence[Entity]) -> dict[tuple[str, str], dict[str, ChunkRef]]:
        """The chunk manifests of many entities: one filtered scroll per collection and tenant
        (and per 256 ids) instead of one query per entity."""
        by_target: dict[tuple[str, str], list[str]] = {}
        for entity in entities:
            for target in self._targets.write_targets(entity.tenant_id):
                by_target.setdefault((target.collection, entity.tenant_id), []).append(
                    entity.entity_id
                )
        out: dict[tuple[str, str], dict[str, ChunkRef]] = {}
        for (collection, tenant), ids in by_target.items():
            for start in range(0, len(ids), 256):
                flt = StoreFilter(tenant_id=tenant, entity_ids=tuple(ids[start : start + 256]))
                for point in self._store.scroll(collection, flt):
                    p = point.payload
                    ref = ChunkRef(point.point_id, p[CHUNK_ID], p.get(SOURCE_HASH), p)
                    out.setdefault((collection, p[ENTITY_ID]), {})[ref.chunk_id] = ref
        return out

    @staticmethod
    def _same_content(refs: Mapping[str, ChunkRef], entity: Entity) -> bool:
        """A complete chunk set made from the same content: only the payload may differ."""
        expected = {r.payload.get(CHUNK_COUNT) for r in refs.values()}
        return expected == {len(refs)} and all(
            ref.source_hash == entity.content_hash for ref in refs.values()
        )

    def _unchanged(self, refs: Mapping[str, ChunkRef], entity: Entity) -> bool:
        """Same content hash on every chunk and a complete chunk set: nothing to re-embed.

        Metadata-only changes (title, type, keywords) still rewrite payloads via a re-upsert,
        so only a row whose indexed payload already matches is skipped outright.
        """
        expected = {r.payload.get(CHUNK_COUNT) for r in refs.values()}
        if expected != {len(refs)}:
            return False  # a crash left extra or missing chunks: rewrite
        for ref in refs.values():
            p = ref.payload
            if (
                ref.source_hash != entity.content_hash
                or p.get("title") != entity.title
                or p.get(ENTITY_TYPE) != entity.entity_type
                or p.get(VERSION_UPDATED_AT) != entity.version.updated_at_us
                or any(p.get(k) != entity.metadata.get(k) for k in self._keyword_fields)
            ):
                return False
        return True

    def _model(self, target: TargetIndex) -> tuple[Embedder, EntityPreparer]:
        """The embedder and preparer of the model a target's vectors come from."""
        if target.model_version is None:
            return self._embedder, self._preparer
        found = self._models.get(target.model_version)
        if found is None:
            raise ConfigError(
                f"{target.collection} is built with {target.model_version}, which this worker "
                f"does not hold (it holds {', '.join(self._models)})"
            )
        return found

    def _chunk(
        self, item: _Work, entity: Entity, letters: list[DeadLetter], preparer: EntityPreparer
    ) -> list[Chunk] | None:
        started = time.perf_counter()
        try:
            chunks = preparer.chunks(entity)
        except (ChunkingError, MappingError) as exc:
            for rec in item.records:
                letters.append(DeadLetter(rec, exc.code, str(exc), "chunk"))
            if not item.records:  # read from the SoR (snapshot, re-read): no record to DLQ
                log.warning("cannot index %s: %s %s", entity.entity_id, exc.code, exc)
                self._rejections.append(Rejection(entity.entity_id, exc.code, str(exc)))
            self._count_all(item, "dlq")
            return None
        finally:
            self._metrics.stage_seconds.labels("chunk").observe(time.perf_counter() - started)
        if not chunks and not item.records:
            # nothing to index (no text after normalization); reported, not an error
            self._rejections.append(
                Rejection(entity.entity_id, "EMPTY_CONTENT", "no text after normalization")
            )
        return chunks

    def _embed(self, embedder: Embedder, texts: list[str]) -> Vectors:
        started = time.perf_counter()
        vectors = embedder.embed_documents(texts)
        self._metrics.embedding_calls.inc()
        self._metrics.stage_seconds.labels("embed").observe(time.perf_counter() - started)
        return vectors

    def _entity_fields(
        self, entity: Entity, target: TargetIndex, indexed_at: str | None
    ) -> dict[str, Any]:
        """The payload fields that come from the entity row and may change in place (identity
        fields — tenant, entity, chunk — are set only when a point is written)."""
        fields = row_fields(
            content_hash=entity.content_hash,
            entity_type=entity.entity_type,
            title=entity.title,
            content_format=entity.content_format.value,
            created_at=_rfc3339(entity.created_at),
            updated_at=_rfc3339(entity.updated_at),
            spec=self._model(target)[0].spec,
            index_version=target.version,
            indexed_at=indexed_at,
            event_date=self._event_date(entity),
            version=entity.version,
        )
        for key in self._keyword_fields:
            value = entity.metadata.get(key)
            fields[key] = value if isinstance(value, str | int | bool) else None
        return fields

    def _point(
        self,
        entity: Entity,
        *,
        chunk: Chunk,
        target: TargetIndex,
        vector: Any,
        indexed_at: str | None,
        chunk_count: int,
    ) -> PointRecord:
        return chunk_point(
            self._entity_fields(entity, target, indexed_at),
            tenant_id=entity.tenant_id,
            entity_id=entity.entity_id,
            source_table=table_of_entity(entity.entity_id) or None,
            chunk_id=chunk.chunk_id,
            chunk_index=chunk.chunk_index,
            chunk_count=chunk_count,
            locator=chunk.locator.model_dump(mode="json"),
            text=chunk.text,
            index_version=target.version,
            dense=vector,
            sparse=self._sparse.encode_document(chunk.text),
        )

    def _refresh(
        self,
        refresh: Sequence[tuple[Entity, TargetIndex, dict[str, ChunkRef]]],
        indexed_at: str | None,
    ) -> None:
        """Entities whose content is unchanged (same hash, complete chunk set) but whose row
        changed (version, title, type, keywords): their payloads are updated in place, so no
        chunking, embedding, sparse encoding or vector rewrite is repeated."""
        for entity, target, refs in refresh:
            fields = self._entity_fields(entity, target, indexed_at)
            values = {k: v for k, v in fields.items() if v is not None}
            unset = [k for k, v in fields.items() if v is None]
            ids = [ref.point_id for ref in refs.values()]
            self._store.update_payload(target.collection, ids, values, unset=unset)

    def _event_date(self, entity: Entity) -> str | None:
        field = self._event_date_fields.get(table_of_entity(entity.entity_id))
        if field is None:
            return _rfc3339(entity.updated_at)
        value = entity.metadata.get(field)
        return value if isinstance(value, str) else None

    # --- counting ---------------------------------------------------------------------------

    def _count(self, topic: str, op: object, outcome: str) -> None:
        self._metrics.events.labels(topic, str(op) if op is not None else "?", outcome).inc()

    def _count_all(self, item: _Work, outcome: str) -> None:
        for rec in item.records:
            self._count(rec.topic, item.plan.op, outcome)
