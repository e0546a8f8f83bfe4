"""Request validation: a `RetrieveRequest` proto in, a `ValidatedRequest` or a precise error out.

Pure (no gRPC): the servicer maps `RequestValidationError` to INVALID_ARGUMENT and
`PermissionDeniedError` to PERMISSION_DENIED. Every message starts with the offending field's
path (e.g. `filters.keywords['equipment_id']: ...`) and never echoes the query text.
Nothing but those two errors escapes `validate_request` for any request the wire can carry.
"""

from __future__ import annotations

import math
import re
import uuid
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from enum import StrEnum

from google.protobuf.timestamp_pb2 import Timestamp

from ragcore.errors import RagstreamError
from ragcore.normalize import nfc
from ragcore.store.base import EVENT_DATE, PayloadValue, Range, StoreFilter
from ragcore.store.ids import validate_tenant
from retrieval_api.pipeline_settings import RetrievalConfig
from retrieval_api.ranking import ScoreKind, Thresholds
from schemas.proto.ragstream.retrieval.v1.retrieval_pb2 import RetrieveRequest


class ValidationCode(StrEnum):
    """Sub-codes of INVALID_ARGUMENT (and TENANT_MISMATCH of PERMISSION_DENIED)."""

    EMPTY_QUERY = "EMPTY_QUERY"
    QUERY_TOO_LONG = "QUERY_TOO_LONG"
    CONTROL_CHARACTERS = "CONTROL_CHARACTERS"
    TOP_K_OUT_OF_RANGE = "TOP_K_OUT_OF_RANGE"
    BAD_TENANT = "BAD_TENANT"
    BAD_INDEX_VERSION = "BAD_INDEX_VERSION"
    INDEX_VERSION_ALIAS_REJECTED = "INDEX_VERSION_ALIAS_REJECTED"
    OVERRIDE_OUT_OF_BOUNDS = "OVERRIDE_OUT_OF_BOUNDS"
    CONTEXT_BUDGET_OUT_OF_RANGE = "CONTEXT_BUDGET_OUT_OF_RANGE"
    BAD_REQUEST_ID = "BAD_REQUEST_ID"
    UNKNOWN_FILTER_FIELD = "UNKNOWN_FILTER_FIELD"
    BAD_FILTER_VALUE = "BAD_FILTER_VALUE"
    TOO_MANY_FILTER_VALUES = "TOO_MANY_FILTER_VALUES"
    BAD_TIMESTAMP = "BAD_TIMESTAMP"
    BAD_DATE_RANGE = "BAD_DATE_RANGE"
    TENANT_MISMATCH = "TENANT_MISMATCH"


class RequestValidationError(RagstreamError):
    """A malformed request (gRPC INVALID_ARGUMENT); `code` is a `ValidationCode` value."""

    code = "INVALID_ARGUMENT"

    def __init__(self, field: str, message: str, *, code: ValidationCode) -> None:
        super().__init__(f"{field}: {message}", code=code.value)
        self.field = field


class PermissionDeniedError(RagstreamError):
    """The request asks for data its caller may not see (gRPC PERMISSION_DENIED)."""

    code = ValidationCode.TENANT_MISMATCH.value


@dataclass(frozen=True, slots=True)
class ValidatedRequest:
    """A request that passed validation, normalized; the only form later stages accept."""

    request_id: str
    tenant: str
    query: str  # trimmed, NFC
    index_version: int | None  # None: the tenant's active version
    top_k: int
    candidate_k: int
    store_filter: StoreFilter  # tenant always the caller's
    min_similarity_override: float | None
    max_context_tokens: int | None = None  # None: no context, no token budget

    def thresholds(self, config: RetrievalConfig, kind: ScoreKind) -> Thresholds:
        """The thresholds for `kind` with this request's override applied."""
        return config.thresholds(kind, self.min_similarity_override)


