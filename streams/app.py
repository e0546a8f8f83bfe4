"""The ingest worker process: `python -m streams` / `ragstream ingest`.

Startup checks fail fast with a clear message: embedder usable, store reachable, every
tenant's active index built with this embedder, the table mappings workable against a
PostgreSQL SoR's catalog (`ragcore.sor.mapcheck`), Kafka reachable and topics present.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable, Collection, Sequence
from dataclasses import dataclass, field

from prometheus_client import CollectorRegistry, start_http_server

from ragcore.embedders.base import Embedder
from ragcore.embedding_models import EmbeddingModels
from ragcore.errors import (
    ConfigError,
    RagstreamError,
    SchemaDriftError,
    SorTableError,
    SorUnavailableError,
)
from ragcore.plan import Plan, plan_event, record_identity
from ragcore.prepare import Preparer
from ragcore.sor.base import SlotSource, SystemOfRecord
from ragcore.sor.mapcheck import refuse_unworkable
from ragcore.sor.pgcatalog import CatalogSource
from ragcore.sparse import Bm25Encoder
from ragcore.store.base import VectorStore
from ragcore.store.registry import IndexRegistry
from ragcore.tracing import Tracing
from ragcore.wiring import Closable, build_core, new_tenant_placement, payload_schema
from schemas.events import ChangeEvent, RawRecord
from streams.adapters import RegistryTargets, SorRows
from streams.consumer import ConsumerLoop, OffsetGap, install_signal_handlers
from streams.decode import decode_record
from streams.ingest import IngestHandler
from streams.liveness import ObservedHandler, SlotWatch, SourceLiveness, heartbeat_pattern
from streams.metrics import IngestMetrics
from streams.reconcile import ReconcileMetrics, ReconcileReport, reconcile
from streams.settings import IngestSettings

log = logging.getLogger(__name__)


class LostTables:
    """The mapped tables whose changes an offset gap may have lost, until the worker
    reconciles them (thread-safe: the consumer loop adds, the liveness thread takes).

    A gap in a table's topic names that table; a gap in a connector's heartbeat topic loses no
    change; a gap in any other topic (none is subscribed: `consumed_topics` refuses them) would
    name every table, so nothing is left unreconciled by a topic this map does not know."""

    def __init__(
        self,
        table_of_topic: Callable[[str], str | None],
        heartbeat_prefix: str,
        tables: Collection[str],
    ) -> None:
        """`table_of_topic`: the label of the table whose changes a topic carries, or None;
        `tables`: every mapped table's label (when all of them lost changes, `take` says every
        table: a full reconciliation, which also exports its drift gauges)."""
        self._table_of_topic = table_of_topic
        self._every = frozenset(tables)
        self._heartbeat_prefix = f"{heartbeat_prefix}."
        self._lock = threading.Lock()
        self._tables: set[str] = set()
        self._all = False

    def add(self, gaps: Sequence[OffsetGap]) -> None:
        """Note the tables the offset gaps of the consumer loop may have lost changes of."""
        with self._lock:
            for gap in gaps:
                if gap.topic.startswith(self._heartbeat_prefix):
                    continue
                table = self._table_of_topic(gap.topic)
                if table is None:
                    self._all = True
                else:
                    self._tables.add(table)

    def restore(self, tables: frozenset[str] | None) -> None:
        """Put back what `take` returned (the reconciliation failed: retried later)."""
        with self._lock:
            if tables is None:
                self._all = True
            else:
                self._tables |= tables

    def pending(self) -> bool:
        """Some table waits to be reconciled."""
        with self._lock:
            return self._all or bool(self._tables)

    def take(self) -> frozenset[str] | None:
        """The tables to reconcile (None: every table), and forget them; an empty set when
        nothing waits."""
        with self._lock:
            taken = None if self._all or self._tables >= self._every else frozenset(self._tables)
            self._all = False
            self._tables = set()
            return taken


@dataclass
class IngestWorker:
    """A wired worker: the loop and the resources it owns."""

    settings: IngestSettings
    loop: ConsumerLoop
    handler: IngestHandler
    store: VectorStore
    registry: IndexRegistry
    embedder: Embedder
    models: EmbeddingModels
    targets: RegistryTargets
    metrics: IngestMetrics
    reconcile_metrics: ReconcileMetrics
    #: the BM25 encoder the worker writes with (reindex's parity search uses the same one)
    sparse: Bm25Encoder
    #: the tables of partitions whose committed offset or fetch position was out of range
    #: (changes expired unread), noted by the loop and reconciled by `watch_sources`
    offset_gaps: LostTables
    sor: SystemOfRecord | None = None
    liveness: SourceLiveness | None = None
    slots: SlotWatch | None = None
    stop: threading.Event = field(default_factory=threading.Event)
    #: what `build_worker` created (injected parts belong to their owner and stay open)
    owned: tuple[Closable, ...] = ()

    def check(self) -> None:
        """Fail fast: embedders usable, every tenant's active index built with one of them,
        the SoR reachable and (PostgreSQL) every table mapping workable against its catalog
        (`ragcore.sor.mapcheck`: a ConfigError names each mapping that cannot work)."""
        for embedder in self.models:
            embedder.check()
        for tenant in self.registry.list_tenants():
            if self.registry.active_version(tenant) is not None:
                self.targets.write_targets(tenant)  # raises ManifestMismatchError
        if self.sor is not None:
            self.sor.check()
            if isinstance(self.sor, CatalogSource):
                tables = self.settings.plan.tables
                refuse_unworkable(tables, self.sor.database_info([m.table for m in tables]))

    def run(self) -> None:
        """Check, connect, consume until stopped (reconciling on schedule), then release."""
        scheduled: threading.Thread | None = None
        watch: threading.Thread | None = None
        try:
            self.check()
            self.loop.start()
            if self.liveness is not None:
                watch = threading.Thread(target=self.watch_sources, name="liveness", daemon=True)
                watch.start()
            if self.sor is not None and self.settings.reconcile.interval_s > 0:
                scheduled = threading.Thread(
                    target=self.reconcile_forever, name="reconcile", daemon=True
                )
                scheduled.start()
            self.loop.run(self.stop)
        finally:
            self.stop.set()
            for thread in (scheduled, watch):
                if thread is not None:
                    thread.join()
            self.close()

    def watch_sources(self) -> None:
        """Until stopped, every `liveness.check_interval_s`: log connectors that fell silent
        (`SourceLiveness`), export the SoR's replication slots (`SlotWatch`, PostgreSQL) and
        close a WAL gap (a slot dropped or that lost WAL) or an offset gap (changes that
        expired in Kafka unread) by reconciling every tenant (after an offset gap, only in the
        tables whose topics had the gap)."""
        while not self.stop.wait(self.settings.liveness.check_interval_s):
            if self.liveness is not None:
                self.liveness.check()
            if self.offset_gaps.pending():
                self.close_offset_gaps()
            if self.slots is None:
                continue
            try:
                gaps = self.slots.check()
                if gaps:
                    log.warning("closing the WAL gap of %s: reconciling every tenant", gaps)
                    self.reconcile_once(repair=True)
            except (SorUnavailableError, SorTableError) as exc:
                log.warning("cannot read the SoR's replication slots: %s", exc)
            except RagstreamError:
                log.exception(
                    "reconciling after a WAL gap failed: run `ragstream reconcile --tenant T "
                    "--repair` for every tenant"
                )

    def close_offset_gaps(self) -> None:
        """Reconcile every tenant in the tables whose topics had an offset gap (`OffsetGap`:
        changes expired in Kafka unread), with repair whatever `reconcile.repair` says
        (changes are known to be lost); without a SoR the gap stays open and the error says
        what to do."""
        tables = self.offset_gaps.take()
        if tables is not None and not tables:
            return
        named = "every table" if tables is None else ", ".join(sorted(tables))
        if self.sor is None:
            log.error(
                "changes of %s were lost to Kafka retention and no SoR is configured to "
                "reconcile from: re-snapshot the affected tables (a new Debezium snapshot)",
                named,
            )
            return
        log.warning("closing the offset gap: reconciling every tenant in %s", named)
        try:
            self.reconcile_once(repair=True, tables=tables)
        except RagstreamError:
            self.offset_gaps.restore(tables)  # retried at the next check
            log.exception(
                "reconciling %s after an offset gap failed (retried at the next check); or "
                "run `ragstream reconcile --tenant T --repair` for every tenant",
                named,
            )

    def reconcile_once(
        self, *, repair: bool | None = None, tables: frozenset[str] | None = None
    ) -> list[ReconcileReport]:
        """Reconcile every tenant with an active index (repairing per `repair`, default the
        settings' `reconcile.repair`), in every table or only in `tables` (mapped table
        labels). A run over every table exports the drift totals as `ragstream_reconcile_*`
        gauges; a run over some tables only logs its reports (its totals would read as the
        whole index's)."""
        if self.sor is None:
            raise ConfigError("reconciliation reads the system of record: set RAGSTREAM_SOR__KIND")
        reports = []
        for tenant in self.registry.list_tenants():
            if self.stop.is_set():
                break
            if self.registry.active_version(tenant) is None:
                continue
            for table in [None] if tables is None else sorted(tables):
                report = reconcile(
                    tenant,
                    sor=self.sor,
                    store=self.store,
                    registry=self.registry,
                    handler=self.handler,
                    repair=self.settings.reconcile.repair if repair is None else repair,
                    table=table,
                    calibration_stale_ratio=self.settings.reconcile.calibration_stale_ratio,
                )
                log.info(
                    "reconcile %s%s: %d missing, %d extra, %d stale of %d SoR entities "
                    "(index %.2f s, SoR %.2f s, %d repaired, %d unchanged by the re-read, "
                    "%d raced, %d rejected)%s",
                    tenant,
                    "" if table is None else f" in {table}",
                    len(report.missing),
                    len(report.extra),
                    len(report.stale),
                    report.sor_entities,
                    report.index_seconds,
                    report.sor_seconds,
                    report.repaired,
                    report.repair_unchanged,
                    report.repair_raced,
                    report.repair_rejected,
                    _calibration_note(report),
                )
                reports.append(report)
        if tables is None:
            self.reconcile_metrics.record_all(reports)
        return reports

    def reconcile_forever(self) -> None:
        """`reconcile_once` every `reconcile.interval_s` until stopped, on one member of the
        consumer group only (`ConsumerLoop.is_designated`; every member when that cannot be
        told). When the SoR is unreachable the run is retried with backoff (counted as
        backpressure on `dependency="sor"`) instead of waiting a whole interval; any other
        failure is logged with its error and retried at the next interval (the last-run gauge
        shows the gap)."""
        delay = self.settings.reconcile.interval_s
        while not self.stop.wait(delay):
            delay = self.settings.reconcile.interval_s
            if self.loop.is_designated() is False:
                # replicas share the work: the holder of the first topic's partition 0 runs it
                log.debug("scheduled reconciliation left to the designated group member")
                continue
            backoff = self.settings.consumer.backoff_initial_s
            while not self.stop.is_set():
                try:
                    self.reconcile_once()
                except SorUnavailableError as exc:
                    self.metrics.backpressure.labels("sor").inc()
                    log.warning(
                        "scheduled reconciliation paused, retry in %.1f s: %s", backoff, exc
                    )
                    if self.stop.wait(backoff):
                        return
                    backoff = min(backoff * 2, self.settings.consumer.backoff_max_s)
                    continue
                except RagstreamError:
                    log.exception(
                        "scheduled reconciliation failed; next try in %.0f s",
                        self.settings.reconcile.interval_s,
                    )
                break

    def close(self) -> None:
        """Release what the worker created."""
        for resource in self.owned:
            resource.close()


def _calibration_note(report: ReconcileReport) -> str:
    """The log line's calibration part: only a calibration that needs refitting is named."""
    state = report.calibration
    if state is None or state.state == "fitted":
        return ""
    if state.state == "stale":
        return (
            f"; calibration stale (fitted on {state.calibrated_chunks} chunks, {state.chunks} "
            "now): run `ragstream calibrate --stale`"
        )
    if state.state == "prior":
        return "; never calibrated (scored by the prior): run `ragstream calibrate --stale`"
    return f"; calibration unreadable ({state.error}): run `ragstream calibrate --stale`"


def consumed_topics(topics: Sequence[str], settings: IngestSettings) -> tuple[str, ...]:
    """The topics to subscribe: the configured ones, each of which must carry a mapped table's
    changes (or heartbeats), or by default every mapped table's topic and (`liveness.heartbeats`)
    the connectors' heartbeat topics."""
    catalog = settings.plan.catalog
    if not topics:
        heartbeats = [
            heartbeat_pattern(settings.decode.heartbeat_topic_prefix, settings.plan.topic_prefix)
        ]
        return (*catalog.topics(), *(heartbeats if settings.liveness.heartbeats else []))
    unmapped = [
        t
        for t in topics
        if not t.startswith("^")
        and catalog.for_topic(t) is None
        and not t.startswith(settings.decode.heartbeat_topic_prefix)
    ]
    if unmapped:
        raise ConfigError(
            f"topics {unmapped} map to no SoR table: add a table mapping whose topic is each "
            f"of them (RAGSTREAM_PLAN__TABLES; mapped topics: {catalog.topics()}) or remove "
            "them from RAGSTREAM_CONSUMER__TOPICS"
        )
    return tuple(topics)


def build_worker(
    settings: IngestSettings,
    registry: CollectorRegistry,
    *,
    store: VectorStore | None = None,
    embedder: Embedder | None = None,
    next_embedder: Embedder | None = None,
    tracing: Tracing | None = None,
) -> IngestWorker:
    """Wire a worker from settings; `store`, `embedder` and `next_embedder` may be injected
    (embedded stack, tests); `tracing` defaults to what the `OTEL_*` variables configure."""
    # configuration mistakes first, before the model loads
    consumer = settings.consumer.model_copy(
        update={"topics": consumed_topics(settings.consumer.topics, settings)}
    )
    schedule = settings.consumer.scheduler
    metrics = IngestMetrics(
        registry, tenant_classes=[t.tenant_class for t in schedule.tenants.values()]
    )
    core = build_core(
        settings,
        embedder=embedder,
        next_embedder=next_embedder,
        store=store,
        cache=settings.embedding_cache,
        metrics=registry,
    )
    own_embedder, preparer, store, sparse, sor = (
        core.embedder,
        core.preparer,
        core.store,
        core.sparse,
        core.sor,
    )
    others = [core.next_embedder] if core.next_embedder is not None else []
    models = EmbeddingModels(own_embedder, others)
    index_registry = core.registry
    targets = RegistryTargets(
        index_registry,
        [e.spec for e in models],
        sparse,
        store,
        new_tenants=new_tenant_placement(settings.store, store),
    )
    catalog = settings.plan.catalog
    options = settings.decode.options()

    def decode(raw: RawRecord) -> ChangeEvent:
        return decode_record(raw, options)

    def table_of_topic(topic: str) -> str | None:
        mapping = catalog.for_topic(topic)
        return None if mapping is None else mapping.label

    def plan(event: ChangeEvent) -> Plan:
        try:
            return plan_event(event, settings.plan, preparer.content_hash, defer_documents=True)
        except SchemaDriftError as exc:
            for column in exc.columns:
                metrics.schema_drift.labels(exc.table, column).inc()
            raise  # the handler dead-letters it with its code (SCHEMA_DRIFT) and reason

    # a preparer per further model (a reindex to another embedder): each may own an
    # extraction child process, closed with the worker
    other_models = [(e, Preparer(e.spec, settings.chunking)) for e in list(models)[1:]]
    handler = IngestHandler(
        decode=decode,
        plan=plan,
        preparer=preparer,
        embedder=own_embedder,
        sparse=sparse,
        store=store,
        targets=targets,
        metrics=metrics,
        rows=SorRows(sor) if sor is not None else None,
        keyword_fields=payload_schema(settings.plan).keyword_fields,
        event_date_fields={
            m.label: m.event_date_field for m in catalog if m.event_date_field is not None
        },
        reindex_topic=settings.consumer.reindex_topic,
        other_models=other_models,
        locate=lambda event: record_identity(event, settings.plan),
        topic_table=table_of_topic,
        documents=[m.label for m in catalog if m.document is not None],
        tenant_class=lambda tenant: (
            schedule.tenants[tenant].tenant_class if tenant in schedule.tenants else "default"
        ),
    )
    own_tracing = tracing or Tracing.from_env("ragstream-ingest")
    # every mapped column exported at 0 from the start: `increase()` sees the first drift
    for mapping in catalog:
        for column in mapping.columns():
            metrics.schema_drift.labels(mapping.table, column)
    prefix = settings.plan.topic_prefix
    liveness = SourceLiveness(
        metrics,
        topic_sources=lambda topic: prefix if catalog.for_topic(topic) is not None else None,
        heartbeat_prefix=settings.decode.heartbeat_topic_prefix,
        sources=(prefix,),
        silent_after_s=settings.liveness.silent_after_s,
        heartbeats=settings.liveness.heartbeats,
    )
    lost = LostTables(
        table_of_topic,
        settings.decode.heartbeat_topic_prefix,
        [m.label for m in catalog],
    )
    loop = ConsumerLoop(
        settings.kafka,
        consumer,
        ObservedHandler(handler, liveness),
        metrics,
        tracing=own_tracing,
        on_offset_gaps=lost.add,
    )
    return IngestWorker(
        settings=settings,
        loop=loop,
        handler=handler,
        store=store,
        registry=index_registry,
        embedder=own_embedder,
        models=models,
        targets=targets,
        metrics=metrics,
        reconcile_metrics=ReconcileMetrics(
            registry, dedicated_above_points=settings.store.dedicated_above_points
        ),
        sparse=sparse,
        sor=sor,
        liveness=liveness,
        slots=SlotWatch(metrics, sor) if isinstance(sor, SlotSource) else None,
        offset_gaps=lost,
        owned=(
            *core.owned,
            *(p for _, p in other_models),
            *([own_tracing] if tracing is None else []),
        ),
    )


def main() -> int:
    """Run the worker with signal handling and a /metrics endpoint."""
    logging.basicConfig(
        level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s"
    )
    settings = IngestSettings()
    registry = CollectorRegistry()
    # installed first: a SIGTERM while the model loads still means a clean stop
    stop = threading.Event()
    install_signal_handlers(stop)
    try:
        worker = build_worker(settings, registry)
    except ConfigError as exc:
        log.error("cannot start: %s", exc)
        return 2
    worker.stop = stop
    if settings.metrics_port:
        start_http_server(settings.metrics_port, settings.metrics_host, registry=registry)
        log.info("metrics on http://%s:%d/metrics", settings.metrics_host, settings.metrics_port)
    try:
        worker.run()
    except ConfigError as exc:
        log.error("cannot start: %s", exc)
        return 2
    except RagstreamError as exc:
        # the processing loop died (its cause is logged): exit non-zero at once, so that the
        # orchestrator restarts the worker and its alerts see it, rather than a process that
        # lives on indexing nothing
        log.critical("the ingest worker stopped: %s", exc)
        return 1
    return 0
