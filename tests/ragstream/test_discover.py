"""discover's proposals, from hand-built catalogs: every choice and the reason it gives, the
tables it leaves out and why, and (hypothesis) that no proposal is a mapping check refuses."""

from __future__ import annotations

import json

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from ragcore.mapping import TableMapping
from ragcore.plan import PlanConfig
from ragcore.sor.mapcheck import Severity, check_mappings
from ragcore.sor.pgcatalog import ColumnKind, ReplicaIdentity, TableInfo
from ragstream.discover import (
    CATEGORY_NAMES,
    CONTENT_NAMES,
    CREATED_NAMES,
    DELETED_NAMES,
    TENANT_TIERS,
    TITLE_NAMES,
    UPDATED_NAMES,
    DiscoverOptions,
    LeftOut,
    Proposal,
    TableSample,
    propose,
    propose_table,
)
from tests.ragcore.sor.catalogs import col, database, table

pytestmark = pytest.mark.unit

K = ColumnKind


def proposed(info: TableInfo, sample: TableSample | None = None, **options: str) -> Proposal:
    found = propose_table(info, DiscoverOptions(**options), sample)
    assert isinstance(found, Proposal), found
    # what discover prints is a valid element of RAGSTREAM_PLAN__TABLES
    assert TableMapping.model_validate(json.loads(json.dumps(found.mapping_json()))) == (
        found.mapping
    )
    return found


def left_out(info: TableInfo, **options: str) -> LeftOut:
    found = propose_table(info, DiscoverOptions(**options))
    assert isinstance(found, LeftOut), found
    return found


TICKETS = table(
    "support.tickets",
    [
        col("org_id", K.TEXT, not_null=True),
        col("ticket_no", K.INTEGER),
        col("subject", K.TEXT, not_null=True),
        col("body", K.TEXT),
        col("status", K.TEXT),
        col("requester_email", K.TEXT),
        col("password_hash", K.TEXT),
        col("modified_at", K.TIMESTAMP, not_null=True),
        col("created_at", K.TIMESTAMP, not_null=True),
        col("deleted_at", K.TIMESTAMP),
    ],
    pk=("org_id", "ticket_no"),
)


def test_a_composite_key_a_tenant_title_content_categories_and_times() -> None:
    p = proposed(TICKETS)
    m = p.mapping
    assert m.key_columns == ("org_id", "ticket_no")
    assert m.tenant_column == "org_id"
    assert m.title_column == "subject"
    assert m.content_columns == ("subject", "body")
    assert m.metadata_columns == ("status",)
    assert (m.created_at_column, m.updated_at_column, m.deleted_at_column) == (
        "created_at",
        "modified_at",
        "deleted_at",
    )
    assert (m.type_column, m.metadata_column, m.content_hash_column) == (None, None, None)
    assert "2 columns, in key order" in p.reasons["key_columns"]
    assert "part of the primary key" in p.reasons["tenant_column"]
    assert "NOT NULL" in p.reasons["tenant_column"]
    assert "'subject' comes first" in p.reasons["content_columns"]
    assert "soft delete" in p.reasons["deleted_at_column"]
    assert "'TICKETS'" in p.reasons["type_column"]
    assert p.unused["password_hash"] == "named like a secret: never indexed"
    assert "identifier or an address" in p.unused["requester_email"]


def test_every_field_the_mapping_sets_has_a_reason() -> None:
    p = proposed(TICKETS)
    doc = p.mapping_json()
    named = {k for k in doc if k not in ("table",)} - {"json_columns", "format_column"}
    assert named <= set(p.reasons), named - set(p.reasons)
    assert all(p.reasons.values())


def test_the_defaults_of_the_seed_table_are_written_out_as_nulls() -> None:
    """A proposal names every column field, nulls included: the defaults fit the seed table."""
    doc = proposed(TICKETS).mapping_json()
    assert doc["type_column"] is None
    assert doc["metadata_column"] is None
    assert doc["content_hash_column"] is None


def test_a_tenant_column_with_another_name_is_found_by_its_foreign_key() -> None:
    info = table(
        "shop.notes",
        [col("id", K.INTEGER), col("owner_ref", K.TEXT, not_null=True), col("note", K.TEXT)],
        references={"owner_ref": "shop.companies"},
    )
    p = proposed(info)
    assert p.mapping.tenant_column == "owner_ref"
    assert "references shop.companies" in p.reasons["tenant_column"]


