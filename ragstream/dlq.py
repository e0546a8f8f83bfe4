"""`ragstream dlq replay`: bring back what was dead-lettered, once its cause is fixed; park what
never can be, so that nothing blocks the letters after it.

**What a letter names.** A dead letter keeps the original record's key and value (the value cut
at `dlq_max_value_bytes`, header `ragstream.value.truncated=true`) and its source topic,
partition and offset (`ragstream.source.*`). The replay names the entity a letter is about,
with the *current* table mappings, from the first of these that names one:

1. the decoded value (`ragcore.plan.identity_of`: key and tenant columns only, so a record that
   lacks a since-restored column still names its entity); never a truncated value;
2. the headers `ragstream.error.entity` and `ragstream.error.tenant`, when the worker wrote
   them (letters written before it did have none);
3. the Kafka key (Debezium's key: the primary-key columns, with or without the JsonConverter
   schema), decoded by the worker's decoder, on the table of `ragstream.error.table` or of the
   source topic. A key rarely holds the tenant column.

A letter of the reindex-request topic (Retrieve's requests) names the entity of its request.

**The re-read.** Each named entity is re-read from the system of record through the worker's
write path (`IngestHandler.reread`): what the SoR holds now is indexed, a row that is gone is
deleted. Re-reading instead of re-applying the old event means the replay can never put an
outdated version over a newer one, and running it twice is harmless. An entity whose tenant is
unknown is re-read in the tenant the SoR holds it in now (`sor_locator`) and in every tenant
with an index (to delete copies left where it was).

**Every letter read ends one way**, counted in the report:

- *replayed*: its entity was re-read (in every tenant it names) and indexed or deleted;
- *re-queued*: its entity still cannot be indexed (a mapping still wrong, a SoR table still
  unreadable, content that cannot be chunked: fixable later). It is written again at the tail
  of the topic replayed, with `ragstream.replay.attempts` counting the replays it failed and
  `ragstream.replay.code`/`reason`/`at` saying why; the next replay tries it again. A letter
  that failed `max_attempts` replays (default 5) is parked instead (`STILL_FAILING`);
- *parked*: it can never name an entity to re-read (`ParkCode`: a reindex request that cannot
  be read, a letter of a table no mapping knows, one whose value, headers and key name no
  entity, a letter dead-lettered by policy, a record without source headers) or it failed too
  often. It is written to the parking topic (default `<DLQ topic>.parked`) with its original
  headers and `ragstream.parked.code`/`reason`/`at`. `ragstream dlq list --parked` lists
  them, `ragstream dlq replay --parked` replays them once their cause is fixed (what still
  fails there is parked again at its tail).

Re-queued and parked letters are written, and their delivery acknowledged, before the replay
group commits past the letters it read: a crash in between duplicates letters, never loses one.
Copies of one original record read in the same run (same `ragstream.source.*`: a re-queued
copy and its original after such a crash, or with `--from-beginning`) are settled once, through
the copy that failed most replays; the others count as *duplicates*. An **outage** (SoR,
store, embedder or broker unavailable) commits nothing: one before the writes writes nothing,
one during them or the commit leaves what was written to be duplicated by the next run; every
letter read stays where it was for the next run (the re-reads already done are harmless to
repeat).

The DLQ has retention like any topic. A replay group whose committed offset fell below the
log start never reads the records in between: no offset jumps silently
(`auto.offset.reset=error`); the replay starts at the log start, names the lost offsets in the
report (`lost_to_retention`) and an ERROR, and fails even when everything it read was
replayed, because the entities those records named can only be brought back by
`ragstream reconcile --repair`.

Exit codes (`ReplayReport.exit_code`): 0 nothing is left failing in the topic replayed (every
letter replayed or parked away); 1 letters were re-queued (or parked again, when replaying the
parking topic), offsets were lost to retention, or the read stopped at its limit; 3 an outage,
nothing committed. Configuration errors exit 2 like every command.
"""

from __future__ import annotations

import dataclasses
import json
import logging
import uuid
from collections import Counter
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from enum import StrEnum
from types import TracebackType
from typing import Any, Literal, Protocol

from confluent_kafka import (
    OFFSET_BEGINNING,
    Consumer,
    KafkaError,
    KafkaException,
    Message,
    Producer,
    TopicPartition,
)

from ragcore.errors import (
    ConfigError,
    DeadLetterUnavailableError,
    DecodeError,
    InvalidTenantError,
    MappingError,
    RagstreamError,
    SorTableError,
    UnavailableError,
)
from ragcore.kafka_config import KafkaSettings
from ragcore.mapping import RowView, TableMapping, table_of_entity
from ragcore.plan import PlanConfig, identity_of
from ragcore.sor.base import SystemOfRecord
from ragcore.store.ids import validate_tenant
from schemas.events import ChangeEvent, RawRecord
from streams.consumer import DLQ_HEADER_PREFIX, OffsetGap, dependency_of, offset_gap, to_raw
from streams.ingest import Rejection

