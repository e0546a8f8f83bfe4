"""Service settings: pydantic-settings with the `RAGSTREAM_` prefix and `__` for nesting.

Examples: `RAGSTREAM_KAFKA__BOOTSTRAP_SERVERS=kafka:9092`,
`RAGSTREAM_STORE__BACKEND=qdrant`, `RAGSTREAM_STORE__URL=http://qdrant:6334`,
`RAGSTREAM_EMBEDDER__KIND=openai`, `RAGSTREAM_EMBEDDER__API_KEY_FILE=/run/secrets/key`.
Secrets are `SecretStr` (masked in `repr` and logs). The README's environment table lists
every variable; `ragstream config` prints the effective settings with secrets masked.
"""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, SecretStr
from pydantic_settings import BaseSettings, SettingsConfigDict

from ragstream.embedders.cache import EmbeddingCacheConfig
from ragstream.embedders.local_onnx import LocalEmbedderConfig
from ragstream.embedders.openai_http import OpenAIEmbedderConfig
from ragstream.kafka_config import MASK, KafkaSettings, is_secret_key
from streams.consumer import ConsumerConfig
from streams.plan import PlanConfig
from streams.prepare import ChunkingSettings

EmbedderSettings = Annotated[
    LocalEmbedderConfig | OpenAIEmbedderConfig, Field(discriminator="kind")
]


class StoreSettings(BaseModel):
    """Where vectors live: qdrant-edge shards on disk (embedded) or a Qdrant server."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    backend: Literal["edge", "qdrant"] = "edge"
    data_dir: Path = Field(
        default=Path("data/store"), description="edge: shards and the index registry."
    )
    url: str | None = Field(default=None, description="qdrant: e.g. http://qdrant:6333.")
    api_key: SecretStr | None = None
    prefer_grpc: bool = True
    timeout_s: float = Field(default=10.0, gt=0)


class SorSettings(BaseModel):
    """The system of record Retrieve verifies against and ingest re-reads from. Its tables
    are the mapped ones (`plan.tables`)."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    kind: Literal["none", "postgres", "sqlite"] = "none"
    dsn: SecretStr | None = Field(default=None, description="postgres: libpq DSN (masked).")
    sqlite_path: Path | None = None


class DecodeSettings(BaseModel):
    """Change-event decoding choices."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    envelope: Literal["debezium", "unwrapped"] = "debezium"
    heartbeat_topic_prefix: str = "__debezium-heartbeat"
    max_record_bytes: int = Field(default=4 * 1024 * 1024, gt=0)


class ReconcileSettings(BaseModel):
    """The worker's scheduled reconciliation (needs a SoR; see `streams.reconcile`)."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    interval_s: float = Field(
        default=3600.0,
        ge=0,
        description="Seconds between runs (first run after one interval); 0 = off.",
    )
    repair: bool = Field(default=True, description="Re-read drifted entities from the SoR.")


class IngestSettings(BaseSettings):
    """Everything the ingest worker (`ragstream ingest`) reads from its environment."""

    model_config = SettingsConfigDict(
        env_prefix="RAGSTREAM_", env_nested_delimiter="__", extra="ignore", frozen=True
    )

    kafka: KafkaSettings = Field(default_factory=KafkaSettings)
    consumer: ConsumerConfig = Field(default_factory=ConsumerConfig)
    decode: DecodeSettings = Field(default_factory=DecodeSettings)
    plan: PlanConfig = Field(default_factory=PlanConfig)
    chunking: ChunkingSettings = Field(default_factory=ChunkingSettings)
    embedder: EmbedderSettings = Field(default_factory=LocalEmbedderConfig)
    next_embedder: EmbedderSettings | None = Field(
        default=None,
        description=(
            "During a model change: the model `ragstream reindex --model` builds with; the "
            "worker also writes live changes to versions built with it."
        ),
    )
    embedding_cache: EmbeddingCacheConfig | None = Field(
        default_factory=lambda: EmbeddingCacheConfig(path=Path("data/embedding-cache.sqlite"))
    )
    store: StoreSettings = Field(default_factory=StoreSettings)
    sor: SorSettings = Field(default_factory=SorSettings)
    reconcile: ReconcileSettings = Field(default_factory=ReconcileSettings)
    metrics_host: str = "127.0.0.1"
    metrics_port: int = Field(default=9464, ge=0, le=65535)


def masked(value: Any) -> Any:
    """A JSON-ready settings dump with every secret masked: `SecretStr` fields (pydantic dumps
    them masked) and any text under a secret-looking key (librdkafka properties in
    `kafka.extra`, header maps...)."""
    if isinstance(value, dict):
        return {
            k: MASK if isinstance(v, str) and is_secret_key(k) else masked(v)
            for k, v in value.items()
        }
    if isinstance(value, list):
        return [masked(v) for v in value]
    return value


def settings_report(settings: BaseModel) -> dict[str, Any]:
    """The effective settings as JSON, secrets masked (`ragstream config`)."""
    report: dict[str, Any] = masked(settings.model_dump(mode="json"))
    return report
