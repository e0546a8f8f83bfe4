"""The alert rules: promtool checks them and runs their unit tests; every rule uses real metric
names, carries what an on-call engineer needs, and is tested both firing and quiet; the Helm
chart ships the same rules; the services' exposition passes `promtool check metrics`."""

from __future__ import annotations

import re
import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml
from prometheus_client import CollectorRegistry, generate_latest

from tests.deploy.support import (
    ALERTS_FILE,
    ALERTS_TEST_FILE,
    CHART_ALERTS_FILE,
    PROMETHEUS_CONFIG,
    known_sample_names,
    load_yaml,
    promql_metric_names,
    require_tool,
)

EXPECTED_ALERTS = {
    "RagstreamIngestStalled",
    "RagstreamIngestNoActiveConsumer",
    "RagstreamIngestDLQSpike",
    "RagstreamFreshnessSLOBreach",
    "RagstreamIngestBackgroundLaneBehind",
    "RagstreamRetrieveErrorRate",
    "RagstreamRetrieveLatencyHigh",
    "RagstreamRetrieveStaleExclusionSpike",
    "RagstreamRetrieveConfigReloadFailing",
    "RagstreamReconcileDrift",
    "RagstreamCalibrationStale",
    "RagstreamTenantsDueForPromotion",
    "RagstreamSchemaDrift",
    "RagstreamSourceSilent",
    "RagstreamReplicationSlotInactive",
    "RagstreamSorTableUnreadable",
    "RagstreamWalGap",
    "RagstreamIngestOffsetsLost",
}


def alert_rules(path: Path = ALERTS_FILE) -> Iterator[dict[str, Any]]:
    for group in load_yaml(path)["groups"]:
        yield from group["rules"]


def _promtool(*args: str, stdin: bytes | None = None) -> subprocess.CompletedProcess[str]:
    promtool = require_tool("promtool")
    return subprocess.run(
        [str(promtool), *args],
        input=stdin.decode() if stdin is not None else None,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )


# --- promtool ------------------------------------------------------------------------------------


@pytest.mark.integration
def test_promtool_check_rules_accepts_the_alerts() -> None:
    result = _promtool("check", "rules", str(ALERTS_FILE))
    assert result.returncode == 0, result.stdout + result.stderr
    assert f"SUCCESS: {len(EXPECTED_ALERTS)} rules found" in result.stdout


@pytest.mark.integration
def test_promtool_rule_unit_tests_pass() -> None:
    result = _promtool("test", "rules", str(ALERTS_TEST_FILE))
    assert result.returncode == 0, result.stdout + result.stderr
    assert "SUCCESS" in result.stdout


@pytest.mark.integration
def test_promtool_rule_unit_tests_catch_a_broken_threshold(tmp_path: Path) -> None:
    # The same tests against rules whose freshness threshold was loosened must fail.
    broken = ALERTS_FILE.read_text(encoding="utf-8").replace(
        '(rate(ragstream_ingest_freshness_seconds_bucket{lane="live"}[5m]))\n          ) > 2',
        '(rate(ragstream_ingest_freshness_seconds_bucket{lane="live"}[5m]))\n          ) > 20',
    )
    assert broken != ALERTS_FILE.read_text(encoding="utf-8")
    (tmp_path / "alerts.yml").write_text(broken, encoding="utf-8")
    (tmp_path / "alerts.test.yml").write_bytes(ALERTS_TEST_FILE.read_bytes())
    result = _promtool("test", "rules", str(tmp_path / "alerts.test.yml"))
    assert result.returncode != 0
    assert "RagstreamFreshnessSLOBreach" in result.stdout + result.stderr


@pytest.mark.integration
def test_promtool_check_config_accepts_the_compose_prometheus_config(tmp_path: Path) -> None:
    config = load_yaml(PROMETHEUS_CONFIG)
    config["rule_files"] = [str(ALERTS_FILE)]  # the container path, pointed at the repo
    (tmp_path / "prometheus.yml").write_text(yaml.safe_dump(config), encoding="utf-8")
    result = _promtool("check", "config", str(tmp_path / "prometheus.yml"))
    assert result.returncode == 0, result.stdout + result.stderr


