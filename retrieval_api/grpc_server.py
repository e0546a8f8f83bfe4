"""The gRPC server: `RetrievalService.Retrieve`, grpc.health.v1, reflection, `grpc_server_*`
metrics, authentication, graceful shutdown.

The servicer is thin: authenticate -> admit -> validate -> run the pipeline in a worker thread
-> map errors to status codes (one table, `STATUS_OF`) -> audit. Error table (README "Errors"):

| error                                   | gRPC status          |
|-----------------------------------------|----------------------|
| no, unknown or expired credentials      | UNAUTHENTICATED      |
| tenant quota or server capacity used up | RESOURCE_EXHAUSTED   |
| request for another tenant              | PERMISSION_DENIED    |
| malformed request (RequestValidation)   | INVALID_ARGUMENT     |
| deadline passed                         | DEADLINE_EXCEEDED    |
| INDEX_NOT_FOUND                         | NOT_FOUND            |
| MANIFEST_MISMATCH                       | FAILED_PRECONDITION  |
| store / embedder / SoR / reranker down  | UNAVAILABLE          |
| any other ragstream error               | INTERNAL             |

A search that ran but found nothing usable is OK with status NO_EVIDENCE. Every non-OK answer
carries the stable ragstream code in the trailing metadata `ragstream-error-code` and the
request's correlation id (its request id, or a new one) in `ragstream-correlation-id`; a shed
call (RESOURCE_EXHAUSTED) also carries its retry hint (`grpc-retry-pushback-ms`,
`retry-after-ms`). A server-side failure (UNAVAILABLE, INTERNAL, and any exception no typed
error names) tells the client only a generic text and the correlation id, e.g. "the system of
record is unavailable (correlation id ...)": its detail (a SoR host or user, a vendor message)
is in the server log line (WARNING, or ERROR for INTERNAL) under the same id.
Admission per tenant (retrieval_api/admission.py) runs after authentication, before validation
and the pipeline (a tenant calling inside its retry hint has its refusals answered late);
credentials and quotas reload without a restart (`RetrieveServer.reload`).
"""

from __future__ import annotations

import asyncio
import contextlib
import contextvars
import logging
import time
from collections.abc import Awaitable, Callable, Mapping
from concurrent.futures import ThreadPoolExecutor
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import grpc
from grpc_health.v1 import health_pb2, health_pb2_grpc
from grpc_health.v1._async import HealthServicer
from grpc_reflection.v1alpha import reflection
from prometheus_client import CollectorRegistry, Counter, Histogram

from ragcore.errors import (
    EmbeddingUnavailableError,
    IndexNotFoundError,
    ManifestMismatchError,
    RagstreamError,
    StoreUnavailableError,
)
from ragcore.rerankers import RerankUnavailableError
from ragcore.sor.sql import SorUnavailableError
from retrieval_api.admission import OverloadedError, TenantAdmission
from retrieval_api.auth import AuthenticationError, Authenticator
from retrieval_api.evidence import error_pack
from retrieval_api.metrics import Children
from retrieval_api.retriever import DeadlineExceededError, Retriever
from retrieval_api.settings import GrpcSettings
from retrieval_api.tracing import TracingInterceptor
from retrieval_api.validate import (
    PermissionDeniedError,
    RequestValidationError,
    request_id_or_new,
    validate_request,
)
from schemas.proto.ragstream.retrieval.v1 import retrieval_pb2 as pb
from schemas.proto.ragstream.retrieval.v1 import retrieval_pb2_grpc as pb_grpc

log = logging.getLogger(__name__)

SERVICE_NAME = pb.DESCRIPTOR.services_by_name["RetrievalService"].full_name
ERROR_CODE_KEY = "ragstream-error-code"
CORRELATION_ID_KEY = "ragstream-correlation-id"


class UnexpectedError(RagstreamError):
    """A failure no typed error names (a bug): INTERNAL for the client, the original
    exception and its traceback in the server log."""

    code = "INTERNAL"

    def __init__(self, cause: Exception) -> None:
        super().__init__(f"{type(cause).__name__}: {cause}")


