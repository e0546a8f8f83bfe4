"""The variable table of docs/configuration.md is the one generated from the settings models."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest
from pydantic import BaseModel, Field

from ragcore.plan import PlanConfig
from ragstream.cli import main
from ragstream.envtable import END, START, env_rows, markdown, service_settings

pytestmark = pytest.mark.unit

CONFIGURATION = Path(__file__).resolve().parents[2] / "docs" / "configuration.md"
JSON_MARKS = ("JSON list.", "JSON object.", "JSON list of objects.")


def generated_block(text: str) -> str:
    """The text between the table's markers, markers included; AssertionError unless each
    marker stands exactly once (a stray copy would hide a stale table)."""
    assert (text.count(START), text.count(END)) == (1, 1), "one start and one end marker"
    return text[text.index(START) : text.index(END) + len(END)]


def test_the_configuration_table_is_the_generated_one() -> None:
    block = generated_block(CONFIGURATION.read_text())
    assert block == markdown(service_settings()), "run `ragstream config --env-table`"


def test_a_duplicated_marker_is_noticed() -> None:
    table = markdown(service_settings())
    with pytest.raises(AssertionError, match="one start and one end marker"):
        generated_block(f"{table}\n{END}\n")
    with pytest.raises(AssertionError, match="one start and one end marker"):
        generated_block(f"{START}\n{table}")
    assert generated_block(f"intro\n{table}\noutro") == table


def test_every_nested_field_and_union_variant_is_a_row() -> None:
    rows = {(row.variable, row.variant): users for row, users in env_rows(service_settings())}
    assert rows[("RAGSTREAM_CONSUMER__GROUP_ID", "")] == ["ingest"]
    assert rows[("RAGSTREAM_STORE__URL", "")] == ["ingest", "retrieve"]
    assert rows[("RAGSTREAM_RETRIEVAL__FUSION_METHOD", "")] == ["retrieve"]
    assert rows[("RAGSTREAM_EMBEDDER__BASE_URL", "kind=openai")] == ["ingest", "retrieve"]
    assert rows[("RAGSTREAM_EMBEDDER__KIND", "kind=local")] == ["ingest", "retrieve"]
    assert ("RAGSTREAM_RERANKER__BASE_URL", "kind=http") in rows
    assert ("RAGSTREAM_EMBEDDING_CACHE__PATH", "") in rows
    assert ("RAGSTREAM_PLAN__TABLES", "") in rows
    assert not any(variable.endswith("__TABLES__TABLE") for variable, _ in rows)
    assert len(rows) > 150


class _Inner(BaseModel):
    depth: int = Field(default=3, description="How deep | far.")


class _Outer(BaseModel):
    inner: _Inner = Field(default_factory=_Inner)
    items: list[_Inner] = Field(default_factory=list, description="Several.")


def test_a_pipe_in_a_cell_is_escaped_and_lists_of_models_are_one_json_variable() -> None:
    table = markdown({"svc": _Outer})
    assert "| `RAGSTREAM_INNER__DEPTH` | svc |  | `3` | How deep \\| far. |" in table
    assert "| `RAGSTREAM_ITEMS` | svc |  | `[]` | Several. JSON list of objects. |" in table


def test_the_command_prints_the_table(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["config", "--env-table"]) == 0
    assert capsys.readouterr().out.strip() == markdown(service_settings())


def test_every_variable_written_as_json_says_so_and_shows_a_json_default() -> None:
    rows = {row.variable: row for row, _ in env_rows(service_settings())}
    written_as_json = {v: r for v, r in rows.items() if r.meaning.endswith(JSON_MARKS)}
    assert {
        "RAGSTREAM_PLAN__TABLES",
        "RAGSTREAM_CONSUMER__TOPICS",
        "RAGSTREAM_AUTH__TOKENS",
        "RAGSTREAM_KAFKA__EXTRA",
        "RAGSTREAM_CONSUMER__SCHEDULER__TENANTS",
    } <= set(written_as_json)
    for variable, row in written_as_json.items():
        default = json.loads(row.default)  # JSON, never a Python repr
        kind = list if "list" in row.meaning.rsplit("JSON", 1)[1] else dict
        assert isinstance(default, kind), (variable, row.default)
    # the table mappings' default is a valid value of the variable itself
    tables = json.loads(rows["RAGSTREAM_PLAN__TABLES"].default)
    assert PlanConfig(tables=tables) == PlanConfig()


def test_a_list_of_models_default_is_json_of_the_models() -> None:
    class Listing(BaseModel):
        items: tuple[_Inner, ...] = (_Inner(depth=5),)

    table = markdown({"svc": Listing})
    assert '| `RAGSTREAM_ITEMS` | svc |  | `[{"depth": 5}]` | JSON list of objects. |' in table


def test_every_json_setting_the_docs_show_is_json_and_the_table_example_maps() -> None:
    """What a reader copies from the docs into a variable parses as JSON (`VAR='...'`, the
    Markdown line breaks of a long example joined), and the table mapping example is a valid
    RAGSTREAM_PLAN__TABLES."""
    root = CONFIGURATION.parents[1]
    found: dict[str, object] = {}
    for path in [root / "README.md", *sorted((root / "docs").rglob("*.md"))]:
        for match in re.finditer(r"(RAGSTREAM_[A-Z0-9_]+)='([^']*)'", path.read_text()):
            value = match.group(2)
            if value.lstrip().startswith(("[", "{")):
                joined = re.sub(r"\s*`?\n\s*`?", " ", value)
                found[f"{path.name}:{match.group(1)}"] = json.loads(joined)
    assert "configuration.md:RAGSTREAM_PLAN__TABLES" in found
    tables = PlanConfig.model_validate({"tables": found["configuration.md:RAGSTREAM_PLAN__TABLES"]})
    assert len(tables.tables) == 3
