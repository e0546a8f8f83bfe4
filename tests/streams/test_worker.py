"""The ingest worker against a real Kafka-protocol broker (tansu) and the real qdrant-edge
engine: idempotency, shrinking updates, deletes, ordering, poison records, outages, rebalances.

The embedder is `HashEmbedder` (see tests/streams/support.py): these suites test Kafka and
store semantics, and the real ONNX embedder is exercised end to end in test_worker_local.py.
"""

from __future__ import annotations

import json
import time

import pytest
from confluent_kafka import Producer

from ragcore.mapping import epoch_us
from ragcore.prepare import Preparer
from ragcore.store.base import StoreFilter
from ragdev.services.tansu import free_port
from ragdev.sor.debezium_format import change_event, encode_key, encode_value
from schemas.events import Op
from streams.app import IngestWorker
from tests.streams.support import (
    Record,
    SorModel,
    committed,
    content,
    eid,
    read_all,
)
from tests.streams.worker_env import Env, FlakyStore

pytestmark = pytest.mark.integration


def test_ingesting_an_entity_twice_leaves_exactly_its_chunks_and_embeds_once(
    env: Env, preparer: Preparer
) -> None:
    sor = SorModel()
    record = sor.put("ent-a", "acme", content(sor.rng, 30))
    expected = sor.expected_index(preparer)
    assert len(expected["acme"][eid("ent-a")]) >= 5  # a multi-chunk entity
    env.start_worker()
    env.wait(env.produce([record]))
    texts_after_first = env.embedder.texts
    env.wait(env.produce([record]))  # re-delivery of the same event
    assert env.snapshot(["acme"]) == expected
    assert env.embedder.texts == texts_after_first  # unchanged content: no embedding call
    assert (
        env.metric(
            "ragstream_ingest_events_total",
            {"topic": env.topic, "op": "c", "outcome": "unchanged"},
        )
        == 1
    )


def test_row_change_with_unchanged_content_rewrites_payloads_without_embedding(
    env: Env, preparer: Preparer
) -> None:
    sor = SorModel()
    text = content(sor.rng, 30)
    env.start_worker()
    env.wait(env.produce([sor.put("ent-a", "acme", text)]))
    before = env.snapshot(["acme"])
    texts_before = env.embedder.texts
    env.wait(env.produce([sor.put("ent-a", "acme", text, name="Renamed doc")]))
    assert env.snapshot(["acme"]) == before  # same chunk set, same hashes
    assert env.embedder.texts == texts_before  # nothing re-embedded
    registry = env.workers[0][0].registry
    name = registry.manifest("acme", registry.active_version("acme") or 0).index_name
    points = list(env.store.scroll(name, StoreFilter(tenant_id="acme")))
    assert {p.payload["title"] for p in points} == {"Renamed doc"}
    newest = sor.rows["ent-a"]["updated_at"]
    assert {p.payload["source_updated_at_us"] for p in points} == {epoch_us(newest)}
    hits = env.store.search_dense(
        name, env.embedder.embed_query(text), StoreFilter(tenant_id="acme"), limit=1
    )
    assert hits and hits[0].payload["source_entity_id"] == eid("ent-a")  # vectors kept


def test_update_shrinking_ten_chunks_to_three_then_delete_and_soft_delete(
    env: Env, preparer: Preparer
) -> None:
    sor = SorModel()
    env.start_worker()
    big = sor.put("ent-a", "acme", content(sor.rng, 60))
    other = sor.put("ent-b", "acme", content(sor.rng, 6))
    env.wait(env.produce([big, other]))
    before = env.snapshot(["acme"])["acme"][eid("ent-a")]
    assert len(before) >= 10
    shrink = sor.put("ent-a", "acme", content(sor.rng, 7))
    env.wait(env.produce([shrink]))
    expected = sor.expected_index(preparer)
    assert 2 <= len(expected["acme"][eid("ent-a")]) <= 4
    assert env.snapshot(["acme"]) == expected
    env.wait(env.produce([*sor.delete("ent-a")]))
    assert eid("ent-a") not in env.snapshot(["acme"]).get("acme", {})
    env.wait(env.produce([sor.soft_delete("ent-b")]))
    assert env.snapshot(["acme"]) == {}
    assert env.metric("ragstream_ingest_chunks_deleted_total") >= len(before)


def test_older_version_delivered_after_newer_does_not_overwrite_it(
    env: Env, preparer: Preparer
) -> None:
    sor = SorModel()
    env.start_worker()
    old = sor.put("ent-a", "acme", "The pump needs calibration every month.")
    new = sor.put("ent-a", "acme", "The valve needs replacement every year.")
    expected = sor.expected_index(preparer)
    env.wait(env.produce([new]))
    env.wait(env.produce([old]))  # e.g. a snapshot row or a replay arriving late
    assert env.snapshot(["acme"]) == expected
    assert env.metric("ragstream_ingest_skipped_older_total") == 1


