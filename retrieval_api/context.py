"""Context around results under a token budget (`RetrieveRequest.max_context_tokens`).

A caller building a prompt says how many tokens of evidence it can take. Before the pack is
assembled (`plan_context`, pure) every result's text and the text around it are counted with
the index's embedding model tokenizer and placed in two passes, best result first:

1. the results' own texts: a text that does not fit what is left is dropped (RESULT_DROPPED),
   except the first result's, which is cut to the budget (TEXT_TRUNCATED) so that a pack with
   evidence never loses it to the budget;
2. the context of each kept result (the end of the previous chunk of its entity and the start
   of the next, overlap removed): whole when it fits, else cut to what is left, the budget split
   evenly between before and after and the text nearest the result kept (CONTEXT_TRUNCATED);
   nothing left: CONTEXT_DROPPED.

Counts are per piece (the text, the context before, the context after); a prompt that joins
them may tokenize a few tokens differently at the joins.

The neighbouring chunks come from the store in one batched read (`neighbour_ids` names them:
same entity, chunk index - 1 and + 1) and are trimmed of the overlap with the result by their
locators (`context_of`).
"""

from __future__ import annotations

import re
import threading
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from enum import StrEnum
from typing import Any, Protocol

from ragcore.tokenizers import TokenCounter

#: Chunk ids are `<entity id>:chunk:<n>` (schemas.entities.Chunk).
CHUNK_SEPARATOR = ":chunk:"


class BudgetAction(StrEnum):
    """What the budget cut (mirrors the proto's `BudgetAction`)."""

    TEXT_TRUNCATED = "text_truncated"
    RESULT_DROPPED = "result_dropped"
    CONTEXT_TRUNCATED = "context_truncated"
    CONTEXT_DROPPED = "context_dropped"


@dataclass(frozen=True, slots=True)
class Context:
    """The text around a result, before the budget: `chunk_ids` in document order."""

    before: str = ""
    after: str = ""
    chunk_ids: tuple[str, ...] = ()


@dataclass(frozen=True, slots=True)
class Cut:
    """One thing the budget cut."""

    chunk_id: str
    action: BudgetAction
    tokens_before: int
    tokens_after: int


@dataclass(frozen=True, slots=True)
class Placed:
    """A result as the budget lets it into the pack."""

    chunk_id: str
    text: str
    text_tokens: int
    context: Context
    context_tokens: int
    context_truncated: bool


@dataclass(frozen=True)
class ContextPlan:
    """The budget's decisions, applied by `retrieval_api.evidence.build_pack`."""

    max_tokens: int
    tokenizer: str
    placed: Mapping[str, Placed]  # by chunk id; a result absent here was dropped
    cuts: tuple[Cut, ...] = ()
    used: int = 0
    dropped: frozenset[str] = field(default_factory=frozenset)


def neighbour_ids(chunk_id: str) -> tuple[str | None, str | None]:
    """The chunk ids before (None for the first chunk) and after `chunk_id` in its entity
    (`<entity>:chunk:<n>`); (None, None) for an id of another form."""
    entity, sep, index = chunk_id.rpartition(CHUNK_SEPARATOR)
    if not sep or not index.isdigit():
        return None, None
    n = int(index)
    previous = f"{entity}{CHUNK_SEPARATOR}{n - 1}" if n > 0 else None
    return previous, f"{entity}{CHUNK_SEPARATOR}{n + 1}"


#: The payload keys this module reads of a result and of its neighbours (which
#: `Retriever.context_plan` reads with these and the chunk id); see `ranking.PAYLOAD_KEYS`.
PAYLOAD_KEYS: tuple[str, ...] = ("locator", "text")


class _HasPayload(Protocol):
    @property
    def chunk_id(self) -> str: ...

    @property
    def payload(self) -> Mapping[str, Any]: ...


def _span(payload: Mapping[str, Any]) -> tuple[int, int] | None:
    locator = payload.get("locator")
    if not isinstance(locator, Mapping):
        return None
    start, end = locator.get("char_start"), locator.get("char_end")
    if isinstance(start, int) and isinstance(end, int) and 0 <= start <= end:
        return start, end
    return None


def _text(payload: Mapping[str, Any]) -> str:
    value = payload.get("text")
    return value if isinstance(value, str) else ""


