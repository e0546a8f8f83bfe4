"""Load a BEIR-format directory into an `EvalSet` for one tenant.

Layout (https://github.com/beir-cellar/beir, "Data format"):

    <dir>/corpus.jsonl       {"_id": "...", "title": "...", "text": "...", ...} per line
    <dir>/queries.jsonl      {"_id": "...", "text": "...", ...} per line
    <dir>/qrels/<split>.tsv  header "query-id<TAB>corpus-id<TAB>score", then one judgment a line

Any of the files may be gzip-compressed (`corpus.jsonl.gz`). Judgments with score <= 0 are
"judged non-relevant" and dropped; positive scores become grades, capped at 3 (the eval set's
top grade). Only queries with at least one positive judgment in the split are kept (BEIR's
queries.jsonl lists the queries of every split).

Limits: `max_queries` keeps the first queries in queries.jsonl order; `max_docs` keeps every
document those queries judge relevant (queries whose documents would not fit are dropped) and
fills the rest with other documents in corpus order, so a small sample still has distractors.
Malformed input raises EvalDataError naming the file and line.
"""

from __future__ import annotations

import csv
import gzip
import json
from collections.abc import Iterator
from pathlib import Path
from typing import IO, Any

from pydantic import ValidationError

from ragcore.errors import InvalidTenantError
from ragcore.quality.dataset import EvalEntity, EvalQuery, EvalSet, QueryKind
from ragcore.quality.errors import EvalDataError
from ragcore.store.ids import validate_tenant

DEFAULT_TENANT = "beir"
DEFAULT_ENTITY_TYPE = "DOCUMENT"
QRELS_HEADER = ("query-id", "corpus-id", "score")
MAX_GRADE = 3


def _find(directory: Path, name: str) -> Path:
    for candidate in (directory / name, directory / f"{name}.gz"):
        if candidate.is_file():
            return candidate
    raise EvalDataError(f"BEIR directory {directory}: {name} (or {name}.gz) not found")


def _open(path: Path) -> IO[str]:
    if path.suffix == ".gz":
        return gzip.open(path, "rt", encoding="utf-8", newline="")
    return path.open("r", encoding="utf-8", newline="")


def _jsonl(path: Path) -> Iterator[tuple[int, dict[str, Any]]]:
    """(line number, object) of every non-blank line; EvalDataError for a malformed one."""
    try:
        with _open(path) as handle:
            for number, line in enumerate(handle, start=1):
                if not line.strip():
                    continue
                try:
                    record = json.loads(line)
                except json.JSONDecodeError as exc:
                    raise EvalDataError(f"{path}:{number}: invalid JSON: {exc.msg}") from exc
                if not isinstance(record, dict):
                    raise EvalDataError(f"{path}:{number}: expected a JSON object")
                yield number, record
    except (OSError, UnicodeDecodeError, EOFError) as exc:
        raise EvalDataError(f"{path}: cannot read: {exc}") from exc


def _string(record: dict[str, Any], key: str, where: str, *, required: bool) -> str:
    value = record.get(key)
    if value is None and not required:
        return ""
    if not isinstance(value, str | int) or isinstance(value, bool):
        raise EvalDataError(f"{where}: field {key!r} must be a string, got {value!r}")
    text = str(value)
    if required and not text.strip():
        raise EvalDataError(f"{where}: field {key!r} is empty")
    return text


def read_qrels(path: Path) -> dict[str, dict[str, int]]:
    """query id -> {corpus id -> grade} of the positive judgments of one qrels TSV."""
    qrels: dict[str, dict[str, int]] = {}
    try:
        with _open(path) as handle:
            reader = csv.reader(handle, delimiter="\t", quoting=csv.QUOTE_NONE)
            header = next(reader, None)
            if header is None or tuple(h.strip().lower() for h in header) != QRELS_HEADER:
                raise EvalDataError(
                    f"{path}:1: expected the header {'<TAB>'.join(QRELS_HEADER)!r}, got {header!r}"
                )
            for fields in reader:
                number = reader.line_num
                if not fields or all(not f.strip() for f in fields):
                    continue
                if len(fields) != 3:
                    raise EvalDataError(f"{path}:{number}: expected 3 tab-separated fields")
                query_id, corpus_id, raw_score = (f.strip() for f in fields)
                if not query_id or not corpus_id:
                    raise EvalDataError(f"{path}:{number}: empty query-id or corpus-id")
                try:
                    score = int(raw_score)
                except ValueError:
                    raise EvalDataError(
                        f"{path}:{number}: score must be an integer, got {raw_score!r}"
                    ) from None
                if score > 0:
                    qrels.setdefault(query_id, {})[corpus_id] = min(score, MAX_GRADE)
    except (OSError, UnicodeDecodeError, EOFError, csv.Error) as exc:
        raise EvalDataError(f"{path}: cannot read: {exc}") from exc
    return qrels


