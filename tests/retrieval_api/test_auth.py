"""Credentials: several tokens per tenant with expiries, reload without a restart, mTLS
mappings from a file, and the per-peer throttle of repeated failures (no server; a call
context stand-in carrying metadata, peer and auth context as gRPC hands them over)."""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest
from prometheus_client import CollectorRegistry

from ragcore.errors import ConfigError
from retrieval_api.auth import (
    AUTH_FAILURE_REASONS,
    RELOAD_SOURCES,
    AuthenticationError,
    Authenticator,
    AuthThrottledError,
    Credentials,
    PeerThrottle,
    peer_address,
)
from retrieval_api.settings import AuthSettings

pytestmark = pytest.mark.unit

NOW = datetime(2026, 11, 25, 12, 0, tzinfo=UTC)


def sha(token: str) -> str:
    return hashlib.sha256(token.encode()).hexdigest()


@dataclass
class Call:
    """What `Authenticator.tenant_of` reads of a `grpc.aio.ServicerContext`."""

    token: str | None = None
    peer_text: str = "ipv4:10.0.0.7:53122"
    common_names: list[bytes] = field(default_factory=list)

    def invocation_metadata(self) -> tuple[tuple[str, str], ...]:
        return (("authorization", f"Bearer {self.token}"),) if self.token is not None else ()

    def peer(self) -> str:
        return self.peer_text

    def auth_context(self) -> dict[str, list[bytes]]:
        return {"x509_common_name": self.common_names} if self.common_names else {}


def tenant(auth: Authenticator, call: Call) -> str:
    context: Any = call
    return auth.tenant_of(context)


def test_every_listed_token_of_a_tenant_works_until_its_expiry() -> None:
    settings = AuthSettings(
        tokens={
            "acme": [
                {"sha256": sha("old"), "expires_at": (NOW + timedelta(hours=1)).isoformat()},
                sha("new"),
            ],
            "globex": sha("globex"),
        }
    )
    clock = [NOW]
    auth = Authenticator(settings, now=lambda: clock[0])
    assert tenant(auth, Call("old")) == "acme"
    assert tenant(auth, Call("new")) == "acme"
    assert tenant(auth, Call("globex")) == "globex"
    clock[0] = NOW + timedelta(hours=1)
    with pytest.raises(AuthenticationError, match="expired") as err:
        tenant(auth, Call("old"))
    assert err.value.reason == "expired"
    assert tenant(auth, Call("new")) == "acme"


@pytest.mark.parametrize(
    ("tokens", "message"),
    [
        ({"acme": "abc"}, "not a sha256"),
        ({"acme": []}, "empty list"),
        ({"acme": [{"sha256": sha("x"), "expires": "2026-01-01"}]}, "unknown keys"),
        ({"acme": [{"sha256": sha("x"), "expires_at": "soon"}]}, "not RFC 3339"),
        ({"acme": [{"sha256": sha("x"), "expires_at": "2026-01-01T00:00:00"}]}, "time zone"),
        ({"acme": sha("x"), "globex": sha("x")}, "'acme' and 'globex'"),
    ],
)
def test_bad_token_entries_are_refused_without_showing_a_digest(
    tokens: dict[str, Any], message: str
) -> None:
    with pytest.raises(ConfigError, match=message) as err:
        Credentials.load(AuthSettings(tokens=tokens))
    assert sha("x") not in str(err.value)


def test_the_tokens_file_reloads_and_a_broken_file_keeps_the_tokens_in_force(
    tmp_path: Path,
) -> None:
    path = tmp_path / "tokens.json"
    path.write_text(json.dumps({"acme": sha("old")}))
    registry = CollectorRegistry()
    auth = Authenticator(AuthSettings(tokens_file=path), registry)
    assert tenant(auth, Call("old")) == "acme"
    path.write_text(json.dumps({"acme": [sha("old"), sha("new")]}))
    assert auth.reload()
    assert tenant(auth, Call("new")) == "acme"
    path.write_text(json.dumps({"acme": sha("new")}))
    assert auth.reload()
    with pytest.raises(AuthenticationError, match="unknown"):
        tenant(auth, Call("old"))
    path.write_text('{"acme": ')  # a half-written file
    assert not auth.reload()
    assert tenant(auth, Call("new")) == "acme"
    value = registry.get_sample_value
    labels = {"source": "credentials"}
    assert value("ragstream_retrieve_config_reloads_total", {**labels, "outcome": "ok"}) == 2
    assert value("ragstream_retrieve_config_reloads_total", {**labels, "outcome": "error"}) == 1


def test_mtls_mappings_reload_from_their_file(tmp_path: Path) -> None:
    path = tmp_path / "mtls.json"
    path.write_text(json.dumps({"acme-service": "acme"}))
    auth = Authenticator(AuthSettings(mtls_file=path, mtls_tenants={"legacy": "globex"}))
    assert tenant(auth, Call(common_names=[b"acme-service"])) == "acme"
    assert tenant(auth, Call(common_names=[b"legacy"])) == "globex"
    path.write_text(json.dumps({"acme-service-2": "acme"}))
    auth.reload()
    assert tenant(auth, Call(common_names=[b"acme-service-2"])) == "acme"
    with pytest.raises(AuthenticationError, match="not mapped"):
        tenant(auth, Call(common_names=[b"acme-service"]))


