"""The SoR readers against a real PostgreSQL cluster and a real SQLite file, with three tables
of different shapes: the seed `entities` table, `order_lines` (composite key, content from two
columns, its own tenant column) and `parts` (a constant tenant, a JSON column as content)."""

from __future__ import annotations

import hashlib
import sqlite3
import uuid
from collections.abc import Iterator
from pathlib import Path

import psycopg
import pytest
from pydantic import ValidationError

from ragcore.errors import ConfigError, SorTableError
from ragcore.mapping import TableCatalog, TableMapping
from ragcore.sor.base import SorVerdict, quote_ident
from ragcore.sor.sql import PostgresSor, SorUnavailableError, SqliteSor
from ragdev.services.postgres import PostgresCluster
from schemas.entities import ContentFormat
from tests.streams.support import order_lines_mapping

SQL_DIR = Path(__file__).resolve().parents[3] / "schemas" / "sql"


def hasher(content: str, fmt: ContentFormat) -> str:
    return hashlib.sha256(content.encode()).hexdigest()


ROWS = [
    # id, tenant, name, content, hash, deleted
    ("e1", "acme", "Refunds", "Refunds within 30 days.", "h1", False),
    ("e2", "acme", "Shipping", "Ships in 2 days.", None, False),
    ("e3", "acme", "Old", "Gone.", "h3", True),
    ("e4", "globex", "Other", "Other tenant.", "h4", False),
]
LINES = [
    # order_id, line_no, org, product, note
    (1001, 1, "acme", "Seal kit K-27", "Urgent, ship by air."),
    (1001, 2, "acme", "Bearing set", "Standard delivery."),
    (1002, 1, "globex", "Impeller", "Duplex steel."),
]
PARTS = [
    ("GX-300", "seal", '{"material": "duplex", "bar": 16}'),
    ("GX-410", "bearing", '{"grease": "lithium"}'),
]
ORDER_LINES = order_lines_mapping()
PARTS_TABLE = TableMapping(
    table="public.parts",
    key_columns=("part_no",),
    tenant_column=None,
    tenant="globex",
    type_column=None,
    title_column="kind",
    content_columns=("kind", "spec"),
    json_columns=("spec",),
    metadata_column=None,
    content_hash_column=None,
    created_at_column=None,
    updated_at_column=None,
    deleted_at_column=None,
)
#: mapped, but no such table exists in the SoR
GHOSTS = TableMapping(table="public.ghosts", content_columns=("content",))
CATALOG = TableCatalog([TableMapping(), ORDER_LINES, PARTS_TABLE, GHOSTS], "sor")


