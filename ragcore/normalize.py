"""Normalize an entity's content into the text that gets chunked, embedded and hashed.

Pure and deterministic: the same content, format and options give the same text byte for byte,
so `content_sha256` of the result is a stable identity for "did the indexed text change".

- HTML: parsed with the stdlib `html.parser` into readable text. Block elements become paragraph
  breaks, `<br>` a newline, list items and table rows their own lines (`- item`, `1. item`,
  `a | b`), headings Markdown-style `## Title` lines (so chunk locators can carry a section path),
  `<pre>` keeps its line breaks; script/style/head/template/noscript are dropped; entities are
  unescaped.
- Markdown: kept as Markdown (headings, lists, emphasis, links, code fences); only HTML comments
  are removed. Leading indentation (nested lists, indented code) and the inside of fenced code
  blocks keep their spacing.
- Everything: NFC, `\\r\\n`/`\\r`/Unicode line separators -> `\\n`, control characters other than
  `\\n` removed, runs of spaces/tabs collapsed to one space, trailing spaces stripped, at most one
  blank line between paragraphs, no leading/trailing blank lines.
- Optional PII redaction (emails -> `[EMAIL]`, phone numbers -> `[PHONE]`), applied last.

Row text is untrusted: every step runs in time linear in the text's length, whatever the text
(docs/decisions/document-extraction.md, "Bounds per row and per document";
tests/ragcore/test_normalize_bounds.py times each step on adversarial inputs of n and 8n
characters).
"""

from __future__ import annotations

import functools
import hashlib
import re
import unicodedata
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from html import unescape
from html.parser import HTMLParser
from typing import Literal

from schemas.entities import ContentFormat

PiiKind = Literal["email", "phone"]
ALL_PII_KINDS: frozenset[PiiKind] = frozenset({"email", "phone"})
EMAIL_PLACEHOLDER = "[EMAIL]"
PHONE_PLACEHOLDER = "[PHONE]"


@dataclass(frozen=True)
class NormalizeOptions:
    """How to normalize: PII redaction is off unless configured."""

    redact_pii: bool = False
    pii_kinds: frozenset[PiiKind] = ALL_PII_KINDS  # which kinds `redact_pii` redacts


@dataclass(frozen=True)
class TextSegment:
    """A located span of an extracted document's normalized text, `text[start:end]`: a PDF
    page, a DOCX section or spreadsheet rows (`ragcore.documents`). Chunks never cross one."""

    start: int
    end: int
    path: tuple[str, ...]  # the citation after the file name: ("p. 3",), headings, (sheet, rows)
    page: int | None = None
    sheet: str | None = None
    rows: tuple[int, ...] = ()  # the spreadsheet row number of each line of the span


@dataclass(frozen=True)
class NormalizedText:
    """Normalized text plus what the normalizer did to get it (extraction metadata)."""

    text: str
    extracted_from: str  # the source format, e.g. "html", "markdown", "text", "pdf"
    original_length: int  # characters of the content before normalization
    redactions: dict[str, int] = field(default_factory=dict)  # PII kind -> replacements
    segments: tuple[TextSegment, ...] = ()  # documents only: where each part came from
    pages: int = 0  # documents only: pages (or sections, row blocks) extracted

    @property
    def sha256(self) -> str:
        """`content_sha256(self.text)`."""
        return content_sha256(self.text)

    def metadata(self) -> dict[str, object]:
        """Extraction metadata for payloads and logs (JSON-serializable)."""
        out: dict[str, object] = {
            "extracted_from": self.extracted_from,
            "original_length": self.original_length,
            "normalized_length": len(self.text),
            "redactions": dict(sorted(self.redactions.items())),
        }
        if self.segments:
            out["pages"] = self.pages
        return out


def content_sha256(text: str) -> str:
    """SHA-256 hex digest of `text` encoded as UTF-8 (pass the normalized text)."""
    return hashlib.sha256(text.encode("utf-8")).hexdigest()


