"""`ragstream dlq replay`: dead letters, named with the current table mappings (decoded value,
then the worker's `ragstream.error.*` headers, then the Kafka key), become re-reads of their
entities; what still fails is re-queued and parked after N attempts, what never can be replayed
is parked, and nothing blocks the letters after it.

The broker tests use the real broker (tansu; the retention test librdkafka's mock cluster),
three of them the worker's own write path (SQLite SoR, qdrant-edge). The hypothesis property runs
the whole replay many times over `MemoryBroker`, an in-memory double of the broker (see its
docstring), which the contract test `test_the_memory_double_and_tansu_agree_*` holds to the
real thing."""

from __future__ import annotations

import hashlib
import json
import logging
import os
import sqlite3
import uuid
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from prometheus_client import CollectorRegistry

from ragcore.errors import (
    DeadLetterUnavailableError,
    MappingError,
    RagstreamError,
    SorTableError,
    SorUnavailableError,
)
from ragcore.kafka_config import KafkaSettings
from ragcore.mapping import TableMapping
from ragcore.plan import PlanConfig
from ragcore.settings import SorSettings, StoreSettings
from ragcore.store.edge import EdgeStore
from ragdev.services.tansu import TansuBroker
from ragdev.sor.debezium_format import change_event, encode_key, encode_value
from ragstream.cli import main
from ragstream.dlq import (
    ATTEMPTS,
    ERROR_COLUMN,
    ERROR_ENTITY,
    ERROR_TABLE,
    ERROR_TENANT,
    PARKED_AT,
    PARKED_CODE,
    PARKED_REASON,
    REPLAY_CODE,
    KafkaLetters,
    Letters,
    Locator,
    Named,
    Outgoing,
    ParkCode,
    Permanent,
    ReplayReport,
    describe_letters,
    name_letter,
    original_record,
    replay_dlq,
    replay_records,
    settle,
    sor_locator,
)
from schemas.entities import ContentFormat
from schemas.events import Op, RawRecord
from streams.app import IngestWorker, build_worker
from streams.consumer import DLQ_HEADER_PREFIX, DeadLetter, OffsetGap, dlq_headers
from streams.decode import DecodeOptions, decode_record
from streams.ingest import Rejection
from streams.settings import IngestSettings
from tests.conftest import REPO_ROOT
from tests.streams.support import (
    HashEmbedder,
    MockKafka,
    Record,
    committed,
    create_topics,
    index_snapshot,
    read_all,
)

TOPIC = "sor.public.tickets"
DLQ = "ragstream.dlq"
PARKING = "ragstream.dlq.parked"
REINDEX = "ragstream.reindex-requests"
#: the mapping before the fix: content from `body`, which the SoR renamed to `description`
BROKEN = TableMapping(
    table="public.tickets",
    key_columns=("id",),
    tenant_column="org",
    type_column=None,
    title_column="subject",
    content_columns=("subject", "body"),
    metadata_column=None,
    content_hash_column=None,
    created_at_column=None,
    updated_at_column=None,
    deleted_at_column=None,
)
FIXED = BROKEN.model_copy(update={"content_columns": ("subject", "description")})
FIXED_PLAN = PlanConfig(tables=(FIXED,))
#: the headers the lead's worker adds to new letters; `letter` leaves them out unless asked
NEW_HEADERS = (ERROR_TABLE, ERROR_COLUMN, ERROR_ENTITY, ERROR_TENANT)
OPTIONS = DecodeOptions()


def decode(raw: RawRecord) -> Any:
    return decode_record(raw, OPTIONS)


def hasher(content: str, fmt: ContentFormat) -> str:
    return hashlib.sha256(content.encode()).hexdigest()


def ticket(key: int, org: str = "acme") -> dict[str, Any]:
    return {"id": key, "org": org, "subject": f"Ticket {key}", "description": "It jams."}


def change(
    n: int,
    op: Op,
    row: dict[str, Any],
    *,
    topic: str = TOPIC,
    key: bytes | None = None,
    table: str = "tickets",
) -> RawRecord:
    """The original record: a Debezium change event (of `public.tickets`)."""
    value = change_event(
        op,
        before=row if op is Op.DELETE else None,
        after=None if op is Op.DELETE else row,
        table=table,
        lsn=100 + n,
    )
    return RawRecord(
        topic=topic,
        partition=0,
        offset=n,
        key=encode_key({"id": row["id"]}) if key is None else key,
        value=encode_value(value),
        headers=(("t.id", str(n).encode()),),
    )


def letter(
    n: int,
    original: RawRecord,
    code: str,
    *,
    max_value_bytes: int | None = None,
    extra: Sequence[tuple[str, bytes]] = (),
    topic: str = DLQ,
) -> RawRecord:
    """The DLQ record the worker writes for `original` (`ConsumerLoop._dead_letter`: its
    `dlq_headers`, the value cut at `dlq_max_value_bytes` and marked truncated), as a letter
    written before the worker added `NEW_HEADERS` (unless `extra` brings them)."""
    value = original.value
    truncated = max_value_bytes is not None and value is not None and len(value) > max_value_bytes
    if truncated and value is not None:
        value = value[:max_value_bytes]
    headers = [
        (k, v if isinstance(v, bytes) or v is None else v.encode())
        for k, v in dlq_headers(DeadLetter(original, code, "why", "plan"), truncated)
        if k not in NEW_HEADERS
    ]
    return RawRecord(
        topic=topic,
        partition=0,
        offset=1000 + n,
        key=original.key,
        value=value,
        headers=(*headers, *extra),
    )


def reindex_letter(n: int, request: bytes, code: str = "BAD_REINDEX_REQUEST") -> RawRecord:
    """A letter of Retrieve's reindex-request topic."""
    original = RawRecord(REINDEX, 0, n, None, request, (("t.id", str(n).encode()),))
    return letter(n, original, code)


