"""Normalization runs in linear time on any row text, and its linear rewrites give what the
quadratic originals gave (hypothesis, on inputs small enough for the originals)."""

from __future__ import annotations

import re
import sys
import unicodedata
from collections.abc import Callable

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from ragcore import normalize as normalize_module
from ragcore.normalize import (
    NormalizeOptions,
    html_to_text,
    nfc,
    normalize,
    normalize_whitespace,
    redact_pii,
)
from schemas.entities import ContentFormat
from tests.linear_time import assert_linear

pytestmark = pytest.mark.unit

REDACT = NormalizeOptions(redact_pii=True)
TEXT, MARKDOWN, HTML = ContentFormat.TEXT, ContentFormat.MARKDOWN, ContentFormat.HTML

# --- the originals, as they were ------------------------------------------------------------------

_OLD_MD_COMMENT = re.compile(r"<!--.*?-->", re.DOTALL)


class _OldHtmlText(normalize_module._HtmlText):
    """The HTML collector as it was: the stdlib parser unbounded, `<![` raising, the dropped
    elements closed by a scan of the whole stack."""

    def __init__(self) -> None:
        super().__init__(waste_budget=sys.maxsize)

    def parse_html_declaration(self, i: int) -> int:
        return super(normalize_module._HtmlText, self).parse_html_declaration(i)

    def handle_endtag(self, tag: str) -> None:
        if self._dropped:
            if tag in self._dropped:
                idx = len(self._dropped) - 1 - self._dropped[::-1].index(tag)
                for closed in self._dropped[idx:]:  # the count `_drop` keeps
                    self._dropped_open[closed] -= 1
                del self._dropped[idx:]
            return
        super().handle_endtag(tag)


def _old_html_to_text(html: str) -> str:
    parser = _OldHtmlText()
    parser.feed(html)
    parser.close()
    return parser.text()


# --- equal results --------------------------------------------------------------------------------

_COMMENTISH = st.lists(st.sampled_from(["<!--", "-->", "<", "!", "-", ">", "a", "\n"])).map("".join)


@settings(max_examples=200, deadline=None)
@given(text=_COMMENTISH)
def test_dropping_comments_equals_the_regex(text: str) -> None:
    assert normalize_module._drop_comments(text) == _OLD_MD_COMMENT.sub("", text)


@settings(max_examples=200, deadline=None)
@given(
    lines=st.lists(
        st.sampled_from(["```", "~~~", "````", "<!--", "-->", "x <!-- y --> z", "  a", ""]),
        max_size=20,
    )
)
def test_markdown_comments_are_dropped_outside_fences_as_before(lines: list[str]) -> None:
    text = "\n".join(lines)
    # the original `_strip_markdown_comments`
    parts: list[str] = []
    prose: list[str] = []
    fence: str | None = None
    for line in text.splitlines(keepends=True):
        marker = re.match(r"^ {0,3}(`{3,}|~{3,})", line)
        if fence is None:
            if marker:
                parts.append(_OLD_MD_COMMENT.sub("", "".join(prose)))
                prose, fence = [], marker.group(1)
                parts.append(line)
            else:
                prose.append(line)
        else:
            parts.append(line)
            if marker and marker.group(1)[0] == fence[0] and len(marker.group(1)) >= len(fence):
                fence = None
    parts.append(_OLD_MD_COMMENT.sub("", "".join(prose)))
    assert normalize_module._strip_markdown_comments(text) == "".join(parts)


# Starters, marks of several combining classes (230, 220, 202, 1, 9), a character that
# decomposes to two marks (U+0F73), precomposed letters and Hangul: runs long enough to take
# the sorted path (over 32 marks) and short ones.
_MARKED = st.lists(
    st.one_of(
        st.sampled_from(["a", "e", "A", "Å", "ǘ", "\u1100", "\u1161", "\uac00", " ", "x"]),
        st.lists(
            st.sampled_from(
                ["\u0301", "\u0316", "\u0327", "\u0334", "\u094d", "\u0f73", "\u0344", "\u0308"]
            ),
            min_size=1,
            max_size=80,
        ).map("".join),
    ),
    max_size=12,
).map("".join)


