"""Shared helpers of the deploy suites: repository paths, the external tools, the metric
catalogue and a small PromQL scanner.

The metric catalogue is built from the code (the metrics classes registered on a fresh
registry), plus the names that are fixed but not implemented yet (reconcile) and the one
external metric the alerts may use (the Kafka lag exporter's `kafka_consumergroup_lag`).
"""

from __future__ import annotations

import os
import re
import shutil
import typing
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any

import pytest
import yaml
from prometheus_client import CollectorRegistry
from pydantic import BaseModel
from pydantic_settings import BaseSettings

REPO_ROOT = Path(__file__).resolve().parents[2]
TOOLS_DIR = REPO_ROOT / ".tools"
COMPOSE_FILE = REPO_ROOT / "docker-compose.yml"
DOCKERFILE = REPO_ROOT / "Dockerfile"
CHART_DIR = REPO_ROOT / "helm" / "ragstream"
ALERTS_FILE = REPO_ROOT / "deploy" / "prometheus" / "alerts.yml"
ALERTS_TEST_FILE = REPO_ROOT / "deploy" / "prometheus" / "alerts.test.yml"
PROMETHEUS_CONFIG = REPO_ROOT / "deploy" / "prometheus" / "prometheus.yml"
DASHBOARD_FILE = REPO_ROOT / "deploy" / "grafana" / "dashboards" / "ragstream.json"
CONNECTOR_FILE = REPO_ROOT / "schemas" / "debezium" / "entities-connector.json"
CHART_ALERTS_FILE = CHART_DIR / "files" / "alerts.yml"
CHART_DASHBOARD_FILE = CHART_DIR / "files" / "dashboards" / "ragstream.json"

INSTALL_HINT = "run scripts/install-tools.sh (installs helm, promtool and kubernetes-validate)"

#: Metrics exported by other components the alerts and dashboard may use (name -> type).
EXTERNAL_METRICS: dict[str, str] = {
    # danielqsj/kafka-exporter: consumer-group lag per topic partition.
    "kafka_consumergroup_lag": "gauge",
}

#: RAGSTREAM_* variables that are read directly, not through a settings class.
NON_SETTINGS_ENV = frozenset(
    {
        "RAGSTREAM_CACHE_DIR",  # ragcore.tokenizers.default_cache_dir (tokenizer files)
    }
)

_SAMPLE_SUFFIXES: dict[str, tuple[str, ...]] = {
    "counter": ("_total", "_created"),
    "gauge": ("",),
    "histogram": ("_bucket", "_sum", "_count", "_created"),
    "summary": ("", "_sum", "_count", "_created"),
}


def find_tool(name: str) -> Path | None:
    """`.tools/<name>` (scripts/install-tools.sh), else `<name>` on PATH."""
    local = TOOLS_DIR / name
    if local.is_file() and os.access(local, os.X_OK):
        return local
    found = shutil.which(name)
    return Path(found) if found else None


def require_tool(name: str) -> Path:
    """The tool's path, or skip the test with the reason and the fix."""
    path = find_tool(name)
    if path is None:
        pytest.skip(f"{name} not installed: {INSTALL_HINT}")
    return path


def load_yaml(path: Path) -> Any:
    with path.open(encoding="utf-8") as fh:
        return yaml.safe_load(fh)


def load_yaml_documents(text: str) -> list[dict[str, Any]]:
    """Every non-empty document of a multi-document YAML stream."""
    return [doc for doc in yaml.safe_load_all(text) if doc]


# --- metrics -------------------------------------------------------------------------------------


def code_metric_families() -> dict[str, str]:
    """name -> type of every metric family the services register (from the code)."""
    from ragcore.embedders.cache import EmbeddingCacheMetrics
    from retrieval_api.admission import AdmissionMetrics
    from retrieval_api.auth import AuthMetrics
    from retrieval_api.grpc_server import GrpcMetrics
    from retrieval_api.metrics import RetrieveMetrics
    from streams.metrics import IngestMetrics
    from streams.reconcile import ReconcileMetrics

    registry = CollectorRegistry()
    IngestMetrics(registry)
    ReconcileMetrics(registry)
    EmbeddingCacheMetrics(registry)
    RetrieveMetrics(registry)
    AdmissionMetrics(registry)
    AuthMetrics(registry)
    GrpcMetrics(registry)
    return {family.name: family.type for family in registry.collect()}