log = logging.getLogger(__name__)

_P = DLQ_HEADER_PREFIX
_CODE = _P + "error.code"
_MESSAGE = _P + "error.message"
_SOURCE = _P + "source."
#: written by the worker
TRUNCATED = _P + "value.truncated"
ERROR_TABLE = _P + "error.table"
ERROR_COLUMN = _P + "error.column"
ERROR_ENTITY = _P + "error.entity"
ERROR_TENANT = _P + "error.tenant"
#: written by the replay on a re-queued letter
ATTEMPTS = _P + "replay.attempts"
REPLAY_CODE = _P + "replay.code"
REPLAY_REASON = _P + "replay.reason"
REPLAY_AT = _P + "replay.at"
#: written by the replay on a parked letter
PARKED_CODE = _P + "parked.code"
PARKED_REASON = _P + "parked.reason"
PARKED_AT = _P + "parked.at"

#: The re-read reason (`ragstream_ingest_rereads_total`, logs).
REREAD_REASON = "dlq_replay"
DEFAULT_MAX_ATTEMPTS = 5
#: Exit codes of `ragstream dlq replay` (2 is every command's configuration error).
EXIT_CLEAN, EXIT_LEFT_FAILING, EXIT_OUTAGE = 0, 1, 3


def parking_topic_of(dlq_topic: str) -> str:
    """The default parking topic of a DLQ topic."""
    return f"{dlq_topic}.parked"


class ParkCode(StrEnum):
    """Why a letter was parked (`ragstream.parked.code`)."""

    #: no `ragstream.source.*` headers: not written by the worker, nothing to name
    NOT_A_LETTER = "NOT_A_LETTER"
    #: a reindex request (Retrieve's) that cannot be read
    BAD_REINDEX_REQUEST = "BAD_REINDEX_REQUEST"
    #: dead-lettered by policy (`POLICY_*`: a truncate or logical message): names no entity
    BY_POLICY = "BY_POLICY"
    #: neither its value, its headers nor its key name an entity
    NO_ENTITY = "NO_ENTITY"
    #: no table mapping knows its table or topic
    UNMAPPED_TABLE = "UNMAPPED_TABLE"
    #: its entity still could not be indexed after `max_attempts` replays
    STILL_FAILING = "STILL_FAILING"


@dataclass(frozen=True, slots=True)
class Named:
    """The entity a letter names, the tenants it names (empty: unknown) and where the replay
    read them."""

    entity_id: str
    tenants: tuple[str, ...]
    found_in: Literal["value", "headers", "key", "reindex request"]


@dataclass(frozen=True, slots=True)
class Permanent:
    """A letter that can never be replayed as it is: it is parked."""

    code: ParkCode
    reason: str


@dataclass(frozen=True, slots=True)
class Outcome:
    """What the re-read made of one letter: `replayed`, `failing` (fixable later: its entity
    still cannot be indexed), `permanent` (`code` is then a `ParkCode`) or `duplicate` (a copy
    of another letter read in the same run, settled with it)."""

    letter: RawRecord
    status: Literal["replayed", "failing", "permanent", "duplicate"]
    code: str = ""
    reason: str = ""
    entity_id: str | None = None


@dataclass(frozen=True, slots=True)
class Outgoing:
    """A letter to write: re-queued at the tail of the topic replayed, or parked."""

    topic: str
    key: bytes | None
    value: bytes | None
    headers: tuple[tuple[str, bytes | None], ...]


@dataclass(frozen=True, slots=True)
class Letters:
    """What one read of a DLQ topic returned: the letters, the offsets lost to retention,
    and whether the read stopped at its limit (more letters wait)."""

    records: list[RawRecord]
    gaps: list[OffsetGap] = field(default_factory=list)
    more: bool = False