#: Typed errors -> gRPC status, most specific first.
STATUS_OF: tuple[tuple[type[BaseException], grpc.StatusCode], ...] = (
    (AuthenticationError, grpc.StatusCode.UNAUTHENTICATED),
    (OverloadedError, grpc.StatusCode.RESOURCE_EXHAUSTED),
    (PermissionDeniedError, grpc.StatusCode.PERMISSION_DENIED),
    (RequestValidationError, grpc.StatusCode.INVALID_ARGUMENT),
    (DeadlineExceededError, grpc.StatusCode.DEADLINE_EXCEEDED),
    (IndexNotFoundError, grpc.StatusCode.NOT_FOUND),
    (ManifestMismatchError, grpc.StatusCode.FAILED_PRECONDITION),
    (StoreUnavailableError, grpc.StatusCode.UNAVAILABLE),
    (EmbeddingUnavailableError, grpc.StatusCode.UNAVAILABLE),
    (SorUnavailableError, grpc.StatusCode.UNAVAILABLE),
    (RerankUnavailableError, grpc.StatusCode.UNAVAILABLE),
    (RagstreamError, grpc.StatusCode.INTERNAL),
)


def status_of(exc: BaseException) -> grpc.StatusCode:
    """The gRPC status for a typed error (INTERNAL for anything unexpected)."""
    for kind, code in STATUS_OF:
        if isinstance(exc, kind):
            return code
    return grpc.StatusCode.INTERNAL


#: The server-side statuses: their detail stays in the server log.
SERVER_SIDE = frozenset({grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.INTERNAL})
#: What a client is told of a dependency that is down, by error code.
_GENERIC = {
    "SOR_UNAVAILABLE": "the system of record is unavailable",
    "STORE_UNAVAILABLE": "the vector store is unavailable",
    "EMBEDDING_UNAVAILABLE": "the embedder is unavailable",
    "RERANK_UNAVAILABLE": "the reranker is unavailable",
}


def client_message(exc: RagstreamError, code: grpc.StatusCode, correlation_id: str) -> str:
    """The text a client gets for `exc`: its message for a client-side status; for a
    server-side one a generic text and the correlation id, never the detail (a SoR's host,
    port, user or database; a vendor's message)."""
    if code not in SERVER_SIDE:
        return str(exc)
    fallback = "a dependency is unavailable" if code == grpc.StatusCode.UNAVAILABLE else None
    text = _GENERIC.get(exc.code) or fallback or "internal error"
    return f"{text} (correlation id {correlation_id})"


class RetrievalServicer(pb_grpc.RetrievalServiceServicer):
    """Thin servicer: proto in, domain, proto out; errors mapped by `STATUS_OF`."""

    def __init__(
        self,
        retriever: Retriever,
        auth: Authenticator,
        pool: ThreadPoolExecutor,
        admission: TenantAdmission | None = None,
    ) -> None:
        self._retriever = retriever
        self._auth = auth
        self._pool = pool
        self._admission = admission

    async def Retrieve(  # noqa: N802 - the generated base class names it
        self, request: pb.RetrieveRequest, context: grpc.aio.ServicerContext[Any, Any]
    ) -> pb.EvidencePack:
        """Authenticate, admit, validate, run the pipeline, answer."""
        requested_at = datetime.now(UTC)
        started = time.perf_counter()
        tenant = ""
        try:
            # the token's hash decides the tenant; admission comes next, so a refused call
            # costs no validation, no audit record and no pipeline work
            tenant = self._auth.tenant_of(context)
            async with self._admitted(tenant, context.time_remaining()):
                with self._retriever.tracing.span("retrieve.validate"):
                    validated = validate_request(request, self._retriever.config, tenant)
                remaining = context.time_remaining()
                deadline = time.monotonic() + remaining if remaining is not None else None
                loop = asyncio.get_running_loop()
                # a copy of the call's context: the pipeline's spans are children of the call's
                call = contextvars.copy_context()
                return await loop.run_in_executor(
                    self._pool, call.run, self._retriever.retrieve, validated, deadline
                )
        except Exception as raised:
            # the one error mapping: every failure becomes a status (an unexpected one INTERNAL)
            exc = raised if isinstance(raised, RagstreamError) else UnexpectedError(raised)
            code = status_of(exc)
            request_id = request_id_or_new(request.request_id, self._retriever.config)
            detail = client_message(exc, code, request_id)  # what the client may see
            # a shed call is counted by admission, not audited: a flood would flood the audit
            if tenant and not isinstance(exc, AuthenticationError | OverloadedError):
                timings = {"total": (time.perf_counter() - started) * 1000}
                pack = error_pack(request_id, exc.code, detail, tenant=tenant, timings_ms=timings)
                self._retriever.record_failure(
                    pack, request.query_text, requested_at, code=go_code_name(code)
                )
            # shed calls are summed up by admission's offenders line instead of one line each
            level = logging.DEBUG if isinstance(exc, OverloadedError) else logging.INFO
            if code in SERVER_SIDE:
                level = logging.ERROR if code == grpc.StatusCode.INTERNAL else logging.WARNING
            log.log(
                level,
                "Retrieve %s [%s] correlation id %s: %s",
                code.name,
                exc.code,
                request_id,
                exc,
                exc_info=raised if exc is not raised else None,
            )
            trailer: tuple[tuple[str, str], ...] = (
                (ERROR_CODE_KEY, exc.code),
                (CORRELATION_ID_KEY, request_id),
            )
            if isinstance(exc, OverloadedError):
                trailer += exc.trailers()
            await context.abort(code, f"{exc.code}: {detail}", trailing_metadata=trailer)
            raise  # unreachable: abort raises

    def _admitted(
        self, tenant: str, time_remaining_s: float | None
    ) -> contextlib.AbstractAsyncContextManager[None]:
        """The tenant's admission slot for the rest of the call (OverloadedError when refused,
        deferred if the tenant calls inside its retry hint); without admission, nothing."""
        if self._admission is None:
            return contextlib.nullcontext()
        return self._admission.admitted(tenant, time_remaining_s=time_remaining_s)


