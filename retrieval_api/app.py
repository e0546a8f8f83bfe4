"""The Retrieve server process: `python -m retrieval_api` / `ragstream serve`."""

from __future__ import annotations

import asyncio
import logging
import signal
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass

from prometheus_client import CollectorRegistry, start_http_server

from ragcore.embedders.base import Embedder
from ragcore.errors import ConfigError, RagstreamError
from ragcore.publish import KafkaPublisher, Publisher
from ragcore.rerankers import build_reranker
from ragcore.sor.base import SystemOfRecord
from ragcore.store.base import Placement, VectorStore
from ragcore.store.registry import IndexRegistry
from ragcore.tracing import Tracing
from ragcore.wiring import Closable, build_core
from retrieval_api.admission import TenantAdmission
from retrieval_api.auth import Authenticator
from retrieval_api.grpc_server import RetrieveServer
from retrieval_api.metrics import RetrieveMetrics
from retrieval_api.processes import RetrieveProcesses, serving_settings
from retrieval_api.retriever import Retriever
from retrieval_api.settings import RetrieveSettings
from retrieval_api.sorwatch import SorTableWatch

log = logging.getLogger(__name__)


@dataclass
class RetrieveApp:
    """A wired server and the resources it owns."""

    settings: RetrieveSettings
    server: RetrieveServer
    retriever: Retriever
    store: VectorStore
    registry: IndexRegistry
    embedder: Embedder
    sor: SystemOfRecord
    publisher: Publisher | None
    #: what `build_app` created (injected parts belong to their owner and stay open)
    owned: tuple[Closable, ...] = ()

    def close(self) -> None:
        """Release what the app created (after the server stopped)."""
        for resource in self.owned:
            resource.close()


class _Throttled:
    """Runs a costly check at most once per `interval_s` (it reads every tenant's manifest);
    in between, repeats the last outcome (raises its error again)."""

    def __init__(self, check: Callable[[], None], interval_s: float) -> None:
        self._check = check
        self._interval = interval_s
        self._last: float | None = None
        self._error: RagstreamError | None = None
        self._lock = threading.Lock()

    def __call__(self) -> None:
        with self._lock:
            now = time.monotonic()
            if self._last is None or now - self._last >= self._interval:
                self._last = now
                try:
                    self._check()
                except RagstreamError as exc:
                    self._error = exc
                else:
                    self._error = None
            if self._error is not None:
                raise self._error


def build_app(
    settings: RetrieveSettings,
    registry: CollectorRegistry,
    *,
    store: VectorStore | None = None,
    embedder: Embedder | None = None,
    sor: SystemOfRecord | None = None,
    publisher: Publisher | None = None,
    next_embedder: Embedder | None = None,
    tracing: Tracing | None = None,
) -> RetrieveApp:
    """Wire the server from settings; parts may be injected (embedded stack, tests);
    `tracing` defaults to what the `OTEL_*` variables configure. A local embedder built here
    runs with one onnxruntime thread unless configured (`serving_settings`)."""
    settings = serving_settings(settings)
    rerank = settings.retrieval.rerank_enabled
    if rerank and settings.reranker is None:
        raise ConfigError(
            "retrieval.rerank_enabled is set but no reranker is configured: set "
            "RAGSTREAM_RERANKER__KIND (http | onnx)"
        )
    no_sor = ConfigError(
        "Retrieve verifies every hit against the system of record: set RAGSTREAM_SOR__KIND"
    )
    if sor is None and settings.sor.kind == "none":
        raise no_sor  # before anything is built
    core = build_core(
        settings, embedder=embedder, next_embedder=next_embedder, store=store, sor=sor
    )
    own_embedder, own_next, own_store = core.embedder, core.next_embedder, core.store
    index_registry = core.registry
    own_sor = core.sor
    if own_sor is None:
        core.close()
        raise no_sor
    created: list[Closable] = []
    admission = TenantAdmission(settings.admission, registry)
    own_publisher = publisher
    if own_publisher is None and settings.publish_enabled:
        own_publisher = KafkaPublisher(
            settings.kafka, registry, settings.publish, tenant_class=admission.tenant_class
        )
        created.append(own_publisher)
    key = settings.audit_hmac_key.get_secret_value().encode() if settings.audit_hmac_key else None
    own_reranker = (
        build_reranker(settings.reranker) if rerank and settings.reranker is not None else None
    )
    if own_reranker is not None:
        created.append(own_reranker)
    own_tracing = tracing or Tracing.from_env("ragstream-retrieve")
    if tracing is None:
        created.append(own_tracing)
    metrics = RetrieveMetrics(registry)
    retriever = Retriever(
        config=settings.retrieval,
        embedder=own_embedder,
        sparse=core.sparse,
        store=own_store,
        registry=index_registry,
        sor=own_sor,
        metrics=metrics,
        publisher=own_publisher,
        audit_topic=settings.audit_topic,
        reindex_topic=settings.reindex_topic,
        audit_key=key,
        reranker=own_reranker,
        attribute_fields=tuple(settings.retrieval.keyword_filter_fields),
        other_embedders=[own_next] if own_next is not None else [],
        tracing=own_tracing,
    )

    model_check = _Throttled(retriever.check_models, settings.model_check_interval_s)

    def health_check() -> None:
        """Raise when the embedder, the store, the SoR (or an enabled reranker) is unusable,
        or when some tenant's active index needs a model this server does not hold."""
        own_embedder.check()
        if own_next is not None:
            own_next.check()
        index_registry.list_tenants()
        own_sor.check()
        if own_reranker is not None:
            own_reranker.check()
        model_check()

    server = RetrieveServer(
        settings.grpc,
        retriever=retriever,
        auth=Authenticator(settings.auth, registry),
        registry=registry,
        health_check=health_check,
        health_interval_s=settings.health_check_interval_s,
        admission=admission,
        reload_interval_s=settings.auth.reload_interval_s,
        part_health=SorTableWatch(own_sor, metrics.sor_table_unreadable).check,
    )
    owned = [*core.owned, *created]
    app = RetrieveApp(
        settings=settings,
        server=server,
        retriever=retriever,
        store=own_store,
        registry=index_registry,
        embedder=own_embedder,
        sor=own_sor,
        publisher=own_publisher,
        owned=tuple(owned),
    )
    return app


