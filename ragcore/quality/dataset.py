"""Evaluation sets: entities to index and queries with graded relevance judgments.

An `EvalSet` is self-contained: its entities are loaded into a SoR (and so indexed through the
normal ingest path) and its queries are sent through Retrieve. Judgments are at entity level
(`relevant`: entity id -> grade 1..3, 3 = answers the question, 1 = related and useful) plus an
optional `expected_top_chunk` for queries whose answer sits in one section of a long entity,
and an optional `expected_passage` for a document's answer: the page, DOCX section or spreadsheet
row block that holds it, named as its citation names it (`<entity_id>#p. 3`,
`<entity_id>#Safety > Lockout`, `<entity_id>#Prices > rows 42-81`), which survives rechunking.

Validation (beyond field types) that the JSON Schema cannot express:
- entity ids are unique across the whole set (judgments and chunk ids name entities without a
  tenant) and query ids are unique;
- every judged entity (`relevant`, `hard_negatives`) exists *in the query's tenant*;
- `answerable` is true exactly when `relevant` is non-empty; kind `unanswerable` is never
  answerable (an unanswerable query must get NO_EVIDENCE);
- `expected_top_chunk` is `<entity_id>:chunk:<n>` of a relevant entity; `answer_text`, when
  given, is a verbatim excerpt of that entity so the chunk can be re-located when chunking
  changes (`relocate_expected_chunks`);
- `expected_passage` is `<entity_id>#<locator>` of a relevant entity.
"""

from __future__ import annotations

import json
import re
from collections import Counter
from collections.abc import Callable, Sequence
from enum import StrEnum
from pathlib import Path
from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator, model_validator

from ragcore.errors import InvalidTenantError
from ragcore.quality.errors import EvalDataError
from ragcore.store.ids import validate_tenant
from schemas.entities import ContentFormat

#: Relevance grade: 1 = related/partially useful, 2 = relevant, 3 = answers the query.
Grade = Annotated[int, Field(ge=1, le=3)]
#: Tenant names as the store accepts them (`ragcore.store.ids.validate_tenant`; no "__").
TENANT_PATTERN = r"^[a-z0-9][a-z0-9_-]{0,62}$"
MAX_GRADE = 3
CHUNK_SEPARATOR = ":chunk:"
#: Between the entity id and the locator of a passage id (`<entity_id>#<locator>`).
PASSAGE_SEPARATOR = "#"
#: Between the parts of a passage's locator (its section path after the file name).
LOCATOR_SEPARATOR = " > "
_CHUNK_ID_RE = re.compile(r"^(?P<entity>.+):chunk:(?P<index>0|[1-9][0-9]*)$")
JSON_SCHEMA_DIALECT = "https://json-schema.org/draft/2020-12/schema"


class QueryKind(StrEnum):
    """What a query tests (one primary kind; secondary traits go in `tags`)."""

    PARAPHRASE = "paraphrase"  # the answer uses other words than the question
    EXACT_IDENTIFIER = "exact_identifier"  # error codes, SKUs, ticket ids, config keys, strings
    KEYWORD = "keyword"  # a terse keyword query sharing terms with the answer
    HARD_NEGATIVE = "hard_negative"  # lexically close non-relevant entities exist (see field)
    MULTI_RELEVANT = "multi_relevant"  # several entities with different grades
    UNANSWERABLE = "unanswerable"  # the corpus does not answer it: NO_EVIDENCE expected
    KNOWN_ITEM = "known_item"  # exactly one target entity (e.g. the man-page benchmark)
    BENCHMARK = "benchmark"  # imported from an external set (BEIR)


Complexity = Literal["simple", "moderate", "complex"]


def _check_tenant(value: str) -> str:
    try:
        return validate_tenant(value)
    except InvalidTenantError as exc:
        # pydantic reports ValueErrors as validation errors with the field path.
        raise ValueError(exc.message) from exc


def parse_chunk_id(chunk_id: str) -> tuple[str, int]:
    """Split `<entity_id>:chunk:<n>` into (entity_id, n); ValueError when it is not one."""
    match = _CHUNK_ID_RE.fullmatch(chunk_id)
    if match is None:
        raise ValueError(f"not a chunk id of the form '<entity_id>:chunk:<n>': {chunk_id!r}")
    return match["entity"], int(match["index"])


