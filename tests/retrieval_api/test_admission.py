"""Per-tenant admission: token buckets, concurrency quotas, fair share at the global cap,
retry hints, reloads, deferred refusals of tenants calling inside their retry hint, and
metrics by tenant class (a fake clock and a fake sleep, no server)."""

from __future__ import annotations

import asyncio
import heapq
import itertools
import json
import logging
from collections import Counter
from contextlib import ExitStack
from pathlib import Path

import pytest
from prometheus_client import CollectorRegistry
from pydantic import ValidationError

from ragcore.errors import ConfigError
from retrieval_api.admission import (
    AdmissionSettings,
    OverloadedError,
    QuotaBook,
    TenantAdmission,
    TenantQuota,
)
from retrieval_api.settings import GrpcSettings, RetrieveSettings

pytestmark = pytest.mark.unit


class Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def admission(
    registry: CollectorRegistry | None = None, clock: Clock | None = None, **fields: object
) -> TenantAdmission:
    return TenantAdmission(
        AdmissionSettings.model_validate(fields),
        registry or CollectorRegistry(),
        clock=clock or Clock(),
    )


def test_a_tenant_over_its_rate_is_refused_with_the_time_until_its_next_token() -> None:
    clock = Clock()
    quotas = QuotaBook(default=TenantQuota(requests_per_s=10, burst=2))
    gate = admission(clock=clock, quotas=quotas)
    for _ in range(2):
        with gate.admit("acme"):
            pass
    with pytest.raises(OverloadedError) as err, gate.admit("acme"):
        pass
    assert err.value.reason == "rate"
    assert err.value.retry_after_ms == 100  # one token per 100 ms
    assert ("grpc-retry-pushback-ms", "100") in err.value.trailers()
    clock.now += 0.1
    with gate.admit("acme"):  # refilled
        pass
    with gate.admit("globex"):  # another tenant has a bucket of its own
        pass


def test_a_tenant_at_its_concurrency_is_refused_while_others_are_admitted() -> None:
    gate = admission(quotas=QuotaBook(default=TenantQuota(concurrency=2)))
    with ExitStack() as held:
        held.enter_context(gate.admit("acme"))
        held.enter_context(gate.admit("acme"))
        with pytest.raises(OverloadedError) as err, gate.admit("acme"):
            pass
        assert err.value.reason == "concurrency"
        assert err.value.retry_after_ms >= 1
        with gate.admit("globex"):
            assert gate.in_flight() == 3
    assert gate.in_flight("acme") == 0
    with gate.admit("acme"):
        pass


def test_at_the_global_cap_only_tenants_under_their_fair_share_are_admitted() -> None:
    gate = admission(max_in_flight=4, quotas=QuotaBook(default=TenantQuota(concurrency=None)))
    with ExitStack() as held:
        for _ in range(4):
            held.enter_context(gate.admit("acme"))
        with pytest.raises(OverloadedError) as err, gate.admit("acme"):
            pass
        assert err.value.reason == "overload"
        # globex holds nothing: its fair share is 4 / 2 tenants = 2, so two calls pass the cap
        held.enter_context(gate.admit("globex"))
        held.enter_context(gate.admit("globex"))
        with pytest.raises(OverloadedError), gate.admit("globex"):
            pass
        assert gate.in_flight() == 6  # soft by the fair share of the tenant under it


def test_per_tenant_quota_overrides_the_default_and_a_failed_call_frees_its_slot() -> None:
    quotas = QuotaBook(
        default=TenantQuota(concurrency=1),
        tenants={"bigco": TenantQuota(concurrency=3, tenant_class="premium")},
    )
    gate = admission(quotas=quotas)
    with ExitStack() as held:
        for _ in range(3):
            held.enter_context(gate.admit("bigco"))
        held.enter_context(gate.admit("small"))
        with pytest.raises(OverloadedError), gate.admit("small"):
            pass
    with pytest.raises(RuntimeError), gate.admit("small"):
        raise RuntimeError("the pipeline failed")
    assert gate.in_flight("small") == 0


