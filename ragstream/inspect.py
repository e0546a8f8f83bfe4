"""`ragstream inspect-event`: what ingest would do with one Kafka record, as JSON.

Reads either a JSON object `{"topic", "partition", "offset", "key", "value", "headers"}` (key and
value may be JSON objects, strings holding JSON, or null; headers a list of [name, value] pairs
or an object) or separate key and value files. A record taken from the DLQ keeps its
`ragstream.source.*` headers; they name the original topic, partition and offset.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from ragcore.errors import RagstreamError
from ragcore.plan import Action, PlanConfig, plan_event
from ragcore.prepare import Preparer
from schemas.events import RawRecord
from streams.consumer import DLQ_HEADER_PREFIX
from streams.decode import DecodeOptions, decode_record


def _as_bytes(value: Any) -> bytes | None:
    if value is None:
        return None
    if isinstance(value, str):
        return value.encode()
    return json.dumps(value).encode()


def _headers(value: Any) -> tuple[tuple[str, bytes | None], ...]:
    if value is None:
        return ()
    pairs = value.items() if isinstance(value, Mapping) else value
    out: list[tuple[str, bytes | None]] = []
    for pair in pairs:
        name, raw = pair
        out.append((str(name), _as_bytes(raw)))
    return tuple(out)


def record_from_json(doc: Mapping[str, Any], default_topic: str) -> RawRecord:
    """Build a RawRecord from the JSON form described in the module docstring."""
    headers = _headers(doc.get("headers"))
    found = {k: v.decode() for k, v in headers if k.startswith(DLQ_HEADER_PREFIX) and v}
    topic = doc.get("topic") or found.get(DLQ_HEADER_PREFIX + "source.topic") or default_topic
    partition = doc.get("partition", found.get(DLQ_HEADER_PREFIX + "source.partition", 0))
    offset = doc.get("offset", found.get(DLQ_HEADER_PREFIX + "source.offset", 0))
    return RawRecord(
        topic=str(topic),
        partition=int(partition),
        offset=int(offset),
        key=_as_bytes(doc.get("key")),
        value=_as_bytes(doc.get("value")),
        headers=headers,
    )


def read_record(
    path: Path | None, key_path: Path | None, value_path: Path | None, topic: str
) -> RawRecord:
    """The record named on the command line."""
    if path is not None:
        doc = json.loads(path.read_text())
        if not isinstance(doc, dict):
            raise RagstreamError(f"{path}: expected a JSON object with key/value/headers")
        return record_from_json(doc, topic)
    key = key_path.read_bytes().strip() if key_path is not None else None
    value = value_path.read_bytes().strip() if value_path is not None else None
    return RawRecord(topic=topic, partition=0, offset=0, key=key or None, value=value or None)


def inspect_record(
    raw: RawRecord,
    *,
    preparer: Preparer,
    plan_config: PlanConfig | None = None,
    decode_options: DecodeOptions | None = None,
) -> dict[str, Any]:
    """Decode, plan and (for upserts) chunk one record; never raises for bad input."""
    report: dict[str, Any] = {
        "topic": raw.topic,
        "partition": raw.partition,
        "offset": raw.offset,
    }
    try:
        event = decode_record(raw, decode_options)
        report.update({"kind": event.kind.value, "op": event.op.value if event.op else None})
        plan = plan_event(event, plan_config or PlanConfig(), preparer.content_hash)
    except RagstreamError as exc:
        report.update(
            {"action": Action.DLQ.value, "reason": exc.code, "detail": str(exc), "chunk_ids": []}
        )
        return report
    report.update(
        {
            "tenant": plan.tenant_id,
            "entity_id": plan.entity_id,
            "action": plan.action.value,
            "reason": plan.reason,
            "detail": plan.detail,
            "previous_tenant": plan.previous_tenant_id,
            "version": plan.version.model_dump() if plan.version else None,
            "source_ts_ms": plan.source_ts_ms,
        }
    )
    if event.unavailable_columns:
        report["unavailable_columns"] = sorted(event.unavailable_columns)
    if plan.entity is not None:
        try:
            chunks = preparer.chunks(plan.entity)
        except RagstreamError as exc:
            report.update({"action": Action.DLQ.value, "reason": exc.code, "detail": str(exc)})
            chunks = []
        report.update(
            {
                "entity_type": plan.entity.entity_type,
                "content_format": plan.entity.content_format.value,
                "content_hash": plan.entity.content_hash,
                "embedding_model": preparer.spec.model_version,
                "chunk_budget_tokens": preparer.budget,
                "chunk_ids": [c.chunk_id for c in chunks],
                "chunk_tokens": [c.token_count for c in chunks],
            }
        )
    else:
        report["chunk_ids"] = []
    return report
