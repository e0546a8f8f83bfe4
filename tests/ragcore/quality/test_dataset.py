"""Eval set model: validation rules, JSON round trip, the committed schema and the golden set."""

from __future__ import annotations

import json
from collections import Counter
from pathlib import Path
from typing import Any

import pytest
from pydantic import ValidationError

from ragcore.quality.dataset import (
    EvalEntity,
    EvalSet,
    QueryKind,
    dump_evalset,
    dump_json_schema,
    load_evalset,
    locate_answer,
    parse_chunk_id,
    parse_evalset,
    parse_passage_id,
    passage_id,
    passage_within,
    relocate_expected_chunks,
    save_evalset,
)
from ragcore.quality.errors import EvalDataError
from ragdev.eval import GOLDEN_PATH, SCHEMA_PATH

pytestmark = pytest.mark.unit


def entity(entity_id: str, tenant: str = "acme", content: str = "Some text.") -> dict[str, Any]:
    return {
        "entity_id": entity_id,
        "tenant": tenant,
        "entity_type": "KNOWLEDGE_ARTIFACT",
        "content": content,
    }


def query(query_id: str, relevant: dict[str, int], **extra: Any) -> dict[str, Any]:
    data: dict[str, Any] = {
        "query_id": query_id,
        "text": "what?",
        "tenant": "acme",
        "kind": "paraphrase" if relevant else "unanswerable",
        "answerable": bool(relevant),
        "relevant": relevant,
    }
    data.update(extra)
    return data


def evalset(entities: list[dict[str, Any]], queries: list[dict[str, Any]]) -> EvalSet:
    return EvalSet.model_validate(
        {"name": "t", "version": "1", "entities": entities, "queries": queries}
    )


def test_valid_set_round_trips_through_json(tmp_path: Path) -> None:
    original = evalset(
        [entity("a", content="Alpha. The answer is 42."), entity("b"), entity("z", "globex")],
        [
            query("q1", {"a": 3, "b": 1}, expected_top_chunk="a:chunk:0", answer_text="is 42"),
            query("q2", {}),
        ],
    )
    path = tmp_path / "set.json"
    save_evalset(original, path)
    assert load_evalset(path) == original
    assert dump_evalset(load_evalset(path)) == path.read_text(encoding="utf-8")
    assert original.tenants == ["acme", "globex"]
    assert [e.entity_id for e in original.entities_of("acme")] == ["a", "b"]


@pytest.mark.parametrize(
    ("entities", "queries", "message"),
    [
        ([entity("a"), entity("a")], [], "duplicate entity ids"),
        ([entity("a")], [query("q", {"a": 1}), query("q", {"a": 2})], "duplicate query ids"),
        ([entity("a")], [query("q", {"missing": 1})], "'missing' is not in the set"),
        ([entity("a", "globex")], [query("q", {"a": 1})], "belongs to tenant 'globex'"),
        ([entity("a")], [query("q", {"a": 4})], "less than or equal to 3"),
        ([entity("a")], [query("q", {"a": 0})], "greater than or equal to 1"),
        ([entity("a")], [query("q", {}, answerable=True)], "answerable=True but 0 relevant"),
        ([entity("a")], [query("q", {"a": 1}, answerable=False)], "answerable=False"),
        ([entity("a")], [query("q", {"a": 1}, kind="unanswerable")], "must not be answerable"),
        (
            [entity("a"), entity("b")],
            [query("q", {"a": 1}, expected_top_chunk="b:chunk:0")],
            "not among its relevant entities",
        ),
        ([entity("a")], [query("q", {"a": 1}, expected_top_chunk="a-0")], "not a chunk id"),
        (
            [entity("a"), entity("b")],
            [query("q", {"a": 1}, expected_passage="b#p. 2")],
            "not among its relevant entities",
        ),
        ([entity("a")], [query("q", {"a": 1}, expected_passage="a p. 2")], "not a passage id"),
        ([entity("a")], [query("q", {"a": 1}, expected_passage="a#  ")], "not a passage id"),
        ([entity("a#b")], [], "must not contain"),
        ([entity("a")], [query("q", {"a": 1}, answer_text="x")], "needs an expected_top_chunk"),
        ([entity("a")], [query("q", {"a": 1}, hard_negatives=["a"])], "both relevant and neg"),
        ([entity("a")], [query("q", {"a": 1}, hard_negatives=["zz"])], "'zz' is not in the set"),
        ([entity("a", "Bad Tenant")], [], "String should match pattern"),
        ([entity("a", "two__parts")], [], "invalid tenant name"),
        ([entity("a:chunk:1")], [], "must not contain"),
        ([entity("a", content="   ")], [], "content is blank"),
        ([{**entity("a"), "colour": "red"}], [], "Extra inputs are not permitted"),
    ],
)
def test_invalid_sets_are_rejected(
    entities: list[dict[str, Any]], queries: list[dict[str, Any]], message: str
) -> None:
    with pytest.raises(ValidationError, match=message):
        evalset(entities, queries)


