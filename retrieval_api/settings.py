"""Settings of the Retrieve server (`RAGSTREAM_` prefix, `__` nesting; see README)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Annotated

from pydantic import BaseModel, ConfigDict, Field, SecretStr

from ragcore.errors import ConfigError
from ragcore.rerankers.http import HttpRerankerConfig
from ragcore.rerankers.onnx_cross_encoder import OnnxRerankerConfig
from ragcore.settings import ServiceSettings
from retrieval_api.config import RetrievalConfig

#: The reranker stage's adapter, told apart by `kind` ("http" | "onnx").
RerankerSettings = Annotated[HttpRerankerConfig | OnnxRerankerConfig, Field(discriminator="kind")]


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
    max_concurrent_rpcs: int = Field(default=64, ge=1)
    tls_cert_file: Path | None = None
    tls_key_file: Path | None = None
    tls_client_ca_file: Path | None = Field(
        default=None, description="Require client certificates signed by this CA (mTLS)."
    )
    grace_s: float = Field(default=10.0, ge=0, description="Drain time on SIGTERM.")


class AuthSettings(BaseModel):
    """Who a caller is: an API token (hashed here) or an mTLS identity, mapped to a tenant."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    tokens: dict[str, str] = Field(
        default_factory=dict, description="tenant -> sha256 hex of its API token."
    )
    tokens_file: Path | None = Field(
        default=None, description="JSON file {tenant: sha256 hex} (merged with `tokens`)."
    )
    mtls_tenants: dict[str, str] = Field(
        default_factory=dict, description="client certificate common name -> tenant."
    )

    def token_hashes(self) -> dict[str, str]:
        """sha256 hex -> tenant, from `tokens` and `tokens_file`."""
        merged = dict(self.tokens)
        if self.tokens_file is not None:
            try:
                loaded = json.loads(self.tokens_file.read_text())
            except (OSError, json.JSONDecodeError) as exc:
                where = self.tokens_file
                raise ConfigError(f"cannot read auth tokens file {where}: {exc}") from exc
            if not isinstance(loaded, dict):
                raise ConfigError(f"{self.tokens_file}: expected a JSON object tenant -> sha256")
            merged.update({str(k): str(v) for k, v in loaded.items()})
        out: dict[str, str] = {}
        for tenant, raw in merged.items():
            digest = raw.strip().lower()
            if len(digest) != 64 or any(c not in "0123456789abcdef" for c in digest):
                raise ConfigError(f"auth token of tenant {tenant!r} is not a sha256 hex digest")
            out[digest] = tenant
        return out


class RetrieveSettings(ServiceSettings):
    """Everything the Retrieve server (`ragstream serve`) reads from its environment."""

    grpc: GrpcSettings = Field(default_factory=GrpcSettings)
    auth: AuthSettings = Field(default_factory=AuthSettings)
    retrieval: RetrievalConfig = Field(default_factory=RetrievalConfig)
    reranker: RerankerSettings | None = Field(
        default=None, description="Used when retrieval.rerank_enabled is set (required then)."
    )
    publish_enabled: bool = Field(
        default=True, description="Publish audit records and reindex requests to Kafka."
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