class GrpcMetrics(grpc.aio.ServerInterceptor):  # type: ignore[misc]
    """`grpc_server_*` metrics with go-grpc-prometheus names and labels (unary calls)."""

    def __init__(self, registry: CollectorRegistry) -> None:
        labels = ["grpc_type", "grpc_service", "grpc_method"]
        self.started = Counter(
            "grpc_server_started_total", "RPCs started on the server.", labels, registry=registry
        )
        self.handled = Counter(
            "grpc_server_handled_total",
            "RPCs completed on the server, by status code.",
            [*labels, "grpc_code"],
            registry=registry,
        )
        self.handling = Histogram(
            "grpc_server_handling_seconds",
            "Response latency of RPCs handled by the server.",
            labels,
            buckets=(0.001, 0.0025, 0.005, 0.01, 0.02, 0.03, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10),
            registry=registry,
        )
        self.received = Counter(
            "grpc_server_msg_received_total", "Messages received.", labels, registry=registry
        )
        self.sent = Counter(
            "grpc_server_msg_sent_total", "Messages sent.", labels, registry=registry
        )
        # each call's children, looked up once per method and code (see `Children`)
        self.started_of = Children(self.started)
        self.handled_of = Children(self.handled)
        self.handling_of = Children(self.handling)
        self.received_of = Children(self.received)
        self.sent_of = Children(self.sent)

    async def intercept_service(
        self,
        continuation: Callable[[grpc.HandlerCallDetails], Awaitable[grpc.RpcMethodHandler]],
        handler_call_details: grpc.HandlerCallDetails,
    ) -> grpc.RpcMethodHandler:
        """Wrap unary-unary handlers with counters and a latency histogram."""
        handler = await continuation(handler_call_details)
        if handler is None or handler.unary_unary is None:
            return handler
        service, _, method = handler_call_details.method.lstrip("/").rpartition("/")
        labels = ("unary", service, method)
        inner = handler.unary_unary

        async def observed(request: Any, context: grpc.aio.ServicerContext[Any, Any]) -> Any:
            self.started_of(*labels).inc()
            self.received_of(*labels).inc()
            began = time.perf_counter()
            code = grpc.StatusCode.OK
            try:
                response = await inner(request, context)
                self.sent_of(*labels).inc()
                return response
            except asyncio.CancelledError:
                code = grpc.StatusCode.CANCELLED
                raise
            except BaseException:
                code = context.code() or grpc.StatusCode.UNKNOWN
                if code == grpc.StatusCode.OK:
                    code = grpc.StatusCode.UNKNOWN
                raise
            finally:
                self.handled_of(*labels, go_code_name(code)).inc()
                self.handling_of(*labels).observe(time.perf_counter() - began)

        return grpc.unary_unary_rpc_method_handler(
            observed,
            request_deserializer=handler.request_deserializer,
            response_serializer=handler.response_serializer,
        )


