"""The SoR readers against a real PostgreSQL cluster and a real SQLite file, each through the
contract of tests/ragcore/sor/contract.py (three tables of different shapes)."""

from __future__ import annotations

import sqlite3
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path

import psycopg
import pytest
from pydantic import ValidationError

from ragcore.errors import ConfigError, SorRowError
from ragcore.mapping import TableCatalog, TableMapping
from ragcore.sor.base import SystemOfRecord, quote_ident
from ragcore.sor.sql import PostgresSor, SorUnavailableError, SqliteSor
from ragdev.services.postgres import PostgresCluster
from tests.ragcore.sor.contract import (
    BAD_ROWS,
    CATALOG,
    DEEP_JSON,
    FILES,
    LINES,
    PARTS,
    ROWS,
    SystemOfRecordContract,
    bad_row_content,
    entities,
    hasher,
    with_document_root,
    write_documents,
)

SQL_DIR = Path(__file__).resolve().parents[3] / "schemas" / "sql"


@pytest.fixture
def pg_schema() -> str:
    """The schema of one test's PostgreSQL SoR."""
    return f"t{uuid.uuid4().hex[:8]}"


@pytest.fixture
def pg_sor(postgres: PostgresCluster, pg_schema: str, tmp_path: Path) -> Iterator[PostgresSor]:
    schema = pg_schema
    with psycopg.connect(postgres.dsn, autocommit=True) as conn:
        conn.execute(f"CREATE SCHEMA {schema}".encode())
        conn.execute(f"SET search_path TO {schema}".encode())
        conn.execute((SQL_DIR / "entities.postgres.sql").read_text().encode())
        for i, tenant, name, content, h, deleted in ROWS:
            conn.execute(
                "INSERT INTO entities (id, company_id, name, content, content_hash, metadata,"
                " deleted_at) VALUES (%s, %s, %s, %s, %s, %s::jsonb,"
                " CASE WHEN %s THEN now() END)",
                (i, tenant, name, content, h, '{"format": "text"}', deleted),
            )
        conn.execute(
            "CREATE TABLE order_lines (order_id int, line_no int, org text, product text,"
            " note text, PRIMARY KEY (order_id, line_no))"
        )
        conn.cursor().executemany("INSERT INTO order_lines VALUES (%s, %s, %s, %s, %s)", LINES)
        conn.execute("CREATE TABLE parts (part_no text PRIMARY KEY, kind text, spec jsonb)")
        conn.cursor().executemany("INSERT INTO parts VALUES (%s, %s, %s::jsonb)", PARTS)
        for key, (metadata, timely, h, deleted) in BAD_ROWS.items():
            # JSON PostgreSQL accepts is stored as jsonb; text that is not JSON as a jsonb
            # string (what a writer storing JSON text in a jsonb column gets back)
            as_json = metadata == DEEP_JSON or metadata.startswith('{"format": "text"}')
            conn.execute(
                "INSERT INTO entities (id, company_id, content, content_hash, metadata,"
                " updated_at, deleted_at) VALUES (%s, 'initech', %s, %s,"
                f" {'%s::jsonb' if as_json else 'to_jsonb(%s::text)'},"
                " CASE WHEN %s THEN now() ELSE 'infinity' END, CASE WHEN %s THEN now() END)",
                (key, bad_row_content(key), h, metadata, timely, deleted),
            )
        conn.execute("CREATE TABLE files (id text PRIMARY KEY, title text, kind text, path text)")
        conn.cursor().executemany("INSERT INTO files VALUES (%s, %s, %s, %s)", FILES)
    catalog = with_document_root(_in(schema), write_documents(tmp_path / "docs"))
    sor = PostgresSor(
        f"{postgres.dsn} options='-c search_path={schema}'", catalog=catalog, hasher=hasher
    )
    yield sor
    sor.close()


def _in(schema: str) -> TableCatalog:
    """The catalog with every table in `schema` (one schema per test)."""
    return TableCatalog(
        [
            m.model_copy(update={"table": f"{schema}.{m.table_name}", "name": m.label})
            for m in CATALOG
        ],
        "sor",
    )


