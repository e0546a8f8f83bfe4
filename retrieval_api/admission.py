"""Per-tenant admission of Retrieve calls: fair shedding under overload.

Every authenticated call asks `TenantAdmission.admitted(tenant)` for a slot before it is
validated and before the pipeline runs. A call is refused (`OverloadedError`, gRPC
RESOURCE_EXHAUSTED with a retry hint) when

1. its tenant's token bucket is empty (`requests_per_s`, `burst`), or
2. its tenant already has `concurrency` calls in flight, or
3. the process already runs `max_in_flight` calls *and* the tenant holds at least its fair
   share of them (`max_in_flight` / tenants with calls in flight).

Rule 3 is what keeps a quiet tenant's latency while another floods: a tenant under its fair
share is admitted even at the global cap, so the cap is soft by at most the fair shares of the
tenants under it (total in flight stays below 2 x `max_in_flight`). A flooding tenant is bound
by its own quota first, so one flood never takes the whole cap.

A refused call costs the server about what gRPC's own handling of any call costs (0.7-1.9 ms
of CPU on the aio server here, most of it in grpc), and a client that ignores the retry
hints repeats it as fast as it is answered: 300 client threads made ~2,000 refused calls/s, and
the server's one event loop spent its time answering them (issue 41). So a tenant that keeps
calling inside the retry hints it was given gets its refusals answered late (an asyncio sleep:
no thread, no pipeline), which holds each of its client's callers that long. The delay is the
tenant's waiting refusals / `defer_refusals_per_s`, between `defer_s` and `defer_max_s`, so C
callers make about `defer_refusals_per_s` refused calls per second (never more than
C / `defer_s`, never fewer than C / `defer_max_s`) instead of as many as the server answers.

Who ignores the hints: each refusal's hint is a promise to stay away until it ends. A caller
that honours its hints holds at most one unexpired hint, so a client with C such callers holds
at most C, while a caller ignoring them piles up one per round trip. A tenant holding
`defer_grace` (16) unexpired hints has all its refusals deferred until every hint it was given
has run out. A client that waits out its hints is never deferred, unless it has more than
`defer_grace` callers refused at once. Deferred refusals are bounded per tenant and in total
(`defer_max_per_tenant`, `defer_max_total`; beyond, they are answered at once).

State is per server process (docs/decisions/tenant-fairness.md: with N processes on one port a
tenant's service-wide limit lies between 1x and Nx the figures, depending on how many
connections it spreads over the processes). The quotas reload from `quotas_file` without a
restart (`reload`). Metrics are labelled by tenant *class* (from the quota), never by tenant:
the tenants refused most are named in a periodic log line instead (`top_offenders`).
"""

from __future__ import annotations

import asyncio
import heapq
import json
import logging
import math
import random as _random
import threading
import time
from collections import Counter
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator, Mapping
from contextlib import asynccontextmanager, contextmanager
from dataclasses import dataclass, field
from pathlib import Path

from prometheus_client import CollectorRegistry, Gauge
from prometheus_client import Counter as PromCounter
from pydantic import BaseModel, ConfigDict, Field, ValidationError, model_validator

from ragcore.errors import ConfigError, RagstreamError

__all__ = [
    "AdmissionSettings",
    "OverloadedError",
    "QuotaBook",
    "TenantAdmission",
    "TenantQuota",
    "load_quotas",
]

log = logging.getLogger(__name__)

#: gRPC's standard server pushback trailer (gRPC retry design A6: a client retry policy that
#: lists RESOURCE_EXHAUSTED waits this long), and its plain-named twin for other clients.
PUSHBACK_KEY = "grpc-retry-pushback-ms"
RETRY_AFTER_KEY = "retry-after-ms"
DEFAULT_CLASS = "default"


class OverloadedError(RagstreamError):
    """The call was shed: the tenant's quota or the server's capacity is used up."""

    code = "RESOURCE_EXHAUSTED"

    def __init__(
        self, message: str, *, retry_after_ms: int, reason: str, defer_s: float = 0.0
    ) -> None:
        super().__init__(message)
        self.retry_after_ms = retry_after_ms
        self.reason = reason
        #: how long the answer is held back (the tenant called inside its retry hint; 0: not)
        self.defer_s = defer_s

    def trailers(self) -> tuple[tuple[str, str], ...]:
        """The retry hint as trailing metadata."""
        ms = str(self.retry_after_ms)
        return ((PUSHBACK_KEY, ms), (RETRY_AFTER_KEY, ms))


