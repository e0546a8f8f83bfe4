"""The version rule of the ingest write path: when an incoming row must not overwrite what is
indexed (docs/decisions/chunk-ids-and-versions.md)."""

from __future__ import annotations

from schemas.entities import EntityVersion


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
