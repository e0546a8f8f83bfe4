"""docker-compose.yml cannot run here (no Docker engine): these tests keep it consistent with
the code instead — services, settings names and values, ports, health-gated dependencies, the
Debezium connector config, topics, mounts and credentials."""

from __future__ import annotations

import json
import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import pytest

from tests.deploy.support import (
    COMPOSE_FILE,
    CONNECTOR_FILE,
    PROMETHEUS_CONFIG,
    REPO_ROOT,
    all_settings_env_names,
    load_yaml,
)

pytestmark = pytest.mark.unit

INGEST = "ragstream-ingest"
RETRIEVE = "ragstream-retrieve"
#: Built from the repository's Dockerfile, whose HEALTHCHECK probes grpc.health.v1.
OUR_IMAGE_SERVICES = {INGEST, RETRIEVE}


@pytest.fixture(scope="module")
def compose() -> dict[str, Any]:
    data = load_yaml(COMPOSE_FILE)
    assert isinstance(data, dict)
    return data


@pytest.fixture(scope="module")
def services(compose: dict[str, Any]) -> dict[str, dict[str, Any]]:
    result = compose["services"]
    assert isinstance(result, dict)
    return result


@pytest.fixture(scope="module")
def connector() -> dict[str, str]:
    data = json.loads(CONNECTOR_FILE.read_text(encoding="utf-8"))
    assert isinstance(data, dict)
    return data


def env_of(service: dict[str, Any]) -> dict[str, str]:
    """A service's environment as strings (map form; list form `K=V` also accepted)."""
    raw = service.get("environment") or {}
    if isinstance(raw, list):
        raw = dict(item.split("=", 1) for item in raw)
    return {str(k): "" if v is None else str(v) for k, v in raw.items()}


def bind_mounts(service: dict[str, Any]) -> Iterator[tuple[str, str]]:
    """(host path, container path) of each bind mount (`./...` short syntax)."""
    for volume in service.get("volumes", []):
        source, target = volume.split(":")[:2]
        if source.startswith("."):
            yield source, target


def mount_target(service: dict[str, Any], host_path: str) -> str:
    """Where a repository file is mounted in the service."""
    for source, target in bind_mounts(service):
        if Path(source) == Path(host_path):
            return target
    raise AssertionError(f"{host_path} is not mounted")


def published_container_ports(service: dict[str, Any]) -> set[int]:
    return {int(str(p).rsplit(":", 1)[-1]) for p in service.get("ports", [])}


def exposed_ports(service: dict[str, Any]) -> set[int]:
    return {int(p) for p in service.get("expose", [])} | published_container_ports(service)


def depends_on(service: dict[str, Any]) -> dict[str, str]:
    raw = service.get("depends_on") or {}
    if isinstance(raw, list):
        return dict.fromkeys(raw, "service_started")
    return {name: spec.get("condition", "service_started") for name, spec in raw.items()}


def kafka_init_topics(services: dict[str, dict[str, Any]]) -> dict[str, int]:
    specs = env_of(services["kafka-init"])["TOPICS"].split()
    return {spec.split(":")[0]: int(spec.split(":")[1]) for spec in specs}


def prometheus_targets() -> dict[str, list[str]]:
    config = load_yaml(PROMETHEUS_CONFIG)
    return {
        job["job_name"]: [t for sc in job["static_configs"] for t in sc["targets"]]
        for job in config["scrape_configs"]
    }


# --- services ------------------------------------------------------------------------------------


def test_every_service_the_system_needs_is_defined(services: dict[str, dict[str, Any]]) -> None:
    needed = {
        "postgres",
        "kafka",
        "kafka-init",
        "connect",
        "connect-init",
        "qdrant",
        INGEST,
        RETRIEVE,
        "kafka-exporter",
        "prometheus",
        "grafana",
    }
    assert needed <= set(services), needed - set(services)