@dataclass
class ReplayReport:
    """What a replay did (`as_dict` is the command's JSON output)."""

    topic: str
    parking_topic: str
    read: int = 0
    replayed: int = 0
    #: copies of a letter read in the same run, settled with it
    duplicates: int = 0
    #: (tenant, entity) pairs re-read from the SoR
    entities: int = 0
    requeued: list[dict[str, Any]] = field(default_factory=list)
    parked: list[dict[str, Any]] = field(default_factory=list)
    #: DLQ offsets deleted by retention before the replay group read them
    lost: list[OffsetGap] = field(default_factory=list)
    #: the read stopped at its limit: later letters wait for the next run
    more: bool = False
    #: the dependency that was unavailable (nothing committed), or None
    outage: dict[str, str] | None = None
    committed: bool = False

    @property
    def left_failing(self) -> int:
        """Letters still failing in the topic replayed: the re-queued ones, and the parked
        ones when the topic replayed is the parking topic."""
        again = len(self.parked) if self.topic == self.parking_topic else 0
        return len(self.requeued) + again

    @property
    def exit_code(self) -> int:
        """0 nothing is left failing in the topic replayed; 1 letters left failing, offsets
        lost to retention, or more to read; 3 an outage (nothing committed)."""
        if self.outage is not None:
            return EXIT_OUTAGE
        if self.left_failing or self.lost or self.more:
            return EXIT_LEFT_FAILING
        return EXIT_CLEAN

    @property
    def ok(self) -> bool:
        """Whether the replay left nothing failing in the topic it replayed."""
        return self.exit_code == EXIT_CLEAN

    def as_dict(self) -> dict[str, Any]:
        """JSON form (the command's output)."""
        return {
            "topic": self.topic,
            "parking_topic": self.parking_topic,
            "read": self.read,
            "replayed": self.replayed,
            "duplicates": self.duplicates,
            "requeued": len(self.requeued),
            "parked": len(self.parked),
            "parked_by_code": dict(sorted(Counter(p["code"] for p in self.parked).items())),
            "entities_reread": self.entities,
            "lost_to_retention": [gap.describe() for gap in self.lost],
            "more_to_read": self.more,
            "outage": self.outage,
            "committed": self.committed,
            "exit_code": self.exit_code,
            "requeued_letters": self.requeued,
            "parked_letters": self.parked,
        }

    def unavailable(self, exc: UnavailableError) -> ReplayReport:
        """This report after an outage: nothing settled, nothing committed."""
        self.outage = {"dependency": dependency_of(exc), "code": exc.code, "reason": str(exc)}
        self.replayed, self.duplicates, self.requeued, self.parked = 0, 0, [], []
        self.committed = False
        return self


# --- reading a letter ---------------------------------------------------------------------


def where(rec: RawRecord) -> str:
    """`topic[partition]@offset`, for reports and logs."""
    return f"{rec.topic}[{rec.partition}]@{rec.offset}"


def own_headers(dlq: RawRecord) -> dict[str, str]:
    """The letter's `ragstream.*` headers as text (the last one of a name wins)."""
    return {k: (v or b"").decode("utf-8", "replace") for k, v in dlq.headers if k.startswith(_P)}


def original_record(dlq: RawRecord) -> tuple[RawRecord, str]:
    """The record as it was before it was dead-lettered (its source topic, partition and offset
    from the `ragstream.source.*` headers), and the error code it was dead-lettered with."""
    found = own_headers(dlq)
    original = tuple((k, v) for k, v in dlq.headers if not k.startswith(_P))
    topic = found.get(_SOURCE + "topic")
    if not topic:
        raise RagstreamError(f"{where(dlq)}: no source headers")
    return (
        RawRecord(
            topic=topic,
            partition=int(found.get(_SOURCE + "partition") or 0),
            offset=int(found.get(_SOURCE + "offset") or 0),
            key=dlq.key,
            value=dlq.value,
            headers=original,
        ),
        found.get(_CODE, ""),
    )


def decode_key(
    raw: RawRecord, decode: Callable[[RawRecord], ChangeEvent]
) -> Mapping[str, Any] | None:
    """The record's Kafka key as the worker's decoder reads it (JsonConverter envelope or not,
    logical types, column hints): the record decoded without its value, i.e. as a tombstone,
    which decodes the key alone. Raises `DecodeError` for a key it cannot read."""
    return decode(dataclasses.replace(raw, value=None)).key


def name_letter(
    dlq: RawRecord,
    *,
    decode: Callable[[RawRecord], ChangeEvent],
    config: PlanConfig,
    reindex_topic: str | None = None,
) -> Named | Permanent:
    """The entity a letter names (see the module docstring for the order), or why it never
    can."""
    try:
        raw, code = original_record(dlq)
    except (RagstreamError, ValueError) as exc:
        return Permanent(ParkCode.NOT_A_LETTER, str(exc))
    headers = own_headers(dlq)
    if code == "BAD_REINDEX_REQUEST":
        return Permanent(
            ParkCode.BAD_REINDEX_REQUEST,
            f"a reindex request that cannot be read names no entity: {headers.get(_MESSAGE, '')}",
        )
    if code.startswith("POLICY_"):
        return Permanent(ParkCode.BY_POLICY, f"dead-lettered by policy ({code}): no entity")
    if reindex_topic is not None and raw.topic == reindex_topic:
        return _reindex_request(raw, config)
    notes: list[str] = []
    if headers.get(TRUNCATED) == "true":
        notes.append("value: truncated in the DLQ")
    else:
        named = _from_value(raw, decode, config, notes)
        if named is not None:
            return named
    named = _from_headers(headers, config, notes)
    if named is not None:
        return named
    return _from_key(raw, headers, decode, config, notes)


def _from_value(
    raw: RawRecord,
    decode: Callable[[RawRecord], ChangeEvent],
    config: PlanConfig,
    notes: list[str],
) -> Named | None:
    try:
        event = decode(raw)
        identity = identity_of(event, config)
    except (DecodeError, MappingError) as exc:
        notes.append(f"value: {exc}")
        return None
    if identity is None:
        notes.append(f"value: a {event.kind.value} record names no entity")
        return None
    entity_id, tenants = identity
    return Named(entity_id, tuple(t for t in tenants if t is not None), "value")


