"""The Grafana dashboard: every query uses real metric names, the panels SREs need are there,
the datasource is a variable, and the Helm chart ships the same file."""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

import pytest

from tests.deploy.support import (
    CHART_DASHBOARD_FILE,
    DASHBOARD_FILE,
    code_metric_families,
    known_sample_names,
    promql_metric_names,
)

pytestmark = pytest.mark.unit


@pytest.fixture(scope="module")
def dashboard() -> dict[str, Any]:
    data = json.loads(DASHBOARD_FILE.read_text(encoding="utf-8"))
    assert isinstance(data, dict)
    return data


def panels(dashboard: dict[str, Any]) -> Iterator[dict[str, Any]]:
    for panel in dashboard["panels"]:
        yield panel
        yield from panel.get("panels", [])


def queries(dashboard: dict[str, Any]) -> Iterator[tuple[str, str]]:
    """(panel title, PromQL) of every target."""
    for panel in panels(dashboard):
        for target in panel.get("targets", []):
            yield panel["title"], target["expr"]


def test_promql_scanner_finds_metrics_and_ignores_everything_else() -> None:
    expr = (
        'histogram_quantile(0.95, sum by (stage, le) (rate(a_bucket{job=~"$job", x="y z"}'
        "[$__rate_interval]))) / on (job) group_left sum(b_total offset 5m) > bool 1e3"
        " and time() - c_seconds"
    )
    assert promql_metric_names(expr) == {"a_bucket", "b_total", "c_seconds"}
    assert promql_metric_names("sum(rate(x_total[5m])) by (code)") == {"x_total"}


def test_metric_catalogue_holds_the_documented_names() -> None:
    families = code_metric_families()
    documented = {
        "ragstream_ingest_events_total": "counter",
        "ragstream_ingest_dlq_records_total": "counter",
        "ragstream_ingest_freshness_seconds": "histogram",
        "ragstream_ingest_stage_seconds": "histogram",
        "ragstream_ingest_last_commit_timestamp_seconds": "gauge",
        "ragstream_embedding_cache_hits_total": "counter",
        "ragstream_retrieve_requests_total": "counter",
        "ragstream_retrieve_excluded_total": "counter",
        "grpc_server_handled_total": "counter",
        "grpc_server_handling_seconds": "histogram",
    }
    for name, kind in documented.items():
        family = name.removesuffix("_total") if kind == "counter" else name
        assert families.get(family) == kind, name


def test_every_query_references_only_known_metrics(dashboard: dict[str, Any]) -> None:
    known = known_sample_names()
    found = list(queries(dashboard))
    assert len(found) >= 20
    unknown = [(title, name) for title, expr in found for name in promql_metric_names(expr) - known]
    assert not unknown


def test_dashboard_covers_what_operators_watch(dashboard: dict[str, Any]) -> None:
    referenced = {name for _, expr in queries(dashboard) for name in promql_metric_names(expr)}
    exprs = " ".join(expr for _, expr in queries(dashboard))
    needed = {
        "ragstream_ingest_events_total",  # throughput by outcome
        "ragstream_ingest_last_commit_timestamp_seconds",  # stall
        "kafka_consumergroup_lag",  # lag of the whole group (exporter)
        "ragstream_ingest_consumer_lag_records",  # lag per partition (the worker's own)
        "ragstream_ingest_backlog_age_seconds",  # backlog age per partition
        "ragstream_ingest_freshness_seconds_bucket",  # freshness
        "ragstream_ingest_dlq_records_total",  # DLQ rate
        "ragstream_ingest_stage_seconds_bucket",  # per-stage latency
        "ragstream_embedding_cache_hits_total",  # cache hit rate
        "ragstream_embedding_cache_misses_total",
        "grpc_server_handled_total",  # QPS
        "grpc_server_handling_seconds_bucket",  # latency
        "ragstream_retrieve_requests_total",  # status mix, NO_EVIDENCE
        "ragstream_retrieve_excluded_total",  # stale exclusions
        "ragstream_ingest_read_ahead_records",  # the read-ahead in use ...
        "ragstream_ingest_read_ahead_budget_records",  # ... against its budget
        "ragstream_ingest_read_ahead_bytes",
        "ragstream_ingest_read_ahead_budget_bytes",
        "ragstream_ingest_backlog_records",  # waiting, by tenant class and lane
        "ragstream_ingest_backlog_oldest_age_seconds",
        "ragstream_ingest_read_ahead_dropped_total",  # drops and rescans
        "ragstream_ingest_rescans_total",
        "ragstream_ingest_restart_records_total",
        "ragstream_ingest_commit_metadata_cut_total",
        "ragstream_ingest_loop_heartbeat_timestamp_seconds",  # a lost loop
    }
    assert needed <= referenced, needed - referenced
    for fragment in (
        "sum by (outcome)",
        "histogram_quantile(0.50, sum by (le) (rate(ragstream_ingest_freshness_seconds_bucket",
        "histogram_quantile(0.95, sum by (le) (rate(ragstream_ingest_freshness_seconds_bucket",
        "histogram_quantile(0.95, sum by (stage, le) (rate(ragstream_ingest_stage_seconds_bucket",
        'status="NO_EVIDENCE"',
        # the freshness SLO is judged per tenant class on the live lane
        "sum by (tenant_class, le) (rate(ragstream_ingest_freshness_seconds_bucket"
        '{job=~"$ingest_job", lane="live"}',
        'reason=~"stale|deleted|missing"',
        "sum by (status)",
    ):
        assert fragment in exprs, fragment


def test_grpc_queries_select_the_retrieve_service(dashboard: dict[str, Any]) -> None:
    grpc_exprs = [expr for _, expr in queries(dashboard) if "grpc_server_" in expr]
    assert grpc_exprs
    for expr in grpc_exprs:
        assert 'grpc_service="ragstream.retrieval.v1.RetrievalService"' in expr


def test_datasource_is_a_templated_prometheus_variable(dashboard: dict[str, Any]) -> None:
    variables = {v["name"]: v for v in dashboard["templating"]["list"]}
    assert variables["datasource"]["type"] == "datasource"
    assert variables["datasource"]["query"] == "prometheus"
    for panel in panels(dashboard):
        if panel["type"] == "row":
            continue
        assert panel["datasource"] == {"type": "prometheus", "uid": "${datasource}"}
        for target in panel["targets"]:
            assert target["datasource"]["uid"] == "${datasource}"
    for name in ("ingest_job", "retrieve_job"):
        assert variables[name]["datasource"]["uid"] == "${datasource}"


def test_panels_have_unique_ids_and_fit_the_grid(dashboard: dict[str, Any]) -> None:
    all_panels = list(panels(dashboard))
    ids = [p["id"] for p in all_panels]
    assert len(ids) == len(set(ids))
    for panel in all_panels:
        pos = panel["gridPos"]
        assert pos["x"] >= 0 and pos["x"] + pos["w"] <= 24, panel["title"]
        assert panel.get("title")
        if panel["type"] != "row":
            assert panel["targets"], panel["title"]
    assert dashboard["uid"] == "ragstream-overview"


def test_helm_chart_ships_the_same_dashboard() -> None:
    assert CHART_DASHBOARD_FILE.read_bytes() == DASHBOARD_FILE.read_bytes(), (
        "copy deploy/grafana/dashboards/ragstream.json to helm/ragstream/files/dashboards/"
    )