def test_images_are_pinned_and_connect_is_debezium_2_or_3(
    services: dict[str, dict[str, Any]],
) -> None:
    for name, svc in services.items():
        image = svc["image"]
        repository, _, tag = image.rpartition(":")
        assert repository and tag and tag != "latest", (name, image)
    repository, _, tag = services["connect"]["image"].rpartition(":")
    assert repository == "quay.io/debezium/connect"
    assert tag.split(".")[0] in {"2", "3"}


def test_our_services_run_the_documented_entry_points(
    services: dict[str, dict[str, Any]],
) -> None:
    assert services[INGEST]["command"] == ["python", "-m", "streams"]
    assert services[RETRIEVE]["command"] == ["python", "-m", "retrieval_api"]
    for name in OUR_IMAGE_SERVICES:
        assert services[name]["build"]["dockerfile"] == "Dockerfile"
        assert services[name]["read_only"] is True


def test_every_repository_file_mounted_exists(services: dict[str, dict[str, Any]]) -> None:
    mounted = [(name, src) for name, svc in services.items() for src, _ in bind_mounts(svc)]
    assert mounted
    missing = [(name, src) for name, src in mounted if not (REPO_ROOT / src).exists()]
    assert not missing


# --- settings ------------------------------------------------------------------------------------


def test_every_ragstream_variable_is_a_settings_field(
    services: dict[str, dict[str, Any]],
) -> None:
    known = all_settings_env_names()
    used = {
        (name, key)
        for name, svc in services.items()
        for key in env_of(svc)
        if key.startswith("RAGSTREAM_")
    }
    assert {name for name, _ in used} == OUR_IMAGE_SERVICES
    unknown = sorted((name, key) for name, key in used if key not in known)
    assert not unknown


def test_the_settings_name_walk_sees_nested_fields() -> None:
    known = all_settings_env_names()
    assert {
        "RAGSTREAM_KAFKA__BOOTSTRAP_SERVERS",
        "RAGSTREAM_CONSUMER__TOPICS",
        "RAGSTREAM_EMBEDDER__API_KEY_FILE",  # from the openai member of the embedder union
        "RAGSTREAM_EMBEDDING_CACHE__PATH",  # from an Optional model
        "RAGSTREAM_AUTH__TOKENS_FILE",
        "RAGSTREAM_GRPC__PORT",
        "RAGSTREAM_AUDIT_TOPIC",
    } <= known
    assert "RAGSTREAM_KAFKA__BOOTSTRAP_SERVER" not in known


def _settings_from(monkeypatch: pytest.MonkeyPatch, env: dict[str, str]) -> None:
    import os

    for key in list(os.environ):
        if key.startswith("RAGSTREAM_"):
            monkeypatch.delenv(key)
    for key, value in env.items():
        monkeypatch.setenv(key, value)


def test_ingest_environment_parses_into_ingest_settings(
    services: dict[str, dict[str, Any]], monkeypatch: pytest.MonkeyPatch
) -> None:
    from streams.settings import IngestSettings

    env = env_of(services[INGEST])
    _settings_from(monkeypatch, env)
    settings = IngestSettings()
    assert settings.kafka.bootstrap_servers == "kafka:9092"
    assert settings.consumer.topics == ("sor.public.entities", "__debezium-heartbeat.sor")
    assert settings.store.backend == "qdrant"
    assert settings.sor.kind == "postgres"
    assert settings.metrics_host == "0.0.0.0"
    assert settings.embedding_cache is not None
    assert settings.embedding_cache.path.is_relative_to(env["RAGSTREAM_CACHE_DIR"])


def test_retrieve_environment_parses_into_retrieve_settings(
    services: dict[str, dict[str, Any]], monkeypatch: pytest.MonkeyPatch
) -> None:
    from retrieval_api.settings import RetrieveSettings

    env = env_of(services[RETRIEVE])
    _settings_from(monkeypatch, env)
    settings = RetrieveSettings()
    assert settings.grpc.host == "0.0.0.0"
    assert settings.metrics_host == "0.0.0.0"
    assert settings.store.backend == "qdrant"
    assert settings.auth.tokens_file is not None
    assert settings.audit_topic == "ragstream.audit"
    assert settings.reindex_topic == "ragstream.reindex-requests"