def test_metrics_count_by_tenant_class_not_by_tenant() -> None:
    registry = CollectorRegistry()
    quotas = QuotaBook(
        default=TenantQuota(concurrency=1),
        tenants={"bigco": TenantQuota(concurrency=1, tenant_class="premium")},
    )
    gate = admission(registry, quotas=quotas)
    for tenant in ("bigco", "t1", "t2"):
        with gate.admit(tenant):
            with pytest.raises(OverloadedError), gate.admit(tenant):
                pass
            sample = registry.get_sample_value
            cls = "premium" if tenant == "bigco" else "default"
            assert sample("ragstream_retrieve_in_flight", {"tenant_class": cls}) == 1

    def decisions(tenant_class: str, outcome: str) -> float | None:
        labels = {"tenant_class": tenant_class, "outcome": outcome}
        return registry.get_sample_value("ragstream_retrieve_admission_total", labels)

    assert decisions("default", "admitted") == 2
    assert decisions("default", "concurrency") == 2
    assert decisions("premium", "concurrency") == 1
    labels = {
        s.labels.get("tenant_class") for f in registry.collect() for s in f.samples if s.labels
    }
    assert labels == {"default", "premium"}


def test_top_offenders_are_named_in_the_log_and_the_window_restarts(
    caplog: pytest.LogCaptureFixture,
) -> None:
    gate = admission(quotas=QuotaBook(default=TenantQuota(requests_per_s=1, burst=1)))
    for tenant, calls in (("acme", 5), ("globex", 2)):
        for _ in range(calls):
            try:
                with gate.admit(tenant):
                    pass
            except OverloadedError:
                pass
    with caplog.at_level(logging.WARNING, logger="retrieval_api.admission"):
        gate.log_offenders()
        gate.log_offenders()  # nothing refused since: no second line
    lines = [r.getMessage() for r in caplog.records]
    assert len(lines) == 1 and "acme (4), globex (1)" in lines[0]


def test_quotas_reload_from_the_file_and_a_broken_file_keeps_the_old_ones(tmp_path: Path) -> None:
    path = tmp_path / "quotas.json"
    path.write_text(json.dumps({"tenants": {"acme": {"concurrency": 1}}}))
    gate = admission(quotas_file=path, quotas={"default": {"concurrency": 5}})
    assert gate.quotas.of("acme").concurrency == 1
    assert gate.quotas.of("other").concurrency == 5  # the file has no default: the settings'
    with gate.admit("acme"):
        with pytest.raises(OverloadedError), gate.admit("acme"):
            pass
        path.write_text(json.dumps({"tenants": {"acme": {"concurrency": 2}}}))
        gate.reload()
        with gate.admit("acme"):  # the new quota applies to calls already in flight
            pass
    path.write_text("{not json")
    with pytest.raises(ConfigError, match="quotas file"):
        gate.reload()
    assert gate.quotas.of("acme").concurrency == 2
    path.write_text(json.dumps({"tenants": {"acme": {"concurency": 2}}}))
    with pytest.raises(ConfigError, match="concurency"):
        gate.reload()


def test_disabled_admission_admits_everything() -> None:
    gate = admission(enabled=False, quotas=QuotaBook(default=TenantQuota(concurrency=1)))
    with gate.admit("acme"), gate.admit("acme"):
        pass


class Sleeps:
    """A fake `asyncio.sleep`: records each delay and advances the fake clock by it."""

    def __init__(self, clock: Clock) -> None:
        self.clock = clock
        self.delays: list[float] = []

    async def __call__(self, delay: float) -> None:
        self.delays.append(delay)
        self.clock.now += delay


def deferring(
    registry: CollectorRegistry | None = None, **fields: object
) -> tuple[TenantAdmission, Clock, Sleeps]:
    clock = Clock()
    sleeps = Sleeps(clock)
    gate = TenantAdmission(
        AdmissionSettings.model_validate(fields),
        registry or CollectorRegistry(),
        clock=clock,
        sleep=sleeps,
        random=lambda: 0.5,  # the middle of the spread: exactly defer_s
    )
    return gate, clock, sleeps


async def call(gate: TenantAdmission, tenant: str, **kwargs: float | None) -> str:
    """One call through `admitted`: 'ok' or the refusal's reason."""
    try:
        async with gate.admitted(tenant, **kwargs):
            return "ok"
    except OverloadedError as err:
        return err.reason


RATE_1 = QuotaBook(default=TenantQuota(requests_per_s=1, burst=1))  # hint: the next token, 1 s


def test_a_tenant_calling_inside_its_retry_hint_has_its_refusals_answered_late() -> None:
    gate, clock, sleeps = deferring(quotas=RATE_1, defer_s=2.0, defer_grace=1)

    async def scenario() -> list[str]:
        got = [await call(gate, "acme")]  # the token
        got.append(await call(gate, "acme"))  # refused at once: it opens the hint window
        assert sleeps.delays == []
        got.append(await call(gate, "acme"))  # inside the hint it was given: deferred
        return got

    assert asyncio.run(scenario()) == ["ok", "rate", "rate"]
    assert sleeps.delays == [2.0]
    assert clock.now == 102.0 and gate.deferred() == 0  # its place is free again


