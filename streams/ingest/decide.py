"""Stage 3, decide: what each entity to upsert needs in each of its write targets, from the
chunks those targets index now: nothing (an older row, or the same content and metadata), a
payload refresh (same content), or new chunks (chunked here, embedded by the write stage)."""

from __future__ import annotations

import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Literal

from ragcore.errors import ChunkingError, MappingError
from ragcore.store.base import CHUNK_ID, ENTITY_ID, ENTITY_TYPE, SOURCE_HASH, ChunkRef, StoreFilter
from ragcore.store.points import CHUNK_COUNT, VERSION_UPDATED_AT, indexed_version
from schemas.entities import Chunk, Entity
from streams.ingest.context import Stages
from streams.ingest.order import is_provably_older
from streams.ingest.ports import EntityPreparer, TargetIndex
from streams.ingest.work import NO_FAULTS, Faults, Rejection, Work

#: What a write target needs for an entity (`need`).
Need = Literal["stale", "unchanged", "refresh", "chunks"]
#: The indexed chunks of an entity in one collection, by chunk id.
Refs = Mapping[str, ChunkRef]


@dataclass(frozen=True, slots=True)
class TargetWrite:
    """New chunks of one entity for one write target (replacing `refs`, its indexed chunks)."""

    item: Work
    entity: Entity
    target: TargetIndex
    refs: Refs
    chunks: tuple[Chunk, ...]


@dataclass(frozen=True, slots=True)
class Refresh:
    """An entity whose content one target already indexes: only its payloads change."""

    item: Work
    entity: Entity
    target: TargetIndex
    refs: Refs


@dataclass(frozen=True, slots=True)
class Decision:
    """What a batch of upserts needs: new chunks, payload refreshes, the texts to embed per
    model (in the order of `writes`), and the entities that cannot be chunked."""

    writes: tuple[TargetWrite, ...]
    refresh: tuple[Refresh, ...]
    texts: Mapping[str, tuple[str, ...]]
    faults: Faults

    @property
    def empty(self) -> bool:
        """Nothing to write."""
        return not self.writes and not self.refresh


def decide(upserts: Sequence[tuple[Work, Entity]], stages: Stages) -> Decision:
    """What each entity needs in each of its write targets."""
    writes: list[TargetWrite] = []
    refresh: list[Refresh] = []
    texts: dict[str, list[str]] = {}
    faults = NO_FAULTS
    manifests = _manifests([entity for _, entity in upserts], stages)
    needs = [_needs(entity, manifests, stages) for _, entity in upserts]
    _prime(upserts, needs, stages)
    for (item, entity), per_target in zip(upserts, needs, strict=True):
        chunked: dict[str, tuple[Chunk, ...] | Faults] = {}  # per model (tokenizer and budget)
        outcome: str | None = None
        for target, refs, need in per_target:
            if need == "stale":
                outcome = "stale"
            elif need == "unchanged":
                outcome = outcome or "unchanged"
            elif need == "refresh":
                refresh.append(Refresh(item, entity, target, refs))
                outcome = "write"
            else:
                embedder, preparer = stages.model(target)
                model = embedder.spec.model_version
                if model not in chunked:
                    chunked[model] = _chunk(item, entity, preparer, stages)
                chunks = chunked[model]
                if isinstance(chunks, Faults):
                    faults += chunks
                    break  # dead-lettered or rejected
                writes.append(TargetWrite(item, entity, target, refs, chunks))
                texts.setdefault(model, []).extend(c.text for c in chunks)
                outcome = "write"
        for result in chunked.values():
            if isinstance(result, tuple) and not result and not item.records:
                # nothing to index (no text after normalization); reported, not an error
                faults += Faults(
                    rejections=(
                        Rejection(entity.entity_id, "EMPTY_CONTENT", "no text after normalization"),
                    )
                )
        if outcome == "stale":
            stages.metrics.skipped_older.inc()
        if outcome in {"stale", "unchanged"}:
            stages.count_all(item, outcome)
    return Decision(tuple(writes), tuple(refresh), {m: tuple(t) for m, t in texts.items()}, faults)


