"""The shipped alert rules and dashboard in a real Prometheus, against the running real-CDC
stack (tests/deploy/live_stack.py): every alert fires on a real fault and resolves after
recovery; a healthy run and a burst of bad client requests fire nothing; every dashboard panel
returns data right after the healthy run (before any fault: no panel waits for a fault to have
happened) and again after the workload.

One stack and one Prometheus serve the whole module; tests run in file order (the healthy
checks first, then the faults, the panel coverage once more last, after every scenario made its
metrics move). The rules
Prometheus evaluates are generated from deploy/prometheus/alerts.yml with `for:` and range
windows shortened (tests/deploy/prometheus_live.py); thresholds stay as shipped.

Adding an alert? Add its fault scenario to SCENARIOS: `test_every_alert_has_a_fault_scenario`
fails until you do.
"""

from __future__ import annotations

import time
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path

import grpc
import pytest

from ragcore.errors import EmbeddingUnavailableError
from ragcore.grpc_codes import SERVER_ERROR_CODES
from ragdev.services.postgres import PostgresCluster
from ragdev.services.tansu import TansuBroker
from retrieval_api.calibration import CalibrationSettings, calibrate_version
from retrieval_api.candidates import CandidateSearch
from retrieval_api.pipeline_settings import RetrievalConfig
from tests.deploy.live_stack import (
    ACME_ROWS,
    PROMOTE_ABOVE,
    LiveStack,
    Load,
    ask,
    produce_late_snapshot_row,
    produce_poison,
    row_text,
    start_live_stack,
    tokens_json,
)
from tests.deploy.prometheus_live import (
    LivePrometheus,
    alert_names,
    dashboard_panels,
)
from tests.deploy.support import ALERTS_FILE, CHART_ALERTS_FILE, require_tool

#: Alone, after the parallel part of `make test` (Makefile): the alerts fire within seconds-long
#: deadlines, which a second worker's CPU-heavy tests pushed past (two alerts missed theirs).
pytestmark = pytest.mark.serial

#: What one scenario does to the stack: `inject` breaks something and returns `recover`.
Inject = Callable[[LiveStack], Callable[[], None]]


@dataclass(frozen=True)
class Scenario:
    """A real fault that must fire `alert` (on the series matching `labels`), and its fix;
    `quiet`: alerts the fault must not fire (neither pending nor firing while `alert` fires)."""

    fault: str
    inject: Inject
    labels: dict[str, str] = field(default_factory=dict)
    quiet: tuple[str, ...] = ()


# --- the faults -----------------------------------------------------------------------------------


def store_down_for_a_new_worker(stack: LiveStack) -> Callable[[], None]:
    """A worker (re)started while its vector store is unreachable: it owns partitions, has a
    backlog, pauses for backpressure and never commits."""
    return stack.start_stalled_worker(store_down=True)


def embedder_down(stack: LiveStack) -> Callable[[], None]:
    """The embedding service is unreachable while rows change: the worker pauses, the oldest
    change waits (backlog age), nothing becomes searchable."""
    stack.embedder.fail_with = EmbeddingUnavailableError("embedder unreachable (live fault)")
    stack.put_rows("globex", [f"fresh-{n}" for n in range(5)], lambda n: f"Fresh change {n}.")

    def recover() -> None:
        stack.embedder.fail_with = None
        stack.caught_up()

    return recover


def snapshot_row_waits(stack: LiveStack) -> Callable[[], None]:
    """A snapshot row Debezium wrote two hours ago still waits to be applied (the embedding
    service is down): the oldest bulk change of class default is older than the hour the
    alert allows, while no live change waits, so the live freshness SLO holds. The row is one
    of the stack's own start-up snapshot records, re-keyed to a new entity of a tenant nobody
    queries, its Kafka timestamp set two hours back (the threshold stays as shipped)."""
    stack.embedder.fail_with = EmbeddingUnavailableError("embedder unreachable (live fault)")
    entity = f"late-snapshot-{uuid.uuid4().hex[:6]}"
    produce_late_snapshot_row(
        stack.broker.bootstrap_servers,
        stack.topic,
        tenant="initech",
        entity_id=entity,
        text=f"Snapshot row {entity} that waited.",
        age_s=7200,
    )

    def recover() -> None:
        stack.embedder.fail_with = None
        stack.caught_up()
        stack.worker.reconcile_once()  # the row has no SoR row: repair removes it again

    return recover