def go_code_name(code: grpc.StatusCode) -> str:
    """go-grpc-prometheus spells codes in CamelCase (`InvalidArgument`); dashboards expect it."""
    if code == grpc.StatusCode.OK:
        return "OK"
    return "".join(part.capitalize() for part in code.name.split("_"))


def server_options(settings: GrpcSettings) -> list[tuple[str, int]]:
    """gRPC core channel arguments of the Retrieve server: connection ageing
    (`GrpcSettings.connection_age_s`). At the age, the server sends GOAWAY: calls in flight
    finish (within the grace), the client opens a new connection for its next call, and with
    several server processes the kernel picks one again."""
    age_s = settings.connection_age_s()
    if age_s is None:
        return []
    return [
        ("grpc.max_connection_age_ms", max(1, round(age_s * 1000))),
        (
            "grpc.max_connection_age_grace_ms",
            max(1, round(settings.max_connection_age_grace_s * 1000)),
        ),
    ]


class RetrieveServer:
    """The aio server with health and reflection; `start`, `serve_until`, `stop`."""

    def __init__(
        self,
        settings: GrpcSettings,
        *,
        retriever: Retriever,
        auth: Authenticator,
        registry: CollectorRegistry,
        health_check: Callable[[], None],
        health_interval_s: float = 10.0,
        admission: TenantAdmission | None = None,
        reload_interval_s: float = 2.0,
        part_health: Callable[[], Mapping[str, bool]] | None = None,
    ) -> None:
        """`health_check` decides the service's status; `part_health` (optional) names parts
        that are reported under their own health service name (e.g. one per SoR table) and
        does not change the service's status."""
        self._settings = settings
        self._retriever = retriever
        self._auth = auth
        self.admission = admission
        self._reload_interval = reload_interval_s
        self._watched = _Watched(auth, admission)
        self._tasks: list[asyncio.Task[None]] = []
        self._interceptor = GrpcMetrics(registry)
        self._pool = ThreadPoolExecutor(settings.workers, thread_name_prefix="retrieve")
        self.health = HealthServicer()
        self._health_check = health_check
        self._part_health = part_health
        self._health_interval = health_interval_s
        self._health_task: asyncio.Task[None] | None = None
        self._server: grpc.aio.Server | None = None
        self.port = 0

    def _build(self) -> grpc.aio.Server:
        # an aio server belongs to the event loop it is created in: build it in `start`
        server = grpc.aio.server(
            interceptors=[self._interceptor, TracingInterceptor(self._retriever.tracing)],
            options=server_options(self._settings),
            maximum_concurrent_rpcs=self._settings.max_concurrent_rpcs,
        )
        pb_grpc.add_RetrievalServiceServicer_to_server(
            RetrievalServicer(self._retriever, self._auth, self._pool, self.admission), server
        )
        health_pb2_grpc.add_HealthServicer_to_server(self.health, server)
        reflection.enable_server_reflection(
            (SERVICE_NAME, reflection.SERVICE_NAME, "grpc.health.v1.Health"), server
        )
        return server

    def _bind(self, server: grpc.aio.Server) -> int:
        address = f"{self._settings.host}:{self._settings.port}"
        s = self._settings
        if s.tls_cert_file is None:
            port: int = server.add_insecure_port(address)
            return port
        if s.tls_key_file is None:
            raise RagstreamError("grpc.tls_cert_file needs grpc.tls_key_file")
        client_ca = s.tls_client_ca_file.read_bytes() if s.tls_client_ca_file else None
        credentials = grpc.ssl_server_credentials(
            [(s.tls_key_file.read_bytes(), s.tls_cert_file.read_bytes())],
            root_certificates=client_ca,
            require_client_auth=client_ca is not None,
        )
        secure: int = server.add_secure_port(address, credentials)
        return secure

    async def start(self) -> None:
        """Bind, start serving, and start the periodic dependency health check."""
        self._server = self._build()
        self.port = self._bind(self._server)
        await self._server.start()
        await self._check_health()
        self._health_task = asyncio.create_task(self._health_loop())
        self._tasks.append(asyncio.create_task(self._every(self._reload_interval, self.poll)))
        if self.admission is not None:
            every = self.admission.settings.offenders_log_interval_s
            offenders = self._every(every, self.admission.log_offenders)
            self._tasks.append(asyncio.create_task(offenders))

    def reload(self) -> None:
        """Read the credentials and the quotas again now (SIGHUP); what cannot be read is
        logged and counted, and what was in force stays."""
        self._watched.reload()

    def poll(self) -> None:
        """Reload the credentials and the quotas if one of their files changed."""
        self._watched.poll()

    @staticmethod
    async def _every(interval_s: float, action: Callable[[], None]) -> None:
        while True:
            await asyncio.sleep(interval_s)
            action()

    def check_health(self) -> None:
        """Run the health check once in the caller's thread (what the health service reports:
        raises the RagstreamError that makes it NOT_SERVING)."""
        self._health_check()

    async def refresh_health(self) -> None:
        """Run the health checks now and publish their statuses (as the periodic loop does)."""
        await self._check_health()

    async def _check_health(self) -> None:
        loop = asyncio.get_running_loop()
        try:
            await loop.run_in_executor(self._pool, self._health_check)
        except RagstreamError as exc:
            log.warning("not serving: %s", exc)
            status = health_pb2.HealthCheckResponse.NOT_SERVING
        else:
            status = health_pb2.HealthCheckResponse.SERVING
        for name in ("", SERVICE_NAME):
            await self.health.set(name, status)
        if self._part_health is None or status != health_pb2.HealthCheckResponse.SERVING:
            return
        try:
            parts = await loop.run_in_executor(self._pool, self._part_health)
        except RagstreamError as exc:
            log.warning("cannot check the parts' health: %s", exc)
            return
        for name, ok in parts.items():
            await self.health.set(
                name,
                health_pb2.HealthCheckResponse.SERVING
                if ok
                else health_pb2.HealthCheckResponse.NOT_SERVING,
            )

    async def _health_loop(self) -> None:
        while True:
            await asyncio.sleep(self._health_interval)
            await self._check_health()

    async def stop(self) -> None:
        """Graceful shutdown: NOT_SERVING first, drain in-flight RPCs, then stop."""
        if self._health_task is not None:
            self._health_task.cancel()
        for task in self._tasks:
            task.cancel()
        await self.health.enter_graceful_shutdown()
        if self._server is not None:
            await self._server.stop(self._settings.grace_s)
        self._pool.shutdown(wait=True)

    async def wait(self) -> None:
        """Until the server terminates."""
        if self._server is not None:
            await self._server.wait_for_termination()


