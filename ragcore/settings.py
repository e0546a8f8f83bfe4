"""Service settings: pydantic-settings with the `RAGSTREAM_` prefix and `__` for nesting.

Examples: `RAGSTREAM_KAFKA__BOOTSTRAP_SERVERS=kafka:9092`,
`RAGSTREAM_STORE__BACKEND=qdrant`, `RAGSTREAM_STORE__URL=http://qdrant:6334`,
`RAGSTREAM_EMBEDDER__KIND=openai`, `RAGSTREAM_EMBEDDER__API_KEY_FILE=/run/secrets/key`.
Secrets are `SecretStr` (masked in `repr` and logs). The README's environment table lists
every variable; `ragstream config` prints the effective settings with secrets masked.
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, SecretStr
from pydantic_settings import BaseSettings, SettingsConfigDict

from ragcore.embedders.local_onnx import LocalEmbedderConfig
from ragcore.embedders.openai_http import OpenAIEmbedderConfig
from ragcore.kafka_config import MASK, KafkaSettings, is_secret_key
from ragcore.kinds import missing_kind
from ragcore.plan import PlanConfig
from ragcore.prepare import ChunkingSettings
from ragcore.store.base import Placement

#: The embedder's adapter, told apart by `kind`; without one, the local embedder (so
#: `RAGSTREAM_EMBEDDER__EXECUTION=int8` alone configures the default embedder).
EmbedderSettings = Annotated[
    LocalEmbedderConfig | OpenAIEmbedderConfig,
    Field(discriminator="kind"),
    missing_kind("local", LocalEmbedderConfig, OpenAIEmbedderConfig),
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
    edge_payload_in_ram: bool = Field(
        default=True,
        description="edge: keep each collection's payload pages in memory (at least 32 MiB per "
        "open collection); false for many small tenants (~1 MiB each, payloads read through "
        "the page cache).",
    )
    edge_search_threads: int | None = Field(
        default=None,
        ge=1,
        description="edge: search threads per open collection (each starts its own pool; "
        "default: the engine's, 8 here); 1 for many small tenants.",
    )
    new_tenants: Placement | None = Field(
        default=None,
        description="Placement of a tenant's first version: shared (a partition of one "
        "collection shared by small tenants; the default) or dedicated (its own collection).",
    )
    dedicated_above_points: int = Field(
        default=100_000,
        ge=1,
        description="A shared tenant above this many points is due for promotion to its own "
        "collection (`ragstream index placement`; `ragstream reindex --placement auto` "
        "promotes it).",
    )

    @property
    def placement_for_new_tenants(self) -> Placement:
        """Where a tenant's first version goes."""
        return self.new_tenants or "shared"


class SorSettings(BaseModel):
    """The system of record Retrieve verifies against and ingest re-reads from. Its tables
    are the mapped ones (`plan.tables`)."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    kind: Literal["none", "postgres", "sqlite"] = "none"
    dsn: SecretStr | None = Field(default=None, description="postgres: libpq DSN (masked).")
    sqlite_path: Path | None = None


class ServiceSettings(BaseSettings):
    """What both services read from their environment (`RAGSTREAM_` prefix, `__` nesting): the
    broker, the table mapping, chunking, the embedder(s), the store, the SoR and the metrics
    endpoint. `streams.settings.IngestSettings` and `retrieval_api.settings.RetrieveSettings`
    add their own."""

    model_config = SettingsConfigDict(
        env_prefix="RAGSTREAM_", env_nested_delimiter="__", extra="ignore", frozen=True
    )

    kafka: KafkaSettings = Field(default_factory=KafkaSettings)
    plan: PlanConfig = Field(default_factory=PlanConfig)
    chunking: ChunkingSettings = Field(default_factory=ChunkingSettings)
    embedder: EmbedderSettings = Field(default_factory=LocalEmbedderConfig)
    next_embedder: EmbedderSettings | None = Field(
        default=None,
        description=(
            "During a model change: the other model. `ragstream reindex --model` builds with "
            "it, the worker also writes live changes to versions built with it, and Retrieve "
            "can search versions built with either."
        ),
    )
    store: StoreSettings = Field(default_factory=StoreSettings)
    sor: SorSettings = Field(default_factory=SorSettings)
    metrics_host: str = "127.0.0.1"
    metrics_port: int = Field(default=9464, ge=0, le=65535)


def masked(dumped: Any, value: Any = None) -> Any:
    """A JSON-ready settings dump (`dumped`, of the settings object `value`) with every secret
    masked and nothing else: `SecretStr` fields (pydantic dumps them masked) and, in free-form
    maps whose keys are not ours (librdkafka properties in `kafka.extra`, header maps...), text
    under a secret-looking key. A model field is never masked for its name alone
    (`format_metadata_key` is a column name, not a key)."""
    if isinstance(dumped, dict):
        if isinstance(value, BaseModel):
            return {k: masked(v, getattr(value, k, None)) for k, v in dumped.items()}
        inner = value if isinstance(value, Mapping) else {}
        return {
            k: MASK if isinstance(v, str) and is_secret_key(str(k)) else masked(v, inner.get(k))
            for k, v in dumped.items()
        }
    if isinstance(dumped, list):
        items = list(value) if isinstance(value, list | tuple) else [None] * len(dumped)
        return [masked(d, v) for d, v in zip(dumped, items, strict=False)]
    return dumped


def settings_report(settings: BaseModel) -> dict[str, Any]:
    """The effective settings as JSON, secrets masked (`ragstream config`)."""
    report: dict[str, Any] = masked(settings.model_dump(mode="json"), settings)
    return report
