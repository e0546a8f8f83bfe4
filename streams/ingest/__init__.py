"""The ingest path, one module per step a record takes:

- `plan`: decode and plan a batch of records into work per entity (dead letters for the rest);
- `resolve`: write deletes and truncates, re-read refetched rows from the SoR;
- `decide`: what each entity needs in each write target (nothing, a payload refresh, chunks);
- `write`: embed and write (new chunks first, then the obsolete ones deleted).

Each step returns a frozen result carrying its work, dead letters and rejections (`work`);
`handler.IngestHandler` runs them in order. The ports are in `ports`; reconcile and reindex
write through `SorWriter.apply_rows`.
"""

from streams.ingest.handler import BatchApplied, BatchObserver, IngestHandler
from streams.ingest.ports import (
    Decoder,
    EntityPreparer,
    IndexTargets,
    Planner,
    RowSource,
    SorWriter,
    SparseEncoder,
    TargetIndex,
)
from streams.ingest.work import Rejection, RereadOutcome, SorBatch, SorWritten

__all__ = [
    "BatchApplied",
    "BatchObserver",
    "Decoder",
    "EntityPreparer",
    "IndexTargets",
    "IngestHandler",
    "Planner",
    "Rejection",
    "RereadOutcome",
    "RowSource",
    "SorBatch",
    "SorWriter",
    "SorWritten",
    "SparseEncoder",
    "TargetIndex",
]