def poison_records(stack: LiveStack) -> Callable[[], None]:
    """A producer writes records no decoder accepts to the change topic."""
    produce_poison(stack.broker.bootstrap_servers, stack.topic, 15)
    return stack.caught_up


def workers_down(stack: LiveStack) -> Callable[[], None]:
    """Every worker stopped (crashed or scaled to zero) while rows keep changing."""
    stack.stop_worker()
    stack.put_rows("globex", [f"idle-{n}" for n in range(3)], lambda n: f"While down {n}.")

    def recover() -> None:
        stack.start_worker()
        stack.caught_up()

    return recover


def sor_down_for_retrieve(stack: LiveStack) -> Callable[[], None]:
    """PostgreSQL unreachable from Retrieve (every hit must be verified against it)."""
    stack.sor_proxy.cut()
    return stack.sor_proxy.restore


def sor_slow_for_retrieve(stack: LiveStack) -> Callable[[], None]:
    """PostgreSQL answers Retrieve's verification queries 0.6 s late."""
    stack.sor_proxy.delay_s = 0.6

    def recover() -> None:
        stack.sor_proxy.delay_s = 0.0

    return recover


def debezium_stopped(stack: LiveStack) -> Callable[[], None]:
    """Debezium stopped while the SoR changes: the index keeps the old content, Retrieve's
    SoR check excludes those hits as stale."""
    stack.dbz.stop(drop_slot=False)  # a clean stop: the slot keeps the WAL
    keys = [f"acme-{n:03d}" for n in range(ACME_ROWS)]  # every acme hit is then stale
    stack.put_rows("acme", keys, lambda n: f"{row_text(n)} Revised while capture was down.")

    def recover() -> None:
        stack.dbz.start()
        stack.caught_up()  # the alert resolves once the revised rows are indexed

    return recover


def drift_injected(stack: LiveStack) -> Callable[[], None]:
    """120 of acme's entities vanish from the index (a restore from an old backup); the
    reconcile run finds them (and repairs them); the next run finds none."""
    registry = stack.worker.registry
    version = registry.active_version("acme")
    assert version is not None
    name = registry.manifest("acme", version).index_name
    for n in range(120):
        stack.store.delete_by_entity(name, "acme", f"entities:acme-{n:03d}")
    reports = stack.worker.reconcile_once()
    assert any(len(r.missing) >= 120 for r in reports), [r.to_dict() for r in reports]

    def recover() -> None:
        stack.worker.reconcile_once()

    return recover


def fit_calibration(stack: LiveStack, tenant: str) -> None:
    """What `ragstream calibrate --stale` does for one tenant (the nightly job), with fewer
    practice queries than its default: the stack's embedder is a hash, not a language model."""
    worker = stack.worker
    search = CandidateSearch(
        config=RetrievalConfig(),
        encoder=worker.sparse,
        store=worker.store,
        registry=worker.registry,
    )
    index = worker.registry.lookup(tenant, None)
    settings = CalibrationSettings(positives=40, negatives=40)
    calibrate_version(
        search, worker.registry, index, worker.embedder, worker.store, settings=settings
    )