def normalize(content: str, fmt: ContentFormat, options: NormalizeOptions) -> NormalizedText:
    """Normalize `content` written in `fmt` (see the module docstring for the rules).

    Documents (PDF, DOCX, ...) are extracted first (`ragcore.prepare.Preparer`), then their
    segments normalized as text (`normalize_segments`); here they are a ValueError.
    """
    if fmt.is_document:
        raise ValueError(f"{fmt.value} content is extracted, not normalized as written")
    if fmt is ContentFormat.HTML:
        text = normalize_whitespace(html_to_text(content), keep_indent=False)
    elif fmt is ContentFormat.MARKDOWN:
        text = normalize_whitespace(_strip_markdown_comments(content), keep_indent=True)
    else:
        text = normalize_whitespace(content, keep_indent=False)
    redactions: dict[str, int] = {}
    if options.redact_pii:
        text, redactions = redact_pii(text, options.pii_kinds)
    return NormalizedText(
        text=text,
        extracted_from=fmt.value,
        original_length=len(content),
        redactions=redactions,
    )


def normalize_segments(
    parts: Sequence[tuple[str, TextSegment]],
    fmt: ContentFormat,
    options: NormalizeOptions,
    *,
    original_length: int,
    pages: int,
) -> NormalizedText:
    """An extracted document's text: each part normalized as plain text, parts joined by a
    blank line, each part's span recorded in `segments` (with the `TextSegment`'s locator;
    its `start`/`end` given are ignored)."""
    pieces: list[str] = []
    segments: list[TextSegment] = []
    redactions: dict[str, int] = {}
    offset = 0
    for raw, where in parts:
        text = normalize_whitespace(raw, keep_indent=False)
        if options.redact_pii:
            text, counts = redact_pii(text, options.pii_kinds)
            for kind, n in counts.items():
                redactions[kind] = redactions.get(kind, 0) + n
        if not text:
            continue
        if pieces:
            offset += 2
        rows = where.rows if where.rows and text.count("\n") + 1 == len(where.rows) else ()
        if where.rows and not rows:
            # a row's text vanished in normalization: cite the block's first and last row
            rows = (where.rows[0], where.rows[-1])
        segments.append(
            TextSegment(offset, offset + len(text), where.path, where.page, where.sheet, rows)
        )
        pieces.append(text)
        offset += len(text)
    return NormalizedText(
        text="\n\n".join(pieces),
        extracted_from=fmt.value,
        original_length=original_length,
        redactions=redactions,
        segments=tuple(segments),
        pages=pages,
    )


def normalized_sha256(
    content: str, fmt: ContentFormat, options: NormalizeOptions | None = None
) -> str:
    """The content hash ingest stores and Retrieve and reconcile compare: SHA-256 of the
    normalized content (default options unless given)."""
    return content_sha256(normalize(content, fmt, options or NormalizeOptions()).text)


# --- whitespace --------------------------------------------------------------------------------

_LINE_BREAKS = re.compile(r"\r\n|[\r\u2028\u2029\x0b\x0c\x85]")
# Invisible characters with no meaning in text (BOM, zero-width space). ZWJ/ZWNJ stay: emoji
# sequences and several scripts need them.
_INVISIBLE = dict.fromkeys(map(ord, "\ufeff\u200b"), None)
_SPACE_CLASS = r"[ \t\u00a0\u1680\u2000-\u200a\u202f\u205f\u3000]"
_SPACES = " \t\u00a0\u1680\u202f\u205f\u3000" + "".join(map(chr, range(0x2000, 0x200B)))
_SPACE_RUN = re.compile(_SPACE_CLASS + "+")
_LEADING_SPACE = re.compile("^" + _SPACE_CLASS + "*")
_FENCE = re.compile(r"^ {0,3}(`{3,}|~{3,})")


# Cc (U+0000-001F, U+007F-009F) other than \n and \t (tabs are collapsed as spaces afterwards),
# and lone surrogates (Cs: a JSON "\\ud800" escape decodes to one), which UTF-8 cannot encode.
_CONTROLS = re.compile("[\x00-\x08\x0b-\x1f\x7f-\x9f\ud800-\udfff]")


def _drop_controls(text: str) -> str:
    return _CONTROLS.sub("", text).translate(_INVISIBLE)


