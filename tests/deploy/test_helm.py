"""The Helm chart, linted and rendered with the real helm binary (offline), the manifests
validated against the Kubernetes JSON schemas (kubernetes-validate), and checked for what the
chart promises: non-root read-only pods, native gRPC probes, gated monitoring objects that
reuse deploy/ rules and dashboard, settings names the services read.

The chart declares the optional qdrant dependency, and helm refuses to lint or render a chart
whose declared dependency is missing from charts/ (whatever its condition). Offline, the tests
render a copy of the chart with a metadata-only stub in charts/qdrant; qdrant.enabled=false
(the default) never renders it.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
from pathlib import Path
from typing import Any

import pytest
import yaml

from tests.deploy.support import (
    ALERTS_FILE,
    CHART_DIR,
    CONNECTOR_FILE,
    DASHBOARD_FILE,
    INSTALL_HINT,
    all_settings_env_names,
    load_yaml,
    load_yaml_documents,
    require_tool,
)

pytestmark = pytest.mark.integration

REGISTER_SCRIPT = CHART_DIR.parents[1] / "deploy" / "debezium" / "register-connector.sh"

Manifest = dict[str, Any]
#: The oldest Kubernetes the chart supports (Chart.yaml kubeVersion) and the newest schemas.
K8S_VERSIONS = ("1.25.0", "latest")
MONITORING = ("serviceMonitor.enabled=true", "prometheusRule.enabled=true")
OPENAI = (
    "config.embedder.kind=openai",
    "config.embedder.baseUrl=http://tei:8080/v1",
    "config.embedder.model=bge-small",
    "config.embedder.dimension=384",
)


@pytest.fixture(scope="module")
def helm() -> Path:
    return require_tool("helm")


@pytest.fixture(scope="module")
def chart(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A copy of the chart with an offline stub for the optional qdrant dependency."""
    root = tmp_path_factory.mktemp("chart")
    copy = root / "ragstream"
    shutil.copytree(CHART_DIR, copy, ignore=shutil.ignore_patterns("charts"))
    (dep,) = load_yaml(copy / "Chart.yaml")["dependencies"]
    stub = copy / "charts" / dep["name"]
    stub.mkdir(parents=True)
    (stub / "Chart.yaml").write_text(
        "apiVersion: v2\nname: qdrant\nversion: 1.15.0\n"
        "description: offline stub of the optional dependency (tests only)\n",
        encoding="utf-8",
    )
    return copy


def _helm_env(base: Path) -> dict[str, str]:
    env = dict(os.environ)
    for var in ("HELM_CACHE_HOME", "HELM_CONFIG_HOME", "HELM_DATA_HOME"):
        env[var] = str(base / var.lower())
    return env