class Rereads:
    """The `Rereader` port: records each re-read; rejects an entity `failures[entity]` times
    (then indexes it); raises `SorUnavailableError` while `outage` is set."""

    def __init__(
        self, rejected: Sequence[str] = (), failures: Mapping[str, int] | None = None
    ) -> None:
        self.calls: list[tuple[str, list[str]]] = []
        self.failures = dict(failures or {})
        self._always = set(rejected)
        self.outage = False

    def reread(self, tenant_id: str, entity_ids: Sequence[str], reason: str) -> list[Rejection]:
        assert reason == "dlq_replay"
        if self.outage:
            raise SorUnavailableError("SQLite SoR query failed: unable to open database file")
        self.calls.append((tenant_id, sorted(entity_ids)))
        out = []
        for e in entity_ids:
            if e in self._always or self.failures.get(e, 0) > 0:
                self.failures[e] = self.failures.get(e, 0) - 1
                out.append(Rejection(e, "CHUNKING_ERROR", "no"))
        return out


def located(where: Mapping[str, str | RagstreamError]) -> Locator:
    """A `Locator` double: the SoR holds each entity of `where` in that tenant."""
    return lambda ids: {e: where[e] for e in ids if e in where}


def replay(
    records: Sequence[RawRecord],
    mapping: TableMapping,
    handler: Rereads,
    locate: Locator | None = None,
) -> Any:
    outcomes, _ = replay_records(
        records,
        decode=decode,
        config=PlanConfig(tables=(mapping,)),
        handler=handler,
        known_tenants=lambda: ["acme", "globex"],
        locate=locate,
        reindex_topic=REINDEX,
    )
    return outcomes


def name(dlq: RawRecord, mapping: TableMapping = FIXED) -> Named | Permanent:
    return name_letter(
        dlq, decode=decode, config=PlanConfig(tables=(mapping,)), reindex_topic=REINDEX
    )


# --- naming a letter ----------------------------------------------------------------------


@pytest.mark.unit
def test_the_original_record_comes_back_from_the_dlq_headers() -> None:
    dlq = letter(7, change(7, Op.CREATE, ticket(1)), "SCHEMA_DRIFT")
    raw, code = original_record(dlq)
    assert (raw.topic, raw.partition, raw.offset, code) == (TOPIC, 0, 7, "SCHEMA_DRIFT")
    assert raw.value == dlq.value and not any(k.startswith("ragstream.") for k, _ in raw.headers)


@pytest.mark.unit
def test_after_the_mapping_is_fixed_every_named_entity_is_reread_per_tenant() -> None:
    records = [
        letter(0, change(0, Op.CREATE, ticket(1)), "SCHEMA_DRIFT"),
        letter(1, change(1, Op.UPDATE, ticket(1)), "SCHEMA_DRIFT"),
        letter(2, change(2, Op.CREATE, ticket(2, "globex")), "SCHEMA_DRIFT"),
        letter(3, change(3, Op.CREATE, ticket(3)), "POLICY_TRUNCATE"),
    ]
    handler = Rereads()
    outcomes = replay(records, FIXED, handler)
    assert sorted(handler.calls) == [("acme", ["tickets:1"]), ("globex", ["tickets:2"])]
    assert [o.status for o in outcomes] == ["replayed"] * 3 + ["permanent"]
    assert outcomes[3].code == ParkCode.BY_POLICY


@pytest.mark.unit
def test_a_record_lacking_a_column_still_names_its_entity_for_the_reread() -> None:
    # the schema was fixed (column renamed back): the record itself still lacks `body`, yet
    # its key and tenant name the entity to re-read; the SoR holds the content
    handler = Rereads()
    outcomes = replay([letter(0, change(0, Op.CREATE, ticket(1)), "SCHEMA_DRIFT")], BROKEN, handler)
    assert handler.calls == [("acme", ["tickets:1"])]
    assert [o.status for o in outcomes] == ["replayed"]


@pytest.mark.unit
def test_a_letter_of_a_table_no_mapping_knows_is_parked_and_nothing_is_reread() -> None:
    other = BROKEN.model_copy(update={"table": "public.other"})
    handler = Rereads()
    outcomes = replay([letter(0, change(0, Op.CREATE, ticket(1)), "MAPPING_ERROR")], other, handler)
    assert handler.calls == []
    assert [(o.status, o.code) for o in outcomes] == [("permanent", ParkCode.UNMAPPED_TABLE)]
    assert "public.tickets" in outcomes[0].reason and TOPIC in outcomes[0].reason


@pytest.mark.unit
def test_an_entity_the_write_path_still_rejects_is_failing_with_its_code() -> None:
    records = [letter(5, change(5, Op.CREATE, ticket(9)), "CHUNKING_ERROR")]
    [outcome] = replay(records, FIXED, Rereads(rejected=["tickets:9"]))
    assert (outcome.status, outcome.code, outcome.entity_id) == (
        "failing",
        "CHUNKING_ERROR",
        "tickets:9",
    )
    assert outcome.reason == "in acme: no"


@pytest.mark.unit
def test_a_dead_lettered_delete_rereads_the_entity_in_its_tenant() -> None:
    handler = Rereads()
    dlq = letter(0, change(0, Op.DELETE, ticket(4)), "SOR_TABLE_UNREADABLE")
    assert [o.status for o in replay([dlq], FIXED, handler)] == ["replayed"]
    assert handler.calls == [("acme", ["tickets:4"])]


@pytest.mark.unit
def test_a_record_without_tenant_is_reread_in_every_tenant_and_where_the_sor_holds_it() -> None:
    keyless = {"id": 5, "org": "", "subject": "", "description": ""}
    dlq = letter(0, change(0, Op.DELETE, keyless), "X")
    handler = Rereads()
    assert [o.status for o in replay([dlq], FIXED, handler)] == ["replayed"]
    assert sorted(handler.calls) == [("acme", ["tickets:5"]), ("globex", ["tickets:5"])]
    # a tenant without an index yet: only the SoR can say the row lives there
    handler = Rereads()
    replay([dlq], FIXED, handler, located({"tickets:5": "initech"}))
    assert sorted(handler.calls) == [
        ("acme", ["tickets:5"]),
        ("globex", ["tickets:5"]),
        ("initech", ["tickets:5"]),
    ]