def warm_calibrations(app: RetrieveApp) -> threading.Event:
    """Start loading the calibrations `retrieval.warm_calibrations` names in a background
    thread (requests are served meanwhile; one for an index being loaded waits for that one
    load, as before); set the returned event to stop it between indexes."""
    stop = threading.Event()
    mode = app.settings.retrieval.warm_calibrations
    if mode == "none":
        return stop
    placements: tuple[Placement, ...] = (
        ("dedicated",) if mode == "dedicated" else ("dedicated", "shared")
    )

    def run() -> None:
        started = time.monotonic()
        warmed = app.retriever.search.warm(placements, stop)
        log.info(
            "calibrations of %d %s index version(s) loaded ahead of their requests in %.1f s",
            warmed,
            mode,
            time.monotonic() - started,
        )

    threading.Thread(target=run, name="calibration-warm", daemon=True).start()
    return stop


async def serve(app: RetrieveApp, on_start: Callable[[int], None] | None = None) -> None:
    """Serve until SIGTERM/SIGINT, then shut down gracefully; SIGHUP reloads the credentials
    and quotas; `on_start` gets the bound port once the server serves."""
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    loop.add_signal_handler(signal.SIGHUP, app.server.reload)
    await app.server.start()
    log.info("Retrieve serving on %s:%d", app.settings.grpc.host, app.server.port)
    if on_start is not None:
        on_start(app.server.port)
    warming = warm_calibrations(app)
    await stop.wait()
    warming.set()
    log.info("shutting down: draining in-flight requests")
    await app.server.stop()


def main() -> int:
    """Run the server with a /metrics endpoint."""
    logging.basicConfig(
        level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s"
    )
    settings = RetrieveSettings()
    if settings.grpc.processes > 1:
        return _serve_processes(settings)
    registry = CollectorRegistry()
    try:
        app = build_app(settings, registry)
    except RagstreamError as exc:
        log.error("cannot start: [%s] %s", exc.code, exc)
        return 2
    if settings.metrics_port:
        start_http_server(settings.metrics_port, settings.metrics_host, registry=registry)
    try:
        asyncio.run(serve(app))
    finally:
        app.close()
    return 0


def _serve_processes(settings: RetrieveSettings) -> int:
    """`grpc.processes` server processes on one port (retrieval_api.processes) until
    SIGTERM/SIGINT; 1 when one of them died on its own (all are then stopped)."""
    group = RetrieveProcesses(settings)
    stop = threading.Event()
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, lambda *_: stop.set())
    signal.signal(signal.SIGHUP, lambda *_: group.signal(signal.SIGHUP))
    if settings.metrics_port:
        # before the processes serve: once gRPC answers, /metrics does too
        start_http_server(
            settings.metrics_port, settings.metrics_host, registry=group.metrics_registry()
        )
    try:
        group.start()
    except RagstreamError as exc:
        log.error("cannot start: [%s] %s", exc.code, exc)
        return 2
    try:
        died = group.wait(stop)
    finally:
        log.info("shutting down: draining in-flight requests in every server process")
        group.stop()
    return 0 if died is None else 1