def _from_headers(headers: Mapping[str, str], config: PlanConfig, notes: list[str]) -> Named | None:
    entity_id = headers.get(ERROR_ENTITY, "").strip()
    if not entity_id:
        return None
    mapping = config.catalog.for_entity(entity_id)
    try:
        if mapping is None:
            raise MappingError(f"{entity_id!r} belongs to no mapped table")
        mapping.key_of(entity_id)
    except MappingError as exc:
        notes.append(f"header {ERROR_ENTITY}: {exc}")
        return None
    tenant = headers.get(ERROR_TENANT, "").strip()
    if tenant:
        try:
            return Named(entity_id, (validate_tenant(tenant),), "headers")
        except InvalidTenantError as exc:
            notes.append(f"header {ERROR_TENANT}: {exc}")
    return Named(entity_id, (mapping.tenant,) if mapping.tenant else (), "headers")


def _from_key(
    raw: RawRecord,
    headers: Mapping[str, str],
    decode: Callable[[RawRecord], ChangeEvent],
    config: PlanConfig,
    notes: list[str],
) -> Named | Permanent:
    mapping = _table_of(headers.get(ERROR_TABLE, ""), raw.topic, config)
    if mapping is None:
        notes.append(f"key: no table mapping for topic {raw.topic!r}")
        return Permanent(ParkCode.UNMAPPED_TABLE, "; ".join(notes))
    if raw.key is None:
        notes.append("key: none")
        return Permanent(ParkCode.NO_ENTITY, "; ".join(notes))
    try:
        key = decode_key(raw, decode)
        if key is None:
            raise MappingError("a null key")
        row = RowView(key, where(raw))
        entity_id = mapping.row_entity_id(row)
        tenant = mapping.row_tenant_if_known(row)
    except (DecodeError, MappingError) as exc:
        notes.append(f"key: {exc}")
        return Permanent(ParkCode.NO_ENTITY, "; ".join(notes))
    return Named(entity_id, (tenant,) if tenant else (), "key")


def _table_of(header: str, topic: str, config: PlanConfig) -> TableMapping | None:
    """The table named by `ragstream.error.table` (qualified or by its name in entity ids),
    else the table of the topic."""
    header = header.strip()
    if header:
        for mapping in config.catalog:
            if header in (mapping.table, f"{mapping.schema_name}.{mapping.table_name}"):
                return mapping
        found = config.catalog.by_label(header)
        if found is not None:
            return found
    return config.catalog.for_topic(topic)


def _reindex_request(raw: RawRecord, config: PlanConfig) -> Named | Permanent:
    """A letter of Retrieve's reindex-request topic: the entity its request names (read as the
    worker reads it: `streams.ingest.plan`)."""
    try:
        doc = json.loads(raw.value or b"")
        tenant, entity_id = doc["tenant"], doc["entity_id"]
        if not isinstance(tenant, str) or not isinstance(entity_id, str) or not entity_id:
            raise TypeError("tenant and entity_id must be strings")
        validate_tenant(tenant)
    except (ValueError, KeyError, TypeError, InvalidTenantError) as exc:
        return Permanent(ParkCode.BAD_REINDEX_REQUEST, f"reindex request: {exc}")
    if config.catalog.for_entity(entity_id) is None:
        return Permanent(
            ParkCode.UNMAPPED_TABLE, f"reindex request: {entity_id!r} belongs to no mapped table"
        )
    return Named(entity_id, (tenant,), "reindex request")


# --- re-reading what the letters name -------------------------------------------------------


class Rereader(Protocol):
    """The worker's re-read path (`IngestHandler.reread`)."""

    def reread(self, tenant_id: str, entity_ids: Sequence[str], reason: str) -> list[Rejection]:
        """Re-read entities from the SoR and apply what it holds now."""
        ...


#: entity ids -> the tenant the SoR holds each in now (absent: no live row), or why the SoR
#: cannot tell (a `MappingError` or `SorTableError`: the entity cannot be indexed yet).
#: Raises `SorUnavailableError` when the SoR is unreachable.
Locator = Callable[[Sequence[str]], Mapping[str, str | RagstreamError]]


def sor_locator(sor: SystemOfRecord) -> Locator:
    """A `Locator` reading the SoR: one query per table, and one per entity of a table whose
    query failed (so one row that cannot be mapped does not hide the others)."""

    def locate_all(entity_ids: Sequence[str]) -> dict[str, str | RagstreamError]:
        try:
            found = sor.fetch_entities(None, entity_ids)
            # a row that cannot be read (SorRowError) says why the entity cannot be indexed yet
            return {
                e: row if isinstance(row, RagstreamError) else row.tenant_id
                for e, row in found.items()
            }
        except (MappingError, SorTableError) as exc:
            if len(entity_ids) == 1:
                return {entity_ids[0]: exc}
        out: dict[str, str | RagstreamError] = {}
        for entity_id in entity_ids:
            out.update(locate_all([entity_id]))
        return out

    def locate(entity_ids: Sequence[str]) -> dict[str, str | RagstreamError]:
        by_table: dict[str, list[str]] = {}
        for entity_id in entity_ids:
            by_table.setdefault(table_of_entity(entity_id), []).append(entity_id)
        out: dict[str, str | RagstreamError] = {}
        for ids in by_table.values():
            out.update(locate_all(ids))
        return out

    return locate