class TenantQuota(BaseModel):
    """What one tenant may use of one server process (None: no limit of that kind)."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    requests_per_s: float | None = Field(
        default=None, gt=0, description="Sustained calls per second (token bucket)."
    )
    burst: int | None = Field(
        default=None, ge=1, description="Bucket size; default: requests_per_s rounded up."
    )
    concurrency: int | None = Field(
        default=8,
        ge=1,
        description="Calls in flight (null: only the global cap applies). The default keeps "
        "one tenant to a quarter of max_in_flight.",
    )
    tenant_class: str = Field(
        default=DEFAULT_CLASS,
        pattern=r"^[a-z][a-z0-9_]{0,31}$",
        description="Metrics label of the tenant's calls (bounded cardinality).",
    )

    @property
    def bucket(self) -> float:
        """The token bucket's size."""
        if self.requests_per_s is None:
            return math.inf
        return float(self.burst or math.ceil(self.requests_per_s))


class QuotaBook(BaseModel):
    """Quotas per tenant, with a default for every other tenant."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    default: TenantQuota = Field(
        default_factory=TenantQuota, description="Quota of every tenant not listed in `tenants`."
    )
    tenants: dict[str, TenantQuota] = Field(default_factory=dict)

    def of(self, tenant: str) -> TenantQuota:
        """The tenant's quota."""
        return self.tenants.get(tenant, self.default)

    def classes(self) -> set[str]:
        """Every tenant class the book names."""
        return {self.default.tenant_class, *(q.tenant_class for q in self.tenants.values())}


class AdmissionSettings(BaseModel):
    """Fair shedding of Retrieve calls per tenant (docs/decisions/tenant-fairness.md)."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    enabled: bool = Field(default=True, description="Off: every call is admitted.")
    max_in_flight: int = Field(
        default=32,
        ge=1,
        description="Calls in the pipeline at once per server process; a tenant under its "
        "fair share (this / tenants with calls in flight) is admitted even above it.",
    )
    quotas: QuotaBook = Field(
        default_factory=QuotaBook,
        description='Per-tenant quotas: {"default": {...}, "tenants": {tenant: {...}}}, '
        "each with requests_per_s, burst, concurrency, tenant_class.",
    )
    quotas_file: Path | None = Field(
        default=None,
        description="JSON file with the same shape as `quotas` (its tenants override); "
        "reloaded without a restart when it changes (and on SIGHUP).",
    )
    offenders_log_interval_s: float = Field(
        default=60.0, gt=0, description="How often the most refused tenants are logged."
    )
    defer_s: float = Field(
        default=1.0,
        ge=0,
        le=60,
        description="Shortest delay before a refusal is answered when its tenant calls inside "
        "the retry hint it was given (0: every refusal is answered at once). The delay is "
        "spread over 0.5-1.5x, holds no thread, and is capped by the call's deadline.",
    )
    defer_max_s: float = Field(
        default=10.0,
        gt=0,
        le=300,
        description="Longest delay of a deferred refusal (before the spread).",
    )
    defer_refusals_per_s: float = Field(
        default=20.0,
        gt=0,
        description="Refused calls per second a tenant calling inside its hints is held to: "
        "each deferred refusal waits its tenant's waiting refusals / this (between defer_s "
        "and defer_max_s), so C callers that ignore the hints make about this many refused "
        "calls per second (never more than C / defer_s, never fewer than C / defer_max_s).",
    )
    defer_grace: int = Field(
        default=16,
        ge=1,
        description="Unexpired retry hints a tenant may hold before its refusals are deferred "
        "(until every hint it was given has run out): a client whose callers honour their "
        "hints never holds more than it has callers refused at once; one that ignores them "
        "piles up one per round trip, and is caught once it makes defer_grace refused calls "
        "within one hint.",
    )
    defer_max_per_tenant: int = Field(
        default=512,
        ge=0,
        description="Deferred refusals one tenant may have waiting; beyond, its refusals are "
        "answered at once.",
    )
    defer_max_total: int = Field(
        default=768,
        ge=0,
        description="Deferred refusals waiting in one server process (each holds a gRPC call, "
        "about 30 KiB); with 2 x max_in_flight it must fit under grpc.max_concurrent_rpcs, "
        "which counts them too.",
    )

    @model_validator(mode="after")
    def _delays_in_order(self) -> AdmissionSettings:
        if self.defer_max_s < self.defer_s:
            raise ValueError(
                f"defer_max_s ({self.defer_max_s:g}) must not be below defer_s ({self.defer_s:g})"
            )
        return self


def load_quotas(settings: AdmissionSettings) -> QuotaBook:
    """The quotas of `settings`, with `quotas_file` (when set) read now: its default replaces
    the settings' one and its tenants are added. ConfigError when the file is unusable."""
    book = settings.quotas
    if settings.quotas_file is None:
        return book
    path = settings.quotas_file
    try:
        raw = json.loads(path.read_text(encoding="utf-8"))
        loaded = QuotaBook.model_validate(raw)
    except OSError as exc:
        raise ConfigError(f"cannot read the quotas file {path}: {exc}") from exc
    except (json.JSONDecodeError, ValidationError) as exc:
        raise ConfigError(f"the quotas file {path} is not valid: {exc}") from exc
    default = loaded.default if "default" in raw else book.default
    return QuotaBook(default=default, tenants={**book.tenants, **loaded.tenants})