def test_retrieve_api_tokens_file_is_mounted_and_valid(
    services: dict[str, dict[str, Any]],
) -> None:
    svc = services[RETRIEVE]
    tokens_path = env_of(svc)["RAGSTREAM_AUTH__TOKENS_FILE"]
    host = next(src for src, target in bind_mounts(svc) if target == tokens_path)
    tokens = json.loads((REPO_ROOT / host).read_text(encoding="utf-8"))
    assert tokens
    assert all(re.fullmatch(r"[0-9a-f]{64}", digest) for digest in tokens.values())


def test_writable_paths_of_read_only_containers_are_volumes(
    services: dict[str, dict[str, Any]],
) -> None:
    for name in OUR_IMAGE_SERVICES:
        svc = services[name]
        env = env_of(svc)
        writable = [v.split(":")[1] for v in svc["volumes"] if not v.startswith(".")]
        writable += svc.get("tmpfs", [])
        assert "/tmp" in writable
        paths = [env["RAGSTREAM_CACHE_DIR"]]
        if "RAGSTREAM_EMBEDDING_CACHE__PATH" in env:
            paths.append(env["RAGSTREAM_EMBEDDING_CACHE__PATH"])
        for path in paths:
            assert any(Path(path).is_relative_to(w) for w in writable), (name, path)


# --- ports ---------------------------------------------------------------------------------------


def test_ports_agree_with_settings_and_scrape_targets(
    services: dict[str, dict[str, Any]],
) -> None:
    targets = prometheus_targets()
    ingest_env, retrieve_env = env_of(services[INGEST]), env_of(services[RETRIEVE])
    ingest_metrics = int(ingest_env["RAGSTREAM_METRICS_PORT"])
    retrieve_metrics = int(retrieve_env["RAGSTREAM_METRICS_PORT"])
    grpc_port = int(retrieve_env["RAGSTREAM_GRPC__PORT"])

    assert (ingest_metrics, retrieve_metrics, grpc_port) == (9464, 9465, 50051)
    assert targets[INGEST] == [f"{INGEST}:{ingest_metrics}"]
    assert targets[RETRIEVE] == [f"{RETRIEVE}:{retrieve_metrics}"]
    assert ingest_metrics in exposed_ports(services[INGEST])
    assert retrieve_metrics in exposed_ports(services[RETRIEVE])
    assert grpc_port in published_container_ports(services[RETRIEVE])
    ingest_probe = " ".join(services[INGEST]["healthcheck"]["test"])
    assert f"127.0.0.1:{ingest_metrics}/metrics" in ingest_probe


def test_every_scrape_target_is_a_compose_service(services: dict[str, dict[str, Any]]) -> None:
    for job, targets in prometheus_targets().items():
        for target in targets:
            host, port = target.rsplit(":", 1)
            if host != "localhost":
                assert host in services, (job, target)
                assert int(port) in exposed_ports(services[host]), (job, target)


def test_service_urls_point_at_compose_services(services: dict[str, dict[str, Any]]) -> None:
    for name in OUR_IMAGE_SERVICES:
        env = env_of(services[name])
        kafka_host, kafka_port = env["RAGSTREAM_KAFKA__BOOTSTRAP_SERVERS"].split(":")
        assert kafka_host in services
        listeners = env_of(services[kafka_host])["KAFKA_ADVERTISED_LISTENERS"]
        assert f"//{kafka_host}:{kafka_port}" in listeners
        store = urlsplit(env["RAGSTREAM_STORE__URL"])
        assert store.hostname in services
        dsn = urlsplit(env["RAGSTREAM_SOR__DSN"])
        assert dsn.hostname in services
        assert dsn.path.lstrip("/") == env_of(services["postgres"])["POSTGRES_DB"]


# --- dependencies --------------------------------------------------------------------------------


def _has_healthcheck(name: str, service: dict[str, Any]) -> bool:
    check = service.get("healthcheck")
    if check is not None:
        return not check.get("disable", False)
    return name in OUR_IMAGE_SERVICES  # the image's HEALTHCHECK


