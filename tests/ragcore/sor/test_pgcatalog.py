"""The catalog of a real PostgreSQL as `read_catalog` reads it: kinds of columns (domains,
enums, arrays, varchar lengths, generated columns), keys, REPLICA IDENTITY, foreign keys,
publications with column lists and row filters, slots, and what a restricted role may read;
the same through the SoR reader's pool (`PostgresSor.database_info`)."""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from typing import Any

import psycopg
import pytest
from psycopg.rows import dict_row

from ragcore.mapping import TableCatalog, TableMapping
from ragcore.sor.pgcatalog import ColumnKind, ReplicaIdentity, read_catalog
from ragcore.sor.sql import PostgresSor
from ragdev.services.postgres import PostgresCluster

pytestmark = pytest.mark.integration

SCHEMA_SQL = """
CREATE TYPE {s}.state AS ENUM ('open', 'closed');
CREATE DOMAIN {s}.slug AS text;
CREATE TABLE {s}.orgs (id {s}.slug PRIMARY KEY);
CREATE TABLE {s}.tickets (
  org {s}.slug NOT NULL REFERENCES {s}.orgs (id),
  no int NOT NULL,
  code varchar(12) UNIQUE,
  subject text,
  state {s}.state,
  tags text[],
  specs jsonb,
  file bytea,
  at timestamptz,
  day date,
  words tsvector GENERATED ALWAYS AS (to_tsvector('simple', coalesce(subject, ''))) STORED,
  PRIMARY KEY (org, no)
);
CREATE UNIQUE INDEX tickets_code_lower ON {s}.tickets (lower(code));
ALTER TABLE {s}.tickets REPLICA IDENTITY FULL;
CREATE TABLE {s}.lines (id int NOT NULL, org text NOT NULL, body text);
CREATE UNIQUE INDEX lines_id ON {s}.lines (id);
ALTER TABLE {s}.lines REPLICA IDENTITY USING INDEX lines_id;
CREATE TABLE {s}.logs (at timestamptz, line text);
ALTER TABLE {s}.logs REPLICA IDENTITY NOTHING;
CREATE PUBLICATION {p} FOR TABLE {s}.tickets (org, no, subject) WHERE (no > 0), {s}.lines
  WITH (publish = 'insert, update');
"""


@pytest.fixture
def schema(postgres: PostgresCluster) -> Iterator[str]:
    suffix = uuid.uuid4().hex[:8]
    name, pub = f"cat_{suffix}", f"pub_{suffix}"
    with psycopg.connect(postgres.dsn, autocommit=True) as conn:
        conn.execute(f"CREATE SCHEMA {name}".encode())
        conn.execute(SCHEMA_SQL.format(s=name, p=pub).encode())
    try:
        yield name
    finally:
        with psycopg.connect(postgres.dsn, autocommit=True) as conn:
            for name_ in (pub, f"{pub}_all", f"{pub}_schema"):
                conn.execute(f"DROP PUBLICATION IF EXISTS {name_}".encode())
            conn.execute(f"DROP SCHEMA {name} CASCADE".encode())
            conn.execute(f"DROP ROLE IF EXISTS reader_{suffix}".encode())


def catalog_of(dsn: str, schema: str) -> Any:
    with psycopg.connect(dsn, autocommit=True, row_factory=dict_row) as conn:
        return read_catalog(
            lambda sql, params: conn.execute(sql.encode(), list(params)).fetchall(),
            schemas=[schema],
        )


def test_columns_keys_identity_and_references(postgres: PostgresCluster, schema: str) -> None:
    db = catalog_of(postgres.dsn, schema)
    assert set(db.tables) == {f"{schema}.{t}" for t in ("orgs", "tickets", "lines", "logs")}
    assert db.wal_level == "logical"
    assert db.version_num >= 150000
    tickets = db.tables[f"{schema}.tickets"]
    kinds = {c.name: c.kind for c in tickets.columns}
    assert kinds == {
        "org": ColumnKind.TEXT,  # a domain over text
        "no": ColumnKind.INTEGER,
        "code": ColumnKind.TEXT,
        "subject": ColumnKind.TEXT,
        "state": ColumnKind.ENUM,
        "tags": ColumnKind.ARRAY,
        "specs": ColumnKind.JSON,
        "file": ColumnKind.BYTEA,
        "at": ColumnKind.TIMESTAMP,
        "day": ColumnKind.DATE,
        "words": ColumnKind.OTHER,
    }
    code = tickets.column("code")
    assert code is not None and code.max_length == 12
    words = tickets.column("words")
    assert words is not None and words.generated
    assert tickets.primary_key == ("org", "no")
    assert tickets.replica_identity is ReplicaIdentity.FULL
    assert tickets.unique_index_on(["code"]) is not None
    assert [i.name for i in tickets.indexes if i.partial] == ["tickets_code_lower"]
    assert [(fk.columns, fk.references) for fk in tickets.foreign_keys] == [
        (("org",), f"{schema}.orgs")
    ]
    lines = db.tables[f"{schema}.lines"]
    assert lines.replica_identity is ReplicaIdentity.INDEX
    assert lines.old_row_columns() == frozenset({"id"})
    assert lines.primary_key == ()
    assert db.tables[f"{schema}.logs"].replica_identity is ReplicaIdentity.NOTHING


