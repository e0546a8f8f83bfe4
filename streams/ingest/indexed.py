"""What the index holds for entities: their chunk manifests in each write target, and a
fingerprint of that state, the compare-and-set of SoR re-reads (a re-read writes only where the
indexed state is still the one observed before the SoR was read)."""

from __future__ import annotations

import hashlib
import json
from collections.abc import Iterable, Mapping

from ragcore.store.base import CHUNK_ID, ENTITY_ID, SOURCE_HASH, ChunkRef, StoreFilter
from streams.ingest.context import Stages
from streams.ingest.work import Fingerprint

#: The indexed chunks of an entity in one collection, by chunk id.
Refs = Mapping[str, ChunkRef]
#: (collection, entity id)
Key = tuple[str, str]


def manifests(
    entities: Iterable[tuple[str, str]], stages: Stages, *, create: bool = True
) -> dict[Key, dict[str, ChunkRef]]:
    """The chunk manifests of many (tenant, entity id): one filtered scroll per collection and
    tenant (and per 256 ids) instead of one query per entity. `create` False: a tenant without
    an index has none created (nothing is indexed there)."""
    by_target: dict[tuple[str, str], list[str]] = {}
    for tenant, entity_id in entities:
        targets = stages.targets.write_targets if create else stages.targets.existing_targets
        for target in targets(tenant):
            by_target.setdefault((target.collection, tenant), []).append(entity_id)
    out: dict[Key, dict[str, ChunkRef]] = {}
    for (collection, tenant), ids in by_target.items():
        for start in range(0, len(ids), 256):
            flt = StoreFilter(tenant_id=tenant, entity_ids=tuple(ids[start : start + 256]))
            for point in stages.store.scroll(collection, flt):
                p = point.payload
                ref = ChunkRef(point.point_id, p[CHUNK_ID], p.get(SOURCE_HASH), p)
                out.setdefault((collection, p[ENTITY_ID]), {})[ref.chunk_id] = ref
    return out


def fingerprint(refs: Refs) -> Fingerprint:
    """The indexed state of an entity in one collection: every point and its whole payload
    (any write, a payload refresh included, changes it: `indexed_at` is in the payload)."""
    return frozenset(
        (
            ref.point_id,
            hashlib.blake2b(
                json.dumps(ref.payload, sort_keys=True, default=str).encode(), digest_size=16
            ).hexdigest(),
        )
        for ref in refs.values()
    )


def observe(entities: Iterable[tuple[str, str]], stages: Stages) -> dict[Key, Fingerprint]:
    """The fingerprint of every (tenant, entity id) in each of its tenant's write targets
    (an entity with nothing indexed in a target gets the empty fingerprint there)."""
    pairs = list(dict.fromkeys(entities))
    found = manifests(pairs, stages, create=False)
    out: dict[Key, Fingerprint] = {}
    for tenant, entity_id in pairs:
        for target in stages.targets.existing_targets(tenant):
            key = (target.collection, entity_id)
            out[key] = fingerprint(found.get(key, {}))
    return out