def passage_id(entity_id: str, path: Sequence[str]) -> str:
    """The id of one passage of an entity: `<entity_id>#<locator>`, the locator being the
    citation's path after the file name joined by " > " (`p. 3`, `Safety > Lockout`,
    `Prices > rows 42-81`; empty for an entity that is not a document)."""
    return f"{entity_id}{PASSAGE_SEPARATOR}{LOCATOR_SEPARATOR.join(path)}"


def parse_passage_id(value: str) -> tuple[str, str]:
    """Split `<entity_id>#<locator>` into (entity_id, locator) at the first "#" (entity ids of
    an eval set never hold one); ValueError when it is not a passage id."""
    entity_id, separator, locator = value.partition(PASSAGE_SEPARATOR)
    if not separator or not entity_id or not locator.strip():
        raise ValueError(f"not a passage id of the form '<entity_id>#<locator>': {value!r}")
    return entity_id, locator


_ROWS_RE = re.compile(r"^(?P<sheet>.*?)(?: > )?rows? (?P<first>[0-9]+)(?:-(?P<last>[0-9]+))?$")


def _row_range(locator: str) -> tuple[str, int, int] | None:
    """(sheet part, first row, last row) of a spreadsheet locator (`Parts > rows 42-81`,
    `rows 3-9`, `Parts > row 7`), None for any other locator."""
    match = _ROWS_RE.fullmatch(locator)
    if match is None:
        return None
    first = int(match["first"])
    return match["sheet"], first, int(match["last"] or first)


def passage_within(passage: str, expected: str) -> bool:
    """True when `passage` is the `expected` passage or a part of it: the same entity and
    locator, or rows of the same sheet inside the expected row block (a spreadsheet chunk
    cites its own rows, `Parts > rows 50-57`, inside its block `Parts > rows 42-81`)."""
    if passage == expected:
        return True
    try:
        entity, locator = parse_passage_id(passage)
        expected_entity, expected_locator = parse_passage_id(expected)
    except ValueError:
        return False
    rows, block = _row_range(locator), _row_range(expected_locator)
    if entity != expected_entity or rows is None or block is None:
        return False
    return rows[0] == block[0] and block[1] <= rows[1] and rows[2] <= block[2]