def test_publications_with_column_lists_row_filters_and_operations(
    postgres: PostgresCluster, schema: str
) -> None:
    db = catalog_of(postgres.dsn, schema)
    (pub,) = [
        p
        for p in db.publications
        if p.name.startswith("pub_") and p.tables and f"{schema}.tickets" in p.tables
    ]
    assert (pub.inserts, pub.updates, pub.deletes, pub.truncates) == (True, True, False, False)
    tickets = pub.publishes(f"{schema}.tickets")
    assert tickets is not None and tickets.columns == ("org", "no", "subject")
    assert tickets.row_filter is not None and "no > 0" in tickets.row_filter
    assert pub.publishes(f"{schema}.logs") is None
    assert db.publications_of(f"{schema}.lines") == [pub]


def test_a_restricted_role_sees_what_it_may_read(postgres: PostgresCluster, schema: str) -> None:
    role = f"reader_{schema.removeprefix('cat_')}"
    with psycopg.connect(postgres.dsn, autocommit=True) as conn:
        conn.execute(f"CREATE ROLE {role} LOGIN".encode())
        conn.execute(f"GRANT USAGE ON SCHEMA {schema} TO {role}".encode())
        conn.execute(f"GRANT SELECT ON {schema}.lines TO {role}".encode())
        conn.execute(f"GRANT SELECT (org, no) ON {schema}.tickets TO {role}".encode())
    dsn = postgres.dsn.replace("user=postgres", f"user={role}")
    db = catalog_of(dsn, schema)
    assert db.user == role
    assert db.tables[f"{schema}.lines"].readable
    tickets = db.tables[f"{schema}.tickets"]
    assert not tickets.readable
    assert {c.name for c in tickets.columns if c.readable} == {"org", "no"}


def test_the_sor_reader_reads_the_catalog_of_its_mapped_tables(
    postgres: PostgresCluster, schema: str
) -> None:
    mapping = TableMapping(
        table=f"{schema}.lines",
        tenant_column="org",
        type_column=None,
        title_column=None,
        content_columns=("body",),
        metadata_column=None,
        content_hash_column=None,
        created_at_column=None,
        updated_at_column=None,
        deleted_at_column=None,
    )
    sor = PostgresSor(
        postgres.dsn, catalog=TableCatalog([mapping], "sor"), hasher=lambda text, fmt: ""
    )
    try:
        db = sor.database_info([mapping.table])
    finally:
        sor.close()
    assert list(db.tables) == [f"{schema}.lines"]
    assert db.slots == ()  # the worker's check needs no slots


def test_publications_for_all_tables_and_for_a_schema_publish_the_tables_read(
    postgres: PostgresCluster, schema: str
) -> None:
    pub = f"pub_{schema.removeprefix('cat_')}"
    with psycopg.connect(postgres.dsn, autocommit=True) as conn:
        conn.execute(f"CREATE PUBLICATION {pub}_schema FOR TABLES IN SCHEMA {schema}".encode())
        conn.execute(f"CREATE PUBLICATION {pub}_all FOR ALL TABLES".encode())
    db = catalog_of(postgres.dsn, schema)
    by_name = {p.name: p for p in db.publications}
    for name in (f"{pub}_schema", f"{pub}_all"):
        published = by_name[name].publishes(f"{schema}.logs")
        assert published is not None and published.columns is None  # every column
    assert by_name[f"{pub}_all"].all_tables
    assert set(by_name[f"{pub}_schema"].tables) == set(db.tables)  # only the tables read
