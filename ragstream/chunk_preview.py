"""Chunking preview: normalize and chunk a text exactly as ingest would, without embedding.

Backs the `ragstream chunk-preview` command: a user sees where chunk boundaries fall, each
chunk's token count under the model's tokenizer, its section path and offsets.
"""

from __future__ import annotations

from typing import Any

from ragcore.chunking import STRATEGIES, ChunkConfig, chunk_text
from ragcore.errors import ConfigError
from ragcore.normalize import NormalizeOptions, normalize
from ragcore.tokenizers import load_token_counter
from schemas.entities import ContentFormat

PREVIEW_ENTITY_ID = "preview"


def preview(
    text: str,
    fmt: ContentFormat,
    *,
    tokenizer_ref: str,
    max_tokens: int,
    overlap_tokens: int | None,
    strategy: str,
    redact_pii: bool,
    entity_id: str = PREVIEW_ENTITY_ID,
) -> dict[str, Any]:
    """Normalize + chunk `text`; a JSON-serializable report of the config used and the chunks.

    `max_tokens` is the chunk budget itself (compute it with `chunk_budget` for a model spec);
    `overlap_tokens` None means the default share of it. Raises ConfigError for a bad strategy,
    budget or tokenizer ref, ChunkingError when text cannot fit the budget.
    """
    if strategy not in STRATEGIES:
        raise ConfigError(f"strategy must be one of {STRATEGIES}, got {strategy!r}")
    config = ChunkConfig(max_tokens=max_tokens, overlap_tokens=overlap_tokens, strategy=strategy)
    counter = load_token_counter(tokenizer_ref)
    normalized = normalize(text, fmt, NormalizeOptions(redact_pii=redact_pii))
    chunks = chunk_text(entity_id, normalized, counter, config, fmt)
    return {
        "config": {
            "tokenizer": tokenizer_ref,
            "format": fmt.value,
            "max_tokens": config.max_tokens,
            "overlap_tokens": config.effective_overlap_tokens,
            "strategy": config.strategy,
            "redact_pii": redact_pii,
        },
        "normalized": {
            **normalized.metadata(),
            "sha256": normalized.sha256,
        },
        "chunk_count": len(chunks),
        "chunks": [
            {
                "index": chunk.chunk_index,
                "chunk_id": chunk.chunk_id,
                "char_start": chunk.locator.char_start,
                "char_end": chunk.locator.char_end,
                "section_path": list(chunk.locator.section_path),
                "token_count": chunk.token_count,
                "text": chunk.text,
            }
            for chunk in chunks
        ],
    }
