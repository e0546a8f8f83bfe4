"""No row can stop the lane (issue 41): rows whose content used to kill the ingest worker, and a
stage that raises what it never should, end as dead letters naming their table, column, entity
and tenant, while the rest of the batch and the partition move on. Real broker, real engine."""

from __future__ import annotations

from typing import Any

import pytest
from prometheus_client import CollectorRegistry

from ragcore.errors import ConfigError
from ragcore.prepare import Preparer
from ragdev.sor.debezium_format import change_event, encode_key, encode_value
from schemas.entities import Chunk, Entity
from schemas.events import Op, RawRecord
from streams.app import build_worker
from streams.ingest import IngestHandler
from tests.streams.support import (
    Record,
    SorModel,
    content,
    create_topics,
    eid,
    produce,
    read_all,
    wait_committed,
)
from tests.streams.worker_env import Env

pytestmark = pytest.mark.integration


def letters_by_entity(env: Env) -> dict[str, dict[str, str]]:
    """The DLQ's `ragstream.*` headers of every letter, by the entity header (or offset)."""
    out: dict[str, dict[str, str]] = {}
    for msg in read_all(env.broker.bootstrap_servers, env.dlq):
        headers = {k: (v or b"").decode() for k, v in msg.headers()}
        where = f"{headers['ragstream.source.partition']}@{headers['ragstream.source.offset']}"
        key = headers.get("ragstream.error.entity") or where
        out[key] = headers
    return out


def raw_change(op: Op, key: str, before: Any, after: Any, lsn: int) -> Record:
    return Record(
        encode_key({"id": key}), encode_value(change_event(op, before=before, after=after, lsn=lsn))
    )


def test_rows_that_killed_the_worker_are_dead_lettered_and_later_rows_are_indexed(
    env: Env, preparer: Preparer
) -> None:
    sor = SorModel(seed=3)
    worker = env.start_worker()
    deep = "[" * 3000 + "]" * 3000
    stream = [
        sor.put("ok-1", "acme", content(sor.rng, 3)),
        # metadata nested 3,000 deep: RecursionError in the planner
        sor.put("deep", "acme", "hi", metadata='{"a": ' + deep + "}"),
        sor.put("ok-2", "globex", content(sor.rng, 3)),
    ]
    # a row written under an invalid tenant (dead-lettered), then fixed by an update
    wrong = {**sor.rows["ok-1"], "id": "moved", "company_id": "ACME", "content": "Fixed row."}
    fixed = {**wrong, "company_id": "acme"}
    stream += [
        raw_change(Op.CREATE, "moved", None, wrong, 5_000),
        raw_change(Op.UPDATE, "moved", wrong, fixed, 5_008),
        # a delete naming a valid tenant that has no index: nothing to delete, nothing created
        raw_change(
            Op.DELETE, "ghost", {**wrong, "id": "ghost", "company_id": "nobody"}, None, 5_016
        ),
        sor.put("ok-3", "acme", content(sor.rng, 3)),
    ]
    env.wait(env.produce(stream))
    index = env.snapshot(["acme", "globex"])
    assert set(index["acme"]) == {eid("ok-1"), eid("ok-3"), eid("moved")}
    assert set(index["globex"]) == {eid("ok-2")}
    assert worker.registry.list_tenants() == ["acme", "globex"]  # no index for "nobody"
    letters = letters_by_entity(env)
    assert set(letters) == {eid("deep"), eid("moved")}
    assert letters[eid("deep")]["ragstream.error.code"] == "MAPPING_ERROR"
    assert letters[eid("deep")]["ragstream.error.column"] == "metadata"
    assert letters[eid("deep")]["ragstream.error.table"] == "entities"
    assert letters[eid("deep")]["ragstream.error.tenant"] == "acme"
    assert "nests deeper than 64 levels" in letters[eid("deep")]["ragstream.error.message"]
    assert letters[eid("moved")]["ragstream.error.column"] == "company_id"
    assert "ragstream.error.tenant" not in letters[eid("moved")]  # not a tenant it can name
    assert env.workers[0][1].is_alive()


def test_an_entity_whose_stage_raises_unexpectedly_is_dead_lettered_alone(
    env: Env, preparer: Preparer, monkeypatch: pytest.MonkeyPatch
) -> None:
    # No stage is known to raise an untyped error any more; this double stands in for the next
    # bug found in one: chunking raises ZeroDivisionError for any entity holding "BOOM".
    real_chunks = Preparer.chunks

    def chunks(self: Preparer, entity: Entity) -> list[Chunk]:
        if "BOOM" in entity.content:
            raise ZeroDivisionError("a bug in a stage")
        return real_chunks(self, entity)

    monkeypatch.setattr(Preparer, "chunks", chunks)
    sor = SorModel(seed=4)
    records = [sor.put(f"ent-{i}", "acme", content(sor.rng, 2)) for i in range(40)]
    bombs = [sor.put(f"bomb-{i}", "acme", f"BOOM number {i}.") for i in range(3)]
    # the bombs land in the middle of one batch of 43 entities
    stream = records[:10] + bombs[:1] + records[10:30] + bombs[1:] + records[30:]
    env.start_worker()
    env.wait(env.produce(stream))
    index = env.snapshot(["acme"])
    assert set(index["acme"]) == {eid(f"ent-{i}") for i in range(40)}
    letters = letters_by_entity(env)
    assert set(letters) == {eid(f"bomb-{i}") for i in range(3)}
    for headers in letters.values():
        assert headers["ragstream.error.code"] == "RECORD_UNPROCESSABLE"
        assert headers["ragstream.error.stage"] == "apply"
        assert "ZeroDivisionError: a bug in a stage" in headers["ragstream.error.message"]
        assert headers["ragstream.error.tenant"] == "acme"
    assert env.metric("ragstream_ingest_dlq_records_total", {"code": "RECORD_UNPROCESSABLE"}) == 3
    # the entities keep flowing after it
    env.wait(env.produce([sor.put("after", "acme", "Later text.")]))
    assert eid("after") in env.snapshot(["acme"])["acme"]