def normalize_whitespace(text: str, *, keep_indent: bool) -> str:
    """NFC + line-break, control-character and space normalization (module docstring).

    `keep_indent` keeps each line's leading indentation (tabs as 4 spaces) and the spacing
    inside fenced code blocks, which carry meaning in Markdown.
    """
    text = nfc(_LINE_BREAKS.sub("\n", text))
    text = _drop_controls(text)
    out: list[str] = []
    fence: str | None = None  # the opening marker while inside a fenced code block
    blank_pending = False
    for raw in text.split("\n"):
        line = raw.rstrip(_SPACES)
        if fence is not None:
            marker = _FENCE.match(line)
            if marker and marker.group(1)[0] == fence[0] and len(marker.group(1)) >= len(fence):
                fence = None
            # else: a code line keeps its spacing; only trailing spaces went.
        else:
            if keep_indent and (marker := _FENCE.match(line)):
                fence = marker.group(1)
            line = _collapse_line(line, keep_indent=keep_indent)
        if not line:
            blank_pending = bool(out)
            continue
        if blank_pending:
            out.append("")
            blank_pending = False
        out.append(line)
    return "\n".join(out)


#: Longest run of non-starters left to `unicodedata.normalize` as it stands (see `nfc`).
_NON_STARTER_RUN = 32


def nfc(text: str) -> str:
    """`unicodedata.normalize("NFC", text)`, in time linear in the text.

    CPython puts each run of combining marks into canonical order by insertion sort: a run
    of k marks in reverse order costs k^2/2 steps (32k marks: 2 s; a 2M-character row of
    them: hours). A run longer than `_NON_STARTER_RUN` is replaced by its canonical
    decomposition, sorted here (a stable sort by combining class, as the algorithm orders
    it): a canonically equivalent string, so its NFC is the same, which CPython then sorts
    in one pass.
    """
    if text.isascii():
        return text
    if len(text) <= _NON_STARTER_RUN:
        return unicodedata.normalize("NFC", text)
    runs = _non_starter_runs()
    if runs.search(text) is None:
        return unicodedata.normalize("NFC", text)
    return unicodedata.normalize("NFC", runs.sub(_canonical_order, text))


@functools.cache
def _non_starter_runs() -> re.Pattern[str]:
    """Runs of more than `_NON_STARTER_RUN` characters that decompose to non-starters
    (combining class > 0): a character class of the running Python's Unicode database, built
    on first use (a fraction of a second)."""
    every = range(0x110000)
    marks = set(filter(unicodedata.combining, map(chr, every)))
    for char in filter(unicodedata.decomposition, map(chr, every)):  # U+0F73, U+0F75, ...
        canonical = unicodedata.decomposition(char)
        if canonical[0] != "<" and unicodedata.combining(unicodedata.normalize("NFD", char)[0]):
            marks.add(char)
    ranges: list[list[int]] = []
    for cp in sorted(map(ord, marks)):
        if ranges and ranges[-1][1] == cp - 1:
            ranges[-1][1] = cp
        else:
            ranges.append([cp, cp])
    members = "".join(
        re.escape(chr(a)) if a == b else f"{re.escape(chr(a))}-{re.escape(chr(b))}"
        for a, b in ranges
    )
    # the lookbehind starts a match only where a run starts: one attempt per run
    return re.compile(f"(?<![{members}])[{members}]{{{_NON_STARTER_RUN + 1},}}")


def _canonical_order(match: re.Match[str]) -> str:
    decomposed = "".join(unicodedata.normalize("NFD", char) for char in match.group(0))
    out: list[str] = []
    marks: list[str] = []
    for char in decomposed:
        if unicodedata.combining(char):
            marks.append(char)
            continue
        out += sorted(marks, key=unicodedata.combining)
        marks = []
        out.append(char)
    out += sorted(marks, key=unicodedata.combining)
    return "".join(out)


def _collapse_line(line: str, *, keep_indent: bool) -> str:
    indent = ""
    if keep_indent:
        lead = _LEADING_SPACE.match(line)
        assert lead is not None  # the pattern matches the empty string
        indent = lead.group(0).replace("\t", "    ")
        indent = " " * len(indent)
    return indent + _SPACE_RUN.sub(" ", line).strip(" ")