@dataclass
class _Tenant:
    """One tenant's live state."""

    tokens: float
    refilled: float
    in_flight: int = 0
    #: smoothed duration of its admitted calls (s): the hint for a concurrency refusal
    mean_s: float = 0.05
    #: ends of the unexpired retry hints it was given (a heap; at most defer_grace long)
    hints: list[float] = field(default_factory=list)
    #: end of the last of them
    hint_until: float = -math.inf
    #: holding defer_grace unexpired hints, it is taken for a client ignoring them: its
    #: refusals are deferred until `hint_until`
    flooding: bool = False
    #: deferred refusals waiting now
    deferred: int = 0


@dataclass
class _Window:
    """Refusals per tenant since the last offenders line."""

    started: float
    refused: Counter[str] = field(default_factory=Counter)


class AdmissionMetrics:
    """`ragstream_retrieve_admission_total`, `ragstream_retrieve_in_flight` and the deferred
    refusals (`ragstream_retrieve_deferred_refusals_total`, `..._waiting`)."""

    def __init__(self, registry: CollectorRegistry) -> None:
        self.decisions = PromCounter(
            "ragstream_retrieve_admission",
            "Retrieve calls admitted or refused by per-tenant admission, by tenant class and "
            "outcome (admitted, rate, concurrency, overload).",
            ["tenant_class", "outcome"],
            registry=registry,
        )
        self.in_flight = Gauge(
            "ragstream_retrieve_in_flight",
            "Admitted Retrieve calls in the pipeline, by tenant class.",
            ["tenant_class"],
            registry=registry,
            multiprocess_mode="livesum",
        )
        self.deferrals = PromCounter(
            "ragstream_retrieve_deferred_refusals",
            "Refusals of a tenant calling inside the retry hint it was given, by tenant class "
            "and outcome (deferred: answered after admission.defer_s; bound: answered at once, "
            "the deferral bounds were reached).",
            ["tenant_class", "outcome"],
            registry=registry,
        )
        self.deferred_waiting = Gauge(
            "ragstream_retrieve_deferred_refusals_waiting",
            "Deferred refusals waiting to be answered, by tenant class.",
            ["tenant_class"],
            registry=registry,
            multiprocess_mode="livesum",
        )


