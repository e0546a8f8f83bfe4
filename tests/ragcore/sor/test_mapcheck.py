"""Table mappings judged against hand-built catalogs: every problem kind, its severity and its
fix; a workable mapping has none; the worker's refusal names the table and the field."""

from __future__ import annotations

import logging

import pytest

from ragcore.documents.source import DocumentSource
from ragcore.errors import ConfigError
from ragcore.mapping import TableMapping
from ragcore.sor.mapcheck import Problem, Severity, check_mappings, refuse_unworkable
from ragcore.sor.pgcatalog import ColumnKind, DatabaseInfo, ReplicaIdentity
from tests.ragcore.sor.catalogs import col, database, publication, table

pytestmark = pytest.mark.unit

K = ColumnKind

TICKETS = table(
    "support.tickets",
    [
        col("id", K.INTEGER),
        col("org", K.TEXT, not_null=True),
        col("subject", K.TEXT),
        col("body", K.TEXT),
        col("specs", K.JSON),
        col("updated_at", K.TIMESTAMP),
        col("deleted_at", K.TIMESTAMP),
    ],
    pk=("id",),
)
MAPPING = TableMapping(
    table="support.tickets",
    tenant_column="org",
    type_column=None,
    title_column="subject",
    content_columns=("subject", "body", "specs"),
    json_columns=("specs",),
    metadata_column=None,
    content_hash_column=None,
    created_at_column=None,
    updated_at_column="updated_at",
    deleted_at_column="deleted_at",
)
PUBLISHED = publication("ragstream", "support.tickets")


def problems(
    mapping: TableMapping = MAPPING, db: DatabaseInfo | None = None, **kwargs: object
) -> list[Problem]:
    found = check_mappings(
        [mapping],
        db or database(TICKETS, publications=[PUBLISHED]),
        **kwargs,  # type: ignore[arg-type]
    )
    for p in found:
        assert p.message and p.fix, p
    return found


def only(found: list[Problem], code: str) -> Problem:
    matching = [p for p in found if p.code == code]
    assert len(matching) == 1, [p.line() for p in found]
    return matching[0]


def test_a_workable_mapping_has_no_problem() -> None:
    assert problems() == []
    assert problems(publication="ragstream") == []


def test_a_missing_table_names_a_close_one() -> None:
    p = only(problems(MAPPING.model_copy(update={"table": "support.ticket"})), "TABLE_MISSING")
    assert p.severity is Severity.ERROR
    assert (p.table, p.field) == ("support.ticket", "table")
    assert "did you mean 'support.tickets'?" in p.message


def test_an_unreadable_table_gets_the_grant() -> None:
    hidden = table("support.tickets", TICKETS.columns, readable=False)
    p = only(problems(db=database(hidden, publications=[PUBLISHED])), "TABLE_UNREADABLE")
    assert p.sql == (
        'GRANT USAGE ON SCHEMA "support" TO "ragstream"; '
        'GRANT SELECT ON "support"."tickets" TO "ragstream"'
    )


def test_a_misspelt_column_names_the_field_and_the_column_it_meant() -> None:
    found = problems(MAPPING.model_copy(update={"updated_at_column": "updatedat"}))
    p = only(found, "COLUMN_MISSING")
    assert (p.severity, p.table, p.field) == (
        Severity.ERROR,
        "support.tickets",
        "updated_at_column",
    )
    assert "did you mean 'updated_at'?" in p.message
    assert "SCHEMA_DRIFT" in p.fix


def test_a_generated_column_is_never_published_before_postgresql_18() -> None:
    generated = table(
        "support.tickets",
        [*TICKETS.columns[:3], col("body", K.TEXT, generated=True), *TICKETS.columns[4:]],
    )
    p = only(problems(db=database(generated, publications=[PUBLISHED])), "COLUMN_GENERATED")
    assert p.field == "content_columns"
    on_18 = database(generated, publications=[PUBLISHED], version_num=180000)
    assert not [x for x in problems(db=on_18) if x.code == "COLUMN_GENERATED"]


def test_an_unreadable_column_gets_a_column_grant() -> None:
    hidden = table(
        "support.tickets",
        [*TICKETS.columns[:3], col("body", K.TEXT, readable=False), *TICKETS.columns[4:]],
    )
    p = only(problems(db=database(hidden, publications=[PUBLISHED])), "COLUMN_UNREADABLE")
    assert p.sql == 'GRANT SELECT ("body") ON "support"."tickets" TO "ragstream"'


