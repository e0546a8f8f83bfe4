"""Settings of the Retrieve server (`RAGSTREAM_` prefix, `__` nesting; see README)."""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Annotated

from pydantic import BaseModel, ConfigDict, Field, SecretStr, model_validator

from ragcore.kinds import missing_kind
from ragcore.publish import PublishSettings
from ragcore.rerankers.http import HttpRerankerConfig
from ragcore.rerankers.onnx_cross_encoder import OnnxRerankerConfig
from ragcore.settings import ServiceSettings
from retrieval_api.admission import AdmissionSettings
from retrieval_api.pipeline_settings import RetrievalConfig

#: The reranker stage's adapter, told apart by `kind` ("http" | "onnx").
RerankerSettings = Annotated[
    HttpRerankerConfig | OnnxRerankerConfig,
    Field(discriminator="kind"),
    missing_kind(None, HttpRerankerConfig, OnnxRerankerConfig),
]


#: A connection's age before the server asks its client to reconnect, with several server
#: processes: long enough that reconnecting costs nothing measurable (a TCP and HTTP/2
#: handshake, or a TLS one, per client every 30 s), short enough that a long-lived client's
#: process is drawn again within a minute.
DEFAULT_MAX_CONNECTION_AGE_S = 30.0


class GrpcSettings(BaseModel):
    """Where and how the gRPC server listens."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    host: str = "127.0.0.1"
    port: int = Field(default=50051, ge=0, le=65535)
    workers: int = Field(default=4, ge=1, description="Threads running the blocking stages.")
    processes: int = Field(
        default=1,
        ge=1,
        le=64,
        description="Server processes sharing the port (SO_REUSEPORT). Above 1, an embedded "
        "store is opened by a parent process and served to them; size it to the cores.",
    )
    max_concurrent_rpcs: int = Field(
        default=1024,
        ge=1,
        description="Hard cap of calls the gRPC server holds at once, refused by gRPC before "
        "the tenant is known; fair per-tenant admission (admission.*) works below it.",
    )
    tls_cert_file: Path | None = None
    tls_key_file: Path | None = None
    tls_client_ca_file: Path | None = Field(
        default=None, description="Require client certificates signed by this CA (mTLS)."
    )
    grace_s: float = Field(default=10.0, ge=0, description="Drain time on SIGTERM.")
    max_connection_age_s: float | None = Field(
        default=None,
        ge=0,
        description="Close a client connection after this age (+-10% jitter; GOAWAY: the "
        "client reconnects, the kernel picks a server process again). Unset: "
        f"{DEFAULT_MAX_CONNECTION_AGE_S:g} s when processes > 1, never with one; 0: never.",
    )
    max_connection_age_grace_s: float = Field(
        default=30.0,
        gt=0,
        description="Time the calls in flight on an aged connection get to finish before it "
        "is closed.",
    )

    def connection_age_s(self) -> float | None:
        """The age after which a connection is closed, None for never: the kernel spreads
        connections, not calls, over the server processes, so a long-lived client keeps its
        process until its connection ends (docs/decisions/retrieve-processes.md)."""
        if self.max_connection_age_s is None:
            return DEFAULT_MAX_CONNECTION_AGE_S if self.processes > 1 else None
        return self.max_connection_age_s or None


class AuthSettings(BaseModel):
    """Who a caller is: API tokens (hashed here) or an mTLS identity, mapped to a tenant
    (retrieval_api/auth.py)."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    tokens: Mapping[str, str | list[str | dict[str, str]]] = Field(
        default_factory=dict,
        description="tenant -> sha256 hex of its API token, or a list of them (each a hex "
        'digest or {"sha256": hex, "expires_at": RFC 3339}) to rotate without a gap.',
    )
    tokens_file: Path | None = Field(
        default=None,
        description="JSON file of the same shape (merged over `tokens`); reloaded without a "
        "restart when it changes (and on SIGHUP).",
    )
    mtls_tenants: dict[str, str] = Field(
        default_factory=dict, description="client certificate common name -> tenant."
    )
    mtls_file: Path | None = Field(
        default=None,
        description="JSON file {common name: tenant} (merged over `mtls_tenants`); reloaded "
        "like the tokens file.",
    )
    reload_interval_s: float = Field(
        default=2.0,
        gt=0,
        description="How often the tokens, mTLS and quotas files are checked for changes.",
    )
    max_failures: int = Field(
        default=10,
        ge=1,
        description="Failed authentications from one peer address within failure_window_s "
        "that block it for block_s.",
    )
    failure_window_s: float = Field(default=60.0, gt=0)
    block_s: float = Field(
        default=30.0, gt=0, description="How long a blocked peer's calls are refused."
    )


class RetrieveSettings(ServiceSettings):
    """Everything the Retrieve server (`ragstream serve`) reads from its environment."""

    grpc: GrpcSettings = Field(default_factory=GrpcSettings)
    auth: AuthSettings = Field(default_factory=AuthSettings)
    admission: AdmissionSettings = Field(default_factory=AdmissionSettings)
    retrieval: RetrievalConfig = Field(default_factory=RetrievalConfig)
    reranker: RerankerSettings | None = Field(
        default=None, description="Used when retrieval.rerank_enabled is set (required then)."
    )
    publish_enabled: bool = Field(
        default=True, description="Publish audit records and reindex requests to Kafka."
    )
    publish: PublishSettings = Field(
        default_factory=PublishSettings,
        description="Bounds on each tenant's undelivered audit records and reindex requests.",
    )
    audit_topic: str = "ragstream.audit"
    reindex_topic: str = "ragstream.reindex-requests"
    audit_hmac_key: SecretStr | None = Field(
        default=None, description="Key for the audit query fingerprint (HMAC-SHA256)."
    )
    health_check_interval_s: float = Field(default=10.0, gt=0)
    model_check_interval_s: float = Field(
        default=60.0,
        ge=0,
        description="How often the health check verifies that every tenant's active index "
        "can be searched with a configured model (it reads every manifest).",
    )
    metrics_port: int = Field(default=9465, ge=0, le=65535)

    @model_validator(mode="after")
    def _deferred_refusals_fit_under_grpc_cap(self) -> RetrieveSettings:
        # a deferred refusal holds a gRPC call: with gRPC's hard cap full of them, gRPC would
        # refuse every other tenant's call before the tenant is known. Leave room for the
        # admitted calls (fewer than 2 x max_in_flight: the cap is soft by the fair shares).
        a, cap = self.admission, self.grpc.max_concurrent_rpcs
        if a.enabled and a.defer_s > 0 and a.defer_max_total + 2 * a.max_in_flight > cap:
            raise ValueError(
                f"admission.defer_max_total ({a.defer_max_total}) + 2 x admission.max_in_flight "
                f"({a.max_in_flight}) must not exceed grpc.max_concurrent_rpcs ({cap}): "
                "deferred refusals hold gRPC calls"
            )
        return self
