"""A restart redoes what was finished above the committed offset (tansu keeps no commit
metadata; Kafka's is cut at `max_metadata_bytes`): an entity deleted before the restart must not
be indexed again from its older, redone insert (issue 42; found while writing
tests/e2e/test_real_cdc_scale.py, whose index watch would flag it). The worker reads a newly
assigned partition up to the end it had at the assignment before applying any of it
(`redo_hold_s`), so the redone insert and delete meet in the queue and the delete supersedes.

The real worker (`streams.app.build_worker`, qdrant-edge, the tansu broker) is stepped with
`ConsumerLoop.run_once`, so the interleaving is exact: another tenant's records below the
entity's insert stay unfinished (dropped for room: its read-ahead share is 10 records), which
keeps the committed offset below the insert while the insert and then the delete are applied.
"""

from __future__ import annotations

import time
import uuid
from collections.abc import Callable
from pathlib import Path

import pytest
from prometheus_client import CollectorRegistry

from ragcore.kafka_config import KafkaSettings
from ragcore.settings import StoreSettings
from ragcore.store.edge import EdgeStore
from ragdev.services.tansu import TansuBroker
from streams.app import IngestWorker, build_worker
from streams.consumer import ConsumerConfig, SchedulerSettings
from streams.settings import IngestSettings
from tests.streams.support import (
    HashEmbedder,
    SorModel,
    committed,
    create_topics,
    entities_plan,
    index_snapshot,
    produce,
)

pytestmark = pytest.mark.integration


def step_until(worker: IngestWorker, done: Callable[[], bool], what: str) -> None:
    """Run the worker's intake and apply cycle (`run_once`) until `done`."""
    deadline = time.monotonic() + 60
    while not done():
        assert time.monotonic() < deadline, f"not reached: {what}"
        worker.loop.run_once()


def test_a_restart_does_not_index_again_an_entity_deleted_before_it(
    kafka_broker: TansuBroker, tmp_path: Path
) -> None:
    suffix = uuid.uuid4().hex[:8]
    topic, dlq, group = f"redo.{suffix}", f"redo.dlq.{suffix}", f"redo-{suffix}"
    create_topics(kafka_broker.bootstrap_servers, topic, dlq, partitions=1)
    store = EdgeStore(tmp_path / "store")

    def worker(fetch: int) -> IngestWorker:
        built = build_worker(
            IngestSettings(
                kafka=KafkaSettings(bootstrap_servers=kafka_broker.bootstrap_servers),
                consumer=ConsumerConfig(
                    topics=(topic,),
                    dlq_topic=dlq,
                    group_id=group,
                    session_timeout_ms=2000,
                    heartbeat_interval_ms=300,
                    poll_timeout_s=0.2,
                    max_batch_records=fetch,
                    scheduler=SchedulerSettings(read_ahead_records=20),  # a tenant holds 10
                ),
                store=StoreSettings(data_dir=tmp_path / "store"),
                embedding_cache=None,
                plan=entities_plan("public.entities", topic),
            ),
            CollectorRegistry(),
            store=store,
            embedder=HashEmbedder(),
        )
        built.check()
        built.loop.start()
        return built

    def indexed() -> set[str]:
        return set(index_snapshot(store, first.registry, ["acme"]).get("acme", {}))

    sor = SorModel()
    bulk = [sor.put(f"bulk-{n:03d}", "globex", f"Bulk row {n}.") for n in range(200)]
    insert = sor.put("gone", "acme", "A row that is deleted again.")
    more = [sor.put(f"bulk-{n:03d}", "globex", f"Bulk row {n}.") for n in range(200, 260)]
    last = produce(kafka_broker.bootstrap_servers, topic, [*bulk, insert, *more])
    insert_offset = 200
    first = worker(fetch=500)
    try:
        # globex holds 10 records, the rest of its are dropped for a later rescan; acme's
        # insert is kept and applied at once, above the dropped records
        step_until(first, lambda: "entities:gone" in indexed(), "the insert applied")
        # the delete, applied at once too (the rescans advance globex 10 records a cycle)
        delete = sor.delete("gone")
        last = produce(kafka_broker.bootstrap_servers, topic, delete)
        step_until(first, lambda: "entities:gone" not in indexed(), "the delete applied")
    finally:
        first.loop.close()  # leaves the group, committing what it finished
        first.close()
    point = committed(kafka_broker.bootstrap_servers, group, topic, [0])[0]
    assert point <= insert_offset  # both above the committed offset: redone after a restart

    # the restart reads from the committed offset, 20 records per fetch: the insert is
    # applied again before the intake reaches the delete, 60 records further
    second = worker(fetch=20)
    came_back: list[int] = []
    try:

        def through() -> bool:
            if "entities:gone" in indexed():
                came_back.append(committed(kafka_broker.bootstrap_servers, group, topic, [0])[0])
            return committed(kafka_broker.bootstrap_servers, group, topic, [0])[0] > last[0]

        step_until(second, through, "the restarted worker past the delete")
        assert "entities:gone" not in indexed()  # the end state is right either way
    finally:
        second.loop.close()
        second.close()
        store.close()
    assert came_back == [], "the deleted entity was indexed again from its older insert"
