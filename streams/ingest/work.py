"""The values that travel between the ingest stages: an entity's work, what the SoR says to
write, and what could not be indexed. All frozen: a stage returns them, none edits them."""

from __future__ import annotations

from dataclasses import dataclass

from ragcore.plan import Plan
from schemas.entities import Entity
from schemas.events import RawRecord
from streams.consumer import DeadLetter


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


@dataclass(frozen=True, slots=True)
class SorBatch:
    """Rows of one tenant to write as the system of record has them: `entities` already read
    (a reindex snapshot) and the ids in `reread` to read now (a repair, a catch-up)."""

    tenant_id: str
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
