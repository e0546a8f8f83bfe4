"""`ragstream reindex` and `ragstream index` as an operator runs them: separate processes, a
SQLite SoR, qdrant-edge on disk, and two "models" served by an OpenAI-compatible embeddings
endpoint on loopback (`EmbeddingStubServer`, hashed-word vectors; the real ONNX model would
make this test minutes long without testing anything more of the commands)."""

from __future__ import annotations

import json
import os
import random
import sqlite3
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from tests.conftest import REPO_ROOT
from tests.streams.support import EmbeddingStubServer, content, stub_embedder

pytestmark = pytest.mark.integration


def embedder(stub: EmbeddingStubServer, model: str) -> str:
    return json.dumps(stub_embedder(stub.base_url, model=model, version="1", max_retries=1))


def run(env: dict[str, str], *args: str) -> tuple[int, Any, str]:
    done = subprocess.run(
        [sys.executable, "-m", "ragstream.cli", *args],
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    doc = json.loads(done.stdout) if done.stdout.strip() else None
    return done.returncode, doc, done.stderr


def test_reindex_builds_switches_and_retires_and_index_lists_the_versions(tmp_path: Path) -> None:
    sor = tmp_path / "sor.sqlite"
    conn = sqlite3.connect(sor)
    rng = random.Random(8)
    with conn:
        conn.executescript((REPO_ROOT / "schemas" / "sql" / "entities.sqlite.sql").read_text())
        for n in range(40):
            conn.execute(
                "INSERT INTO entities (id, company_id, name, content, created_at, updated_at) "
                "VALUES (?, 'acme', ?, ?, '2026-01-01T00:00:00Z', '2026-01-01T00:00:00Z')",
                (f"doc-{n:03d}", f"Doc {n}", content(rng, rng.randint(3, 9))),
            )
    conn.close()
    with EmbeddingStubServer() as stub:
        env = {
            **os.environ,
            "PYTHONPATH": str(REPO_ROOT),
            "RAGSTREAM_EMBEDDER": embedder(stub, "hash-a"),
            "RAGSTREAM_NEXT_EMBEDDER": embedder(stub, "hash-b"),
            "RAGSTREAM_SOR__KIND": "sqlite",
            "RAGSTREAM_SOR__SQLITE_PATH": str(sor),
            "RAGSTREAM_STORE__DATA_DIR": str(tmp_path / "store"),
            "RAGSTREAM_EMBEDDING_CACHE__PATH": str(tmp_path / "cache.sqlite"),
        }
        quick = ("--settle-s", "0", "--grace-s", "0")
        code, first, err = run(env, "reindex", "--tenant", "acme", *quick)
        assert code == 0, err
        assert (first["outcome"], first["new_version"], first["parity"]) == ("switched", 1, None)
        assert first["sor_entities"] == 40 and first["points"] >= 40
        assert "snapshot 40/40 entities (100%)" in err

        code, unknown, err = run(env, "reindex", "--tenant", "acme", "--model", "nope", *quick)
        assert code == 2 and unknown is None
        assert "model 'nope' is not configured (configured: hash-a@1, hash-b@1)" in err

        code, second, err = run(env, "reindex", "--tenant", "acme", "--model", "hash-b", *quick)
        assert code == 0, err
        assert (second["outcome"], second["old_version"], second["new_version"]) == (
            "switched",
            1,
            2,
        )
        assert second["parity"]["passed"] and second["parity"]["queries"] == 40
        assert second["retired"] == [1] and second["points"] == first["points"]

        code, listing, err = run(env, "index", "list", "--tenant", "acme")
        assert code == 0, err
        rows = {v["version"]: v for v in listing["versions"]}
        assert listing["active"] == 2
        assert (rows[1]["status"], rows[1]["active"], rows[1]["embedding_model"]) == (
            "retired",
            False,
            "hash-a",
        )
        assert (rows[2]["status"], rows[2]["active"], rows[2]["embedding_model"]) == (
            "ready",
            True,
            "hash-b",
        )
        assert rows[2]["points"] == second["points"]

        code, _, err = run(env, "index", "activate", "--tenant", "acme", "--version", "1")
        assert code == 2 and "rag__acme__v1 is retired, not ready" in err
