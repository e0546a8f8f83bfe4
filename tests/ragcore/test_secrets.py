"""Secrets never show: every settings path that takes one is fed a unique marker, and every
place settings are shown (repr, str, `ragstream config`, the worker's connect log line) is
searched for it."""

from __future__ import annotations

import json
import logging
import os
import subprocess
import sys
import uuid
from collections.abc import Sequence

import pytest
from prometheus_client import CollectorRegistry

from ragcore.kafka_config import KafkaSettings, is_secret_key
from ragcore.settings import settings_report
from ragdev.services.tansu import TansuBroker
from retrieval_api.settings import RetrieveSettings
from schemas.events import RawRecord
from streams.consumer import ConsumerConfig, ConsumerLoop, DeadLetter
from streams.metrics import IngestMetrics
from streams.settings import IngestSettings
from tests.streams.support import create_topics

#: env var -> the secret it carries (each unique, so a leak names its path)
SECRETS = {
    "RAGSTREAM_KAFKA__SASL_PASSWORD": "leak-sasl-password-1",
    "RAGSTREAM_KAFKA__SSL_KEY_PASSWORD": "leak-ssl-key-password-2",
    "RAGSTREAM_KAFKA__EXTRA": json.dumps(
        {
            "sasl.oauthbearer.client.secret": "leak-oauth-secret-3",
            "ssl.key.pem": "leak-pem-4",
            "sasl.oauthbearer.config": "principal=leak-oauth-config-5",
            "ssl.keystore.password": "leak-keystore-6",
            "sasl.username": "leak-user-7",
            "queue.buffering.max.ms": "5",
        }
    ),
    "RAGSTREAM_SOR__DSN": "postgresql://reader:leak-dsn-8@db:5432/sor",
    "RAGSTREAM_STORE__API_KEY": "leak-qdrant-key-9",
    "RAGSTREAM_EMBEDDER": json.dumps(
        {
            "kind": "openai",
            "base_url": "http://127.0.0.1:1/v1",
            "model": "m",
            "dimension": 8,
            "api_key": "leak-embedder-key-10",
        }
    ),
    "RAGSTREAM_AUDIT_HMAC_KEY": "leak-audit-key-11",
    "RAGSTREAM_RERANKER": json.dumps(
        {"kind": "http", "base_url": "http://127.0.0.1:1", "api_key": "leak-rerank-key-12"}
    ),
}
MARKERS = [
    f"leak-{part}"
    for part in (
        "sasl",
        "ssl",
        "oauth",
        "pem",
        "keystore",
        "user",
        "dsn",
        "qdrant",
        "embedder",
        "audit",
        "rerank",
    )
]


def _leaks(text: str) -> list[str]:
    return [m for m in MARKERS if m in text]


@pytest.fixture
def secret_env(monkeypatch: pytest.MonkeyPatch) -> None:
    for name, value in SECRETS.items():
        monkeypatch.setenv(name, value)


@pytest.mark.unit
def test_settings_repr_str_and_report_mask_every_secret(secret_env: None) -> None:
    for settings in (IngestSettings(), RetrieveSettings()):
        # the secrets did arrive (else this test would pass vacuously)
        dumped = settings.model_dump_json()  # pydantic's own masking of SecretStr applies
        assert "queue.buffering.max.ms" in dumped
        kafka = settings.kafka
        assert kafka.client_config()["sasl.oauthbearer.client.secret"] == "leak-oauth-secret-3"
        for shown in (repr(settings), str(settings), json.dumps(settings_report(settings))):
            assert _leaks(shown) == []
        assert _leaks(repr(kafka)) == [] and _leaks(str(kafka.redacted_config())) == []
    report = settings_report(IngestSettings())
    assert report["kafka"]["extra"]["queue.buffering.max.ms"] == "5"  # not a secret: shown


@pytest.mark.unit
def test_ragstream_config_prints_the_effective_settings_without_secrets() -> None:
    env = {**os.environ, **SECRETS}
    done = subprocess.run(
        [sys.executable, "-m", "ragstream.cli", "config"],
        env=env,
        capture_output=True,
        text=True,
        check=True,
        timeout=60,
    )
    doc = json.loads(done.stdout)
    assert doc["ingest"]["sor"]["dsn"] == "**********"
    assert doc["retrieve"]["embedder"]["model"] == "m"
    assert _leaks(done.stdout + done.stderr) == []


@pytest.mark.unit
@pytest.mark.parametrize(
    ("key", "secret"),
    [
        ("sasl.password", True),
        ("sasl.oauthbearer.client.secret", True),
        ("sasl.username", True),
        ("sasl.mechanism", False),
        ("ssl.key.pem", True),
        ("ssl.keystore.password", True),
        ("ssl.ca.location", False),
        ("api_key", True),
        ("access_token", True),
        ("queue.buffering.max.ms", False),
        ("keyword_fields", False),
    ],
)
def test_secret_looking_keys(key: str, secret: bool) -> None:
    assert is_secret_key(key) is secret


@pytest.mark.integration
def test_the_worker_connect_log_line_masks_librdkafka_secrets(
    kafka_broker: TansuBroker, caplog: pytest.LogCaptureFixture
) -> None:
    kafka = KafkaSettings(
        bootstrap_servers=kafka_broker.bootstrap_servers,
        extra={"sasl.oauthbearer.client.secret": "leak-oauth-secret-3", "linger.ms": "5"},
    )
    dlq = f"dlq.{uuid.uuid4().hex[:8]}"
    create_topics(kafka_broker.bootstrap_servers, dlq)
    config = ConsumerConfig(topics=("^never-matching-.*",), dlq_topic=dlq)

    class Nothing:
        def handle(self, records: Sequence[RawRecord]) -> Sequence[DeadLetter]:
            return []

    loop = ConsumerLoop(kafka, config, Nothing(), IngestMetrics(CollectorRegistry()))
    with caplog.at_level(logging.DEBUG):
        try:
            loop.start()
        finally:
            loop.close()
    assert "linger.ms" in caplog.text  # the configuration was logged
    assert _leaks(caplog.text) == []