@pytest.fixture
def sqlite_sor(tmp_path: Path) -> Iterator[SqliteSor]:
    path = tmp_path / "sor.db"
    conn = sqlite3.connect(path)
    conn.executescript((SQL_DIR / "entities.sqlite.sql").read_text())
    for i, tenant, name, content, h, deleted in ROWS:
        conn.execute(
            "INSERT INTO entities (id, company_id, name, content, content_hash, metadata,"
            " created_at, updated_at, deleted_at) VALUES (?, ?, ?, ?, ?, '{}', ?, ?, ?)",
            (
                i,
                tenant,
                name,
                content,
                h,
                "2024-01-01T00:00:00Z",
                "2024-01-02T00:00:00Z",
                "2024-01-03T00:00:00Z" if deleted else None,
            ),
        )
    conn.execute(
        "CREATE TABLE order_lines (order_id INTEGER, line_no INTEGER, org TEXT, product TEXT,"
        " note TEXT, PRIMARY KEY (order_id, line_no))"
    )
    conn.executemany("INSERT INTO order_lines VALUES (?, ?, ?, ?, ?)", LINES)
    conn.execute("CREATE TABLE parts (part_no TEXT PRIMARY KEY, kind TEXT, spec TEXT)")
    conn.executemany("INSERT INTO parts VALUES (?, ?, ?)", PARTS)
    for key, (metadata, timely, h, deleted) in BAD_ROWS.items():
        conn.execute(
            "INSERT INTO entities (id, company_id, content, content_hash, metadata,"
            " created_at, updated_at, deleted_at) VALUES (?, 'initech', ?, ?, ?, ?, ?, ?)",
            (
                key,
                bad_row_content(key),
                h,
                metadata,
                "2024-01-01T00:00:00Z",
                "2024-01-02T00:00:00Z" if timely else "not a time",
                "2024-01-03T00:00:00Z" if deleted else None,
            ),
        )
    conn.execute("CREATE TABLE files (id TEXT PRIMARY KEY, title TEXT, kind TEXT, path TEXT)")
    conn.executemany("INSERT INTO files VALUES (?, ?, ?, ?)", FILES)
    conn.commit()
    conn.close()
    catalog = with_document_root(CATALOG, write_documents(tmp_path / "docs"))
    sor = SqliteSor(path, catalog=catalog, hasher=hasher)
    yield sor
    sor.close()


@pytest.mark.integration
class TestPostgresSor(SystemOfRecordContract):
    @pytest.fixture
    def sor(self, pg_sor: PostgresSor) -> SystemOfRecord:
        return pg_sor

    @pytest.fixture
    def set_metadata(
        self, pg_sor: PostgresSor, postgres: PostgresCluster, pg_schema: str
    ) -> Callable[[str, str], None]:
        def write(key: str, metadata: str) -> None:
            with psycopg.connect(postgres.dsn, autocommit=True) as conn:
                conn.execute(
                    f"UPDATE {pg_schema}.entities SET metadata = to_jsonb(%s::text)"
                    " WHERE id = %s".encode(),
                    (metadata, key),
                )

        return write


@pytest.mark.integration
class TestSqliteSor(SystemOfRecordContract):
    @pytest.fixture
    def sor(self, sqlite_sor: SqliteSor) -> SystemOfRecord:
        return sqlite_sor

    @pytest.fixture
    def set_metadata(self, sqlite_sor: SqliteSor, tmp_path: Path) -> Callable[[str, str], None]:
        def write(key: str, metadata: str) -> None:
            conn = sqlite3.connect(tmp_path / "sor.db")
            with conn:
                conn.execute("UPDATE entities SET metadata = ? WHERE id = ?", (metadata, key))
            conn.close()

        return write


@pytest.mark.unit
def test_identifiers_are_checked_before_they_reach_sql() -> None:
    with pytest.raises(ConfigError, match="not a plain SQL identifier"):
        quote_ident("entities; drop table x")
    with pytest.raises(ValidationError, match="not plain column names"):
        TableMapping(key_columns=('id" or 1=1 --',))
    with pytest.raises(ValidationError, match="plain names"):
        TableMapping(table="public.entities; drop table x")


