"""`ragstream dev` end to end, as a newcomer runs it: start, query, update, delete, scrape
/metrics, Ctrl-C, and a restart that reuses the data directory."""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path
from typing import Any

import pytest

from ragdev.services.tansu import free_port
from tests.conftest import REPO_ROOT

pytestmark = [pytest.mark.integration, pytest.mark.slow]

DOG = "what is the name of the office dog?"
CURRENCY = "our invoice came in dollars instead of euros"


class DevProcess:
    """`ragstream dev` as a subprocess with its own ports and data directory."""

    def __init__(self, data_dir: Path, sor: str = "sqlite") -> None:
        self.data_dir = data_dir
        self.grpc = free_port()
        self.metrics = free_port()
        self.kafka = free_port()
        self.log = data_dir.parent / f"dev-{time.monotonic_ns()}.log"
        self.env = {**os.environ, "PYTHONPATH": str(REPO_ROOT)}
        args = ["dev", "--data-dir", str(data_dir), "--sample-size", "20", "--sor", sor]
        args += ["--kafka-port", str(self.kafka), "--grpc-port", str(self.grpc)]
        args += ["--metrics-port", str(self.metrics), "--postgres-port", str(free_port())]
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "ragstream.cli", *args],
            stdout=self.log.open("wb"),
            stderr=subprocess.STDOUT,
            env=self.env,
            start_new_session=True,  # a process group of its own, as a terminal gives it
        )

    def output(self) -> str:
        return self.log.read_text(errors="replace")

    def wait_up(self, timeout: float = 180) -> None:
        deadline = time.monotonic() + timeout
        while "Press Ctrl-C to stop." not in self.output():
            assert self.proc.poll() is None, f"dev stack exited:\n{self.output()[-3000:]}"
            assert time.monotonic() < deadline, f"dev stack not up:\n{self.output()[-3000:]}"
            time.sleep(0.5)

    def cli(self, *args: str) -> str:
        result = subprocess.run(
            [sys.executable, "-m", "ragstream.cli", *args, "--data-dir", str(self.data_dir)],
            capture_output=True,
            text=True,
            env=self.env,
            timeout=60,
            check=False,
        )
        assert result.returncode == 0, result.stderr
        return result.stdout

    def query(self, tenant: str, question: str) -> dict[str, Any]:
        out = self.cli(
            "query", "--target", f"127.0.0.1:{self.grpc}", "--tenant", tenant, "--json", question
        )
        pack: dict[str, Any] = json.loads(out)
        return pack

    def stop(self) -> int:
        """Ctrl-C as a terminal sends it: SIGINT to the whole process group (the broker and
        the database too, unless they run in sessions of their own). The shutdown must stop
        the worker before the broker: no client may log a refused connection."""
        before = len(self.output())
        os.killpg(self.proc.pid, signal.SIGINT)
        code = self.proc.wait(60)
        shutdown = self.output()[before:]
        assert "Connection refused" not in shutdown, shutdown[-3000:]
        return code


def entity_ids(pack: dict[str, Any]) -> list[str]:
    return [r["entity_id"] for r in pack.get("results", [])]


def wait_for(check: Any, timeout: float = 20.0) -> float:
    began = time.monotonic()
    while not check():
        assert time.monotonic() - began < timeout, "condition not reached in time"
        time.sleep(0.3)
    return time.monotonic() - began


def assert_cites_the_page(dev: DevProcess) -> None:
    """The sample datasheet PDF answers a question only its page 4 holds, cited as such."""
    pack = wait_for_pack(dev, "globex", "How often must the GX-950 motor bearings be regreased?")
    top = pack["results"][0]
    assert top["entity_id"] == "documents:globex-doc-1", entity_ids(pack)
    assert top["locator"]["section_path"] == ["gx950-datasheet.pdf", "p. 4"]
    assert top["locator"]["extracted_from"] == "pdf"


def wait_for_pack(dev: DevProcess, tenant: str, question: str) -> dict[str, Any]:
    """The pack once the question has an answer (the documents table may index last)."""
    wait_for(lambda: bool(dev.query(tenant, question).get("results")))
    return dev.query(tenant, question)