def _drop_comments(text: str) -> str:
    """`re.sub(r"<!--.*?-->", "", text, flags=re.DOTALL)` in one forward pass. The regex
    tries every `<!--` against the rest of the text: 80k characters of `<!--` took 4.6 s, a
    2M-character row about 45 minutes. A `<!--` with no `-->` after it is no comment, and
    neither is any later one: the rest stays as it is."""
    pos = 0
    parts: list[str] = []
    while (start := text.find("<!--", pos)) >= 0:
        end = text.find("-->", start + 4)
        if end < 0:
            break
        parts.append(text[pos:start])
        pos = end + 3
    if not parts:
        return text
    parts.append(text[pos:])
    return "".join(parts)


def _strip_markdown_comments(text: str) -> str:
    # HTML comments are invisible in rendered Markdown; inside code fences they are code.
    parts: list[str] = []
    prose: list[str] = []
    fence: str | None = None
    for line in text.splitlines(keepends=True):
        marker = _FENCE.match(line)
        if fence is None:
            if marker:
                parts.append(_drop_comments("".join(prose)))
                prose = []
                fence = marker.group(1)
                parts.append(line)
            else:
                prose.append(line)
        else:
            parts.append(line)
            if marker and marker.group(1)[0] == fence[0] and len(marker.group(1)) >= len(fence):
                fence = None
    parts.append(_drop_comments("".join(prose)))
    return "".join(parts)


# --- HTML ----------------------------------------------------------------------------------------

_DROPPED = frozenset({"script", "style", "head", "template", "noscript", "svg", "iframe", "object"})
_VOID = frozenset(
    {"area", "base", "br", "col", "embed", "hr", "img", "input", "link", "meta", "source", "wbr"}
)
_BLOCKS = frozenset(
    {
        "address", "article", "aside", "blockquote", "body", "caption", "center", "details",
        "dialog", "dir", "div", "dl", "fieldset", "figcaption", "figure", "footer", "form",
        "header", "hgroup", "hr", "html", "legend", "main", "menu", "nav", "ol", "p", "pre",
        "section", "summary", "table", "tbody", "tfoot", "thead", "ul",
    }
)  # fmt: skip
_LINES = frozenset({"li", "tr", "dt", "dd", "option"})
_HEADINGS = {f"h{n}": n for n in range(1, 7)}
_PARAGRAPH, _LINE = 2, 1