def exposed_names(families: Mapping[str, str]) -> set[str]:
    """Every sample name a scrape of these families can contain (`_total`, `_bucket`, ...)."""
    names: set[str] = set()
    for name, kind in families.items():
        base = name.removesuffix("_total") if kind == "counter" else name
        names.update(base + suffix for suffix in _SAMPLE_SUFFIXES.get(kind, ("",)))
    return names


def known_sample_names() -> set[str]:
    """Sample names the dashboard and the alert rules may reference."""
    return exposed_names({**code_metric_families(), **EXTERNAL_METRICS})


_PROMQL_KEYWORDS = frozenset(
    {"and", "or", "unless", "bool", "offset", "by", "without", "on", "ignoring"}
    | {"group_left", "group_right", "inf", "nan", "atan2"}
)
_STRING = re.compile(r'"(?:[^"\\]|\\.)*"|\'(?:[^\'\\]|\\.)*\'|`[^`]*`')
_MATCHERS = re.compile(r"\{[^{}]*\}")
_RANGES = re.compile(r"\[[^\[\]]*\]")
_GROUPING = re.compile(r"\b(?:by|without|on|ignoring|group_left|group_right)\s*\([^()]*\)")
_VARIABLE = re.compile(r"\$\{[^}]*\}|\$\w+")
_IDENT = re.compile(r"(?<![A-Za-z0-9_.:])[A-Za-z_:][A-Za-z0-9_:]*")


def promql_metric_names(expr: str) -> set[str]:
    """Metric names a PromQL expression selects (functions, keywords, labels excluded).

    A small scanner, not a parser: strings, label matchers, ranges, grouping clauses and
    Grafana variables are removed first; an identifier followed by `(` is a function.
    """
    text = _STRING.sub('""', expr)
    text = _MATCHERS.sub("", text)
    text = _RANGES.sub("", text)
    text = _GROUPING.sub("", text)
    text = _VARIABLE.sub("", text)
    names: set[str] = set()
    for match in _IDENT.finditer(text):
        token = match.group(0)
        if token.lower() in _PROMQL_KEYWORDS:
            continue
        if text[match.end() :].lstrip().startswith("("):
            continue  # function or aggregation
        names.add(token)
    return names


# --- settings ------------------------------------------------------------------------------------


def _model_types(annotation: Any) -> Iterator[type[BaseModel]]:
    """The pydantic models inside an annotation (unions, Optional, Annotated)."""
    if isinstance(annotation, type) and issubclass(annotation, BaseModel):
        yield annotation
        return
    for arg in typing.get_args(annotation):
        yield from _model_types(arg)


def settings_env_names(settings: type[BaseSettings], prefix: str = "RAGSTREAM_") -> set[str]:
    """Every environment variable a settings class reads: each field at every nesting level
    (`RAGSTREAM_KAFKA` as JSON, `RAGSTREAM_KAFKA__BOOTSTRAP_SERVERS`, ...)."""
    names: set[str] = set()

    def walk(model: type[BaseModel], path: str) -> None:
        for field_name, field in model.model_fields.items():
            env = f"{path}{field_name.upper()}"
            names.add(env)
            for sub in _model_types(field.annotation):
                walk(sub, env + "__")

    walk(settings, prefix)
    return names


def all_settings_env_names() -> set[str]:
    """RAGSTREAM_* names of the ingest worker and the Retrieve server, plus the direct ones."""
    from retrieval_api.settings import RetrieveSettings
    from streams.settings import IngestSettings

    return (
        settings_env_names(IngestSettings) | settings_env_names(RetrieveSettings) | NON_SETTINGS_ENV
    )
