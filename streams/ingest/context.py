"""What every ingest stage works with: the ports, the models a write target may name, the
payload options and the metrics (one frozen value, built once per handler)."""

from __future__ import annotations

import logging
from collections.abc import Mapping
from dataclasses import dataclass

from ragcore.embedders.base import Embedder
from ragcore.errors import ConfigError
from ragcore.store.base import VectorStore
from streams.consumer import DeadLetter
from streams.ingest.ports import (
    EntityPreparer,
    IndexTargets,
    RowSource,
    SparseEncoder,
    TargetIndex,
)
from streams.ingest.work import Faults, Rejection, Work
from streams.metrics import IngestMetrics

log = logging.getLogger("streams.ingest")


@dataclass(frozen=True)
class Stages:
    """The collaborators of the ingest stages."""

    preparer: EntityPreparer
    embedder: Embedder
    #: model version -> (embedder, preparer) of every model a target may name
    models: Mapping[str, tuple[Embedder, EntityPreparer]]
    sparse: SparseEncoder
    store: VectorStore
    targets: IndexTargets
    metrics: IngestMetrics
    rows: RowSource | None
    keyword_fields: tuple[str, ...]
    #: table name -> the metadata key holding the event date (else `updated_at` is used)
    event_date_fields: Mapping[str, str]

    def model(self, target: TargetIndex) -> tuple[Embedder, EntityPreparer]:
        """The embedder and preparer of the model a target's vectors come from."""
        if target.model_version is None:
            return self.embedder, self.preparer
        found = self.models.get(target.model_version)
        if found is None:
            raise ConfigError(
                f"{target.collection} is built with {target.model_version}, which this worker "
                f"does not hold (it holds {', '.join(self.models)})"
            )
        return found

    def count(self, topic: str, op: object, outcome: str) -> None:
        """Count one record's outcome."""
        self.metrics.events.labels(topic, str(op) if op is not None else "?", outcome).inc()

    def count_all(self, item: Work, outcome: str) -> None:
        """Count the outcome of every record an item covers."""
        for rec in item.records:
            self.count(rec.topic, item.plan.op, outcome)

    def reject(
        self, item: Work, code: str, reason: str, stage: str = "plan", column: str | None = None
    ) -> Faults:
        """DLQ the item's records (naming its table and entity, each record's own tenant, and
        `column` when one is at fault), or report it when it has none (a re-read, a
        snapshot)."""
        plan = item.plan
        letters = tuple(
            DeadLetter(
                rec,
                code,
                reason,
                stage,
                table=plan.table,
                column=column,
                entity_id=plan.entity_id,
                tenant_id=tenant,
            )
            for rec, tenant in zip(item.records, item.record_tenants(), strict=True)
        )
        rejections: tuple[Rejection, ...] = ()
        if not item.records:
            log.warning("cannot index %s: %s %s", item.plan.entity_id, code, reason)
            rejections = (Rejection(item.plan.entity_id or "?", code, reason),)
        self.count_all(item, "dlq")
        return Faults(letters, rejections)
