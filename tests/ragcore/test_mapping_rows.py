"""What a row holds that no index can take (a lone surrogate, an integer Python will not print,
a moment with no UTC datetime) is the row's `MappingError` naming the column: its record is
dead-lettered as MAPPING_ERROR, never a crash of a later stage (issue 41)."""

from __future__ import annotations

import hashlib
from datetime import UTC, datetime, timedelta, timezone
from typing import Any

import pytest

from ragcore.errors import MappingError
from ragcore.mapping import RowView, TableMapping, metadata_of, to_datetime
from ragcore.plan import build_entity
from schemas.entities import Entity, EntityVersion

pytestmark = pytest.mark.unit

MAPPING = TableMapping()


def row(**columns: Any) -> RowView:
    base = {
        "id": "x",
        "company_id": "acme",
        "entity_type": "NOTE",
        "name": "A note",
        "content": "Plain text.",
        "metadata": None,
        "content_hash": None,
        "created_at": None,
        "updated_at": None,
        "deleted_at": None,
    }
    return RowView({**base, **columns}, "t[0]@1")


def entity_of(view: RowView) -> Entity:
    return build_entity(
        view,
        MAPPING,
        tenant_id="acme",
        entity_id="entities:x",
        version=EntityVersion(updated_at_us=None, lsn=1, snapshot=False),
        hasher=lambda text, _fmt: hashlib.sha256(text.encode()).hexdigest(),
        where=view.where,
    )


@pytest.mark.parametrize(
    ("column", "value"),
    [
        ("name", "title \ud800"),
        ("entity_type", "\udfff"),
        ("content", "text \ud83d alone"),
        ("content_hash", "\ud800"),
        ("metadata", '{"k": "\\ud800"}'),  # a JSON escape decodes to a lone surrogate
        ("metadata", '{"\\udc00": 1}'),
        ("metadata", {"nested": ["ok", {"k": "\ud800"}]}),
    ],
)
def test_a_lone_surrogate_in_a_column_is_the_rows_mapping_error(column: str, value: Any) -> None:
    with pytest.raises(MappingError, match="lone surrogate") as info:
        entity_of(row(**{column: value}))
    assert info.value.column == column
    assert info.value.code == "MAPPING_ERROR"


def test_a_lone_surrogate_in_a_key_or_tenant_is_the_rows_mapping_error() -> None:
    with pytest.raises(MappingError, match="lone surrogate") as info:
        MAPPING.row_entity_id(row(id="x\ud800"))
    assert info.value.column == "id"
    with pytest.raises(MappingError) as info:
        MAPPING.row_tenant(row(company_id="acme\ud800"))
    assert info.value.column == "company_id"


def test_a_surrogate_pair_written_as_one_character_is_text() -> None:
    entity = entity_of(row(content="emoji \U0001f600", metadata={"k": "\U0001f600"}))
    assert "\U0001f600" in entity.content


def test_json_with_an_integer_python_will_not_convert_is_the_rows_mapping_error() -> None:
    # more digits than sys.get_int_max_str_digits() (4300): json.loads raises ValueError
    huge = '{"n": ' + "9" * 5000 + "}"
    with pytest.raises(MappingError, match="not usable JSON") as info:
        metadata_of(row(metadata=huge), MAPPING)
    assert info.value.column == "metadata"


@pytest.mark.parametrize(
    "value",
    [
        "9999-12-31T23:59:59-05:00",  # past datetime.max once in UTC
        "0001-01-01T00:00:00+05:00",  # before datetime.min once in UTC
        # an aware datetime, as the decoder makes of a ZonedTimestamp
        datetime(9999, 12, 31, 23, 0, tzinfo=timezone(timedelta(hours=-5))),
    ],
)
def test_a_moment_with_no_utc_datetime_is_the_rows_mapping_error(value: object) -> None:
    with pytest.raises(MappingError, match="out of range in UTC"):
        to_datetime(value, "t[0]@1: column 'updated_at'")
    with pytest.raises(MappingError) as info:
        row(updated_at=value).optional_time("updated_at")
    assert info.value.column == "updated_at"


def test_a_moment_with_an_offset_is_read_in_utc() -> None:
    moment = to_datetime("2026-03-01T10:00:00+02:00", "w")
    assert moment == datetime(2026, 3, 1, 8, 0, tzinfo=UTC)
    assert moment.tzinfo is UTC


def test_a_title_over_its_limit_is_the_rows_mapping_error() -> None:
    """Every chunk's payload carries the title: a 2.1M-character one was indexed (the fuzz of
    issue 41 found it); one character over the limit is the row's fault, at the limit is not."""
    limit = MAPPING.max_title_chars
    assert entity_of(row(name="t" * limit)).title == "t" * limit
    with pytest.raises(MappingError, match="title is 4097 characters") as info:
        entity_of(row(name="t" * (limit + 1)))
    assert info.value.column == "name"
    assert info.value.code == "MAPPING_ERROR"
