"""Settings of the ingest worker: the shared service settings (`ragcore.settings`) plus the
consumer, decoding, the embedding cache and scheduled reconciliation."""

from __future__ import annotations

from pathlib import Path
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field

from ragcore.calibration_state import DEFAULT_STALE_RATIO
from ragcore.embedders.cache import EmbeddingCacheConfig
from ragcore.settings import ServiceSettings
from streams.consumer import ConsumerConfig
from streams.decode import DecodeOptions
from streams.liveness import LivenessSettings


class DecodeSettings(BaseModel):
    """Change-event decoding choices."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    envelope: Literal["debezium", "unwrapped"] = "debezium"
    heartbeat_topic_prefix: str = "__debezium-heartbeat"
    max_record_bytes: int = Field(default=4 * 1024 * 1024, gt=0)

    def options(self) -> DecodeOptions:
        """The decoder's options."""
        return DecodeOptions(
            envelope=self.envelope,
            heartbeat_topic_prefix=self.heartbeat_topic_prefix,
            max_record_bytes=self.max_record_bytes,
        )


class ReconcileSettings(BaseModel):
    """The worker's scheduled reconciliation (needs a SoR; see `streams.reconcile`)."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    interval_s: float = Field(
        default=3600.0,
        ge=0,
        description="Seconds between runs (first run after one interval); 0 = off.",
    )
    repair: bool = Field(default=True, description="Re-read drifted entities from the SoR.")
    calibration_stale_ratio: float = Field(
        default=DEFAULT_STALE_RATIO,
        gt=0,
        description="A version's evidence calibration counts as stale (gauge "
        "`ragstream_tenants_calibration`) once its chunk count moved by more than this share "
        "of the chunks it was fitted on.",
    )


class IngestSettings(ServiceSettings):
    """Everything the ingest worker (`ragstream ingest`) reads from its environment."""

    consumer: ConsumerConfig = Field(default_factory=ConsumerConfig)
    decode: DecodeSettings = Field(default_factory=DecodeSettings)
    embedding_cache: EmbeddingCacheConfig | None = Field(
        default_factory=lambda: EmbeddingCacheConfig(path=Path("data/embedding-cache.sqlite"))
    )
    reconcile: ReconcileSettings = Field(default_factory=ReconcileSettings)
    liveness: LivenessSettings = Field(default_factory=LivenessSettings)