def replay_records(
    records: Sequence[RawRecord],
    *,
    decode: Callable[[RawRecord], ChangeEvent],
    config: PlanConfig,
    handler: Rereader,
    known_tenants: Callable[[], Sequence[str]],
    locate: Locator | None = None,
    reindex_topic: str | None = None,
) -> tuple[list[Outcome], int]:
    """Name the entity of every letter and re-read it (see the module docstring); returns one
    outcome per letter, in order, and the number of (tenant, entity) pairs re-read. Copies of
    one original record (same `ragstream.source.*`: a re-queued copy read again with
    `--from-beginning`, a copy a crash left) are settled once, through the copy that failed
    most replays; the others are `duplicate`. An outage raises (an `UnavailableError`) and
    settles nothing."""
    copy_of = _copies(records)
    verdicts: list[Named | Permanent | None] = [
        None
        if copy_of[i] is not None
        else name_letter(dlq, decode=decode, config=config, reindex_topic=reindex_topic)
        for i, dlq in enumerate(records)
    ]
    named = [v for v in verdicts if isinstance(v, Named)]
    tenantless = sorted({v.entity_id for v in named if not v.tenants})
    located: Mapping[str, str | RagstreamError] = {}
    everywhere: list[str] = []
    if tenantless:
        located = locate(tenantless) if locate is not None else {}
        everywhere = list(known_tenants())

    def tenants_of(verdict: Named) -> tuple[str, ...]:
        if verdict.tenants:
            return verdict.tenants
        here = located.get(verdict.entity_id)
        if isinstance(here, RagstreamError):
            return ()  # the SoR cannot tell: a re-read elsewhere would delete what it hides
        # where the SoR holds it now, and wherever a copy may be indexed
        return tuple(dict.fromkeys([*([here] if here is not None else []), *everywhere]))

    by_tenant: dict[str, set[str]] = {}
    for one in named:
        for tenant in tenants_of(one):
            by_tenant.setdefault(tenant, set()).add(one.entity_id)
    rejected: dict[tuple[str, str], Rejection] = {}
    for tenant, entity_ids in sorted(by_tenant.items()):
        for rejection in handler.reread(tenant, sorted(entity_ids), REREAD_REASON):
            rejected[(tenant, rejection.entity_id)] = rejection
    outcomes: list[Outcome] = []
    for dlq, verdict, original in zip(records, verdicts, copy_of, strict=True):
        if original is not None:
            reason = f"a copy of {where(records[original])}, settled with it"
            outcomes.append(Outcome(dlq, "duplicate", reason=reason))
        elif isinstance(verdict, Permanent):
            outcomes.append(Outcome(dlq, "permanent", verdict.code.value, verdict.reason))
        elif isinstance(verdict, Named):
            outcomes.append(_reread_outcome(dlq, verdict, tenants_of(verdict), located, rejected))
    return outcomes, sum(len(ids) for ids in by_tenant.values())


def _reread_outcome(
    dlq: RawRecord,
    verdict: Named,
    tenants: Sequence[str],
    located: Mapping[str, str | RagstreamError],
    rejected: Mapping[tuple[str, str], Rejection],
) -> Outcome:
    entity_id = verdict.entity_id
    cannot_tell = located.get(entity_id) if not verdict.tenants else None
    if isinstance(cannot_tell, RagstreamError):
        return Outcome(dlq, "failing", cannot_tell.code, str(cannot_tell), entity_id)
    found = [(t, rejected[(t, entity_id)]) for t in tenants if (t, entity_id) in rejected]
    if found:
        reason = "; ".join(f"in {t}: {r.reason}" for t, r in found)
        return Outcome(dlq, "failing", found[0][1].code, reason, entity_id)
    return Outcome(dlq, "replayed", entity_id=entity_id)


def _copies(records: Sequence[RawRecord]) -> list[int | None]:
    """For each letter, the index of the copy of the same original record it is settled with
    (the one that failed most replays, the last read among equals), or None: itself."""
    chosen: dict[tuple[str, str, str], int] = {}
    keys: list[tuple[str, str, str] | None] = []
    for i, dlq in enumerate(records):
        found = own_headers(dlq)
        source = tuple(found.get(_SOURCE + part, "") for part in ("topic", "partition", "offset"))
        key = (source[0], source[1], source[2]) if source[0] else None
        keys.append(key)
        if key is not None:
            best = chosen.get(key)
            if best is None or attempts_of(dlq) >= attempts_of(records[best]):
                chosen[key] = i
    return [None if k is None or chosen[k] == i else chosen[k] for i, k in enumerate(keys)]


