"""The service launchers the tests and the dev stack rely on actually start real services."""

from __future__ import annotations

import os

import psycopg
import pytest
from confluent_kafka import Consumer, Producer
from confluent_kafka.admin import AdminClient
from confluent_kafka.cimpl import NewTopic

from ragdev.services.postgres import PostgresCluster
from ragdev.services.tansu import TansuBroker


@pytest.mark.integration
def test_tansu_broker_round_trips_a_keyed_record(kafka_broker: TansuBroker) -> None:
    admin = AdminClient({"bootstrap.servers": kafka_broker.bootstrap_servers})
    futures = admin.create_topics([NewTopic("svc-check", num_partitions=1, replication_factor=1)])
    for future in futures.values():
        future.result(10)
    producer = Producer(
        {"bootstrap.servers": kafka_broker.bootstrap_servers, "enable.idempotence": True}
    )
    producer.produce("svc-check", key=b"k1", value=b"v1", headers=[("h", b"x")])
    assert producer.flush(10) == 0
    consumer = Consumer(
        {
            "bootstrap.servers": kafka_broker.bootstrap_servers,
            "group.id": "svc-check",
            "auto.offset.reset": "earliest",
            "session.timeout.ms": 2000,
            "heartbeat.interval.ms": 300,
        }
    )
    try:
        consumer.subscribe(["svc-check"])
        msg = None
        for _ in range(50):
            msg = consumer.poll(0.5)
            if msg is not None and msg.error() is None:
                break
        assert msg is not None and msg.error() is None
        assert (msg.key(), msg.value(), msg.headers()) == (b"k1", b"v1", [("h", b"x")])
    finally:
        consumer.close()


@pytest.mark.integration
def test_postgres_cluster_accepts_queries(postgres: PostgresCluster) -> None:
    with psycopg.connect(postgres.dsn) as conn:
        row = conn.execute("select current_setting('server_version_num')::int").fetchone()
    assert row is not None and row[0] >= 130000


@pytest.mark.integration
def test_the_services_run_in_sessions_of_their_own(
    kafka_broker: TansuBroker, postgres: PostgresCluster
) -> None:
    """A terminal's Ctrl-C (SIGINT to the foreground process group) reaches ragstream only,
    which then stops the worker before the broker and the database it reads."""
    ours = os.getsid(0)
    for pid in (kafka_broker.pid, postgres.pid):
        assert pid is not None
        assert os.getsid(pid) != ours
        assert os.getpgid(pid) != os.getpgrp()
