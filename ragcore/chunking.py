"""Split normalized text into chunks sized to the embedder's token budget
(docs/decisions/chunk-size-follows-embedder.md).

Rules:
- The text is cut into paragraphs (blank lines; a Markdown code fence or heading is a paragraph
  of its own) and paragraphs into sentences (a rule-based splitter; list items, table rows and
  code lines are units of their own).
- Whole sentences are packed greedily up to `max_tokens`. A sentence is split only when it alone
  exceeds the budget, then on token boundaries (via the counter), preferring whitespace.
- With the "paragraph" strategy whole paragraphs are packed; a paragraph over the budget falls
  back to its sentences.
- Overlap: a chunk starts with the trailing *whole* sentences of the previous chunk that fit in
  `overlap_tokens` (never its first unit, so chunk starts strictly increase).
- Every chunk is an exact slice of the normalized text (`text[char_start:char_end]`), its
  `token_count` is counted by the counter on that text and is `<= max_tokens`.
- Markdown (and HTML, whose normalizer writes `#` headings): `locator.section_path` is the heading
  path in force at the chunk's start.
- Deterministic: the same input gives the same chunks byte for byte.

Empty or whitespace-only text gives no chunks: the caller decides what an entity without text
means (delete its chunks, skip it, or flag it).
"""

from __future__ import annotations

import bisect
import itertools
import re
from bisect import bisect_left, bisect_right
from dataclasses import dataclass, field
from typing import Literal

from ragcore.errors import ChunkingError, ConfigError
from ragcore.normalize import NormalizedText, TextSegment
from ragcore.tokenizers import TokenCounter
from schemas.entities import Chunk, ContentFormat, Locator

Strategy = Literal["sentence", "paragraph"]
STRATEGIES: tuple[Strategy, ...] = ("sentence", "paragraph")
DEFAULT_OVERLAP_RATIO = 0.15


@dataclass(frozen=True)
class ChunkConfig:
    """How to chunk. `max_tokens` is the budget from `ragcore.tokenizers.chunk_budget`."""

    max_tokens: int
    overlap_tokens: int | None = None  # None: DEFAULT_OVERLAP_RATIO of max_tokens
    strategy: Strategy = "sentence"

    def __post_init__(self) -> None:
        if self.max_tokens <= 0:
            raise ConfigError(f"max_tokens must be positive, got {self.max_tokens}")
        if self.overlap_tokens is not None and not 0 <= self.overlap_tokens < self.max_tokens:
            raise ConfigError(
                f"overlap_tokens must be >= 0 and < max_tokens ({self.max_tokens}), "
                f"got {self.overlap_tokens}"
            )
        if self.strategy not in STRATEGIES:
            raise ConfigError(f"strategy must be one of {STRATEGIES}, got {self.strategy!r}")

    @property
    def effective_overlap_tokens(self) -> int:
        """The overlap in use: the configured one, else 15% of the budget."""
        if self.overlap_tokens is not None:
            return self.overlap_tokens
        return int(self.max_tokens * DEFAULT_OVERLAP_RATIO)


def chunk_text(
    entity_id: str,
    text: NormalizedText | str,
    counter: TokenCounter,
    config: ChunkConfig,
    fmt: ContentFormat,
    *,
    document: str | None = None,
) -> list[Chunk]:
    """Chunk normalized text; `[]` for empty/whitespace text (the caller decides what that means).

    An extracted document (`text.segments`) is chunked segment by segment, so no chunk spans two
    pages, sections or row blocks; each chunk's locator names `document` (the file name) and
    its page, heading path or sheet and rows.

    Raises ChunkingError when not even one character fits the budget (a budget smaller than the
    tokens of a single code point).
    """
    if isinstance(text, NormalizedText):
        body, extracted_from = text.text, text.extracted_from
        if text.segments:
            return _chunk_segments(entity_id, text, counter, config, document or "document")
    else:
        body, extracted_from = text, fmt.value
    if not body.strip():
        return []
    structured = fmt in (ContentFormat.MARKDOWN, ContentFormat.HTML)
    packer = _Packer(body, counter, config)
    spans = None if structured else packer.whole_if_it_fits()
    sections = None
    if spans is None:
        paragraphs = _paragraphs(body, structured=structured, fenced=fmt is ContentFormat.MARKDOWN)
        spans = packer.pack(packer.atoms(paragraphs))
        sections = _SectionIndex(paragraphs) if structured else None
    chunks: list[Chunk] = []
    for start, end, tokens in spans:
        index = len(chunks)
        chunks.append(
            Chunk(
                chunk_id=Chunk.make_id(entity_id, index),
                entity_id=entity_id,
                chunk_index=index,
                text=body[start:end],
                token_count=tokens,
                locator=Locator(
                    chunk_index=index,
                    char_start=start,
                    char_end=end,
                    section_path=sections.path_at(start) if sections else (),
                    extracted_from=extracted_from,
                ),
            )
        )
    return chunks


