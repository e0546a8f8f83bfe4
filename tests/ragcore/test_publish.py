"""The Kafka publisher (audit records, reindex requests) against the real tansu broker, and its
bounds on what each tenant may have queued (one tenant's flood drops only its own records)."""

from __future__ import annotations

import json
import time
import uuid

import pytest
from prometheus_client import CollectorRegistry

from ragcore.kafka_config import KafkaSettings
from ragcore.publish import KafkaPublisher, PublishSettings, TenantQueues
from ragdev.services.tansu import TansuBroker, free_port
from tests.streams.support import create_topics, read_all


@pytest.mark.integration
def test_records_arrive_as_json_keyed_and_counted(kafka_broker: TansuBroker) -> None:
    topic = f"ragstream.audit.{uuid.uuid4().hex[:8]}"
    create_topics(kafka_broker.bootstrap_servers, topic, partitions=1)
    registry = CollectorRegistry()
    publisher = KafkaPublisher(
        KafkaSettings(bootstrap_servers=kafka_broker.bootstrap_servers), registry
    )
    for n in range(3):
        publisher.publish(topic, f"req-{n}", {"n": n, "status": "success"}, tenant="acme")
    publisher.close()
    got = read_all(kafka_broker.bootstrap_servers, topic)
    assert [(m.key(), json.loads(m.value())) for m in got] == [
        (f"req-{n}".encode(), {"n": n, "status": "success"}) for n in range(3)
    ]
    assert registry.get_sample_value("ragstream_publish_records_total", {"topic": topic}) == 3


@pytest.mark.integration
def test_an_unreachable_broker_is_counted_as_failures_not_raised() -> None:
    registry = CollectorRegistry()
    settings = KafkaSettings(
        bootstrap_servers=f"127.0.0.1:{free_port()}",
        extra={"message.timeout.ms": "1500"},
    )
    publisher = KafkaPublisher(settings, registry)
    publisher.publish("ragstream.audit", "req", {"status": "failed"}, tenant="acme")  # no raise
    publisher.close(timeout_s=5)
    assert (
        registry.get_sample_value("ragstream_publish_failures_total", {"topic": "ragstream.audit"})
        == 1
    )


@pytest.mark.integration
def test_close_releases_the_producer_and_a_late_record_is_a_counted_failure(
    kafka_broker: TansuBroker,
) -> None:
    registry = CollectorRegistry()
    publisher = KafkaPublisher(
        KafkaSettings(bootstrap_servers=kafka_broker.bootstrap_servers), registry
    )
    publisher.close()
    publisher.close()  # idempotent
    publisher.publish("ragstream.audit", "late", {"status": "ok"}, tenant="acme")  # no raise
    assert (
        registry.get_sample_value("ragstream_publish_failures_total", {"topic": "ragstream.audit"})
        == 1
    )


def classes(tenant: str) -> str:
    return "bulk" if tenant == "floodco" else "default"