def test_load_errors_name_the_file(tmp_path: Path) -> None:
    bad = tmp_path / "bad.json"
    bad.write_text('{"name": "x"}', encoding="utf-8")
    with pytest.raises(EvalDataError, match=r"invalid eval set .*bad\.json"):
        load_evalset(bad)
    with pytest.raises(EvalDataError, match="cannot read eval set"):
        load_evalset(tmp_path / "absent.json")
    with pytest.raises(EvalDataError, match="<string>"):
        parse_evalset("not json")


def test_passage_ids_round_trip() -> None:
    assert passage_id("manual", ("Safety", "Lockout")) == "manual#Safety > Lockout"
    assert parse_passage_id("manual#Prices > rows 2-41") == ("manual", "Prices > rows 2-41")
    assert parse_passage_id("m#p. 3#x") == ("m", "p. 3#x")  # split at the first "#"


def test_chunk_ids_parse() -> None:
    assert parse_chunk_id("doc:7:chunk:12") == ("doc:7", 12)
    for bad in ("doc:chunk:", "doc:chunk:01", "doc", ":chunk:1"):
        with pytest.raises(ValueError, match="not a chunk id"):
            parse_chunk_id(bad)


def test_relocate_expected_chunks_follows_the_answer() -> None:
    original = evalset(
        [entity("a", content="First part. Second part holds the answer: 42.")],
        [query("q", {"a": 3}, expected_top_chunk="a:chunk:0", answer_text="the  answer: 42")],
    )

    def two_chunks(e: EvalEntity) -> list[tuple[str, str]]:
        return [
            (f"{e.entity_id}:chunk:0", "First part."),
            (f"{e.entity_id}:chunk:1", "Second\npart holds the answer: 42."),
        ]

    moved = relocate_expected_chunks(original, two_chunks)
    assert moved.queries[0].expected_top_chunk == "a:chunk:1"
    assert locate_answer(moved.queries[0], two_chunks(moved.entities[0])) == ["a:chunk:1"]
    with pytest.raises(EvalDataError, match="in no chunk"):
        relocate_expected_chunks(original, lambda e: [(f"{e.entity_id}:chunk:0", "nothing")])


def test_committed_schema_equals_the_generated_one() -> None:
    committed = SCHEMA_PATH.read_text(encoding="utf-8")
    assert committed == dump_json_schema(), (
        "evalset.schema.json is stale: regenerate with "
        "`python -c 'from ragdev.eval import SCHEMA_PATH; "
        "from ragcore.quality.dataset import write_json_schema; write_json_schema(SCHEMA_PATH)'`"
    )
    schema = json.loads(committed)
    assert schema["$schema"].startswith("https://json-schema.org/")
    assert {"entities", "queries", "name", "version"} <= set(schema["required"])


# --- the golden set ----------------------------------------------------------------------------


@pytest.fixture(scope="module")
def golden() -> EvalSet:
    return load_evalset(GOLDEN_PATH)


def test_golden_file_is_canonical(golden: EvalSet) -> None:
    assert GOLDEN_PATH.read_text(encoding="utf-8") == dump_evalset(golden)