def _chunk_segments(
    entity_id: str,
    text: NormalizedText,
    counter: TokenCounter,
    config: ChunkConfig,
    document: str,
) -> list[Chunk]:
    chunks: list[Chunk] = []
    for segment in text.segments:
        part = text.text[segment.start : segment.end]
        # where each line of a spreadsheet block starts (a chunk's rows are its lines)
        line_starts = _line_starts(part) if segment.rows else []
        for sub in chunk_text(entity_id, part, counter, config, ContentFormat.TEXT):
            index = len(chunks)
            start = segment.start + sub.locator.char_start
            end = segment.start + sub.locator.char_end
            rows = _rows_of(line_starts, segment, sub.locator.char_start, sub.locator.char_end)
            path = segment.path
            if rows is not None and segment.rows:
                label = f"row {rows[0]}" if rows[0] == rows[1] else f"rows {rows[0]}-{rows[1]}"
                path = (*segment.path[:-1], label)
            chunks.append(
                Chunk(
                    chunk_id=Chunk.make_id(entity_id, index),
                    entity_id=entity_id,
                    chunk_index=index,
                    text=sub.text,
                    token_count=sub.token_count,
                    locator=Locator(
                        chunk_index=index,
                        char_start=start,
                        char_end=end,
                        section_path=(document, *path),
                        extracted_from=text.extracted_from,
                        document=document,
                        page=segment.page,
                        sheet=segment.sheet,
                        rows=rows,
                    ),
                )
            )
    return chunks


def _line_starts(part: str) -> list[int]:
    starts = [0]
    at = part.find("\n")
    while at >= 0:
        starts.append(at + 1)
        at = part.find("\n", at + 1)
    return starts


def _rows_of(
    line_starts: list[int], segment: TextSegment, start: int, end: int
) -> tuple[int, int] | None:
    """The first and last spreadsheet row a chunk covers (one row per line of its segment's
    text, whose lines start at `line_starts`): found by bisection, not by counting the
    newlines before each chunk (a long block of rows has many chunks)."""
    if not segment.rows:
        return None
    if len(line_starts) != len(segment.rows):
        return (min(segment.rows), max(segment.rows))
    first = bisect_right(line_starts, start) - 1
    last = bisect_right(line_starts, max(start, end - 1)) - 1
    return (segment.rows[first], segment.rows[last])


# --- paragraphs --------------------------------------------------------------------------------

_FENCE = re.compile(r"^ {0,3}(`{3,}|~{3,})")
# An ATX heading's opening: `#` to `######`, then a space, a tab or the end of the line.
_ATX_OPEN = re.compile(r" {0,3}(#{1,6})(?![^ \t])")
_SETEXT = re.compile(r"^ {0,3}(=+|-+)[ \t]*$")
# Lines that start a unit of their own: list items, quotes, table rows.
_LINE_UNIT = re.compile(r"^[ \t]*(?:[-*+•]\s|\d{1,3}[.)]\s|>|\|)")


@dataclass(frozen=True)
class _Paragraph:
    start: int
    end: int
    kind: Literal["text", "code", "heading"]
    lines: tuple[tuple[int, int], ...]  # (start, end) of each line, end excluding "\n"
    level: int = 0  # heading level
    title: str = ""  # heading title


def _line_spans(text: str) -> list[tuple[int, int]]:
    spans: list[tuple[int, int]] = []
    pos = 0
    for line in text.split("\n"):
        spans.append((pos, pos + len(line)))
        pos += len(line) + 1
    return spans