@pytest.fixture
def pg_sor(postgres: PostgresCluster) -> Iterator[PostgresSor]:
    schema = f"t{uuid.uuid4().hex[:8]}"
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
    sor = PostgresSor(
        f"{postgres.dsn} options='-c search_path={schema}'", catalog=_in(schema), hasher=hasher
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
    conn.commit()
    conn.close()
    sor = SqliteSor(path, catalog=CATALOG, hasher=hasher)
    yield sor
    sor.close()


@pytest.fixture(params=["postgres", "sqlite"])
def sor(request: pytest.FixtureRequest) -> PostgresSor | SqliteSor:
    name = "pg_sor" if request.param == "postgres" else "sqlite_sor"
    value: PostgresSor | SqliteSor = request.getfixturevalue(name)
    return value


@pytest.mark.integration
def test_verify_reports_exists_deleted_hash_and_missing_in_one_call(
    sor: PostgresSor | SqliteSor,
) -> None:
    ids = ["entities:e1", "entities:e2", "entities:e3", "entities:e4", "entities:nope"]
    verdicts = sor.verify("acme", ids)
    assert verdicts["entities:e1"] == SorVerdict(
        "entities:e1", True, False, "h1", "KNOWLEDGE_ARTIFACT"
    )
    # no hash column value: computed from the content, as ingest computes it
    assert verdicts["entities:e2"].content_hash == hasher("Ships in 2 days.", ContentFormat.TEXT)
    assert verdicts["entities:e3"].deleted is True
    # another tenant's entity is invisible: the verification is tenant-scoped
    assert verdicts["entities:e4"].exists is False
    assert verdicts["entities:nope"].exists is False
    assert all(v.mapped for v in verdicts.values())


@pytest.mark.integration
def test_verify_spans_tables_and_never_denies_what_it_cannot_read(
    sor: PostgresSor | SqliteSor,
) -> None:
    verdicts = sor.verify(
        "acme",
        [
            "order_lines:1001,2",
            "order_lines:1002,1",  # globex's line
            "parts:GX-300",  # a globex-only table
            "ghosts:g1",  # mapped, but the table does not exist
            "invoices:7",  # no such mapping
            "entities:e1",
        ],
    )
    line = verdicts["order_lines:1001,2"]
    assert (line.exists, line.entity_type, line.mapped) == (True, "ORDER_LINES", True)
    assert line.content_hash == hasher("Bearing set\n\nStandard delivery.", ContentFormat.TEXT)
    assert verdicts["order_lines:1002,1"].exists is False
    assert (verdicts["parts:GX-300"].exists, verdicts["parts:GX-300"].mapped) == (False, True)
    for unknown in ("ghosts:g1", "invoices:7"):
        assert (verdicts[unknown].exists, verdicts[unknown].mapped) == (False, False)
    assert verdicts["entities:e1"].exists is True
    part = sor.verify("globex", ["parts:GX-300"])["parts:GX-300"]
    assert part.exists is True
    fetched = sor.fetch_entities("globex", ["parts:GX-300"])["parts:GX-300"]
    # the JSON column is rendered as lines (JSONB keeps its own key order: compare as a set)
    head, _, spec = fetched.content.partition("\n\n")
    assert (head, set(spec.splitlines())) == ("seal", {"material: duplex", "bar: 16"})
    assert part.content_hash == hasher(fetched.content, ContentFormat.TEXT)


@pytest.mark.integration
def test_fetch_entities_skips_soft_deleted_and_maps_like_ingest(
    sor: PostgresSor | SqliteSor,
) -> None:
    entities = sor.fetch_entities(
        None, ["entities:e1", "entities:e3", "entities:e4", "order_lines:1001,1", "invoices:1"]
    )
    assert sorted(entities) == ["entities:e1", "entities:e4", "order_lines:1001,1"]
    assert entities["entities:e1"].tenant_id == "acme"
    assert entities["entities:e1"].content == "Refunds within 30 days."
    assert entities["entities:e1"].version.updated_at_us is not None
    line = entities["order_lines:1001,1"]
    assert (line.tenant_id, line.title) == ("acme", "Seal kit K-27")
    assert line.content == "Seal kit K-27\n\nUrgent, ship by air."
    assert sor.fetch_entities("globex", ["entities:e1", "entities:e4"]).keys() == {"entities:e4"}
    assert sor.fetch_entities("acme", ["parts:GX-300"]) == {}
    with pytest.raises(SorTableError, match="ghosts"):
        sor.fetch_entities(None, ["ghosts:g1"])


@pytest.mark.integration
def test_scan_pages_through_live_rows_table_by_table(sor: PostgresSor | SqliteSor) -> None:
    assert [e.entity_id for e in sor.scan("acme", batch=1, table="entities")] == [
        "entities:e1",
        "entities:e2",
    ]
    # keyset pages over a composite key
    assert [e.entity_id for e in sor.scan("acme", batch=1, table="order_lines")] == [
        "order_lines:1001,1",
        "order_lines:1001,2",
    ]
    assert [e.entity_id for e in sor.scan("globex", table="parts")] == [
        "parts:GX-300",
        "parts:GX-410",
    ]
    assert list(sor.scan("acme", table="parts")) == []
    assert sor.count("acme", table="order_lines") == 2
    assert sor.count("globex", table="parts") == 2
    with pytest.raises(SorTableError, match="ghosts"):
        list(sor.scan("acme", table="ghosts"))
    with pytest.raises(ConfigError, match="no mapped table 'invoices'"):
        list(sor.scan("acme", table="invoices"))


@pytest.mark.unit
def test_identifiers_are_checked_before_they_reach_sql() -> None:
    with pytest.raises(ConfigError, match="not a plain SQL identifier"):
        quote_ident("entities; drop table x")
    with pytest.raises(ValidationError, match="not plain column names"):
        TableMapping(key_columns=('id" or 1=1 --',))
    with pytest.raises(ValidationError, match="plain names"):
        TableMapping(table="public.entities; drop table x")


@pytest.mark.integration
def test_unreachable_postgres_is_a_typed_unavailable_error() -> None:
    from ragdev.services.tansu import free_port

    sor = PostgresSor(
        f"host=127.0.0.1 port={free_port()} user=postgres connect_timeout=1",
        catalog=CATALOG,
        hasher=hasher,
        min_size=0,
        timeout_s=1.0,
    )
    try:
        with pytest.raises(SorUnavailableError, match="PostgreSQL unavailable"):
            sor.check()
    finally:
        sor.close()