def calibration_goes_stale(stack: LiveStack) -> Callable[[], None]:
    """acme is calibrated, then grows by more than the stale ratio (0.2) of its chunks: the
    reconcile run finds its calibration stale. The fix is the nightly job's refit."""
    fit_calibration(stack, "acme")
    keys = [f"new-content-{n:03d}" for n in range(ACME_ROWS // 4)]
    stack.put_rows("acme", keys, lambda n: f"New content row {n}.")
    stack.wait_indexed("acme", keys[-1])
    reports = stack.worker.reconcile_once()
    states = {r.tenant: r.calibration.state for r in reports if r.calibration is not None}
    assert states["acme"] == "stale", states

    def recover() -> None:
        fit_calibration(stack, "acme")
        (acme,) = [r for r in stack.worker.reconcile_once() if r.tenant == "acme"]
        assert acme.calibration is not None and acme.calibration.state == "fitted"
        # the rows go again: 130 of the 162 chunks fitted on moves by less than 0.2
        stack.cleanups.append(lambda: stack.delete_rows(keys))

    return recover


def tenant_outgrows_the_shared_pool(stack: LiveStack) -> Callable[[], None]:
    """acme grows above the promotion threshold; the reconcile run counts it."""
    keys = [f"grow-{n:03d}" for n in range(PROMOTE_ABOVE - ACME_ROWS + 20)]
    stack.put_rows("acme", keys, lambda n: f"Growth row {n}.")
    stack.wait_indexed("acme", keys[-1])
    stack.worker.reconcile_once()

    def recover() -> None:
        stack.delete_rows(keys)
        stack.wait_indexed("acme", keys[-1], present=False)
        stack.worker.reconcile_once()

    return recover


def credentials_file_broken(stack: LiveStack) -> Callable[[], None]:
    """The tokens file is overwritten with something that is not JSON (a botched rotation):
    the server keeps the credentials in force and says it cannot reload them."""
    stack.tokens_file.write_text("{not json", encoding="utf-8")

    def recover() -> None:
        stack.tokens_file.write_text(tokens_json(), encoding="utf-8")

    return recover


def connector_killed(stack: LiveStack) -> Callable[[], None]:
    """The Kafka Connect JVM dies (SIGKILL): no heartbeat, no change, the slot has no consumer."""
    stack.dbz.kill()

    def recover() -> None:
        stack.dbz.restart()
        stack.caught_up()

    return recover


def slot_dropped(stack: LiveStack) -> Callable[[], None]:
    """Debezium's replication slot is dropped while it is down: a WAL gap."""
    stack.dbz.kill()
    stack.dbz.drop_slot()
    stack.put_rows("globex", [f"gap-{n}" for n in range(3)], lambda n: f"In the gap {n}.")

    def recover() -> None:
        stack.dbz.restart()  # snapshot.mode=when_needed: a fresh snapshot; the worker reconciles
        stack.caught_up()

    return recover


def content_column_renamed(stack: LiveStack) -> Callable[[], None]:
    """A migration renames the mapped content column: the table's changes lack it (they are
    dead-lettered), Retrieve cannot read the table."""
    stack.sql("ALTER TABLE entities RENAME COLUMN content TO body")
    run = uuid.uuid4().hex[:6]  # ids of their own on every injection of this fault
    for n in range(3):
        stack.sql(
            "INSERT INTO entities (id, company_id, name, body) VALUES (%s, %s, %s, %s)",
            (f"drift-{run}-{n}", "globex", f"drift {n}", f"Renamed {n}."),
        )

    def recover() -> None:
        stack.sql("ALTER TABLE entities RENAME COLUMN body TO content")
        stack.caught_up()
        stack.worker.reconcile_once()  # brings the dead-lettered rows back (the runbook)

    return recover


def offsets_expired(stack: LiveStack) -> Callable[[], None]:
    """The worker is stopped for longer than the topic's retention: the changes written
    meanwhile expire unread and its group's committed offset falls out of range. tansu has
    neither DeleteRecords nor retention (its low watermark stays 0), so the offset is moved
    past the log end instead: out of range all the same, where Kafka's reset jumps silently."""
    stack.stop_worker()
    stack.put_rows("globex", [f"expired-{n}" for n in range(3)], lambda n: f"Expired {n}.")
    moved = stack.move_group_offsets_past_the_end()
    stack.start_worker()
    began = time.time()

    def recover() -> None:
        stack.caught_up()
        registry = stack.worker.metrics.registry
        deadline = time.monotonic() + 60
        while (
            registry.get_sample_value("ragstream_reconcile_last_run_timestamp_seconds") or 0
        ) < began:
            assert time.monotonic() < deadline, f"no reconcile after the offset gap {moved}"
            time.sleep(0.3)
        reports = stack.worker.reconcile_once()  # the automatic one converged: nothing drifts
        assert all(not (r.missing or r.extra or r.stale) for r in reports), [
            r.to_dict() for r in reports
        ]

    return recover


INGEST = {"job": "ragstream-ingest"}
RETRIEVE = {"job": "ragstream-retrieve"}
#: The stack configures no tenant classes: every tenant is in class `default`.
DEFAULT_CLASS = {**INGEST, "tenant_class": "default"}

SCENARIOS: dict[str, Scenario] = {
    "RagstreamIngestStalled": Scenario("store down", store_down_for_a_new_worker, INGEST),
    "RagstreamIngestNoActiveConsumer": Scenario("workers down", workers_down),
    "RagstreamIngestDLQSpike": Scenario("poison records", poison_records, INGEST),
    "RagstreamFreshnessSLOBreach": Scenario("embedder down", embedder_down, DEFAULT_CLASS),
    "RagstreamIngestBackgroundLaneBehind": Scenario(
        "a snapshot row waiting for two hours",
        snapshot_row_waits,
        {**DEFAULT_CLASS, "lane": "bulk"},
        quiet=("RagstreamFreshnessSLOBreach",),  # a snapshot is not the live SLO's
    ),
    "RagstreamRetrieveErrorRate": Scenario("SoR down", sor_down_for_retrieve, RETRIEVE),
    "RagstreamRetrieveLatencyHigh": Scenario("SoR slow", sor_slow_for_retrieve, RETRIEVE),
    "RagstreamRetrieveStaleExclusionSpike": Scenario(
        "Debezium stopped", debezium_stopped, RETRIEVE
    ),
    "RagstreamRetrieveConfigReloadFailing": Scenario(
        "tokens file broken", credentials_file_broken, RETRIEVE
    ),
    "RagstreamReconcileDrift": Scenario("drift injected", drift_injected, INGEST),
    "RagstreamCalibrationStale": Scenario(
        "index grew past its calibration", calibration_goes_stale, INGEST
    ),
    "RagstreamTenantsDueForPromotion": Scenario(
        "tenant due for promotion", tenant_outgrows_the_shared_pool, INGEST
    ),
    "RagstreamSourceSilent": Scenario("connector killed", connector_killed, INGEST),
    "RagstreamReplicationSlotInactive": Scenario("connector killed", connector_killed, INGEST),
    "RagstreamWalGap": Scenario("slot dropped", slot_dropped, INGEST),
    "RagstreamIngestOffsetsLost": Scenario("changes expired unread", offsets_expired, INGEST),
    "RagstreamSchemaDrift": Scenario("content column renamed", content_column_renamed, INGEST),
    "RagstreamSorTableUnreadable": Scenario(
        "content column renamed", content_column_renamed, RETRIEVE
    ),
}


# --- the coverage rule ----------------------------------------------------------------------------


@pytest.mark.unit
@pytest.mark.parametrize("rules", [ALERTS_FILE, CHART_ALERTS_FILE], ids=["deploy", "helm"])
def test_every_alert_has_a_fault_scenario(rules: Path) -> None:
    names = alert_names(rules)
    assert names
    missing = [n for n in names if n not in SCENARIOS]
    assert not missing, f"add a fault scenario to SCENARIOS for {missing}"
    assert set(SCENARIOS) <= set(names), "a scenario names an alert the rules do not have"


# --- the live module ------------------------------------------------------------------------------


#: How long the start-up snapshot's freshness stays in the generated rules' 10 s range windows
#: (and two evaluations) after the stack caught up.
STARTUP_IN_WINDOWS_S = 12.0


@dataclass
class Live:
    stack: LiveStack
    prometheus: LivePrometheus
    started: float
    #: `time.monotonic()` from which the start-up has left the rules' windows (`settle`).
    settled_at: float

    def settle(self) -> None:
        """Waits out what is left of the start-up's time in the rules' windows: a test that
        checks which alerts fire must not see start-up's. Once per module, not per test: in
        file order the healthy run's own wait covers it and this returns at once."""
        time.sleep(max(0.0, self.settled_at - time.monotonic()))


@pytest.fixture(scope="module")
def live(
    postgres: PostgresCluster, kafka_broker: TansuBroker, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[Live]:
    binary = require_tool("prometheus")
    work = tmp_path_factory.mktemp("live")
    for stack in start_live_stack(postgres, kafka_broker, work):
        prometheus = LivePrometheus(
            binary,
            tmp_path_factory.mktemp("prometheus"),
            {
                "ragstream-ingest": [stack.ingest_metrics.target, stack.stall_metrics.target],
                "ragstream-retrieve": [stack.retrieve_metrics.target],
                "kafka-exporter": [stack.lag_metrics.target],
            },
        )
        try:
            prometheus.wait_ready()
            stack.caught_up(timeout=120)
            stack.worker.reconcile_once()  # the drift and placement gauges start at a real run
            settled_at = time.monotonic() + STARTUP_IN_WINDOWS_S
            stack.load = Load(stack.client)
            yield Live(stack, prometheus, time.time(), settled_at)
        finally:
            prometheus.stop()


@pytest.mark.integration
@pytest.mark.slow
def test_prometheus_loads_the_generated_rules_and_scrapes_every_target(live: Live) -> None:
    prom = live.prometheus
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        up = {r["metric"]["instance"]: r["value"][1] for r in prom.query("up")}
        if all(up.get(t) == "1" for t in _always_up(live.stack)):
            break
        time.sleep(0.5)
    assert all(up.get(t) == "1" for t in _always_up(live.stack)), up
    health = prom.rule_health()
    assert set(health) == set(alert_names()), health
    # A rule not yet evaluated is "unknown"; wait for every rule's first evaluation, not a
    # fixed time, then every one must be "ok" (an "err" fails at once).
    deadline = time.monotonic() + 30
    while "unknown" in health.values() and time.monotonic() < deadline:
        time.sleep(0.5)
        health = prom.rule_health()
    assert set(health.values()) == {"ok"}, health


def _always_up(stack: LiveStack) -> list[str]:
    return [s.target for s in (stack.ingest_metrics, stack.retrieve_metrics, stack.lag_metrics)]


@pytest.mark.integration
@pytest.mark.slow
def test_a_healthy_run_fires_nothing(live: Live) -> None:
    stack = live.stack
    prom = live.prometheus
    # Start-up is not the healthy state: the snapshot is a backfill that the freshness SLO
    # counts (by design), and the worker rebalances once when its pattern subscription finds
    # the connector's heartbeat topic. Wait until the source is heard (that topic consumed),
    # then until start-up has left the rules' windows.
    stack.caught_up()
    deadline = time.monotonic() + 60
    while not prom.query("ragstream_source_last_heard_timestamp_seconds"):
        assert time.monotonic() < deadline, "the connector's heartbeats were never consumed"
        time.sleep(1)
    time.sleep(12)  # one range window of the generated rules (10 s) and two evaluations
    live.settle()  # (already passed: the start-up is older than the wait above)
    deadline = time.monotonic() + 90
    while prom.alerts():
        assert time.monotonic() < deadline, prom.alerts()
        time.sleep(1)
    stack.put_rows("globex", [f"globex-{n:03d}" for n in range(5)], lambda n: f"Updated {n}.")
    stack.delete_rows(["globex-019"])
    deadline = time.monotonic() + 25
    seen: list[dict[str, object]] = []
    while time.monotonic() < deadline:
        seen += live.prometheus.firing()
        time.sleep(1)
    assert not seen, seen
    assert stack.load is not None and stack.load.ok > 50 and not stack.load.failed


@pytest.mark.integration
@pytest.mark.slow
def test_every_dashboard_panel_returns_data_on_a_healthy_stack(live: Live) -> None:
    # Right after the healthy run, before any fault or bad request: a panel must not need a
    # fault to have happened (labelled counters are exported at 0 for their known values).
    empty = _empty_panel_queries(live)
    assert not empty, empty


def _empty_panel_queries(live: Live) -> list[tuple[str, str]]:
    """(title, PromQL) of every dashboard query that returned no value since the stack
    started (NaN and infinities are no value)."""
    prom = live.prometheus
    empty = []
    panels = dashboard_panels()
    assert len(panels) >= 30
    for panel in panels:
        for expr in panel.exprs:
            series = prom.query_range(expr, live.started, time.time())
            values = [v for s in series for _, v in s["values"] if v not in ("NaN", "+Inf", "-Inf")]
            if not values:
                empty.append((panel.title, expr))
    return empty


@pytest.mark.integration
@pytest.mark.slow
def test_a_burst_of_bad_client_requests_fires_nothing(live: Live) -> None:
    live.settle()
    client = live.stack.client
    codes: dict[str, int] = {}
    began = time.monotonic()
    calls: list[Callable[[], object]] = [
        lambda: ask(client, "acme", ""),  # INVALID_ARGUMENT
        lambda: ask(client, "acme", "x", token="wrong"),  # UNAUTHENTICATED
        lambda: ask(client, "globex", "refunds", token="acme-live-token"),  # PERMISSION_DENIED
        lambda: ask(client, "acme", "x" * 5000),  # INVALID_ARGUMENT (too long)
    ]
    while time.monotonic() - began < 15:
        for call in calls:
            try:
                call()
                codes["OK"] = codes.get("OK", 0) + 1
            except grpc.RpcError as exc:
                codes[exc.code().name] = codes.get(exc.code().name, 0) + 1
    assert {"INVALID_ARGUMENT", "UNAUTHENTICATED", "PERMISSION_DENIED"} <= set(codes), codes
    assert sum(codes.values()) > 100
    seen = []
    for _ in range(10):
        seen += live.prometheus.firing()
        time.sleep(1)
    assert not seen, seen
    # the client errors are on record, labelled as such
    failed = live.prometheus.query(
        'sum by (code) (ragstream_retrieve_requests_total{status="FAILED"}) > 0'
    )
    recorded = {r["metric"]["code"] for r in failed}
    assert recorded >= {"InvalidArgument", "PermissionDenied"}
    assert not recorded & set(SERVER_ERROR_CODES), recorded


def faults() -> list[tuple[str, ...]]:
    """The alerts of SCENARIOS grouped by fault (one `inject`), in SCENARIOS order: alerts
    that the same fault fires are checked on one injection of it (the connector killed once,
    not once per alert)."""
    groups: dict[Inject, list[str]] = {}
    for alert, scenario in SCENARIOS.items():
        groups.setdefault(scenario.inject, []).append(alert)
    return [tuple(alerts) for alerts in groups.values()]


@pytest.mark.unit
def test_scenarios_sharing_a_fault_are_grouped_and_none_is_lost() -> None:
    grouped = faults()
    assert sorted(a for alerts in grouped for a in alerts) == sorted(SCENARIOS)
    assert ("RagstreamSourceSilent", "RagstreamReplicationSlotInactive") in grouped
    assert ("RagstreamSchemaDrift", "RagstreamSorTableUnreadable") in grouped
    for alerts in grouped:
        assert len({SCENARIOS[a].inject for a in alerts}) == 1, alerts


@pytest.mark.integration
@pytest.mark.slow
@pytest.mark.parametrize("alerts", faults(), ids="+".join)
def test_fault_fires_its_alerts_and_recovery_resolves_them(
    live: Live, alerts: tuple[str, ...]
) -> None:
    prom = live.prometheus
    live.settle()  # an alert of the start-up is not one of this fault's
    quiet = sorted({q for a in alerts for q in SCENARIOS[a].quiet})
    for alert in (*alerts, *quiet):
        prom.wait_resolved(alert, timeout=60)  # a previous scenario's tail has passed
    recover = SCENARIOS[alerts[0]].inject(live.stack)
    try:
        try:
            fired = [prom.wait_firing(a, SCENARIOS[a].labels, timeout=90) for a in alerts]
            for _ in range(5):  # while the fault's own alerts fire, and a few seconds on
                assert not [q for q in quiet if prom.active(q)], prom.alerts()
                time.sleep(1)
        finally:
            recover()
        resolved = [prom.wait_resolved(a, timeout=90) for a in alerts]
    finally:
        # even after a failure: a scenario's leftovers (the stalled worker owns partitions)
        # would otherwise keep the next scenario's alert from firing
        for cleanup in live.stack.cleanups:
            cleanup()
        live.stack.cleanups.clear()
    for alert, up, down in zip(alerts, fired, resolved, strict=True):
        print(f"{alert} ({SCENARIOS[alert].fault}): fired in {up:.1f}s, resolved in {down:.1f}s")


@pytest.mark.integration
@pytest.mark.slow
def test_every_dashboard_panel_returns_data_after_the_workload(live: Live) -> None:
    empty = _empty_panel_queries(live)
    assert not empty, empty
