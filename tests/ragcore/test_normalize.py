"""Normalization: HTML extraction, Markdown kept readable, whitespace rules, PII redaction."""

from __future__ import annotations

import re
import unicodedata

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from ragcore.normalize import (
    NormalizedText,
    NormalizeOptions,
    content_sha256,
    normalize,
    redact_pii,
)
from schemas.entities import ContentFormat

PLAIN = NormalizeOptions()
REDACT = NormalizeOptions(redact_pii=True)


def _text(content: str, fmt: ContentFormat = ContentFormat.TEXT) -> str:
    return normalize(content, fmt, PLAIN).text


# --- HTML --------------------------------------------------------------------------------------

PAGE = """<!doctype html>
<html><head><title>Page title</title><style>p { color: red }</style>
<script>var x = "<p>not text</p>";</script></head>
<body>
  <h1>Install &amp; run</h1>
  <p>First   paragraph
     spans lines.<br>After a break.</p>
  <div>Second&nbsp;block with <b>bold</b> and <a href="/x">a link</a>.</div>
  <ul><li>one</li><li>two<ul><li>nested</li></ul></li></ul>
  <ol><li>alpha</li><li>beta</li></ol>
  <table><tr><th>key</th><th>value</th></tr><tr><td>a</td><td>1</td></tr></table>
  <h2>Usage</h2>
  <pre>line one
line two</pre>
  <noscript>enable js</noscript>
  <p>Caf&eacute; &lt;tag&gt; &#x1F99C;</p>
</body></html>"""


@pytest.mark.unit
def test_html_blocks_become_paragraphs_and_br_a_newline() -> None:
    text = _text(PAGE, ContentFormat.HTML)

    assert "First paragraph spans lines.\nAfter a break.\n\nSecond block with bold and a link." in (
        text
    )


@pytest.mark.unit
def test_html_drops_head_script_style_and_noscript() -> None:
    text = _text(PAGE, ContentFormat.HTML)

    for hidden in ("Page title", "color: red", "not text", "var x", "enable js"):
        assert hidden not in text


@pytest.mark.unit
def test_html_list_items_and_table_rows_are_lines_of_their_own() -> None:
    text = _text(PAGE, ContentFormat.HTML)

    assert "- one\n- two\n- nested" in text
    assert "1. alpha\n2. beta" in text
    assert "key | value\na | 1" in text


@pytest.mark.unit
def test_html_headings_become_markdown_headings_and_entities_are_unescaped() -> None:
    text = _text(PAGE, ContentFormat.HTML)

    assert text.startswith("# Install & run\n\n")
    assert "\n\n## Usage\n\n" in text
    assert text.endswith("Café <tag> 🦜")


@pytest.mark.unit
def test_html_pre_keeps_its_line_breaks() -> None:
    assert "line one\nline two" in _text(PAGE, ContentFormat.HTML)


@pytest.mark.unit
def test_html_records_extraction_metadata() -> None:
    result = normalize(PAGE, ContentFormat.HTML, PLAIN)

    assert result.extracted_from == "html"
    assert result.original_length == len(PAGE)
    assert result.metadata()["normalized_length"] == len(result.text)


@pytest.mark.unit
def test_malformed_html_still_yields_its_text() -> None:
    text = _text("<div><p>unclosed <b>bold<p>next</div></span>tail", ContentFormat.HTML)

    assert text == "unclosed bold\n\nnext\n\ntail"


# --- Markdown ----------------------------------------------------------------------------------

MARKDOWN = """# Guide

Intro with **bold**, `code` and a [link](https://example.com).
<!-- an editor's note -->

## Install

- step   one
    - nested\tstep

```python
def f():
    x  =  1


    return x
```

> quoted   text
"""


@pytest.mark.unit
def test_markdown_keeps_headings_lists_emphasis_and_links() -> None:
    text = _text(MARKDOWN, ContentFormat.MARKDOWN)

    assert text.startswith(
        "# Guide\n\nIntro with **bold**, `code` and a [link](https://example.com)."
    )
    assert "\n\n## Install\n\n- step one\n    - nested step\n" in text
    assert text.endswith("> quoted text")


