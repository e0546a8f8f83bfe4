"""The planner: what each kind of change event means for the index."""

from __future__ import annotations

import hashlib
from collections.abc import Mapping
from datetime import UTC, datetime
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from ragcore.errors import MappingError, SchemaDriftError
from ragcore.mapping import TableMapping, epoch_us, json_depth, to_datetime
from ragcore.plan import (
    Action,
    PlanConfig,
    PlanPolicy,
    RecordIdentity,
    plan_event,
    record_identity,
)
from ragcore.store.ids import TenantId
from schemas.entities import ContentFormat, EntityVersion
from schemas.events import (
    ChangeEvent,
    Op,
    RecordKind,
    RecordPosition,
    SnapshotMarker,
    SourceInfo,
)

POS = RecordPosition("sor.public.entities", 0, 7)


def fake_hasher(content: str, fmt: ContentFormat) -> str:
    return hashlib.sha256(f"{fmt}:{content}".encode()).hexdigest()


def row(**overrides: Any) -> dict[str, Any]:
    base: dict[str, Any] = {
        "id": "ent-1",
        "company_id": "acme",
        "entity_type": "KNOWLEDGE_ARTIFACT",
        "name": "Refund policy",
        "content": "Refunds are issued within 30 days.",
        "metadata": '{"format": "markdown", "team": "support"}',
        "content_hash": None,
        "created_at": 1_700_000_000_000_000,
        "updated_at": 1_700_000_100_000_000,
        "deleted_at": None,
    }
    base.update(overrides)
    return base


def change(
    op: Op,
    *,
    after: Mapping[str, Any] | None = None,
    before: Mapping[str, Any] | None = None,
    key: Mapping[str, Any] | None = None,
    snapshot: SnapshotMarker = SnapshotMarker.FALSE,
    unavailable: frozenset[str] = frozenset(),
    new_key: Mapping[str, Any] | None = None,
) -> ChangeEvent:
    return ChangeEvent(
        kind=RecordKind.CHANGE,
        position=POS,
        op=op,
        key=key if key is not None else {"id": "ent-1"},
        before=before,
        after=after,
        source=SourceInfo(table="entities", ts_ms=1_700_000_100_500, lsn=42, snapshot=snapshot),
        unavailable_columns=unavailable,
        new_key=new_key,
    )


def plan(event: ChangeEvent, config: PlanConfig | None = None) -> Any:
    return plan_event(event, config or PlanConfig(), fake_hasher)


@pytest.mark.unit
def test_create_builds_entity_with_computed_hash_and_markdown_format() -> None:
    p = plan(change(Op.CREATE, after=row()))
    assert p.action is Action.UPSERT and p.reason == "upsert"
    assert (p.tenant_id, p.entity_id, p.table) == ("acme", "entities:ent-1", "entities")
    assert p.entity is not None
    assert p.entity.content_format is ContentFormat.MARKDOWN
    assert p.entity.metadata == {"format": "markdown", "team": "support"}
    assert p.entity.content_hash == fake_hasher(row()["content"], ContentFormat.MARKDOWN)
    assert p.entity.title == "Refund policy"
    assert p.version == EntityVersion(updated_at_us=1_700_000_100_000_000, lsn=42, snapshot=False)
    assert p.source_ts_ms == 1_700_000_100_500


@pytest.mark.unit
def test_declared_content_hash_column_wins_over_computed_hash() -> None:
    p = plan(change(Op.UPDATE, after=row(content_hash="ABCDEF")))
    assert p.entity is not None and p.entity.content_hash == "abcdef"


@pytest.mark.unit
def test_soft_delete_plans_a_delete() -> None:
    p = plan(change(Op.UPDATE, after=row(deleted_at=1_700_000_200_000_000)))
    assert (p.action, p.reason, p.entity_id, p.tenant_id) == (
        Action.DELETE,
        "soft_delete",
        "entities:ent-1",
        "acme",
    )


@pytest.mark.unit
def test_delete_without_before_takes_id_from_key_and_leaves_tenant_unknown() -> None:
    p = plan(change(Op.DELETE, before=None, key={"id": "ent-9"}))
    assert (p.action, p.entity_id, p.tenant_id) == (Action.DELETE, "entities:ent-9", None)


@pytest.mark.unit
def test_delete_with_full_before_knows_tenant_and_version() -> None:
    p = plan(change(Op.DELETE, before=row()))
    assert (p.action, p.tenant_id) == (Action.DELETE, "acme")
    assert p.version is not None and p.version.updated_at_us == 1_700_000_100_000_000


