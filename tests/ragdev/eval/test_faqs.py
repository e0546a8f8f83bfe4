"""The FAQ question-answering benchmark: parsing, BEIR files, loading."""

from __future__ import annotations

import gzip
from pathlib import Path

import pytest

from ragdev.eval.beir import load_beir
from ragdev.eval.faqs import collect, parse_numbered, parse_qa, write_beir

pytestmark = pytest.mark.unit

NUMBERED = """Table of Contents:

1.0\tGeneral
1.1\tWhat is frobnicate?
1.2\tWhy does frobnicate report
\tthe wrong size?

1.0\tGeneral

1.1\tWhat is frobnicate?

\tFrobnicate is a tool that rewrites files in place, keeping a backup of every
\tfile it touches so that a mistake can always be undone later on.

1.2\tWhy does frobnicate report
\tthe wrong size?

\tThe size comes from the file system cache, which lags behind the disk on some
\tkernels; run sync first and the reported size matches the real one.
\t  1. This numbered item is part of the answer, not a heading.
"""

QA = """Q:  What do the letters XZ mean?

A:  Nothing. They are just two letters, which come from the file format suffix
    used by the tool since its very first public release.

Q:  Too short?

A:  Yes.
"""


def test_numbered_faq_questions_come_with_the_answer_from_the_body() -> None:
    entries = parse_numbered("frob", NUMBERED)
    assert [(e.number, e.question) for e in entries] == [
        ("1.1", "What is frobnicate?"),
        ("1.2", "Why does frobnicate report the wrong size?"),
    ]
    assert entries[0].answer.startswith("Frobnicate is a tool")
    assert "the wrong size?" not in entries[1].answer
    assert "numbered item is part of the answer" in entries[1].answer


def test_question_and_answer_pairs_drop_answers_too_short_to_retrieve() -> None:
    entries = parse_qa("xz", QA)
    assert [e.question for e in entries] == ["What do the letters XZ mean?"]


def test_faq_files_become_a_beir_directory_the_loader_reads(tmp_path: Path) -> None:
    source = tmp_path / "FAQ.gz"
    source.write_bytes(gzip.compress(NUMBERED.encode()))
    entries, absent = collect([("frob", source, "numbered"), ("nope", tmp_path / "x", "qa")])
    assert absent == [str(tmp_path / "x")] and len(entries) == 2
    assert write_beir(tmp_path / "beir", entries) == 2
    evalset = load_beir(tmp_path / "beir", tenant="faqs")
    assert len(evalset.queries) == 2 and len(evalset.entities) == 2
    query = evalset.queries[0]
    assert query.text == "What is frobnicate?" and query.relevant == {"frob-1.1": 1}
