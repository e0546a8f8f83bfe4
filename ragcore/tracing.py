"""OpenTelemetry tracing, off unless the standard `OTEL_*` variables configure it
(docs/decisions/tracing.md).

On when `OTEL_TRACES_EXPORTER` names an exporter (`otlp`, `console`), or when an OTLP endpoint is
set (`OTEL_EXPORTER_OTLP_ENDPOINT`, `OTEL_EXPORTER_OTLP_TRACES_ENDPOINT`); off when
`OTEL_SDK_DISABLED=true` or `OTEL_TRACES_EXPORTER=none`. Everything else (service name,
resource attributes, sampler, OTLP headers, timeouts, batch sizes) is read by the SDK itself
from its own variables.

Off, a `Tracing` never imports opentelemetry: `span` hands back one shared no-op context manager,
so the hot paths pay a method call. A caller's W3C `traceparent` is still parsed (a regular
expression) so that its trace id reaches the evidence pack and the audit record: the caller's
trace can be joined with ragstream's records even when ragstream exports no spans.
"""

from __future__ import annotations

import contextlib
import os
import re
from collections.abc import Iterable, Iterator, Mapping
from contextlib import AbstractContextManager, nullcontext
from contextvars import ContextVar
from typing import TYPE_CHECKING, Any

from ragcore.errors import ConfigError

if TYPE_CHECKING:
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.trace import Span, Tracer

__all__ = ["TRACEPARENT", "Tracing", "parse_traceparent", "tracing_configured"]

#: The W3C trace-context header (lower case: gRPC metadata keys are).
TRACEPARENT = "traceparent"
TRACESTATE = "tracestate"
_TRACEPARENT_RE = re.compile(r"^([0-9a-f]{2})-([0-9a-f]{32})-([0-9a-f]{16})-([0-9a-f]{2})(-.*)?$")
_NULL: AbstractContextManager[None] = nullcontext()
#: With tracing off: the trace id a caller sent, for the pack and audit of its request.
_CALLER_TRACE_ID: ContextVar[str] = ContextVar("ragstream_caller_trace_id", default="")
#: Exporters `OTEL_TRACES_EXPORTER` may name.
EXPORTERS = frozenset({"otlp", "console"})


def parse_traceparent(value: str | None) -> str | None:
    """The trace id (32 hex digits) of a valid W3C `traceparent`, else None (an invalid header
    is ignored, as the W3C spec asks: the request starts a new trace)."""
    if not value:
        return None
    match = _TRACEPARENT_RE.match(value.strip())
    if match is None:
        return None
    version, trace_id, parent_id, _flags, rest = match.groups()
    if version == "ff" or (version == "00" and rest):
        return None
    if trace_id == "0" * 32 or parent_id == "0" * 16:
        return None
    return trace_id


def _truthy(value: str | None) -> bool:
    return (value or "").strip().lower() in {"true", "1", "yes"}


def _exporters(env: Mapping[str, str]) -> list[str]:
    """The span exporters the environment asks for (empty: tracing off)."""
    if _truthy(env.get("OTEL_SDK_DISABLED")):
        return []
    named = env.get("OTEL_TRACES_EXPORTER")
    if named is not None and named.strip():
        names = [n.strip().lower() for n in named.split(",") if n.strip()]
        if names == ["none"]:
            return []
        unknown = sorted(set(names) - EXPORTERS)
        if unknown:
            raise ConfigError(
                f"OTEL_TRACES_EXPORTER names {', '.join(unknown)}; ragstream ships "
                f"{', '.join(sorted(EXPORTERS))} (or none)"
            )
        return names
    if env.get("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT") or env.get("OTEL_EXPORTER_OTLP_ENDPOINT"):
        return ["otlp"]
    return []


def tracing_configured(env: Mapping[str, str] | None = None) -> bool:
    """Whether the `OTEL_*` variables turn tracing on."""
    return bool(_exporters(os.environ if env is None else env))


def _otlp_exporter(env: Mapping[str, str]) -> Any:
    protocol = (
        env.get("OTEL_EXPORTER_OTLP_TRACES_PROTOCOL") or env.get("OTEL_EXPORTER_OTLP_PROTOCOL")
    ) or "grpc"
    if protocol == "grpc":
        from opentelemetry.exporter.otlp.proto.grpc.trace_exporter import OTLPSpanExporter

        return OTLPSpanExporter()
    if protocol == "http/protobuf":
        from opentelemetry.exporter.otlp.proto.http.trace_exporter import (
            OTLPSpanExporter as HttpSpanExporter,
        )

        return HttpSpanExporter()
    raise ConfigError(f"OTEL_EXPORTER_OTLP_PROTOCOL={protocol!r}: use grpc or http/protobuf")