def test_a_client_that_waits_out_the_hint_is_never_deferred() -> None:
    gate, clock, sleeps = deferring(quotas=RATE_1, defer_s=2.0, defer_grace=1)

    async def honest() -> list[str]:
        got = []
        for _ in range(6):
            try:
                async with gate.admitted("acme"):
                    got.append("ok")
            except OverloadedError as err:
                got.append(err.reason)
                clock.now += err.retry_after_ms / 1000  # waits exactly the hint
            else:
                clock.now += 0.3  # and calls again soon after an answer
        return got

    assert asyncio.run(honest()) == ["ok", "rate", "ok", "rate", "ok", "rate"]
    assert sleeps.delays == []


def test_the_grace_lets_several_callers_honouring_their_own_hints_through() -> None:
    # four callers refused a little apart inside one hint: with a grace of 4, none is deferred
    gate, clock, sleeps = deferring(
        quotas=QuotaBook(default=TenantQuota(concurrency=1)), defer_s=1.0, defer_grace=4
    )

    async def scenario() -> list[str]:
        got = []
        async with gate.admitted("acme"):  # one call in flight: the others are refused
            for _ in range(4):
                got.append(await call(gate, "acme"))
                clock.now += 0.001
            got.append(await call(gate, "acme"))  # the fifth inside the hint: deferred
        return got

    assert asyncio.run(scenario()) == ["concurrency"] * 5
    assert sleeps.delays == [1.0]


def test_past_the_grace_every_refusal_is_deferred_until_the_tenant_waits_out_a_hint() -> None:
    # a concurrency refusal's hint is the tenant's mean call duration: 50 ms at first
    gate, clock, sleeps = deferring(
        quotas=QuotaBook(default=TenantQuota(concurrency=1)), defer_s=1.0, defer_grace=2
    )

    async def scenario() -> None:
        async with gate.admitted("acme"):
            await call(gate, "acme")  # answered at once: one unexpired hint (50 ms)
            await call(gate, "acme")  # and a second: the grace is full
            # deferred, and each called again as soon as answered: its hint runs from then,
            # so it is still calling inside it
            for _ in range(3):
                await call(gate, "acme")
            assert sleeps.delays == [1.0] * 3 and clock.now == 103.0
            clock.now += 0.049  # inside the last refusal's hint: still deferred
            await call(gate, "acme")
            assert len(sleeps.delays) == 4
            clock.now += 0.051  # waited out every hint: answered at once again
            assert await call(gate, "acme") == "concurrency"
            assert await call(gate, "acme") == "concurrency"  # within the grace again
        assert len(sleeps.delays) == 4

    asyncio.run(scenario())


def test_deferrals_are_spread_around_defer_s() -> None:
    draws = iter([0.0, 0.999])
    clock = Clock()
    sleeps = Sleeps(clock)
    gate = TenantAdmission(
        AdmissionSettings(
            quotas=QuotaBook(default=TenantQuota(requests_per_s=0.1, burst=1)),
            defer_s=2.0,
            defer_grace=1,
        ),
        CollectorRegistry(),
        clock=clock,
        sleep=sleeps,
        random=lambda: next(draws),
    )

    async def scenario() -> None:
        for _ in range(4):
            await call(gate, "acme")

    asyncio.run(scenario())
    assert sleeps.delays == [1.0, pytest.approx(2.998)]  # 0.5x and ~1.5x


def test_a_tenants_delay_grows_with_its_waiting_refusals_up_to_the_longest() -> None:
    # held to 2 refused calls/s: the k-th waiting refusal waits k / 2 s, within 1..4 s
    release = asyncio.Event()
    delays: list[float] = []

    async def held(delay: float) -> None:
        delays.append(delay)
        await release.wait()

    gate = TenantAdmission(
        AdmissionSettings(
            quotas=QuotaBook(default=TenantQuota(requests_per_s=0.01, burst=1)),
            defer_s=1.0,
            defer_max_s=4.0,
            defer_refusals_per_s=2.0,
            defer_grace=1,
        ),
        CollectorRegistry(),
        clock=Clock(),
        sleep=held,
        random=lambda: 0.5,
    )

    async def scenario() -> None:
        await call(gate, "acme")
        await call(gate, "acme")  # refused at once: one unexpired hint
        callers = [asyncio.create_task(call(gate, "acme")) for _ in range(10)]
        await asyncio.sleep(0)
        release.set()
        assert await asyncio.gather(*callers) == ["rate"] * 10

    asyncio.run(scenario())
    assert delays == [1.0, 1.0, 1.5, 2.0, 2.5, 3.0, 3.5, 4.0, 4.0, 4.0]
    with pytest.raises(ValidationError, match="defer_max_s"):
        AdmissionSettings(defer_s=5.0, defer_max_s=4.0)