# C0 and C1 controls and DEL (category Cc), except tab, line feed and carriage return.
_CONTROL_RE = re.compile(r"[\x00-\x08\x0b\x0c\x0e-\x1f\x7f-\x9f]")
_REQUEST_ID_RE = re.compile(r"[A-Za-z0-9][A-Za-z0-9._:-]*")
_INDEX_VERSION_RE = re.compile(r"[vV]?([1-9][0-9]{0,8})")
# Names that mean "whatever is newest": a pinned version is what makes results reproducible.
_VERSION_ALIASES = frozenset({"latest", "current", "active", "newest", "head", "stable"})
# Timestamp bounds of google.protobuf.Timestamp: 0001-01-01T00:00:00Z .. 9999-12-31T23:59:59Z.
_TS_MIN_SECONDS = -62_135_596_800
_TS_MAX_SECONDS = 253_402_300_799
_INT64_MIN, _INT64_MAX = -(2**63), 2**63 - 1
_INTEGER_RE = re.compile(r"-?[0-9]{1,19}")
_EPOCH = datetime(1970, 1, 1, tzinfo=UTC)


def _show(value: str, limit: int = 64) -> str:
    """A safe rendering of a client-supplied string for an error message."""
    return repr(value[:limit] + "…" if len(value) > limit else value)


def normalize_query(text: str) -> str:
    """The canonical form of a query: NFC, then trimmed (also what the audit hash covers).
    NFC in linear time (`ragcore.normalize.nfc`): it runs before the length check, on up to
    a whole request's worth of text."""
    return nfc(text).strip()


def _check_controls(field: str, text: str) -> None:
    match = _CONTROL_RE.search(text)
    if match is not None:
        raise RequestValidationError(
            field,
            f"control character U+{ord(match.group()):04X} at offset {match.start()} "
            "(only tab, line feed and carriage return are allowed)",
            code=ValidationCode.CONTROL_CHARACTERS,
        )


def _query(text: str, config: RetrievalConfig) -> str:
    # Checked before trimming: str.strip() would silently eat controls such as U+001F at the ends.
    _check_controls("query_text", text)
    query = normalize_query(text)
    if not query:
        raise RequestValidationError(
            "query_text", "empty after trimming whitespace", code=ValidationCode.EMPTY_QUERY
        )
    if len(query) > config.max_query_chars:
        raise RequestValidationError(
            "query_text",
            f"{len(query)} characters, at most {config.max_query_chars} allowed",
            code=ValidationCode.QUERY_TOO_LONG,
        )
    return query


def _request_id(raw: str, config: RetrievalConfig, new_id: Callable[[], str]) -> str:
    if raw == "":
        return new_id()
    if len(raw) > config.max_request_id_chars or not _REQUEST_ID_RE.fullmatch(raw):
        raise RequestValidationError(
            "request_id",
            f"{_show(raw)} is not 1-{config.max_request_id_chars} characters of "
            "[A-Za-z0-9._:-] starting with a letter or digit",
            code=ValidationCode.BAD_REQUEST_ID,
        )
    return raw


def _tenant(req: RetrieveRequest, caller_tenant: str) -> str:
    if not req.HasField("tenant"):
        return caller_tenant
    if req.tenant == "":
        raise RequestValidationError(
            "tenant",
            "empty; omit the field to use the caller's tenant",
            code=ValidationCode.BAD_TENANT,
        )
    if req.tenant != caller_tenant:
        # The requested name is not echoed: it could be probing for other tenants.
        raise PermissionDeniedError("tenant: the caller may only query its own tenant")
    return caller_tenant


def _index_version(req: RetrieveRequest) -> int | None:
    if not req.HasField("index_version"):
        return None
    raw = req.index_version
    if raw.strip().lower() in _VERSION_ALIASES:
        raise RequestValidationError(
            "index_version",
            f"alias {_show(raw)} rejected: pin a published version (e.g. '3') or omit the field "
            "for the tenant's active version",
            code=ValidationCode.INDEX_VERSION_ALIAS_REJECTED,
        )
    match = _INDEX_VERSION_RE.fullmatch(raw)
    if match is None:
        raise RequestValidationError(
            "index_version",
            f"{_show(raw)} is not a version number such as '3' or 'v3'",
            code=ValidationCode.BAD_INDEX_VERSION,
        )
    return int(match.group(1))