def context_of(chunk: _HasPayload, neighbours: Mapping[str, Mapping[str, Any]]) -> Context:
    """The context of one result from its neighbours' payloads (by chunk id): the previous
    chunk's text up to where the result starts, the next chunk's text from where the result
    ends (the overlap removed when both locators agree with the texts' lengths)."""
    previous, following = neighbour_ids(chunk.chunk_id)
    span = _span(chunk.payload)
    before = after = ""
    if previous is not None and previous in neighbours:
        before = _text(neighbours[previous])
        theirs = _span(neighbours[previous])
        if span is not None and theirs is not None and theirs[1] - theirs[0] == len(before):
            before = before[: max(0, min(len(before), span[0] - theirs[0]))]
    if following is not None and following in neighbours:
        after = _text(neighbours[following])
        theirs = _span(neighbours[following])
        if span is not None and theirs is not None and theirs[1] - theirs[0] == len(after):
            after = after[max(0, min(len(after), span[1] - theirs[0])) :]
    used = tuple(c for c, t in ((previous, before), (following, after)) if c is not None and t)
    return Context(before, after, used)


#: Tokens per whitespace-separated word, and per text, by tokenizer name (a context-free
#: tokenizer counts a text as the sum of its words; chunk vocabularies and texts repeat, so
#: counting is mostly dict lookups). Bounded: cleared when full.
_WORDS: dict[str, dict[str, int]] = {}
_TEXTS: dict[str, dict[str, int]] = {}
_MEMO_MAX = 200_000
_LOCK = threading.Lock()
_WORD_RE = re.compile(r"\S+")


class _Counts:
    """Counts, cuts at a token count and measures texts with the request's tokenizer.

    With a context-free tokenizer (`TokenCounter.token_starts` is not None: WordPiece behind
    BERT's pre-tokenizer, a token never crosses whitespace) a text's count is the sum of its
    words' counts, each remembered; the texts of a request holding unknown words are tokenized
    once, in one batch (`prime`), and their tokens assigned to words by offset. Cuts fall on
    word boundaries. Other tokenizers count and cut whole texts (`count`, `prefix_end`).
    """

    def __init__(self, counter: TokenCounter) -> None:
        self.counter = counter
        name = getattr(counter, "name", "")
        self.by_word = counter.token_starts("a b") is not None
        with _LOCK:
            self._words = _WORDS.setdefault(name, {})
            self._texts = _TEXTS.setdefault(name, {})

    def warm(self, texts: Sequence[str]) -> None:
        """Learn the words of `texts` that are not known yet (one batch)."""
        if not self.by_word:
            return
        known = self._words.keys()
        cold = [
            t for t in dict.fromkeys(texts) if t not in self._texts and not known >= set(t.split())
        ]
        if not cold:
            return
        self.counter.prime(cold)
        learned: dict[str, int] = {}
        for text in cold:
            starts = self.counter.token_starts(text) or []
            spans = list(_WORD_RE.finditer(text))
            tokens = [0] * len(spans)
            i = 0
            for start in starts:
                while i < len(spans) and spans[i].end() <= start:
                    i += 1
                if i < len(spans):
                    tokens[i] += 1
            learned.update((m.group(), n) for m, n in zip(spans, tokens, strict=True))
        with _LOCK:
            if len(self._words) + len(learned) > _MEMO_MAX:
                self._words.clear()
            self._words.update(learned)

    def _word(self, word: str) -> int:
        known = self._words.get(word)
        if known is None:
            known = self._words[word] = self.counter.count(word)
        return known

    def __call__(self, text: str) -> int:
        if not text:
            return 0
        if not self.by_word:
            return self.counter.count(text)
        n = self._texts.get(text)
        if n is None:
            try:
                n = sum(map(self._words.__getitem__, text.split()))
            except KeyError:
                n = sum(self._word(w) for w in text.split())
            with _LOCK:
                if len(self._texts) >= _MEMO_MAX:
                    self._texts.clear()
                self._texts[text] = n
        return n

    def prefix(self, text: str, tokens: int) -> str:
        """The longest prefix of `text` of at most `tokens` tokens."""
        if tokens <= 0:
            return ""
        if not self.by_word:
            return _prefix(self.counter, text, tokens)
        used, end = 0, 0
        for m in _WORD_RE.finditer(text):
            used += self._word(m.group())
            if used > tokens:
                break
            end = m.end()
        else:
            return text
        return text[:end]

    def suffix(self, text: str, tokens: int) -> str:
        """The longest suffix of `text` of at most `tokens` tokens."""
        if tokens <= 0:
            return ""
        if not self.by_word:
            return _suffix(self.counter, text, tokens)
        # words from the end, on the reversed text: stops after `tokens` tokens instead of
        # listing every word of a long text first (its allocations cost a loaded process's
        # garbage collector more than linear time)
        used, start, size = 0, len(text), len(text)
        for m in _WORD_RE.finditer(text[::-1]):
            used += self._word(m.group()[::-1])
            if used > tokens:
                return text[start:]
            start = size - m.end()
        return text