def need(entity: Entity, refs: Refs, keyword_fields: Sequence[str]) -> Need:
    """What a write target needs for `entity`, given the chunks it indexes (`refs`)."""
    current = indexed_version(refs)
    if current is not None and is_provably_older(entity.version, current):
        return "stale"
    if refs and _unchanged(refs, entity, keyword_fields):
        return "unchanged"
    if refs and _same_content(refs, entity):
        return "refresh"
    return "chunks"


def _needs(
    entity: Entity, manifests: Mapping[tuple[str, str], Refs], stages: Stages
) -> list[tuple[TargetIndex, Refs, Need]]:
    """Each write target of the entity, its indexed chunks and what it needs."""
    out: list[tuple[TargetIndex, Refs, Need]] = []
    for target in stages.targets.write_targets(entity.tenant_id):
        refs = manifests.get((target.collection, entity.entity_id), {})
        out.append((target, refs, need(entity, refs, stages.keyword_fields)))
    return out


def _prime(
    upserts: Sequence[tuple[Work, Entity]],
    needs: Sequence[Sequence[tuple[TargetIndex, Refs, Need]]],
    stages: Stages,
) -> None:
    """Tokenize, per model, every entity that needs new chunks in one batch."""
    by_model: dict[str, tuple[EntityPreparer, list[Entity]]] = {}
    for (_, entity), per_target in zip(upserts, needs, strict=True):
        for target, _, what in per_target:
            if what == "chunks":
                embedder, preparer = stages.model(target)
                by_model.setdefault(embedder.spec.model_version, (preparer, []))[1].append(entity)
    started = time.perf_counter()
    for preparer, entities in by_model.values():
        preparer.prime(entities)
    stages.metrics.stage_seconds.labels("chunk").observe(time.perf_counter() - started)


def _manifests(entities: Sequence[Entity], stages: Stages) -> dict[tuple[str, str], Refs]:
    """The chunk manifests of many entities: one filtered scroll per collection and tenant
    (and per 256 ids) instead of one query per entity."""
    by_target: dict[tuple[str, str], list[str]] = {}
    for entity in entities:
        for target in stages.targets.write_targets(entity.tenant_id):
            by_target.setdefault((target.collection, entity.tenant_id), []).append(entity.entity_id)
    out: dict[tuple[str, str], dict[str, ChunkRef]] = {}
    for (collection, tenant), ids in by_target.items():
        for start in range(0, len(ids), 256):
            flt = StoreFilter(tenant_id=tenant, entity_ids=tuple(ids[start : start + 256]))
            for point in stages.store.scroll(collection, flt):
                p = point.payload
                ref = ChunkRef(point.point_id, p[CHUNK_ID], p.get(SOURCE_HASH), p)
                out.setdefault((collection, p[ENTITY_ID]), {})[ref.chunk_id] = ref
    return dict(out)


def _same_content(refs: Refs, entity: Entity) -> bool:
    """A complete chunk set made from the same content: only the payload may differ."""
    expected = {r.payload.get(CHUNK_COUNT) for r in refs.values()}
    return expected == {len(refs)} and all(
        ref.source_hash == entity.content_hash for ref in refs.values()
    )


def _unchanged(refs: Refs, entity: Entity, keyword_fields: Sequence[str]) -> bool:
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
            or any(p.get(k) != entity.metadata.get(k) for k in keyword_fields)
        ):
            return False
    return True


def _chunk(
    item: Work, entity: Entity, preparer: EntityPreparer, stages: Stages
) -> tuple[Chunk, ...] | Faults:
    """The entity's chunks for one model, or the faults of an entity that cannot be chunked."""
    started = time.perf_counter()
    try:
        return tuple(preparer.chunks(entity))
    except (ChunkingError, MappingError) as exc:
        return stages.reject(item, exc.code, str(exc), stage="chunk")
    finally:
        stages.metrics.stage_seconds.labels("chunk").observe(time.perf_counter() - started)