@pytest.mark.unit
def test_an_entity_whose_table_the_sor_cannot_read_is_failing_not_replayed() -> None:
    dlq = letter(0, change(0, Op.CREATE, ticket(5)), "SCHEMA_DRIFT", max_value_bytes=30)
    unreadable = SorTableError("cannot read public.tickets: no such column: description")
    handler = Rereads()
    [outcome] = replay([dlq], FIXED, handler, located({"tickets:5": unreadable}))
    assert (outcome.status, outcome.code) == ("failing", "SOR_TABLE_UNREADABLE")
    assert handler.calls == []  # a re-read elsewhere would delete what it cannot see


ENVELOPE_KEY = json.dumps(
    {
        "schema": {
            "type": "struct",
            "name": "sor.public.tickets.Key",
            "optional": False,
            "fields": [{"field": "id", "type": "int32", "optional": False}],
        },
        "payload": {"id": 7},
    }
).encode()


@pytest.mark.unit
@pytest.mark.parametrize(
    "key", [encode_key({"id": 7}), ENVELOPE_KEY], ids=["schemaless", "with-schema"]
)
def test_a_truncated_value_falls_back_to_the_debezium_key(key: bytes) -> None:
    original = change(0, Op.UPDATE, ticket(7), key=key)
    dlq = letter(0, original, "RECORD_TOO_LARGE", max_value_bytes=60)
    assert (dlq.value or b"") == (original.value or b"")[:60]
    assert name(dlq) == Named("tickets:7", (), "key")


@pytest.mark.unit
def test_a_key_holding_the_tenant_column_names_the_tenant_too() -> None:
    by_org = FIXED.model_copy(update={"key_columns": ("org", "id")})
    key = encode_key({"org": "globex", "id": 3})
    dlq = letter(0, change(0, Op.UPDATE, ticket(3, "globex"), key=key), "X", max_value_bytes=10)
    assert name(dlq, by_org) == Named("tickets:globex,3", ("globex",), "key")


@pytest.mark.unit
def test_undecodable_value_is_read_through_the_error_headers_before_the_key() -> None:
    original = change(0, Op.UPDATE, ticket(8, "globex"))
    original = RawRecord(original.topic, 0, 0, original.key, b'{"op": "u", "after": {', ())
    headers = ((ERROR_ENTITY, b"tickets:8"), (ERROR_TENANT, b"globex"))
    assert name(letter(0, original, "DECODE_ERROR", extra=headers)) == Named(
        "tickets:8", ("globex",), "headers"
    )
    # an older letter without them: the key
    assert name(letter(0, original, "DECODE_ERROR")) == Named("tickets:8", (), "key")
    # a header naming a table no mapping knows: the key again
    elsewhere = ((ERROR_ENTITY, b"gone:8"), (ERROR_TENANT, b"globex"))
    assert name(letter(0, original, "DECODE_ERROR", extra=elsewhere)) == Named(
        "tickets:8", (), "key"
    )


@pytest.mark.unit
def test_a_decoded_value_comes_before_the_headers() -> None:
    headers = ((ERROR_ENTITY, b"tickets:99"), (ERROR_TENANT, b"globex"))
    dlq = letter(0, change(0, Op.CREATE, ticket(2)), "SCHEMA_DRIFT", extra=headers)
    assert name(dlq) == Named("tickets:2", ("acme",), "value")


@pytest.mark.unit
def test_the_error_table_header_maps_a_key_whose_topic_no_mapping_knows() -> None:
    routed = change(0, Op.UPDATE, ticket(4), topic="sor.all-tables")
    dlq = letter(0, routed, "X", max_value_bytes=10, extra=((ERROR_TABLE, b"public.tickets"),))
    assert name(dlq) == Named("tickets:4", (), "key")
    assert isinstance(name(letter(0, routed, "X", max_value_bytes=10)), Permanent)


@pytest.mark.unit
@pytest.mark.parametrize(
    "key",
    [None, b"\xff not json", encode_key({"ticket_no": 4})],
    ids=["no-key", "undecodable-key", "key-without-key-columns"],
)
def test_a_letter_whose_value_and_key_name_nothing_is_permanent(key: bytes | None) -> None:
    original = change(0, Op.UPDATE, ticket(4))
    original = RawRecord(original.topic, 0, 0, key, b"not json", ())
    verdict = name(letter(0, original, "DECODE_ERROR"))
    assert isinstance(verdict, Permanent) and verdict.code is ParkCode.NO_ENTITY
    assert verdict.reason.startswith("value: ") and "key: " in verdict.reason


@pytest.mark.unit
def test_reindex_request_letters_name_their_request_or_are_parked() -> None:
    bad = name(reindex_letter(0, b'{"tenant": 7}'))
    assert isinstance(bad, Permanent) and bad.code is ParkCode.BAD_REINDEX_REQUEST
    good = b'{"tenant": "acme", "entity_id": "tickets:3", "reason": "stale"}'
    assert name(reindex_letter(1, good, "CHUNKING_ERROR")) == Named(
        "tickets:3", ("acme",), "reindex request"
    )
    unmapped = b'{"tenant": "acme", "entity_id": "gone:3"}'
    verdict = name(reindex_letter(2, unmapped, "MAPPING_ERROR"))
    assert isinstance(verdict, Permanent) and verdict.code is ParkCode.UNMAPPED_TABLE


@pytest.mark.unit
def test_a_record_without_source_headers_is_not_a_letter() -> None:
    verdict = name(RawRecord(DLQ, 0, 3, b"k", b"v", (("x", b"y"),)))
    assert isinstance(verdict, Permanent) and verdict.code is ParkCode.NOT_A_LETTER


# --- settling: re-queue, park ------------------------------------------------------------------


def settled(outcomes: Sequence[Any], topic: str = DLQ, max_attempts: int = 3) -> Any:
    report = ReplayReport(topic, PARKING)
    out = settle(
        outcomes,
        topic=topic,
        parking_topic=PARKING,
        max_attempts=max_attempts,
        report=report,
        now=lambda: "2026-03-01T12:00:00Z",
    )
    return report, out


def headers_of(out: Outgoing) -> dict[str, list[bytes | None]]:
    found: dict[str, list[bytes | None]] = {}
    for k, v in out.headers:
        found.setdefault(k, []).append(v)
    return found