class _Watched:
    """The files credentials and quotas come from, and when each was last seen changed."""

    def __init__(self, auth: Authenticator, admission: TenantAdmission | None) -> None:
        self._auth = auth
        self._admission = admission
        self._seen = self._stamps()
        if admission is not None:
            auth.metrics.reload_ok.labels("quotas").set(1)

    def _paths(self) -> list[Path]:
        s = self._auth.settings
        paths = [s.tokens_file, s.mtls_file]
        if self._admission is not None:
            paths.append(self._admission.settings.quotas_file)
        return [p for p in paths if p is not None]

    def _stamps(self) -> dict[Path, tuple[int, int, int] | None]:
        stamps: dict[Path, tuple[int, int, int] | None] = {}
        for path in self._paths():
            try:
                st = path.stat()  # follows symlinks: a Kubernetes secret swaps one
            except OSError:
                stamps[path] = None
            else:
                stamps[path] = (st.st_mtime_ns, st.st_size, st.st_ino)
        return stamps

    def poll(self) -> None:
        stamps = self._stamps()
        if stamps != self._seen:
            self._seen = stamps
            self.reload()

    def reload(self) -> None:
        self._auth.reload()
        if self._admission is not None:
            try:
                self._admission.reload()
            except RagstreamError as exc:
                self._auth.metrics.reloaded("quotas", ok=False)
                log.error("quotas not reloaded, the previous ones stay in force: %s", exc)
            else:
                self._auth.metrics.reloaded("quotas", ok=True)