def test_health_conditions_reference_services_with_healthchecks(
    services: dict[str, dict[str, Any]],
) -> None:
    conditions = [
        (name, dep, cond) for name, svc in services.items() for dep, cond in depends_on(svc).items()
    ]
    assert conditions
    for name, dep, cond in conditions:
        assert dep in services, (name, dep)
        assert cond in {"service_healthy", "service_completed_successfully"}, (name, dep, cond)
        if cond == "service_healthy":
            assert _has_healthcheck(dep, services[dep]), (name, dep)
        else:
            assert services[dep].get("restart") == "no", (name, dep)


def test_startup_order_gates_on_what_each_service_needs(
    services: dict[str, dict[str, Any]],
) -> None:
    for name in OUR_IMAGE_SERVICES:
        deps = depends_on(services[name])
        # The worker checks at startup that its topics exist.
        assert deps["kafka-init"] == "service_completed_successfully"
        assert deps["qdrant"] == "service_healthy"
        assert deps["postgres"] == "service_healthy"
    assert depends_on(services["connect"])["postgres"] == "service_healthy"
    assert depends_on(services["connect-init"])["connect"] == "service_healthy"


# --- Kafka topics --------------------------------------------------------------------------------


def test_kafka_init_creates_every_topic_the_services_use(
    services: dict[str, dict[str, Any]], connector: dict[str, str]
) -> None:
    from ragstream.dlq import parking_topic_of
    from retrieval_api.settings import RetrieveSettings
    from streams.consumer import ConsumerConfig

    topics = kafka_init_topics(services)
    ingest_env, retrieve_env = env_of(services[INGEST]), env_of(services[RETRIEVE])
    used = {
        *json.loads(ingest_env["RAGSTREAM_CONSUMER__TOPICS"]),
        ingest_env["RAGSTREAM_CONSUMER__DLQ_TOPIC"],
        retrieve_env["RAGSTREAM_AUDIT_TOPIC"],
        retrieve_env["RAGSTREAM_REINDEX_TOPIC"],
    }
    defaults = {
        *ConsumerConfig().topics,
        ConsumerConfig().dlq_topic,
        RetrieveSettings.model_fields["audit_topic"].default,
        RetrieveSettings.model_fields["reindex_topic"].default,
    }
    assert used == {
        "sor.public.entities",
        "__debezium-heartbeat.sor",
        "ragstream.dlq",
        "ragstream.audit",
        "ragstream.reindex-requests",
    }
    assert defaults <= used
    assert used <= set(topics)
    # `ragstream dlq replay` parks what it can never replay beside the DLQ (no auto-creation)
    assert parking_topic_of(ingest_env["RAGSTREAM_CONSUMER__DLQ_TOPIC"]) in topics
    table = connector["table.include.list"]
    assert f"{connector['topic.prefix']}.{table}" in topics
    assert all(partitions >= 1 for partitions in topics.values())


def test_broker_does_not_auto_create_topics(services: dict[str, dict[str, Any]]) -> None:
    assert env_of(services["kafka"])["KAFKA_AUTO_CREATE_TOPICS_ENABLE"] == "false"


# --- Debezium ------------------------------------------------------------------------------------

#: Debezium 1.x names removed or renamed in 2.x/3.x.
LEGACY_PROPERTIES = {
    "database.server.name",  # -> topic.prefix
    "table.whitelist",  # -> table.include.list
    "table.blacklist",
    "schema.whitelist",
    "schema.blacklist",
    "column.whitelist",
    "column.blacklist",
    "database.history.kafka.topic",
    "database.history.kafka.bootstrap.servers",
}


