"""Normalize and chunk entities with the embedder's own tokenizer and budget.

One `Preparer` per embedding spec serves the planner (content hash of the normalized text when
the SoR has no hash column), the worker (chunks), the SoR verifier (the same hash) and the
`inspect-event` command, so all of them agree byte for byte.
"""

from __future__ import annotations

import threading
from collections import OrderedDict
from collections.abc import Sequence
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field

from ragcore.chunking import ChunkConfig, chunk_text
from ragcore.embedders.spec import EmbeddingSpec
from ragcore.normalize import NormalizedText, NormalizeOptions, content_sha256, normalize
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

    def normalized(self, content: str, fmt: ContentFormat) -> NormalizedText:
        """The normalized text of `content` (memoized for the last few hundred contents)."""
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
        self.counter.prime([self.normalized(e.content, e.content_format).text for e in entities])

    def content_hash(self, content: str, fmt: ContentFormat) -> str:
        """SHA-256 hex of the normalized content (a `ragcore.plan.ContentHasher`)."""
        return content_sha256(self.normalized(content, fmt).text)

    def chunks(self, entity: Entity) -> list[Chunk]:
        """The entity's chunks; [] when its normalized content is empty."""
        text = self.normalized(entity.content, entity.content_format)
        return chunk_text(entity.entity_id, text, self.counter, self.config, entity.content_format)
