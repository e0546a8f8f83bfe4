"""The SoR readers against a real PostgreSQL cluster and a real SQLite file."""

from __future__ import annotations

import hashlib
import sqlite3
from collections.abc import Iterator
from pathlib import Path

import psycopg
import pytest

from ragstream.errors import ConfigError
from ragstream.services.postgres import PostgresCluster
from ragstream.sor.base import SorVerdict, SqlShape
from ragstream.sor.sql import PostgresSor, SorUnavailableError, SqliteSor
from schemas.entities import ContentFormat
from streams.mapping import TableMapping

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


@pytest.fixture
def pg_sor(postgres: PostgresCluster) -> Iterator[PostgresSor]:
    with psycopg.connect(postgres.dsn, autocommit=True) as conn:
        conn.execute("DROP TABLE IF EXISTS entities")
        conn.execute((SQL_DIR / "entities.postgres.sql").read_text().encode())
        for i, tenant, name, content, h, deleted in ROWS:
            conn.execute(
                "INSERT INTO entities (id, company_id, name, content, content_hash, metadata,"
                " deleted_at) VALUES (%s, %s, %s, %s, %s, %s::jsonb,"
                " CASE WHEN %s THEN now() END)",
                (i, tenant, name, content, h, '{"format": "text"}', deleted),
            )
    sor = PostgresSor(postgres.dsn, table="public.entities", hasher=hasher)
    yield sor
    sor.close()


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
    conn.commit()
    conn.close()
    sor = SqliteSor(path, hasher=hasher)
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
    verdicts = sor.verify("acme", ["e1", "e2", "e3", "e4", "nope"])
    assert verdicts["e1"] == SorVerdict("e1", True, False, "h1", "KNOWLEDGE_ARTIFACT")
    # no hash column value: computed from the content, as ingest computes it
    assert verdicts["e2"].content_hash == hasher("Ships in 2 days.", ContentFormat.TEXT)
    assert verdicts["e3"].deleted is True
    # another tenant's entity is invisible: the verification is tenant-scoped
    assert verdicts["e4"].exists is False
    assert verdicts["nope"].exists is False


@pytest.mark.integration
def test_fetch_entities_skips_soft_deleted_and_maps_like_ingest(
    sor: PostgresSor | SqliteSor,
) -> None:
    entities = sor.fetch_entities(None, ["e1", "e3", "e4"])
    assert sorted(entities) == ["e1", "e4"]
    assert entities["e1"].tenant_id == "acme"
    assert entities["e1"].content == "Refunds within 30 days."
    assert entities["e1"].version.updated_at_us is not None
    assert sor.fetch_entities("globex", ["e1", "e4"]).keys() == {"e4"}


@pytest.mark.integration
def test_scan_pages_through_live_rows_of_one_tenant(sor: PostgresSor | SqliteSor) -> None:
    assert [e.entity_id for e in sor.scan("acme", batch=1)] == ["e1", "e2"]
    assert [e.entity_id for e in sor.scan("globex")] == ["e4"]


@pytest.mark.unit
def test_identifiers_are_checked_before_they_reach_sql() -> None:
    with pytest.raises(ConfigError, match="not a plain SQL identifier"):
        SqlShape("entities; drop table x", TableMapping(), "%s")
    with pytest.raises(ConfigError, match="not a plain SQL identifier"):
        SqlShape("entities", TableMapping(id_column='id" or 1=1 --'), "%s")


@pytest.mark.integration
def test_unreachable_postgres_is_a_typed_unavailable_error() -> None:
    from ragstream.services.tansu import free_port

    sor = PostgresSor(
        f"host=127.0.0.1 port={free_port()} user=postgres connect_timeout=1",
        hasher=hasher,
        min_size=0,
        timeout_s=1.0,
    )
    try:
        with pytest.raises(SorUnavailableError, match="PostgreSQL unavailable"):
            sor.check()
    finally:
        sor.close()
