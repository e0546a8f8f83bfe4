"""BEIR directory loader on tiny datasets written to tmp_path."""

from __future__ import annotations

import gzip
import json
from pathlib import Path
from typing import Any

import pytest

from ragcore.quality.dataset import QueryKind
from ragcore.quality.errors import EvalDataError
from ragdev.eval.beir import load_beir

pytestmark = pytest.mark.unit

CORPUS = [
    {"_id": "d1", "title": "Pumps", "text": "Centrifugal pumps move water."},
    {"_id": "d2", "title": "Valves", "text": "Gate valves stop flow."},
    {"_id": "d3", "title": "Only a title", "text": ""},
    {"_id": "d4", "title": "", "text": "Bearings need grease.", "metadata": {"x": 1}},
    {"_id": "d5", "title": "", "text": "A distractor about seals."},
]
QUERIES = [
    {"_id": "q1", "text": "what moves water"},
    {"_id": "q2", "text": "how to stop flow"},
    {"_id": "q3", "text": "a train-split query"},
    {"_id": "q4", "text": "lubrication"},
]
QRELS = "query-id\tcorpus-id\tscore\nq1\td1\t1\nq2\td2\t2\nq2\td1\t0\nq4\td4\t5\nq4\td3\t1\n"


def write_beir(
    root: Path,
    corpus: list[dict[str, Any]] | None = None,
    queries: list[dict[str, Any]] | None = None,
    qrels: str = QRELS,
    *,
    gz: bool = False,
) -> Path:
    root.mkdir(parents=True, exist_ok=True)
    (root / "qrels").mkdir(exist_ok=True)
    corpus_text = "".join(json.dumps(d) + "\n" for d in (corpus or CORPUS))
    if gz:
        (root / "corpus.jsonl.gz").write_bytes(gzip.compress(corpus_text.encode()))
    else:
        (root / "corpus.jsonl").write_text(corpus_text)
    (root / "queries.jsonl").write_text("".join(json.dumps(q) + "\n" for q in (queries or QUERIES)))
    (root / "qrels" / "test.tsv").write_text(qrels)
    (root / "qrels" / "train.tsv").write_text("query-id\tcorpus-id\tscore\nq3\td5\t1\n")
    return root


def test_loads_documents_queries_and_graded_judgments(tmp_path: Path) -> None:
    s = load_beir(write_beir(tmp_path / "tiny"), tenant="tiny-beir")
    assert s.name == "tiny" and s.version == "test"
    assert [e.entity_id for e in s.entities] == ["d1", "d2", "d3", "d4", "d5"]
    assert {e.tenant for e in s.entities} == {"tiny-beir"}
    assert s.entity("d3").content == "Only a title"  # no text: the title is the content
    assert s.entity("d1").title == "Pumps"
    # q3 is judged only in the train split; score 0 is "not relevant"; 5 is capped at grade 3.
    assert [q.query_id for q in s.queries] == ["q1", "q2", "q4"]
    assert s.queries[1].relevant == {"d2": 2}
    assert s.queries[2].relevant == {"d4": 3, "d3": 1}
    assert all(q.kind is QueryKind.BENCHMARK and q.answerable for q in s.queries)
    train = load_beir(tmp_path / "tiny", split="train")
    assert [q.query_id for q in train.queries] == ["q3"]


def test_limits_keep_the_judged_documents_and_fill_with_distractors(tmp_path: Path) -> None:
    root = write_beir(tmp_path / "tiny", gz=True)
    s = load_beir(root, max_queries=2, max_docs=3)
    assert [q.query_id for q in s.queries] == ["q1", "q2"]
    # d1 and d2 are needed; one distractor slot is filled in corpus order (d3).
    assert [e.entity_id for e in s.entities] == ["d1", "d2", "d3"]
    # With room for one document only q1 fits; q2 and q4 need documents beyond the budget.
    one = load_beir(root, max_docs=1)
    assert [q.query_id for q in one.queries] == ["q1"]
    assert [e.entity_id for e in one.entities] == ["d1"]


@pytest.mark.parametrize(
    ("corpus", "queries", "qrels", "message"),
    [
        (None, None, "qid\tdid\tscore\n", r"test\.tsv:1: expected the header"),
        (None, None, "query-id\tcorpus-id\tscore\nq1\td1\n", r"test\.tsv:2: expected 3"),
        (
            None,
            None,
            "query-id\tcorpus-id\tscore\nq1\td1\t1\nq2\td2\thigh\n",
            r"test\.tsv:3: score",
        ),
        (None, None, "query-id\tcorpus-id\tscore\nq9\td1\t1\n", r"queries absent .*'q9'"),
        (None, None, "query-id\tcorpus-id\tscore\nq1\td9\t1\n", r"documents absent .*'d9'"),
        ([*CORPUS, CORPUS[0]], None, QRELS, r"corpus\.jsonl:6: duplicate corpus _id 'd1'"),
        (
            [{"_id": "d1", "title": "", "text": ""}],
            None,
            "query-id\tcorpus-id\tscore\n",
            r":1: .*neither",
        ),
        ([{"title": "x", "text": "y"}], None, QRELS, r"corpus\.jsonl:1: field '_id'"),
        (None, [{"_id": "q1", "text": ["list"]}], QRELS, r"queries\.jsonl:1: field 'text'"),
        ([{"_id": "a:chunk:1", "text": "t"}], None, "query-id\tcorpus-id\tscore\n", "not a usable"),
    ],
)
def test_malformed_input_names_file_and_line(
    tmp_path: Path,
    corpus: list[dict[str, Any]] | None,
    queries: list[dict[str, Any]] | None,
    qrels: str,
    message: str,
) -> None:
    root = write_beir(tmp_path / "bad", corpus, queries, qrels)
    with pytest.raises(EvalDataError, match=message):
        load_beir(root)


def test_invalid_json_line_and_missing_files(tmp_path: Path) -> None:
    root = write_beir(tmp_path / "bad")
    with (root / "queries.jsonl").open("a") as handle:
        handle.write("\n{not json\n")
    with pytest.raises(EvalDataError, match=r"queries\.jsonl:6: invalid JSON"):
        load_beir(root)
    (root / "queries.jsonl").unlink()
    with pytest.raises(EvalDataError, match=r"queries\.jsonl \(or queries\.jsonl\.gz\) not found"):
        load_beir(root)
    with pytest.raises(EvalDataError, match="does not exist"):
        load_beir(tmp_path / "absent")
    with pytest.raises(EvalDataError, match="invalid tenant"):
        load_beir(root, tenant="No Spaces")
    with pytest.raises(EvalDataError, match="max_docs must be >= 1"):
        load_beir(root, max_docs=0)