@pytest.mark.unit
def test_delete_half_of_primary_key_change_is_labelled() -> None:
    p = plan(change(Op.DELETE, before=row(), new_key={"id": "ent-2"}))
    assert p.reason == "delete_pk_change"


@pytest.mark.unit
def test_update_that_moves_tenant_deletes_from_previous_tenant() -> None:
    p = plan(change(Op.UPDATE, before=row(company_id="old-co"), after=row()))
    assert (p.action, p.tenant_id, p.previous_tenant_id) == (Action.UPSERT, "acme", "old-co")


@pytest.mark.unit
def test_toast_placeholder_in_content_asks_for_refetch_not_text() -> None:
    after = row()
    del after["content"]
    p = plan(change(Op.UPDATE, after=after, unavailable=frozenset({"content"})))
    assert (p.action, p.reason) == (Action.REFETCH, "content_unavailable")
    assert p.entity is None


@pytest.mark.unit
def test_snapshot_row_version_is_marked_snapshot_and_loses_ties() -> None:
    snap = plan(change(Op.READ, after=row(), snapshot=SnapshotMarker.LAST))
    live = plan(change(Op.UPDATE, after=row()))
    assert snap.version is not None and live.version is not None
    assert snap.version.snapshot is True
    assert snap.version.is_older_than(live.version)
    assert not live.version.is_older_than(snap.version)


@pytest.mark.unit
@pytest.mark.parametrize(
    ("overrides", "message"),
    [
        ({"company_id": None}, "company_id"),
        ({"id": ""}, "'id'"),
        ({"metadata": "{not json"}, "metadata is not valid JSON"),
        ({"metadata": "[1, 2]"}, "must be a JSON object"),
        ({"metadata": '{"format": "docx"}'}, "unknown content format"),
        ({"updated_at": "yesterday"}, "not an ISO-8601 timestamp"),
    ],
)
def test_unmappable_rows_raise_mapping_error_with_reason(
    overrides: dict[str, Any], message: str
) -> None:
    with pytest.raises(MappingError, match=message):
        plan(change(Op.CREATE, after=row(**overrides)))


@pytest.mark.unit
def test_row_without_tenant_column_is_a_mapping_error() -> None:
    after = row()
    del after["company_id"]
    with pytest.raises(MappingError, match="company_id missing"):
        plan(change(Op.CREATE, after=after))


@pytest.mark.unit
def test_oversized_content_is_a_mapping_error() -> None:
    config = PlanConfig(tables=(TableMapping(max_content_chars=10),))
    with pytest.raises(MappingError, match="over the limit"):
        plan(change(Op.CREATE, after=row()), config)


@pytest.mark.unit
@pytest.mark.parametrize(
    ("kind", "reason"),
    [
        (RecordKind.TOMBSTONE, "tombstone"),
        (RecordKind.HEARTBEAT, "heartbeat"),
        (RecordKind.SCHEMA_CHANGE, "schema_change"),
        (RecordKind.TRANSACTION, "transaction"),
        (RecordKind.MESSAGE, "logical_message"),
    ],
)
def test_records_without_row_changes_are_skipped_by_default(kind: RecordKind, reason: str) -> None:
    p = plan(ChangeEvent(kind=kind, position=POS))
    assert (p.action, p.reason) == (Action.SKIP, reason)


@pytest.mark.unit
def test_truncate_and_message_policy_can_route_to_dlq() -> None:
    config = PlanConfig(policy=PlanPolicy(truncate="dlq", message="dlq"))
    for kind in (RecordKind.TRUNCATE, RecordKind.MESSAGE):
        assert plan(ChangeEvent(kind=kind, position=POS), config).action is Action.DLQ


@pytest.mark.unit
def test_truncate_purges_the_table_up_to_its_lsn_by_default() -> None:
    event = ChangeEvent(
        kind=RecordKind.TRUNCATE,
        position=POS,
        op=Op.TRUNCATE,
        source=SourceInfo(schema="public", table="entities", lsn=900),
    )
    p = plan(event)
    assert (p.action, p.table, p.entity_id) == (Action.TRUNCATE, "entities", None)
    assert p.version is not None and p.version.lsn == 900
    skipped = plan(event, PlanConfig(policy=PlanPolicy(truncate="skip")))
    assert skipped.action is Action.SKIP


@pytest.mark.unit
def test_truncate_of_an_unmapped_table_is_a_mapping_error() -> None:
    event = ChangeEvent(
        kind=RecordKind.TRUNCATE,
        position=RecordPosition("sor.public.other", 0, 1),
        op=Op.TRUNCATE,
        source=SourceInfo(schema="public", table="other", lsn=900),
    )
    with pytest.raises(MappingError, match=r"no table mapping for public\.other"):
        plan(event)