def _top_k(req: RetrieveRequest, config: RetrievalConfig) -> int:
    if not req.HasField("top_k"):
        return config.default_top_k
    if not 1 <= req.top_k <= config.max_top_k:
        raise RequestValidationError(
            "top_k",
            f"{req.top_k} is outside 1..{config.max_top_k}",
            code=ValidationCode.TOP_K_OUT_OF_RANGE,
        )
    return req.top_k


def _override(req: RetrieveRequest, config: RetrievalConfig) -> float | None:
    if not req.HasField("min_similarity_override"):
        return None
    value = req.min_similarity_override
    low, high = config.min_similarity_override_min, config.min_similarity_override_max
    if not (math.isfinite(value) and low <= value <= high):
        raise RequestValidationError(
            "min_similarity_override",
            f"{value!r} is outside the allowed bounds [{low}, {high}]",
            code=ValidationCode.OVERRIDE_OUT_OF_BOUNDS,
        )
    return value


def _context_budget(req: RetrieveRequest, config: RetrievalConfig) -> int | None:
    if not req.HasField("max_context_tokens"):
        return None
    if not 1 <= req.max_context_tokens <= config.max_context_tokens:
        raise RequestValidationError(
            "max_context_tokens",
            f"{req.max_context_tokens} is outside 1..{config.max_context_tokens}",
            code=ValidationCode.CONTEXT_BUDGET_OUT_OF_RANGE,
        )
    return req.max_context_tokens


def _strings(field: str, values: Iterable[str], config: RetrievalConfig) -> tuple[str, ...]:
    items = list(values)
    if len(items) > config.max_filter_values:
        raise RequestValidationError(
            field,
            f"{len(items)} values, at most {config.max_filter_values} allowed",
            code=ValidationCode.TOO_MANY_FILTER_VALUES,
        )
    for i, value in enumerate(items):
        where = f"{field}[{i}]"
        if value == "" or len(value) > config.max_filter_value_chars:
            raise RequestValidationError(
                where,
                f"must be 1-{config.max_filter_value_chars} characters",
                code=ValidationCode.BAD_FILTER_VALUE,
            )
        _check_controls(where, value)
    # Order and repeats do not change a filter's meaning; sorted keeps packs and audits stable.
    return tuple(sorted(set(items)))


def _typed(field: str, values: tuple[str, ...], kind: str) -> tuple[PayloadValue, ...]:
    """Values parsed as the payload stores them: a keyword index matches type-exactly."""
    if kind == "integer":
        ints: set[int] = set()
        for value in values:
            if not (_INTEGER_RE.fullmatch(value) and _INT64_MIN <= int(value) <= _INT64_MAX):
                raise RequestValidationError(
                    field,
                    f"{_show(value)} is not a 64-bit integer",
                    code=ValidationCode.BAD_FILTER_VALUE,
                )
            ints.add(int(value))
        return tuple(sorted(ints))
    if kind == "bool":
        bools: set[bool] = set()
        for value in values:
            if value.lower() not in ("true", "false"):
                raise RequestValidationError(
                    field,
                    f"{_show(value)} is not 'true' or 'false'",
                    code=ValidationCode.BAD_FILTER_VALUE,
                )
            bools.add(value.lower() == "true")
        return tuple(sorted(bools))
    return values