def test_repeated_failures_from_one_peer_block_it_and_are_counted() -> None:
    registry = CollectorRegistry()
    settings = AuthSettings(tokens={"acme": sha("good")}, max_failures=3, block_s=30)
    auth = Authenticator(settings, registry)
    attacker, other = "ipv4:10.0.0.66:4000", "ipv4:10.0.0.7:5000"
    for port in range(3):
        with pytest.raises(AuthenticationError):
            tenant(auth, Call("guess", peer_text=f"ipv4:10.0.0.66:{port}"))
    # blocked: even a good token from that address is refused before it is looked at
    with pytest.raises(AuthThrottledError) as err:
        tenant(auth, Call("good", peer_text=attacker))
    assert err.value.code == "AUTH_THROTTLED"
    assert 0 < err.value.retry_after_ms <= 30_000
    assert tenant(auth, Call("good", peer_text=other)) == "acme"
    value = registry.get_sample_value
    assert value("ragstream_retrieve_auth_failures_total", {"reason": "unknown"}) == 3
    assert value("ragstream_retrieve_auth_failures_total", {"reason": "throttled"}) == 1
    assert value("ragstream_retrieve_auth_blocked_peers_total") == 1


def test_failure_reasons_and_reloads_start_at_zero_and_failures_count_there() -> None:
    registry = CollectorRegistry()
    auth = Authenticator(AuthSettings(tokens={"acme": sha("good")}), registry)
    value = registry.get_sample_value
    failures = "ragstream_retrieve_auth_failures_total"
    for source in RELOAD_SOURCES:
        for outcome in ("ok", "error"):
            labels = {"source": source, "outcome": outcome}
            assert value("ragstream_retrieve_config_reloads_total", labels) == 0
    assert all(value(failures, {"reason": r}) == 0 for r in AUTH_FAILURE_REASONS)
    for call in (Call(), Call(""), Call("guess")):  # missing, malformed, unknown
        with pytest.raises(AuthenticationError):
            tenant(auth, call)
    counted = {
        sample.labels["reason"]: sample.value
        for family in registry.collect()
        if family.name == "ragstream_retrieve_auth_failures"
        for sample in family.samples
        if sample.name == failures
    }
    assert set(counted) == set(AUTH_FAILURE_REASONS)  # no reason outside the list
    assert {r for r, n in counted.items() if n} == {"missing", "malformed", "unknown"}


def test_the_block_ends_and_old_failures_leave_the_window() -> None:
    clock = [0.0]
    throttle = PeerThrottle(2, window_s=10, block_s=5, clock=lambda: clock[0])
    assert not throttle.failed("p")
    clock[0] = 11  # the first failure left the window
    assert not throttle.failed("p")
    assert throttle.failed("p")
    with pytest.raises(AuthThrottledError):
        throttle.check("p")
    clock[0] = 16.5
    throttle.check("p")


def test_the_peer_table_is_bounded() -> None:
    throttle = PeerThrottle(1, window_s=10, block_s=5, max_peers=2)
    for peer in ("a", "b", "c"):
        throttle.failed(peer)
    throttle.check("a")  # forgotten: the oldest
    with pytest.raises(AuthThrottledError):
        throttle.check("c")


@pytest.mark.parametrize(
    ("peer", "address"),
    [
        ("ipv4:10.0.0.7:53122", "ipv4:10.0.0.7"),
        ("ipv6:[::1]:5000", "ipv6:[::1]"),
        ("unix:/tmp/s.sock", "unix:/tmp/s.sock"),
    ],
)
def test_peer_address_drops_the_port(peer: str, address: str) -> None:
    assert peer_address(peer) == address


def test_the_server_s_poll_reloads_changed_files_and_flags_a_broken_one(tmp_path: Path) -> None:
    """What the server runs every `reload_interval_s`: a changed tokens or quotas file is
    reloaded, an unchanged one is not read again, a broken one sets reload_ok to 0."""
    from retrieval_api.admission import AdmissionSettings, TenantAdmission
    from retrieval_api.grpc_server import _Watched

    tokens, quotas = tmp_path / "tokens.json", tmp_path / "quotas.json"
    tokens.write_text(json.dumps({"acme": sha("one")}))
    quotas.write_text(json.dumps({"tenants": {"acme": {"concurrency": 1}}}))
    registry = CollectorRegistry()
    auth = Authenticator(AuthSettings(tokens_file=tokens), registry)
    admission = TenantAdmission(AdmissionSettings(quotas_file=quotas), registry)
    watched = _Watched(auth, admission)
    value = registry.get_sample_value
    reloads = "ragstream_retrieve_config_reloads_total"
    watched.poll()
    assert value(reloads, {"source": "quotas", "outcome": "ok"}) == 0  # nothing changed
    quotas.write_text(json.dumps({"tenants": {"acme": {"concurrency": 3}}}))
    tokens.write_text(json.dumps({"acme": [sha("one"), sha("two")]}))
    watched.poll()
    assert admission.quotas.of("acme").concurrency == 3
    assert tenant(auth, Call("two")) == "acme"
    assert value(reloads, {"source": "quotas", "outcome": "ok"}) == 1
    quotas.write_text('{"tenants": ')
    watched.poll()
    assert admission.quotas.of("acme").concurrency == 3  # the previous quotas stay
    assert value("ragstream_retrieve_config_reload_ok", {"source": "quotas"}) == 0
    assert value("ragstream_retrieve_config_reload_ok", {"source": "credentials"}) == 1
    quotas.unlink()  # a missing file is a change too, and an error
    watched.poll()
    assert value(reloads, {"source": "quotas", "outcome": "error"}) == 2
