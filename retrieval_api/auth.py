"""Who a caller is: API tokens (several per tenant, each optionally expiring) and mTLS
identities, reloaded without a restart; repeated failures from one peer are throttled.

Tokens are kept as sha256 hex digests only. A tenant's entry in `auth.tokens` or in the tokens
file is one digest, or a list of digests and `{"sha256": hex, "expires_at": RFC 3339}` objects:
during a rotation both the old and the new token are listed, the old one perhaps with an
expiry, and the file is rewritten without it once every client moved
(docs/decisions/tenant-fairness.md). `Credentials.load` reads the settings and the files;
`Authenticator.reload` swaps in a new snapshot, and keeps the one in force when the files are
unusable (logged and counted, never half-applied).
"""

from __future__ import annotations

import hashlib
import json
import logging
import threading
import time
from collections import OrderedDict
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import grpc
from prometheus_client import CollectorRegistry, Counter, Gauge

from ragcore.errors import ConfigError, RagstreamError
from retrieval_api.admission import OverloadedError
from retrieval_api.settings import AuthSettings

__all__ = ["AuthenticationError", "Authenticator", "Credentials", "PeerThrottle"]

log = logging.getLogger(__name__)

_HEX = frozenset("0123456789abcdef")
#: `reason` of `ragstream_retrieve_auth_failures_total` and `source` of
#: `ragstream_retrieve_config_reloads_total`, exported at 0 from the start (a healthy server's
#: dashboard shows 0, not "no data").
AUTH_FAILURE_REASONS = ("missing", "malformed", "unknown", "expired", "throttled")
RELOAD_SOURCES = ("credentials", "quotas")


class AuthenticationError(RagstreamError):
    """The caller presented no usable credentials."""

    code = "UNAUTHENTICATED"

    def __init__(self, message: str, *, reason: str = "unknown") -> None:
        super().__init__(message)
        self.reason = reason


class AuthThrottledError(OverloadedError):
    """A peer that failed to authenticate too often is refused for a while."""

    code = "AUTH_THROTTLED"


@dataclass(frozen=True)
class _Token:
    tenant: str
    expires_at: datetime | None


@dataclass(frozen=True)
class Credentials:
    """One consistent snapshot: token digest -> tenant (+ expiry), certificate CN -> tenant."""

    tokens: Mapping[str, _Token]
    mtls: Mapping[str, str]

    @classmethod
    def load(cls, settings: AuthSettings) -> Credentials:
        """Parse `settings` and read its files now; ConfigError names what is wrong (never a
        digest)."""
        entries: dict[str, Any] = dict(settings.tokens)
        if settings.tokens_file is not None:
            loaded = _read_json_object(settings.tokens_file, "auth tokens")
            entries.update(loaded)
        tokens: dict[str, _Token] = {}
        for tenant, value in entries.items():
            for digest, expires in _token_entries(str(tenant), value):
                known = tokens.get(digest)
                if known is not None and known.tenant != tenant:
                    raise ConfigError(
                        f"one auth token is listed for tenants {known.tenant!r} and {tenant!r}"
                    )
                tokens[digest] = _Token(str(tenant), expires)
        mtls = dict(settings.mtls_tenants)
        if settings.mtls_file is not None:
            for name, tenant in _read_json_object(settings.mtls_file, "mTLS tenants").items():
                if not isinstance(tenant, str) or not tenant:
                    raise ConfigError(f"{settings.mtls_file}: tenant of {name!r} is not a name")
                mtls[str(name)] = tenant
        return cls(tokens, mtls)

    def summary(self) -> str:
        """Counts for a log line (no digests)."""
        tenants = {t.tenant for t in self.tokens.values()}
        expiring = sum(1 for t in self.tokens.values() if t.expires_at is not None)
        return (
            f"{len(self.tokens)} tokens of {len(tenants)} tenants ({expiring} with an expiry), "
            f"{len(self.mtls)} mTLS identities"
        )


def _read_json_object(path: Path, what: str) -> dict[str, Any]:
    try:
        loaded = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, json.JSONDecodeError) as exc:
        raise ConfigError(f"cannot read the {what} file {path}: {exc}") from exc
    if not isinstance(loaded, dict):
        raise ConfigError(f"{path}: expected a JSON object")
    return loaded