class _HtmlText(HTMLParser):
    """Collects readable text; breaks are kept as levels and resolved in `text()`.

    Bounded: the stdlib parser meets a construct left open (`<a `, `<!--` or `</` with no
    end) at the end of its input by emitting it as text up to the next `>` and trying again
    at the next `<`, each try scanning to the end: quadratic (48k characters of `<a `: 40 s).
    `parse` charges each such try the characters it may scan; past `waste_budget` the rest of
    the input is text at once (what the tries would have made of most of it).
    """

    def __init__(self, waste_budget: int) -> None:
        super().__init__(convert_charrefs=True)
        self._out: list[str] = []
        self._pending_break = 0
        self._dropped: list[str] = []  # open dropped elements (their content is skipped)
        self._dropped_open: dict[str, int] = {}  # tag -> how many of `_dropped`
        self._waste = 0
        self._waste_budget = waste_budget
        self.cut = False  # whether the budget ran out (the rest of the input became text)
        self._pre = 0
        self._heading = 0
        self._lists: list[list[int]] = []  # per open list: [is_ordered, next number]
        self._cells: list[int] = []  # per open table row: cells seen

    def _break(self, level: int) -> None:
        self._pending_break = max(self._pending_break, level)

    def _emit(self, text: str) -> None:
        if not text:
            return
        if self._pending_break and self._out:
            self._out.append("\n\n" if self._pending_break >= _PARAGRAPH else "\n")
        self._pending_break = 0
        self._out.append(text)

    # -- bounded parsing (see the class docstring) --

    def parse(self, html: str) -> str:
        """The text of a whole document: `feed(html)` then `close()`, in one pass. `feed`
        stops at the first construct left open and `close` tries it again: the same result
        with one scan fewer of what may be the rest of the input."""
        self.rawdata = html
        self.close()
        return self.text()

    def parse_starttag(self, i: int) -> int:
        return self._tried(i, super().parse_starttag(i))

    def parse_endtag(self, i: int) -> int:
        return self._tried(i, super().parse_endtag(i))

    def parse_comment(self, i: int, report: bool = True) -> int:
        return self._tried(i, super().parse_comment(i, report))

    def parse_pi(self, i: int) -> int:
        return self._tried(i, super().parse_pi(i))

    def parse_html_declaration(self, i: int) -> int:
        try:
            end = super().parse_html_declaration(i)
        except AssertionError:
            # `_markupbase` raises it for `<![` without a known keyword (`<![ >`, `<![x]>`):
            # what HTML makes of it, a bogus comment up to the next `>`
            end = self.parse_bogus_comment(i)
        return self._tried(i, end)

    def _tried(self, i: int, end: int) -> int:
        """`end` of a construct parsed at `i`; when it is open at the end of the input (-1)
        and the budget is spent, the rest of the input as text."""
        if end >= 0:
            return end
        rest = len(self.rawdata) - i
        self._waste += rest
        if self._waste <= self._waste_budget:
            return end  # the parser emits it as text up to the next `>` and goes on
        self.cut = True
        self.handle_data(unescape(self.rawdata[i:]))
        return len(self.rawdata)

    # -- text --

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        if self._dropped:
            if tag in _DROPPED:
                self._drop(tag)
            return
        if tag in _DROPPED:
            self._drop(tag)
            return
        if tag == "br":
            if self._heading:
                self._emit(" ")
            else:
                self._break(_LINE)
        elif tag in _HEADINGS:
            self._break(_PARAGRAPH)
            self._emit("#" * _HEADINGS[tag] + " ")
            self._heading += 1
        elif tag in ("ul", "ol", "menu", "dir"):
            self._break(_PARAGRAPH if not self._lists else _LINE)
            self._lists.append([1 if tag == "ol" else 0, 1])
        elif tag == "li":
            self._break(_LINE)
            if self._lists and self._lists[-1][0]:
                self._emit(f"{self._lists[-1][1]}. ")
                self._lists[-1][1] += 1
            else:
                self._emit("- ")
        elif tag == "tr":
            self._break(_LINE)
            self._cells.append(0)
        elif tag in ("td", "th"):
            if self._cells:
                if self._cells[-1]:
                    self._emit(" | ")
                self._cells[-1] += 1
        elif tag in _BLOCKS:
            self._break(_PARAGRAPH)
            if tag == "pre":
                self._pre += 1
        elif tag in _LINES:
            self._break(_LINE)

    def handle_startendtag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        self.handle_starttag(tag, attrs)
        if tag not in _VOID:
            self.handle_endtag(tag)

    def handle_endtag(self, tag: str) -> None:
        if self._dropped:
            # Close the innermost dropped element of this name (tolerates sloppy nesting):
            # found by count, then from the top, so each open element costs O(1) overall.
            if self._dropped_open.get(tag):
                idx = len(self._dropped) - 1
                while self._dropped[idx] != tag:
                    idx -= 1
                for closed in self._dropped[idx:]:
                    self._dropped_open[closed] -= 1
                del self._dropped[idx:]
            return
        if tag in _HEADINGS:
            self._heading = max(0, self._heading - 1)
            self._break(_PARAGRAPH)
        elif tag in ("ul", "ol", "menu", "dir"):
            if self._lists:
                self._lists.pop()
            self._break(_PARAGRAPH if not self._lists else _LINE)
        elif tag == "tr":
            if self._cells:
                self._cells.pop()
            self._break(_LINE)
        elif tag in _BLOCKS:
            if tag == "pre":
                self._pre = max(0, self._pre - 1)
            self._break(_PARAGRAPH)
        elif tag in _LINES:
            self._break(_LINE)

    def _drop(self, tag: str) -> None:
        self._dropped.append(tag)
        self._dropped_open[tag] = self._dropped_open.get(tag, 0) + 1

    def handle_data(self, data: str) -> None:
        if self._dropped:
            return
        if self._pre and not self._heading:
            lines = _LINE_BREAKS.sub("\n", data).split("\n")
            for n, line in enumerate(lines):
                if n:
                    self._break(_LINE)
                self._emit(line)
            return
        # Outside <pre>, HTML collapses any whitespace run (newlines included) to one space.
        collapsed = re.sub(r"\s+", " ", data)
        if collapsed == " " and (self._pending_break or not self._out):
            return
        self._emit(collapsed)

    def text(self) -> str:
        """The collected text (whitespace not yet normalized)."""
        return "".join(self._out)