TICKETS = TableMapping(
    table="support.tickets",
    tenant_column="org",
    key_columns=("ticket_id",),
    type_column=None,
    default_entity_type="TICKET",
    title_column="subject",
    content_columns=("subject", "body"),
    metadata_column=None,
    metadata_columns=("status",),
    content_hash_column=None,
    deleted_at_column=None,
)


@pytest.mark.unit
def test_custom_table_mapping_is_chosen_by_source_table() -> None:
    config = PlanConfig(tables=(TableMapping(), TICKETS))
    event = ChangeEvent(
        kind=RecordKind.CHANGE,
        position=RecordPosition("sor.support.tickets", 1, 3),
        op=Op.CREATE,
        after={
            "ticket_id": 77,
            "org": "globex",
            "subject": "Printer",
            "body": "It jams.",
            "status": "open",
            "created_at": None,
            "updated_at": None,
        },
        source=SourceInfo(schema="support", table="tickets"),
    )
    p = plan(event, config)
    assert p.entity is not None
    assert (p.entity.entity_id, p.entity.tenant_id, p.entity.entity_type) == (
        "tickets:77",
        "globex",
        "TICKET",
    )
    assert p.entity.content == "Printer\n\nIt jams."
    assert p.entity.metadata == {"status": "open"}


@pytest.mark.unit
def test_table_is_found_by_topic_when_the_event_has_no_source() -> None:
    config = PlanConfig(tables=(TableMapping(), TICKETS), topic_prefix="crm")
    event = ChangeEvent(
        kind=RecordKind.CHANGE,
        position=RecordPosition("crm.support.tickets", 0, 0),
        op=Op.CREATE,
        after={
            "ticket_id": "T-1",
            "org": "acme",
            "subject": "S",
            "body": "B",
            "status": None,  # present with null: a NULL column, not a missing one
            "created_at": None,
            "updated_at": None,
        },
    )
    assert plan(event, config).entity_id == "tickets:T-1"


@pytest.mark.unit
def test_same_key_in_two_tables_gives_two_entities() -> None:
    articles = TableMapping(table="public.articles")
    config = PlanConfig(tables=(TableMapping(), articles))
    ids = set()
    for table in ("entities", "articles"):
        event = ChangeEvent(
            kind=RecordKind.CHANGE,
            position=RecordPosition(f"sor.public.{table}", 0, 0),
            op=Op.CREATE,
            after=row(),
            source=SourceInfo(schema="public", table=table),
        )
        ids.add(plan(event, config).entity_id)
    assert ids == {"entities:ent-1", "articles:ent-1"}


@pytest.mark.unit
def test_composite_key_constant_tenant_json_content_and_template() -> None:
    specs = TableMapping(
        table="catalog.part_specs",
        name="specs",
        key_columns=("part_no", "revision"),
        tenant_column=None,
        tenant="globex",
        type_column=None,
        title_column="part_no",
        content_columns=("summary", "spec"),
        content_template="Part {summary}\n{spec}",
        json_columns=("spec",),
        metadata_column=None,
        content_hash_column=None,
        created_at_column=None,
        updated_at_column=None,
        deleted_at_column=None,
    )
    config = PlanConfig(tables=(specs,))
    after = {
        "part_no": "GX-300,A",  # a comma in a key value stays unambiguous
        "revision": 2,
        "summary": "seal kit",
        "spec": '{"material": "duplex", "sizes": [10, 12], "limits": {"bar": 16}}',
    }
    event = ChangeEvent(
        kind=RecordKind.CHANGE,
        position=RecordPosition("sor.catalog.part_specs", 0, 0),
        op=Op.CREATE,
        after=after,
        source=SourceInfo(schema="catalog", table="part_specs"),
    )
    p = plan(event, config)
    assert p.entity is not None
    assert p.entity.entity_id == "specs:GX-300%2CA,2"
    assert specs.key_of(p.entity.entity_id) == ("GX-300,A", "2")
    assert (p.entity.tenant_id, p.entity.entity_type) == ("globex", "SPECS")
    assert p.entity.content == ("Part seal kit\nmaterial: duplex\nsizes: 10, 12\nlimits.bar: 16")
    delete = ChangeEvent(
        kind=RecordKind.CHANGE,
        position=event.position,
        op=Op.DELETE,
        key={"part_no": "GX-300,A", "revision": 2},
        source=event.source,
    )
    d = plan(delete, config)
    assert (d.action, d.entity_id, d.tenant_id) == (Action.DELETE, p.entity.entity_id, "globex")