# --- settling: re-queue, park, count -------------------------------------------------------


def attempts_of(dlq: RawRecord) -> int:
    """How many replays a letter failed (`ragstream.replay.attempts`; 0 when absent)."""
    text = own_headers(dlq).get(ATTEMPTS, "").strip()
    if not text:
        return 0
    if not text.isdigit():
        log.warning("%s: unreadable %s %r, counted as 0", where(dlq), ATTEMPTS, text[:40])
        return 0
    return int(text)


def _now() -> str:
    return datetime.now(UTC).isoformat(timespec="seconds").replace("+00:00", "Z")


def _rewritten(dlq: RawRecord, topic: str, replaced: Mapping[str, str]) -> Outgoing:
    """The letter to write to `topic`: its key, value and headers, with `replaced` set (any
    earlier header of those names dropped)."""
    kept = tuple((k, v) for k, v in dlq.headers if k not in replaced)
    added = tuple((k, v.encode()) for k, v in replaced.items())
    return Outgoing(topic, dlq.key, dlq.value, kept + added)


def _check_attempts(max_attempts: int) -> None:
    if max_attempts < 1:
        raise ConfigError(f"max_attempts must be at least 1, not {max_attempts}")


def settle(
    outcomes: Sequence[Outcome],
    *,
    topic: str,
    parking_topic: str,
    max_attempts: int,
    report: ReplayReport,
    now: Callable[[], str] = _now,
) -> list[Outgoing]:
    """What to write for `outcomes` (read from `topic`): failing letters re-queued at its
    tail with one more attempt, or parked after `max_attempts` (always when `topic` is the
    parking topic); permanent ones parked. Counts every letter in `report`."""
    _check_attempts(max_attempts)
    out: list[Outgoing] = []
    at = now()
    for outcome in outcomes:
        dlq = outcome.letter
        if outcome.status == "replayed":
            report.replayed += 1
            continue
        if outcome.status == "duplicate":
            report.duplicates += 1
            continue
        entry: dict[str, Any] = {
            "dlq": where(dlq),
            "code": outcome.code,
            "reason": outcome.reason,
            "entity_id": outcome.entity_id,
            "error_code": own_headers(dlq).get(_CODE, ""),
        }
        if outcome.status == "failing":
            attempts = attempts_of(dlq) + 1
            entry["attempts"] = attempts
            failed = {
                ATTEMPTS: str(attempts),
                REPLAY_CODE: outcome.code,
                REPLAY_REASON: outcome.reason[:2000],
                REPLAY_AT: at,
            }
            if attempts < max_attempts and topic != parking_topic:
                out.append(_rewritten(dlq, topic, failed))
                report.requeued.append(entry)
                continue
            reason = f"{outcome.code} after {attempts} replay(s): {outcome.reason}"
            parked = {**failed, PARKED_CODE: ParkCode.STILL_FAILING.value, PARKED_REASON: reason}
            entry.update(code=ParkCode.STILL_FAILING.value, reason=reason)
        else:
            parked = {PARKED_CODE: outcome.code, PARKED_REASON: outcome.reason}
        parked[PARKED_REASON] = parked[PARKED_REASON][:2000]  # as the worker's error.message
        out.append(_rewritten(dlq, parking_topic, {**parked, PARKED_AT: at}))
        report.parked.append(entry)
    return out


# --- the broker -------------------------------------------------------------------------------


class LetterLog(Protocol):
    """One DLQ topic as the replay uses it: `KafkaLetters` on a broker; tests also use an
    in-memory double. Every failure of the broker is a `DeadLetterUnavailableError`."""

    @property
    def topic(self) -> str:
        """The topic read."""
        ...

    def read(self) -> Letters:
        """The letters after the replay group's committed offsets (or all of them)."""
        ...

    def write(self, letters: Sequence[Outgoing]) -> None:
        """Write `letters`; returns once the broker acknowledged every one."""
        ...

    def commit(self, letters: Letters) -> None:
        """Commit the replay group past `letters` (and past the gaps)."""
        ...