def _token_entries(tenant: str, value: Any) -> list[tuple[str, datetime | None]]:
    """A tenant's entry: one digest, or a list of digests / {sha256, expires_at} objects."""
    items = value if isinstance(value, list) else [value]
    if not items:
        raise ConfigError(f"auth tokens of tenant {tenant!r}: an empty list")
    out: list[tuple[str, datetime | None]] = []
    for item in items:
        expires: datetime | None = None
        if isinstance(item, dict):
            unknown = set(item) - {"sha256", "expires_at"}
            if unknown:
                raise ConfigError(f"auth token of tenant {tenant!r}: unknown keys {unknown}")
            raw, when = item.get("sha256"), item.get("expires_at")
            if when is not None:
                try:
                    expires = datetime.fromisoformat(str(when))
                except ValueError as exc:
                    raise ConfigError(
                        f"auth token of tenant {tenant!r}: expires_at {when!r} is not RFC 3339"
                    ) from exc
                if expires.tzinfo is None:
                    raise ConfigError(
                        f"auth token of tenant {tenant!r}: expires_at {when!r} needs a time zone"
                    )
        else:
            raw = item
        digest = str(raw or "").strip().lower()
        if len(digest) != 64 or not set(digest) <= _HEX:
            raise ConfigError(f"auth token of tenant {tenant!r} is not a sha256 hex digest")
        out.append((digest, expires))
    return out


def peer_address(peer: str) -> str:
    """The address part of gRPC's peer string: 'ipv4:10.0.0.7:53122' -> 'ipv4:10.0.0.7',
    'ipv6:[::1]:5000' -> 'ipv6:[::1]' (the port changes with every connection)."""
    kind, _, rest = peer.partition(":")
    if kind in ("ipv4", "ipv6"):
        return f"{kind}:{rest.rpartition(':')[0]}"
    return peer


