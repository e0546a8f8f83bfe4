"""`ragstream tables discover` and `ragstream tables check` against a real PostgreSQL and the
tansu broker: discover's report and files, its fixes applied making check pass, every live
problem check finds with its fix, and the exit codes (0, 1, 2, 3)."""

from __future__ import annotations

import json
import os
import socket
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import psycopg
import pytest

from ragdev.services.postgres import PostgresCluster
from ragdev.services.tansu import TansuBroker
from ragstream.cli import main
from tests.streams.support import create_topics

pytestmark = pytest.mark.integration

SHOP_SQL = """
CREATE TABLE {s}.workspaces (slug text PRIMARY KEY, title text NOT NULL);
CREATE TABLE {s}.tickets (
  workspace text NOT NULL REFERENCES {s}.workspaces (slug),
  ticket_no int NOT NULL,
  subject text NOT NULL,
  body text,
  status text NOT NULL DEFAULT 'open',
  api_token text,
  modified_at timestamptz NOT NULL DEFAULT now(),
  deleted_at timestamptz,
  PRIMARY KEY (workspace, ticket_no)
);
CREATE TABLE {s}.articles (
  id bigint PRIMARY KEY,
  account text,
  headline text,
  doc jsonb NOT NULL,
  attributes jsonb
);
CREATE TABLE {s}.audit_log (id bigserial PRIMARY KEY, account text, at timestamptz);
INSERT INTO {s}.workspaces VALUES ('acme', 'Acme');
INSERT INTO {s}.tickets (workspace, ticket_no, subject, body)
  VALUES ('acme', 1, 'Printer on fire', 'Floor 3 printer caught fire after the update.');
INSERT INTO {s}.articles VALUES (1, 'acme', 'Reset', '{{"steps": ["a", "b"]}}', '{{"lang": "en"}}');
"""


@dataclass
class Shop:
    dsn: str
    schema: str
    prefix: str
    dlq: str
    bootstrap: str
    out: Path

    def sql(self, statement: str) -> None:
        with psycopg.connect(self.dsn, autocommit=True) as conn:
            conn.execute(statement.format(s=self.schema).encode())

    def run(
        self, capsys: pytest.CaptureFixture[str], *args: str
    ) -> tuple[int, dict[str, Any], str]:
        code = main(["tables", *args])
        captured = capsys.readouterr()
        return code, json.loads(captured.out) if captured.out.strip() else {}, captured.err

    def check(self, capsys: pytest.CaptureFixture[str], *args: str) -> tuple[int, dict[str, Any]]:
        code, report, _ = self.run(
            capsys,
            "check",
            "--dsn",
            self.dsn,
            "--tables",
            str(self.out / "tables.json"),
            "--connector",
            str(self.out / "kafka-connect.json"),
            *args,
        )
        return code, report