@pytest.mark.unit
def test_unknown_table_is_a_mapping_error_naming_it() -> None:
    config = PlanConfig(tables=(TableMapping(),))
    event = ChangeEvent(
        kind=RecordKind.CHANGE,
        position=RecordPosition("sor.public.other", 0, 0),
        op=Op.CREATE,
        after=row(),
        source=SourceInfo(schema="public", table="other"),
    )
    with pytest.raises(MappingError, match=r"no table mapping for public\.other"):
        plan(event, config)


@pytest.mark.unit
@pytest.mark.parametrize(
    ("tables", "message"),
    [
        ({"entities": {}}, "JSON list of table mappings"),
        ([{}, {"table": "other.entities"}], "share the name 'entities'"),
        ([{}, {"table": "public.entities", "name": "e2"}], "share the table"),
        ([{"tenant_column": None}], "exactly one of tenant_column and tenant"),
        ([{"content_template": "{body}"}], "not content_columns"),
        ([{"key_columns": ["id; drop"]}], "not plain column names"),
        ([{"id_column": "x", "key_columns": ["y"]}], "not both"),
    ],
)
def test_bad_table_mappings_are_refused_with_the_reason(tables: object, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        PlanConfig.model_validate({"tables": tables})


@pytest.mark.unit
def test_legacy_id_column_is_a_one_column_key() -> None:
    assert TableMapping.model_validate({"id_column": "ticket_id"}).key_columns == ("ticket_id",)


@pytest.mark.unit
def test_temporal_values_of_every_decoded_shape_map_to_the_same_instant() -> None:
    moment = datetime(2024, 5, 1, 12, 30, 15, 123456, tzinfo=UTC)
    shapes: list[object] = [
        moment,
        epoch_us(moment),
        "2024-05-01T12:30:15.123456Z",
        "2024-05-01T14:30:15.123456+02:00",
    ]
    assert {to_datetime(s, "t") for s in shapes} == {moment}
    assert epoch_us(datetime(1930, 3, 1, tzinfo=UTC)) == -1_257_206_400_000_000


@pytest.mark.unit
def test_a_tenant_the_index_cannot_hold_is_a_mapping_error_not_a_crash() -> None:
    with pytest.raises(MappingError, match="invalid tenant name 'Acme Corp'"):
        plan(change(Op.CREATE, after=row(company_id="Acme Corp")))


@pytest.mark.unit
def test_a_delete_whose_before_has_the_key_only_leaves_the_tenant_unknown() -> None:
    # REPLICA IDENTITY DEFAULT: Debezium fills the NOT NULL non-key columns with empty values
    before = {k: "" for k in row()} | {"id": "ent-1", "deleted_at": None}
    p = plan(change(Op.DELETE, before=before))
    assert (p.action, p.entity_id, p.tenant_id) == (Action.DELETE, "entities:ent-1", None)


# --- schema drift: a mapped column renamed or dropped in the SoR ---------------------------------


def _without(column: str, **extra: Any) -> dict[str, Any]:
    after = row(**extra)
    del after[column]
    return after


@pytest.mark.unit
@pytest.mark.parametrize("op", [Op.CREATE, Op.UPDATE, Op.READ])
def test_a_change_row_without_a_mapped_content_column_is_schema_drift_not_empty_content(
    op: Op,
) -> None:
    # `ALTER TABLE entities RENAME COLUMN content TO body`: the row carries `body`, not `content`
    event = change(op, after=_without("content", body="Refunds are issued within 30 days."))
    with pytest.raises(SchemaDriftError) as caught:
        plan(event)
    assert caught.value.code == "SCHEMA_DRIFT"
    assert (caught.value.table, caught.value.columns) == ("public.entities", ("content",))
    assert "public.entities" in str(caught.value) and "content" in str(caught.value)


@pytest.mark.unit
def test_a_dropped_title_or_soft_delete_column_is_schema_drift_too() -> None:
    for column in ("name", "deleted_at", "updated_at"):
        with pytest.raises(SchemaDriftError) as caught:
            plan(change(Op.UPDATE, after=_without(column)))
        assert caught.value.columns == (column,)


@pytest.mark.unit
def test_a_null_mapped_column_is_present_not_missing() -> None:
    p = plan(change(Op.CREATE, after=row(name=None, metadata=None, updated_at=None)))
    assert p.action is Action.UPSERT
    assert p.entity is not None and p.entity.title == ""


@pytest.mark.unit
def test_an_unchanged_toast_column_is_not_schema_drift() -> None:
    # the decoder removes the placeholder from `after` and names the column as unavailable
    event = change(Op.UPDATE, after=_without("content"), unavailable=frozenset({"content"}))
    assert plan(event).action is Action.REFETCH


@pytest.mark.unit
def test_a_key_only_delete_is_not_schema_drift() -> None:
    # REPLICA IDENTITY DEFAULT: `before` holds the key only; the delete still applies
    p = plan(change(Op.DELETE, before={"id": "ent-1"}))
    assert (p.action, p.entity_id) == (Action.DELETE, "entities:ent-1")


# --- rows that must be the row's fault (issue 41: no row can stop the lane) ------------------


def nested(depth: int) -> str:
    """A JSON array nested `depth` levels deep."""
    return "[" * depth + "]" * depth


@pytest.mark.unit
@pytest.mark.parametrize("depth", [65, 3_000, 100_000])
def test_metadata_nested_past_the_limit_is_a_mapping_error_naming_the_column(depth: int) -> None:
    # 3,000 deep raised RecursionError out of the planner and killed the ingest thread
    with pytest.raises(MappingError, match="nests deeper than 64 levels") as raised:
        plan(change(Op.CREATE, after=row(metadata='{"a": ' + nested(depth) + "}")))
    assert raised.value.column == "metadata"


@pytest.mark.unit
def test_metadata_nested_within_the_limit_is_kept() -> None:
    p = plan(change(Op.CREATE, after=row(metadata='{"a": ' + nested(60) + "}")))
    assert p.action is Action.UPSERT
    assert json_depth(p.entity.metadata) == 61


@pytest.mark.unit
@settings(max_examples=200, deadline=None)
@given(
    st.recursive(
        st.none() | st.booleans() | st.integers() | st.text(max_size=5),
        lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=3), inner),
        max_leaves=40,
    )
)
def test_json_depth_counts_nesting_without_recursion(value: object) -> None:
    def depth(v: object) -> int:
        if isinstance(v, dict):
            return 1 + max((depth(x) for x in v.values()), default=0)
        if isinstance(v, list):
            return 1 + max((depth(x) for x in v), default=0)
        return 0

    assert json_depth(value) == depth(value)
    assert json_depth(value, limit=1) == min(depth(value), 2)