@pytest.mark.parametrize(
    ("column", "kind", "field"),
    [
        ("org", K.JSON, "tenant_column"),
        ("deleted_at", K.BOOLEAN, "deleted_at_column"),
        ("updated_at", K.DATE, "updated_at_column"),
        ("updated_at", K.TEXT, "updated_at_column"),
        ("body", K.BYTEA, "content_columns"),
        ("subject", K.BOOLEAN, "title_column"),
        ("id", K.TIMESTAMP, "key_columns"),
    ],
)
def test_a_column_of_the_wrong_type_names_the_accepted_ones(
    column: str, kind: ColumnKind, field: str
) -> None:
    columns = [c if c.name != column else col(column, kind) for c in TICKETS.columns]
    db = database(table("support.tickets", columns), publications=[PUBLISHED])
    found = [p for p in problems(db=db) if p.code == "COLUMN_TYPE"]
    assert field in [p.field for p in found], [p.line() for p in found]
    assert all(p.severity is Severity.ERROR for p in found)
    wrong = next(p for p in found if p.field == field)
    assert f"{field} accepts" in wrong.message or "a timestamp" in wrong.message


def test_a_boolean_soft_delete_column_says_false_is_not_null() -> None:
    columns = [
        c if c.name != "deleted_at" else col("deleted_at", K.BOOLEAN) for c in TICKETS.columns
    ]
    p = only(problems(db=database(table("support.tickets", columns))), "COLUMN_TYPE")
    assert "a boolean false is not NULL" in p.message


def test_a_not_null_soft_delete_column_would_delete_every_row() -> None:
    columns = [
        c if c.name != "deleted_at" else col("deleted_at", K.TIMESTAMP, not_null=True)
        for c in TICKETS.columns
    ]
    p = only(problems(db=database(table("support.tickets", columns))), "DELETED_AT_NOT_NULL")
    assert "every row would be deleted" in p.message


def test_json_content_not_declared_as_json_is_a_warning() -> None:
    p = only(problems(MAPPING.model_copy(update={"json_columns": ()})), "JSON_NOT_DECLARED")
    assert (p.severity, p.field) == (Severity.WARNING, "json_columns")
    assert p.fix == 'add "specs" to json_columns'


def test_a_json_column_the_mapping_does_not_read_is_a_warning() -> None:
    mapping = MAPPING.model_copy(
        update={"content_columns": ("subject", "body"), "json_columns": ("specs",)}
    )
    assert only(problems(mapping), "JSON_COLUMN_UNUSED").severity is Severity.WARNING


def test_a_document_column_must_be_bytea_or_be_a_reference() -> None:
    mapping = MAPPING.model_copy(update={"document": DocumentSource(column="body")})
    p = only(problems(mapping), "COLUMN_TYPE")
    assert (p.field, p.fix) == (
        "document.column",
        'set document.kind to "reference" (with root or allowed_hosts)',
    )


def test_key_columns_that_identify_no_row_are_refused() -> None:
    p = only(problems(MAPPING.model_copy(update={"key_columns": ("org",)})), "KEY_NOT_UNIQUE")
    assert p.severity is Severity.ERROR
    assert p.fix == "set key_columns to the primary key ['id']"


def test_a_unique_key_that_deletes_do_not_carry_is_refused_unless_full() -> None:
    keyed = table(
        "support.tickets",
        TICKETS.columns,
        identity=ReplicaIdentity.DEFAULT,
        unique=[("org", "subject")],
    )
    mapping = MAPPING.model_copy(update={"key_columns": ("org", "subject")})
    p = only(problems(mapping, database(keyed, publications=[PUBLISHED])), "KEY_NOT_IN_DELETES")
    assert p.sql == 'ALTER TABLE "support"."tickets" REPLICA IDENTITY FULL'
    full = table("support.tickets", TICKETS.columns, unique=[("org", "subject")])
    assert not [
        x
        for x in problems(mapping, database(full, publications=[PUBLISHED]))
        if x.code == "KEY_NOT_IN_DELETES"
    ]


def test_a_table_without_a_primary_key_but_a_unique_key_is_a_warning() -> None:
    keyless = table("support.tickets", TICKETS.columns, pk=(), unique=[("id",)])
    p = only(problems(db=database(keyless, publications=[PUBLISHED])), "NO_PRIMARY_KEY")
    assert p.severity is Severity.WARNING
    assert p.sql == 'ALTER TABLE "support"."tickets" ADD PRIMARY KEY USING INDEX "tickets_id_key"'


def test_replica_identity_nothing_is_refused() -> None:
    nothing = table("support.tickets", TICKETS.columns, identity=ReplicaIdentity.NOTHING)
    p = only(problems(db=database(nothing, publications=[PUBLISHED])), "REPLICA_IDENTITY")
    assert p.severity is Severity.ERROR
    assert p.sql == 'ALTER TABLE "support"."tickets" REPLICA IDENTITY FULL'