def test_deletes_without_tenant_or_before_remove_the_entity_wherever_it_is(
    env: Env, preparer: Preparer
) -> None:
    sor = SorModel()
    env.start_worker()
    env.wait(
        env.produce(
            [sor.put("ent-a", "acme", "Alpha text."), sor.put("ent-b", "globex", "Beta text.")]
        )
    )
    # REPLICA IDENTITY DEFAULT without a PK in before: only the key names the entity
    bare = change_event(Op.DELETE, before=None, after=None, lsn=99_999)
    env.wait(env.produce([Record(encode_key({"id": "ent-b"}), encode_value(bare))]))
    assert env.snapshot(["acme", "globex"]) == {
        "acme": {
            eid("ent-a"): sor.expected_index(preparer)["acme"][eid("ent-a")],
        }
    }


def test_poison_records_go_to_the_dlq_with_reasons_and_good_ones_are_indexed(
    env: Env, preparer: Preparer
) -> None:
    sor = SorModel()
    good = [sor.put(f"ent-{i}", "acme", content(sor.rng, 3)) for i in range(6)]
    toast_event = json.loads(good[0].value or b"{}")
    toast_event["op"] = "u"
    toast_event["after"]["content"] = "__debezium_unavailable_value"
    no_tenant = json.loads(good[1].value or b"{}")
    no_tenant["after"]["company_id"] = None
    unknown_op = json.loads(good[2].value or b"{}")
    unknown_op["op"] = "x"
    huge = json.loads(good[3].value or b"{}")
    huge["after"]["content"] = "word " * (5 * 1024 * 1024 // 5)
    poison = [
        Record(b'{"id": "p1"}', b"{not json"),
        Record(b'{"id": "p2"}', json.dumps(unknown_op).encode()),
        Record(b'{"id": "ent-0"}', json.dumps(toast_event).encode()),
        Record(b'{"id": "p3"}', json.dumps(no_tenant).encode()),
        Record(b'{"id": "p4"}', json.dumps(huge).encode()),
    ]
    stream = [good[0], poison[0], good[1], poison[1], good[2], poison[2]]
    stream += [good[3], poison[3], good[4], poison[4], good[5]]
    env.start_worker()
    env.wait(env.produce(stream))
    assert env.snapshot(["acme"]) == sor.expected_index(preparer)
    letters = read_all(env.broker.bootstrap_servers, env.dlq)
    reasons = {}
    for msg in letters:
        headers = {k: v.decode() for k, v in msg.headers()}
        where = (headers["ragstream.source.partition"], headers["ragstream.source.offset"])
        reasons[where] = headers["ragstream.error.code"]
        assert headers["ragstream.source.topic"] == env.topic
        assert headers["ragstream.error.message"]
    assert sorted(reasons.values()) == sorted(
        [
            "DECODE_ERROR",
            "UNSUPPORTED_OP",
            "CONTENT_UNAVAILABLE",
            "MAPPING_ERROR",
            "RECORD_TOO_LARGE",
        ]
    )
    assert env.metric("ragstream_ingest_dlq_records_total", {"code": "RECORD_TOO_LARGE"}) == 1


def test_store_outage_pauses_commits_nothing_ahead_and_completes_after_recovery(
    env: Env, preparer: Preparer
) -> None:
    sor = SorModel()
    flaky = FlakyStore(env.store)
    flaky.down = True
    env.start_worker(store=flaky)
    records = sor.random_stream(300, ["acme", "globex"], 40)
    last = env.produce(records)
    deadline = time.monotonic() + 20
    while flaky.failed_writes < 3 and time.monotonic() < deadline:
        time.sleep(0.1)
    assert flaky.failed_writes >= 3
    during = committed(env.broker.bootstrap_servers, env.group, env.topic, list(last))
    # nothing committed past an unwritten record (the commit point may stand at the first
    # offset, its metadata naming the tombstones finished above it)
    assert all(offset <= 0 for offset in during.values()), during
    assert env.metric("ragstream_ingest_backpressure_total", {"dependency": "store"}) >= 3
    flaky.down = False
    env.wait(last)
    assert env.snapshot(["acme", "globex"]) == sor.expected_index(preparer)
    assert env.metric("ragstream_ingest_paused_partitions") == 0


def test_worker_exports_lag_and_backlog_age_per_partition_and_clears_them_when_caught_up(
    env: Env,
) -> None:
    # One record per produce call: each is its own record batch, the case where the tansu dev
    # broker's high watermark (base offset of the last batch + 1) equals the real log end.
    # On real Kafka the high watermark is the log end whatever the batching.
    env.consumer_overrides = {"lag_refresh_s": 0.2}
    sor = SorModel(seed=5)
    flaky = FlakyStore(env.store)
    flaky.down = True
    env.start_worker(store=flaky)
    per_partition: dict[int, int] = {}
    first_produced: dict[int, tuple[float, float]] = {}  # partition -> (before, after)
    # upserts only: while the store's writes fail, every one of them stays pending (a delete
    # would be applied at once, out of offset order, and leave the backlog)
    for record in [sor.put(f"ent-{i}", "acme", content(sor.rng, 2)) for i in range(12)]:
        before = time.time()
        for partition, offset in env.produce([record]).items():
            per_partition[partition] = offset + 1
            first_produced.setdefault(partition, (before, time.time()))
    lag = "ragstream_ingest_consumer_lag_records"
    age = "ragstream_ingest_backlog_age_seconds"

    def labels(partition: int) -> dict[str, str]:
        return {"topic": env.topic, "partition": str(partition)}

    deadline = time.monotonic() + 20
    while time.monotonic() < deadline:
        if all(env.metric(lag, labels(p)) == n for p, n in per_partition.items()):
            break
        time.sleep(0.1)
    assert {p: env.metric(lag, labels(p)) for p in per_partition} == per_partition
    time.sleep(1.0)
    # the store is down: the oldest change of each partition has waited since it was produced
    for partition, (before, after) in first_produced.items():
        now = time.time()
        assert now - after - 0.2 <= env.metric(age, labels(partition)) <= now - before + 0.2
    # every assigned partition is exported, those without records at 0, and nothing else
    exported = {
        s.labels["partition"]
        for family in env.registry.collect()
        if family.name == lag
        for s in family.samples
    }
    assert exported == {"0", "1", "2", "3"}
    flaky.down = False
    env.wait({p: n - 1 for p, n in per_partition.items()})
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline:
        if all(env.metric(lag, labels(p)) == 0 for p in range(4)):
            break
        time.sleep(0.1)
    for partition in range(4):
        assert env.metric(lag, labels(partition)) == 0
        assert env.metric(age, labels(partition)) == 0


@pytest.mark.slow
def test_two_workers_share_partitions_and_a_rebalance_loses_nothing(
    env: Env, preparer: Preparer
) -> None:
    sor = SorModel(seed=11)
    env.session_timeout_ms = 6000  # a loaded machine must not evict a live member
    first = env.start_worker()
    records = sor.random_stream(2000, ["acme", "globex", "initech"], 150)
    last_a = env.produce(records[:1000])
    time.sleep(1.0)
    second = env.start_worker()  # joins: partitions are rebalanced mid-stream
    last_b = env.produce(records[1000:])
    time.sleep(1.5)

    def assigned(worker: IngestWorker) -> float:
        return worker.metrics.registry.get_sample_value("ragstream_ingest_assigned_partitions") or 0

    deadline = time.monotonic() + 30
    while not (assigned(first) > 0 and assigned(second) > 0):
        assert time.monotonic() < deadline, "the partitions were never shared"
        time.sleep(0.2)
    # exactly one member runs group-wide chores (the scheduled reconciliation)
    assert {first.loop.is_designated(), second.loop.is_designated()} == {False, True}
    env.stop_worker(first)  # leaves: its partitions move to the second worker
    deadline = time.monotonic() + 60
    while second.metrics.registry.get_sample_value("ragstream_ingest_assigned_partitions") != 4:
        assert time.monotonic() < deadline, "the second worker never took over every partition"
        time.sleep(0.2)
    assert second.loop.is_designated() is True
    last_c = env.produce(sor.random_stream(200, ["acme", "globex", "initech"], 150))
    lasts = (last_a, last_b, last_c)
    env.wait({p: max(last.get(p, -1) for last in lasts) for p in range(4)}, 90)
    assert env.snapshot(["acme", "globex", "initech"]) == sor.expected_index(preparer)


def test_unreachable_dlq_is_backpressure_on_the_dlq_and_nothing_is_committed_past_it(
    env: Env, preparer: Preparer
) -> None:
    sor = SorModel()
    worker = env.start_worker()
    # The DLQ producer is pointed at a port where no broker listens (a real librdkafka producer,
    # failing for real); the change-event consumer keeps its healthy broker.
    dead = {
        **worker.loop._producer_config(),
        "bootstrap.servers": f"127.0.0.1:{free_port()}",
        "message.timeout.ms": 1500,
    }
    healthy = worker.loop._producer
    worker.loop._producer = Producer(dead)
    good = sor.put("ent-a", "acme", "Alpha text.")
    poison = env.produce([Record(b'{"id": "p1"}', b"{not json")])
    last = env.produce([good])
    for partition, offset in poison.items():
        last[partition] = max(last.get(partition, -1), offset)
    deadline = time.monotonic() + 30
    while env.metric("ragstream_ingest_backpressure_total", {"dependency": "dlq"}) < 2:
        assert time.monotonic() < deadline, "the DLQ outage was never reported"
        time.sleep(0.1)
    assert env.metric("ragstream_ingest_backpressure_total", {"dependency": "store"}) == 0
    during = committed(env.broker.bootstrap_servers, env.group, env.topic, list(poison))
    # the poison's partition is not committed past it (others may move on)
    assert all(during[p] <= offset for p, offset in poison.items()), during
    worker.loop._producer = healthy  # the DLQ is back
    env.wait(last)
    letters = read_all(env.broker.bootstrap_servers, env.dlq)
    assert [dict(m.headers())["ragstream.error.code"] for m in letters] == [b"DECODE_ERROR"]
    assert env.snapshot(["acme"]) == sor.expected_index(preparer)
