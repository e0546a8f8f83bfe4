"""`ragstream status`: figures and SLO verdicts from real expositions (prometheus_client
registries) and from a running `ragstream dev` stack's /metrics."""

from __future__ import annotations

import json
import shutil
import subprocess
import time
import urllib.parse
import urllib.request
from pathlib import Path

import pytest
from prometheus_client import (
    CollectorRegistry,
    Counter,
    Gauge,
    Histogram,
    generate_latest,
    start_http_server,
)

from ragcore.calibration_state import CalibrationState
from ragdev.services.tansu import free_port
from ragstream.status import (
    NOT_EXPORTED,
    STALE_ROW,
    Slos,
    _bucket_quantile,
    _View,
    from_metrics,
    parse,
    standing_out,
)
from streams.metrics import IngestMetrics
from streams.reconcile import ReconcileMetrics, ReconcileReport
from tests.ragdev.test_dev_stack import entity_ids, wait_for
from tests.ragstream.conftest import RunningDev

BUCKETS = (0.1, 0.5, 1.0, 2.0, 5.0)


def exposition(registry: CollectorRegistry) -> str:
    return generate_latest(registry).decode()


@pytest.mark.unit
def test_quantiles_interpolate_within_the_bucket_as_prometheus_does() -> None:
    edges = [0.1, 0.5, 1.0, float("inf")]
    assert _bucket_quantile(0.5, edges, [0, 10, 10, 10]) == pytest.approx(0.3)
    assert _bucket_quantile(0.95, edges, [90, 95, 100, 100]) == pytest.approx(0.5)
    assert _bucket_quantile(0.99, edges, [0, 0, 0, 10]) == 1.0  # highest finite bound


@pytest.mark.unit
def test_a_window_reads_only_what_happened_in_it() -> None:
    registry = CollectorRegistry()
    latency = Histogram(
        "grpc_server_handling_seconds", "h", ["grpc_method"], buckets=BUCKETS, registry=registry
    )
    for _ in range(300):
        latency.labels("Retrieve").observe(0.05)  # before the window: fast
    before = parse(exposition(registry))
    for _ in range(10):
        latency.labels("Retrieve").observe(3.0)  # in the window: slow
    view = _View(before, parse(exposition(registry)))
    p95, basis = view.quantile("grpc_server_handling_seconds", 0.95)
    assert basis == "window" and 2.0 < p95 <= 5.0  # type: ignore[operator]
    since_start, basis = _View(None, parse(exposition(registry))).quantile(
        "grpc_server_handling_seconds", 0.95
    )
    assert basis == "since start" and since_start is not None and since_start <= 0.1


@pytest.mark.unit
def test_a_tenant_far_above_the_others_and_refused_tenants_stand_out() -> None:
    registry = CollectorRegistry()
    admission = Counter(
        "ragstream_retrieve_admission", "a", ["tenant_class", "outcome"], registry=registry
    )
    per_tenant = Gauge("ragstream_example_in_flight", "g", ["tenant"], registry=registry)
    for tenant, value in (("a", 1), ("b", 2), ("c", 1), ("noisy", 40)):
        per_tenant.labels(tenant).set(value)
    admission.labels("small", "admitted").inc(50)
    before = parse(exposition(registry))
    admission.labels("small", "admitted").inc(5)
    admission.labels("large", "throttled").inc(7)
    found = standing_out(_View(before, parse(exposition(registry))))
    assert found == [
        "large: 7 refused (throttled)",
        "noisy: 40 in ragstream_example_in_flight (others' median 1)",
    ]


@pytest.mark.unit
def test_stale_calibrations_are_counted_from_the_workers_gauge() -> None:
    registry = CollectorRegistry()
    metrics = ReconcileMetrics(registry)
    server, thread = start_http_server(0, "127.0.0.1", registry=registry)
    url = f"http://127.0.0.1:{server.server_port}/metrics"
    try:
        metrics.record_all(
            [
                ReconcileReport(t, f"rag__{t}__v1", 0, 0, 10, calibration=state)
                for t, state in (
                    ("a", CalibrationState("stale", 20, 10)),
                    ("b", CalibrationState("unreadable", 10, error="bad")),
                    ("c", CalibrationState("prior", 10)),
                    ("d", CalibrationState("fitted", 10, 10)),
                )
            ]
        )
        rows = {r.name: r for r in from_metrics([url], Slos(), window_s=0).rows}
    finally:
        server.shutdown()
        thread.join(5)
    row = rows[STALE_ROW]
    assert (row.value, row.breached) == (2, False)  # stale and unreadable; the prior is not
    assert "ragstream calibrate --stale" in row.note


