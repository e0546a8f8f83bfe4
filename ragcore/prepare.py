"""Normalize and chunk entities with the embedder's own tokenizer and budget.

One `Preparer` per embedding spec serves the planner (content hash of the normalized text when
the SoR has no hash column), the worker (chunks), the SoR verifier (the same hash) and the
`inspect-event` command, so all of them agree byte for byte.
"""

from __future__ import annotations

import threading
import time
from collections import OrderedDict
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field

from ragcore.chunking import ChunkConfig, chunk_text
from ragcore.documents import (
    DOCUMENT_NAME,
    ExtractionLimits,
    Extractor,
    decode_document,
    document_sha256,
)
from ragcore.documents.text import document_text
from ragcore.embedders.spec import EmbeddingSpec
from ragcore.errors import DocumentError
from ragcore.normalize import (
    NormalizedText,
    NormalizeOptions,
    content_sha256,
    normalize,
)
from ragcore.tokenizers import TokenCounter, chunk_budget, load_token_counter
from schemas.entities import Chunk, ContentFormat, Entity


class ChunkingSettings(BaseModel):
    """Chunking and normalization choices (the token budget defaults to the model's limit)."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    max_tokens: int | None = Field(
        default=None, gt=0, description="Chunk budget; capped by the embedding model's limit."
    )
    overlap_tokens: int | None = Field(default=None, ge=0)
    strategy: Literal["sentence", "paragraph"] = "sentence"
    redact_pii: bool = False
    documents: ExtractionLimits = Field(
        default_factory=ExtractionLimits,
        description="Limits of text extraction from PDF, DOCX and spreadsheet documents.",
    )


class Preparer:
    """Normalization, hashing and chunking for one embedding spec (thread-safe)."""

    def __init__(self, spec: EmbeddingSpec, settings: ChunkingSettings | None = None) -> None:
        self.spec = spec
        self.settings = settings or ChunkingSettings()
        self.counter: TokenCounter = load_token_counter(spec.tokenizer)
        self.budget = chunk_budget(spec, self.counter, self.settings.max_tokens)
        self.config = ChunkConfig(
            max_tokens=self.budget,
            overlap_tokens=self.settings.overlap_tokens,
            strategy=self.settings.strategy,
        )
        self._options = NormalizeOptions(redact_pii=self.settings.redact_pii)
        # The planner hashes and the worker chunks the same content moments apart.
        self._recent: OrderedDict[tuple[str, ContentFormat], NormalizedText] = OrderedDict()
        self._lock = threading.Lock()
        # Documents by file hash (their content is the whole file: few are kept), with the
        # failure of one that cannot be extracted, so a batch's prime and chunk passes extract
        # (or time out on) it once.
        self._documents: OrderedDict[tuple[str, ContentFormat], NormalizedText | DocumentError]
        self._documents = OrderedDict()
        self._extractor: Extractor | None = None  # its child process starts at the first one
        self.extraction = ExtractionStats()

    def normalized(self, content: str, fmt: ContentFormat) -> NormalizedText:
        """The normalized text of `content` (memoized for the last few hundred contents).

        A document (PDF, DOCX, ...) is extracted first; DocumentError when it cannot be.
        """
        if fmt.is_document:
            return self._document(content, fmt)
        key = (content, fmt)
        with self._lock:
            hit = self._recent.get(key)
            if hit is not None:
                self._recent.move_to_end(key)
                return hit
        result = normalize(content, fmt, self._options)
        with self._lock:
            self._recent[key] = result
            while len(self._recent) > 512:
                self._recent.popitem(last=False)
        return result

    def prime(self, entities: Sequence[Entity]) -> None:
        """Tokenize the normalized content of `entities` in one parallel batch before they are
        chunked one by one (the chunker's token counts then come from it)."""
        texts: list[str] = []
        for entity in entities:
            try:
                texts.append(self.normalized(entity.content, entity.content_format).text)
            except DocumentError:
                continue  # raised again, from the cache, when the entity is chunked
        self.counter.prime(texts)

    def content_hash(self, content: str, fmt: ContentFormat) -> str:
        """SHA-256 hex of the normalized content (a `ragcore.plan.ContentHasher`); of a
        document, of the file's bytes (no extraction: Retrieve's verification calls this)."""
        if fmt.is_document:
            return document_sha256(content)
        return content_sha256(self.normalized(content, fmt).text)

    def chunks(self, entity: Entity) -> list[Chunk]:
        """The entity's chunks; [] when its normalized content is empty. A document's chunks
        cite its file name (`metadata["document_name"]`) and page, section or rows."""
        text = self.normalized(entity.content, entity.content_format)
        name = entity.metadata.get(DOCUMENT_NAME) if entity.content_format.is_document else None
        return chunk_text(
            entity.entity_id,
            text,
            self.counter,
            self.config,
            entity.content_format,
            document=str(name) if name else f"{entity.entity_id}.{entity.content_format.value}",
        )

    def close(self) -> None:
        """Stop the extraction child process, if one runs."""
        if self._extractor is not None:
            self._extractor.close()

    def _document(self, content: str, fmt: ContentFormat) -> NormalizedText:
        key = (document_sha256(content), fmt)
        with self._lock:
            hit = self._documents.get(key)
            if hit is not None:
                self._documents.move_to_end(key)
        if hit is None:
            hit = self._extract(content, fmt)
            with self._lock:
                self._documents[key] = hit
                while len(self._documents) > 16:
                    self._documents.popitem(last=False)
        if isinstance(hit, DocumentError):
            raise hit
        return hit

    def _extract(self, content: str, fmt: ContentFormat) -> NormalizedText | DocumentError:
        with self._lock:
            if self._extractor is None:
                self._extractor = Extractor(self.settings.documents)
            extractor = self._extractor
        data = decode_document(content)
        started = time.perf_counter()
        try:
            text = document_text(extractor, data, fmt, self._options)
        except DocumentError as exc:
            self.extraction.failed += 1
            return exc
        finally:
            self.extraction.seconds += time.perf_counter() - started
        self.extraction.documents += 1
        self.extraction.pages += text.pages
        return text


@dataclass
class ExtractionStats:
    """Documents extracted by a `Preparer` so far (bench and CLI read it)."""

    documents: int = 0
    pages: int = 0
    failed: int = 0
    seconds: float = 0.0