def _exposition() -> bytes:
    from ragcore.embedders.cache import EmbeddingCacheMetrics
    from retrieval_api.grpc_server import GrpcMetrics
    from retrieval_api.metrics import RetrieveMetrics
    from streams.metrics import IngestMetrics

    registry = CollectorRegistry()
    ingest = IngestMetrics(registry)
    EmbeddingCacheMetrics(registry)
    retrieve = RetrieveMetrics(registry)
    grpc_metrics = GrpcMetrics(registry)
    # Labelled metrics only appear in a scrape once a child exists.
    ingest.events.labels("sor.public.entities", "c", "upserted").inc()
    ingest.dlq.labels("DECODE_ERROR").inc()
    ingest.stage_seconds.labels("embed").observe(0.2)
    ingest.backpressure.labels("store").inc()
    ingest.committed_offset.labels("sor.public.entities", "0").set(42)
    ingest.schema_drift.labels("public.tickets", "body").inc()
    ingest.source_heard_age.labels("sor").set(3)
    ingest.slot_retained_bytes.labels("ragstream_entities").set(1024)
    ingest.slot_active.labels("ragstream_entities").set(1)
    ingest.wal_gaps.labels("ragstream_entities").inc()
    ingest.offset_gaps.labels("sor.public.entities", "0").inc()
    retrieve.sor_table_unreadable.labels("public.tickets").set(0)
    retrieve.requests.labels("SUCCESS", "OK").inc()
    retrieve.stage_seconds.labels("search").observe(0.01)
    retrieve.excluded.labels("stale").inc()
    service = "ragstream.retrieval.v1.RetrievalService"
    grpc_metrics.handled.labels("unary", service, "Retrieve", "OK").inc()
    grpc_metrics.handling.labels("unary", service, "Retrieve").observe(0.03)
    return generate_latest(registry)


@pytest.mark.integration
def test_promtool_check_metrics_accepts_the_services_exposition() -> None:
    exposition = _exposition()
    assert b"ragstream_ingest_events_total{" in exposition
    assert b"grpc_server_handled_total{" in exposition
    result = _promtool("check", "metrics", stdin=exposition)
    assert result.returncode == 0, result.stdout + result.stderr


# --- structure -----------------------------------------------------------------------------------


@pytest.mark.unit
def test_the_expected_alerts_exist_with_severity_and_annotations() -> None:
    rules = list(alert_rules())
    assert {r["alert"] for r in rules} == EXPECTED_ALERTS
    for rule in rules:
        assert rule["labels"]["severity"] in {"warning", "critical"}, rule["alert"]
        assert rule["annotations"]["summary"], rule["alert"]
        assert rule["annotations"]["description"], rule["alert"]
        assert rule.get("for"), f"{rule['alert']} needs a `for` to ride out blips"


@pytest.mark.unit
def test_alert_expressions_reference_only_known_metrics() -> None:
    known = known_sample_names()
    for rule in alert_rules():
        names = promql_metric_names(rule["expr"])
        assert names, rule["alert"]
        assert names <= known, (rule["alert"], names - known)


@pytest.mark.unit
def test_grpc_rules_select_the_retrieve_service() -> None:
    for rule in alert_rules():
        if "grpc_server_" in rule["expr"]:
            assert 'grpc_service="ragstream.retrieval.v1.RetrievalService"' in rule["expr"]


@pytest.mark.unit
def test_error_rate_alert_counts_exactly_the_server_side_codes() -> None:
    from ragcore.grpc_codes import SERVER_ERROR_CODES

    rule = next(r for r in alert_rules() if r["alert"] == "RagstreamRetrieveErrorRate")
    matcher = re.search(
        r'ragstream_retrieve_requests_total\{status="FAILED", code=~"([^"]+)"\}', rule["expr"]
    )
    assert matcher, "the FAILED-pack half of the rule must select server-side codes"
    assert set(matcher.group(1).split("|")) == set(SERVER_ERROR_CODES)
    client_codes = {"InvalidArgument", "Unauthenticated", "PermissionDenied", "NotFound"}
    assert not client_codes & set(SERVER_ERROR_CODES)
    assert "ResourceExhausted" not in SERVER_ERROR_CODES


@pytest.mark.unit
def test_every_alert_is_tested_firing_and_quiet() -> None:
    tests = load_yaml(ALERTS_TEST_FILE)["tests"]
    fired: set[str] = set()
    quiet: set[str] = set()
    for test in tests:
        for case in test.get("alert_rule_test", []):
            (fired if case.get("exp_alerts") else quiet).add(case["alertname"])
    assert fired == EXPECTED_ALERTS
    assert quiet == EXPECTED_ALERTS


@pytest.mark.unit
def test_helm_chart_ships_the_same_rule_groups() -> None:
    ours = load_yaml(ALERTS_FILE)["groups"]
    chart = load_yaml(CHART_ALERTS_FILE)["groups"]
    assert chart == ours, "copy deploy/prometheus/alerts.yml to helm/ragstream/files/alerts.yml"
