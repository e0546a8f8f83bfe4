"""The docker-compose PostgreSQL init files, run for real against a throwaway cluster: the
entities DDL, then deploy/postgres/init-roles.sh (roles, grants, the Debezium publication)."""

from __future__ import annotations

import json
import os
import subprocess
import uuid

import psycopg
import pytest

from ragdev.services.postgres import PostgresCluster
from tests.deploy.support import CONNECTOR_FILE, REPO_ROOT

pytestmark = pytest.mark.integration


def test_init_scripts_create_the_table_roles_and_publication(postgres: PostgresCluster) -> None:
    connector = json.loads(CONNECTOR_FILE.read_text(encoding="utf-8"))
    db = f"deploy_init_{uuid.uuid4().hex[:8]}"
    with psycopg.connect(postgres.dsn, autocommit=True) as conn:
        conn.execute(f"CREATE DATABASE {db}".encode())
    env = {
        **os.environ,
        "PGHOST": "127.0.0.1",
        "PGPORT": str(postgres.port),
        "POSTGRES_USER": "postgres",
        "POSTGRES_DB": db,
        "DEBEZIUM_PASSWORD": "pw-debezium",
        "SOR_READER_PASSWORD": "pw-reader",
    }
    ddl = REPO_ROOT / "schemas" / "sql" / "entities.postgres.sql"
    subprocess.run(
        ["psql", "-v", "ON_ERROR_STOP=1", "-U", "postgres", "-d", db, "-f", str(ddl)],
        env=env,
        check=True,
        capture_output=True,
    )
    subprocess.run(
        ["bash", str(REPO_ROOT / "deploy" / "postgres" / "init-roles.sh")],
        env=env,
        check=True,
        capture_output=True,
    )

    dsn = f"host=127.0.0.1 port={postgres.port} dbname={db}"
    with psycopg.connect(f"{dsn} user=postgres", autocommit=True) as conn:
        published = conn.execute(
            "SELECT schemaname || '.' || tablename FROM pg_publication_tables WHERE pubname = %s",
            (connector["publication.name"],),
        ).fetchall()
        assert published == [(connector["table.include.list"],)]
        replication = conn.execute(
            "SELECT rolreplication FROM pg_roles WHERE rolname = 'debezium'"
        ).fetchone()
        assert replication == (True,)
        conn.execute("INSERT INTO entities (id, company_id) VALUES ('e1', 'acme')")

    with psycopg.connect(f"{dsn} user=ragstream_reader", autocommit=True) as reader:
        assert reader.execute("SELECT id FROM public.entities").fetchall() == [("e1",)]
        with pytest.raises(psycopg.errors.InsufficientPrivilege):
            reader.execute("DELETE FROM public.entities")

    # Re-running on an initialised database fails loudly instead of half-applying.
    rerun = subprocess.run(
        ["bash", str(REPO_ROOT / "deploy" / "postgres" / "init-roles.sh")],
        env=env,
        check=False,
        capture_output=True,
    )
    assert rerun.returncode != 0