def test_the_best_tenant_name_wins_and_the_others_are_named() -> None:
    info = table(
        "crm.deals",
        [
            col("id", K.UUID),
            col("customer_id", K.INTEGER, not_null=True),
            col("account_id", K.TEXT, not_null=True),
            col("notes", K.TEXT),
        ],
    )
    p = proposed(info)
    assert p.mapping.tenant_column == "account_id"
    assert "also considered: 'customer_id'" in p.reasons["tenant_column"]


def test_a_close_call_between_tenant_columns_is_a_note() -> None:
    info = table(
        "crm.deals",
        [
            col("id", K.UUID),
            col("org_id", K.TEXT, not_null=True),
            col("company_id", K.TEXT, not_null=True),
            col("notes", K.TEXT),
        ],
    )
    p = proposed(info)
    assert p.mapping.tenant_column == "org_id"
    assert any("by name order alone" in n for n in p.notes)


def test_a_customer_like_tenant_is_proposed_with_a_note_to_confirm_it() -> None:
    info = table(
        "crm.visits",
        [col("id", K.INTEGER), col("customer_id", K.INTEGER, not_null=True), col("notes", K.TEXT)],
    )
    p = proposed(info)
    assert p.mapping.tenant_column == "customer_id"
    assert any("confirm it" in n for n in p.notes)


def test_a_not_null_tenant_column_beats_a_nullable_one_of_the_same_tier() -> None:
    info = table(
        "crm.deals",
        [
            col("id", K.INTEGER),
            col("org_id", K.TEXT),
            col("company_id", K.TEXT, not_null=True),
            col("body", K.TEXT),
        ],
    )
    assert proposed(info).mapping.tenant_column == "company_id"


def test_tenant_column_and_tenant_settle_it() -> None:
    info = table("crm.notes", [col("id", K.INTEGER), col("owner", K.TEXT), col("body", K.TEXT)])
    assert "no tenant column found" in left_out(info).reason
    p = proposed(info, tenant_column="owner")
    assert p.mapping.tenant_column == "owner"
    assert "--tenant-column" in p.reasons["tenant_column"]
    constant = proposed(info, tenant="acme")
    assert (constant.mapping.tenant_column, constant.mapping.tenant) == (None, "acme")
    assert constant.mapping_json()["tenant_column"] is None
    assert "--tenant" in constant.reasons["tenant"]
    assert "no column 'region'" in left_out(info, tenant_column="region").reason


def test_the_tenants_own_table_is_left_out_as_such() -> None:
    info = table("public.companies", [col("id", K.TEXT), col("description", K.TEXT)])
    assert "tenants' own table" in left_out(info).reason


def test_a_table_without_a_primary_key_is_left_out_with_the_fix() -> None:
    info = table(
        "public.sessions",
        [col("token", K.TEXT, not_null=True), col("company_id", K.TEXT), col("body", K.TEXT)],
        pk=(),
        unique=[("token",)],
    )
    out = left_out(info)
    assert "no primary key" in out.reason
    assert out.fix == "ALTER TABLE public.sessions ADD PRIMARY KEY USING INDEX sessions_token_key"


def test_a_key_that_cannot_form_an_entity_id_is_left_out() -> None:
    info = table(
        "public.readings",
        [col("at", K.TIMESTAMP), col("company_id", K.TEXT), col("body", K.TEXT)],
        pk=("at",),
    )
    assert "cannot form an entity id" in left_out(info).reason


def test_a_table_with_nothing_to_index_is_left_out() -> None:
    info = table(
        "public.audit_log",
        [col("id", K.INTEGER), col("company_id", K.TEXT), col("at", K.TIMESTAMP)],
    )
    assert "nothing to index" in left_out(info).reason


def test_text_long_enough_to_be_prose_is_content_and_short_text_is_not() -> None:
    info = table(
        "public.items",
        [
            col("id", K.INTEGER),
            col("company_id", K.TEXT),
            col("remarks", K.TEXT),
            col("label", K.TEXT),
            col("sku", K.TEXT),
            col("code", K.TEXT, max_length=12),
        ],
    )
    sample = TableSample(rows=200, avg_chars={"remarks": 410.0, "sku": 9.0, "code": 6.0})
    p = proposed(info, sample)
    assert p.mapping.title_column == "label"
    assert p.mapping.content_columns == ("label", "remarks")
    assert "'remarks' averages 410 characters over 200 rows read" in p.reasons["content_columns"]
    assert "short text (averages 9 characters" in p.unused["sku"]
    assert "too short for prose" in p.unused["code"]
    without_rows = propose_table(info, DiscoverOptions(), None)
    assert isinstance(without_rows, LeftOut)  # no row tells prose from a label


