"""The parity gate's decision logic and its known-item queries (pure: the search is a table)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from ragcore.quality.dataset import EvalQuery, QueryKind
from ragcore.quality.errors import EvalDataError
from ragcore.quality.metrics import QueryRun, Status
from ragstream.parity import (
    ParitySettings,
    SearchFn,
    known_item_queries,
    load_queries,
    parity_check,
)
from schemas.entities import Entity

pytestmark = pytest.mark.unit


def entity(n: int, text: str) -> Entity:
    return Entity(
        tenant_id="acme",
        entity_id=f"e{n}",
        entity_type="DOC",
        content=text,
        content_hash=f"{n:064x}",
    )


CORPUS = [
    entity(n, f"Short. The pump number {n} needs a valve check every spring and autumn season.")
    for n in range(50)
] + [entity(99, "Too short. Tiny.")]


def test_known_item_queries_are_a_seeded_sample_of_long_enough_sentences() -> None:
    settings = ParitySettings(sample=10, seed=4, min_query_words=6, max_query_words=8)
    queries = known_item_queries(CORPUS, "acme", settings)
    assert len(queries) == 10
    assert queries == known_item_queries(CORPUS, "acme", settings)  # deterministic
    assert queries != known_item_queries(CORPUS, "acme", settings.model_copy(update={"seed": 5}))
    for q in queries:
        (target,) = q.relevant
        assert q.kind is QueryKind.KNOWN_ITEM and q.answerable
        assert q.text.startswith("The pump number") and len(q.text.split()) == 8
        assert f"number {target[1:]} " in q.text + " "
    assert "e99" not in {e for q in queries for e in q.relevant}  # no sentence of 6+ words


def _queries(n: int) -> list[EvalQuery]:
    return known_item_queries(CORPUS[:n], "acme", ParitySettings(sample=n))


def _search(hits_new: set[str]) -> SearchFn:
    """Old version: the target first. New version: the target first only for `hits_new`."""

    def search(query: EvalQuery, version: int) -> QueryRun:
        (target,) = query.relevant
        found = version == 1 or query.query_id in hits_new
        ranked = (target, "x", "y") if found else ("x", "y", "z")
        return QueryRun(query.query_id, Status.SUCCESS, entity_ids=ranked)

    return search


def test_the_gate_passes_within_the_tolerance_and_fails_beyond_it() -> None:
    queries = _queries(40)
    ids = [q.query_id for q in queries]
    settings = ParitySettings(tolerance=0.05)
    one_lost = parity_check(
        queries,
        _search(set(ids[1:])),
        old_version=1,
        new_version=2,
        settings=settings,
        source="test",
    )
    assert one_lost.passed and one_lost.deltas["recall@5"] == pytest.approx(-1 / 40)
    three_lost = parity_check(
        queries,
        _search(set(ids[3:])),
        old_version=1,
        new_version=2,
        settings=settings,
        source="test",
    )
    assert not three_lost.passed
    assert three_lost.deltas["mrr@10"] == pytest.approx(-3 / 40)
    assert any(
        f.startswith("recall@5 fell from 1.0000 (v1) to 0.9250 (v2)") for f in three_lost.failures
    )
    doc = three_lost.to_dict()
    assert doc["passed"] is False and doc["significance"]["ndcg@5"]["mean_diff"] < 0


def test_operator_queries_are_read_per_tenant_and_refused_when_none_apply(tmp_path: Path) -> None:
    query = {
        "query_id": "q1",
        "text": "valve check",
        "tenant": "acme",
        "kind": "paraphrase",
        "answerable": True,
        "relevant": {"e1": 3},
    }
    path = tmp_path / "q.json"
    path.write_text(json.dumps([query, {**query, "query_id": "q2", "tenant": "other"}]))
    assert [q.query_id for q in load_queries(path, "acme")] == ["q1"]
    with pytest.raises(EvalDataError, match="no answerable queries for tenant 'nobody'"):
        load_queries(path, "nobody")
    path.write_text("{not json")
    with pytest.raises(EvalDataError, match="cannot read parity queries"):
        load_queries(path, "acme")