def _prefix(counter: TokenCounter, text: str, tokens: int) -> str:
    """The longest prefix of `text` the counter counts at most `tokens` tokens for."""
    end = counter.prefix_end(text, tokens)
    while end > 0 and counter.count(text[:end]) > tokens:  # BPE merges across the cut
        end = counter.prefix_end(text, counter.count(text[:end]) - 1)
    return text[:end]


def _suffix(counter: TokenCounter, text: str, tokens: int) -> str:
    """The longest suffix of `text` (starting after a space when it can) of at most `tokens`."""
    if not text or counter.count(text) <= tokens:
        return text
    low, high = 0, len(text)  # binary search on the start offset: fewer tokens as it grows
    while low < high:
        mid = (low + high) // 2
        if counter.count(text[mid:]) <= tokens:
            high = mid
        else:
            low = mid + 1
    space = text.find(" ", low)
    start = space + 1 if 0 <= space < len(text) - 1 else low
    return text[start:]


def plan_context(
    results: Sequence[tuple[str, str, Context]], counter: TokenCounter, max_tokens: int
) -> ContextPlan:
    """Place `results` ((chunk id, text, context), best first) within `max_tokens`; see the
    module docstring."""
    if max_tokens < 1:
        raise ValueError(f"max_tokens must be >= 1, got {max_tokens}")
    count = _Counts(counter)
    count.warm([t for _, text, c in results for t in (text, c.before, c.after)])
    cuts: list[Cut] = []
    used = 0
    texts: dict[str, tuple[str, int]] = {}
    dropped: set[str] = set()
    for i, (chunk_id, text, _context) in enumerate(results):
        n = count(text)
        if used + n <= max_tokens:
            texts[chunk_id] = (text, n)
            used += n
        elif i == 0:
            cut = count.prefix(text, max_tokens)
            m = count(cut)
            texts[chunk_id] = (cut, m)
            used += m
            cuts.append(Cut(chunk_id, BudgetAction.TEXT_TRUNCATED, n, m))
        else:
            dropped.add(chunk_id)
            cuts.append(Cut(chunk_id, BudgetAction.RESULT_DROPPED, n, 0))
    placed: dict[str, Placed] = {}
    for chunk_id, _, context in results:
        if chunk_id not in texts:
            continue
        text, n = texts[chunk_id]
        b, a = count(context.before), count(context.after)
        left = max_tokens - used
        truncated = False
        kept = context
        if b + a > left:
            if left <= 0:
                kept = Context()
                cuts.append(Cut(chunk_id, BudgetAction.CONTEXT_DROPPED, b + a, 0))
            else:
                # half each, the unused part of one side going to the other
                keep_b = min(b, max(left // 2, left - a))
                before = count.suffix(context.before, keep_b)
                after = count.prefix(context.after, left - count(before))
                kept = Context(before, after, context.chunk_ids)
                truncated = True
            whole = b + a
            b, a = count(kept.before), count(kept.after)
            if truncated:
                cuts.append(Cut(chunk_id, BudgetAction.CONTEXT_TRUNCATED, whole, b + a))
        used += b + a
        placed[chunk_id] = Placed(chunk_id, text, n, kept, b + a, truncated)
    return ContextPlan(
        max_tokens=max_tokens,
        tokenizer=getattr(counter, "name", ""),
        placed=placed,
        cuts=tuple(cuts),
        used=used,
        dropped=frozenset(dropped),
    )
