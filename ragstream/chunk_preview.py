"""Chunking preview: normalize and chunk a text exactly as ingest would, without embedding.

Backs the `ragstream chunk-preview` command: a user sees where chunk boundaries fall, each
chunk's token count under the model's tokenizer, its section path and offsets, and for a
document (PDF, DOCX, XLSX, CSV) the page, heading path or sheet and rows it cites.
"""

from __future__ import annotations

from typing import Any

from ragcore.chunking import STRATEGIES, ChunkConfig, chunk_text
from ragcore.documents import ExtractionLimits, Extractor
from ragcore.documents.text import document_text
from ragcore.errors import ConfigError
from ragcore.normalize import NormalizeOptions, normalize
from ragcore.tokenizers import load_token_counter
from schemas.entities import Chunk, ContentFormat, cite

PREVIEW_ENTITY_ID = "preview"


def preview(
    text: str | bytes,
    fmt: ContentFormat,
    *,
    tokenizer_ref: str,
    max_tokens: int,
    overlap_tokens: int | None,
    strategy: str,
    redact_pii: bool,
    entity_id: str = PREVIEW_ENTITY_ID,
    document_name: str | None = None,
    limits: ExtractionLimits | None = None,
) -> dict[str, Any]:
    """Normalize + chunk `text`; a JSON-serializable report of the config used and the chunks.

    A document format (PDF, DOCX, XLSX, CSV) takes the file's bytes: its text is extracted as
    ingest extracts it (sandboxed, within `limits`) and each chunk shows its locator (page,
    heading path, sheet and rows) and citation. `max_tokens` is the chunk budget itself
    (compute it with `chunk_budget` for a model spec); `overlap_tokens` None means the default
    share of it. Raises ConfigError for a bad strategy, budget or tokenizer ref,
    ChunkingError when text cannot fit the budget, DocumentError when a document yields no text.
    """
    if strategy not in STRATEGIES:
        raise ConfigError(f"strategy must be one of {STRATEGIES}, got {strategy!r}")
    config = ChunkConfig(max_tokens=max_tokens, overlap_tokens=overlap_tokens, strategy=strategy)
    counter = load_token_counter(tokenizer_ref)
    options = NormalizeOptions(redact_pii=redact_pii)
    if fmt.is_document:
        if not isinstance(text, bytes):
            raise ConfigError(f"{fmt.value} is a document format: give the file's bytes")
        extractor = Extractor(limits)
        try:
            normalized = document_text(extractor, text, fmt, options)
        finally:
            extractor.close()
    else:
        if isinstance(text, bytes):
            raise ConfigError(f"{fmt.value} is a text format: give text, not bytes")
        normalized = normalize(text, fmt, options)
    chunks = chunk_text(entity_id, normalized, counter, config, fmt, document=document_name)
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
        "chunks": [_chunk_report(chunk) for chunk in chunks],
    }


def _chunk_report(chunk: Chunk) -> dict[str, Any]:
    locator = chunk.locator
    report: dict[str, Any] = {
        "index": chunk.chunk_index,
        "chunk_id": chunk.chunk_id,
        "char_start": locator.char_start,
        "char_end": locator.char_end,
        "section_path": list(locator.section_path),
    }
    if locator.document is not None:
        report["citation"] = cite(locator.section_path, locator.extracted_from)
        report["locator"] = locator.model_dump(
            mode="json", include={"document", "page", "sheet", "rows"}, exclude_none=True
        )
    report["token_count"] = chunk.token_count
    report["text"] = chunk.text
    return report