@pytest.mark.unit
def test_a_failing_letter_is_requeued_with_one_more_attempt_then_parked() -> None:
    dlq = letter(5, change(5, Op.CREATE, ticket(9)), "SCHEMA_DRIFT")
    handler = Rereads(rejected=["tickets:9"])
    for attempt in (1, 2):
        report, [out] = settled(replay([dlq], FIXED, handler))
        assert (out.topic, len(report.requeued), report.parked) == (DLQ, 1, [])
        found = headers_of(out)
        assert found[ATTEMPTS] == [str(attempt).encode()] and found[REPLAY_CODE] == [
            b"CHUNKING_ERROR"
        ]
        assert found["t.id"] == [b"5"] and (out.key, out.value) == (dlq.key, dlq.value)
        assert found[DLQ_HEADER_PREFIX + "error.code"] == [b"SCHEMA_DRIFT"]  # the original's
        dlq = RawRecord(DLQ, 0, 2000 + attempt, out.key, out.value, out.headers)
    report, [out] = settled(replay([dlq], FIXED, handler))
    assert (out.topic, report.requeued, len(report.parked)) == (PARKING, [], 1)
    found = headers_of(out)
    assert found[PARKED_CODE] == [b"STILL_FAILING"] and found[ATTEMPTS] == [b"3"]
    assert found[PARKED_AT] == [b"2026-03-01T12:00:00Z"]
    assert (found[PARKED_REASON][0] or b"").startswith(b"CHUNKING_ERROR after 3 replay(s)")
    assert report.parked[0]["code"] == "STILL_FAILING" and report.exit_code == 0


@pytest.mark.unit
def test_copies_of_one_letter_read_in_one_run_are_settled_once() -> None:
    """`--from-beginning` reads a letter and its re-queued copies again: one re-read, one
    re-queue (of the copy that failed most replays), the others counted as duplicates."""
    dlq = letter(5, change(5, Op.CREATE, ticket(9)), "SCHEMA_DRIFT")
    copy = RawRecord(DLQ, 0, 2000, dlq.key, dlq.value, (*dlq.headers, (ATTEMPTS, b"2")))
    handler = Rereads(rejected=["tickets:9"])
    outcomes = replay([copy, dlq], FIXED, handler)
    assert [o.status for o in outcomes] == ["failing", "duplicate"]
    assert handler.calls == [("acme", ["tickets:9"])]
    report, [out] = settled(outcomes, max_attempts=5)
    assert (report.duplicates, len(report.requeued), headers_of(out)[ATTEMPTS]) == (1, 1, [b"3"])


@pytest.mark.unit
def test_replaying_the_parking_topic_parks_what_still_fails_again_at_its_tail() -> None:
    parked = letter(0, change(0, Op.CREATE, ticket(9)), "SCHEMA_DRIFT", topic=PARKING)
    report, [out] = settled(replay([parked], FIXED, Rereads(rejected=["tickets:9"])), PARKING)
    assert out.topic == PARKING and len(report.parked) == 1
    assert report.exit_code == 1  # still failing in the topic replayed


@pytest.mark.unit
@pytest.mark.parametrize(
    ("change_report", "code"),
    [
        ({}, 0),
        ({"parked": [{"code": "NO_ENTITY"}]}, 0),
        ({"requeued": [{"code": "CHUNKING_ERROR"}]}, 1),
        ({"lost": [OffsetGap(DLQ, 0, 2, 5, 9)]}, 1),
        ({"more": True}, 1),
        ({"outage": {"dependency": "sor"}}, 3),
    ],
)
def test_exit_codes(change_report: dict[str, Any], code: int) -> None:
    report = ReplayReport(DLQ, PARKING)
    for attribute, value in change_report.items():
        setattr(report, attribute, value)
    assert report.exit_code == code and report.as_dict()["exit_code"] == code


# --- the whole replay over an in-memory broker -----------------------------------------------


@dataclass
class MemoryBroker:
    """An in-memory double of a Kafka broker, for the property test only: each topic is one
    partition (a list whose index is the offset), the replay group's committed offset is one
    number per topic, `write` appends (all of a call, or nothing when `unavailable`), and
    `commit` fails when `unavailable` or `commit_fails`. No retention, no rebalances, no
    network: `KafkaLetters` on tansu is tested against the same expectations below."""

    topics: dict[str, list[RawRecord]] = field(default_factory=dict)
    committed: dict[str, int] = field(default_factory=dict)
    unavailable: bool = False
    commit_fails: bool = False

    def append(self, topic: str, key: bytes | None, value: bytes | None, headers: Any) -> None:
        log = self.topics.setdefault(topic, [])
        log.append(RawRecord(topic, 0, len(log), key, value, tuple(headers)))

    def letters(self, topic: str) -> MemoryLetters:
        return MemoryLetters(self, topic)


@dataclass
class MemoryLetters:
    """`LetterLog` over a `MemoryBroker`."""

    broker: MemoryBroker
    topic: str

    def read(self) -> Letters:
        if self.broker.unavailable:
            raise DeadLetterUnavailableError("broker down")
        start = self.broker.committed.get(self.topic, 0)
        return Letters(list(self.broker.topics.get(self.topic, [])[start:]))

    def write(self, letters: Sequence[Outgoing]) -> None:
        if self.broker.unavailable:
            raise DeadLetterUnavailableError("broker down")
        for out in letters:
            self.broker.append(out.topic, out.key, out.value, out.headers)

    def commit(self, letters: Letters) -> None:
        if self.broker.unavailable or self.broker.commit_fails:
            raise DeadLetterUnavailableError("commit failed")
        if letters.records:
            self.broker.committed[self.topic] = letters.records[-1].offset + 1


def run(broker: MemoryBroker, handler: Rereads, max_attempts: int) -> ReplayReport:
    return replay_dlq(
        broker.letters(DLQ),
        parking_topic=PARKING,
        decode=decode,
        config=PlanConfig(tables=(FIXED,)),
        handler=handler,
        known_tenants=lambda: ["acme", "globex"],
        locate=located({}),
        reindex_topic=REINDEX,
        max_attempts=max_attempts,
    )


def ids(records: Sequence[RawRecord]) -> list[int]:
    return [int(dict(r.headers)["t.id"] or b"-1") for r in records]