class EvalEntity(BaseModel):
    """One document of an eval set, as a SoR row would hold it."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    entity_id: str = Field(min_length=1, max_length=256)
    tenant: str = Field(pattern=TENANT_PATTERN)
    entity_type: str = Field(
        min_length=1, description="e.g. KNOWLEDGE_ARTIFACT, COMMUNICATION_SIGNAL, TICKET"
    )
    title: str = ""
    content: str = Field(min_length=1)
    format: ContentFormat = ContentFormat.TEXT
    metadata: dict[str, Any] = Field(default_factory=dict)

    @field_validator("tenant")
    @classmethod
    def _tenant(cls, value: str) -> str:
        return _check_tenant(value)

    @field_validator("entity_id")
    @classmethod
    def _entity_id(cls, value: str) -> str:
        if CHUNK_SEPARATOR in value or PASSAGE_SEPARATOR in value or value != value.strip():
            raise ValueError(
                f"entity id {value!r} must not contain {CHUNK_SEPARATOR!r}, "
                f"{PASSAGE_SEPARATOR!r} or surrounding spaces"
            )
        return value

    @field_validator("content")
    @classmethod
    def _content(cls, value: str) -> str:
        if not value.strip():
            raise ValueError("content is blank: an entity without text can never be retrieved")
        return value

    def word_count(self) -> int:
        """Whitespace-separated words of the raw content (markup included)."""
        return len(self.content.split())


class EvalQuery(BaseModel):
    """A query with graded relevance judgments at entity level."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    query_id: str = Field(min_length=1, max_length=256)
    text: str = Field(min_length=1)
    tenant: str = Field(pattern=TENANT_PATTERN)
    kind: QueryKind
    answerable: bool = Field(description="False for queries that must get NO_EVIDENCE.")
    relevant: dict[str, Grade] = Field(
        default_factory=dict, description="entity id -> grade (1 related, 2 relevant, 3 answer)"
    )
    expected_top_chunk: str | None = Field(
        default=None, description="'<entity_id>:chunk:<n>' holding the answer, for long entities"
    )
    answer_text: str | None = Field(
        default=None,
        description="Verbatim excerpt of the expected chunk's entity that holds the answer.",
    )
    expected_passage: str | None = Field(
        default=None,
        description="'<entity_id>#<locator>': the page, DOCX section or spreadsheet row block "
        "holding the answer, as its citation names it after the file name ('p. 3', "
        "'Safety > Lockout', 'Prices > rows 42-81')",
    )
    hard_negatives: tuple[str, ...] = Field(
        default=(), description="Entities that share words with the query but do not answer it."
    )
    complexity: Complexity | None = None
    tags: tuple[str, ...] = ()
    notes: str = ""

    @field_validator("tenant")
    @classmethod
    def _tenant(cls, value: str) -> str:
        return _check_tenant(value)

    @field_validator("text")
    @classmethod
    def _text(cls, value: str) -> str:
        if not value.strip():
            raise ValueError("query text is blank")
        return value

    @model_validator(mode="after")
    def _consistent(self) -> EvalQuery:
        if self.answerable != bool(self.relevant):
            raise ValueError(
                f"query {self.query_id}: answerable={self.answerable} but "
                f"{len(self.relevant)} relevant entities (answerable <=> at least one relevant)"
            )
        if self.kind is QueryKind.UNANSWERABLE and self.answerable:
            raise ValueError(f"query {self.query_id}: kind 'unanswerable' must not be answerable")
        if self.expected_top_chunk is not None:
            entity_id, _ = parse_chunk_id(self.expected_top_chunk)
            if entity_id not in self.relevant:
                raise ValueError(
                    f"query {self.query_id}: expected_top_chunk {self.expected_top_chunk!r} "
                    f"belongs to {entity_id!r}, which is not among its relevant entities"
                )
        if self.expected_passage is not None:
            entity_id, _ = parse_passage_id(self.expected_passage)
            if entity_id not in self.relevant:
                raise ValueError(
                    f"query {self.query_id}: expected_passage {self.expected_passage!r} "
                    f"belongs to {entity_id!r}, which is not among its relevant entities"
                )
        if self.answer_text is not None and self.expected_top_chunk is None:
            raise ValueError(f"query {self.query_id}: answer_text needs an expected_top_chunk")
        overlap = sorted(set(self.hard_negatives) & set(self.relevant))
        if overlap:
            raise ValueError(f"query {self.query_id}: {overlap} are both relevant and negatives")
        return self

    @property
    def expected_entity(self) -> str | None:
        """The entity of `expected_top_chunk`, if any."""
        if self.expected_top_chunk is None:
            return None
        return parse_chunk_id(self.expected_top_chunk)[0]


class EvalSet(BaseModel):
    """A named, versioned evaluation set: entities and the queries judged against them."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    name: str = Field(min_length=1)
    version: str = Field(min_length=1)
    description: str = ""
    entities: tuple[EvalEntity, ...]
    queries: tuple[EvalQuery, ...]

    @model_validator(mode="after")
    def _references(self) -> EvalSet:
        _no_duplicates("entity id", [e.entity_id for e in self.entities])
        _no_duplicates("query id", [q.query_id for q in self.queries])
        tenant_of = {e.entity_id: e.tenant for e in self.entities}
        for query in self.queries:
            for role, ids in (
                ("relevant", list(query.relevant)),
                ("hard_negatives", query.hard_negatives),
            ):
                for entity_id in ids:
                    tenant = tenant_of.get(entity_id)
                    if tenant is None:
                        raise ValueError(
                            f"query {query.query_id}: {role} entity {entity_id!r} is not in the set"
                        )
                    if tenant != query.tenant:
                        raise ValueError(
                            f"query {query.query_id} (tenant {query.tenant!r}): {role} entity "
                            f"{entity_id!r} belongs to tenant {tenant!r}"
                        )
        return self

    @property
    def tenants(self) -> list[str]:
        """Tenants of the entities and queries, sorted."""
        return sorted({e.tenant for e in self.entities} | {q.tenant for q in self.queries})

    def entity(self, entity_id: str) -> EvalEntity:
        """The entity with this id (KeyError when absent)."""
        for entity in self.entities:
            if entity.entity_id == entity_id:
                return entity
        raise KeyError(entity_id)

    def entities_of(self, tenant: str) -> list[EvalEntity]:
        """The tenant's entities, in set order."""
        return [e for e in self.entities if e.tenant == tenant]

    def queries_of(self, tenant: str) -> list[EvalQuery]:
        """The tenant's queries, in set order."""
        return [q for q in self.queries if q.tenant == tenant]