def test_connector_config_uses_debezium_2_and_3_property_names(
    connector: dict[str, str],
) -> None:
    assert not LEGACY_PROPERTIES & set(connector)
    assert connector["connector.class"] == "io.debezium.connector.postgresql.PostgresConnector"
    assert connector["plugin.name"] == "pgoutput"
    assert connector["topic.prefix"] == "sor"
    assert connector["table.include.list"] == "public.entities"
    # a snapshot at first start, and again when the stored position is gone (a WAL gap)
    assert connector["snapshot.mode"] == "when_needed"
    assert int(connector["heartbeat.interval.ms"]) > 0
    assert connector["tasks.max"] == "1"
    assert all(isinstance(v, str) for v in connector.values()), "Connect wants string values"


def test_connector_emits_schemaless_json_for_key_and_value(connector: dict[str, str]) -> None:
    for side in ("key", "value"):
        assert connector[f"{side}.converter"] == "org.apache.kafka.connect.json.JsonConverter"
        assert connector[f"{side}.converter.schemas.enable"] == "false"


def test_connector_table_and_topic_match_what_the_worker_consumes(
    services: dict[str, dict[str, Any]], connector: dict[str, str]
) -> None:
    from ragcore.plan import PlanConfig
    from streams.settings import DecodeSettings

    plan = PlanConfig()  # compose maps the default table
    assert [m.table for m in plan.tables] == connector["table.include.list"].split(",")
    assert plan.topic_prefix == connector["topic.prefix"]
    topics = plan.catalog.topics()
    heartbeats = f"{connector['topic.heartbeat.prefix']}.{connector['topic.prefix']}"
    consumed = json.loads(env_of(services[INGEST])["RAGSTREAM_CONSUMER__TOPICS"])
    # the table topics, and the connector's heartbeat topic (its liveness)
    assert consumed == [*topics, heartbeats]
    assert connector["topic.heartbeat.prefix"] == DecodeSettings().heartbeat_topic_prefix
    assert int(connector["heartbeat.interval.ms"]) <= 10_000


def test_sor_table_keeps_full_replica_identity() -> None:
    ddl = (REPO_ROOT / "schemas" / "sql" / "entities.postgres.sql").read_text(encoding="utf-8")
    assert re.search(r"CREATE TABLE IF NOT EXISTS entities\b", ddl)
    assert re.search(r"ALTER TABLE entities REPLICA IDENTITY FULL", ddl)


def test_postgres_is_set_up_for_logical_decoding(services: dict[str, dict[str, Any]]) -> None:
    pg = services["postgres"]
    command = " ".join(pg["command"])
    assert "wal_level=logical" in command
    ddl_target = mount_target(pg, "./schemas/sql/entities.postgres.sql")
    roles_target = mount_target(pg, "./deploy/postgres/init-roles.sh")
    assert ddl_target.startswith("/docker-entrypoint-initdb.d/")
    assert roles_target.startswith("/docker-entrypoint-initdb.d/")
    # The entrypoint runs init files in name order: the table before the grants on it.
    assert sorted([ddl_target, roles_target]) == [ddl_target, roles_target]


def test_connector_publication_and_slot_are_prepared_by_the_init_script(
    connector: dict[str, str],
) -> None:
    script = (REPO_ROOT / "deploy" / "postgres" / "init-roles.sh").read_text(encoding="utf-8")
    assert connector["publication.autocreate.mode"] == "disabled"
    publication = connector["publication.name"]
    table = connector["table.include.list"]
    assert f"CREATE PUBLICATION {publication} FOR TABLE {table};" in script
    assert re.fullmatch(r"[a-z0-9_]{1,63}", connector["slot.name"])


def _properties(path: Path) -> dict[str, str]:
    lines = path.read_text(encoding="utf-8").splitlines()
    pairs = [line.split("=", 1) for line in lines if line.strip() and not line.startswith("#")]
    return {k.strip(): v.strip() for k, v in pairs}


