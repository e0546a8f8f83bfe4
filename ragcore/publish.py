"""Fire-and-forget event publishing (audit records, reindex requests) to Kafka topics.

Delivery is asynchronous so a Retrieve request never waits on Kafka; failures are logged and
counted (`ragstream_publish_failures_total`), never raised into the request path. A record
that cannot even be queued (local queue full) is counted as a failure too.
"""

from __future__ import annotations

import json
import logging
import threading
from collections.abc import Mapping
from typing import Any, Protocol

from confluent_kafka import KafkaError, KafkaException, Message, Producer
from prometheus_client import CollectorRegistry, Counter

from ragcore.kafka_config import KafkaSettings

log = logging.getLogger(__name__)


class Publisher(Protocol):
    """Publishes JSON records to topics."""

    def publish(self, topic: str, key: str, record: Mapping[str, Any]) -> None:
        """Queue one record (never blocks the caller on the network)."""
        ...

    def close(self, timeout_s: float = 10.0) -> None:
        """Deliver what is queued, then release resources."""
        ...


class KafkaPublisher:
    """`Publisher` over an idempotent confluent-kafka producer with a background poller."""

    def __init__(self, kafka: KafkaSettings, registry: CollectorRegistry) -> None:
        self._producer: Producer | None = Producer(
            {**kafka.client_config(), "enable.idempotence": True, "linger.ms": 20}
        )
        self.sent = Counter(
            "ragstream_publish_records_total",
            "Records delivered to Kafka, by topic.",
            ["topic"],
            registry=registry,
        )
        self.failures = Counter(
            "ragstream_publish_failures_total",
            "Records that could not be delivered, by topic.",
            ["topic"],
            registry=registry,
        )
        self._stop = threading.Event()
        self._poller = threading.Thread(target=self._poll, name="publisher-poll", daemon=True)
        self._poller.start()

    def _poll(self) -> None:
        producer = self._producer
        while producer is not None and not self._stop.is_set():
            producer.poll(0.2)

    def publish(self, topic: str, key: str, record: Mapping[str, Any]) -> None:
        """Queue a JSON record; delivery is reported by callback."""

        def delivered(err: KafkaError | None, _msg: Message) -> None:
            if err is None:
                self.sent.labels(topic).inc()
            else:
                self.failures.labels(topic).inc()
                log.error("could not deliver a record to %s: %s", topic, err)

        value = json.dumps(record, sort_keys=True, default=str).encode()
        if self._producer is None:
            self.failures.labels(topic).inc()
            log.error("could not queue a record for %s: the publisher is closed", topic)
            return
        try:
            self._producer.produce(topic, key=key.encode(), value=value, on_delivery=delivered)
        except (BufferError, KafkaException) as exc:
            self.failures.labels(topic).inc()
            log.error("could not queue a record for %s: %s", topic, exc)

    def close(self, timeout_s: float = 10.0) -> None:
        """Flush, stop the poller and release the producer (its connections close now, not
        when it is collected: a shutdown that stops the broker next logs no refused
        reconnects). Idempotent."""
        self._stop.set()
        self._poller.join(2)
        producer, self._producer = self._producer, None
        if producer is None:
            return
        remaining = producer.flush(timeout_s)
        if remaining:
            log.error("%d records were not delivered before shutdown", remaining)
