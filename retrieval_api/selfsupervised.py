"""Self-supervised calibration queries: built from an index's own chunks, no labels from people.

Real questions are about what a chunk is *about*, rarely a verbatim line of it; and questions a
corpus cannot answer are rarely off-topic, they ask about something near the corpus that is not
in it. The generator mimics both with the same question frames on each side, so a frame is never
a tell:

Positives (the chunk the query was built from answers it):
- `title`: the entity's title, or its title and the chunk's section heading;
- `topic`: the chunk's characteristic words (highest TF-IDF), as keywords or in a question frame;
- `sentence`: a sentence of the chunk (8..24 words);
- `paraphrase`: a title, topic or sentence query in which every content word that has a near
  neighbour (`retrieval_api.synonyms`) is replaced by it: the vocabulary mismatch of a real
  question (the largest share of the positives: see docs/decisions/abstention-threshold.md);
- `identifier`: an identifier of the chunk (error code, ticket or part number), bare or in a
  question template; every chunk holding it answers.
Negatives (nothing in the index answers them):
- `background`: questions from another source (`retrieval_api.calibration_questions`);
- `absent_focus`: a question frame around a focus word the index does not contain (from the
  background questions) and a common word of the corpus: near-domain questions it cannot answer;
- `mixture`: the characteristic words of two unrelated chunks in one question frame;
- `unknown_identifier`: an identifier of the corpus' shape that occurs nowhere in it
  (`E-2113` -> `E-7405`), in the same templates as the positives.

Reproducible: a seeded `random.Random` over the chunks sorted by chunk id.
"""

from __future__ import annotations

import math
import random
import re
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass

from ragcore.sparse import Bm25Encoder, LexiconStats, is_identifier
from retrieval_api.calibration_questions import BACKGROUND_QUESTIONS
from retrieval_api.synonyms import neighbours

_SENTENCE = re.compile(r"[^.!?\n]+")
_STRIP = "\"'`*#()[]{}<>,;:!?.-_=|"
_LETTERS = re.compile(r"^[^\W\d_]{3,}$")
#: Question frames shared by positives and negatives ({x}: the query's content words).
FRAMES: tuple[str, ...] = (
    "{x}",
    "what is the {x}?",
    "how does {x} work?",
    "tell me about {x}",
    "what are the rules for {x}?",
    "where can I find {x}?",
    "when is {x} due?",
    "who is responsible for {x}?",
    "how do I handle {x}?",
    "is there a policy on {x}?",
)
ID_TEMPLATES: tuple[str, ...] = (
    "{id}",
    "what does {id} mean?",
    "{id} status",
    "what is {id}?",
    "details about {id}",
    "how do I fix {id}?",
)
POSITIVE_MIX: dict[str, float] = {
    "title": 0.10,
    "topic": 0.25,
    "sentence": 0.05,
    "paraphrase": 0.40,
    "identifier": 0.20,
}
#: Share of a paraphrase's content words that get replaced (at least).
PARAPHRASE_SHARE = 0.5
NEGATIVE_MIX: dict[str, float] = {
    "background": 0.20,
    "absent_focus": 0.35,
    "mixture": 0.25,
    "unknown_identifier": 0.20,
}
#: Corpus words in at least / at most this share of chunks are "common" (absent_focus).
COMMON_DF = (0.03, 0.5)


@dataclass(frozen=True, slots=True)
class IndexedChunk:
    """One chunk of the index, as its payload holds it."""

    chunk_id: str
    entity_id: str
    title: str
    text: str
    heading: str = ""


@dataclass(frozen=True, slots=True)
class CalibrationQuery:
    """A generated query and what answers it (nothing, for a negative)."""

    text: str
    kind: str
    answerable: bool
    chunk_id: str | None = None  # the chunk it was built from
    entity_id: str | None = None
    passage: str | None = None  # text whose presence in a chunk makes that chunk an answer
    identifier: str | None = None  # a chunk holding this token answers (identifier queries)


def _words(sentence: str) -> list[str]:
    return [w.strip(_STRIP) for w in sentence.split() if w.strip(_STRIP)]


def squash(text: str) -> str:
    """Lower case, single spaces, no surrounding punctuation: how passages are compared."""
    return " ".join(_words(text.lower()))