def _paragraphs(text: str, *, structured: bool, fenced: bool) -> list[_Paragraph]:
    """Blank-line separated paragraphs; fences and headings are paragraphs of their own."""
    out: list[_Paragraph] = []
    current: list[tuple[int, int]] = []

    def flush() -> None:
        if current:
            out.append(_Paragraph(current[0][0], current[-1][1], "text", tuple(current)))
            current.clear()

    lines = _line_spans(text)
    i = 0
    while i < len(lines):
        start, end = lines[i]
        line = text[start:end]
        if not line.strip():
            flush()
            i += 1
            continue
        fence = _FENCE.match(line) if fenced else None
        if fence:
            flush()
            marker = fence.group(1)
            j = i + 1
            while j < len(lines):
                close = _FENCE.match(text[lines[j][0] : lines[j][1]])
                if close and close.group(1)[0] == marker[0] and len(close.group(1)) >= len(marker):
                    break
                j += 1
            last = min(j, len(lines) - 1)
            code_lines = tuple(s for s in lines[i : last + 1] if text[s[0] : s[1]].strip())
            out.append(_Paragraph(start, lines[last][1], "code", code_lines))
            i = last + 1
            continue
        atx = _atx_heading(line) if structured else None
        if atx:
            flush()
            level, title = atx
            out.append(_Paragraph(start, end, "heading", ((start, end),), level, title))
            i += 1
            continue
        underline = (
            _SETEXT.match(text[lines[i + 1][0] : lines[i + 1][1]])
            if structured and not current and i + 1 < len(lines)
            else None
        )
        if underline and not _LINE_UNIT.match(line):
            level = 1 if underline.group(1)[0] == "=" else 2
            span = ((start, lines[i + 1][1]),)
            out.append(_Paragraph(start, lines[i + 1][1], "heading", span, level, line.strip()))
            i += 2
            continue
        current.append((start, end))
        i += 1
    flush()
    return out


def _atx_heading(line: str) -> tuple[int, str] | None:
    """(level, title) of an ATX heading line (`## Title ##`), None for any other line.

    What `^ {0,3}(#{1,6})(?:[ \\t]+(.*?))?(?:[ \\t]+#+)?[ \\t]*$` matches, its title group
    stripped, in one pass: that pattern tries its tail at every position of the title, each
    try scanning the run of blanks ahead (quadratic in a long run of spaces).
    """
    opening = _ATX_OPEN.match(line)
    if opening is None:
        return None
    level = len(opening.group(1))
    rest = line[opening.end() :]
    title = rest.lstrip(" \t")
    if not title:
        return level, ""
    # the shortest title the tail allows: without trailing blanks, and without a closing
    # sequence (blanks, then #s) unless that would leave no title
    title = title.rstrip(" \t")
    body = title.rstrip("#")
    if body != title and body[-1:] in (" ", "\t"):
        title = body.rstrip(" \t")
    return level, title.strip()


# --- sentences -----------------------------------------------------------------------------------

# Words that end with a period without ending the sentence (compared lower-case, no trailing dot).
ABBREVIATIONS = frozenset(
    {
        "al", "approx", "ave", "blvd", "ca", "cf", "ch", "co", "corp", "dept", "dr", "ed", "eds",
        "eq", "est", "fig", "figs", "gen", "gov", "govt", "inc", "jr", "lt", "ltd", "max", "min",
        "mr", "mrs", "ms", "mt", "no", "nos", "op", "p", "pp", "prof", "ref", "rep", "rev", "sec",
        "sen", "sgt", "sr", "st", "vol", "vols", "vs", "viz",
    }
)  # fmt: skip
# Sentence-final punctuation (with closing quotes/brackets); Latin needs whitespace after it.
# A match never starts inside a run of the marks it starts with (the lookbehinds): such a try
# would fail exactly as the one at the run's start did, and scanning the rest of the run from
# every position of it was quadratic (16k dots: 10 s).
_TERMINATOR = re.compile(
    r"(?:(?<![.!?])[.!?]++|(?<!…)…++)[\"'”’)\]»]*+(?=\s)"
    r"|[。！？]+[\"'”’)\]」』»]*"
    r"|(?<![.!?…])[.!?…]++[\"'”’)\]»]*+$"
)
_VISIBLE = re.compile(r"\S")
_DOTTED_ABBREVIATION = re.compile(r"(?:[A-Za-z]\.)+[A-Za-z]")  # e.g, i.e, U.S, a.m


def _last_word(text: str, begin: int, end: int) -> str:
    """`text[begin:end].rsplit(None, 1)[-1]` ("" when blank), reading back from `end` only."""
    stop = end
    while stop > begin and text[stop - 1].isspace():
        stop -= 1
    start = stop
    while start > begin and not text[start - 1].isspace():
        start -= 1
    return text[start:stop]


def _is_abbreviation(word: str) -> bool:
    word = word.lstrip("([{\"'“‘")
    if not word:
        return False
    if len(word) == 1 and word.isalpha():  # an initial: "J. R. R. Tolkien"
        return True
    return word.lower() in ABBREVIATIONS or bool(_DOTTED_ABBREVIATION.fullmatch(word))


