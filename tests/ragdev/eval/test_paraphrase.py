"""The held-out paraphrase set: golden-corpus questions worded unlike their answers."""

from __future__ import annotations

import pytest

from ragcore.quality.dataset import QueryKind, load_evalset
from ragdev.eval import GOLDEN_PATH
from ragdev.eval.neardomain import neardomain_evalset
from ragdev.eval.paraphrase import content_words, paraphrase_evalset, word_overlap
from ragdev.eval.sets import NAMES, load_named

pytestmark = pytest.mark.unit


def test_the_set_has_forty_answerable_paraphrases_over_the_golden_corpus() -> None:
    evalset = paraphrase_evalset()
    golden = load_evalset(GOLDEN_PATH)
    assert evalset.entities == golden.entities
    assert len(evalset.queries) >= 40
    assert all(q.kind is QueryKind.PARAPHRASE and q.answerable for q in evalset.queries)
    assert all(list(q.relevant.values()).count(3) == 1 for q in evalset.queries)
    assert {q.tenant for q in evalset.queries} == {"acme", "globex"}


def test_every_question_is_worded_unlike_its_answer() -> None:
    """At most half of a question's content words occur in the entity that answers it."""
    evalset = paraphrase_evalset()
    for q in evalset.queries:
        answer = next(evalset.entity(e) for e, grade in q.relevant.items() if grade == 3)
        overlap = word_overlap(q.text, f"{answer.title}\n{answer.content}")
        assert overlap <= 0.5, (q.text, overlap)


def test_no_question_repeats_a_golden_or_neardomain_one() -> None:
    seen = {q.text.lower() for q in load_evalset(GOLDEN_PATH).queries}
    seen |= {q.text.lower() for q in neardomain_evalset().queries}
    assert not [q.text for q in paraphrase_evalset().queries if q.text.lower() in seen]


def test_word_overlap_by_hand() -> None:
    assert content_words("How long is the Lunch room open?") == {"long", "lunch", "room", "open"}
    # lunch, room of {long, lunch, room, open}
    assert word_overlap("How long is the lunch room open?", "The lunch room.") == 0.5
    assert word_overlap("how is it", "anything") == 0.0  # stop words only


def test_the_set_is_a_named_dataset() -> None:
    assert "paraphrase" in NAMES
    assert load_named("paraphrase").name == "ragstream-paraphrase"