def load_beir(
    directory: Path | str,
    *,
    split: str = "test",
    tenant: str = DEFAULT_TENANT,
    name: str | None = None,
    max_docs: int | None = None,
    max_queries: int | None = None,
    entity_type: str = DEFAULT_ENTITY_TYPE,
) -> EvalSet:
    """Read a BEIR dataset directory into an EvalSet (see the module docstring)."""
    root = Path(directory)
    try:
        validate_tenant(tenant)
    except InvalidTenantError as exc:
        raise EvalDataError(exc.message) from exc
    if not root.is_dir():
        raise EvalDataError(f"BEIR directory {root} does not exist")
    for label, limit in (("max_docs", max_docs), ("max_queries", max_queries)):
        if limit is not None and limit < 1:
            raise EvalDataError(f"{label} must be >= 1, got {limit}")
    qrels_path = _find(root / "qrels", f"{split}.tsv")
    qrels = read_qrels(qrels_path)
    queries_path = _find(root, "queries.jsonl")
    corpus_path = _find(root, "corpus.jsonl")

    query_texts: dict[str, str] = {}
    order: list[str] = []
    for number, record in _jsonl(queries_path):
        where = f"{queries_path}:{number}"
        query_id = _string(record, "_id", where, required=True)
        text = _string(record, "text", where, required=True)
        if query_id in query_texts:
            raise EvalDataError(f"{where}: duplicate query _id {query_id!r}")
        query_texts[query_id] = text
        order.append(query_id)
    unknown = sorted(set(qrels) - set(query_texts))
    if unknown:
        raise EvalDataError(
            f"{qrels_path}: judgments for queries absent from {queries_path.name}: {unknown[:10]}"
        )

    selected: list[str] = []
    needed: set[str] = set()
    for query_id in order:
        if query_id not in qrels:
            continue
        if max_queries is not None and len(selected) >= max_queries:
            break
        docs = needed | set(qrels[query_id])
        if max_docs is not None and len(docs) > max_docs:
            continue  # its relevant documents would not fit the document budget
        selected.append(query_id)
        needed = docs

    entities: list[EvalEntity] = []
    seen: set[str] = set()
    distractors = 0 if max_docs is None else max_docs - len(needed)
    for number, record in _jsonl(corpus_path):
        where = f"{corpus_path}:{number}"
        doc_id = _string(record, "_id", where, required=True)
        if doc_id in seen:
            raise EvalDataError(f"{where}: duplicate corpus _id {doc_id!r}")
        seen.add(doc_id)
        if max_docs is not None and doc_id not in needed:
            if distractors <= 0:
                continue
            distractors -= 1
        title = _string(record, "title", where, required=False)
        text = _string(record, "text", where, required=False)
        content = text if text.strip() else title
        if not content.strip():
            raise EvalDataError(f"{where}: document {doc_id!r} has neither text nor title")
        try:
            entity = EvalEntity(
                entity_id=doc_id,
                tenant=tenant,
                entity_type=entity_type,
                title=title,
                content=content,
            )
        except ValidationError as exc:
            raise EvalDataError(f"{where}: not a usable document: {exc}") from exc
        entities.append(entity)
    absent = sorted(needed - seen)
    if absent:
        raise EvalDataError(
            f"{qrels_path}: judged documents absent from {corpus_path.name}: {absent[:10]}"
        )
    description = (
        f"BEIR directory {root.name}, split {split!r}: {len(entities)} documents, "
        f"{len(selected)} queries (max_docs={max_docs}, max_queries={max_queries})"
    )
    try:
        queries = [
            EvalQuery(
                query_id=query_id,
                text=query_texts[query_id],
                tenant=tenant,
                kind=QueryKind.BENCHMARK,
                answerable=True,
                relevant=qrels[query_id],
            )
            for query_id in selected
        ]
        return EvalSet(
            name=name or root.name,
            version=split,
            description=description,
            entities=tuple(entities),
            queries=tuple(queries),
        )
    except ValidationError as exc:
        raise EvalDataError(f"BEIR directory {root}: {exc}") from exc