#: the kinds of letter the property mixes: a letter of each kind for entity n
KINDS = ("good", "truncated", "bad_reindex", "failing", "unmapped", "policy")


def make_letter(n: int, kind: str) -> RawRecord:
    original = change(n, Op.UPDATE, ticket(n, "globex" if n % 2 else "acme"))
    if kind == "truncated":
        return letter(n, original, "RECORD_TOO_LARGE", max_value_bytes=50)
    if kind == "bad_reindex":
        return reindex_letter(n, b'{"tenant": "acme"}')
    if kind == "unmapped":
        other = change(n, Op.UPDATE, ticket(n), topic="sor.public.other", table="other")
        return letter(n, other, "MAPPING_ERROR")
    if kind == "policy":
        return letter(n, original, "POLICY_TRUNCATE")
    return letter(n, original, "SCHEMA_DRIFT")


@pytest.mark.unit
@settings(max_examples=150, deadline=None)
@given(
    mix=st.lists(st.tuples(st.sampled_from(KINDS), st.integers(1, 7)), max_size=12),
    max_attempts=st.integers(1, 5),
    outages=st.sets(st.integers(0, 8), max_size=3),
)
def test_every_letter_ends_replayed_or_parked_exactly_once_and_nothing_blocks(
    mix: list[tuple[str, int]], max_attempts: int, outages: set[int]
) -> None:
    """Random mixes of letters, some still failing for k replays, replays interrupted by SoR
    outages: every run accounts for each letter it read exactly once (replayed, re-queued or
    parked), an outage run writes and commits nothing, and in the end each letter was
    replayed or parked, once, as its kind says, after the re-queues its failures allow."""
    broker = MemoryBroker()
    failures = {f"tickets:{n}": k for n, (kind, k) in enumerate(mix) if kind == "failing"}
    for n, (kind, _) in enumerate(mix):
        dlq = make_letter(n, kind)
        broker.append(DLQ, dlq.key, dlq.value, dlq.headers)
    handler = Rereads(failures=failures)
    replayed: list[int] = []
    requeues: dict[int, int] = {}
    for attempt in range(max_attempts + len(outages) + 2):
        handler.outage = attempt in outages
        before = {t: len(log) for t, log in broker.topics.items()}
        start = broker.committed.get(DLQ, 0)
        read = broker.topics[DLQ][start:] if DLQ in broker.topics else []
        report = run(broker, handler, max_attempts)
        written = {t: log[before.get(t, 0) :] for t, log in broker.topics.items()}
        # the SoR is only asked for letters that name an entity
        rereads = any(mix[i][0] in ("good", "truncated", "failing") for i in ids(read))
        assert (report.outage is not None) == (handler.outage and rereads)
        if report.outage is not None:
            assert report.exit_code == 3 and not report.committed
            assert all(not w for w in written.values()) and broker.committed.get(DLQ, 0) == start
            continue
        requeued, parked = ids(written.get(DLQ, [])), ids(written.get(PARKING, []))
        assert report.read == len(read) == report.replayed + len(requeued) + len(parked)
        assert report.duplicates == 0
        assert (len(report.requeued), len(report.parked)) == (len(requeued), len(parked))
        settled_now = set(requeued) | set(parked)
        assert len(settled_now) == len(requeued) + len(parked)  # no letter twice
        replayed += [i for i in ids(read) if i not in settled_now]
        for i in requeued:
            requeues[i] = requeues.get(i, 0) + 1
    # a last run finds nothing: nothing blocks, nothing comes back
    handler.outage = False
    assert run(broker, handler, max_attempts).read == 0
    parked_codes = {
        i: dict(r.headers)[PARKED_CODE]
        for i, r in zip(
            ids(broker.topics.get(PARKING, [])), broker.topics.get(PARKING, []), strict=True
        )
    }
    assert len(parked_codes) == len(broker.topics.get(PARKING, []))  # each parked once
    assert not set(parked_codes) & set(replayed) and len(set(replayed)) == len(replayed)
    assert set(parked_codes) | set(replayed) == set(range(len(mix)))  # nothing lost
    expected_park = {
        "bad_reindex": b"BAD_REINDEX_REQUEST",
        "unmapped": b"UNMAPPED_TABLE",
        "policy": b"BY_POLICY",
    }
    for n, (kind, k) in enumerate(mix):
        if kind in expected_park:
            assert parked_codes[n] == expected_park[kind]
        elif kind == "failing" and k >= max_attempts:
            assert parked_codes[n] == b"STILL_FAILING"
            assert requeues.get(n, 0) == max_attempts - 1
        else:
            assert n in replayed, (kind, k)
            assert requeues.get(n, 0) == (k if kind == "failing" else 0)


@pytest.mark.unit
def test_a_crash_between_writing_and_committing_duplicates_letters_never_loses_one() -> None:
    broker = MemoryBroker()
    for dlq in (make_letter(0, "bad_reindex"), make_letter(1, "failing")):
        broker.append(DLQ, dlq.key, dlq.value, dlq.headers)
    handler = Rereads(failures={"tickets:1": 9})
    broker.commit_fails = True
    report = run(broker, handler, 5)
    assert (report.exit_code, report.committed, report.outage and report.outage["dependency"]) == (
        3,
        False,
        "dlq",
    )
    assert ids(broker.topics[PARKING]) == [0] and ids(broker.topics[DLQ]) == [0, 1, 1]
    broker.commit_fails = False
    # the same two letters and the copy re-queued meanwhile: the copies of letter 1 are
    # settled once, through the one that failed more replays
    again = run(broker, handler, 5)
    assert (again.read, len(again.parked), len(again.requeued), again.duplicates) == (3, 1, 1, 1)
    assert again.requeued[0]["attempts"] == 2 and again.committed
    assert ids(broker.topics[PARKING]) == [0, 0]  # a duplicate, nothing lost


# --- with the real broker ------------------------------------------------------------------


def as_record(raw: RawRecord, pad: int = 0) -> Record:
    headers = tuple((k, v or b"") for k, v in raw.headers)
    return Record(raw.key, raw.value, headers + ((("pad", b"x" * pad),) if pad else ()))