#: Characters the parser may scan in vain on an input of n characters: `_HTML_WASTE_BASE +
#: _HTML_WASTE_PER_CHAR * n`. Any input of up to 256 characters, and one of any size with one
#: construct left open to its end, parses as the stdlib parser parses it; 2M characters of
#: open tags (the costliest to scan: about 0.75 us a character) take about 3 s.
_HTML_WASTE_BASE = 1 << 16
_HTML_WASTE_PER_CHAR = 1
# `&#` and more digits than any interpreter's int() accepts (640 at the lowest): html.unescape
# raises ValueError on them (the limit on int-from-string conversions)
_LONG_DECIMAL_CHARREF = re.compile(r"&#([0-9]{640,})")
_MAX_CODE_POINT_DIGITS = 7  # 0x10FFFF = 1114111


def _short_charref(match: re.Match[str]) -> str:
    # the same code point: leading zeros dropped, and a number past U+10FFFF (which
    # unescape makes U+FFFD) as 8 digits
    digits = match.group(1).lstrip("0") or "0"
    return "&#" + (digits if len(digits) <= _MAX_CODE_POINT_DIGITS else "9" * 8)


def html_to_text(html: str) -> str:
    """Readable text of an HTML document or fragment (see the module docstring)."""
    parser = _HtmlText(_HTML_WASTE_BASE + _HTML_WASTE_PER_CHAR * len(html))
    return parser.parse(_LONG_DECIMAL_CHARREF.sub(_short_charref, html))


# --- PII -----------------------------------------------------------------------------------------

_EMAIL = re.compile(
    r"(?<![\w.%+-])[A-Za-z0-9][A-Za-z0-9._%+-]*@"
    r"(?:[A-Za-z0-9](?:[A-Za-z0-9-]*[A-Za-z0-9])?\.)+[A-Za-z]{2,}(?![\w-])"
)
# Phone numbers need the shape of one: a leading "+" country code, a North-American 3-3-4 with
# separators, or a trunk "0" followed by separated groups. Bare digit runs (order ids), dates,
# versions, IP addresses and codes like E-1042 have none of these shapes.
_PHONE = re.compile(
    r"(?<![\w+.\-/])"
    r"(?:"
    r"\+\d{1,3}(?:[ .-]?\(\d{1,4}\)|[ .-]?\d{1,4})(?:[ .-]?\d{2,4}){1,5}"
    r"|(?:\(\d{3}\) ?|\d{3}[ .-])\d{3}[ .-]\d{4}"
    r"|0\d{1,4}(?:[ .-]\d{2,8}){1,4}"
    r")"
    r"(?![\w\-/]|[.,:]\d)"
)
_MIN_PHONE_DIGITS, _MAX_PHONE_DIGITS = 9, 15


def _phone_or_keep(match: re.Match[str]) -> str:
    digits = sum(ch.isdigit() for ch in match.group(0))
    if _MIN_PHONE_DIGITS <= digits <= _MAX_PHONE_DIGITS:
        return PHONE_PLACEHOLDER
    return match.group(0)


def redact_pii(text: str, kinds: frozenset[PiiKind] = ALL_PII_KINDS) -> tuple[str, dict[str, int]]:
    """Replace emails with `[EMAIL]` and phone numbers with `[PHONE]`; returns counts per kind."""
    counts: dict[str, int] = {}
    if "email" in kinds:
        text, n = _EMAIL.subn(EMAIL_PLACEHOLDER, text)
        counts["email"] = n
    if "phone" in kinds:
        replaced = 0

        def count_phone(match: re.Match[str]) -> str:
            nonlocal replaced
            out = _phone_or_keep(match)
            if out == PHONE_PLACEHOLDER:
                replaced += 1
            return out

        replacer: Callable[[re.Match[str]], str] = count_phone
        text = _PHONE.sub(replacer, text)
        counts["phone"] = replaced
    return text, counts