@pytest.mark.unit
@pytest.mark.parametrize(
    ("assigned", "beat_age", "breached"),
    [
        (4, 1.0, set()),
        (0, 1.0, {"ingest partitions assigned"}),
        (2, 600.0, {"ingest loop heartbeat age"}),
    ],
)
def test_a_worker_that_holds_no_partition_or_whose_loop_is_lost_is_a_breach_not_quiet(
    assigned: int, beat_age: float, breached: set[str]
) -> None:
    # the dev stack once said "consumer lag 0 over 0 partitions: ok" after its loop died
    registry = CollectorRegistry()
    metrics = IngestMetrics(registry)
    metrics.assigned_partitions.set(assigned)
    metrics.loop_heartbeat.labels("intake").set(time.time())
    metrics.loop_heartbeat.labels("apply").set(time.time() - beat_age)
    server, thread = start_http_server(0, "127.0.0.1", registry=registry)
    url = f"http://127.0.0.1:{server.server_port}/metrics"
    try:
        report = from_metrics([url], Slos(), window_s=0)
    finally:
        server.shutdown()
        thread.join(5)
    rows = {r.name: r for r in report.rows}
    assert rows["ingest partitions assigned"].value == assigned
    assert rows["ingest loop heartbeat age"].value == pytest.approx(beat_age, abs=5)
    assert {r.name for r in report.breached} == breached


@pytest.mark.integration
@pytest.mark.slow
def test_status_reads_a_running_stack_and_exits_non_zero_on_a_breach(
    running_dev: RunningDev,
) -> None:
    url = f"http://127.0.0.1:{running_dev.dev.metrics}/metrics"
    # a burst of requests with a bad token: client errors, no server error
    for _ in range(5):
        bad = running_dev.run(
            "query", "--target", f"127.0.0.1:{running_dev.dev.grpc}", "--token", "nope", "x"
        )
        assert bad.returncode != 0
    target = ("--target", f"127.0.0.1:{running_dev.dev.grpc}")
    for _ in range(3):  # a valid caller's malformed requests: INVALID_ARGUMENT
        malformed = running_dev.run(
            "query", *target, "--tenant", "acme", "--data-dir", str(running_dev.dev.data_dir), " "
        )
        assert malformed.returncode != 0 and "INVALID_ARGUMENT" in malformed.stderr
    # the stack's first load is a snapshot (the bulk lane); the freshness SLO judges live
    # changes: make one and wait until it is searchable
    running_dev.dev.cli(
        "sor", "put", "--tenant", "acme", "--id", "status-canary",
        "--text", "The status canary hums a tune in the loading bay.",
    )  # fmt: skip
    wait_for(
        lambda: (
            "entities:status-canary"
            in entity_ids(running_dev.dev.query("acme", "where does the status canary hum?"))
        )
    )
    # since start, the figures include the stack's first load (a backfill) and first queries
    generous = (
        *("--slo-retrieve-p95", "30", "--slo-freshness-p95", "600"),
        *("--slo-backlog-age", "600"),  # a loaded machine's batch may be in flight
    )
    healthy = running_dev.run("status", "--metrics", url, "--window", "0", "--json", *generous)
    assert healthy.returncode == 0, healthy.stdout + healthy.stderr
    rows = {r["name"]: r for r in json.loads(healthy.stdout)["rows"]}
    assert rows["freshness p95"]["value"] > 0  # the live change was indexed
    assert rows["freshness p95"]["note"].startswith("live")
    assert rows["Retrieve p95"]["value"] > 0  # the banner's example queries
    assert rows["Retrieve server error rate"]["value"] == 0.0
    assert rows["Retrieve server error rate"]["note"].endswith("calls since start")
    assert rows["DLQ records"]["value"] == 0
    assert rows["reconcile drift"]["shown"] in ("0", NOT_EXPORTED, "no data")
    for name in ("backlog age", "consumer lag"):  # the worker's own (issue 25 item 3)
        assert rows[name]["value"] is not None, rows[name]
    assert rows["consumer lag"]["note"].endswith("partitions")
    assert rows["Retrieve client errors"]["value"] >= 3  # counted apart from server errors
    assert not [r for r in rows.values() if r["breached"]]

    breached = running_dev.run(
        "status",
        "--metrics",
        url,
        "--window",
        "1",
        "--slo-freshness-p95",
        "600",
        "--slo-backlog-age",
        "600",
        "--slo-retrieve-p95",
        "0.000001",
    )
    text = breached.stdout
    # no Retrieve call in the 1 s window: the p95 falls back to the totals since start
    assert breached.returncode == 1, text + breached.stderr
    assert "Retrieve p95" in text and "BREACH" in text and "since start" in text
    assert text.rstrip().endswith("SLO breached: Retrieve p95")

    unreachable = running_dev.run("status", "--metrics", "http://127.0.0.1:1/metrics")
    assert unreachable.returncode == 2 and "STATUS_UNREADABLE" in unreachable.stderr