class TenantAdmission:
    """Admission state of one server process (see the module docstring)."""

    def __init__(
        self,
        settings: AdmissionSettings,
        registry: CollectorRegistry,
        *,
        clock: Callable[[], float] = time.monotonic,
        sleep: Callable[[float], Awaitable[None]] = asyncio.sleep,
        random: Callable[[], float] = _random.random,
    ) -> None:
        self._settings = settings
        self._book = load_quotas(settings)
        self._clock = clock
        self._sleep = sleep
        self._random = random
        self._tenants: dict[str, _Tenant] = {}
        self._total = 0
        self._deferred = 0
        self._lock = threading.Lock()
        self._window = _Window(clock())
        self.metrics = AdmissionMetrics(registry)
        for name in self._book.classes():
            self.metrics.in_flight.labels(name).set(0)
            self.metrics.deferred_waiting.labels(name).set(0)

    @property
    def settings(self) -> AdmissionSettings:
        """The admission settings (where the quotas come from)."""
        return self._settings

    @property
    def quotas(self) -> QuotaBook:
        """The quotas in force."""
        return self._book

    def reload(self) -> None:
        """Read the quotas again (settings + `quotas_file`); ConfigError leaves the quotas in
        force unchanged. Live counts (in flight, bucket levels) carry over."""
        book = load_quotas(self._settings)
        with self._lock:
            self._book = book
            for tenant, state in self._tenants.items():
                state.tokens = min(state.tokens, book.of(tenant).bucket)

    def tenant_class(self, tenant: str) -> str:
        """The tenant's class (the metrics label of what concerns it), from the quotas in
        force."""
        return self._book.of(tenant).tenant_class

    def deferred(self, tenant: str | None = None) -> int:
        """Deferred refusals waiting (of one tenant, or in total)."""
        with self._lock:
            if tenant is None:
                return self._deferred
            state = self._tenants.get(tenant)
            return state.deferred if state else 0

    def in_flight(self, tenant: str | None = None) -> int:
        """Calls in flight (of one tenant, or in total)."""
        with self._lock:
            if tenant is None:
                return self._total
            state = self._tenants.get(tenant)
            return state.in_flight if state else 0

    @contextmanager
    def admit(self, tenant: str) -> Iterator[None]:
        """Hold a slot for the duration of the block; OverloadedError when refused (at once:
        deferral needs `admitted`)."""
        if not self._settings.enabled:
            yield
            return
        quota = self._take(tenant, defer=False)
        began = self._clock()
        try:
            yield
        finally:
            self._give_back(tenant, quota, self._clock() - began)

    @asynccontextmanager
    async def admitted(
        self, tenant: str, *, time_remaining_s: float | None = None
    ) -> AsyncIterator[None]:
        """`admit` for the aio server: hold a slot for the duration of the block, or raise
        OverloadedError; a refusal the tenant earned by calling inside its retry hints is
        raised after its delay (at most `time_remaining_s`, the call's deadline), awaited
        without a thread (module docstring)."""
        if not self._settings.enabled:
            yield
            return
        try:
            quota = self._take(tenant, defer=True, time_remaining_s=time_remaining_s)
        except OverloadedError as refusal:
            if refusal.defer_s > 0:
                await self._hold(tenant, refusal.defer_s)
            raise
        began = self._clock()
        try:
            yield
        finally:
            self._give_back(tenant, quota, self._clock() - began)

    async def _hold(self, tenant: str, delay_s: float) -> None:
        """Wait out a deferred refusal, then free its place (also when the call is cancelled:
        its deadline passed or its client went away)."""
        tenant_class = self._book.of(tenant).tenant_class
        self.metrics.deferred_waiting.labels(tenant_class).inc()
        try:
            await self._sleep(delay_s)
        finally:
            with self._lock:
                self._tenants[tenant].deferred -= 1
                self._deferred -= 1
            self.metrics.deferred_waiting.labels(tenant_class).dec()

    def _take(
        self, tenant: str, *, defer: bool, time_remaining_s: float | None = None
    ) -> TenantQuota:
        now = self._clock()
        with self._lock:
            quota = self._book.of(tenant)
            state = self._tenants.get(tenant)
            if state is None:
                state = self._tenants[tenant] = _Tenant(tokens=quota.bucket, refilled=now)
            refusal = self._refusal(tenant, quota, state, now)
            if refusal is not None:
                self.metrics.decisions.labels(quota.tenant_class, refusal.reason).inc()
                self._window.refused[tenant] += 1
                outcome = self._deferral(state, refusal, now, time_remaining_s) if defer else None
                if outcome is not None:
                    self.metrics.deferrals.labels(quota.tenant_class, outcome).inc()
                raise refusal
            if quota.requests_per_s is not None:
                state.tokens -= 1
            state.in_flight += 1
            self._total += 1
        self.metrics.decisions.labels(quota.tenant_class, "admitted").inc()
        self.metrics.in_flight.labels(quota.tenant_class).inc()
        return quota

    def _refusal(
        self, tenant: str, quota: TenantQuota, state: _Tenant, now: float
    ) -> OverloadedError | None:
        if quota.requests_per_s is not None:
            state.tokens = min(
                quota.bucket, state.tokens + (now - state.refilled) * quota.requests_per_s
            )
            state.refilled = now
            if state.tokens < 1 - 1e-9:  # float residue of the refill is not a refusal
                wait = (1 - state.tokens) / quota.requests_per_s
                return OverloadedError(
                    f"tenant {tenant!r} is over its rate of {quota.requests_per_s:g} calls/s",
                    retry_after_ms=_ms(wait),
                    reason="rate",
                )
        if quota.concurrency is not None and state.in_flight >= quota.concurrency:
            return OverloadedError(
                f"tenant {tenant!r} already has {state.in_flight} calls in flight "
                f"(its limit is {quota.concurrency})",
                retry_after_ms=_ms(state.mean_s),
                reason="concurrency",
            )
        cap = self._settings.max_in_flight
        if self._total >= cap:
            active = sum(1 for s in self._tenants.values() if s.in_flight > 0)
            if state.in_flight == 0:
                active += 1
            if state.in_flight >= max(1, cap // active):
                return OverloadedError(
                    f"the server is at capacity ({self._total} calls in flight) and tenant "
                    f"{tenant!r} holds its fair share of them",
                    retry_after_ms=_ms(state.mean_s),
                    reason="overload",
                )
        return None

    def _deferral(
        self,
        state: _Tenant,
        refusal: OverloadedError,
        now: float,
        time_remaining_s: float | None,
    ) -> str | None:
        """Whether `refusal` is deferred (sets its `defer_s`, takes a place): None when it is
        answered at once, else the outcome for the metric (deferred, or bound when the places
        are taken). The caller holds the lock.

        Each refusal's hint is a promise to stay away until it ends. A caller honouring its
        hints holds at most one unexpired hint (it calls again only after it), so a client
        with C such callers holds at most C; a caller that ignores them piles up one per round
        trip. A tenant holding `defer_grace` unexpired hints is taken for one ignoring them:
        all its refusals are then deferred until every hint it was given has run out (counted
        from the answer: a deferred caller that calls again at once is still inside)."""
        hint_s = refusal.retry_after_ms / 1000
        s = self._settings
        if state.flooding and now >= state.hint_until:
            state.flooding = False  # it stayed away for every hint it was given
        if not state.flooding:
            while state.hints and state.hints[0] <= now:
                heapq.heappop(state.hints)
            if s.defer_s > 0 and len(state.hints) >= s.defer_grace:
                state.flooding = True
                state.hints.clear()  # only the end of the last hint matters from here on
        if not state.flooding:
            heapq.heappush(state.hints, now + hint_s)
            state.hint_until = max(state.hint_until, now + hint_s)
            return None
        if state.deferred >= s.defer_max_per_tenant or self._deferred >= s.defer_max_total:
            state.hint_until = max(state.hint_until, now + hint_s)
            return "bound"
        # the tenant's waiting refusals / the rate it is held to: its refused calls come back
        # at about that rate however many callers it has (within defer_s..defer_max_s)
        delay = min(s.defer_max_s, max(s.defer_s, (state.deferred + 1) / s.defer_refusals_per_s))
        # spread over 0.5-1.5x: callers answered together would come back together
        delay *= 0.5 + self._random()
        if time_remaining_s is not None:
            delay = min(delay, time_remaining_s)
        if delay <= 0:  # its deadline has passed: nothing to hold
            state.hint_until = max(state.hint_until, now + hint_s)
            return None
        state.hint_until = max(state.hint_until, now + delay + hint_s)
        state.deferred += 1
        self._deferred += 1
        refusal.defer_s = delay
        return "deferred"

    def _give_back(self, tenant: str, quota: TenantQuota, seconds: float) -> None:
        with self._lock:
            state = self._tenants[tenant]
            state.in_flight -= 1
            self._total -= 1
            state.mean_s += 0.2 * (seconds - state.mean_s)
        self.metrics.in_flight.labels(quota.tenant_class).dec()

    def top_offenders(self, n: int = 5) -> tuple[float, list[tuple[str, int]]]:
        """The tenants refused most since the last call (and the window's length in s);
        starts a new window."""
        now = self._clock()
        with self._lock:
            window, self._window = self._window, _Window(now)
        return now - window.started, window.refused.most_common(n)

    def log_offenders(self) -> None:
        """One log line naming the tenants refused most in the last window (none: silent)."""
        seconds, top = self.top_offenders()
        if top:
            names = ", ".join(f"{tenant} ({count})" for tenant, count in top)
            log.warning("Retrieve calls refused in the last %.0f s, most: %s", seconds, names)


def _ms(seconds: float) -> int:
    """A retry hint in whole milliseconds, at least 1."""
    return max(1, math.ceil(seconds * 1000))


def quota_summary(book: QuotaBook) -> Mapping[str, object]:
    """How many tenants have their own quota, per class (for the reload log line)."""
    return dict(Counter(q.tenant_class for q in book.tenants.values()))