def test_connector_credentials_resolve_from_the_mounted_properties_file(
    services: dict[str, dict[str, Any]], connector: dict[str, str]
) -> None:
    connect = services["connect"]
    env = env_of(connect)
    assert env["CONNECT_CONFIG_PROVIDERS"] == "file"
    assert env["CONNECT_CONFIG_PROVIDERS_FILE_CLASS"].endswith(".FileConfigProvider")
    refs = {
        key: re.fullmatch(r"\$\{file:([^:]+):([^}]+)\}", value)
        for key, value in connector.items()
        if value.startswith("${")
    }
    assert set(refs) >= {"database.user", "database.password", "database.hostname"}
    mounts = {target: REPO_ROOT / src for src, target in bind_mounts(connect)}
    resolved: dict[str, str] = {}
    for key, match in refs.items():
        assert match is not None, key
        path, prop = match.groups()
        assert path in mounts, f"{key}: {path} is not mounted in connect"
        resolved[key] = _properties(mounts[path])[prop]

    pg_env = env_of(services["postgres"])
    script = (REPO_ROOT / "deploy" / "postgres" / "init-roles.sh").read_text(encoding="utf-8")
    assert resolved["database.hostname"] == "postgres"
    assert int(resolved["database.port"]) == 5432
    assert resolved["database.dbname"] == pg_env["POSTGRES_DB"]
    assert resolved["database.user"] == "debezium"
    assert f"CREATE ROLE {resolved['database.user']} WITH LOGIN REPLICATION" in script
    assert resolved["database.password"] == pg_env["DEBEZIUM_PASSWORD"]
    # No credential is written into the connector config itself.
    assert all(connector[f"database.{k}"].startswith("${file:") for k in ("user", "password"))


def test_ragstream_reads_the_sor_as_the_read_only_role(services: dict[str, dict[str, Any]]) -> None:
    script = (REPO_ROOT / "deploy" / "postgres" / "init-roles.sh").read_text(encoding="utf-8")
    pg_env = env_of(services["postgres"])
    for name in OUR_IMAGE_SERVICES:
        dsn = urlsplit(env_of(services[name])["RAGSTREAM_SOR__DSN"])
        assert dsn.username == "ragstream_reader"
        assert dsn.password == pg_env["SOR_READER_PASSWORD"]
    assert "CREATE ROLE ragstream_reader WITH LOGIN PASSWORD" in script
    assert "GRANT SELECT ON public.entities TO debezium, ragstream_reader;" in script


def test_connector_is_registered_by_the_init_container(
    services: dict[str, dict[str, Any]], connector: dict[str, str]
) -> None:
    init = services["connect-init"]
    env = env_of(init)
    assert (
        mount_target(init, "./schemas/debezium/entities-connector.json")
        == (env["CONNECTOR_CONFIG"])
    )
    assert urlsplit(env["CONNECT_URL"]).hostname == "connect"
    script_target = mount_target(init, "./deploy/debezium/register-connector.sh")
    assert init["entrypoint"] == ["sh", script_target]
    assert connector["name"]


# --- observability -------------------------------------------------------------------------------


def test_prometheus_loads_the_alert_rules(services: dict[str, dict[str, Any]]) -> None:
    config = load_yaml(PROMETHEUS_CONFIG)
    rules_target = mount_target(services["prometheus"], "./deploy/prometheus/alerts.yml")
    assert config["rule_files"] == [rules_target]
    config_target = mount_target(services["prometheus"], "./deploy/prometheus/prometheus.yml")
    assert f"--config.file={config_target}" in services["prometheus"]["command"]


def test_grafana_provisions_the_dashboard_and_datasource(
    services: dict[str, dict[str, Any]],
) -> None:
    grafana = services["grafana"]
    provisioning = mount_target(grafana, "./deploy/grafana/provisioning")
    assert provisioning == "/etc/grafana/provisioning"
    dashboards_dir = mount_target(grafana, "./deploy/grafana/dashboards")
    provider = load_yaml(REPO_ROOT / "deploy/grafana/provisioning/dashboards/ragstream.yml")
    assert provider["providers"][0]["options"]["path"] == dashboards_dir
    datasource = load_yaml(REPO_ROOT / "deploy/grafana/provisioning/datasources/prometheus.yml")
    url = urlsplit(datasource["datasources"][0]["url"])
    assert url.hostname == "prometheus"
    assert url.port in published_container_ports(services["prometheus"])