def on_tansu(broker: TansuBroker, topic: str, group: str, **kwargs: Any) -> KafkaLetters:
    # tansu reports a batch's base offset + 1 as its high watermark (see ConsumerConfig)
    return KafkaLetters(
        KafkaSettings(bootstrap_servers=broker.bootstrap_servers),
        topic,
        group,
        idle_s=1.0,
        high_watermark_slack=1_000,
        **kwargs,
    )


def produce_letters(broker: TansuBroker, topic: str, records: Sequence[RawRecord]) -> None:
    letters = on_tansu(broker, topic, "writer")
    letters.write([Outgoing(topic, r.key, r.value, r.headers) for r in records])
    letters.close()


def replay_on(
    broker: TansuBroker,
    topic: str,
    group: str,
    handler: Any,
    *,
    config: PlanConfig = FIXED_PLAN,
    parking: str | None = None,
    known_tenants: Callable[[], Sequence[str]] = lambda: ["acme"],
    locate: Locator | None = None,
    max_attempts: int = 5,
) -> ReplayReport:
    with on_tansu(broker, topic, group) as letters:
        return replay_dlq(
            letters,
            parking_topic=parking or f"{topic}.parked",
            decode=decode,
            config=config,
            handler=handler,
            known_tenants=known_tenants,
            locate=locate,
            reindex_topic=REINDEX,
            max_attempts=max_attempts,
        )


def fresh(broker: TansuBroker) -> tuple[str, str, str]:
    suffix = uuid.uuid4().hex[:8]
    topic = f"dlq.{suffix}"
    create_topics(broker.bootstrap_servers, topic, f"{topic}.parked", partitions=1)
    return topic, f"{topic}.parked", suffix


@pytest.mark.integration
def test_the_memory_double_and_tansu_agree_on_what_the_replay_uses(
    kafka_broker: TansuBroker,
) -> None:
    """The contract `MemoryBroker` stands in for: written letters come back as written, in
    order; a commit moves the group past what was read; later writes are read next; a
    missing parking topic reads as empty."""
    topic, _, group = fresh(kafka_broker)
    outs = [
        Outgoing(topic, b"k%d" % n, b"v%d" % n, (("h", b"%d" % n), ("e", None))) for n in range(3)
    ]

    def shown(letters: Letters) -> list[Any]:
        # a header without a value comes back from librdkafka as b"" (None in, b"" out)
        return [(r.key, r.value, [(h, v or b"") for h, v in r.headers]) for r in letters.records]

    def scenario(letters: Any, missing: Any) -> list[Any]:
        letters.write(outs[:2])
        first = letters.read()
        letters.commit(first)
        letters.write(outs[2:])
        second = letters.read()
        letters.commit(second)
        return [shown(first), shown(second), shown(letters.read()), shown(missing.read())]

    memory = MemoryBroker()
    expected = scenario(memory.letters(topic), memory.letters("nowhere"))
    with (
        on_tansu(kafka_broker, topic, group) as real,
        on_tansu(kafka_broker, f"missing.{group}", group, missing_ok=True) as missing,
    ):
        assert scenario(real, missing) == expected
    assert [len(step) for step in expected] == [2, 1, 0, 0]


@pytest.mark.integration
@pytest.mark.slow
def test_a_bad_reindex_request_is_parked_and_committed_past_while_a_good_letter_is_replayed(
    kafka_broker: TansuBroker,
) -> None:
    topic, parking, group = fresh(kafka_broker)
    bad = reindex_letter(0, b'{"tenant": "acme", "entity_id": 7}')
    good = letter(1, change(1, Op.CREATE, ticket(2)), "SCHEMA_DRIFT")
    produce_letters(kafka_broker, topic, [bad, good])

    handler = Rereads()
    report = replay_on(kafka_broker, topic, group, handler)
    assert (report.read, report.replayed, len(report.parked), report.requeued) == (2, 1, 1, [])
    assert (report.committed, report.exit_code) == (True, 0)
    assert report.as_dict()["parked_by_code"] == {"BAD_REINDEX_REQUEST": 1}
    assert handler.calls == [("acme", ["tickets:2"])]
    [parked] = read_all(kafka_broker.bootstrap_servers, parking)
    headers = dict(parked.headers())
    assert headers[PARKED_CODE] == b"BAD_REINDEX_REQUEST" and PARKED_AT in headers
    assert headers["ragstream.source.topic"] == REINDEX.encode() and headers["t.id"] == b"0"
    assert parked.value() == bad.value

    again = replay_on(kafka_broker, topic, group, Rereads())
    assert (again.read, again.exit_code) == (0, 0)
    # the parked letter can be listed, and replayed from the parking topic
    with on_tansu(kafka_broker, parking, "lister", from_beginning=True) as letters:
        listed = describe_letters(
            letters.read().records,
            decode=decode,
            config=PlanConfig(tables=(FIXED,)),
            reindex_topic=REINDEX,
        )
    assert [d["parks"]["code"] for d in listed] == ["BAD_REINDEX_REQUEST"]
    assert listed[0]["headers"][PARKED_CODE] == "BAD_REINDEX_REQUEST"
    from_parking = replay_on(kafka_broker, parking, group, Rereads(), parking=parking)
    assert (from_parking.read, len(from_parking.parked), from_parking.exit_code) == (1, 1, 1)


@pytest.mark.integration
@pytest.mark.slow
def test_a_still_failing_letter_is_requeued_then_parked_after_n_attempts(
    kafka_broker: TansuBroker,
) -> None:
    topic, parking, group = fresh(kafka_broker)
    stuck = letter(0, change(0, Op.CREATE, ticket(9)), "CHUNKING_ERROR")
    good = letter(1, change(1, Op.CREATE, ticket(3)), "SCHEMA_DRIFT")
    produce_letters(kafka_broker, topic, [stuck, good])
    handler = Rereads(rejected=["tickets:9"])

    first = replay_on(kafka_broker, topic, group, handler, max_attempts=3)
    assert (first.read, first.replayed, first.exit_code) == (2, 1, 1)
    assert [(r["entity_id"], r["attempts"]) for r in first.requeued] == [("tickets:9", 1)]
    second = replay_on(kafka_broker, topic, group, handler, max_attempts=3)
    assert (second.read, len(second.requeued), second.requeued[0]["attempts"]) == (1, 1, 2)
    third = replay_on(kafka_broker, topic, group, handler, max_attempts=3)
    assert (third.read, third.requeued, third.exit_code) == (1, [], 0)
    assert [p["code"] for p in third.parked] == ["STILL_FAILING"]
    [parked] = read_all(kafka_broker.bootstrap_servers, parking)
    headers = dict(parked.headers())
    assert (headers[PARKED_CODE], headers[ATTEMPTS]) == (b"STILL_FAILING", b"3")
    assert replay_on(kafka_broker, topic, group, handler, max_attempts=3).read == 0


