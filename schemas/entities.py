"""Entities (what a SoR row means to retrieval) and chunks (what gets embedded and indexed)."""

from __future__ import annotations

from collections.abc import Sequence
from datetime import datetime
from enum import StrEnum
from typing import Any

from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    SerializerFunctionWrapHandler,
    model_serializer,
)


class ContentFormat(StrEnum):
    """How an entity's content is written; decides the normalizer."""

    TEXT = "text"
    HTML = "html"
    MARKDOWN = "markdown"
    # Documents (`ragcore.documents`): the content is the file's bytes, base64-encoded; text is
    # extracted from it before chunking.
    PDF = "pdf"
    DOCX = "docx"
    XLSX = "xlsx"
    CSV = "csv"

    @property
    def is_document(self) -> bool:
        """True for file formats whose text is extracted (not normalized as written)."""
        return self in _DOCUMENT_FORMATS


_DOCUMENT_FORMATS = frozenset(
    {ContentFormat.PDF, ContentFormat.DOCX, ContentFormat.XLSX, ContentFormat.CSV}
)


class EntityVersion(BaseModel):
    """Where an entity's row stands in the SoR's history, for ordering changes of one entity.

    The ordering rule (docs/decisions/change-ordering.md): changes are ordered by the database's
    commit order as Debezium delivers it, i.e. by their source position (`lsn`), never by an
    application clock. `updated_at_us` breaks the tie only between two versions that both lack
    a source position. A re-read of the SoR is not ordered by this rule: it is the truth at the
    time of the read (`streams.ingest.resolve`).
    """

    model_config = ConfigDict(frozen=True)

    updated_at_us: int | None = None  # microseconds since the epoch (UTC)
    lsn: int | None = None
    snapshot: bool = False

    def is_older_than(self, other: EntityVersion) -> bool:
        """True only when `other` is known to come later in the SoR's commit order: this
        version must not overwrite it.

        Both with a source position: the lower LSN is older; at the same LSN a snapshot row
        loses to a streamed one (a snapshot read may overlap what the stream delivered). Both
        without one: `updated_at` decides when both have it, then the snapshot flag. One with
        and one without: nothing is known, and missing information never proves a version
        older (it is applied; Retrieve's SoR check and reconcile catch what is stale).
        """
        if self.lsn is not None and other.lsn is not None:
            if self.lsn != other.lsn:
                return self.lsn < other.lsn
            return self.snapshot and not other.snapshot
        if self.lsn is not None or other.lsn is not None:
            return False
        a, b = self.updated_at_us, other.updated_at_us
        if a is not None and b is not None and a != b:
            return a < b
        return self.snapshot and not other.snapshot


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
    extracted_from: str | None = None  # e.g. "html", "markdown", "pdf"
    # Documents only (None otherwise): the file's name, the PDF page, the spreadsheet's sheet and
    # its rows [first, last] (1-based, as the spreadsheet numbers them). A DOCX heading path is
    # `section_path`. For documents `section_path` starts with the file name and ends with the
    # page or rows (`("contract.pdf", "p. 3")`), so the evidence pack's locator can cite it.
    document: str | None = None
    page: int | None = None
    sheet: str | None = None
    rows: tuple[int, int] | None = None

    @model_serializer(mode="wrap")
    def _drop_unset_document_fields(self, handler: SerializerFunctionWrapHandler) -> Any:
        # text chunks keep the payload they always had: the document fields only when set
        data = handler(self)
        if isinstance(data, dict):
            for key in _DOCUMENT_LOCATOR_FIELDS:
                if data.get(key) is None:
                    data.pop(key, None)
        return data

    def describe(self) -> str:
        """A human-readable citation, e.g. 'Setup > Install, chunk 2 (chars 120-480)', or for a
        document 'contract.pdf p. 3, chunk 4 (chars ...)'."""
        where = cite(self.section_path, self.extracted_from)
        prefix = f"{where}, " if where else ""
        return f"{prefix}chunk {self.chunk_index} (chars {self.char_start}-{self.char_end})"


_DOCUMENT_LOCATOR_FIELDS = ("document", "page", "sheet", "rows")


def cite(section_path: Sequence[str], extracted_from: str | None) -> str:
    """The citation of a locator's section path: `contract.pdf p. 3`,
    `procedure.docx Safety > Lockout`, `prices.xlsx Prices > rows 2-9`; for text the heading
    path `Setup > Install`."""
    if extracted_from in _DOCUMENT_FORMATS and len(section_path) > 1:
        return f"{section_path[0]} {' > '.join(section_path[1:])}"
    return " > ".join(section_path)


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