def run_helm(
    helm: Path, chart: Path, *args: str, check: bool = True
) -> subprocess.CompletedProcess[str]:
    result = subprocess.run(
        [str(helm), *args],
        cwd=chart.parent,
        env=_helm_env(chart.parent),
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    if check:
        assert result.returncode == 0, result.stdout + result.stderr
    return result


def set_args(values: tuple[str, ...]) -> list[str]:
    return [arg for value in values for arg in ("--set", value)]


def render(helm: Path, chart: Path, *values: str, release: str = "rs") -> list[Manifest]:
    result = run_helm(
        helm, chart, "template", release, str(chart), "--namespace", "search", *set_args(values)
    )
    return load_yaml_documents(result.stdout)


def by_kind(manifests: list[Manifest], kind: str) -> list[Manifest]:
    return [m for m in manifests if m["kind"] == kind]


def one(manifests: list[Manifest], kind: str, component: str | None = None) -> Manifest:
    found = [
        m
        for m in by_kind(manifests, kind)
        if component is None
        or m["metadata"]["labels"].get("app.kubernetes.io/component") == component
    ]
    assert len(found) == 1, (kind, component, [m["metadata"]["name"] for m in found])
    return found[0]


def container(deployment: Manifest) -> Manifest:
    (c,) = deployment["spec"]["template"]["spec"]["containers"]
    assert isinstance(c, dict)
    return c


def k8s_validate(manifest: Manifest, version: str) -> None:
    kv = pytest.importorskip("kubernetes_validate", reason=f"not installed: {INSTALL_HINT}")
    target = kv.latest_version() if version == "latest" else version
    kv.validate(manifest, target, strict=True)


# --- lint and schema validation ------------------------------------------------------------------


@pytest.mark.parametrize(
    "values",
    [(), MONITORING, OPENAI, ("qdrant.enabled=true",)],
    ids=["defaults", "monitoring", "openai-embedder", "bundled-qdrant"],
)
def test_helm_lint_strict_passes(helm: Path, chart: Path, values: tuple[str, ...]) -> None:
    result = run_helm(helm, chart, "lint", "--strict", str(chart), *set_args(values))
    assert "0 chart(s) failed" in result.stdout


@pytest.mark.parametrize("version", K8S_VERSIONS)
def test_default_render_is_valid_for_kubernetes(helm: Path, chart: Path, version: str) -> None:
    manifests = render(helm, chart)
    kinds = sorted(m["kind"] for m in manifests)
    assert kinds == sorted(
        [
            "ConfigMap",  # settings
            "ConfigMap",  # Grafana dashboard
            "CronJob",  # calibrate --stale
            "Deployment",
            "Deployment",
            "HorizontalPodAutoscaler",
            "NetworkPolicy",
            "NetworkPolicy",
            "PodDisruptionBudget",
            "PodDisruptionBudget",
            "Secret",
            "Service",
            "Service",
            "ServiceAccount",
        ]
    )
    for manifest in manifests:
        k8s_validate(manifest, version)


@pytest.mark.parametrize("version", K8S_VERSIONS)
def test_full_render_is_valid_for_kubernetes(helm: Path, chart: Path, version: str) -> None:
    egress = '[{"to":[{"ipBlock":{"cidr":"10.0.0.0/8"}}]}]'
    result = run_helm(
        helm,
        chart,
        "template",
        "rs",
        str(chart),
        *set_args((*MONITORING, *OPENAI, "debezium.register.enabled=true")),
        "--set-json",
        f"networkPolicy.egress={egress}",
        "--set-json",
        'networkPolicy.retrieveFrom=[{"namespaceSelector":{"matchLabels":{"team":"search"}}}]',
    )
    manifests = load_yaml_documents(result.stdout)
    core = [m for m in manifests if m["apiVersion"] != "monitoring.coreos.com/v1"]
    assert {m["kind"] for m in manifests} - {m["kind"] for m in core} == {
        "ServiceMonitor",
        "PrometheusRule",
    }
    for manifest in core:
        k8s_validate(manifest, version)


def test_schema_validation_is_not_vacuous(helm: Path, chart: Path) -> None:
    deployment = one(render(helm, chart), "Deployment", "retrieve")
    container(deployment)["livenessProbe"]["grpcc"] = {"port": 50051}
    kv = pytest.importorskip("kubernetes_validate", reason=f"not installed: {INSTALL_HINT}")
    with pytest.raises(kv.ValidationError):
        k8s_validate(deployment, "latest")


def test_values_schema_rejects_unknown_and_invalid_values(helm: Path, chart: Path) -> None:
    for bad in ("ingest.replica=2", "retrieve.grpc.port=70000", "config.embedder.kind=torch"):
        result = run_helm(helm, chart, "template", "rs", str(chart), "--set", bad, check=False)
        assert result.returncode != 0, bad
        assert "schema" in result.stderr, result.stderr


# --- what the chart promises ---------------------------------------------------------------------


def test_ingest_replicas_may_not_exceed_the_partition_count(helm: Path, chart: Path) -> None:
    manifests = render(helm, chart, "ingest.replicas=6", "ingest.topicPartitions=6")
    ok = one(manifests, "Deployment", "ingest")
    assert ok["spec"]["replicas"] == 6
    result = run_helm(
        helm,
        chart,
        "template",
        "rs",
        str(chart),
        *set_args(("ingest.replicas=7", "ingest.topicPartitions=6", "retrieve.enabled=false")),
        check=False,
    )
    assert result.returncode != 0
    assert "must not exceed ingest.topicPartitions" in result.stderr


def test_pods_run_non_root_on_a_read_only_root_with_writable_scratch(
    helm: Path, chart: Path
) -> None:
    manifests = render(helm, chart)
    pods = [d["spec"]["template"]["spec"] for d in by_kind(manifests, "Deployment")]
    pods += [
        j["spec"]["jobTemplate"]["spec"]["template"]["spec"] for j in by_kind(manifests, "CronJob")
    ]
    assert len(pods) == 3
    for pod in pods:
        (c,) = pod["containers"]
        assert pod["securityContext"]["runAsNonRoot"] is True
        assert pod["securityContext"]["runAsUser"] != 0
        assert pod["automountServiceAccountToken"] is False
        assert c["securityContext"]["readOnlyRootFilesystem"] is True
        assert c["securityContext"]["allowPrivilegeEscalation"] is False
        assert c["securityContext"]["capabilities"]["drop"] == ["ALL"]
        assert c["resources"]["requests"] and c["resources"]["limits"]
        volumes = {v["name"]: v for v in pod["volumes"]}
        mounts = {m["mountPath"]: m["name"] for m in c["volumeMounts"]}
        for path in ("/tmp", "/var/cache/ragstream"):
            assert "emptyDir" in volumes[mounts[path]], (c["name"], path)


def test_retrieve_uses_native_grpc_probes_and_a_grpc_service(helm: Path, chart: Path) -> None:
    manifests = render(helm, chart)
    c = container(one(manifests, "Deployment", "retrieve"))
    grpc_port = next(p["containerPort"] for p in c["ports"] if p["name"] == "grpc")
    for probe in ("startupProbe", "livenessProbe", "readinessProbe"):
        assert c[probe]["grpc"] == {"port": grpc_port}, probe
    service = one(manifests, "Service", "retrieve")
    ports = {p["name"]: p for p in service["spec"]["ports"]}
    assert ports["grpc"]["appProtocol"] == "grpc"
    assert ports["grpc"]["targetPort"] == "grpc"
    assert ports["metrics"]["targetPort"] == "metrics"

    ingest = container(one(manifests, "Deployment", "ingest"))
    assert ingest["livenessProbe"]["httpGet"] == {"path": "/metrics", "port": "metrics"}


def test_probes_can_be_switched_off(helm: Path, chart: Path) -> None:
    manifests = render(
        helm,
        chart,
        "retrieve.livenessProbe.enabled=false",
        "retrieve.startupProbe.enabled=false",
        "ingest.readinessProbe.enabled=false",
    )
    retrieve = container(one(manifests, "Deployment", "retrieve"))
    assert "livenessProbe" not in retrieve
    assert "startupProbe" not in retrieve
    assert "readinessProbe" in retrieve
    assert "readinessProbe" not in container(one(manifests, "Deployment", "ingest"))


def test_autoscaling_owns_retrieve_replicas(helm: Path, chart: Path) -> None:
    manifests = render(helm, chart)
    deployment = one(manifests, "Deployment", "retrieve")
    hpa = one(manifests, "HorizontalPodAutoscaler")
    assert "replicas" not in deployment["spec"]
    assert hpa["spec"]["scaleTargetRef"]["name"] == deployment["metadata"]["name"]
    fixed = render(helm, chart, "retrieve.autoscaling.enabled=false", "retrieve.replicas=3")
    assert not by_kind(fixed, "HorizontalPodAutoscaler")
    assert one(fixed, "Deployment", "retrieve")["spec"]["replicas"] == 3


def test_single_replica_retrieve_gets_no_blocking_disruption_budget(
    helm: Path, chart: Path
) -> None:
    manifests = render(helm, chart, "retrieve.autoscaling.enabled=false", "retrieve.replicas=1")
    budgets = by_kind(manifests, "PodDisruptionBudget")
    components = {b["metadata"]["labels"]["app.kubernetes.io/component"] for b in budgets}
    assert components == {"ingest"}


def _pod_env(manifests: list[Manifest], component: str) -> tuple[dict[str, str], set[str]]:
    """(plain values from the ConfigMap and env, names of every variable) of a component."""
    configmap = next(
        m for m in by_kind(manifests, "ConfigMap") if m["metadata"]["name"].endswith("-config")
    )
    if component == "calibrate":
        job = one(manifests, "CronJob", component)["spec"]["jobTemplate"]["spec"]["template"]
        (c,) = job["spec"]["containers"]
    else:
        c = container(one(manifests, "Deployment", component))
    assert c["envFrom"] == [{"configMapRef": {"name": configmap["metadata"]["name"]}}]
    values = dict(configmap["data"])
    names = set(values)
    for item in c["env"]:
        names.add(item["name"])
        if "value" in item:
            values[item["name"]] = item["value"]
    return values, names


def test_every_variable_the_pods_get_is_a_settings_field(helm: Path, chart: Path) -> None:
    known = all_settings_env_names()
    manifests = render(helm, chart, *OPENAI)
    for component in ("ingest", "retrieve", "calibrate"):
        _, names = _pod_env(manifests, component)
        assert names - known == set(), component


def test_pod_environment_parses_into_the_settings_classes(
    helm: Path, chart: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from retrieval_api.settings import RetrieveSettings
    from streams.settings import IngestSettings

    manifests = render(helm, chart, *OPENAI)
    components: tuple[tuple[str, type[IngestSettings | RetrieveSettings]], ...] = (
        ("ingest", IngestSettings),
        ("retrieve", RetrieveSettings),
        ("calibrate", RetrieveSettings),  # `ragstream calibrate` reads Retrieve's settings
    )
    for component, settings_class in components:
        values, _ = _pod_env(manifests, component)
        for key in list(os.environ):
            if key.startswith("RAGSTREAM_"):
                monkeypatch.delenv(key)
        for key, value in values.items():
            monkeypatch.setenv(key, value)
        settings = settings_class()
        assert settings.store.backend == "qdrant"
        assert settings.embedder.kind == "openai"
        assert settings.metrics_host == "0.0.0.0"
    ingest_values, _ = _pod_env(manifests, "ingest")
    assert json.loads(ingest_values["RAGSTREAM_CONSUMER__TOPICS"]) == [
        "sor.public.entities",
        "__debezium-heartbeat.sor",
    ]


def test_a_nightly_job_refits_stale_calibrations_with_retrieves_settings(
    helm: Path, chart: Path
) -> None:
    result = run_helm(
        helm,
        chart,
        "template",
        "rs",
        str(chart),
        *set_args(
            (
                "retrieve.calibration.schedule=0 2 * * 6",
                "retrieve.calibration.maxSeconds=600",
                "retrieve.extraEnv[0].name=RAGSTREAM_RETRIEVAL__CANDIDATE_MULTIPLIER",
            )
        ),
        "--set-string",
        "retrieve.extraEnv[0].value=6",
        "--set-json",  # --set keeps 0.3 a string
        "retrieve.calibration.staleRatio=0.3",
    )
    manifests = load_yaml_documents(result.stdout)
    job = one(manifests, "CronJob", "calibrate")
    assert job["spec"]["schedule"] == "0 2 * * 6"
    assert job["spec"]["concurrencyPolicy"] == "Forbid"
    spec = job["spec"]["jobTemplate"]["spec"]
    assert spec["activeDeadlineSeconds"] == 600 + 3600
    (c,) = spec["template"]["spec"]["containers"]
    assert c["command"][-6:] == [
        "calibrate",
        "--stale",
        "--stale-ratio",
        "0.3",
        "--max-seconds",
        "600",
    ]
    # the fit must search as Retrieve searches: Retrieve's own extra settings reach it
    retrieve_env = container(one(manifests, "Deployment", "retrieve"))["env"]
    assert {"name": "RAGSTREAM_RETRIEVAL__CANDIDATE_MULTIPLIER", "value": "6"} in c["env"]
    assert {"name": "RAGSTREAM_RETRIEVAL__CANDIDATE_MULTIPLIER", "value": "6"} in retrieve_env
    assert by_kind(render(helm, chart, "retrieve.calibration.enabled=false"), "CronJob") == []
    assert by_kind(render(helm, chart, "retrieve.enabled=false"), "CronJob") == []


QUOTAS = {
    "default": {"concurrency": 4, "requests_per_s": 20},
    "tenants": {"acme": {"concurrency": 16, "burst": 40, "tenant_class": "gold"}},
}


def test_tenant_quotas_reach_retrieve_as_a_reloadable_file(
    helm: Path, chart: Path, tmp_path: Path
) -> None:
    """`retrieve.quotas` becomes a ConfigMap mounted as a directory (kubelet updates it in
    place, the server reloads it) and RAGSTREAM_ADMISSION__QUOTAS_FILE points at it; the file
    is what `load_quotas` reads. Without quotas nothing of it is rendered."""
    from retrieval_api.admission import AdmissionSettings, load_quotas

    values = tmp_path / "quotas.yaml"
    values.write_text(yaml.safe_dump({"retrieve": {"quotas": QUOTAS}}), encoding="utf-8")
    result = run_helm(
        helm, chart, "template", "rs", str(chart), "--namespace", "search", "-f", str(values)
    )
    manifests = load_yaml_documents(result.stdout)
    (configmap,) = [
        m for m in by_kind(manifests, "ConfigMap") if m["metadata"]["name"] == "rs-ragstream-quotas"
    ]
    k8s_validate(configmap, "latest")
    path = tmp_path / "quotas.json"
    path.write_text(configmap["data"]["quotas.json"], encoding="utf-8")
    book = load_quotas(AdmissionSettings(quotas_file=path))
    assert (book.default.concurrency, book.default.requests_per_s) == (4, 20)
    assert (book.of("acme").burst, book.of("acme").tenant_class) == (40, "gold")

    deployment = one(manifests, "Deployment", "retrieve")
    k8s_validate(deployment, "latest")
    c = container(deployment)
    env = {e["name"]: e.get("value") for e in c["env"]}
    assert env["RAGSTREAM_ADMISSION__QUOTAS_FILE"] == "/etc/ragstream/quotas/quotas.json"
    (mount,) = [m for m in c["volumeMounts"] if m["name"] == "quotas"]
    assert mount == {"name": "quotas", "mountPath": "/etc/ragstream/quotas", "readOnly": True}
    volumes = {v["name"]: v for v in deployment["spec"]["template"]["spec"]["volumes"]}
    assert volumes["quotas"]["configMap"] == {"name": "rs-ragstream-quotas"}

    plain = render(helm, chart)
    assert not [m for m in by_kind(plain, "ConfigMap") if m["metadata"]["name"].endswith("-quotas")]
    plain_env = {e["name"] for e in container(one(plain, "Deployment", "retrieve"))["env"]}
    assert "RAGSTREAM_ADMISSION__QUOTAS_FILE" not in plain_env


@pytest.mark.parametrize(
    "bad",
    [
        {"default": {"concurrency": 0}},
        {"tenants": {"acme": {"rps": 5}}},
        {"tenants": {"acme": {"tenant_class": "Gold Tier"}}},
        {"defaults": {}},
    ],
)
def test_values_schema_rejects_invalid_quotas(
    helm: Path, chart: Path, tmp_path: Path, bad: dict[str, Any]
) -> None:
    values = tmp_path / "bad.yaml"
    values.write_text(yaml.safe_dump({"retrieve": {"quotas": bad}}), encoding="utf-8")
    result = run_helm(helm, chart, "template", "rs", str(chart), "-f", str(values), check=False)
    assert result.returncode != 0 and "schema" in result.stderr, (bad, result.stderr)


def test_secret_holds_credentials_and_existing_secret_replaces_it(helm: Path, chart: Path) -> None:
    digest = "a" * 64
    result = run_helm(
        helm,
        chart,
        "template",
        "rs",
        str(chart),
        "--set",
        "secrets.sorDsn=postgresql://reader@pg/sor",
        "--set-json",
        f'secrets.authTokens={{"acme":"{digest}"}}',
    )
    manifests = load_yaml_documents(result.stdout)
    secret = one(manifests, "Secret")
    assert secret["stringData"]["sor-dsn"] == "postgresql://reader@pg/sor"
    assert json.loads(secret["stringData"]["auth-tokens.json"]) == {"acme": digest}
    assert "kafka-sasl-password" not in secret["stringData"]
    retrieve = container(one(manifests, "Deployment", "retrieve"))
    refs = {e["name"]: e["valueFrom"]["secretKeyRef"] for e in retrieve["env"] if "valueFrom" in e}
    assert refs["RAGSTREAM_SOR__DSN"] == {
        "name": secret["metadata"]["name"],
        "key": "sor-dsn",
        "optional": True,
    }

    external = render(helm, chart, "secrets.existingSecret=vault-synced")
    assert not by_kind(external, "Secret")
    pod = one(external, "Deployment", "retrieve")["spec"]["template"]["spec"]
    (secret_volume,) = [v for v in pod["volumes"] if "secret" in v]
    assert secret_volume["secret"]["secretName"] == "vault-synced"
    pod_metadata = one(external, "Deployment", "retrieve")["spec"]["template"]["metadata"]
    assert "checksum/secret" not in pod_metadata["annotations"]


def test_network_policy_opens_only_the_named_ports(helm: Path, chart: Path) -> None:
    manifests = render(helm, chart)
    for component, expected in (("retrieve", {"grpc", "metrics"}), ("ingest", {"metrics"})):
        policy = one(manifests, "NetworkPolicy", component)
        ports = {p["port"] for rule in policy["spec"]["ingress"] for p in rule["ports"]}
        assert ports == expected
        assert policy["spec"]["policyTypes"] == ["Ingress"]
        named = {p["name"] for p in container(one(manifests, "Deployment", component))["ports"]}
        assert ports <= named


# --- monitoring objects --------------------------------------------------------------------------


def test_monitoring_objects_are_off_by_default(helm: Path, chart: Path) -> None:
    kinds = {m["kind"] for m in render(helm, chart)}
    assert not kinds & {"ServiceMonitor", "PrometheusRule"}


def test_service_monitor_scrapes_both_services(helm: Path, chart: Path) -> None:
    manifests = render(helm, chart, *MONITORING, "serviceMonitor.additionalLabels.release=kps")
    monitor = one(manifests, "ServiceMonitor")
    assert monitor["metadata"]["labels"]["release"] == "kps"
    selector = monitor["spec"]["selector"]["matchLabels"]
    assert monitor["spec"]["namespaceSelector"] == {"matchNames": ["search"]}
    selected = [
        s
        for s in by_kind(manifests, "Service")
        if selector.items() <= s["metadata"]["labels"].items()
    ]
    assert {s["metadata"]["labels"]["app.kubernetes.io/component"] for s in selected} == {
        "ingest",
        "retrieve",
    }
    (endpoint,) = monitor["spec"]["endpoints"]
    assert endpoint["path"] == "/metrics"
    for service in selected:
        assert endpoint["port"] in {p["name"] for p in service["spec"]["ports"]}


def test_debezium_registration_carries_the_tested_connector_config(helm: Path, chart: Path) -> None:
    # one source of truth: the chart ships byte-identical copies of what compose mounts and
    # what the real-Debezium tests run (schemas/debezium/entities-connector.json)
    for name, source in (
        ("entities-connector.json", CONNECTOR_FILE),
        ("register-connector.sh", REGISTER_SCRIPT),
    ):
        assert (CHART_DIR / "files" / "debezium" / name).read_bytes() == source.read_bytes()
    assert not by_kind(render(helm, chart), "Job")  # off by default
    manifests = render(
        helm, chart, "debezium.register.enabled=true", "debezium.register.connectUrl=http://c:8083"
    )
    config_map = one(manifests, "ConfigMap", "debezium")
    rendered = json.loads(config_map["data"]["entities-connector.json"])
    assert rendered == json.loads(CONNECTOR_FILE.read_text(encoding="utf-8"))
    job = one(manifests, "Job", "debezium")
    assert job["metadata"]["annotations"]["helm.sh/hook"] == "post-install,post-upgrade"
    pod = job["spec"]["template"]["spec"]
    (c,) = pod["containers"]
    env = {e["name"]: e["value"] for e in c["env"]}
    assert env == {
        "CONNECT_URL": "http://c:8083",
        "CONNECTOR_CONFIG": "/config/entities-connector.json",
    }
    assert c["securityContext"]["readOnlyRootFilesystem"] is True
    for manifest in (config_map, job):
        k8s_validate(manifest, "latest")


def test_prometheus_rule_carries_the_deploy_alert_groups(helm: Path, chart: Path) -> None:
    rule = one(render(helm, chart, *MONITORING), "PrometheusRule")
    assert rule["spec"]["groups"] == load_yaml(ALERTS_FILE)["groups"]


def test_prometheus_rule_passes_promtool(helm: Path, chart: Path, tmp_path: Path) -> None:
    promtool = require_tool("promtool")
    rule = one(render(helm, chart, *MONITORING), "PrometheusRule")
    rules_file = tmp_path / "rules.yml"
    rules_file.write_text(yaml.safe_dump(rule["spec"]), encoding="utf-8")
    result = subprocess.run(
        [str(promtool), "check", "rules", str(rules_file)],
        capture_output=True,
        text=True,
        check=False,
        timeout=60,
    )
    assert result.returncode == 0, result.stdout + result.stderr


def test_grafana_dashboard_configmap_for_the_sidecar(helm: Path, chart: Path) -> None:
    manifests = render(helm, chart)
    configmap = next(
        m for m in by_kind(manifests, "ConfigMap") if m["metadata"]["name"].endswith("-dashboard")
    )
    assert configmap["metadata"]["labels"]["grafana_dashboard"] == "1"
    assert json.loads(configmap["data"]["ragstream.json"]) == json.loads(
        DASHBOARD_FILE.read_text(encoding="utf-8")
    )
    off = render(helm, chart, "grafanaDashboard.enabled=false")
    assert not [
        m for m in by_kind(off, "ConfigMap") if m["metadata"]["name"].endswith("-dashboard")
    ]


# --- optional Qdrant -----------------------------------------------------------------------------


def test_qdrant_is_an_optional_dependency(helm: Path, chart: Path) -> None:
    (dep,) = load_yaml(CHART_DIR / "Chart.yaml")["dependencies"]
    assert dep["name"] == "qdrant"
    assert dep["condition"] == "qdrant.enabled"
    assert dep["repository"] == "https://qdrant.github.io/qdrant-helm"
    assert load_yaml(CHART_DIR / "values.yaml")["qdrant"]["enabled"] is False

    def store_url(manifests: list[Manifest]) -> str:
        configmap = next(
            m for m in by_kind(manifests, "ConfigMap") if m["metadata"]["name"].endswith("-config")
        )
        return str(configmap["data"]["RAGSTREAM_STORE__URL"])

    assert store_url(render(helm, chart)) == "http://qdrant:6333"
    bundled = render(helm, chart, "qdrant.enabled=true", release="prod")
    assert store_url(bundled) == "http://prod-qdrant:6333"