# --- with the real broker and the worker's own write path (SQLite SoR, qdrant-edge) ---------


@dataclass
class Stack:
    worker: IngestWorker
    store: EdgeStore
    sor_path: Path

    def put(self, key: str, tenant: str, text: str) -> dict[str, Any]:
        row = {
            "id": key,
            "company_id": tenant,
            "entity_type": "KNOWLEDGE_ARTIFACT",
            "name": f"Doc {key}",
            "content": text,
            "metadata": '{"format": "text"}',
            "created_at": "2026-01-01T00:00:00Z",
            "updated_at": "2026-01-02T00:00:00Z",
        }
        with sqlite3.connect(self.sor_path) as db:
            db.execute(
                f"INSERT INTO entities ({', '.join(row)}) VALUES ({', '.join('?' * len(row))})",
                tuple(row.values()),
            )
        return row

    def indexed(self, tenant: str) -> set[str]:
        return set(index_snapshot(self.store, self.worker.registry, [tenant]).get(tenant, {}))

    def replay(self, broker: TansuBroker, topic: str, group: str) -> ReplayReport:
        sor = self.worker.sor
        assert sor is not None
        return replay_on(
            broker,
            topic,
            group,
            self.worker.handler,
            config=PlanConfig(),
            known_tenants=self.worker.targets.known_tenants,
            locate=sor_locator(sor),
        )


@pytest.fixture
def stack(tmp_path: Path) -> Iterator[Stack]:
    sor_path = tmp_path / "sor.sqlite"
    with sqlite3.connect(sor_path) as db:
        db.executescript((REPO_ROOT / "schemas" / "sql" / "entities.sqlite.sql").read_text())
    ingest = IngestSettings(
        kafka=KafkaSettings(bootstrap_servers="127.0.0.1:1"),  # the worker's loop never runs
        store=StoreSettings(data_dir=tmp_path / "store"),
        sor=SorSettings(kind="sqlite", sqlite_path=sor_path),
        embedding_cache=None,
    )
    store = EdgeStore(tmp_path / "store")
    worker = build_worker(ingest, CollectorRegistry(), store=store, embedder=HashEmbedder())
    yield Stack(worker, store, sor_path)
    worker.close()
    store.close()


def entity_letter(n: int, row: dict[str, Any], code: str, **kwargs: Any) -> RawRecord:
    value = change_event(Op.CREATE, before=None, after=row, lsn=500 + n)
    original = RawRecord(
        "sor.public.entities", 0, n, encode_key({"id": row["id"]}), encode_value(value)
    )
    return letter(n, original, code, **kwargs)


@pytest.mark.integration
def test_a_truncated_letter_is_replayed_through_its_key_into_the_tenant_the_sor_names(
    kafka_broker: TansuBroker, stack: Stack
) -> None:
    """A value cut at `dlq_max_value_bytes` cannot be decoded: the key names the entity, the
    SoR says which tenant holds it (a tenant with no index yet), the worker indexes it."""
    topic, _, group = fresh(kafka_broker)
    row = stack.put("doc-1", "initech", "Pumps are serviced every spring. " * 40)
    dlq = entity_letter(0, row, "RECORD_TOO_LARGE", max_value_bytes=200)
    assert (dict(dlq.headers)["ragstream.value.truncated"], len(dlq.value or b"")) == (b"true", 200)
    produce_letters(kafka_broker, topic, [dlq])
    assert stack.indexed("initech") == set()

    report = stack.replay(kafka_broker, topic, group)
    assert (report.read, report.replayed, report.exit_code, report.committed) == (1, 1, 0, True)
    assert stack.indexed("initech") == {"entities:doc-1"}
    assert stack.replay(kafka_broker, topic, group).read == 0


@pytest.mark.integration
@pytest.mark.slow
def test_an_sor_outage_commits_nothing_and_the_next_run_replays(
    kafka_broker: TansuBroker, stack: Stack
) -> None:
    topic, parking, group = fresh(kafka_broker)
    row = stack.put("doc-2", "acme", "Invoices are sent on the first of the month.")
    bad = reindex_letter(0, b"{}")
    produce_letters(kafka_broker, topic, [bad, entity_letter(1, row, "SCHEMA_DRIFT")])
    sor = stack.worker.sor
    assert sor is not None
    away = stack.sor_path.with_suffix(".away")
    sor.close()
    os.rename(stack.sor_path, away)
    stack.sor_path.mkdir()  # "unable to open database file"
    try:
        down = stack.replay(kafka_broker, topic, group)
    finally:
        stack.sor_path.rmdir()
        os.rename(away, stack.sor_path)
        sor.close()
    assert down.outage is not None and down.outage["dependency"] == "sor"
    assert (down.read, down.replayed, down.parked, down.committed, down.exit_code) == (
        2,
        0,
        [],
        False,
        3,
    )
    assert committed(kafka_broker.bootstrap_servers, group, topic, [0])[0] < 0
    assert read_all(kafka_broker.bootstrap_servers, parking, timeout=3) == []

    up = stack.replay(kafka_broker, topic, group)
    assert (up.read, up.replayed, len(up.parked), up.exit_code) == (2, 1, 1, 0)
    assert stack.indexed("acme") == {"entities:doc-2"}
    assert stack.replay(kafka_broker, topic, group).read == 0