class QueryGenerator:
    """Builds the calibration queries of one index (see the module docstring)."""

    def __init__(
        self,
        chunks: Sequence[IndexedChunk],
        encoder: Bm25Encoder,
        lexicon: LexiconStats,
        *,
        seed: int = 0,
        background: Sequence[str] = BACKGROUND_QUESTIONS,
    ) -> None:
        """Sample from `chunks` (sorted by chunk id first) with `seed`."""
        self._chunks = sorted(chunks, key=lambda c: c.chunk_id)
        if not self._chunks:
            raise ValueError("an index without chunks cannot be calibrated")
        self._encoder = encoder
        self._lexicon = lexicon
        self._rng = random.Random(seed)
        self._questions = list(background)
        stop = encoder.config.stopwords
        foreign = {w.lower() for q in background for w in _words(q) if self._content_word(w, stop)}
        # words of the background questions the index does not contain
        self._foreign = sorted(w for w in foreign if not self._known(w))
        corpus_words = sorted(
            {w.lower() for c in self._chunks for w in _words(c.text) if self._content_word(w, stop)}
        )
        n = max(1, lexicon.n_docs)
        low, high = COMMON_DF
        self._common = [w for w in corpus_words if low <= self._df(w) / n <= high] or corpus_words
        self._identifiers = sorted(
            {w for c in self._chunks for w in _words(c.text) if is_identifier(w)}
        )
        self._topics: dict[str, list[str]] = {}

    @staticmethod
    def _content_word(word: str, stop: frozenset[str]) -> bool:
        return _LETTERS.match(word) is not None and word.lower() not in stop

    def _df(self, word: str) -> int:
        tokens = self._encoder.tokenize(word)
        return min((self._lexicon.doc_freq(t) for t in tokens), default=0)

    def _known(self, word: str) -> bool:
        return any(self._lexicon.doc_freq(t) > 0 for t in self._encoder.tokenize(word))

    def topic_words(self, chunk: IndexedChunk, k: int = 6) -> list[str]:
        """The chunk's characteristic words: highest TF-IDF first, one surface form per stem."""
        found = self._topics.get(chunk.chunk_id)
        if found is not None:
            return found[:k]
        stop = self._encoder.config.stopwords
        words = [w.lower() for w in _words(chunk.text) if self._content_word(w, stop)]
        by_stem: dict[str, str] = {}
        tf: Counter[str] = Counter()
        for w in words:
            tokens = self._encoder.tokenize(w)
            if not tokens:  # longer than the encoder's max_token_len: BM25 cannot match it
                continue
            stem = tokens[0]
            by_stem.setdefault(stem, w)
            tf[stem] += 1
        scored = sorted(
            tf, key=lambda s: (-(1 + math.log(tf[s])) * self._lexicon.idf(s), by_stem[s])
        )
        found = [by_stem[s] for s in scored]
        self._topics[chunk.chunk_id] = found
        return found[:k]

    def _chunk(self) -> IndexedChunk:
        return self._rng.choice(self._chunks)

    def _frame(self, words: Sequence[str]) -> str:
        return self._rng.choice(FRAMES).format(x=" ".join(words))

    def _plan(self, total: int, mix: dict[str, float], drop: set[str]) -> list[str]:
        kinds = [k for k in mix if k not in drop]
        weight = sum(mix[k] for k in kinds)
        counts = {k: round(total * mix[k] / weight) for k in kinds}
        plan = [k for k in kinds for _ in range(counts[k])]
        self._rng.shuffle(plan)
        return plan[:total]

    def generate(self, positives: int, negatives: int) -> list[CalibrationQuery]:
        """`positives` answerable and `negatives` unanswerable queries (fewer when the index is
        too small to build some kinds: a kind that cannot be built gives way)."""
        drop = set() if self._identifiers else {"identifier", "unknown_identifier"}
        out: list[CalibrationQuery] = []
        seen: set[str] = set()
        for kind in self._plan(positives, POSITIVE_MIX, drop) + self._plan(
            negatives, NEGATIVE_MIX, drop
        ):
            for _ in range(20):  # a few tries: some chunks cannot give some kinds
                query = getattr(self, f"_make_{kind}")()
                if query is not None and squash(query.text) and squash(query.text) not in seen:
                    seen.add(squash(query.text))
                    out.append(query)
                    break
        return out

    # --- positives -------------------------------------------------------------------------

    def _make_title(self) -> CalibrationQuery | None:
        chunk = self._chunk()
        text = chunk.title
        if (
            chunk.heading
            and squash(chunk.heading) != squash(chunk.title)
            and self._rng.random() < 0.7
        ):
            text = f"{chunk.title} {chunk.heading}" if self._rng.random() < 0.5 else chunk.heading
        if len(_words(text)) < 2:
            return None
        return CalibrationQuery(text, "title", True, chunk.chunk_id, chunk.entity_id)

    def _make_topic(self) -> CalibrationQuery | None:
        chunk = self._chunk()
        top = self.topic_words(chunk)
        if len(top) < 3:
            return None
        picked = self._rng.sample(top[:5], self._rng.randint(2, 3))
        return CalibrationQuery(self._frame(picked), "topic", True, chunk.chunk_id, chunk.entity_id)

    def _make_sentence(self) -> CalibrationQuery | None:
        chunk = self._chunk()
        sentences = [w for w in (_words(s) for s in _SENTENCE.findall(chunk.text)) if len(w) >= 8]
        if not sentences:
            return None
        text = " ".join(self._rng.choice(sentences)[:24])
        return CalibrationQuery(text, "sentence", True, chunk.chunk_id, chunk.entity_id, text)

    def _make_identifier(self) -> CalibrationQuery | None:
        chunk = self._chunk()
        found = [w for w in _words(chunk.text) if is_identifier(w)]
        if not found:
            return None
        token = self._rng.choice(found)
        text = self._rng.choice(ID_TEMPLATES).format(id=token)
        return CalibrationQuery(
            text, "identifier", True, chunk.chunk_id, chunk.entity_id, identifier=token.lower()
        )

    def _make_paraphrase(self) -> CalibrationQuery | None:
        maker = self._rng.choice((self._make_topic, self._make_title, self._make_sentence))
        source = maker()
        if source is None:
            return None
        table = neighbours()
        stop = self._encoder.config.stopwords
        words = source.text.split()
        content = [i for i, w in enumerate(words) if self._content_word(w.strip(_STRIP), stop)]
        swappable = [i for i in content if words[i].strip(_STRIP).lower() in table]
        if not content or len(swappable) < PARAPHRASE_SHARE * len(content):
            return None
        # every word that has a neighbour is replaced: a real question shares few of the
        # answer's words, and a paraphrase that keeps most of them teaches the evidence model
        # that an answer is the chunk with the query's words
        for i in swappable:
            word = words[i].strip(_STRIP).lower()
            words[i] = words[i].lower().replace(word, table[word][0])
        return CalibrationQuery(
            " ".join(words), "paraphrase", True, source.chunk_id, source.entity_id
        )

    # --- negatives -------------------------------------------------------------------------

    def _make_background(self) -> CalibrationQuery | None:
        return CalibrationQuery(self._rng.choice(self._questions), "background", False)

    def _make_absent_focus(self) -> CalibrationQuery | None:
        if not self._foreign or not self._common:
            return None
        words = [self._rng.choice(self._foreign)]
        if self._rng.random() < 0.4:
            words.append(self._rng.choice(self._foreign))
        words += self._rng.sample(self._common, min(len(self._common), self._rng.randint(1, 2)))
        self._rng.shuffle(words)
        return CalibrationQuery(self._frame(words), "absent_focus", False)

    def _make_mixture(self) -> CalibrationQuery | None:
        first, second = self._chunk(), self._chunk()
        if first.entity_id == second.entity_id:
            return None
        a, b = self.topic_words(first, 3), self.topic_words(second, 3)
        if not a or not b:
            return None
        words = [self._rng.choice(a), self._rng.choice(b)]
        if set(words[0:1]) & set(b) or set(words[1:2]) & set(a):
            return None  # a word characteristic of both chunks makes no mixture
        self._rng.shuffle(words)
        return CalibrationQuery(self._frame(words), "mixture", False)

    def _unknown_like(self, identifier: str) -> str | None:
        for _ in range(20):
            if any(c.isdigit() for c in identifier):
                mutated = "".join(
                    str(self._rng.randrange(10)) if c.isdigit() else c for c in identifier
                )
            else:
                mutated = f"{identifier}-{self._rng.randrange(100, 999)}"
            if self._lexicon.doc_freq(mutated.lower()) == 0:
                return mutated
        return None

    def _make_unknown_identifier(self) -> CalibrationQuery | None:
        unknown = self._unknown_like(self._rng.choice(self._identifiers))
        if unknown is None:
            return None
        text = self._rng.choice(ID_TEMPLATES).format(id=unknown)
        return CalibrationQuery(text, "unknown_identifier", False)