def _no_duplicates(what: str, values: Sequence[str]) -> None:
    duplicates = sorted(v for v, n in Counter(values).items() if n > 1)
    if duplicates:
        raise ValueError(f"duplicate {what}s: {duplicates}")


# --- files -----------------------------------------------------------------------------------


def load_evalset(path: Path | str) -> EvalSet:
    """Read and validate an eval set JSON file; EvalDataError names the file and the problem."""
    path = Path(path)
    try:
        raw = path.read_text(encoding="utf-8")
    except OSError as exc:
        raise EvalDataError(f"cannot read eval set {path}: {exc}") from exc
    return parse_evalset(raw, source=str(path))


def parse_evalset(raw: str | bytes, *, source: str = "<string>") -> EvalSet:
    """Validate eval set JSON text; EvalDataError (with `source`) when it is not a valid set."""
    try:
        return EvalSet.model_validate_json(raw)
    except ValidationError as exc:
        raise EvalDataError(f"invalid eval set {source}: {exc}") from exc


def dump_evalset(evalset: EvalSet) -> str:
    """The canonical JSON text of an eval set (2-space indent, UTF-8, trailing newline)."""
    data = evalset.model_dump(mode="json", exclude_defaults=True)
    return json.dumps(data, indent=2, ensure_ascii=False) + "\n"


def save_evalset(evalset: EvalSet, path: Path | str) -> None:
    """Write `dump_evalset(evalset)` to `path` (parents created)."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(dump_evalset(evalset), encoding="utf-8")


def evalset_json_schema() -> dict[str, Any]:
    """The JSON Schema of an eval set file, generated from `EvalSet`."""
    schema = EvalSet.model_json_schema(mode="validation")
    schema["description"] = (
        "A ragstream evaluation set. Cross-field rules the schema cannot express (unique ids, "
        "judged entities in the query's tenant, answerable <=> relevant non-empty, "
        "expected_top_chunk of a relevant entity) are checked by ragcore.quality.dataset."
    )
    return {"$schema": JSON_SCHEMA_DIALECT, **schema}


def dump_json_schema() -> str:
    """The canonical text of the schema file (what `write_json_schema` writes)."""
    return json.dumps(evalset_json_schema(), indent=2, ensure_ascii=False) + "\n"


def write_json_schema(path: Path | str) -> None:
    """Write the eval set JSON Schema to `path`; regenerate after changing the models."""
    Path(path).write_text(dump_json_schema(), encoding="utf-8")


# --- expected chunks -------------------------------------------------------------------------

#: (chunk_id, chunk text) of one entity's chunks, in order; e.g. from the ingest Preparer.
ChunkLister = Callable[[EvalEntity], Sequence[tuple[str, str]]]


def _squash(text: str) -> str:
    return " ".join(text.split())


def locate_answer(query: EvalQuery, chunks: Sequence[tuple[str, str]]) -> list[str]:
    """Ids of the chunks whose text contains `query.answer_text` (whitespace-insensitive)."""
    if query.answer_text is None:
        return []
    needle = _squash(query.answer_text)
    return [chunk_id for chunk_id, text in chunks if needle in _squash(text)]


def relocate_expected_chunks(evalset: EvalSet, chunks_of: ChunkLister) -> EvalSet:
    """A copy whose `expected_top_chunk`s point at the first chunk holding `answer_text`.

    Run after a chunking change (budget, overlap, strategy): chunk indexes move, the answer does
    not. Raises EvalDataError when an answer is in no chunk (the normalizer or the text changed).
    """
    queries: list[EvalQuery] = []
    for query in evalset.queries:
        entity_id = query.expected_entity
        if query.answer_text is None or entity_id is None:
            queries.append(query)
            continue
        found = locate_answer(query, chunks_of(evalset.entity(entity_id)))
        if not found:
            raise EvalDataError(
                f"query {query.query_id}: answer_text is in no chunk of {entity_id!r}"
            )
        queries.append(query.model_copy(update={"expected_top_chunk": found[0]}))
    return evalset.model_copy(update={"queries": tuple(queries)})
