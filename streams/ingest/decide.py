"""Stage 3, decide: what each entity to upsert needs in each of its write targets, from the
chunks those targets index now: nothing (an older row, or the same content and metadata), a
payload refresh (same content), or new chunks (chunked here, embedded by the write stage)."""

from __future__ import annotations

import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Literal

from ragcore.errors import ChunkingError, MappingError
from ragcore.store.base import ENTITY_TYPE
from ragcore.store.points import CHUNK_COUNT, VERSION_LSN, VERSION_UPDATED_AT, indexed_version
from schemas.entities import Chunk, Entity
from streams.ingest.context import Stages
from streams.ingest.indexed import Key, Refs, fingerprint, manifests
from streams.ingest.ports import EntityPreparer, TargetIndex
from streams.ingest.work import NO_FAULTS, Faults, Fingerprint, Rejection, Upsert, Work

#: What a write target needs for an entity (`need`): nothing ("stale": the indexed row comes
#: later in commit order; "raced": a re-read whose observed state changed meanwhile;
#: "unchanged"), a payload refresh, or new chunks.
Need = Literal["stale", "raced", "unchanged", "refresh", "chunks"]


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
    model (in the order of `writes`), the entities left as they are ("stale", "raced" or
    "unchanged" in every target) and the entities that cannot be chunked."""

    writes: tuple[TargetWrite, ...]
    refresh: tuple[Refresh, ...]
    texts: Mapping[str, tuple[str, ...]]
    left: tuple[tuple[Work, str], ...]
    faults: Faults

    @property
    def empty(self) -> bool:
        """Nothing to write."""
        return not self.writes and not self.refresh


def decide(upserts: Sequence[Upsert], stages: Stages) -> Decision:
    """What each entity needs in each of its write targets."""
    writes: list[TargetWrite] = []
    refresh: list[Refresh] = []
    texts: dict[str, list[str]] = {}
    left: list[tuple[Work, str]] = []
    faults = NO_FAULTS
    found = manifests([(u.entity.tenant_id, u.entity.entity_id) for u in upserts], stages)
    needs = [_needs(u, found, stages) for u in upserts]
    _prime(upserts, needs, stages)
    for upsert, per_target in zip(upserts, needs, strict=True):
        item, entity = upsert.item, upsert.entity
        chunked: dict[str, tuple[Chunk, ...] | Faults] = {}  # per model (tokenizer and budget)
        outcome: str | None = None
        for target, refs, need in per_target:
            if need in {"stale", "raced"}:
                outcome = need
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
        if outcome in {"stale", "raced", "unchanged"}:
            stages.count_all(item, outcome)
            left.append((item, outcome or "unchanged"))
    texts_by_model = {m: tuple(t) for m, t in texts.items()}
    return Decision(tuple(writes), tuple(refresh), texts_by_model, tuple(left), faults)


def need(
    entity: Entity,
    refs: Refs,
    keyword_fields: Sequence[str],
    observed: Fingerprint | None = None,
) -> Need:
    """What a write target needs for `entity`, given the chunks it indexes (`refs`).

    A row from a change event or a snapshot (`observed` None) is ordered against the indexed
    one by the ordering rule (`EntityVersion.is_older_than`); a row re-read from the SoR is the
    truth at the time of the read and replaces the indexed state if that is still the one
    observed before the read (a compare-and-set: a change that landed meanwhile is kept)."""
    if observed is None:
        current = indexed_version(refs)
        if current is not None and entity.version.is_older_than(current):
            return "stale"
    elif fingerprint(refs) != observed:
        return "raced"
    if refs and _unchanged(refs, entity, keyword_fields):
        return "unchanged"
    if refs and _same_content(refs, entity):
        return "refresh"
    return "chunks"


def _needs(
    upsert: Upsert, found: Mapping[Key, Refs], stages: Stages
) -> list[tuple[TargetIndex, Refs, Need]]:
    """Each write target of the entity, its indexed chunks and what it needs."""
    entity = upsert.entity
    out: list[tuple[TargetIndex, Refs, Need]] = []
    for target in stages.targets.write_targets(entity.tenant_id):
        refs = found.get((target.collection, entity.entity_id), {})
        observed = None
        if upsert.observed is not None:
            # a target that appeared after the observation had nothing indexed then
            observed = upsert.observed.get(target.collection, frozenset())
        out.append((target, refs, need(entity, refs, stages.keyword_fields, observed)))
    return out


def _prime(
    upserts: Sequence[Upsert],
    needs: Sequence[Sequence[tuple[TargetIndex, Refs, Need]]],
    stages: Stages,
) -> None:
    """Tokenize, per model, every entity that needs new chunks in one batch."""
    by_model: dict[str, tuple[EntityPreparer, list[Entity]]] = {}
    for upsert, per_target in zip(upserts, needs, strict=True):
        entity = upsert.entity
        for target, _, what in per_target:
            if what == "chunks":
                embedder, preparer = stages.model(target)
                by_model.setdefault(embedder.spec.model_version, (preparer, []))[1].append(entity)
    started = time.perf_counter()
    for preparer, entities in by_model.values():
        preparer.prime(entities)
    stages.metrics.stage_seconds.labels("chunk").observe(time.perf_counter() - started)


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
            # a new commit of the same content still records its position: the ordering rule
            # and the re-reads' compare-and-set see that the stream moved on
            or (entity.version.lsn is not None and p.get(VERSION_LSN) != entity.version.lsn)
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
        column = exc.column if isinstance(exc, MappingError) else None
        return stages.reject(item, exc.code, str(exc), stage="chunk", column=column)
    finally:
        stages.metrics.stage_seconds.labels("chunk").observe(time.perf_counter() - started)