@pytest.mark.integration
def test_unreachable_postgres_is_a_typed_unavailable_error_naming_the_server() -> None:
    from ragdev.services.tansu import free_port

    port = free_port()
    sor = PostgresSor(
        f"host=127.0.0.1 port={port} user=sor_reader password=hunter2-pw dbname=erp "
        "connect_timeout=1",
        catalog=CATALOG,
        hasher=hasher,
        min_size=0,
        timeout_s=1.0,
    )
    try:
        with pytest.raises(SorUnavailableError, match=r"PostgreSQL .*unavailable") as err:
            sor.check()
    finally:
        sor.close()
    # the server log learns where the SoR is (a pool timeout alone does not say), never the
    # password
    message = str(err.value)
    assert f"host=127.0.0.1 port={port} user=sor_reader dbname=erp" in message
    assert "hunter2" not in message


@pytest.mark.unit
@pytest.mark.parametrize(
    ("dsn", "text"),
    [
        ("host=db user=bob password=s3cr3t-pw", "libpq: password=s3cr3t-pw rejected"),
        # libpq echoes a DSN it cannot parse: an unquoted space in the password
        ("host=db user=bob password=s3cr3t two", 'missing "=" after "two" in connection info'),
        ("host=db user=bob password='s3cr3t two'", "password s3cr3t two rejected"),
        ("postgresql://bob:s3cr3t-pw@db:5432/erp", "cannot parse postgresql://bob:s3cr3t-pw@db"),
        ("postgresql://bob:s3cr3t-pw@db:5432/erp", "echo of the bare s3cr3t-pw"),
    ],
)
def test_sor_messages_never_carry_the_dsns_password(dsn: str, text: str) -> None:
    from ragcore.sor.sql import redact

    cleaned = redact(text, dsn)
    assert "s3cr3t" not in cleaned and "two" not in cleaned
    assert "***" in cleaned
    assert "bob" in redact("user bob failed", dsn)  # the user stays (the server log needs it)


@pytest.fixture(params=["postgres", "sqlite"])
def either_sor(request: pytest.FixtureRequest) -> PostgresSor | SqliteSor:
    value: PostgresSor | SqliteSor = request.getfixturevalue(
        "pg_sor" if request.param == "postgres" else "sqlite_sor"
    )
    return value


def _rename_column(
    sor: PostgresSor | SqliteSor,
    postgres: PostgresCluster,
    tmp_path: Path,
    table: str,
    *,
    old: str,
    new: str,
) -> None:
    """Rename a column of the SoR behind `sor` (the fixtures' database), as a schema change."""
    if isinstance(sor, PostgresSor):
        qualified = {m.table_name: m.table for m in sor.catalog}[table]
        with psycopg.connect(postgres.dsn, autocommit=True) as pg:
            pg.execute(f"ALTER TABLE {qualified} RENAME COLUMN {old} TO {new}".encode())
    else:
        lite = sqlite3.connect(tmp_path / "sor.db")
        lite.execute(f"ALTER TABLE {table} RENAME COLUMN {old} TO {new}")
        lite.commit()
        lite.close()


@pytest.mark.integration
def test_probe_names_the_tables_it_cannot_read_and_a_renamed_column(
    either_sor: PostgresSor | SqliteSor, postgres: PostgresCluster, tmp_path: Path
) -> None:
    sor = either_sor
    tables = {m.table_name: m.table for m in sor.catalog}
    # the mapped table that does not exist is unreadable; the others are fine
    assert set(sor.probe_tables()) == {tables["ghosts"]}
    # a mapped content column renamed in the SoR makes its table unreadable, naming the column
    _rename_column(sor, postgres, tmp_path, "order_lines", old="note", new="remark")
    found = sor.probe_tables()
    assert set(found) == {tables["ghosts"], tables["order_lines"]}
    assert "note" in found[tables["order_lines"]]


@pytest.mark.integration
def test_a_verdict_reads_the_stored_hash_not_the_content(
    either_sor: PostgresSor | SqliteSor, postgres: PostgresCluster, tmp_path: Path
) -> None:
    # `entities` stores each row's hash: verification selects the key, tenant, type,
    # soft-delete and hash columns only (a document's content may be large, and every
    # Retrieve verifies its hits), so it still answers with the content column renamed
    sor = either_sor
    tables = {m.table_name: m.table for m in sor.catalog}
    before = sor.verify("acme", ["entities:e1", "entities:e2", "entities:e3"])
    _rename_column(sor, postgres, tmp_path, "entities", old="content", new="body")
    stored = sor.verify("acme", ["entities:e1", "entities:e3"])
    assert stored == {k: before[k] for k in ("entities:e1", "entities:e3")}
    assert stored["entities:e1"].content_hash == "h1" and stored["entities:e3"].deleted
    # e2 has no stored hash: its row is read whole to compute it, which now fails, and a
    # table that cannot be read makes its hits unverifiable, never denied
    unread = sor.verify("acme", ["entities:e1", "entities:e2"])
    assert not any(v.mapped or v.exists for v in unread.values())
    assert tables["entities"] in sor.probe_tables()