def test_dev_stack_serves_reflects_changes_within_seconds_and_stops_cleanly(
    tmp_path: Path,
) -> None:
    dev = DevProcess(tmp_path / "data")
    try:
        dev.wait_up()
        out = dev.output()
        assert "loaded 20 sample rows into table entities" in out
        assert "loaded 20 sample rows into table tickets" in out
        assert "SUCCESS  tenant=acme" in out  # the example queries ran
        # each tenant's index is calibrated once indexed: scored by a fitted model, not the prior
        assert "calibrated rag__acme__v1" in out and "calibrated rag__globex__v1" in out
        pack = dev.query("acme", "If a customer cancels a yearly plan, do they get money back?")
        assert pack["status"] == "RETRIEVAL_STATUS_SUCCESS"
        assert pack["calibration"]["source"] == "fitted", pack["calibration"]
        assert entity_ids(pack)[0] == "entities:acme-kb-refund-policy"
        # the documents table: a PDF's chunk answers, cited by file and page
        assert "loaded 5 sample rows into table documents" in out
        assert_cites_the_page(dev)

        # the second table: a ticket written through the CLI is found, as a ticket
        dev.cli(
            "sor",
            "put",
            "--table",
            "tickets",
            "--tenant",
            "acme",
            "--id",
            "acme-ticket-9001",
            "--title",
            "Invoice shows the wrong currency",
            "--text",
            "Our March invoice was issued in US dollars although our contract is in euros.",
            "--set",
            "priority=high",
        )
        ticket = "tickets:acme-ticket-9001"
        wait_for(lambda: ticket in entity_ids(dev.query("acme", CURRENCY))[:1])
        top = dev.query("acme", CURRENCY)["results"][0]
        assert (top["entity_type"], top["title"]) == ("TICKET", "Invoice shows the wrong currency")

        dev.cli(
            "sor",
            "put",
            "--tenant",
            "acme",
            "--id",
            "office-dog",
            "--text",
            "Our office dog is called Rex. He is a golden retriever who visits on Fridays.",
        )
        dog = "entities:office-dog"
        took = wait_for(lambda: dog in entity_ids(dev.query("acme", DOG))[:1])
        assert took < 15, f"the update took {took:.1f}s to become searchable"
        assert dog not in entity_ids(dev.query("globex", DOG))

        dev.cli("sor", "delete", "--id", "office-dog")
        wait_for(lambda: dog not in entity_ids(dev.query("acme", DOG)))

        # `ragstream config --dev`: the settings the stack runs with, secrets masked only
        running = json.loads(dev.cli("config", "--dev"))
        assert running["ingest"]["kafka"]["bootstrap_servers"] == f"127.0.0.1:{dev.kafka}"
        assert running["retrieve"]["grpc"]["port"] == dev.grpc
        assert running["ingest"]["plan"]["tables"][0]["format_metadata_key"] == "format"

        with urllib.request.urlopen(f"http://127.0.0.1:{dev.metrics}/metrics", timeout=10) as r:
            metrics = r.read().decode()
        assert "ragstream_ingest_events_total" in metrics
        assert "grpc_server_handled_total" in metrics
        promtool = shutil.which("promtool")
        if promtool is not None:
            check = subprocess.run(
                [promtool, "check", "metrics"],
                input=metrics,
                capture_output=True,
                text=True,
                check=False,
            )
            assert check.returncode == 0, check.stdout + check.stderr
        assert dev.stop() == 0
        assert "stopped cleanly" in dev.output()
    finally:
        if dev.proc.poll() is None:
            dev.proc.kill()

    again = DevProcess(tmp_path / "data")  # restart on the same data directory
    try:
        again.wait_up()
        assert "sample rows" not in again.output()  # the SoR was kept, not reloaded
        assert "calibrated rag__" not in again.output()  # and so was each index's calibration
        assert entity_ids(again.query("acme", "refund after cancelling a yearly plan"))
        assert again.stop() == 0
    finally:
        if again.proc.poll() is None:
            again.proc.kill()


def test_dev_stack_on_postgres_and_real_debezium_reflects_sql_writes() -> None:
    # PostgreSQL runs as the postgres user: its data directory must be reachable by it (pytest's
    # own temp directories are private to root)
    root = Path(tempfile.mkdtemp(prefix="ragstream-dev-pg-"))
    root.chmod(0o755)
    dev = DevProcess(root / "data", sor="postgres")
    try:
        dev.wait_up()
        out = dev.output()
        assert "loaded 20 sample rows into table tickets (PostgreSQL)" in out
        assert "Debezium (Kafka Connect, pid" in out
        stack = json.loads((root / "data" / "dev-stack.json").read_text())
        assert stack["sor_kind"] == "postgres"
        pack = dev.query("acme", "If a customer cancels a yearly plan, do they get money back?")
        assert entity_ids(pack)[0] == "entities:acme-kb-refund-policy"
        assert_cites_the_page(dev)  # the bytea file came through real Debezium

        # `ragstream sor` writes SQL; Debezium carries the change to the index
        dev.cli(
            "sor",
            "put",
            "--table",
            "tickets",
            "--tenant",
            "globex",
            "--id",
            "globex-ticket-9",
            "--title",
            "Pump trips at start",
            "--text",
            "The GX-300 trips its breaker every time it is started.",
        )
        question = "which pump trips its breaker when it is started?"
        took = wait_for(
            lambda: "tickets:globex-ticket-9" in entity_ids(dev.query("globex", question))[:1]
        )
        assert took < 15, f"the SQL write took {took:.1f}s to become searchable"
        dev.cli("sor", "delete", "--table", "tickets", "--id", "globex-ticket-9")
        wait_for(lambda: "tickets:globex-ticket-9" not in entity_ids(dev.query("globex", question)))
        assert dev.stop() == 0
        assert "stopped cleanly" in dev.output()
    finally:
        if dev.proc.poll() is None:
            dev.proc.kill()
    leftover = subprocess.run(
        ["pgrep", "-f", str(root / "data" / "connect")],
        check=False,
        capture_output=True,
        text=True,
    )
    assert leftover.stdout.strip() == "", "Kafka Connect outlived the dev stack"
    shutil.rmtree(root, ignore_errors=True)