@pytest.mark.integration
def test_dead_letters_lost_to_the_dlqs_retention_are_named_and_the_replay_fails_once(
    mock_kafka: MockKafka, caplog: pytest.LogCaptureFixture
) -> None:
    """librdkafka's mock cluster (the only broker here with retention) deletes DLQ records the
    replay group never read: the replay reads from the log start, names the lost offsets and
    exits non-zero, instead of jumping silently as `auto.offset.reset=earliest` did. The next
    replay starts past them and is clean."""
    topic, group = f"dlq-{uuid.uuid4().hex[:8]}", uuid.uuid4().hex[:8]
    mock_kafka.produce(
        topic,
        [as_record(letter(n, change(n, Op.CREATE, ticket(n)), "SCHEMA_DRIFT")) for n in range(4)],
    )
    mock_kafka.commit(group, topic, 2)  # a replay read 0..1 earlier
    filler = as_record(letter(9, change(9, Op.CREATE, ticket(9)), "SCHEMA_DRIFT"), pad=200_000)
    low, high = mock_kafka.expire(topic, past=3, filler=filler)

    def replay_mock(group: str, handler: Rereads, from_beginning: bool = False) -> ReplayReport:
        letters = KafkaLetters(
            KafkaSettings(bootstrap_servers=mock_kafka.bootstrap_servers),
            topic,
            group,
            from_beginning=from_beginning,
            idle_s=1.0,
        )
        with letters:
            return replay_dlq(
                letters,
                parking_topic=f"{topic}.parked",
                decode=decode,
                config=PlanConfig(tables=(FIXED,)),
                handler=handler,
                known_tenants=lambda: ["acme"],
            )

    handler = Rereads()
    with caplog.at_level(logging.ERROR):
        report = replay_mock(group, handler)
    assert report.lost == [OffsetGap(topic, 0, 2, low, high)]
    assert report.as_dict()["lost_to_retention"] == [
        f"{topic}[0]: committed offset 2 < low watermark {low}, offsets 2..{low - 1} "
        f"({low - 2}) lost"
    ]
    # what retention left: fillers only, copies of one letter (one source offset)
    assert (report.read, report.replayed, report.duplicates) == (high - low, 1, high - low - 1)
    assert (report.committed, report.exit_code) == (True, 1)
    assert handler.calls == [("acme", ["tickets:9"])]
    assert any("ragstream reconcile --repair" in r.getMessage() for r in caplog.records)
    assert committed(mock_kafka.bootstrap_servers, group, topic, [0]) == {0: high}

    again = replay_mock(group, Rereads())
    assert (again.read, again.lost, again.exit_code) == (0, [], 0)
    # from the beginning means from the first record retention kept, which is no gap
    whole = replay_mock(uuid.uuid4().hex[:8], Rereads(), from_beginning=True)
    assert (whole.read, whole.lost, whole.exit_code) == (high - low, [], 0)


@pytest.mark.unit
def test_the_sor_locator_isolates_an_unreadable_row() -> None:
    class Sor:
        def fetch_entities(self, tenant: str | None, ids: Sequence[str]) -> dict[str, Any]:
            assert tenant is None
            if "tickets:2" in ids:
                raise MappingError("tickets:2: content is 9 characters, over the limit")

            @dataclass
            class Found:
                tenant_id: str

            return {i: Found("acme") for i in ids if i != "tickets:3"}

    locate = sor_locator(Sor())  # type: ignore[arg-type]
    found = locate(["tickets:1", "tickets:2", "tickets:3"])
    assert found["tickets:1"] == "acme" and "tickets:3" not in found
    assert isinstance(found["tickets:2"], MappingError)


@pytest.mark.integration
@pytest.mark.slow
def test_the_command_replays_parks_and_lists_with_its_exit_code(
    kafka_broker: TansuBroker,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    """`ragstream dlq replay` and `ragstream dlq list --parked`, wired from the environment as
    an operator runs them (the local embedder, a SQLite SoR, qdrant-edge)."""
    topic, parking, _ = fresh(kafka_broker)
    sor_path = tmp_path / "sor.sqlite"
    with sqlite3.connect(sor_path) as db:
        db.executescript((REPO_ROOT / "schemas" / "sql" / "entities.sqlite.sql").read_text())
        db.execute(
            "INSERT INTO entities (id, company_id, content, created_at, updated_at) VALUES "
            "('doc-9', 'acme', 'Seals are checked yearly.', '2026-01-01T00:00:00Z', "
            "'2026-01-01T00:00:00Z')"
        )
    row = {"id": "doc-9", "company_id": "acme", "content": "Seals are checked yearly."}
    produce_letters(
        kafka_broker,
        topic,
        [reindex_letter(0, b"[]"), entity_letter(1, row, "RECORD_TOO_LARGE", max_value_bytes=20)],
    )
    for variable, value in {
        "RAGSTREAM_KAFKA__BOOTSTRAP_SERVERS": kafka_broker.bootstrap_servers,
        "RAGSTREAM_CONSUMER__DLQ_TOPIC": topic,
        "RAGSTREAM_CONSUMER__REINDEX_TOPIC": REINDEX,
        "RAGSTREAM_CONSUMER__HIGH_WATERMARK_SLACK": "1000",
        "RAGSTREAM_SOR__KIND": "sqlite",
        "RAGSTREAM_SOR__SQLITE_PATH": str(sor_path),
        "RAGSTREAM_STORE__DATA_DIR": str(tmp_path / "store"),
        "RAGSTREAM_EMBEDDING_CACHE__PATH": str(tmp_path / "cache.sqlite"),
    }.items():
        monkeypatch.setenv(variable, value)

    assert main(["dlq", "replay", "--idle-s", "1"]) == 0
    report = json.loads(capsys.readouterr().out)
    assert (report["read"], report["replayed"], report["parked"], report["exit_code"]) == (
        2,
        1,
        1,
        0,
    )
    assert report["parked_by_code"] == {"BAD_REINDEX_REQUEST": 1}
    assert main(["dlq", "list", "--parked", "--idle-s", "1"]) == 0
    [listed] = json.loads(capsys.readouterr().out)
    assert listed["parks"]["code"] == "BAD_REINDEX_REQUEST"
    assert listed["dlq"].startswith(f"{parking}[")
    assert main(["dlq", "replay", "--idle-s", "1"]) == 0
    assert json.loads(capsys.readouterr().out)["read"] == 0