@pytest.mark.integration
def test_replication_slots_show_the_wal_an_inactive_slot_retains(
    pg_sor: PostgresSor, postgres: PostgresCluster
) -> None:
    slot = f"probe_{uuid.uuid4().hex[:8]}"
    table = f"wal_filler_{slot}"
    with psycopg.connect(postgres.dsn, autocommit=True) as conn:
        conn.execute("SELECT pg_create_logical_replication_slot(%s, 'pgoutput')", (slot,))
        try:
            conn.execute(f"CREATE TABLE {table} (x text)".encode())
            conn.execute(
                f"INSERT INTO {table} SELECT md5(g::text) || repeat('x', 1000)"
                " FROM generate_series(1, 500) g".encode()
            )
            found = {s.name: s for s in pg_sor.replication_slots()}
            assert slot in found
            assert found[slot].active is False and found[slot].plugin == "pgoutput"
            assert found[slot].retained_bytes > 500_000
            # the position the slot confirmed (at creation: the WAL position of then)
            (created,) = conn.execute(
                "SELECT pg_wal_lsn_diff(confirmed_flush_lsn, '0/0')::bigint"
                " FROM pg_replication_slots WHERE slot_name = %s",
                (slot,),
            ).fetchone() or (None,)
            assert found[slot].confirmed_lsn == created and created is not None and created > 0
        finally:
            conn.execute("SELECT pg_drop_replication_slot(%s)", (slot,))
            conn.execute(f"DROP TABLE IF EXISTS {table}".encode())


@pytest.mark.integration
def test_a_mapped_columns_type_change_leaves_the_sor_readable(
    pg_sor: PostgresSor, postgres: PostgresCluster
) -> None:
    tenant = ROWS[0][1]
    table = next(m.table for m in pg_sor.catalog if m.table_name == "entities")

    def scan() -> list[str]:
        return [e.entity_id for e in entities(pg_sor.scan(tenant, table="entities"))]

    before = scan()
    assert before
    for _ in range(24):  # past psycopg's prepare threshold on every pooled connection
        assert scan() == before
    with psycopg.connect(postgres.dsn, autocommit=True) as conn:
        conn.execute(f"ALTER TABLE {table} ALTER COLUMN name TYPE varchar(200)".encode())
    assert scan() == before


@pytest.mark.integration
def test_a_row_whose_key_forms_no_entity_id_is_never_taken_for_a_missing_one(
    tmp_path: Path,
) -> None:
    # a REAL key: SQLite finds the row for the id's text, but a float forms no entity id
    path = tmp_path / "gauges.db"
    conn = sqlite3.connect(path)
    with conn:
        conn.execute("CREATE TABLE gauges (id REAL PRIMARY KEY, org TEXT, reading TEXT)")
        conn.execute("INSERT INTO gauges VALUES (1.5, 'acme', 'pressure ok')")
    conn.close()
    gauges = TableMapping(
        table="public.gauges",
        key_columns=("id",),
        tenant_column="org",
        type_column=None,
        title_column=None,
        content_columns=("reading",),
        metadata_column=None,
        content_hash_column=None,
        created_at_column=None,
        updated_at_column=None,
        deleted_at_column=None,
    )
    sor = SqliteSor(path, catalog=TableCatalog([gauges], "sor"), hasher=hasher)
    try:
        verdict = sor.verify("acme", ["gauges:1.5"])["gauges:1.5"]
        assert (verdict.exists, verdict.row_error) == (True, "MAPPING_ERROR")
        fetched = sor.fetch_entities("acme", ["gauges:1.5"])["gauges:1.5"]
        assert isinstance(fetched, SorRowError) and fetched.entity_id == "gauges:1.5"
        (scanned,) = sor.scan("acme")
        assert isinstance(scanned, SorRowError) and scanned.entity_id is None
        assert "key (id=1.5)" in str(scanned) and "public.gauges" in str(scanned)
    finally:
        sor.close()