def test_a_reindex_request_that_is_not_an_object_is_a_bad_request_not_a_crash(
    env: Env,
) -> None:
    requests = f"{env.topic}.reindex"
    create_topics(env.broker.bootstrap_servers, requests, partitions=1)
    env.consumer_overrides = {"reindex_topic": requests}
    env.start_worker()
    values = [
        b"[1, 2]",
        b"null",
        b'"text"',
        b"[" * 5000 + b"]" * 5000,
        b'{"tenant": "A B"}',
        # a JSON escape of a lone surrogate: no store filter can take it (RECORD_UNPROCESSABLE)
        b'{"tenant": "acme", "entity_id": "entities:\\ud800"}',
    ]
    last = produce(env.broker.bootstrap_servers, requests, [Record(b"k", v) for v in values])
    wait_committed(env.broker.bootstrap_servers, env.group, requests, last, 60)
    letters = list(letters_by_entity(env).values())
    assert [h["ragstream.error.code"] for h in letters] == ["BAD_REINDEX_REQUEST"] * len(values)
    assert "lone surrogate" in letters[-1]["ragstream.error.message"]


def test_a_record_with_a_huge_key_is_dead_lettered_within_the_dlq_message_size(env: Env) -> None:
    env.start_worker()
    huge_key = b'{"id": "' + b"k" * 2_000_000 + b'"}'  # a 2 MB primary key
    env.wait(env.produce([Record(huge_key, b"{not json"), Record(b'{"id": "ok"}', b"{not json")]))
    letters = read_all(env.broker.bootstrap_servers, env.dlq)
    assert len(letters) == 2
    big = next(m for m in letters if len(m.key() or b"") > 100)
    assert len(big.key()) < 200_000  # cut to fit the DLQ's message size
    headers = {k: (v or b"").decode() for k, v in big.headers()}
    assert headers["ragstream.error.code"] == "DECODE_ERROR"
    assert headers["ragstream.error.message"].startswith("(key cut)")
    # a record that cannot be decoded still names its table: the one its topic carries
    assert headers["ragstream.error.table"] == "entities"
    assert env.workers[0][1].is_alive()


def test_a_merged_unit_that_fails_names_each_records_own_tenant(
    env: Env, preparer: Preparer, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Two records of one key, the row re-created under another tenant (no `before`: no tenant
    # move, no barrier), become one unit; its apply fails. Each dead letter names the tenant
    # its own record holds, not the last record's.
    real_chunks = Preparer.chunks

    def chunks(self: Preparer, entity: Entity) -> list[Chunk]:
        if "BOOM" in entity.content:
            raise ZeroDivisionError("a bug in a stage")
        return real_chunks(self, entity)

    monkeypatch.setattr(Preparer, "chunks", chunks)
    row = {
        "entity_type": "NOTE",
        "name": "k",
        "metadata": None,
        "content_hash": None,
        "created_at": None,
        "updated_at": None,
        "deleted_at": None,
    }
    first = {**row, "id": "k", "company_id": "acme", "content": "Written under acme."}
    second = {**row, "id": "k", "company_id": "globex", "content": "BOOM under globex."}
    records = [
        raw_change(Op.CREATE, "k", None, first, 6_000),
        raw_change(Op.CREATE, "k", None, second, 6_008),
    ]
    # the handler merges records of one key as the scheduler does (`Pending.merge`), here
    # deterministically: the two always form one unit
    worker = build_worker(
        env.settings(), CollectorRegistry(), store=env.store, embedder=env.embedder
    )
    try:
        raws = [RawRecord(env.topic, 0, n, r.key, r.value, (), 0) for n, r in enumerate(records)]
        letters = worker.handler.handle(raws)
    finally:
        worker.close()
    assert [(d.record.offset, d.code, d.tenant_id) for d in letters] == [
        (0, "RECORD_UNPROCESSABLE", "acme"),
        (1, "RECORD_UNPROCESSABLE", "globex"),
    ]


def test_a_worker_whose_loop_dies_says_so_and_its_run_raises(
    env: Env, monkeypatch: pytest.MonkeyPatch
) -> None:
    # A configuration error in the apply thread (a target built with a model the worker does not
    # hold) is not a row's fault: the worker must not live on indexing nothing.
    def broken(self: object, payloads: object) -> object:
        raise ConfigError("rag__acme__v2 is built with another-model, which this worker lacks")

    monkeypatch.setattr(IngestHandler, "apply", broken)
    worker = env.start_worker()
    thread = env.workers[0][1]
    sor = SorModel(seed=8)
    env.produce([sor.put("x", "acme", "Anything.")])
    thread.join(30)
    assert not thread.is_alive()  # the loop ended: its run raised, naming the cause
    (error,) = env.loop_errors
    assert "ConfigError: rag__acme__v2 is built with another-model" in str(error)
    assert isinstance(worker.loop.failure, ConfigError)
    assert worker.stop.is_set()  # the worker's other threads stop with it
    beats = {
        s.labels["thread"]
        for family in env.registry.collect()
        if family.name == "ragstream_ingest_loop_heartbeat_timestamp_seconds"
        for s in family.samples
    }
    assert beats == {"intake", "apply", "express"}
