"""`ragstream dlq replay`: dead-lettered records, re-planned with the current table mappings,
become re-reads of the entities they name; what still fails is listed."""

from __future__ import annotations

import hashlib
import logging
import uuid
from collections.abc import Sequence
from typing import Any

import pytest

from ragcore.kafka_config import KafkaSettings
from ragcore.mapping import TableMapping
from ragcore.plan import PlanConfig
from ragdev.sor.debezium_format import change_event, encode_key, encode_value
from ragstream.dlq import ReplayReport, original_record, replay_dlq, replay_records
from schemas.entities import ContentFormat
from schemas.events import Op, RawRecord
from streams.consumer import DeadLetter, OffsetGap, dlq_headers
from streams.decode import DecodeOptions, decode_record
from streams.ingest import Rejection
from tests.streams.support import MockKafka, Record, committed

TOPIC = "sor.public.tickets"
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


def hasher(content: str, fmt: ContentFormat) -> str:
    return hashlib.sha256(content.encode()).hexdigest()


def ticket(key: int, org: str = "acme") -> dict[str, Any]:
    return {"id": key, "org": org, "subject": f"Ticket {key}", "description": "It jams."}


def dead_letter(n: int, op: Op, row: dict[str, Any], code: str) -> RawRecord:
    value = change_event(
        op,
        before=row if op is Op.DELETE else None,
        after=None if op is Op.DELETE else row,
        table="tickets",
        lsn=100 + n,
    )
    original = RawRecord(
        topic=TOPIC,
        partition=0,
        offset=n,
        key=encode_key({"id": row["id"]}),
        value=encode_value(value),
    )
    headers = dlq_headers(DeadLetter(original, code, "why", "plan"), truncated=False)
    return RawRecord(
        topic="ragstream.dlq",
        partition=0,
        offset=1000 + n,
        key=original.key,
        value=original.value,
        headers=tuple(
            (k, v if isinstance(v, bytes) or v is None else v.encode()) for k, v in headers
        ),
    )


class Rereads:
    def __init__(self, rejected: Sequence[str] = ()) -> None:
        self.calls: list[tuple[str, list[str]]] = []
        self._rejected = set(rejected)

    def reread(self, tenant_id: str, entity_ids: Sequence[str], reason: str) -> list[Rejection]:
        assert reason == "dlq_replay"
        self.calls.append((tenant_id, sorted(entity_ids)))
        return [Rejection(e, "CHUNKING_ERROR", "no") for e in entity_ids if e in self._rejected]


def replay(records: Sequence[RawRecord], mapping: TableMapping, handler: Rereads) -> Any:
    options = DecodeOptions()
    return replay_records(
        records,
        decode=lambda raw: decode_record(raw, options),
        config=PlanConfig(tables=(mapping,)),
        handler=handler,
        known_tenants=lambda: ["acme", "globex"],
    )


@pytest.mark.unit
def test_the_original_record_comes_back_from_the_dlq_headers() -> None:
    dlq = dead_letter(7, Op.CREATE, ticket(1), "SCHEMA_DRIFT")
    raw, code = original_record(dlq)
    assert (raw.topic, raw.partition, raw.offset, code) == (TOPIC, 0, 7, "SCHEMA_DRIFT")
    assert raw.value == dlq.value and not any(k.startswith("ragstream.") for k, _ in raw.headers)


@pytest.mark.unit
def test_after_the_mapping_is_fixed_every_named_entity_is_reread_per_tenant() -> None:
    records = [
        dead_letter(0, Op.CREATE, ticket(1), "SCHEMA_DRIFT"),
        dead_letter(1, Op.UPDATE, ticket(1), "SCHEMA_DRIFT"),
        dead_letter(2, Op.CREATE, ticket(2, "globex"), "SCHEMA_DRIFT"),
        dead_letter(3, Op.CREATE, ticket(3), "POLICY_TRUNCATE"),
    ]
    handler = Rereads()
    report = replay(records, FIXED, handler)
    assert sorted(handler.calls) == [("acme", ["tickets:1"]), ("globex", ["tickets:2"])]
    assert (report.read, report.entities, report.skipped, report.failing) == (4, 2, 1, [])


@pytest.mark.unit
def test_a_record_lacking_a_column_still_names_its_entity_for_the_reread() -> None:
    # the schema was fixed (column renamed back): the record itself still lacks `body`, yet
    # its key and tenant name the entity to re-read; the SoR holds the content
    handler = Rereads()
    report = replay([dead_letter(0, Op.CREATE, ticket(1), "SCHEMA_DRIFT")], BROKEN, handler)
    assert handler.calls == [("acme", ["tickets:1"])] and report.failing == []


