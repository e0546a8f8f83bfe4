"""Entity ids of a `TableMapping`: encoding key values and reading them back."""

from __future__ import annotations

import re
from urllib.parse import unquote

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from ragcore.mapping import TableMapping

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
