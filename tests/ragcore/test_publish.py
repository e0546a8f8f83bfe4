"""The Kafka publisher (audit records, reindex requests) against the real tansu broker."""

from __future__ import annotations

import json
import uuid

import pytest
from prometheus_client import CollectorRegistry

from ragcore.kafka_config import KafkaSettings
from ragcore.publish import KafkaPublisher
from ragdev.services.tansu import TansuBroker, free_port
from tests.streams.support import create_topics, read_all

pytestmark = pytest.mark.integration


def test_records_arrive_as_json_keyed_and_counted(kafka_broker: TansuBroker) -> None:
    topic = f"ragstream.audit.{uuid.uuid4().hex[:8]}"
    create_topics(kafka_broker.bootstrap_servers, topic, partitions=1)
    registry = CollectorRegistry()
    publisher = KafkaPublisher(
        KafkaSettings(bootstrap_servers=kafka_broker.bootstrap_servers), registry
    )
    for n in range(3):
        publisher.publish(topic, f"req-{n}", {"n": n, "status": "success"})
    publisher.close()
    got = read_all(kafka_broker.bootstrap_servers, topic)
    assert [(m.key(), json.loads(m.value())) for m in got] == [
        (f"req-{n}".encode(), {"n": n, "status": "success"}) for n in range(3)
    ]
    assert registry.get_sample_value("ragstream_publish_records_total", {"topic": topic}) == 3


def test_an_unreachable_broker_is_counted_as_failures_not_raised() -> None:
    registry = CollectorRegistry()
    settings = KafkaSettings(
        bootstrap_servers=f"127.0.0.1:{free_port()}",
        extra={"message.timeout.ms": "1500"},
    )
    publisher = KafkaPublisher(settings, registry)
    publisher.publish("ragstream.audit", "req", {"status": "failed"})  # must not raise
    publisher.close(timeout_s=5)
    assert (
        registry.get_sample_value("ragstream_publish_failures_total", {"topic": "ragstream.audit"})
        == 1
    )


def test_close_releases_the_producer_and_a_late_record_is_a_counted_failure(
    kafka_broker: TansuBroker,
) -> None:
    registry = CollectorRegistry()
    publisher = KafkaPublisher(
        KafkaSettings(bootstrap_servers=kafka_broker.bootstrap_servers), registry
    )
    publisher.close()
    publisher.close()  # idempotent
    publisher.publish("ragstream.audit", "late", {"status": "success"})  # must not raise
    assert (
        registry.get_sample_value("ragstream_publish_failures_total", {"topic": "ragstream.audit"})
        == 1
    )
