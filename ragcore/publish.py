"""Fire-and-forget event publishing (audit records, reindex requests) to Kafka topics.

Delivery is asynchronous so a Retrieve request never waits on Kafka; failures are logged and
counted (`ragstream_publish_failures_total`), never raised into the request path. A record
that cannot even be queued (local queue full) is counted as a failure too.

The producer's queue is shared by every tenant, so one tenant's flood must not fill it for the
others (issue 41). Every record names its tenant, and the publisher counts each tenant's
undelivered records (queued, delivery not yet reported). A record is dropped, and counted in
`ragstream_publish_dropped_total{topic, tenant_class}`, when

1. its tenant already has `max_queued_per_tenant` undelivered records, or
2. `max_queued` records are undelivered in all, *and* its tenant holds its fair share of them
   (`max_queued` / tenants with undelivered records).

This is admission's rule (retrieval_api/admission.py) applied to the queue: a tenant under its
fair share is queued even above `max_queued`, so the total stays below 2 x `max_queued`, which
is the size of librdkafka's own queue (`queue.buffering.max.messages`). A tenant over its
bound loses only its own records; the others keep their room.
"""

from __future__ import annotations

import json
import logging
import math
import threading
import time
from collections import Counter as Tally
from collections.abc import Callable, Mapping
from typing import Any, Protocol

from confluent_kafka import KafkaError, KafkaException, Message, Producer
from prometheus_client import CollectorRegistry, Counter, Gauge
from pydantic import BaseModel, ConfigDict, Field

from ragcore.kafka_config import KafkaSettings

__all__ = ["KafkaPublisher", "PublishSettings", "Publisher", "TenantQueues"]

log = logging.getLogger(__name__)

#: At most one log line naming the tenants whose records were dropped per this many seconds.
DROP_LOG_INTERVAL_S = 60.0


