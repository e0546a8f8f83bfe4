"""The documents eval set: generated files whose questions name the page, section or row block
that answers them."""

from __future__ import annotations

from collections import Counter

import pytest

from ragcore.documents import decode_document
from ragcore.documents.extract import Limits, extract
from ragcore.quality.dataset import LOCATOR_SEPARATOR, parse_passage_id
from ragdev.eval.documents import HYDRA, HYDRA_PAGES, TENANT, documents_evalset
from ragdev.eval.sets import NAMES, load_named
from schemas.entities import ContentFormat

pytestmark = pytest.mark.unit


def test_three_pdfs_and_two_office_files_with_thirty_questions() -> None:
    evalset = documents_evalset()
    formats = Counter(e.format for e in evalset.entities)
    assert formats[ContentFormat.PDF] >= 3
    assert formats[ContentFormat.DOCX] + formats[ContentFormat.XLSX] >= 2
    assert len(evalset.queries) >= 30
    assert all(q.expected_passage and q.answerable for q in evalset.queries)
    assert {e.tenant for e in evalset.entities} == {q.tenant for q in evalset.queries} == {TENANT}


def test_every_expected_passage_is_a_passage_of_its_file() -> None:
    """The locators are the extractor's own citations (file name left out), and every file's
    question covers at least one passage each of several."""
    evalset = documents_evalset()
    passages: dict[str, set[str]] = {}
    for e in evalset.entities:
        extracted = extract(e.format.value, decode_document(e.content), Limits())
        assert extracted.pages > 1, e.entity_id  # multi-page / multi-section / multi-block
        passages[e.entity_id] = {LOCATOR_SEPARATOR.join(s.path) for s in extracted.segments}
    for q in evalset.queries:
        assert q.expected_passage is not None
        entity_id, locator = parse_passage_id(q.expected_passage)
        assert q.relevant == {entity_id: 3}
        assert locator in passages[entity_id], (q.query_id, locator, sorted(passages[entity_id]))


def test_questions_whose_words_are_on_several_pages() -> None:
    """The product's name is on every page of its manual: it cannot pick the page."""
    assert all(any("Hydra-7" in line for line in page) for page in HYDRA_PAGES)
    evalset = documents_evalset()
    hydra = [q for q in evalset.queries if (q.expected_passage or "").startswith(f"{HYDRA}#")]
    assert len({q.expected_passage for q in hydra}) >= 8
    assert sum("Hydra-7" in q.text for q in hydra) >= 6


def test_the_files_are_the_same_on_every_load() -> None:
    first, second = documents_evalset(), documents_evalset()
    for a, b in zip(first.entities, second.entities, strict=True):
        # PDFs are byte-identical; a ZIP package carries its write time, so compare text
        fmt = a.format.value
        left = extract(fmt, decode_document(a.content), Limits()).segments
        right = extract(fmt, decode_document(b.content), Limits()).segments
        assert left == right


def test_the_set_is_a_named_dataset() -> None:
    assert "documents" in NAMES
    assert load_named("documents").name == "ragstream-documents"