@settings(max_examples=200, deadline=None)
@given(text=_MARKED)
def test_nfc_equals_unicodedata(text: str) -> None:
    assert nfc(text) == unicodedata.normalize("NFC", text)


def test_nfc_sorts_a_long_run_of_marks_as_unicodedata_does() -> None:
    text = "a" + "\u0301\u0316\u0f73" * 200 + "b\u0301"
    assert nfc(text) == unicodedata.normalize("NFC", text)
    assert nfc("plain ascii") == "plain ascii"


_HTML_PIECES = [
    "<", ">", "/", "</", "<!", "<!--", "-->", "--", "<![", "<![CDATA[", "]]>", "]>", "<?", "=",
    "'", '"', "&", "&#", "&#65;", "&amp;", "&lt", " ", "\n", "\r\n", "a", "Z", "x y",
    "<p>", "</p>", "<br>", "<div class='a'>", "<pre>", "</pre>", "<h2>", "</h2>", "<ul>", "<li>",
    "</ul>", "<ol>", "<tr>", "<td>", "</tr>", "<svg>", "</svg>", "<script>", "</script>",
    "<style>", "<head>", "</head>", "<a href=x>", "<a ", "<!doctype html>", "<!x>",
]  # fmt: skip


def _bounded_html_to_text(html: str) -> tuple[str, bool]:
    """`html_to_text`, and whether its budget ran out."""
    parser = normalize_module._HtmlText(
        normalize_module._HTML_WASTE_BASE + normalize_module._HTML_WASTE_PER_CHAR * len(html)
    )
    text = parser.parse(html)
    assert text == html_to_text(html)
    return text, parser.cut