class PeerThrottle:
    """Counts authentication failures per peer address; after `max_failures` within
    `window_s`, the peer's calls are refused for `block_s` (before any credential is looked
    at). Remembers at most `max_peers` addresses (the oldest are forgotten)."""

    def __init__(
        self,
        max_failures: int,
        window_s: float,
        block_s: float,
        *,
        max_peers: int = 10_000,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self._max = max_failures
        self._window = window_s
        self._block = block_s
        self._max_peers = max_peers
        self._clock = clock
        #: address -> (window start, failures in it, blocked until)
        self._peers: OrderedDict[str, tuple[float, int, float]] = OrderedDict()
        self._lock = threading.Lock()

    def check(self, address: str) -> None:
        """AuthThrottledError while `address` is blocked."""
        with self._lock:
            state = self._peers.get(address)
            if state is None:
                return
            now = self._clock()
            if state[2] > now:
                raise AuthThrottledError(
                    "too many failed authentications from this peer",
                    retry_after_ms=max(1, int((state[2] - now) * 1000)),
                    reason="auth_throttled",
                )

    def failed(self, address: str) -> bool:
        """Count one failure; True when it blocks the peer."""
        now = self._clock()
        with self._lock:
            start, count, until = self._peers.pop(address, (now, 0, 0.0))
            if now - start > self._window:
                start, count = now, 0
            count += 1
            blocked = count >= self._max
            if blocked:
                until, start, count = now + self._block, now, 0
            self._peers[address] = (start, count, until)
            while len(self._peers) > self._max_peers:
                self._peers.popitem(last=False)
            return blocked


class AuthMetrics:
    """`ragstream_retrieve_auth_failures_total`, `ragstream_retrieve_credential_reloads_total`."""

    def __init__(self, registry: CollectorRegistry) -> None:
        self.failures = Counter(
            "ragstream_retrieve_auth_failures",
            "Retrieve calls refused by authentication, by reason (missing, malformed, unknown, "
            "expired, throttled: the peer failed too often and is blocked for a while).",
            ["reason"],
            registry=registry,
        )
        for reason in AUTH_FAILURE_REASONS:
            self.failures.labels(reason)
        self.blocked = Counter(
            "ragstream_retrieve_auth_blocked_peers",
            "Times a peer address was blocked after repeated authentication failures.",
            registry=registry,
        )
        self.reloads = Counter(
            "ragstream_retrieve_config_reloads",
            "Reloads of the credentials and the quotas, by source (credentials, quotas) and "
            "outcome (ok; error: the previous ones stay in force).",
            ["source", "outcome"],
            registry=registry,
        )
        for source in RELOAD_SOURCES:
            for outcome in ("ok", "error"):
                self.reloads.labels(source, outcome)
        self.reload_ok = Gauge(
            "ragstream_retrieve_config_reload_ok",
            "1 when the last reload of the source (credentials, quotas) succeeded, 0 while its "
            "file is unusable and the previous values stay in force.",
            ["source"],
            registry=registry,
            multiprocess_mode="min",
        )
        self.reload_ok.labels("credentials").set(1)

    def reloaded(self, source: str, ok: bool) -> None:
        """Count one reload of `source` and note its outcome."""
        self.reloads.labels(source, "ok" if ok else "error").inc()
        self.reload_ok.labels(source).set(1 if ok else 0)


class Authenticator:
    """Maps a caller to its tenant: `authorization: Bearer <token>` or an mTLS identity."""

    def __init__(
        self,
        settings: AuthSettings,
        registry: CollectorRegistry | None = None,
        *,
        now: Callable[[], datetime] = lambda: datetime.now(UTC),
    ) -> None:
        self._settings = settings
        self._credentials = Credentials.load(settings)
        self._now = now
        self.throttle = PeerThrottle(
            settings.max_failures, settings.failure_window_s, settings.block_s
        )
        self.metrics = AuthMetrics(registry if registry is not None else CollectorRegistry())

    @property
    def settings(self) -> AuthSettings:
        """Where the credentials come from."""
        return self._settings

    @property
    def credentials(self) -> Credentials:
        """The snapshot in force."""
        return self._credentials

    def reload(self) -> bool:
        """Read the credentials again; on a ConfigError keep those in force (logged, counted).
        True when the new ones are in force."""
        try:
            fresh = Credentials.load(self._settings)
        except ConfigError as exc:
            self.metrics.reloaded("credentials", ok=False)
            log.error("credentials not reloaded, the previous ones stay in force: %s", exc)
            return False
        self.metrics.reloaded("credentials", ok=True)
        if fresh != self._credentials:
            log.info("credentials reloaded: %s", fresh.summary())
        self._credentials = fresh
        return True

    def tenant_of(self, context: grpc.aio.ServicerContext[Any, Any]) -> str:
        """The caller's tenant; AuthenticationError when it has none, AuthThrottledError
        while its peer address is blocked."""
        address = peer_address(context.peer() or "")
        try:
            self.throttle.check(address)
        except AuthThrottledError:
            self.metrics.failures.labels("throttled").inc()
            raise
        try:
            return self._tenant(context)
        except AuthenticationError as exc:
            self.metrics.failures.labels(exc.reason).inc()
            if self.throttle.failed(address):
                self.metrics.blocked.inc()
                log.warning(
                    "peer %s blocked for %g s after %d failed authentications",
                    address,
                    self._settings.block_s,
                    self._settings.max_failures,
                )
            raise

    def _tenant(self, context: grpc.aio.ServicerContext[Any, Any]) -> str:
        credentials = self._credentials
        metadata = {k: v for k, v in (context.invocation_metadata() or ()) if isinstance(v, str)}
        header = metadata.get("authorization")
        if header is not None:
            scheme, _, token = header.partition(" ")
            if scheme.lower() != "bearer" or not token.strip():
                raise AuthenticationError(
                    "authorization must be 'Bearer <token>'", reason="malformed"
                )
            digest = hashlib.sha256(token.strip().encode()).hexdigest()
            found = credentials.tokens.get(digest)
            if found is None:
                raise AuthenticationError("unknown API token", reason="unknown")
            if found.expires_at is not None and found.expires_at <= self._now():
                raise AuthenticationError("expired API token", reason="expired")
            return found.tenant
        names = context.auth_context().get("x509_common_name", [])
        for name in names:
            tenant = credentials.mtls.get(name.decode(errors="replace"))
            if tenant is not None:
                return tenant
        if names:
            raise AuthenticationError("client certificate not mapped to a tenant")
        raise AuthenticationError(
            "no credentials: send 'authorization: Bearer <token>' or a client certificate",
            reason="missing",
        )
