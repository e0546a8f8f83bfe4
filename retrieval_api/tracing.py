"""The span of each gRPC call (docs/decisions/tracing.md): a server interceptor that continues the
caller's W3C `traceparent` and names the span after the method, with the OpenTelemetry RPC
semantic conventions (`rpc.system`, `rpc.service`, `rpc.method`, `rpc.grpc.status_code`).

The span status is ERROR for server-side failures only (UNKNOWN, DEADLINE_EXCEEDED,
UNIMPLEMENTED, INTERNAL, UNAVAILABLE, DATA_LOSS), as the conventions ask of servers: a client's
bad request is not an error of this service. The pipeline's stage spans are its children
(`retrieval_api/retriever.py`); the servicer runs the pipeline in a worker thread with a copy of
the call's context, which carries the current span there.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from typing import Any

import grpc

from ragcore.tracing import Tracing

#: Status codes that mark a server span as failed (OpenTelemetry gRPC conventions).
SERVER_ERRORS = frozenset(
    {
        grpc.StatusCode.UNKNOWN,
        grpc.StatusCode.DEADLINE_EXCEEDED,
        grpc.StatusCode.UNIMPLEMENTED,
        grpc.StatusCode.INTERNAL,
        grpc.StatusCode.UNAVAILABLE,
        grpc.StatusCode.DATA_LOSS,
    }
)


class TracingInterceptor(grpc.aio.ServerInterceptor):  # type: ignore[misc]
    """One server span per unary call (or, with tracing off, the caller's trace id only)."""

    def __init__(self, tracing: Tracing) -> None:
        self._tracing = tracing

    async def intercept_service(
        self,
        continuation: Callable[[grpc.HandlerCallDetails], Awaitable[grpc.RpcMethodHandler]],
        handler_call_details: grpc.HandlerCallDetails,
    ) -> grpc.RpcMethodHandler:
        """Wrap unary-unary handlers in the call's span."""
        handler = await continuation(handler_call_details)
        if handler is None or handler.unary_unary is None:
            return handler
        full = handler_call_details.method.lstrip("/")
        service, _, method = full.rpartition("/")
        attributes = {"rpc.system": "grpc", "rpc.service": service, "rpc.method": method}
        metadata = tuple(handler_call_details.invocation_metadata or ())
        inner = handler.unary_unary
        tracing = self._tracing

        async def traced(request: Any, context: grpc.aio.ServicerContext[Any, Any]) -> Any:
            with tracing.server_span(full, metadata, attributes) as span:
                code = grpc.StatusCode.OK
                try:
                    return await inner(request, context)
                except asyncio.CancelledError:
                    code = grpc.StatusCode.CANCELLED
                    raise
                except BaseException:
                    code = context.code() or grpc.StatusCode.UNKNOWN
                    if code == grpc.StatusCode.OK:
                        code = grpc.StatusCode.UNKNOWN
                    raise
                finally:
                    if span is not None:
                        _finish(span, code)

        return grpc.unary_unary_rpc_method_handler(
            traced,
            request_deserializer=handler.request_deserializer,
            response_serializer=handler.response_serializer,
        )


def _finish(span: Any, code: grpc.StatusCode) -> None:
    from opentelemetry.trace import Status, StatusCode

    span.set_attribute("rpc.grpc.status_code", code.value[0])
    if code in SERVER_ERRORS:
        span.set_status(Status(StatusCode.ERROR, code.name))