class PublishSettings(BaseModel):
    """How much of the producer's queue one tenant may fill (module docstring)."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    max_queued_per_tenant: int = Field(
        default=10_000,
        ge=1,
        description="Undelivered records one tenant may have queued; its further records "
        "are dropped (counted) until deliveries free room.",
    )
    max_queued: int = Field(
        default=50_000,
        ge=1,
        description="Undelivered records of all tenants above which only tenants under their "
        "fair share (this / tenants with records queued) are queued; the producer's queue "
        "holds twice this.",
    )


class Publisher(Protocol):
    """Publishes JSON records to topics."""

    def publish(self, topic: str, key: str, record: Mapping[str, Any], *, tenant: str) -> None:
        """Queue one record of `tenant` (never blocks the caller on the network)."""
        ...

    def close(self, timeout_s: float = 10.0) -> None:
        """Deliver what is queued, then release resources."""
        ...


class TenantQueues:
    """Undelivered records per tenant, and the rule that drops a tenant's records when it
    holds too many (module docstring). Thread-safe: records are queued by request threads
    and reported delivered by the producer's poller."""

    def __init__(self, settings: PublishSettings) -> None:
        self._settings = settings
        self._queued: dict[str, int] = {}  # only tenants with undelivered records
        self._total = 0
        self._lock = threading.Lock()

    def take(self, tenant: str) -> bool:
        """Count one more undelivered record of `tenant`; False (nothing counted) when the
        record is to be dropped."""
        s = self._settings
        with self._lock:
            mine = self._queued.get(tenant, 0)
            if mine >= s.max_queued_per_tenant:
                return False
            if self._total >= s.max_queued:
                tenants = len(self._queued) + (0 if mine else 1)
                if mine >= max(1, s.max_queued // tenants):
                    return False
            self._queued[tenant] = mine + 1
            self._total += 1
            return True

    def give_back(self, tenant: str) -> int:
        """One record of `tenant` was delivered or failed; its undelivered records left."""
        with self._lock:
            left = self._queued[tenant] - 1
            if left:
                self._queued[tenant] = left
            else:
                del self._queued[tenant]
            self._total -= 1
            return left

    def queued(self, tenant: str | None = None) -> int:
        """Undelivered records (of one tenant, or in total)."""
        with self._lock:
            return self._total if tenant is None else self._queued.get(tenant, 0)


class KafkaPublisher:
    """`Publisher` over an idempotent confluent-kafka producer with a background poller.
    `tenant_class` names a tenant's class for the metrics (never the tenant itself)."""

    def __init__(
        self,
        kafka: KafkaSettings,
        registry: CollectorRegistry,
        settings: PublishSettings | None = None,
        *,
        tenant_class: Callable[[str], str] = lambda _tenant: "default",
    ) -> None:
        settings = settings or PublishSettings()
        self._producer: Producer | None = Producer(
            {
                **kafka.client_config(),
                "enable.idempotence": True,
                "linger.ms": 20,
                # room for the soft cap of `TenantQueues`: it never reaches librdkafka's limit
                "queue.buffering.max.messages": 2 * settings.max_queued,
            }
        )
        self._queues = TenantQueues(settings)
        self._tenant_class = tenant_class
        # drops by tenant since the last log line, and when that line was written
        self._drops: Tally[str] = Tally()
        self._drops_logged = -math.inf
        self._drops_lock = threading.Lock()
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
        self.dropped = Counter(
            "ragstream_publish_dropped_total",
            "Records not queued because their tenant had too many undelivered ones, by topic "
            "and tenant class.",
            ["topic", "tenant_class"],
            registry=registry,
        )
        self.queued = Gauge(
            "ragstream_publish_queued",
            "Records queued for Kafka and not yet reported delivered, by tenant class.",
            ["tenant_class"],
            registry=registry,
            multiprocess_mode="livesum",
        )
        self._stop = threading.Event()
        self._poller = threading.Thread(target=self._poll, name="publisher-poll", daemon=True)
        self._poller.start()

    def _poll(self) -> None:
        producer = self._producer
        while producer is not None and not self._stop.is_set():
            producer.poll(0.2)

    def publish(self, topic: str, key: str, record: Mapping[str, Any], *, tenant: str) -> None:
        """Queue a JSON record of `tenant`; delivery is reported by callback. Dropped (and
        counted) when the tenant holds too much of the queue."""
        tenant_class = self._tenant_class(tenant)

        def delivered(err: KafkaError | None, _msg: Message) -> None:
            self._delivered(tenant, tenant_class)
            if err is None:
                self.sent.labels(topic).inc()
            else:
                self.failures.labels(topic).inc()
                log.error("could not deliver a record to %s: %s", topic, err)

        if self._producer is None:
            self.failures.labels(topic).inc()
            log.error("could not queue a record for %s: the publisher is closed", topic)
            return
        if not self._queues.take(tenant):
            self._drop(topic, tenant, tenant_class)
            return
        value = json.dumps(record, sort_keys=True, default=str).encode()
        try:
            # not under the queues' lock: produce may serve delivery callbacks
            self._producer.produce(topic, key=key.encode(), value=value, on_delivery=delivered)
        except (BufferError, KafkaException) as exc:
            self._queues.give_back(tenant)
            self.failures.labels(topic).inc()
            log.error("could not queue a record for %s: %s", topic, exc)
            return
        self.queued.labels(tenant_class).inc()

    def _delivered(self, tenant: str, tenant_class: str) -> None:
        self._queues.give_back(tenant)
        self.queued.labels(tenant_class).dec()

    def _drop(self, topic: str, tenant: str, tenant_class: str) -> None:
        self.dropped.labels(topic, tenant_class).inc()
        now = time.monotonic()
        with self._drops_lock:  # a line per DROP_LOG_INTERVAL_S, not one per record
            self._drops[tenant] += 1
            if now < self._drops_logged + DROP_LOG_INTERVAL_S:
                return
            drops, self._drops, self._drops_logged = self._drops, Tally(), now
        names = ", ".join(f"{t} ({n})" for t, n in drops.most_common(5))
        log.warning(
            "records dropped: their tenant holds too much of the publisher's queue (%d "
            "undelivered in all); most since the last line: %s",
            self._queues.queued(),
            names,
        )

    def undelivered(self, tenant: str | None = None) -> int:
        """Records queued and not yet reported delivered (of one tenant, or in total)."""
        return self._queues.queued(tenant)

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
