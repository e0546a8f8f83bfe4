"""Per-tenant admission: token buckets, concurrency quotas, fair share at the global cap,
retry hints, reloads and metrics by tenant class (a fake clock, no server)."""

from __future__ import annotations

import json
import logging
from contextlib import ExitStack
from pathlib import Path

import pytest
from prometheus_client import CollectorRegistry

from ragcore.errors import ConfigError
from retrieval_api.admission import (
    AdmissionSettings,
    OverloadedError,
    QuotaBook,
    TenantAdmission,
    TenantQuota,
)

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
