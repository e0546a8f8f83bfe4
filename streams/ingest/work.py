"""The values that travel between the ingest stages: an entity's work, what the SoR says to
write, and what could not be indexed. All frozen: a stage returns them, none edits them."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Literal

from ragcore.plan import Plan
from ragcore.store.ids import TenantId
from schemas.entities import Entity
from schemas.events import RawRecord
from streams.consumer import DeadLetter

#: What a re-read of the SoR did to an entity's index: wrote or deleted it ("changed"), found
#: it already as the SoR holds it ("unchanged"), or left it because a change landed in the index
#: between the observation and the write ("raced"), or could not index it ("rejected").
RereadOutcome = Literal["changed", "unchanged", "raced", "rejected"]


@dataclass(frozen=True, slots=True)
class Rejection:
    """An entity read from the SoR that cannot be indexed (e.g. its content cannot be chunked)."""

    entity_id: str
    code: str
    reason: str


@dataclass(frozen=True, slots=True)
class Work:
    """The surviving plan of one entity in a batch, and the records it covers (none when it
    comes from the SoR: a snapshot, a re-read)."""

    plan: Plan
    records: tuple[RawRecord, ...] = ()
    #: the tenant each of `records` named, aligned with them (empty: the plan's, for all):
    #: records of one key merged into one item may name different tenants, and a record's
    #: dead letter names its own
    tenants: tuple[TenantId | None, ...] = ()

    def record_tenants(self) -> tuple[TenantId | None, ...]:
        """The tenant each of `records` named."""
        if len(self.tenants) == len(self.records):
            return self.tenants
        return (self.plan.tenant_id,) * len(self.records)


#: The indexed state of an entity in one collection (`streams.ingest.indexed.fingerprint`;
#: empty: nothing indexed).
Fingerprint = frozenset[tuple[str, str]]


@dataclass(frozen=True, slots=True)
class Upsert:
    """A row to write: from a change event or a snapshot (`observed` None: the ordering rule
    decides), or re-read from the SoR (`observed`: the indexed state, by collection, it may
    replace)."""

    item: Work
    entity: Entity
    observed: Mapping[str, Fingerprint] | None = None


@dataclass(frozen=True, slots=True)
class SorBatch:
    """Rows of one tenant to write as the system of record has them: `entities` already read
    (a reindex snapshot) and the ids in `reread` to read now (a repair, a catch-up)."""

    tenant_id: TenantId
    reason: str
    entities: tuple[Entity, ...] = ()
    reread: tuple[str, ...] = ()


@dataclass(frozen=True, slots=True)
class Faults:
    """What a stage could not index: dead letters for records, rejections for SoR reads."""

    letters: tuple[DeadLetter, ...] = ()
    rejections: tuple[Rejection, ...] = ()

    def __add__(self, other: Faults) -> Faults:
        return Faults(self.letters + other.letters, self.rejections + other.rejections)


NO_FAULTS = Faults()


@dataclass(frozen=True, slots=True)
class SorWritten:
    """What writing a `SorBatch` did, by entity id (each id in one of the lists): changed,
    unchanged (already as the SoR holds it, or an older snapshot row), raced (a change landed
    in the index meanwhile: left to it) and the entities that could not be indexed."""

    changed: tuple[str, ...] = ()
    unchanged: tuple[str, ...] = ()
    raced: tuple[str, ...] = ()
    rejections: tuple[Rejection, ...] = ()
