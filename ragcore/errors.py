"""The one exception root of ragstream and its typed subclasses.

Adapters translate vendor exceptions (confluent-kafka, qdrant, openai, psycopg, grpc) into these
at the boundary, so callers decide on a stable `code` rather than on a vendor's class.
"""

from __future__ import annotations


class RagstreamError(Exception):
    """Root of every error ragstream raises on purpose.

    `code` is a stable, machine-readable name (it travels to DLQ headers, evidence packs and
    metrics labels); the message is for people.
    """

    code: str = "INTERNAL"

    def __init__(self, message: str, *, code: str | None = None) -> None:
        super().__init__(message)
        if code is not None:
            self.code = code

    @property
    def message(self) -> str:
        """The human-readable reason."""
        return str(self)


class UnavailableError(RagstreamError):
    """A dependency is overloaded or unreachable; retry later (backpressure). Each dependency
    has its own subclass and code; `retry_after` is the dependency's hint in seconds, if any."""

    code = "UNAVAILABLE"

    def __init__(self, message: str, *, retry_after: float | None = None) -> None:
        super().__init__(message)
        self.retry_after = retry_after


class ConfigError(RagstreamError):
    """Settings are missing or inconsistent."""

    code = "CONFIG_ERROR"


# --- change events ---------------------------------------------------------------------------


class DecodeError(RagstreamError):
    """A Kafka record is not a change event we can read (bad JSON, bad envelope, bad field)."""

    code = "DECODE_ERROR"


class LogicalTypeError(DecodeError):
    """A Debezium logical type value cannot be represented (e.g. year 21016, malformed base64)."""

    code = "LOGICAL_TYPE_ERROR"


class UnsupportedOperationError(DecodeError):
    """The event's `op` is not one ragstream knows."""

    code = "UNSUPPORTED_OP"


class MappingError(RagstreamError):
    """A decoded row cannot be mapped to an entity (no tenant, no id, TOAST-only content...).

    `column` names the column at fault when one is (it travels to the DLQ headers)."""

    code = "MAPPING_ERROR"

    def __init__(self, message: str, *, code: str | None = None, column: str | None = None) -> None:
        super().__init__(message, code=code)
        self.column = column


class DocumentError(MappingError):
    """A document (PDF, DOCX, spreadsheet) cannot be indexed; `code` says why
    (`ragcore.documents.REASONS`). A record carrying it goes to the DLQ under that code."""

    code = "DOCUMENT_CORRUPT"

    def __init__(self, code: str, message: str, *, column: str | None = None) -> None:
        super().__init__(message, code=code, column=column)


class SchemaDriftError(MappingError):
    """A change event lacks a column the table mapping reads: the column was renamed or dropped
    in the SoR (or the mapping names a column the table never had). The event is never indexed
    as if the column were empty."""

    code = "SCHEMA_DRIFT"

    def __init__(self, message: str, *, table: str, columns: tuple[str, ...]) -> None:
        super().__init__(message, column=",".join(columns))
        self.table = table
        self.columns = columns


class RecordTooLargeError(RagstreamError):
    """A record or its content exceeds the configured size limit."""

    code = "RECORD_TOO_LARGE"


class ChunkingError(RagstreamError):
    """Text could not be chunked within the model's token budget."""

    code = "CHUNKING_ERROR"


# --- embeddings ------------------------------------------------------------------------------


class EmbeddingError(RagstreamError):
    """The embedder failed for a reason retrying will not fix."""

    code = "EMBEDDING_FAILED"


class EmbeddingUnavailableError(EmbeddingError, UnavailableError):
    """The embedder is overloaded or unreachable; retry later (backpressure)."""

    code = "EMBEDDING_UNAVAILABLE"


class EmbeddingDimensionError(EmbeddingError):
    """The embedder returned vectors of a dimension other than its spec says."""

    code = "EMBEDDING_DIMENSION_MISMATCH"


# --- storage ---------------------------------------------------------------------------------


class StoreError(RagstreamError):
    """The vector store rejected an operation."""

    code = "STORE_ERROR"


class StoreUnavailableError(StoreError, UnavailableError):
    """The vector store is unreachable or overloaded; retry later (backpressure)."""

    code = "STORE_UNAVAILABLE"


class IndexNotFoundError(StoreError):
    """The tenant has no such index version (or no active one)."""

    code = "INDEX_NOT_FOUND"


class ManifestMismatchError(StoreError):
    """An index version was built with another embedder than the one in use."""

    code = "MANIFEST_MISMATCH"


# --- system of record ------------------------------------------------------------------------


class SorUnavailableError(UnavailableError):
    """The system of record cannot be reached or refused the query (retryable)."""

    code = "SOR_UNAVAILABLE"


class SorTableError(RagstreamError):
    """One SoR table cannot be read (missing table or column, no privilege): a configuration
    problem of that table, not an outage."""

    code = "SOR_TABLE_UNREADABLE"


class SorRowError(MappingError):
    """One SoR row was read but cannot be judged: its content raised while it was mapped to an
    entity or a verdict (metadata that is not a JSON object, JSON nested too deep, a referenced
    document that cannot be read, a bad timestamp, ...). The row's fault, never the caller's:
    Retrieve excludes its hits, a re-read dead-letters that entity, a scan reports it and goes
    on. An unreadable row is not a missing one: nothing deletes an entity because of it.

    `entity_id` is None only when the row's key cannot form one; `column` names the column at
    fault when it is known; `reason` is the cause's code (a ragstream error's `code`, else the
    exception's type name)."""

    code = "SOR_ROW_UNREADABLE"

    def __init__(
        self,
        message: str,
        *,
        table: str,
        entity_id: str | None,
        reason: str,
        column: str | None = None,
    ) -> None:
        super().__init__(message)
        self.table = table
        self.entity_id = entity_id
        self.reason = reason
        self.column = column


# --- Kafka -----------------------------------------------------------------------------------


class DeadLetterUnavailableError(UnavailableError):
    """Records bound for the DLQ topic were not acknowledged by the broker (retryable)."""

    code = "DLQ_UNAVAILABLE"


class InvalidTenantError(RagstreamError):
    """A tenant name that could escape its namespace (path, alias or collection injection)."""

    code = "INVALID_TENANT"