@pytest.mark.integration
def test_one_tenants_flood_never_drops_another_tenants_audit_and_reindex_records(
    kafka_broker: TansuBroker,
) -> None:
    suffix = uuid.uuid4().hex[:8]
    audit, reindex = f"ragstream.audit.{suffix}", f"ragstream.reindex-requests.{suffix}"
    create_topics(kafka_broker.bootstrap_servers, audit, reindex, partitions=1)
    registry = CollectorRegistry()
    # a queue of 2 x 200 records in all: floodco alone would fill it many times over
    publisher = KafkaPublisher(
        KafkaSettings(bootstrap_servers=kafka_broker.bootstrap_servers),
        registry,
        PublishSettings(max_queued_per_tenant=50, max_queued=200),
        tenant_class=classes,
    )
    publisher.publish(audit, "warm-up", {"tenant": "warm-up", "n": 0}, tenant="warm-up")
    deadline = time.monotonic() + 30
    while publisher.undelivered():  # connected: deliveries run during the flood below
        assert time.monotonic() < deadline, "the warm-up record was not delivered"
        time.sleep(0.05)
    # the quiet tenant's 2 x 20 records stay under its own bound of 50 whatever the timing
    flood, quiet = 5000, 20
    for n in range(flood):  # as fast as records can be queued: far faster than delivered
        publisher.publish(audit, f"f-{n}", {"tenant": "floodco", "n": n}, tenant="floodco")
        if n % (flood // quiet) == 0:
            m = n // (flood // quiet)
            record = {"tenant": "globex", "n": m}
            publisher.publish(audit, f"g-{m}", {**record, "schema": "audit"}, tenant="globex")
            publisher.publish(reindex, f"globex:e-{m}", record, tenant="globex")
        assert publisher.undelivered("floodco") <= 50
    publisher.close()
    assert publisher.undelivered() == 0

    got = read_all(kafka_broker.bootstrap_servers, [audit, reindex], timeout=60)
    by_tenant: dict[tuple[str, str], list[int]] = {}
    for message in got:
        record = json.loads(message.value())
        by_tenant.setdefault((message.topic(), record["tenant"]), []).append(record["n"])
    # every one of the quiet tenant's records arrived, in order
    assert by_tenant[(audit, "globex")] == list(range(quiet))
    assert by_tenant[(reindex, "globex")] == list(range(quiet))

    def dropped(topic: str, tenant_class: str) -> float | None:
        labels = {"topic": topic, "tenant_class": tenant_class}
        return registry.get_sample_value("ragstream_publish_dropped_total", labels)

    # the flooding tenant lost some of its own records, counted by its class
    delivered = len(by_tenant[(audit, "floodco")])
    assert 50 <= delivered < flood
    assert dropped(audit, "bulk") == flood - delivered
    assert dropped(audit, "default") is None and dropped(reindex, "default") is None
    sent = registry.get_sample_value("ragstream_publish_records_total", {"topic": reindex})
    assert sent == quiet


@pytest.mark.integration
def test_records_waiting_for_an_unreachable_broker_are_bounded_per_tenant() -> None:
    registry = CollectorRegistry()
    publisher = KafkaPublisher(
        KafkaSettings(
            bootstrap_servers=f"127.0.0.1:{free_port()}", extra={"message.timeout.ms": "1500"}
        ),
        registry,
        PublishSettings(max_queued_per_tenant=20, max_queued=1000),
        tenant_class=classes,
    )
    for n in range(100):
        publisher.publish("ragstream.audit", f"f-{n}", {"n": n}, tenant="floodco")
    for n in range(10):
        publisher.publish("ragstream.audit", f"g-{n}", {"n": n}, tenant="globex")
    assert (publisher.undelivered("floodco"), publisher.undelivered("globex")) == (20, 10)
    value = registry.get_sample_value
    assert value("ragstream_publish_queued", {"tenant_class": "bulk"}) == 20
    labels = {"topic": "ragstream.audit", "tenant_class": "bulk"}
    assert value("ragstream_publish_dropped_total", labels) == 80
    publisher.close(timeout_s=5)  # every queued record times out: counted as failures
    assert publisher.undelivered() == 0
    assert value("ragstream_publish_queued", {"tenant_class": "bulk"}) == 0
    assert value("ragstream_publish_failures_total", {"topic": "ragstream.audit"}) == 30


@pytest.mark.unit
def test_a_tenant_is_bounded_by_its_own_limit_and_by_its_fair_share_of_a_full_queue() -> None:
    queues = TenantQueues(PublishSettings(max_queued_per_tenant=6, max_queued=8))
    assert [queues.take("a") for _ in range(7)] == [True] * 6 + [False]  # its own bound
    # from 8 queued on, a tenant is queued only under its fair share: 8 / 2 tenants = 4
    assert [queues.take("b") for _ in range(5)] == [True] * 4 + [False]
    # a third tenant still gets its share (8 / 3 = 2) of the full queue
    assert [queues.take("c") for _ in range(3)] == [True, True, False]
    assert queues.queued() == 12 < 2 * 8  # soft by the shares of the tenants under theirs
    assert queues.give_back("a") == 5
    assert queues.take("a") is False  # still above the cap, and a holds more than its share
    for tenant in ("c", "c", "a", "a", "a"):
        queues.give_back(tenant)
    assert (queues.queued("c"), queues.queued("a"), queues.queued()) == (0, 2, 6)
    assert queues.take("b") is True  # below the cap again: only its own bound counts
    assert queues.take("b") is True
    assert queues.take("b") is False  # its own bound of 6