def test_json_content_is_rendered_and_a_metadata_object_is_merged() -> None:
    info = table(
        "catalog.products",
        [
            col("sku", K.TEXT),
            col("vendor", K.TEXT, not_null=True),
            col("title", K.TEXT),
            col("specs", K.JSON),
            col("attributes", K.JSON),
            col("updated_at", K.TIMESTAMP),
        ],
        pk=("sku",),
    )
    p = proposed(
        info,
        TableSample(rows=50, objects={"specs": False, "attributes": True}),
        tenant_column="vendor",
    )
    assert p.mapping.content_columns == ("title", "specs")
    assert p.mapping.json_columns == ("specs",)
    assert p.mapping.metadata_column == "attributes"
    assert "an object in every one of 50 rows read" in p.reasons["metadata_column"]
    assert "rendered as `key: value` lines" in p.reasons["json_columns"]


def test_a_json_column_named_like_metadata_but_holding_arrays_is_content() -> None:
    info = table(
        "catalog.products",
        [col("sku", K.TEXT), col("tenant_id", K.TEXT), col("tags", K.JSON)],
        pk=("sku",),
    )
    p = proposed(info, TableSample(rows=10, objects={"tags": False}))
    assert p.mapping.metadata_column is None
    assert p.mapping.content_columns == ("tags",)
    assert p.mapping.json_columns == ("tags",)


def test_a_bytea_file_column_makes_a_document_table() -> None:
    info = table(
        "docs.attachments",
        [
            col("id", K.INTEGER),
            col("workspace_id", K.UUID, not_null=True),
            col("file_name", K.TEXT),
            col("mime_type", K.TEXT),
            col("description", K.TEXT),
            col("file", K.BYTEA, not_null=True),
            col("thumbnail", K.BYTEA),
        ],
    )
    p = proposed(info)
    document = p.mapping.document
    assert document is not None
    assert (document.column, document.kind, document.mime_type_column, document.name_column) == (
        "file",
        "binary",
        "mime_type",
        "file_name",
    )
    assert p.mapping.title_column == "file_name"
    assert "content_columns" not in p.mapping_json()
    assert p.mapping_json()["document"] == {
        "column": "file",
        "mime_type_column": "mime_type",
        "name_column": "file_name",
    }
    assert "each row's content is that document" in p.reasons["document"]
    assert "a document table's content is its file" in p.unused["description"]
    assert "binary, not named like a file" in p.unused["thumbnail"]


def test_a_boolean_soft_delete_flag_is_not_mapped_and_says_why() -> None:
    info = table(
        "kb.articles",
        [
            col("id", K.INTEGER),
            col("tenant", K.TEXT, not_null=True),
            col("body", K.TEXT),
            col("is_deleted", K.BOOLEAN, not_null=True),
        ],
    )
    p = proposed(info)
    assert p.mapping.deleted_at_column is None
    assert "false is not NULL" in p.unused["is_deleted"]
    assert any("soft-delete flag" in n for n in p.notes)


def test_a_not_null_deletion_time_is_no_soft_delete_column() -> None:
    info = table(
        "kb.articles",
        [
            col("id", K.INTEGER),
            col("tenant", K.TEXT),
            col("body", K.TEXT),
            col("deleted_at", K.TIMESTAMP, not_null=True),
        ],
    )
    assert proposed(info).mapping.deleted_at_column is None


def test_generated_and_oddly_named_columns_are_never_mapped() -> None:
    info = table(
        "kb.articles",
        [
            col("id", K.INTEGER),
            col("tenant", K.TEXT),
            col("body", K.TEXT, generated=True),
            col("Body Text", K.TEXT),
            col("notes", K.TEXT),
        ],
    )
    p = proposed(info)
    assert p.mapping.content_columns == ("notes",)
    assert "generated column" in p.unused["body"]
    assert "not a plain SQL identifier" in p.unused["Body Text"]


def test_a_type_a_format_and_a_declared_hash_are_used() -> None:
    info = table(
        "kb.pages",
        [
            col("id", K.INTEGER),
            col("tenant_id", K.TEXT),
            col("kind", K.TEXT),
            col("format", K.TEXT),
            col("content", K.TEXT),
            col("content_hash", K.TEXT),
        ],
    )
    m = proposed(info).mapping
    assert (m.type_column, m.format_column, m.content_hash_column) == (
        "kind",
        "format",
        "content_hash",
    )
    assert m.content_columns == ("content",)