def test_deferral_is_capped_by_the_calls_deadline_and_off_at_zero() -> None:
    gate, _, sleeps = deferring(quotas=RATE_1, defer_s=2.0, defer_grace=1)

    async def scenario(gate: TenantAdmission) -> None:
        for _ in range(3):
            await call(gate, "acme", time_remaining_s=0.25)

    asyncio.run(scenario(gate))
    assert sleeps.delays == [0.25]
    # a call whose deadline has passed is answered at once, and holds no place
    late, _, late_sleeps = deferring(quotas=RATE_1, defer_s=2.0, defer_grace=1)

    async def past_deadline() -> None:
        for _ in range(3):
            await call(late, "acme", time_remaining_s=-0.1)

    asyncio.run(past_deadline())
    assert late_sleeps.delays == [] and late.deferred() == 0
    off, _, off_sleeps = deferring(quotas=RATE_1, defer_s=0, defer_grace=1)
    asyncio.run(scenario(off))
    assert off_sleeps.delays == [] and off.deferred() == 0


def test_deferred_refusals_are_bounded_per_tenant_and_in_total_and_counted_by_class() -> None:
    registry = CollectorRegistry()
    quotas = QuotaBook(
        default=TenantQuota(requests_per_s=1, burst=1),
        tenants={"bulkco": TenantQuota(requests_per_s=1, burst=1, tenant_class="bulk")},
    )
    release = asyncio.Event()

    async def held(_: float) -> None:
        await release.wait()  # deferred refusals stay waiting until released

    gate = TenantAdmission(
        AdmissionSettings(
            quotas=quotas, defer_s=1.0, defer_grace=1, defer_max_per_tenant=3, defer_max_total=4
        ),
        registry,
        clock=Clock(),
        sleep=held,
    )
    value = registry.get_sample_value

    async def scenario() -> dict[str, list[str]]:
        for tenant in ("bulkco", "acme"):
            assert await call(gate, tenant) == "ok"
            assert await call(gate, tenant) == "rate"  # at once: one unexpired hint
        # bulkco floods: 3 deferred (its bound), the rest answered at once
        bulk = [asyncio.create_task(call(gate, "bulkco")) for _ in range(5)]
        await asyncio.sleep(0)
        assert gate.deferred("bulkco") == 3
        # acme: one place left in total, then answered at once
        other = [asyncio.create_task(call(gate, "acme")) for _ in range(2)]
        await asyncio.sleep(0)
        assert gate.deferred("acme") == 1 and gate.deferred() == 4
        waiting = {"tenant_class": "bulk"}
        assert value("ragstream_retrieve_deferred_refusals_waiting", waiting) == 3
        release.set()
        return {
            "bulk": list(await asyncio.gather(*bulk)),
            "acme": list(await asyncio.gather(*other)),
        }

    got = asyncio.run(scenario())
    assert got == {"bulk": ["rate"] * 5, "acme": ["rate"] * 2}
    assert gate.deferred() == 0

    def deferrals(tenant_class: str, outcome: str) -> float | None:
        labels = {"tenant_class": tenant_class, "outcome": outcome}
        return value("ragstream_retrieve_deferred_refusals_total", labels)

    assert (deferrals("bulk", "deferred"), deferrals("bulk", "bound")) == (3, 2)
    assert (deferrals("default", "deferred"), deferrals("default", "bound")) == (1, 1)
    assert value("ragstream_retrieve_deferred_refusals_waiting", {"tenant_class": "bulk"}) == 0
    labels = {
        s.labels.get("tenant_class") for f in registry.collect() for s in f.samples if s.labels
    }
    assert labels == {"default", "bulk"}  # by class, never by tenant


def test_a_cancelled_deferred_refusal_frees_its_place() -> None:
    never = asyncio.Event()

    async def stuck(_: float) -> None:
        await never.wait()  # the client goes away while its refusal waits

    gate = TenantAdmission(
        AdmissionSettings(quotas=RATE_1, defer_s=1.0, defer_grace=1),
        CollectorRegistry(),
        clock=Clock(),
        sleep=stuck,
    )

    async def scenario() -> None:
        await call(gate, "acme")
        await call(gate, "acme")
        task = asyncio.create_task(call(gate, "acme"))
        await asyncio.sleep(0)
        assert gate.deferred("acme") == 1
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task

    asyncio.run(scenario())
    assert gate.deferred() == 0