def split_sentences(text: str, start: int = 0, end: int | None = None) -> list[tuple[int, int]]:
    """Sentence spans `(start, end)` of `text[start:end]`, whitespace trimmed.

    Rule-based: a sentence ends at `.`, `!`, `?` or `…` (plus closing quotes/brackets) followed by
    whitespace and a character that is not lower-case, unless the word before a single `.` is an
    abbreviation or an initial; CJK `。！？` end a sentence without whitespace. Decimals, URLs and
    version strings have no whitespace after their dots, so they never end a sentence.
    """
    stop = len(text) if end is None else end
    segment = text[start:stop]
    spans: list[tuple[int, int]] = []
    begin = 0
    for match in _TERMINATOR.finditer(segment):
        cut = match.end()
        if match.group(0)[0] not in "。！？":
            # the next visible character, found without copying the rest of the segment
            after = _VISIBLE.search(segment, cut)
            if after is not None and after.group(0).islower():
                continue
            if match.group(0).rstrip("\"'”’)]»") == "." and _is_abbreviation(
                _last_word(segment, begin, match.start())
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


# --- packing -------------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class _Atom:
    """The smallest unit packed: a sentence (or line), or a piece of an over-long one."""

    start: int
    end: int
    tokens: int  # counted alone
    whole: bool  # False for a piece of a split sentence: never used as overlap
    heading: bool = False


@dataclass
class _Block:
    """Atoms packed together or not at all (a paragraph with the "paragraph" strategy)."""

    atoms: list[int]
    tokens: int  # estimate: atoms alone plus the gaps between them
    heading: bool = False


@dataclass
class _Packer:
    text: str
    counter: TokenCounter
    config: ChunkConfig
    _gap_tokens: dict[str, int] = field(default_factory=dict)
    _atoms: list[_Atom] = field(default_factory=list)
    _starts: list[int] | None = field(default=None, init=False)
    # spans counted alone: a piece of a split sentence is counted when it is cut and again
    # when it is packed
    _alone: dict[tuple[int, int], int] = field(default_factory=dict)

    @property
    def budget(self) -> int:
        return self.config.max_tokens

    def __post_init__(self) -> None:
        self._starts = self.counter.token_starts(self.text)

    def whole_if_it_fits(self) -> list[tuple[int, int, int]] | None:
        """The one chunk of a plain text whose tokens, counted from one encoding, fit the
        budget: what packing its sentences would give (the count of a context-free tokenizer
        is the sum of its parts', so every sentence would fit into one chunk spanning the text
        without its outer whitespace), without splitting it into sentences first. None when
        the counter is not context-free or the text does not fit."""
        if self._starts is None:
            return None
        text = self.text
        start = len(text) - len(text.lstrip())
        end = len(text.rstrip())
        if start >= end:
            return None
        tokens = self.count(start, end)
        return [(start, end, tokens)] if tokens <= self.budget else None

    def count(self, start: int, end: int) -> int:
        """Tokens of `text[start:end]`: from the whole text's token offsets when the counter
        is context-free and the span is bounded by whitespace or the text's ends (a piece cut
        inside a word is tokenized differently alone), else counted alone
        (docs/decisions/cpu-on-the-hot-paths.md)."""
        text = self.text
        if (
            self._starts is None
            or (start > 0 and not text[start - 1].isspace())
            or (end < len(text) and not text[end].isspace())
        ):
            counted = self._alone.get((start, end))
            if counted is None:
                counted = self._alone[start, end] = self.counter.count(text[start:end])
            return counted
        return bisect_left(self._starts, end) - bisect_left(self._starts, start)

    def gap(self, left: int, right: int) -> int:
        """Tokens of the whitespace between two atoms (estimate for packing)."""
        between = self.text[self._atoms[left].end : self._atoms[right].start]
        cached = self._gap_tokens.get(between)
        if cached is None:
            cached = self._gap_tokens[between] = self.counter.count(between)
        return cached

    # atoms

    def atoms(self, paragraphs: list[_Paragraph]) -> list[_Block]:
        """Atoms of every paragraph, grouped into blocks per the strategy."""
        blocks: list[_Block] = []
        for paragraph in paragraphs:
            first = len(self._atoms)
            for start, end, whole in self._units(paragraph):
                tokens = self.count(start, end)
                if tokens <= self.budget:
                    self._atoms.append(
                        _Atom(start, end, tokens, whole, paragraph.kind == "heading")
                    )
                else:
                    self._atoms.extend(self._split(start, end))
            indices = list(range(first, len(self._atoms)))
            if not indices:
                continue
            if self.config.strategy == "paragraph":
                estimate = sum(self._atoms[i].tokens for i in indices)
                estimate += sum(self.gap(a, b) for a, b in itertools.pairwise(indices))
                if estimate <= self.budget:
                    blocks.append(_Block(indices, estimate, paragraph.kind == "heading"))
                    continue
            for i in indices:
                atom = self._atoms[i]
                blocks.append(_Block([i], atom.tokens, atom.heading))
        return blocks

    def _units(self, paragraph: _Paragraph) -> list[tuple[int, int, bool]]:
        if paragraph.kind == "heading":
            return [
                (s, e, True) for s, e in _trimmed(self.text, ((paragraph.start, paragraph.end),))
            ]
        if paragraph.kind == "code":
            return [(s, e, True) for s, e in _trimmed(self.text, paragraph.lines)]
        units: list[tuple[int, int, bool]] = []
        seg_start, seg_end = paragraph.lines[0]
        for line_start, line_end in paragraph.lines[1:]:
            if _LINE_UNIT.match(self.text[line_start:line_end]):
                units.extend(
                    (s, e, True) for s, e in split_sentences(self.text, seg_start, seg_end)
                )
                seg_start = line_start
            seg_end = line_end
        units.extend((s, e, True) for s, e in split_sentences(self.text, seg_start, seg_end))
        return units

    def _split(self, start: int, end: int) -> list[_Atom]:
        """Pieces of an over-long sentence, each within the budget, cut on token boundaries."""
        pieces: list[_Atom] = []
        pos = start
        while pos < end:
            # Tokenize a window, not the whole rest: a huge sentence would make this quadratic.
            window = min(end - pos, max(256, self.budget * 16))
            while True:
                chunk = self.text[pos : pos + window]
                cut = self.counter.prefix_end(chunk, self.budget)
                if cut < len(chunk) or pos + window >= end:
                    break
                window = min(end - pos, window * 2)
            piece_end, tokens = self._fit(pos, pos + cut, end)
            pieces.append(_Atom(pos, piece_end, tokens, whole=False))
            pos = piece_end
            while pos < end and self.text[pos].isspace():
                pos += 1
        return pieces

    def _fit(self, pos: int, cut: int, end: int) -> tuple[int, int]:
        """The end of the piece starting at `pos` near `cut` that fits, and its token count."""
        target = self.budget
        while True:
            piece_end = cut
            if piece_end < end and not self.text[piece_end].isspace():
                # Prefer ending at whitespace when there is some in the piece's second half.
                space = _last_space(self.text, pos + (cut - pos) // 2, cut)
                if space is not None:
                    piece_end = space
            while piece_end > pos and self.text[piece_end - 1].isspace():
                piece_end -= 1
            if piece_end <= pos:
                raise ChunkingError(
                    f"cannot fit any text at offset {pos} within {self.budget} tokens "
                    f"(a single character needs more); raise the chunk budget"
                )
            tokens = self.count(pos, piece_end)
            if tokens <= self.budget:
                return piece_end, tokens
            # Re-tokenizing the cut text merged differently: aim lower and try again.
            target -= max(1, tokens - self.budget)
            cut = pos + self.counter.prefix_end(self.text[pos:piece_end], max(target, 0))

    # chunks

    def pack(self, blocks: list[_Block]) -> list[tuple[int, int, int]]:
        """`(char_start, char_end, token_count)` of each chunk."""
        chunks: list[tuple[int, int, int]] = []
        overlap: list[int] = []
        overlap_tokens = 0
        i = 0
        while i < len(blocks):
            taken, exact = self._fill(blocks, i, overlap, overlap_tokens)
            if taken == 0:
                if overlap:
                    overlap, overlap_tokens = self._shrink_overlap(overlap)
                else:  # one paragraph block whose estimate exceeds the budget
                    self._explode(blocks, i)
                continue
            current = overlap + _atoms_of(blocks[i : i + taken])
            tokens = exact if exact is not None else self.count(*self._span(current))
            # Estimates add up counts of parts; the exact count of the joined text decides.
            while tokens > self.budget and (taken > 1 or overlap):
                if taken > 1:
                    taken -= 1
                else:
                    overlap, overlap_tokens = self._shrink_overlap(overlap)
                current = overlap + _atoms_of(blocks[i : i + taken])
                tokens = self.count(*self._span(current))
            if tokens > self.budget:
                if len(blocks[i].atoms) == 1:  # counted alone when it was made: cannot happen
                    raise ChunkingError(
                        f"a unit at offset {self._atoms[current[0]].start} exceeds "
                        f"{self.budget} tokens after splitting"
                    )
                self._explode(blocks, i)
                continue
            if taken > 1 and blocks[i + taken - 1].heading and i + taken < len(blocks):
                # Do not end a chunk on a heading: it belongs to what follows.
                taken -= 1
                current = overlap + _atoms_of(blocks[i : i + taken])
                tokens = self.count(*self._span(current))
            chunks.append((*self._span(current), tokens))
            overlap, overlap_tokens = self._overlap(current)
            i += taken
        return chunks

    def _fill(
        self, blocks: list[_Block], i: int, overlap: list[int], overlap_tokens: int
    ) -> tuple[int, int | None]:
        """How many blocks from `i` fit after `overlap` (greedy, by estimate), and the exact
        count of that span when it was counted on the way (None otherwise)."""
        last = overlap[-1] if overlap else None
        estimate = overlap_tokens
        verified = True  # `estimate` is the exact count of what is taken so far
        j = i
        while j < len(blocks):
            block = blocks[j]
            extra = block.tokens + (self.gap(last, block.atoms[0]) if last is not None else 0)
            if estimate + extra > self.budget and last is not None and not verified:
                first = overlap[0] if overlap else blocks[i].atoms[0]
                estimate = self.count(self._atoms[first].start, self._atoms[last].end)
                verified = True
            if estimate + extra > self.budget:
                break
            estimate += extra
            verified = False
            last = block.atoms[-1]
            j += 1
        return j - i, (estimate if verified and j > i else None)

    def _span(self, atoms: list[int]) -> tuple[int, int]:
        return self._atoms[atoms[0]].start, self._atoms[atoms[-1]].end

    def _explode(self, blocks: list[_Block], i: int) -> None:
        blocks[i : i + 1] = [
            _Block([a], self._atoms[a].tokens, self._atoms[a].heading) for a in blocks[i].atoms
        ]

    def _overlap(self, chunk: list[int]) -> tuple[list[int], int]:
        """Trailing whole sentences of `chunk` (not its first) within the overlap budget."""
        limit = self.config.effective_overlap_tokens
        best: list[int] = []
        best_tokens = 0
        for k in range(len(chunk) - 1, 0, -1):
            atom = self._atoms[chunk[k]]
            if not atom.whole or atom.tokens > limit:
                break
            tokens = self.count(atom.start, self._atoms[chunk[-1]].end)
            if tokens > limit:
                break
            best, best_tokens = chunk[k:], tokens
        return best, best_tokens

    def _shrink_overlap(self, overlap: list[int]) -> tuple[list[int], int]:
        rest = overlap[1:]
        return rest, (self.count(*self._span(rest)) if rest else 0)


def _atoms_of(blocks: list[_Block]) -> list[int]:
    return [a for block in blocks for a in block.atoms]


def _trimmed(text: str, spans: tuple[tuple[int, int], ...]) -> list[tuple[int, int]]:
    out: list[tuple[int, int]] = []
    for start, end in spans:
        piece = text[start:end]
        lead = len(piece) - len(piece.lstrip())
        stripped = piece.strip()
        if stripped:
            out.append((start + lead, start + lead + len(stripped)))
    return out


def _last_space(text: str, lo: int, hi: int) -> int | None:
    for i in range(hi - 1, lo - 1, -1):
        if text[i].isspace():
            return i
    return None


# --- sections ------------------------------------------------------------------------------------


class _SectionIndex:
    """The heading path in force at an offset (h1 > h2 > ...)."""

    def __init__(self, paragraphs: list[_Paragraph]) -> None:
        self._starts: list[int] = []
        self._paths: list[tuple[str, ...]] = []
        stack: list[tuple[int, str]] = []
        for p in paragraphs:
            if p.kind != "heading" or not p.title:
                continue
            while stack and stack[-1][0] >= p.level:
                stack.pop()
            stack.append((p.level, p.title))
            self._starts.append(p.start)
            self._paths.append(tuple(title for _, title in stack))

    def path_at(self, offset: int) -> tuple[str, ...]:
        """Headings whose line starts at or before `offset`, outermost first."""
        k = bisect.bisect_right(self._starts, offset)
        return self._paths[k - 1] if k else ()