class KafkaLetters:
    """A DLQ topic on a Kafka broker: read with a consumer of the replay group (no offset
    jumps silently: `auto.offset.reset=error`, gaps reported), written with an idempotent
    producer (`acks=all`), committed synchronously. Close it (or use it as a context
    manager)."""

    def __init__(
        self,
        kafka: KafkaSettings,
        topic: str,
        group_id: str,
        *,
        from_beginning: bool = False,
        idle_s: float = 3.0,
        limit: int = 100_000,
        high_watermark_slack: int = 0,
        missing_ok: bool = False,
        delivery_timeout_s: float = 30.0,
    ) -> None:
        self._kafka = kafka
        self._topic = topic
        self._group_id = group_id
        self._from_beginning = from_beginning
        self._idle_s = idle_s
        self._limit = limit
        self._slack = high_watermark_slack
        self._missing_ok = missing_ok
        self._delivery_timeout_s = delivery_timeout_s
        self._consumer: Consumer | None = None

    @property
    def topic(self) -> str:
        """The topic read."""
        return self._topic

    def read(self) -> Letters:
        """Every letter after the replay group's committed offsets (or all of them), read until
        nothing arrives for `idle_s` or `limit` letters were read, and the gaps: partitions
        whose committed offset lies outside the log (read from the log start instead;
        `high_watermark_slack` as the worker's consumer setting of that name)."""
        consumer = self._open()
        try:
            starts = self._start_positions(consumer)
        except KafkaException as exc:
            raise DeadLetterUnavailableError(f"reading {self._topic} failed: {exc}") from exc
        if starts is None:
            return Letters([])
        partitions, gaps = starts
        for gap in gaps:
            log.error(
                "dead-lettered records lost to the DLQ's retention before this replay read "
                "them: %s; run `ragstream reconcile --repair` for the entities they named",
                gap.describe(),
            )
        consumer.assign(partitions)
        records: list[RawRecord] = []
        while len(records) < self._limit:
            msg = consumer.poll(self._idle_s)
            if msg is None:
                break
            err = msg.error()
            if err is not None:
                if err.code() == KafkaError._PARTITION_EOF:
                    continue
                raise DeadLetterUnavailableError(f"reading {self._topic} failed: {err}")
            records.append(to_raw(msg))
        more = len(records) >= self._limit
        if more:
            log.warning(
                "read stopped at %d letters: run the replay again for the rest", self._limit
            )
        return Letters(records, gaps, more)

    def write(self, letters: Sequence[Outgoing]) -> None:
        """Produce `letters` and wait for the broker's acknowledgement of every one."""
        if not letters:
            return
        largest = max(len(o.value or b"") + len(o.key or b"") for o in letters)
        producer = Producer(
            {
                **self._kafka.client_config(),
                "enable.idempotence": True,
                "acks": "all",
                "linger.ms": 5,
                "message.max.bytes": max(1_000_000, largest + 100_000),
                "message.timeout.ms": int(self._delivery_timeout_s * 1000),
            }
        )
        failures: list[str] = []

        def delivered(err: KafkaError | None, _msg: Message) -> None:
            if err is not None:
                failures.append(str(err))

        try:
            for out in letters:
                while True:
                    try:
                        producer.produce(
                            out.topic,
                            key=out.key,
                            value=out.value,
                            headers=list(out.headers),
                            on_delivery=delivered,
                        )
                        break
                    except BufferError:  # the local queue is full: let deliveries drain it
                        producer.poll(0.5)
                producer.poll(0)
            remaining = producer.flush(self._delivery_timeout_s + 5)
        except KafkaException as exc:
            raise DeadLetterUnavailableError(f"writing letters failed: {exc}") from exc
        if remaining or failures:
            raise DeadLetterUnavailableError(
                f"{remaining} letter(s) undelivered, {len(failures)} refused: {failures[:3]}"
            )

    def commit(self, letters: Letters) -> None:
        """Commit past the letters read, and at least to the log start of each gap's
        partition (a gap with no letter read after it is not reported again)."""
        last: dict[tuple[str, int], int] = {(g.topic, g.partition): g.low - 1 for g in letters.gaps}
        for rec in letters.records:
            key = (rec.topic, rec.partition)
            last[key] = max(rec.offset, last.get(key, -1))
        if not last:
            return
        offsets = [TopicPartition(t, p, o + 1) for (t, p), o in last.items()]
        try:
            self._open().commit(offsets=offsets, asynchronous=False)
        except KafkaException as exc:
            raise DeadLetterUnavailableError(f"committing {self._topic} failed: {exc}") from exc

    def close(self) -> None:
        """Close the consumer."""
        consumer, self._consumer = self._consumer, None
        if consumer is not None:
            consumer.close()

    def __enter__(self) -> KafkaLetters:
        return self

    def __exit__(
        self,
        _type: type[BaseException] | None,
        _exc: BaseException | None,
        _tb: TracebackType | None,
    ) -> None:
        self.close()

    def _open(self) -> Consumer:
        if self._consumer is None:
            self._consumer = Consumer(
                {
                    **self._kafka.client_config(),
                    "group.id": self._group_id,
                    "enable.auto.commit": False,
                    # Start positions are chosen here; an offset out of range is an error, not
                    # a jump.
                    "auto.offset.reset": "error",
                    "session.timeout.ms": 6000,
                    "heartbeat.interval.ms": 500,
                    "fetch.wait.max.ms": 50,
                }
            )
        return self._consumer

    def _start_positions(
        self, consumer: Consumer
    ) -> tuple[list[TopicPartition], list[OffsetGap]] | None:
        """Where the replay reads each partition: its first retained offset when reading from
        the beginning or when the group never committed; else the committed offset, or the
        log start when that offset lies outside the log (a gap). None: the topic does not
        exist and may not (`missing_ok`)."""
        topic = self._topic
        meta = consumer.list_topics(topic, timeout=10).topics.get(topic)
        if meta is None or meta.error is not None or not meta.partitions:
            if self._missing_ok:
                return None
            raise RagstreamError(f"DLQ topic {topic!r} does not exist")
        partitions = [TopicPartition(topic, p) for p in sorted(meta.partitions)]
        if self._from_beginning:
            return [TopicPartition(topic, p.partition, OFFSET_BEGINNING) for p in partitions], []
        starts: list[TopicPartition] = []
        gaps: list[OffsetGap] = []
        for tp in consumer.committed(partitions, timeout=10):
            if tp.offset < 0:
                starts.append(TopicPartition(topic, tp.partition, OFFSET_BEGINNING))
                continue
            marks = consumer.get_watermark_offsets(
                TopicPartition(topic, tp.partition), timeout=10, cached=False
            )
            if marks is None:
                raise DeadLetterUnavailableError(
                    f"the watermarks of {topic}[{tp.partition}] are unknown"
                )
            gap = offset_gap(topic, tp.partition, tp.offset, *marks, slack=self._slack)
            if gap is not None:
                gaps.append(gap)
            starts.append(
                TopicPartition(topic, tp.partition, tp.offset if gap is None else gap.low)
            )
        return starts, gaps