def test_the_synchronous_admit_never_defers() -> None:
    gate, _, sleeps = deferring(quotas=RATE_1, defer_s=1.0, defer_grace=1)
    with gate.admit("acme"):
        pass
    for _ in range(5):
        with pytest.raises(OverloadedError) as err, gate.admit("acme"):
            pass
        assert err.value.defer_s == 0
    assert sleeps.delays == [] and gate.deferred() == 0


def test_deferred_refusals_must_leave_room_under_grpcs_hard_cap() -> None:
    with pytest.raises(ValidationError, match="max_concurrent_rpcs"):
        RetrieveSettings(grpc=GrpcSettings(max_concurrent_rpcs=800))
    RetrieveSettings(  # deferral off: no constraint
        grpc=GrpcSettings(max_concurrent_rpcs=800), admission=AdmissionSettings(defer_s=0)
    )
    RetrieveSettings(
        grpc=GrpcSettings(max_concurrent_rpcs=800),
        admission=AdmissionSettings(defer_max_total=700, max_in_flight=50),
    )


class Simulation:
    """Simulated time for asyncio tasks: `wait` resumes them in the order of their deadlines,
    each after the others have run up to their own next wait."""

    def __init__(self) -> None:
        self.clock = Clock()
        self.slept: list[float] = []  # the deferrals (TenantAdmission's sleep)
        self._due: list[tuple[float, int, asyncio.Future[None]]] = []
        self._seq = itertools.count()

    async def wait(self, seconds: float) -> None:
        future = asyncio.get_running_loop().create_future()
        heapq.heappush(self._due, (self.clock.now + seconds, next(self._seq), future))
        await future

    async def defer(self, seconds: float) -> None:
        self.slept.append(seconds)
        await self.wait(seconds)

    async def run(self, until: float) -> None:
        for _ in range(20):
            await asyncio.sleep(0)
        while self._due and self._due[0][0] <= until:
            due, _, future = heapq.heappop(self._due)
            self.clock.now = max(self.clock.now, due)
            future.set_result(None)
            for _ in range(20):  # the woken task runs up to its next wait
                await asyncio.sleep(0)


def simulate(callers: int, *, honour: bool, seconds: float = 5.0) -> tuple[Counter[str], int]:
    """`callers` calling back to back for `seconds` (a call takes 15 ms; a refusal is answered
    in 1 ms), waiting out each retry hint or not: outcomes, and the refusals deferred."""
    sim = Simulation()
    quotas = QuotaBook(default=TenantQuota(concurrency=1, requests_per_s=10))
    gate = TenantAdmission(
        AdmissionSettings(quotas=quotas), CollectorRegistry(), clock=sim.clock, sleep=sim.defer
    )
    outcomes: Counter[str] = Counter()
    end = sim.clock.now + seconds

    async def caller() -> None:
        while sim.clock.now < end:
            try:
                async with gate.admitted("acme"):
                    await sim.wait(0.015)
            except OverloadedError as err:
                outcomes[err.reason] += 1
                await sim.wait(0.001 + (err.retry_after_ms / 1000 if honour else 0))
            else:
                outcomes["ok"] += 1

    async def main() -> None:
        tasks = [asyncio.create_task(caller()) for _ in range(callers)]
        await sim.run(end + 20)
        for task in tasks:
            task.cancel()

    asyncio.run(main())
    return outcomes, len(sim.slept)


def test_ten_callers_honouring_rate_and_concurrency_hints_are_never_deferred() -> None:
    # refused for rate (hint: the next token, up to 100 ms) and for concurrency (hint: the
    # mean call, ~15 ms) by turns: mixed hints, yet each caller holds one unexpired hint at most
    outcomes, deferred = simulate(10, honour=True)
    assert outcomes["rate"] > 0 and outcomes["concurrency"] > 0, outcomes
    assert 50 <= outcomes["ok"] <= 61  # its rate: 10 calls/s, and a burst of 10 at first
    assert deferred == 0


def test_two_callers_ignoring_the_hints_are_deferred_and_slowed() -> None:
    honest, _ = simulate(2, honour=True)
    outcomes, deferred = simulate(2, honour=False)
    refused = outcomes["rate"] + outcomes["concurrency"]
    # each ignoring caller piles up a hint per millisecond: past 16 it is deferred, and from
    # then on makes a refused call per deferral (>= 0.5 s), not one per millisecond
    assert deferred > 0
    assert refused <= 16 + 2 * (5 / 0.5 + 1), outcomes
    assert outcomes["ok"] >= 0.5 * honest["ok"]  # still served within its quota
