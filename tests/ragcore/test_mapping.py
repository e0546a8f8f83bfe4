"""Entity ids of a `TableMapping`: encoding key values and reading them back; the errors of a
mapping written as JSON name its table, its field and the accepted values."""

from __future__ import annotations

import re
from urllib.parse import unquote

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from pydantic import ValidationError

from ragcore.mapping import TableMapping
from ragcore.plan import PlanConfig

pytestmark = pytest.mark.unit

#: The key encoding's definition: `%` and `,` percent-encoded, every other character kept.
_UNSAFE = re.compile(r"[%,]")

_KEY_VALUE = st.text(alphabet=st.sampled_from("ab9-_ %,.:é25AF"), min_size=1, max_size=12) | (
    st.text(min_size=1, max_size=20)
)


def _reference_entity_id(label: str, key: tuple[str, ...]) -> str:
    parts = (_UNSAFE.sub(lambda m: f"%{ord(m.group()):02X}", v) for v in key)
    return f"{label}:{','.join(parts)}"


@settings(max_examples=300, deadline=None)
@given(key=st.lists(_KEY_VALUE, min_size=2, max_size=2).map(tuple))
def test_entity_ids_follow_the_encoding_and_read_back(key: tuple[str, ...]) -> None:
    """The shortcuts for keys without `%` or `,` (Retrieve verifies ~23 ids a request) give
    the definition's ids, and `key_of` reads every id back to its values."""
    mapping = TableMapping(table="shop.order_lines", key_columns=("order_id", "line_no"))
    entity_id = mapping.entity_id(key)
    assert entity_id == _reference_entity_id("order_lines", key)
    assert mapping.key_of(entity_id) == key
    rest = entity_id.partition(":")[2]
    assert mapping.key_of(entity_id) == tuple(unquote(p) for p in rest.split(","))


@pytest.mark.parametrize(
    ("table", "name", "label"),
    [
        ("public.entities", None, "entities"),
        ("entities", None, "entities"),
        ("shop.order_lines", None, "order_lines"),
        ("shop.order_lines", "lines", "lines"),
    ],
)
def test_label_is_the_name_else_the_table_name(table: str, name: str | None, label: str) -> None:
    mapping = TableMapping(table=table, name=name)
    assert mapping.label == label == (mapping.name or mapping.table_name)


def _plan_error(tables: object) -> str:
    with pytest.raises(ValidationError) as refused:
        PlanConfig.model_validate({"tables": tables})
    (error,) = refused.value.errors()  # one error, naming each mapping's problems
    return str(error["msg"])


def test_an_unknown_mapping_field_names_the_table_and_the_field_it_meant() -> None:
    text = _plan_error([{"table": "support.tickets", "tenant_colum": "org"}])
    assert "tables[0] (support.tickets): unknown field 'tenant_colum'" in text
    assert "(did you mean 'tenant_column'?)" in text
    assert "the fields are: table, name, topic, key_columns, tenant_column" in text
    text = _plan_error([{"table": "kb.files", "document": {"colum": "file"}}])
    assert "unknown field 'document.colum' (did you mean 'column'?)" in text


def test_a_mapping_value_error_names_the_table_the_field_and_the_accepted_values() -> None:
    text = _plan_error(
        [
            {"table": "public.entities"},
            {"table": "kb.files", "document": {"column": "f", "kind": "blob"}},
            {"table": "kb.pages", "key_columns": "id", "default_format": "rtf"},
        ]
    )
    assert "tables[1] (kb.files): document.kind: Input should be 'binary' or 'reference'" in text
    assert "tables[2] (kb.pages): key_columns: Input should be a valid tuple" in text
    assert '(a JSON list, e.g. ["id"])' in text
    assert "tables[2] (kb.pages): default_format: Input should be 'text', 'html'" in text
    assert "tables[0]" not in text  # a valid mapping is not named
    assert "at least 1 item" not in text


def test_a_mapping_rule_error_names_the_table() -> None:
    text = _plan_error([{"table": "kb.pages", "tenant": "Acme Corp", "tenant_column": None}])
    assert text.startswith("Value error, tables[0] (kb.pages): tenant: invalid tenant name")
    text = _plan_error([{"table": "kb.pages", "tenant": "acme"}])
    assert "tables[0] (kb.pages): kb.pages: set exactly one of tenant_column and tenant" in text
    assert "a table mapping is a JSON object, got str" in _plan_error(["kb.pages"])