# --- the commands -----------------------------------------------------------------------------


def replay_dlq(
    letters: LetterLog,
    *,
    parking_topic: str,
    decode: Callable[[RawRecord], ChangeEvent],
    config: PlanConfig,
    handler: Rereader,
    known_tenants: Callable[[], Sequence[str]],
    locate: Locator | None = None,
    reindex_topic: str | None = None,
    max_attempts: int = DEFAULT_MAX_ATTEMPTS,
) -> ReplayReport:
    """`ragstream dlq replay`: read the letters, re-read what they name (`replay_records`),
    write the re-queued and parked ones (`settle`), then commit past everything read. An
    outage anywhere commits nothing (`ReplayReport.outage`)."""
    _check_attempts(max_attempts)
    report = ReplayReport(topic=letters.topic, parking_topic=parking_topic)
    try:
        batch = letters.read()
        report.read, report.lost, report.more = len(batch.records), batch.gaps, batch.more
        outcomes, report.entities = replay_records(
            batch.records,
            decode=decode,
            config=config,
            handler=handler,
            known_tenants=known_tenants,
            locate=locate,
            reindex_topic=reindex_topic,
        )
        out = settle(
            outcomes,
            topic=letters.topic,
            parking_topic=parking_topic,
            max_attempts=max_attempts,
            report=report,
        )
        letters.write(out)
        # past the gaps too: they are reported once, the reconcile repairs what they named
        letters.commit(batch)
    except UnavailableError as exc:
        log.error(
            "%s unavailable, nothing committed (the letters read stay for the next run): %s",
            dependency_of(exc),
            exc,
        )
        return report.unavailable(exc)
    report.committed = True
    _log_settled(report)
    return report


def _log_settled(report: ReplayReport) -> None:
    log.info(
        "dlq replay of %s: %d read, %d replayed, %d re-queued, %d parked",
        report.topic,
        report.read,
        report.replayed,
        len(report.requeued),
        len(report.parked),
    )
    codes = Counter(str(p["code"]) for p in report.parked)
    if codes:
        log.warning(
            "parked in %s: %s (`ragstream dlq list --parked` lists them)",
            report.parking_topic,
            ", ".join(f"{c} {n}" for c, n in sorted(codes.items())),
        )


def describe_letters(
    records: Iterable[RawRecord],
    *,
    decode: Callable[[RawRecord], ChangeEvent],
    config: PlanConfig,
    reindex_topic: str | None = None,
) -> list[dict[str, Any]]:
    """`ragstream dlq list`: each letter's position, key, value size, `ragstream.*` headers
    and what a replay would name (`names`) or why it would park it (`parks`), with the
    current table mappings. Reads only."""
    out: list[dict[str, Any]] = []
    for dlq in records:
        verdict = name_letter(dlq, decode=decode, config=config, reindex_topic=reindex_topic)
        doc: dict[str, Any] = {
            "dlq": where(dlq),
            "key": None if dlq.key is None else dlq.key.decode("utf-8", "replace"),
            "value_bytes": None if dlq.value is None else len(dlq.value),
            "headers": own_headers(dlq),
        }
        if isinstance(verdict, Named):
            doc["names"] = {
                "entity_id": verdict.entity_id,
                "tenants": list(verdict.tenants) or None,
                "from": verdict.found_in,
            }
        else:
            doc["parks"] = {"code": verdict.code.value, "reason": verdict.reason}
        out.append(doc)
    return out


def list_group(topic: str) -> str:
    """A consumer group of its own for one listing (it never commits)."""
    return f"ragstream-dlq-list-{topic}-{uuid.uuid4().hex[:8]}"