@pytest.mark.unit
def test_records_of_unmapped_tables_are_listed_and_nothing_is_reread() -> None:
    other = BROKEN.model_copy(update={"table": "public.other"})
    handler = Rereads()
    report = replay([dead_letter(0, Op.CREATE, ticket(1), "MAPPING_ERROR")], other, handler)
    assert handler.calls == []
    assert [f["code"] for f in report.failing] == ["MAPPING_ERROR"]
    assert "public.tickets" in report.failing[0]["reason"]


@pytest.mark.unit
def test_an_entity_the_write_path_still_rejects_is_listed_with_its_record() -> None:
    records = [dead_letter(5, Op.CREATE, ticket(9), "CHUNKING_ERROR")]
    report = replay(records, FIXED, Rereads(rejected=["tickets:9"]))
    assert report.failing == [
        {
            "dlq": "ragstream.dlq[0]@1005",
            "entity_id": "tickets:9",
            "code": "CHUNKING_ERROR",
            "reason": "no",
        }
    ]


@pytest.mark.unit
def test_a_dead_lettered_delete_rereads_the_entity_in_its_tenant() -> None:
    handler = Rereads()
    report = replay([dead_letter(0, Op.DELETE, ticket(4), "SOR_TABLE_UNREADABLE")], FIXED, handler)
    assert handler.calls == [("acme", ["tickets:4"])] and report.failing == []


@pytest.mark.unit
def test_a_record_without_tenant_is_reread_in_every_tenant() -> None:
    handler = Rereads()
    keyless = dead_letter(0, Op.DELETE, {"id": 5, "org": "", "subject": "", "description": ""}, "X")
    report = replay([keyless], FIXED, handler)
    assert sorted(handler.calls) == [("acme", ["tickets:5"]), ("globex", ["tickets:5"])]
    assert report.failing == []


def replay_from(
    kafka: MockKafka, topic: str, group: str, handler: Rereads, *, from_beginning: bool = False
) -> ReplayReport:
    options = DecodeOptions()
    return replay_dlq(
        KafkaSettings(bootstrap_servers=kafka.bootstrap_servers),
        topic,
        group,
        decode=lambda raw: decode_record(raw, options),
        config=PlanConfig(tables=(FIXED,)),
        handler=handler,
        known_tenants=lambda: ["acme"],
        from_beginning=from_beginning,
        idle_s=1.0,
    )


def as_record(raw: RawRecord, pad: int = 0) -> Record:
    headers = tuple((k, v or b"") for k, v in raw.headers)
    return Record(raw.key, raw.value, headers + ((("pad", b"x" * pad),) if pad else ()))


@pytest.mark.integration
def test_dead_letters_lost_to_the_dlqs_retention_are_named_and_the_replay_fails_once(
    mock_kafka: MockKafka, caplog: pytest.LogCaptureFixture
) -> None:
    """librdkafka's mock cluster (the only broker here with retention) deletes DLQ records the
    replay group never read: the replay reads from the log start, names the lost offsets and
    exits non-zero (`ok` false), instead of jumping silently as `auto.offset.reset=earliest`
    did. The next replay starts past them and is clean."""
    topic, group = f"dlq-{uuid.uuid4().hex[:8]}", uuid.uuid4().hex[:8]
    mock_kafka.produce(
        topic, [as_record(dead_letter(n, Op.CREATE, ticket(n), "SCHEMA_DRIFT")) for n in range(4)]
    )
    mock_kafka.commit(group, topic, 2)  # a replay read 0..1 earlier
    filler = as_record(dead_letter(9, Op.CREATE, ticket(9), "SCHEMA_DRIFT"), pad=200_000)
    low, high = mock_kafka.expire(topic, past=3, filler=filler)

    handler = Rereads()
    with caplog.at_level(logging.ERROR):
        report = replay_from(mock_kafka, topic, group, handler)
    assert report.lost == [OffsetGap(topic, 0, 2, low, high)]
    assert report.as_dict()["lost_to_retention"] == [
        f"{topic}[0]: committed offset 2 < low watermark {low}, offsets 2..{low - 1} "
        f"({low - 2}) lost"
    ]
    assert (report.read, report.failing, report.committed, report.ok) == (
        high - low,
        [],
        True,
        False,
    )
    assert handler.calls == [("acme", ["tickets:9"])]  # what retention left: fillers only
    assert any("ragstream reconcile --repair" in r.getMessage() for r in caplog.records)
    assert committed(mock_kafka.bootstrap_servers, group, topic, [0]) == {0: high}

    again = replay_from(mock_kafka, topic, group, Rereads())
    assert (again.read, again.lost, again.ok) == (0, [], True)
    # from the beginning means from the first record retention kept, which is no gap
    whole = replay_from(mock_kafka, topic, uuid.uuid4().hex[:8], Rereads(), from_beginning=True)
    assert (whole.read, whole.lost, whole.ok) == (high - low, [], True)
