"""Stage 4, embed and write: the texts of a decision are embedded (one call per model), payloads
of unchanged content are refreshed in place, new chunks are upserted (wait) and then the
entity's obsolete chunks deleted. Also the deletes of entities (a delete event, a row gone).

Write order per entity (docs/decisions/chunk-ids-and-versions.md): the new chunks are upserted
first (wait), then the entity's chunks that are no longer part of it are deleted by id. A crash
in between leaves extra chunks that the next delivery removes; never a gap. Re-delivery
rewrites the same point ids (uuid5 of tenant, chunk id, index version), so replaying a batch is
harmless.
"""

from __future__ import annotations

import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

from ragcore.embedders.base import Embedder, Vectors
from ragcore.mapping import table_of_entity
from ragcore.store.base import PointRecord
from ragcore.store.points import chunk_point, rfc3339, row_fields
from schemas.entities import Chunk, Entity
from streams.ingest.context import Stages
from streams.ingest.decide import Decision, Refresh, TargetWrite
from streams.ingest.ports import TargetIndex
from streams.ingest.work import Work


@dataclass(frozen=True, slots=True)
class Written:
    """The work a decision's writes applied (each item once)."""

    applied: tuple[Work, ...]


def write(decision: Decision, stages: Stages) -> Written:
    """Embed, refresh payloads, write points, drop the entities' obsolete chunks."""
    if decision.empty:
        return Written(())
    vectors = {
        model: _embed(stages.models[model][0], texts, stages)
        for model, texts in decision.texts.items()
        if texts
    }
    started = time.perf_counter()
    indexed_at = _rfc3339(datetime.now(UTC))
    _refresh(decision.refresh, indexed_at, stages)
    points, obsolete = _points(decision.writes, vectors, indexed_at, stages)
    _write(points, obsolete, stages)
    stages.metrics.stage_seconds.labels("write").observe(time.perf_counter() - started)
    items = [*(w.item for w in decision.writes), *(r.item for r in decision.refresh)]
    applied = tuple({id(item): item for item in items}.values())
    for item in applied:
        stages.count_all(item, "upserted")
    return Written(applied)


def delete_entity(tenant_id: str | None, entity_id: str, stages: Stages) -> None:
    """Remove an entity's chunks from every write target of its tenant (of every known tenant
    when the tenant is not known)."""
    tenants = [tenant_id] if tenant_id is not None else stages.targets.known_tenants()
    for tenant in tenants:
        delete_in_tenant(tenant, entity_id, stages)


def delete_in_tenant(tenant_id: str, entity_id: str, stages: Stages) -> None:
    """Remove an entity's chunks from every write target of one tenant (a tenant without an
    index has nothing to remove: none is created for it)."""
    started = time.perf_counter()
    for target in stages.targets.existing_targets(tenant_id):
        refs = stages.store.entity_chunks(target.collection, tenant_id, entity_id)
        if refs:
            stages.store.delete_points(target.collection, [r.point_id for r in refs.values()])
            stages.metrics.chunks_deleted.inc(len(refs))
    stages.metrics.stage_seconds.labels("write").observe(time.perf_counter() - started)


def _rfc3339(moment: datetime | None) -> str | None:
    return None if moment is None else rfc3339(moment)


def _embed(embedder: Embedder, texts: Sequence[str], stages: Stages) -> Vectors:
    started = time.perf_counter()
    vectors = embedder.embed_documents(texts)
    stages.metrics.embedding_calls.inc()
    stages.metrics.stage_seconds.labels("embed").observe(time.perf_counter() - started)
    return vectors


def _points(
    writes: Sequence[TargetWrite],
    vectors: Mapping[str, Vectors],
    indexed_at: str | None,
    stages: Stages,
) -> tuple[dict[str, list[PointRecord]], dict[str, list[str]]]:
    """The points to upsert and the obsolete point ids to delete, per collection; the vectors
    of each model are consumed in the order their texts were queued."""
    offsets = dict.fromkeys(vectors, 0)
    points: dict[str, list[PointRecord]] = {}
    obsolete: dict[str, list[str]] = {}
    for w in writes:
        model = stages.model(w.target)[0].spec.model_version
        for chunk in w.chunks:
            point = _point(
                w.entity,
                chunk=chunk,
                target=w.target,
                vector=vectors[model][offsets[model]],
                indexed_at=indexed_at,
                chunk_count=len(w.chunks),
                stages=stages,
            )
            points.setdefault(w.target.collection, []).append(point)
            offsets[model] += 1
        keep = {c.chunk_id for c in w.chunks}
        gone = [ref.point_id for cid, ref in w.refs.items() if cid not in keep]
        obsolete.setdefault(w.target.collection, []).extend(gone)
    return points, obsolete


def _write(
    points: Mapping[str, list[PointRecord]], obsolete: Mapping[str, list[str]], stages: Stages
) -> None:
    """New chunks first (acknowledged), then the chunks no longer part of their entity:
    a crash in between leaves extra chunks for the next event or reconcile, never a gap."""
    for collection, batch in points.items():
        for start in range(0, len(batch), 256):
            stages.store.upsert(collection, batch[start : start + 256], wait=True)
        stages.metrics.chunks_upserted.inc(len(batch))
    for collection, ids in obsolete.items():
        if ids:
            stages.store.delete_points(collection, ids, wait=True)
            stages.metrics.chunks_deleted.inc(len(ids))


def _entity_fields(
    entity: Entity, target: TargetIndex, indexed_at: str | None, stages: Stages
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
        spec=stages.model(target)[0].spec,
        index_version=target.version,
        indexed_at=indexed_at,
        event_date=_event_date(entity, stages),
        version=entity.version,
    )
    for key in stages.keyword_fields:
        value = entity.metadata.get(key)
        fields[key] = value if isinstance(value, str | int | bool) else None
    return fields


def _point(
    entity: Entity,
    *,
    chunk: Chunk,
    target: TargetIndex,
    vector: Any,
    indexed_at: str | None,
    chunk_count: int,
    stages: Stages,
) -> PointRecord:
    sparse, term_counts = stages.sparse.encode_chunk(chunk.text)
    return chunk_point(
        _entity_fields(entity, target, indexed_at, stages),
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
        sparse=sparse,
        term_counts=term_counts,
    )


def _refresh(refresh: Sequence[Refresh], indexed_at: str | None, stages: Stages) -> None:
    """Entities whose content is unchanged (same hash, complete chunk set) but whose row
    changed (version, title, type, keywords): their payloads are updated in place, so no
    chunking, embedding, sparse encoding or vector rewrite is repeated."""
    for r in refresh:
        fields = _entity_fields(r.entity, r.target, indexed_at, stages)
        values = {k: v for k, v in fields.items() if v is not None}
        unset = [k for k, v in fields.items() if v is None]
        ids = [ref.point_id for ref in r.refs.values()]
        stages.store.update_payload(r.target.collection, ids, values, unset=unset)


def _event_date(entity: Entity, stages: Stages) -> str | None:
    field = stages.event_date_fields.get(table_of_entity(entity.entity_id))
    if field is None:
        return _rfc3339(entity.updated_at)
    value = entity.metadata.get(field)
    return value if isinstance(value, str) else None