def test_replica_identity_default_is_a_warning_only_when_the_tenant_is_not_in_the_key() -> None:
    default = table("support.tickets", TICKETS.columns, identity=ReplicaIdentity.DEFAULT)
    p = only(problems(db=database(default, publications=[PUBLISHED])), "REPLICA_IDENTITY")
    assert (p.severity, p.field) == (Severity.WARNING, "tenant_column")
    assert "moved to another tenant keeps its chunks in the old tenant" in p.message
    in_key = table(
        "support.tickets", TICKETS.columns, pk=("org", "id"), identity=ReplicaIdentity.DEFAULT
    )
    mapping = MAPPING.model_copy(update={"key_columns": ("org", "id")})
    assert problems(mapping, database(in_key, publications=[PUBLISHED])) == []


def test_replica_identity_index_without_the_key_is_refused() -> None:
    indexed = table(
        "support.tickets",
        TICKETS.columns,
        identity=ReplicaIdentity.INDEX,
        replica_index=("org", "subject"),
    )
    p = only(problems(db=database(indexed, publications=[PUBLISHED])), "REPLICA_IDENTITY")
    assert (p.severity, p.field) == (Severity.ERROR, "key_columns")


def test_a_nullable_tenant_column_gets_set_not_null() -> None:
    columns = [c if c.name != "org" else col("org", K.TEXT) for c in TICKETS.columns]
    p = only(
        problems(db=database(table("support.tickets", columns), publications=[PUBLISHED])),
        "TENANT_NULLABLE",
    )
    assert p.severity is Severity.WARNING
    assert p.sql == 'ALTER TABLE "support"."tickets" ALTER COLUMN "org" SET NOT NULL'


def test_a_table_in_no_publication_and_one_missing_from_the_named_publication() -> None:
    p = only(problems(db=database(TICKETS)), "NOT_PUBLISHED")
    assert p.severity is Severity.WARNING
    other = publication("ragstream", "support.other")
    named = only(
        problems(db=database(TICKETS, publications=[other]), publication="ragstream"),
        "NOT_PUBLISHED",
    )
    assert named.sql == 'ALTER PUBLICATION "ragstream" ADD TABLE "support"."tickets"'
    created = only(
        problems(
            db=database(TICKETS, publications=[other]),
            publication="ragstream",
            publication_created_by_connector=True,
        ),
        "NOT_PUBLISHED",
    )
    assert created.severity is Severity.NOTE


def test_a_missing_publication_gets_its_create_statement() -> None:
    p = only(problems(db=database(TICKETS), publication="ragstream"), "PUBLICATION_MISSING")
    assert p.sql == 'CREATE PUBLICATION "ragstream" FOR TABLE "support"."tickets"'


def test_a_column_list_without_a_mapped_column_is_refused() -> None:
    listed = publication(
        "ragstream", "support.tickets", columns={"support.tickets": ("id", "org", "subject")}
    )
    p = only(problems(db=database(TICKETS, publications=[listed])), "PUBLICATION_COLUMNS")
    assert p.severity is Severity.ERROR
    assert "'body', 'specs', 'updated_at', 'deleted_at'" in p.message


def test_a_row_filter_is_a_note_and_unpublished_deletes_a_warning() -> None:
    filtered = publication(
        "ragstream", "support.tickets", row_filter={"support.tickets": "(org = 'acme'::text)"}
    )
    assert (
        only(
            problems(db=database(TICKETS, publications=[filtered])), "PUBLICATION_ROW_FILTER"
        ).severity
        is Severity.NOTE
    )
    no_deletes = publication("ragstream", "support.tickets", deletes=False)
    p = only(problems(db=database(TICKETS, publications=[no_deletes])), "PUBLICATION_OPERATIONS")
    assert p.severity is Severity.WARNING
    assert "delete" in p.message


def test_wal_level_other_than_logical_is_a_warning() -> None:
    p = only(
        problems(db=database(TICKETS, publications=[PUBLISHED], wal_level="replica")), "WAL_LEVEL"
    )
    assert (p.severity, p.table) == (Severity.WARNING, "")


def test_the_worker_refuses_errors_naming_table_and_field_and_logs_warnings(
    caplog: pytest.LogCaptureFixture,
) -> None:
    bad = MAPPING.model_copy(update={"title_column": "subjekt"})
    with pytest.raises(ConfigError) as refused:
        refuse_unworkable([bad], database(TICKETS, publications=[PUBLISHED]))
    text = str(refused.value)
    assert "support.tickets title_column: column 'subjekt' does not exist" in text
    assert "ragstream tables check" in text
    default = table("support.tickets", TICKETS.columns, identity=ReplicaIdentity.DEFAULT)
    with caplog.at_level(logging.WARNING, logger="ragcore.sor.mapcheck"):
        found = refuse_unworkable([MAPPING], database(default, publications=[PUBLISHED]))
    assert [p.code for p in found] == ["REPLICA_IDENTITY"]
    assert "REPLICA IDENTITY DEFAULT" in caplog.text