@pytest.mark.unit
def test_markdown_code_fences_keep_their_spacing() -> None:
    text = _text(MARKDOWN, ContentFormat.MARKDOWN)

    assert "```python\ndef f():\n    x  =  1\n\n    return x\n```" in text


@pytest.mark.unit
def test_markdown_drops_html_comments_outside_code() -> None:
    source = "Text <!-- hidden --> here.\n\n```html\n<!-- shown -->\n```"

    text = _text(source, ContentFormat.MARKDOWN)

    assert text == "Text here.\n\n```html\n<!-- shown -->\n```"


# --- whitespace --------------------------------------------------------------------------------


@pytest.mark.unit
def test_unicode_is_nfc_normalized() -> None:
    decomposed = "Cafe\u0301"

    assert _text(decomposed) == "Café"
    assert _text(decomposed) == unicodedata.normalize("NFC", decomposed)


@pytest.mark.unit
def test_whitespace_is_collapsed_and_blank_lines_limited() -> None:
    source = "  a \t  b  \r\n\r\n\r\n\n c\u00a0\u00a0d \rtail\u2028end  "

    assert _text(source) == "a b\n\nc d\ntail\nend"


@pytest.mark.unit
def test_control_characters_are_removed_but_emoji_joiners_kept() -> None:
    family = "👨\u200d👩\u200d👧"
    source = f"a\x00b\x07c\x1b\ufeffd\u200be {family}\x85next"

    assert _text(source) == f"abcde {family}\nnext"


@pytest.mark.unit
def test_lone_surrogates_are_removed() -> None:
    assert _text("a\ud800b") == "ab"


@pytest.mark.unit
def test_empty_and_whitespace_content_normalizes_to_empty() -> None:
    assert _text("") == ""
    assert _text(" \n\t \n") == ""


_RAW_TEXT = st.text(
    alphabet=st.one_of(
        st.characters(codec="utf-8"),
        st.sampled_from(" \t\n\r\u00a0\u2028\x00\x07\ufeff"),
    ),
    max_size=300,
)


@pytest.mark.unit
@settings(max_examples=200, deadline=None)
@given(content=_RAW_TEXT, fmt=st.sampled_from([f for f in ContentFormat if not f.is_document]))
def test_normalized_text_obeys_the_whitespace_rules(content: str, fmt: ContentFormat) -> None:
    text = _text(content, fmt)

    assert unicodedata.is_normalized("NFC", text)
    assert not any(unicodedata.category(ch) == "Cc" and ch != "\n" for ch in text)
    assert "\n\n\n" not in text
    assert not re.search(r"[ \t]\n|[ \t]$", text)
    assert text == text.strip("\n")


@pytest.mark.unit
@settings(max_examples=200, deadline=None)
@given(content=_RAW_TEXT, fmt=st.sampled_from([ContentFormat.TEXT, ContentFormat.MARKDOWN]))
def test_normalization_is_deterministic_and_idempotent(content: str, fmt: ContentFormat) -> None:
    once = normalize(content, fmt, PLAIN)

    assert normalize(content, fmt, PLAIN) == once
    assert normalize(once.text, fmt, PLAIN).text == once.text


@pytest.mark.unit
def test_plain_text_collapses_space_runs_but_keeps_single_spaces() -> None:
    assert _text("one  two   three") == "one two three"


# --- hashing -----------------------------------------------------------------------------------


@pytest.mark.unit
def test_content_sha256_is_the_hex_digest_of_utf8_text() -> None:
    assert content_sha256("abc") == (
        "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad"
    )
    assert content_sha256("é") != content_sha256("e\u0301")


@pytest.mark.unit
def test_normalized_text_hash_is_of_its_text() -> None:
    result = normalize("Hello   world", ContentFormat.TEXT, PLAIN)

    assert isinstance(result, NormalizedText)
    assert result.sha256 == content_sha256("Hello world")


