"""The docker-compose one-shot scripts, run with POSIX sh against stand-ins: the connector
registration against a fake Kafka Connect REST API, the topic creation against a recording
`kafka-topics.sh`."""

from __future__ import annotations

import json
import os
import shutil
import stat
import subprocess
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import pytest

from tests.deploy.support import COMPOSE_FILE, CONNECTOR_FILE, REPO_ROOT, load_yaml

pytestmark = pytest.mark.integration

REGISTER = REPO_ROOT / "deploy" / "debezium" / "register-connector.sh"
CREATE_TOPICS = REPO_ROOT / "deploy" / "kafka" / "create-topics.sh"
POSTGRES_CONNECTOR = "io.debezium.connector.postgresql.PostgresConnector"


class FakeConnect:
    """Kafka Connect's REST API, just enough for the registration script."""

    def __init__(self, task_state: str = "RUNNING") -> None:
        self.task_state = task_state
        self.configs: dict[str, Any] = {}
        fake = self

        class Handler(BaseHTTPRequestHandler):
            def _reply(self, code: int, body: object) -> None:
                data = json.dumps(body).encode()
                self.send_response(code)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            def do_GET(self) -> None:
                if self.path == "/connector-plugins":
                    self._reply(200, [{"class": POSTGRES_CONNECTOR, "type": "source"}])
                elif self.path.endswith("/status"):
                    name = self.path.split("/")[2]
                    if name not in fake.configs:
                        self._reply(404, {"error_code": 404})
                        return
                    self._reply(
                        200,
                        {
                            "name": name,
                            "connector": {"state": "RUNNING", "worker_id": "w:8083"},
                            "tasks": [{"id": 0, "state": fake.task_state, "worker_id": "w"}],
                        },
                    )
                else:
                    self._reply(404, {"error_code": 404})

            def do_PUT(self) -> None:
                parts = self.path.split("/")
                length = int(self.headers["Content-Length"])
                body = json.loads(self.rfile.read(length))
                if len(parts) == 4 and parts[1] == "connectors" and parts[3] == "config":
                    if body.get("name", parts[2]) != parts[2]:
                        self._reply(400, {"message": "name mismatch"})
                        return
                    fake.configs[parts[2]] = body
                    self._reply(201, {"name": parts[2], "config": body})
                else:
                    self._reply(404, {"error_code": 404})

            def log_message(self, format: str, *args: Any) -> None:
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"
        self._thread = threading.Thread(target=self.server.serve_forever, daemon=True)
        self._thread.start()

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()


@pytest.fixture
def fake_connect() -> Iterator[FakeConnect]:
    connect = FakeConnect()
    try:
        yield connect
    finally:
        connect.close()


def _sh() -> str:
    sh = shutil.which("dash") or shutil.which("sh")
    assert sh is not None
    return sh


def run_register(url: str, tries: int = 3) -> subprocess.CompletedProcess[str]:
    if shutil.which("curl") is None:
        pytest.skip("curl not installed (apt-get install curl)")
    env = {
        "PATH": os.environ["PATH"],
        "CONNECT_URL": url,
        "CONNECTOR_CONFIG": str(CONNECTOR_FILE),
        "TRIES": str(tries),
    }
    return subprocess.run(
        [_sh(), str(REGISTER)], env=env, capture_output=True, text=True, timeout=60, check=False
    )


def test_registration_puts_the_connector_config_and_waits_until_running(
    fake_connect: FakeConnect,
) -> None:
    result = run_register(fake_connect.url)
    assert result.returncode == 0, result.stdout + result.stderr
    connector = json.loads(CONNECTOR_FILE.read_text(encoding="utf-8"))
    assert fake_connect.configs == {connector["name"]: connector}
    assert f"{connector['name']} is RUNNING" in result.stdout
    # Idempotent: a second run updates the same connector.
    assert run_register(fake_connect.url).returncode == 0
    assert list(fake_connect.configs) == [connector["name"]]


def test_registration_fails_when_the_task_fails(fake_connect: FakeConnect) -> None:
    fake_connect.task_state = "FAILED"
    result = run_register(fake_connect.url)
    assert result.returncode != 0
    assert "failed" in result.stderr


def test_registration_gives_up_when_connect_is_unreachable(fake_connect: FakeConnect) -> None:
    url = fake_connect.url
    fake_connect.close()
    result = run_register(url, tries=1)
    assert result.returncode != 0
    assert "not reachable" in result.stderr


def test_topic_script_creates_each_compose_topic_idempotently(tmp_path: Path) -> None:
    log = tmp_path / "calls.log"
    fake = tmp_path / "kafka-topics.sh"
    fake.write_text(f'#!/bin/sh\necho "$*" >> "{log}"\n', encoding="utf-8")
    fake.chmod(fake.stat().st_mode | stat.S_IXUSR)
    compose_env = load_yaml(COMPOSE_FILE)["services"]["kafka-init"]["environment"]
    env = {
        "PATH": os.environ["PATH"],
        "KAFKA_TOPICS_BIN": str(fake),
        "BOOTSTRAP_SERVERS": str(compose_env["BOOTSTRAP_SERVERS"]),
        "REPLICATION_FACTOR": str(compose_env["REPLICATION_FACTOR"]),
        "TOPICS": str(compose_env["TOPICS"]),
    }
    result = subprocess.run(
        [_sh(), str(CREATE_TOPICS)], env=env, capture_output=True, text=True, check=False
    )
    assert result.returncode == 0, result.stderr
    calls = log.read_text(encoding="utf-8").splitlines()
    creates = [c.split() for c in calls if "--create" in c]
    topics = {c[c.index("--topic") + 1]: c[c.index("--partitions") + 1] for c in creates}
    assert topics == {
        "sor.public.entities": "6",
        "ragstream.dlq": "1",
        "ragstream.dlq.parked": "1",
        "ragstream.audit": "3",
        "ragstream.reindex-requests": "3",
        "__debezium-heartbeat.sor": "1",
    }
    assert all("--if-not-exists" in c for c in creates)
    assert all(c[c.index("--bootstrap-server") + 1] == "kafka:9092" for c in creates)
    assert calls[-1].endswith("--list")


def test_topic_script_requires_a_topic_list(tmp_path: Path) -> None:
    result = subprocess.run(
        [_sh(), str(CREATE_TOPICS)],
        env={"PATH": os.environ["PATH"], "KAFKA_TOPICS_BIN": "/bin/false"},
        capture_output=True,
        text=True,
        check=False,
    )
    assert result.returncode != 0
    assert "TOPICS" in result.stderr