@settings(max_examples=400, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(pieces=st.lists(st.sampled_from(_HTML_PIECES), max_size=150))
def test_html_text_equals_the_unbounded_parser_until_the_budget_runs_out(
    pieces: list[str],
) -> None:
    html = "".join(pieces)
    text, cut = _bounded_html_to_text(html)
    assert not (cut and len(html) <= 256), "the budget's floor covers every small input"
    try:
        expected: str | None = _old_html_to_text(html)
    except AssertionError:  # `<![` without a keyword: the original raised
        expected = None
    if expected is not None and not cut:
        assert text == expected


@pytest.mark.parametrize(
    ("html", "text"),
    [
        ("<![ >after", "after"),  # was AssertionError: a bogus comment, as HTML has it
        ("a<![x]>b", "ab"),
        ("x &#" + "0" * 5000 + "65; y", "x A y"),  # was ValueError (int digit limit)
        ("x &#" + "9" * 5000 + "; y", "x \ufffd y"),
        ("<a title='&#" + "1" * 5000 + "'>t</a>", "t"),
    ],
)
def test_html_that_raised_is_text_now(html: str, text: str) -> None:
    assert normalize(html, HTML, NormalizeOptions()).text == text


def test_past_the_budget_the_rest_of_an_unterminated_html_tail_is_text() -> None:
    html = "<p>kept</p>" + "<a " * 200_000
    text, cut = _bounded_html_to_text(html)
    assert cut
    assert text.startswith("kept\n\n<a <a ")
    assert text.count("<a") == 200_000  # nothing of the tail is lost, nothing doubled


def test_an_open_construct_in_a_large_page_parses_as_before() -> None:
    html = "<p>a <!-- never closed</p>" + "<p>body &amp; more</p>" * 5000 + "<b x='1"
    text, cut = _bounded_html_to_text(html)
    assert not cut
    assert text == _old_html_to_text(html)


def test_closing_a_deep_stack_of_dropped_elements_is_linear_and_exact() -> None:
    html = "<svg>" * 3 + "<p>x</p>" + "</svg>" * 3 + "<p>after</p>"
    assert html_to_text(html) == _old_html_to_text(html) == "after"


# --- linear time ----------------------------------------------------------------------------------

_PIECES = [
    # Markdown comments and fences
    "<!--", "<!-- x", "-->", "<!-->", "```\n", "```", "~~~\n", "`", "    x\n",
    # HTML constructs left open or repeated
    "<", "<a ", "<a", "<a x='>' ", "<a x=", "</", "</a", "</a ", "<!", "<![", "<![CDATA[",
    "<![if x>", "<?", "<!doctype", "<!-- x>", "&", "&#", "&#1", "&amp", "&#x", "<svg>",
    "<svg></p>", "<pre>", "<pre>\r", "<h1>", "<li>", "<tr><td>",
    # whitespace, controls, line breaks
    " ", "\t", "\n", " \n", "\r", "\r\n", "\u2028", "\x00", "\x85", "\u00a0", "\u200b",
    # combining marks
    "\u0301\u0316", "\u0f73", "a\u0301", "\u0308",
    # PII shapes
    "@", "a@", "a@a.", "a.", "a-", "+1 ", "+1", "(123) ", "0", "1-", "12 ", "1.", "a1",
    # Markdown prose
    "#", "# a ", "- ", "* ", "1. ", "> ", "|", "[a](", "**", "_",
]  # fmt: skip


def _repeat(piece: str) -> Callable[[int], str]:
    return lambda n: piece * n


@pytest.mark.parametrize(
    "fmt", [MARKDOWN, HTML], ids=lambda f: f.value
)  # text: a subset of markdown
@pytest.mark.parametrize("piece", _PIECES, ids=repr)
def test_normalizing_repetitions_is_linear(fmt: ContentFormat, piece: str) -> None:
    assert_linear(lambda text: normalize(text, fmt, REDACT), _repeat(piece))


@pytest.mark.parametrize(
    ("name", "make"),
    [
        ("unclosed comment then text", lambda n: "<!--" + "a-" * n),
        ("comments closed at the end", lambda n: "<!--" * n + "-->"),
        ("unclosed fence", lambda n: "```\n" + "<!-- a\n" * n),
        ("fence per line", lambda n: "```\n<!--\n" * n),
        ("tag then quote-free text", lambda n: "<a x='" + "b" * n),
        ("open tags, one quote at the end", lambda n: "<a " * n + "x='"),
        ("comment opener with '>' later", lambda n: "<!-- x>" * n + "-->"),
        ("marks after one letter", lambda n: "a" + "\u0301\u0316" * n),
        ("reversed marks", lambda n: "a" + "\u0316" * n + "\u0301" * n),
        ("long word", lambda n: "a" * n),
        ("email-like run", lambda n: "a@" + "a." * n + "1"),
        ("phone-like run", lambda n: "+1 " + "12 " * n),
        ("blank lines", lambda n: "a\n\n\n" * n),
        ("indented lines", lambda n: "    " * n + "x\n" * n),
    ],
)
@pytest.mark.parametrize("fmt", [MARKDOWN, HTML], ids=lambda f: f.value)
def test_normalizing_adversarial_bodies_is_linear(
    fmt: ContentFormat, name: str, make: Callable[[int], str]
) -> None:
    assert_linear(lambda text: normalize(text, fmt, REDACT), make)


@pytest.mark.parametrize(
    "piece", ["\u0301\u0316", "\u0316\u0301", "\u0f73", "\u0344", "a\u0301", "\u1100\u1161"]
)
def test_nfc_is_linear(piece: str) -> None:
    assert_linear(nfc, lambda n: "a" + piece * n)


@pytest.mark.parametrize("piece", ["a@", "a.", "a-", "+1 ", "(123) ", "0", "1-", "12 ", "x@y."])
def test_redacting_pii_is_linear(piece: str) -> None:
    assert_linear(redact_pii, _repeat(piece))


@pytest.mark.parametrize("piece", ["<!--", "<a ", "</", "<!", "<?", "<![", "&#", "<svg>"])
def test_html_to_text_is_linear(piece: str) -> None:
    assert_linear(html_to_text, _repeat(piece))


def test_whitespace_normalization_is_linear_with_kept_indents() -> None:
    assert_linear(
        lambda text: normalize_whitespace(text, keep_indent=True), lambda n: " \t" * n + "x\n"
    )
