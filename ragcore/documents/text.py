"""A document's bytes to the normalized, located text the chunker splits."""

from __future__ import annotations

from ragcore.documents.sandbox import Extractor
from ragcore.errors import DocumentError
from ragcore.normalize import NormalizedText, NormalizeOptions, TextSegment, normalize_segments
from schemas.entities import ContentFormat


def document_text(
    extractor: Extractor, data: bytes, fmt: ContentFormat, options: NormalizeOptions
) -> NormalizedText:
    """Extract `data` (sandboxed) and normalize each segment as text; DocumentError when the
    document yields no text (NO_TEXT_LAYER also when its text is only characters the
    normalizer removes, such as control characters)."""
    document = extractor.extract(fmt.value, data)
    parts = [
        (s.text, TextSegment(0, 0, s.path, s.page, s.sheet, s.rows)) for s in document.segments
    ]
    text = normalize_segments(parts, fmt, options, original_length=len(data), pages=document.pages)
    if not text.text.strip():
        # extraction kept segments that are not blank (`\x01` is no whitespace) but hold no
        # character the index keeps: as empty as a scan, and said the same way
        raise DocumentError(
            "NO_TEXT_LAYER", f"{fmt.value}: the document's text is only control characters"
        )
    return text
