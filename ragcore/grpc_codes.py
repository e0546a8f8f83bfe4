"""Which gRPC status codes are the server's failures (a module without dependencies: the
Retrieve metrics, the alert tests and `ragstream status`, which must not import the service,
share it)."""

from __future__ import annotations

#: gRPC codes (go-grpc-prometheus spelling) that mean the server failed; every other non-OK code
#: is the caller's mistake (InvalidArgument, Unauthenticated, PermissionDenied, NotFound,
#: ResourceExhausted, FailedPrecondition, ...). The error-rate alert reads only these.
SERVER_ERROR_CODES = ("Unknown", "Internal", "Unavailable", "DataLoss", "DeadlineExceeded")