# --- PII ---------------------------------------------------------------------------------------


@pytest.mark.unit
def test_pii_is_kept_unless_redaction_is_configured() -> None:
    source = "Mail jane@example.com or call 555-123-4567."

    assert _text(source) == source
    assert normalize(source, ContentFormat.TEXT, PLAIN).redactions == {}


@pytest.mark.unit
@pytest.mark.parametrize(
    ("source", "expected"),
    [
        ("Write to jane.doe+tag@example.co.uk today.", "Write to [EMAIL] today."),
        ("Ping J_Smith@mail-server.example.org.", "Ping [EMAIL]."),
        ("Call +1 (555) 123-4567 now.", "Call [PHONE] now."),
        ("Call 555-123-4567.", "Call [PHONE]."),
        ("Call (555) 123-4567.", "Call [PHONE]."),
        ("Call 555.123.4567 please", "Call [PHONE] please"),
        ("UK office: +44 20 7946 0958.", "UK office: [PHONE]."),
        ("London: 020 7946 0958", "London: [PHONE]"),
        ("Paris: +33 6 12 34 56 78", "Paris: [PHONE]"),
        ("Berlin: +49-30-1234567", "Berlin: [PHONE]"),
    ],
)
def test_emails_and_phone_numbers_are_redacted(source: str, expected: str) -> None:
    assert normalize(source, ContentFormat.TEXT, REDACT).text == expected


@pytest.mark.unit
@pytest.mark.parametrize(
    "source",
    [
        "Released on 2024-01-15 at 2024-01-15T10:30:00Z.",
        "Dates like 05-06-2024 and 01.02.2024 stay.",
        "Upgrade to v2.14.3 or 10.0.19045.3693.",
        "Error E-1042 and ERR-555-1234 happened.",
        "Order 123456789012 and ORD-20240115-0042 shipped.",
        "Invoice #5551234567 is paid.",
        "Host 192.168.10.254 and 10.0.0.1 respond.",
        "Card-like 4111 1111 1111 1111 is not a phone.",
        "It costs 1,234,567.89 USD in 2023.",
        "Ratio 3.14159 and build 20240115.1.",
        "Call me @noon about user@localhost.",
    ],
)
def test_dates_versions_codes_ids_and_ips_are_not_redacted(source: str) -> None:
    assert normalize(source, ContentFormat.TEXT, REDACT).text == source


@pytest.mark.unit
def test_redaction_counts_are_recorded_per_kind() -> None:
    source = "a@example.com, b@example.com, +1 555 123 4567, version 1.2.3"

    result = normalize(source, ContentFormat.TEXT, REDACT)

    assert result.text == "[EMAIL], [EMAIL], [PHONE], version 1.2.3"
    assert result.redactions == {"email": 2, "phone": 1}


@pytest.mark.unit
def test_redaction_can_be_limited_to_one_kind() -> None:
    text, counts = redact_pii("a@example.com 555-123-4567", frozenset({"email"}))

    assert text == "[EMAIL] 555-123-4567"
    assert counts == {"email": 1}


@pytest.mark.unit
def test_redaction_applies_to_text_extracted_from_html() -> None:
    html = '<p>Contact <a href="mailto:x@example.com">x@example.com</a></p>'

    assert normalize(html, ContentFormat.HTML, REDACT).text == "Contact [EMAIL]"


@pytest.mark.unit
def test_dropping_controls_matches_the_unicode_categories_on_every_code_point() -> None:
    """The regex fast path removes exactly Cc (but newline and tab) and Cs, as the category
    test it replaced did, and the invisible BOM / zero-width space."""
    import unicodedata

    from ragcore.normalize import _drop_controls

    every = "".join(chr(i) for i in range(0x110000))
    expected = "".join(
        ch
        for ch in every
        if (ch in "\n\t" or unicodedata.category(ch) not in ("Cc", "Cs"))
        and ch not in "\ufeff\u200b"
    )
    assert _drop_controls(every) == expected