@pytest.mark.unit
def test_slo_defaults_are_the_alert_thresholds() -> None:
    slos = Slos()
    assert (slos.freshness_p95_s, slos.retrieve_p95_s, slos.error_rate) == (2.0, 0.5, 0.05)
    assert slos.drift_entities == 100


@pytest.mark.integration
@pytest.mark.slow
def test_status_reads_a_prometheus_that_scrapes_the_stack(
    running_dev: RunningDev, tmp_path: Path
) -> None:
    binary = shutil.which("prometheus")
    assert binary is not None, "Debian's prometheus package (.ci/run installs it)"
    port = free_port()
    config = tmp_path / "prometheus.yml"
    config.write_text(
        "global: {scrape_interval: 1s, evaluation_interval: 1s}\n"
        "scrape_configs:\n"
        "  - job_name: ragstream\n"
        f"    static_configs: [{{targets: ['127.0.0.1:{running_dev.dev.metrics}']}}]\n"
    )
    log = (tmp_path / "prometheus.log").open("wb")
    proc = subprocess.Popen(
        [
            binary,
            f"--config.file={config}",
            f"--storage.tsdb.path={tmp_path / 'tsdb'}",
            f"--web.listen-address=127.0.0.1:{port}",
        ],
        stdout=log,
        stderr=subprocess.STDOUT,
    )
    base = f"http://127.0.0.1:{port}"
    try:
        # queries while Prometheus scrapes, until the 5 min rates the report divides have calls
        # in them (two scrapes with a Retrieve between them), polled rather than waited out
        rated = urllib.parse.quote(
            'sum(rate(grpc_server_handled_total{job="ragstream",grpc_method="Retrieve"}[5m])) > 0'
            ' and sum(rate(grpc_server_handling_seconds_bucket{job="ragstream",'
            'grpc_method="Retrieve"}[5m])) > 0'
        )
        deadline = time.monotonic() + 60
        samples: list[object] = []
        while not samples:
            assert time.monotonic() < deadline, "Prometheus never had a Retrieve rate to report"
            running_dev.dev.query("acme", "refund after cancelling a yearly plan")
            try:
                with urllib.request.urlopen(f"{base}/api/v1/query?query={rated}", timeout=5) as r:
                    samples = json.loads(r.read())["data"]["result"]
            except OSError:
                samples = []  # not listening yet
            time.sleep(0.5)
        result = running_dev.run(
            "status",
            "--prometheus",
            base,
            "--selector",
            'job="ragstream"',
            "--json",
            "--slo-retrieve-p95",
            "30",
            "--slo-freshness-p95",
            "600",
            "--slo-backlog-age",
            "600",
        )
        assert result.returncode == 0, result.stdout + result.stderr
        rows = {r["name"]: r for r in json.loads(result.stdout)["rows"]}
        assert rows["Retrieve p95"]["value"] > 0
        assert rows["Retrieve server error rate"]["value"] == 0.0
        assert rows["DLQ records per hour"]["value"] == 0
        assert rows["tenants due for promotion"]["shown"] in ("0", NOT_EXPORTED)
        assert rows[STALE_ROW]["shown"] in ("0", NOT_EXPORTED)  # the dev stack calibrates
        strict = running_dev.run(
            "status",
            "--prometheus",
            base,
            "--slo-retrieve-p95",
            "0.000001",
            "--slo-freshness-p95",
            "600",
            "--slo-backlog-age",
            "600",
        )
        assert strict.returncode == 1 and "SLO breached: Retrieve p95" in strict.stdout
    finally:
        proc.terminate()
        proc.wait(30)
        log.close()
