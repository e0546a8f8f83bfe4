"""A document's bytes to the normalized, located text the chunker splits."""

from __future__ import annotations

from ragcore.documents.sandbox import Extractor
from ragcore.normalize import NormalizedText, NormalizeOptions, TextSegment, normalize_segments
from schemas.entities import ContentFormat


def document_text(
    extractor: Extractor, data: bytes, fmt: ContentFormat, options: NormalizeOptions
) -> NormalizedText:
    """Extract `data` (sandboxed) and normalize each segment as text; DocumentError when the
    document yields no text."""
    document = extractor.extract(fmt.value, data)
    parts = [
        (s.text, TextSegment(0, 0, s.path, s.page, s.sheet, s.rows)) for s in document.segments
    ]
    return normalize_segments(parts, fmt, options, original_length=len(data), pages=document.pages)