def _keywords(req: RetrieveRequest, config: RetrievalConfig) -> dict[str, tuple[PayloadValue, ...]]:
    keywords: dict[str, tuple[PayloadValue, ...]] = {}
    for name in sorted(req.filters.keywords):
        kind = config.keyword_filter_fields.get(name)
        if kind is None:
            allowed = ", ".join(sorted(config.keyword_filter_fields)) or "none configured"
            raise RequestValidationError(
                "filters.keywords",
                f"unknown filter field {_show(name)} (allowed: {allowed})",
                code=ValidationCode.UNKNOWN_FILTER_FIELD,
            )
        field = f"filters.keywords[{name!r}]"
        values = _strings(field, req.filters.keywords[name].values, config)
        if not values:
            raise RequestValidationError(
                field, "needs at least one value", code=ValidationCode.BAD_FILTER_VALUE
            )
        keywords[name] = _typed(field, values, kind)
    return keywords


def _timestamp(field: str, ts: Timestamp) -> datetime:
    if not (_TS_MIN_SECONDS <= ts.seconds <= _TS_MAX_SECONDS and 0 <= ts.nanos <= 999_999_999):
        raise RequestValidationError(
            field,
            f"seconds={ts.seconds}, nanos={ts.nanos} is not a valid timestamp "
            "(0001-01-01..9999-12-31, nanos 0..999999999)",
            code=ValidationCode.BAD_TIMESTAMP,
        )
    # Microseconds: the precision of datetime and of the stored RFC 3339 event dates.
    return _EPOCH + timedelta(seconds=ts.seconds, microseconds=ts.nanos // 1000)


def _date_range(req: RetrieveRequest) -> Range | None:
    filters = req.filters
    start = (
        _timestamp("filters.event_date_start", filters.event_date_start)
        if filters.HasField("event_date_start")
        else None
    )
    end = (
        _timestamp("filters.event_date_end", filters.event_date_end)
        if filters.HasField("event_date_end")
        else None
    )
    if start is not None and end is not None and start > end:
        raise RequestValidationError(
            "filters.event_date_start",
            f"{start.isoformat()} is after filters.event_date_end {end.isoformat()}",
            code=ValidationCode.BAD_DATE_RANGE,
        )
    if start is None and end is None:
        return None
    return Range(gte=start, lte=end)


def _store_filter(req: RetrieveRequest, tenant: str, config: RetrievalConfig) -> StoreFilter:
    date_range = _date_range(req)
    return StoreFilter(
        tenant_id=tenant,
        entity_types=_strings("filters.entity_types", req.filters.entity_types, config),
        entity_ids=_strings("filters.entity_ids", req.filters.entity_ids, config),
        keywords=_keywords(req, config),
        ranges={EVENT_DATE: date_range} if date_range is not None else {},
    )


def _uuid4() -> str:
    return str(uuid.uuid4())


def validate_request(
    req: RetrieveRequest,
    config: RetrievalConfig,
    caller_tenant: str,
    *,
    new_request_id: Callable[[], str] = _uuid4,
) -> ValidatedRequest:
    """Validate and normalize a request for `caller_tenant` (the tenant of its credentials).

    Raises RequestValidationError (INVALID_ARGUMENT, `code` a ValidationCode) or
    PermissionDeniedError (another tenant). `caller_tenant` comes from the server's own
    configuration: an unsafe name raises InvalidTenantError, a server-side fault.
    """
    validate_tenant(caller_tenant)
    tenant = _tenant(req, caller_tenant)
    request_id = _request_id(req.request_id, config, new_request_id)
    query = _query(req.query_text, config)
    top_k = _top_k(req, config)
    return ValidatedRequest(
        request_id=request_id,
        tenant=tenant,
        query=query,
        index_version=_index_version(req),
        top_k=top_k,
        candidate_k=config.candidate_k(top_k),
        store_filter=_store_filter(req, tenant, config),
        min_similarity_override=_override(req, config),
        max_context_tokens=_context_budget(req, config),
    )


def request_id_or_new(raw: str, config: RetrievalConfig) -> str:
    """The request's id when it is well-formed, else a fresh one (for packs of failed requests)."""
    try:
        return _request_id(raw, config, _uuid4)
    except RequestValidationError:
        return _uuid4()
