"""Entities (what a SoR row means to retrieval) and chunks (what gets embedded and indexed)."""

from __future__ import annotations

from datetime import datetime
from enum import StrEnum
from typing import Any

from pydantic import BaseModel, ConfigDict, Field


class ContentFormat(StrEnum):
    """How an entity's content is written; decides the normalizer."""

    TEXT = "text"
    HTML = "html"
    MARKDOWN = "markdown"


class EntityVersion(BaseModel):
    """How new an entity's row is in the SoR, for ordering events of the same entity.

    Ordering rule (docs/decisions/chunk-ids-and-versions.md): compare `updated_at_us` first, then
    `lsn`; when both are
    equal, a snapshot row never beats a streamed row (a snapshot read may overlap events the
    stream already delivered).
    """

    model_config = ConfigDict(frozen=True)

    updated_at_us: int | None = None  # microseconds since the epoch (UTC)
    lsn: int | None = None
    snapshot: bool = False

    def sort_key(self) -> tuple[int, int, int]:
        """A total order key: greater means newer."""
        return (
            self.updated_at_us if self.updated_at_us is not None else -1,
            self.lsn if self.lsn is not None else -1,
            0 if self.snapshot else 1,
        )

    def is_older_than(self, other: EntityVersion) -> bool:
        """True when this version must not overwrite `other`."""
        return self.sort_key() < other.sort_key()


class Entity(BaseModel):
    """One SoR row mapped to the retrieval domain (see `ragcore.mapping`)."""

    model_config = ConfigDict(frozen=True)

    tenant_id: str
    entity_id: str
    entity_type: str
    title: str = ""
    content: str
    content_format: ContentFormat = ContentFormat.TEXT
    metadata: dict[str, Any] = Field(default_factory=dict)
    content_hash: str  # SHA-256 hex of the normalized content, or the SoR's own column
    version: EntityVersion = Field(default_factory=EntityVersion)
    deleted: bool = False
    created_at: datetime | None = None
    updated_at: datetime | None = None


class Locator(BaseModel):
    """Where a chunk sits in its entity's normalized text: enough to cite it."""

    model_config = ConfigDict(frozen=True)

    chunk_index: int
    char_start: int  # offsets into the normalized text, [start, end)
    char_end: int
    section_path: tuple[str, ...] = ()  # Markdown heading path, outermost first
    extracted_from: str | None = None  # e.g. "html", "markdown"

    def describe(self) -> str:
        """A human-readable citation, e.g. 'Setup > Install, chunk 2 (chars 120-480)'."""
        where = " > ".join(self.section_path)
        prefix = f"{where}, " if where else ""
        return f"{prefix}chunk {self.chunk_index} (chars {self.char_start}-{self.char_end})"


class Chunk(BaseModel):
    """A piece of an entity's normalized text sized to the embedder's token budget."""

    model_config = ConfigDict(frozen=True)

    chunk_id: str  # "<entity_id>:chunk:<n>"
    entity_id: str
    chunk_index: int
    text: str
    token_count: int
    locator: Locator

    @staticmethod
    def make_id(entity_id: str, index: int) -> str:
        """The deterministic chunk id of docs/decisions/chunk-ids-and-versions.md."""
        return f"{entity_id}:chunk:{index}"