@pytest.mark.unit
def test_a_json_content_column_nested_past_the_limit_is_a_mapping_error() -> None:
    config = PlanConfig(
        tables=(
            TableMapping(
                table="public.entities",
                content_columns=("content",),
                json_columns=("content",),
            ),
        )
    )
    with pytest.raises(MappingError, match="nests deeper") as raised:
        plan(change(Op.CREATE, after=row(content=nested(5_000))), config)
    assert raised.value.column == "content"


@pytest.mark.unit
@pytest.mark.parametrize("old", ["ACME", " acme ", "ac__me", "", "   "])
def test_an_update_from_an_invalid_or_equal_tenant_moves_nothing(old: str) -> None:
    # a row first written under `ACME` (dead-lettered) and fixed to `acme` killed the worker:
    # its `before` tenant was read unvalidated
    p = plan(change(Op.UPDATE, before=row(company_id=old), after=row(company_id="acme")))
    assert p.action is Action.UPSERT
    assert p.tenant_id == "acme" and p.previous_tenant_id is None


@pytest.mark.unit
def test_an_update_from_another_valid_tenant_names_it_validated() -> None:
    p = plan(change(Op.UPDATE, before=row(company_id=" globex "), after=row(company_id="acme")))
    assert p.previous_tenant_id == "globex"
    assert type(p.previous_tenant_id) is TenantId and type(p.tenant_id) is TenantId


@pytest.mark.unit
def test_record_identity_names_what_it_can_and_never_raises() -> None:
    config = PlanConfig()
    bad = change(Op.CREATE, after=row(metadata="{not json"))
    assert record_identity(bad, config) == RecordIdentity("entities", "entities:ent-1", "acme")
    no_key = change(Op.CREATE, after=row(id=None), key={"other": 1})
    # no key columns: no entity, but the row still names its tenant
    assert record_identity(no_key, config) == RecordIdentity("entities", None, "acme")
    elsewhere = ChangeEvent(
        kind=RecordKind.CHANGE,
        position=RecordPosition("other.topic", 0, 1),
        op=Op.CREATE,
        after=row(),
        source=SourceInfo(table="nowhere"),
    )
    assert record_identity(elsewhere, config) == RecordIdentity()
