"""SIGHUP reloads the credentials and the quotas of a running `python -m retrieval_api` in
every server process, without a restart and without waiting for the file poll.

Real parts: the entry point as a subprocess with two server processes, gRPC over loopback,
the SQLite SoR. The file poll is set to an hour, so only the signal can explain a reload.
"""

from __future__ import annotations

import hashlib
import json
import re
import signal
import time
import urllib.request
from pathlib import Path

import grpc
import pytest

from schemas.proto.ragstream.retrieval.v1 import retrieval_pb2 as pb
from schemas.proto.ragstream.retrieval.v1 import retrieval_pb2_grpc as pb_grpc
from tests.retrieval_api.test_processes import _channel, _serve

pytestmark = pytest.mark.integration


def _digest(token: bytes) -> str:
    return hashlib.sha256(token).hexdigest()


def _reloads(metrics_port: int, source: str) -> float:
    """`ragstream_retrieve_config_reloads_total{source, outcome="ok"}` summed over the
    processes (the parent's registry sums them)."""
    text = urllib.request.urlopen(f"http://127.0.0.1:{metrics_port}/metrics", timeout=10).read()
    pattern = re.compile(
        rf'^ragstream_retrieve_config_reloads_total\{{(?=[^}}]*source="{source}")'
        rf'(?=[^}}]*outcome="ok")[^}}]*\}} (\S+)$',
        re.M,
    )
    return sum(float(v) for v in pattern.findall(text.decode()))


def _codes(port: int, token: str, connections: int = 6) -> list[grpc.StatusCode]:
    """The status of one call per fresh connection (the kernel spreads connections over the
    server processes)."""
    codes = []
    for _ in range(connections):
        with _channel(f"127.0.0.1:{port}") as channel:
            stub = pb_grpc.RetrievalServiceStub(channel)
            try:
                stub.Retrieve(
                    pb.RetrieveRequest(query_text="vpn"),
                    metadata=(("authorization", f"Bearer {token}"),),
                    timeout=30,
                )
                codes.append(grpc.StatusCode.OK)
            except grpc.RpcError as exc:
                codes.append(exc.code())
    return codes


def test_sighup_reloads_tokens_and_quotas_in_every_server_process(tmp_path: Path) -> None:
    tokens = tmp_path / "tokens.json"
    quotas = tmp_path / "quotas.json"
    tokens.write_text(json.dumps({"acme": _digest(b"old")}), encoding="utf-8")
    quotas.write_text(json.dumps({"default": {"concurrency": 4}}), encoding="utf-8")
    parent, port, metrics = _serve(
        tmp_path,
        RAGSTREAM_AUTH__TOKENS_FILE=str(tokens),
        RAGSTREAM_ADMISSION__QUOTAS_FILE=str(quotas),
        RAGSTREAM_AUTH__RELOAD_INTERVAL_S="3600",
    )
    # the store is empty: an authenticated call of acme gets NOT_FOUND (no index yet)
    known = {grpc.StatusCode.NOT_FOUND}
    try:
        assert set(_codes(port, "old")) == known
        assert set(_codes(port, "new")) == {grpc.StatusCode.UNAUTHENTICATED}
        before = (_reloads(metrics, "credentials"), _reloads(metrics, "quotas"))

        # rotate: the new token beside the old one; a quota that still parses
        tokens.write_text(
            json.dumps({"acme": [_digest(b"old"), _digest(b"new")]}), encoding="utf-8"
        )
        quotas.write_text(json.dumps({"default": {"concurrency": 6}}), encoding="utf-8")
        time.sleep(1.0)
        # no poll within the hour: the new token is still unknown
        assert set(_codes(port, "new", connections=2)) == {grpc.StatusCode.UNAUTHENTICATED}

        parent.send_signal(signal.SIGHUP)
        deadline = time.monotonic() + 20
        while (_reloads(metrics, "credentials"), _reloads(metrics, "quotas")) != (
            before[0] + 2,
            before[1] + 2,
        ):
            assert parent.poll() is None, "SIGHUP stopped the server"
            assert time.monotonic() < deadline, "both processes did not reload in 20 s"
            time.sleep(0.2)
        assert set(_codes(port, "new")) == known
        assert set(_codes(port, "old")) == known
    finally:
        parent.send_signal(signal.SIGTERM)
        try:
            parent.wait(60)
        finally:
            if parent.poll() is None:
                parent.kill()
                parent.wait()