@pytest.fixture
def shop(
    postgres: PostgresCluster,
    kafka_broker: TansuBroker,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> Iterator[Shop]:
    suffix = uuid.uuid4().hex[:8]
    schema, prefix, dlq = f"shop_{suffix}", f"shop{suffix}", f"dlq.{suffix}"
    with psycopg.connect(postgres.dsn, autocommit=True) as conn:
        conn.execute(f"CREATE SCHEMA {schema}".encode())
        conn.execute(SHOP_SQL.format(s=schema).encode())
    for name in list(os.environ):
        if name.startswith("RAGSTREAM_"):
            monkeypatch.delenv(name)
    monkeypatch.setenv("RAGSTREAM_PLAN__TOPIC_PREFIX", prefix)
    monkeypatch.setenv("RAGSTREAM_CONSUMER__DLQ_TOPIC", dlq)
    monkeypatch.setenv("RAGSTREAM_KAFKA__BOOTSTRAP_SERVERS", kafka_broker.bootstrap_servers)
    try:
        yield Shop(postgres.dsn, schema, prefix, dlq, kafka_broker.bootstrap_servers, tmp_path)
    finally:
        with psycopg.connect(postgres.dsn, autocommit=True) as conn:
            conn.execute(f"DROP PUBLICATION IF EXISTS pub_{suffix}".encode())
            conn.execute(f"DROP SCHEMA {schema} CASCADE".encode())


def discover(shop: Shop, capsys: pytest.CaptureFixture[str]) -> dict[str, Any]:
    pub = f"pub_{shop.schema.removeprefix('shop_')}"
    code, report, err = shop.run(
        capsys,
        "discover",
        "--dsn",
        shop.dsn,
        "--schema",
        shop.schema,
        "--connector",
        "--publication",
        pub,
        "--slot",
        pub,
        "--write",
        str(shop.out),
    )
    assert code == 0, err
    return report


def test_discover_reports_mappings_reasons_left_out_tables_and_fixes(
    shop: Shop, capsys: pytest.CaptureFixture[str]
) -> None:
    report = discover(shop, capsys)
    s = shop.schema
    tables = {t["table"]: t for t in report["tables"]}
    assert set(tables) == {f"{s}.tickets", f"{s}.articles"}
    assert {x["table"] for x in report["left_out"]} == {f"{s}.workspaces", f"{s}.audit_log"}
    mappings = {m["table"]: m for m in report["RAGSTREAM_PLAN__TABLES"]}
    assert mappings[f"{s}.tickets"]["key_columns"] == ["workspace", "ticket_no"]
    assert mappings[f"{s}.articles"]["json_columns"] == ["doc"]
    assert mappings[f"{s}.articles"]["metadata_column"] == "attributes"
    assert "references" in tables[f"{s}.tickets"]["reasons"]["tenant_column"]
    assert tables[f"{s}.tickets"]["unused_columns"]["api_token"].startswith("named like a secret")
    # the prefix is RAGSTREAM_PLAN__TOPIC_PREFIX's, the worker's own
    assert tables[f"{s}.tickets"]["topic"] == f"{shop.prefix}.{s}.tickets"
    article_problems = {p["code"] for p in tables[f"{s}.articles"]["problems"]}
    assert {"REPLICA_IDENTITY", "TENANT_NULLABLE"} <= article_problems
    assert [p["code"] for p in report["problems"]] == ["PUBLICATION_MISSING"]
    files = sorted(p.name for p in shop.out.iterdir())
    assert files == [
        "debezium-server.properties",
        "fixes.sql",
        "kafka-connect.json",
        "report.json",
        "tables.json",
    ]
    assert json.loads((shop.out / "tables.json").read_text()) == report["RAGSTREAM_PLAN__TABLES"]
    fixes = (shop.out / "fixes.sql").read_text()
    assert f'CREATE PUBLICATION "pub_{s.removeprefix("shop_")}"' in fixes
    assert f'ALTER TABLE "{s}"."articles" REPLICA IDENTITY FULL;' in fixes


def test_the_fixes_applied_make_check_pass_and_each_break_is_found_with_its_fix(
    shop: Shop, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("RAGSTREAM_PLAN__TOPIC_PREFIX", "sor")
    discover(shop, capsys)
    s = shop.schema
    with psycopg.connect(shop.dsn, autocommit=True) as conn:
        conn.execute((shop.out / "fixes.sql").read_bytes())
    create_topics(shop.bootstrap, f"sor.{s}.tickets", f"sor.{s}.articles", shop.dlq, partitions=1)
    code, report = shop.check(capsys)
    assert (code, report["ok"]) == (0, True), report["problems"]
    # article rows: one without a tenant, one whose tenant is no valid name (warnings); the
    # fixes made the tenant column NOT NULL: undo that
    assert 'ALTER COLUMN "account" SET NOT NULL' in (shop.out / "fixes.sql").read_text()
    shop.sql("ALTER TABLE {s}.articles ALTER COLUMN account DROP NOT NULL")
    shop.sql(
        "INSERT INTO {s}.articles VALUES (2, NULL, 'x', '{{}}', NULL),"
        " (3, 'Acme Corp', 'y', '{{}}', '[]')"
    )
    code, report = shop.check(capsys)
    found = {p["code"]: p for p in report["problems"]}
    assert code == 1
    assert {"TENANT_NULLS", "TENANT_INVALID", "METADATA_NOT_OBJECT", "TENANT_NULLABLE"} <= set(
        found
    )
    assert "'Acme Corp'" in found["TENANT_INVALID"]["message"]
    assert found["TENANT_NULLABLE"]["sql"].endswith('ALTER COLUMN "account" SET NOT NULL')
    code, _ = shop.check(capsys, "--errors-only")
    assert code == 0  # warnings only
    shop.sql("DELETE FROM {s}.articles WHERE id > 1")
    # a table dropped from the publication, REPLICA IDENTITY NOTHING, a misspelt column
    pub = f"pub_{s.removeprefix('shop_')}"
    shop.sql(f"ALTER PUBLICATION {pub} DROP TABLE {{s}}.articles")
    shop.sql("ALTER TABLE {s}.tickets REPLICA IDENTITY NOTHING")
    tables = json.loads((shop.out / "tables.json").read_text())
    tables[0]["title_column"] = "headlne"
    (shop.out / "tables.json").write_text(json.dumps(tables))
    code, report = shop.check(capsys)
    assert code == 1
    found = {(p["code"], p["table"].split(".")[-1]): p for p in report["problems"]}
    assert found[("NOT_PUBLISHED", "articles")]["sql"] == (
        f'ALTER PUBLICATION "{pub}" ADD TABLE "{s}"."articles"'
    )
    assert found[("REPLICA_IDENTITY", "tickets")]["severity"] == "error"
    missing = found[("COLUMN_MISSING", "articles")]
    assert (missing["field"], missing["severity"]) == ("title_column", "error")
    assert "did you mean 'headline'?" in missing["message"]


def test_check_finds_missing_topics_and_other_partition_counts(
    shop: Shop, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("RAGSTREAM_PLAN__TOPIC_PREFIX", shop.prefix)
    discover(shop, capsys)
    s = shop.schema
    with psycopg.connect(shop.dsn, autocommit=True) as conn:
        conn.execute((shop.out / "fixes.sql").read_bytes())
    connector = json.loads((shop.out / "kafka-connect.json").read_text())
    connector["config"]["topic.prefix"] = shop.prefix
    (shop.out / "kafka-connect.json").write_text(json.dumps(connector))
    create_topics(shop.bootstrap, f"{shop.prefix}.{s}.tickets", partitions=2)
    code, report = shop.check(capsys)
    assert code == 1
    found = {(p["code"], p["field"]) for p in report["problems"]}
    assert found == {
        ("TOPIC_PARTITIONS", f"{shop.prefix}.{s}.tickets"),
        ("TOPIC_MISSING", f"{shop.prefix}.{s}.articles"),
        ("TOPIC_MISSING", shop.dlq),
    }
    code, report = shop.check(capsys, "--partitions", "2", "--no-broker")
    assert code == 0, report["problems"]  # without the broker: nothing about topics


def test_exit_codes_for_a_bad_file_and_unreachable_database_or_broker(
    shop: Shop,
    capsys: pytest.CaptureFixture[str],
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    with monkeypatch.context() as env:
        env.setenv("RAGSTREAM_PLAN__TABLES", '[{"table": "x.y",]')
        code, _, err = shop.run(capsys, "check", "--dsn", shop.dsn, "--no-broker")
        assert code == 2
        assert "error [CONFIG_ERROR]" in err
        assert "line 1 column 18" in err  # where the JSON breaks
    broken = tmp_path / "broken.json"
    broken.write_text('[{"table": "x.y",]')
    code, _, err = shop.run(capsys, "check", "--dsn", shop.dsn, "--tables", str(broken))
    assert code == 2
    assert "line 1 column" in err
    typo = tmp_path / "typo.json"
    typo.write_text(json.dumps([{"table": "x.y", "tenant_colum": "org"}]))
    code, _, err = shop.run(capsys, "check", "--dsn", shop.dsn, "--tables", str(typo))
    assert code == 2
    assert "tables[0] (x.y): unknown field 'tenant_colum' (did you mean 'tenant_column'?)" in err
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        closed = sock.getsockname()[1]  # bound, never listening: refused
        dead = f"host=127.0.0.1 port={closed} user=u password=hunter2 dbname=d connect_timeout=2"
        code, _, err = shop.run(capsys, "discover", "--dsn", dead)
        assert code == 3
        assert "hunter2" not in err
        code, _, err = shop.run(
            capsys,
            "check",
            "--dsn",
            shop.dsn,
            "--tables",
            str(typo),
            "--bootstrap-servers",
            f"127.0.0.1:{closed}",
        )
        assert code == 2  # the file is checked before anything is reached
    ok = tmp_path / "ok.json"
    ok.write_text(
        json.dumps(
            [
                {
                    "table": f"{shop.schema}.tickets",
                    "key_columns": ["workspace", "ticket_no"],
                    "tenant_column": "workspace",
                    "type_column": None,
                    "title_column": "subject",
                    "content_columns": ["subject", "body"],
                    "metadata_column": None,
                    "content_hash_column": None,
                    "created_at_column": None,
                    "updated_at_column": "modified_at",
                    "deleted_at_column": "deleted_at",
                }
            ]
        )
    )
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        code, _, err = shop.run(
            capsys,
            "check",
            "--dsn",
            shop.dsn,
            "--tables",
            str(ok),
            "--bootstrap-servers",
            f"127.0.0.1:{sock.getsockname()[1]}",
        )
    assert code == 3
    assert "unreachable" in err