class Tracing:
    """Spans of one service, or nothing (`Tracing.off()`): see the module docstring."""

    def __init__(self, provider: TracerProvider | None = None, *, owned: bool = False) -> None:
        """Trace with `provider` (None: off). `owned`: `shutdown` also shuts the provider down
        (flushing its exporters); a provider handed in by a test stays its owner's."""
        self._provider = provider
        self._owned = owned
        self._tracer: Tracer | None = None
        self._propagator: Any = None
        if provider is not None:
            from opentelemetry.trace.propagation.tracecontext import (
                TraceContextTextMapPropagator,
            )

            self._tracer = provider.get_tracer("ragstream")
            self._propagator = TraceContextTextMapPropagator()

    @classmethod
    def off(cls) -> Tracing:
        """No spans (the default)."""
        return cls(None)

    @classmethod
    def from_env(cls, service_name: str, env: Mapping[str, str] | None = None) -> Tracing:
        """Tracing as the `OTEL_*` variables configure it; `service_name` unless
        `OTEL_SERVICE_NAME` (or `service.name` in `OTEL_RESOURCE_ATTRIBUTES`) names another."""
        environ = os.environ if env is None else env
        exporters = _exporters(environ)
        if not exporters:
            return cls.off()
        from opentelemetry.sdk.resources import Resource
        from opentelemetry.sdk.trace import TracerProvider
        from opentelemetry.sdk.trace.export import BatchSpanProcessor, ConsoleSpanExporter

        named = "OTEL_SERVICE_NAME" in environ or "service.name=" in environ.get(
            "OTEL_RESOURCE_ATTRIBUTES", ""
        )
        # attributes given to Resource.create win over the environment's: give none then
        resource = Resource.create() if named else Resource.create({"service.name": service_name})
        provider = TracerProvider(resource=resource)
        for name in exporters:
            exporter = _otlp_exporter(environ) if name == "otlp" else ConsoleSpanExporter()
            provider.add_span_processor(BatchSpanProcessor(exporter))
        return cls(provider, owned=True)

    @property
    def enabled(self) -> bool:
        """Spans are recorded."""
        return self._tracer is not None

    def span(
        self, name: str, attributes: Mapping[str, str | int | float | bool] | None = None
    ) -> AbstractContextManager[Span | None]:
        """A child of the current span (a root without one); the shared no-op when off."""
        if self._tracer is None:
            return _NULL
        return self._tracer.start_as_current_span(name, attributes=attributes)

    @contextlib.contextmanager
    def server_span(
        self,
        name: str,
        metadata: Iterable[tuple[str, str | bytes]],
        attributes: Mapping[str, str | int | float | bool] | None = None,
    ) -> Iterator[Span | None]:
        """The span of one incoming call, continuing the caller's `traceparent` (metadata
        keys as gRPC gives them). Off: only the caller's trace id is kept, for
        `current_trace_id`."""
        carrier = {k: v for k, v in metadata if isinstance(v, str) and k in _PROPAGATED}
        if self._tracer is None:
            token = _CALLER_TRACE_ID.set(parse_traceparent(carrier.get(TRACEPARENT)) or "")
            try:
                yield None
            finally:
                _CALLER_TRACE_ID.reset(token)
            return
        from opentelemetry.trace import SpanKind

        parent = self._propagator.extract(carrier)
        with self._tracer.start_as_current_span(
            name,
            context=parent,
            kind=SpanKind.SERVER,
            attributes=attributes,
            record_exception=False,
            set_status_on_exception=False,
        ) as span:
            yield span

    def current_trace_id(self) -> str:
        """The trace id (32 hex digits) of the current span, or with tracing off the one the
        caller sent; "" when there is none."""
        if self._tracer is None:
            return _CALLER_TRACE_ID.get()
        from opentelemetry.trace import get_current_span

        context = get_current_span().get_span_context()
        return format(context.trace_id, "032x") if context.is_valid else ""

    def shutdown(self) -> None:
        """Flush and stop the exporters of a provider built here (idempotent)."""
        if self._provider is not None and self._owned:
            self._provider.shutdown()
            self._owned = False

    def close(self) -> None:
        """`shutdown` (a service closes what it owns)."""
        self.shutdown()


_PROPAGATED = frozenset({TRACEPARENT, TRACESTATE})