def test_golden_set_meets_seed_000_7_1(golden: EvalSet) -> None:
    assert len(golden.entities) >= 50
    assert golden.tenants == ["acme", "globex"]
    types = Counter(e.entity_type for e in golden.entities)
    assert {"KNOWLEDGE_ARTIFACT", "COMMUNICATION_SIGNAL", "INTERACTION_EVENT", "TICKET"} <= set(
        types
    )
    formats = Counter(e.format.value for e in golden.entities)
    assert formats["markdown"] >= 10 and formats["html"] >= 3
    words = [e.word_count() for e in golden.entities]
    assert sum(1 for n in words if n < 30) >= 3  # one-liners
    assert sum(1 for n in words if 80 <= n <= 400) >= len(words) // 2
    assert sum(1 for n in words if 800 <= n <= 1500) >= 3  # several chunks each
    assert len(golden.queries) >= 25
    kinds = Counter(q.kind for q in golden.queries)
    assert kinds[QueryKind.UNANSWERABLE] >= 5
    for kind in (
        QueryKind.PARAPHRASE,
        QueryKind.EXACT_IDENTIFIER,
        QueryKind.KEYWORD,
        QueryKind.HARD_NEGATIVE,
        QueryKind.MULTI_RELEVANT,
    ):
        assert kinds[kind] >= 3, kind
    graded = [q for q in golden.queries if len(set(q.relevant.values())) > 1]
    assert len(graded) >= 5  # several relevant entities with different grades
    assert sum(1 for q in golden.queries if q.expected_top_chunk) >= 5
    later = [
        q
        for q in golden.queries
        if q.expected_top_chunk and not q.expected_top_chunk.endswith(":chunk:0")
    ]
    assert len(later) >= 3  # the answer sits in a later section of a long document
    assert sum(1 for q in golden.queries if q.hard_negatives) >= 5
    assert all(q.tenant in ("acme", "globex") for q in golden.queries)


def test_golden_has_cross_tenant_twins(golden: EvalSet) -> None:
    # Near-identical documents in both tenants, to catch any leak across tenants.
    for acme_id, globex_id in (
        ("acme-kb-travel-expenses", "globex-kb-travel-expenses"),
        ("acme-kb-refund-policy", "globex-kb-returns-policy"),
    ):
        assert golden.entity(acme_id).tenant == "acme"
        assert golden.entity(globex_id).tenant == "globex"
    isolation = [q for q in golden.queries if "tenant_isolation" in q.tags]
    assert {q.tenant for q in isolation} == {"acme", "globex"}


def test_golden_expected_chunks_match_the_default_chunker(golden: EvalSet) -> None:
    # The ids were computed with the ingest Preparer for all-MiniLM-L6-v2; a chunking change
    # that moves an answer must come with regenerated ids (relocate_expected_chunks).
    from ragcore.embedders.local_onnx import MINILM_SPEC
    from ragcore.prepare import Preparer
    from schemas.entities import Entity

    preparer = Preparer(MINILM_SPEC)

    def chunks_of(e: EvalEntity) -> list[tuple[str, str]]:
        row = Entity(
            tenant_id=e.tenant,
            entity_id=e.entity_id,
            entity_type=e.entity_type,
            content=e.content,
            content_format=e.format,
            content_hash="unused",
        )
        return [(c.chunk_id, c.text) for c in preparer.chunks(row)]

    for q in golden.queries:
        if q.answer_text is None or q.expected_entity is None:
            continue
        found = locate_answer(q, chunks_of(golden.entity(q.expected_entity)))
        assert found[:1] == [q.expected_top_chunk], q.query_id


@pytest.mark.parametrize(
    ("passage", "expected", "within"),
    [
        ("m#p. 3", "m#p. 3", True),
        ("m#p. 3", "m#p. 30", False),
        ("x#p. 3", "m#p. 3", False),
        ("s#Parts > rows 50-57", "s#Parts > rows 42-81", True),
        ("s#Parts > row 42", "s#Parts > rows 42-81", True),
        ("s#Parts > rows 80-85", "s#Parts > rows 42-81", False),
        ("s#Other > rows 50-57", "s#Parts > rows 42-81", False),
        ("s#rows 3-4", "s#rows 2-41", True),
        ("s#Parts > rows 50-57", "t#Parts > rows 42-81", False),
        ("not a passage", "s#rows 2-41", False),
    ],
)
def test_passage_within(passage: str, expected: str, within: bool) -> None:
    assert passage_within(passage, expected) is within