def test_tables_of_two_schemas_with_one_name_get_distinct_names() -> None:
    a = table("eu.tickets", [col("id", K.INTEGER), col("tenant_id", K.TEXT), col("body", K.TEXT)])
    b = table("us.tickets", [col("id", K.INTEGER), col("tenant_id", K.TEXT), col("body", K.TEXT)])
    found = propose(database(a, b))
    assert [p.mapping.label for p in found.proposals] == ["eu_tickets", "us_tickets"]
    assert "another schema" in found.proposals[0].reasons["name"]
    PlanConfig.model_validate({"tables": found.tables_json()})  # labels, topics are unique


def test_the_proposals_are_the_value_of_the_variable() -> None:
    found = propose(database(TICKETS))
    plan = PlanConfig.model_validate({"tables": json.loads(json.dumps(found.tables_json()))})
    assert plan.tables[0].table == "support.tickets"


def test_an_unreadable_table_is_left_out_with_the_grant() -> None:
    info = table(
        "hr.reviews",
        [col("id", K.INTEGER), col("tenant_id", K.TEXT), col("body", K.TEXT)],
        readable=False,
    )
    assert "GRANT SELECT ON hr.reviews" in left_out(info).fix


# --- the property: discover never proposes what check refuses --------------------------------

_NAMES = sorted(
    {
        *(n for tier in TENANT_TIERS for n in tier),
        *TITLE_NAMES,
        *CONTENT_NAMES,
        *CATEGORY_NAMES,
        *UPDATED_NAMES,
        *CREATED_NAMES,
        *DELETED_NAMES,
        "is_deleted",
        "file",
        "mime_type",
        "file_name",
        "format",
        "kind",
        "content_hash",
        "metadata",
        "attributes",
        "api_token",
        "misc",
        "x1",
    }
)


_KEY_KINDS = [K.INTEGER, K.TEXT, K.UUID]


@st.composite
def tables(draw: st.DrawFn) -> tuple[TableInfo, TableSample]:
    """A table with an id of a key type (and sometimes a second key column), usually a tenant
    column, and up to a dozen columns of any kind under names discover looks for."""
    names = draw(st.lists(st.sampled_from(_NAMES), min_size=1, max_size=12, unique=True))
    columns = [col("id", draw(st.sampled_from(_KEY_KINDS)))]
    if draw(st.integers(0, 4)) and "tenant_id" not in names:
        kind = draw(st.sampled_from([K.TEXT, K.INTEGER, K.UUID, K.JSON]))
        columns.append(col("tenant_id", kind, not_null=draw(st.booleans())))
    columns += [
        col(
            name,
            draw(st.sampled_from(list(ColumnKind))),
            not_null=draw(st.booleans()),
            generated=draw(st.integers(0, 9)) == 0,
        )
        for name in names
    ]
    key_size = draw(st.sampled_from([1, 1, 1, 2]))
    key = tuple(c.name for c in columns[:key_size])
    info = table(
        "app.things",
        columns,
        pk=key,
        identity=draw(st.sampled_from(list(ReplicaIdentity))),
    )
    sample = TableSample(
        rows=draw(st.integers(0, 100)),
        avg_chars={n: draw(st.floats(0, 500)) for n in names if draw(st.booleans())},
        objects={n: draw(st.booleans()) for n in names},
    )
    return info, sample


@settings(max_examples=300, deadline=None)
@given(tables(), st.sampled_from([None, "acme"]))
def test_no_proposal_is_a_mapping_check_refuses_for_its_columns(
    drawn: tuple[TableInfo, TableSample], tenant: str | None
) -> None:
    """Whatever the table, a proposal's columns exist, are published-able (not generated) and
    suit their fields; only REPLICA IDENTITY (the table's, not the mapping's) may stand in the
    way, and that problem says so."""
    info, sample = drawn
    found = propose_table(info, DiscoverOptions(tenant=tenant), sample)
    if isinstance(found, LeftOut):
        assert found.reason and found.fix
    else:
        TableMapping.model_validate(found.mapping_json())
        refused = check_mappings([found.mapping], database(info))
        errors = [p for p in refused if p.severity is Severity.ERROR]
        assert all(p.code == "REPLICA_IDENTITY" for p in errors), [p.line() for p in errors]


def test_rows_that_could_not_be_read_are_a_note_and_names_decide_alone() -> None:
    info = table(
        "kb.pages",
        [
            col("id", K.INTEGER),
            col("tenant_id", K.TEXT),
            col("body", K.TEXT),
            col("remark", K.TEXT),
        ],
    )
    p = proposed(info, TableSample(rows=0, error="InsufficientPrivilege: permission denied"))
    assert p.mapping.content_columns == ("body",)
    assert "no rows to measure" in p.unused["remark"]
    assert any("could not be read (InsufficientPrivilege" in n for n in p.notes)
