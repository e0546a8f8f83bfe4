"""The near-domain eval set: near misses the corpus cannot answer, reworded questions it can."""

from __future__ import annotations

import pytest

from ragcore.quality.dataset import QueryKind
from ragdev.eval.neardomain import UNANSWERABLE, neardomain_evalset
from ragdev.eval.sets import NAMES, load_named

pytestmark = pytest.mark.unit


def test_the_set_has_thirty_near_misses_and_thirty_reworded_answerable_questions() -> None:
    evalset = neardomain_evalset()
    unanswerable = [q for q in evalset.queries if not q.answerable]
    answerable = [q for q in evalset.queries if q.answerable]
    assert len(unanswerable) >= 30 and len(answerable) >= 30
    assert all(q.kind is QueryKind.UNANSWERABLE and not q.relevant for q in unanswerable)
    assert all(q.relevant and max(q.relevant.values()) == 3 for q in answerable)
    assert {q.tenant for q in unanswerable} == {q.tenant for q in answerable} == {"acme", "globex"}
    assert len({q.query_id for q in evalset.queries}) == len(evalset.queries)


def test_judged_entities_belong_to_the_query_tenant() -> None:
    evalset = neardomain_evalset()
    tenant_of = {e.entity_id: e.tenant for e in evalset.entities}
    for q in evalset.queries:
        assert all(tenant_of[entity] == q.tenant for entity in q.relevant), q.query_id


def test_the_absent_fact_of_every_near_miss_is_absent_from_its_tenant_corpus() -> None:
    evalset = neardomain_evalset()
    for tenant, question, absent in UNANSWERABLE:
        texts = [f"{e.title}\n{e.content}".lower() for e in evalset.entities if e.tenant == tenant]
        assert not any(absent in t for t in texts), (question, absent)


def test_the_set_is_a_named_dataset() -> None:
    assert "neardomain" in NAMES
    assert load_named("neardomain").name == "neardomain"
