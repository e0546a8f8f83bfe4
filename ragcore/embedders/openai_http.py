"""OpenAI-compatible HTTP embedder (OpenAI, vLLM, TEI, Ollama `/v1/embeddings`) on the `openai` SDK.

Retries are ours, not the SDK's (`max_retries=0`): 5xx, 408, timeouts and connection errors are
retried with capped exponential backoff and jitter (at least a 5xx's Retry-After; one longer
than `backoff_max_s` is handed to the caller at once); HTTP 429 is *not* retried here but raised at
once as `EmbeddingUnavailableError(retry_after=...)`, because backpressure belongs to the caller
(the ingest worker pauses its partitions instead of blocking a poll loop in sleeps).

The API key never leaves the SDK client: it is a `SecretStr` in the config, read from a file at
construction when configured that way, masked in every repr, and scrubbed from error messages.
"""

from __future__ import annotations

import base64
import logging
import random
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any, Literal
from urllib.parse import urlsplit

import numpy as np
import openai
from pydantic import BaseModel, ConfigDict, Field, SecretStr, model_validator

from ragcore.embedders.base import Vectors, empty_vectors, finalize, with_prefix
from ragcore.embedders.spec import EmbeddingSpec
from ragcore.errors import (
    EmbeddingDimensionError,
    EmbeddingError,
    EmbeddingUnavailableError,
)
from ragcore.http_common import (
    equal_jitter_backoff,
    parse_retry_after,
    resolve_api_key,
    scrub,
)

__all__ = ["MAX_BATCH_SIZE", "OpenAIEmbedder", "OpenAIEmbedderConfig"]

log = logging.getLogger(__name__)

#: Largest batch we send in one request (OpenAI accepts 2048 inputs, many self-hosted servers
#: far fewer; small batches also bound the work lost to one failed request).
MAX_BATCH_SIZE = 100

# Sent when no key is configured: the SDK insists on one, and keyless vLLM/TEI/Ollama servers
# ignore it ("EMPTY" is vLLM's documented convention).
_NO_KEY = "EMPTY"
_MAX_SERVER_MESSAGE = 500


class OpenAIEmbedderConfig(BaseModel):
    """Settings of an OpenAI-compatible embeddings endpoint."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    kind: Literal["openai"] = "openai"
    base_url: str = Field(description="API root including /v1, e.g. http://tei:8080/v1.")
    model: str = Field(min_length=1, description="Model name sent in each request.")
    api_key: SecretStr | None = Field(default=None, description="The key itself (masked).")
    api_key_file: Path | None = Field(
        default=None, description="File holding the key (e.g. a mounted secret), read at start."
    )
    dimension: int = Field(gt=0, description="Vector size the endpoint must return.")
    send_dimensions: bool = Field(
        default=False,
        description="Send `dimensions` in requests (OpenAI text-embedding-3 only).",
    )
    max_input_tokens: int = Field(default=8191, gt=0)
    special_tokens: int = Field(default=0, ge=0)
    tokenizer: str = Field(
        default="tiktoken:cl100k_base", description="Token counter for chunking (spec.tokenizer)."
    )
    version: str = Field(
        default="api",
        min_length=1,
        description="Label of the served weights; part of model_version in index manifests.",
    )
    query_prefix: str = ""
    document_prefix: str = ""
    batch_size: int = Field(default=64, ge=1, le=MAX_BATCH_SIZE)
    timeout_s: float = Field(default=30.0, gt=0)
    max_retries: int = Field(default=4, ge=0, description="Retries after the first attempt.")
    backoff_base_s: float = Field(default=0.5, gt=0)
    backoff_max_s: float = Field(default=20.0, gt=0)

    @model_validator(mode="after")
    def _check(self) -> OpenAIEmbedderConfig:
        if self.api_key is not None and self.api_key_file is not None:
            raise ValueError("set api_key or api_key_file, not both")
        if self.backoff_max_s < self.backoff_base_s:
            raise ValueError("backoff_max_s must be >= backoff_base_s")
        parts = urlsplit(self.base_url)
        if parts.scheme not in ("http", "https") or not parts.hostname:
            raise ValueError("base_url must be an absolute http(s) URL")
        if "@" in parts.netloc:
            # The HTTP client would turn user:password@ into Basic auth that replaces the
            # bearer key, and the URL would carry a secret into logs.
            raise ValueError("base_url must not contain credentials: use api_key/api_key_file")
        return self

    @property
    def spec(self) -> EmbeddingSpec:
        """The embedding contract this endpoint promises."""
        return EmbeddingSpec(
            name=self.model,
            version=self.version,
            dimension=self.dimension,
            max_input_tokens=self.max_input_tokens,
            special_tokens=self.special_tokens,
            tokenizer=self.tokenizer,
            query_prefix=self.query_prefix,
            document_prefix=self.document_prefix,
        )

    def resolve_api_key(self) -> str | None:
        """The key from `api_key` or `api_key_file` (stripped), or None when neither is set."""
        return resolve_api_key(self.api_key, self.api_key_file)


class OpenAIEmbedder:
    """`Embedder` over an OpenAI-compatible `/embeddings` endpoint.

    `sleep` and `rand` (uniform in [0, 1)) are injectable so tests run without waiting.
    Safe to share between threads (the SDK client is).
    """

    def __init__(
        self,
        config: OpenAIEmbedderConfig,
        *,
        sleep: Callable[[float], None] = time.sleep,
        rand: Callable[[], float] = random.random,
    ) -> None:
        self._config = config
        self._spec = config.spec
        self._sleep = sleep
        self._rand = rand
        key = config.resolve_api_key()
        # Kept only to scrub it from server messages; never logged or shown.
        self._secret = key
        self._client = openai.OpenAI(
            base_url=config.base_url,
            api_key=key or _NO_KEY,
            timeout=config.timeout_s,
            max_retries=0,
        )
        self._closed = False

    @property
    def spec(self) -> EmbeddingSpec:
        """The contract built from the config (name = served model, version = label)."""
        return self._spec

    @property
    def config(self) -> OpenAIEmbedderConfig:
        """The configuration this embedder was built from (the key stays masked)."""
        return self._config

    def __repr__(self) -> str:
        return (
            f"OpenAIEmbedder(base_url={self._config.base_url!r}, "
            f"model_version={self._spec.model_version!r}, dimension={self._spec.dimension})"
        )

    __str__ = __repr__

    def embed_documents(self, texts: Sequence[str]) -> Vectors:
        """Vectors for `texts` (document prefix applied), in batches of `batch_size`."""
        return self._embed(with_prefix(self._spec.document_prefix, texts))

    def embed_query(self, text: str) -> Vectors:
        """The vector of one query (query prefix applied), shape (dimension,)."""
        return self._embed(with_prefix(self._spec.query_prefix, [text])).reshape(
            self._spec.dimension
        )

    def embed_queries(self, texts: Sequence[str]) -> Vectors:
        """The vectors of `texts` as queries (query prefix applied), in requests of
        `batch_size` inputs: the API embeds each input of a request on its own, so each is
        `embed_query`'s vector (the calibration's ~1,000 practice queries per index were as many
        requests)."""
        return self._embed(with_prefix(self._spec.query_prefix, texts))

    def check(self) -> None:
        """Embed one short text: proves reachability, the key, the model and the dimension."""
        self._embed(["ragstream health check"])

    def close(self) -> None:
        """Close the HTTP connection pool. Idempotent."""
        if not self._closed:
            self._closed = True
            self._client.close()

    # --- internals -----------------------------------------------------------------------

    def _embed(self, texts: list[str]) -> Vectors:
        if self._closed:
            raise EmbeddingError(f"{self._spec.model_version}: embedder is closed")
        if not texts:
            return empty_vectors(self._spec)
        size = self._config.batch_size
        parts = [self._embed_batch(texts[i : i + size]) for i in range(0, len(texts), size)]
        return finalize(np.concatenate(parts), self._spec, len(texts))

    def _embed_batch(self, batch: list[str]) -> Vectors:
        attempts = self._config.max_retries + 1
        hint: float | None = None  # a 5xx's Retry-After: the least we wait before retrying
        for attempt in range(attempts):
            hint = None
            try:
                response = self._client.embeddings.create(
                    model=self._config.model,
                    input=batch,
                    encoding_format="float",
                    dimensions=(
                        self._spec.dimension if self._config.send_dimensions else openai.omit
                    ),
                )
            except openai.RateLimitError as exc:
                retry_after = parse_retry_after(exc.response.headers)
                raise EmbeddingUnavailableError(
                    f"{self._spec.model_version}: rate limited (HTTP 429)"
                    + (f", retry after {retry_after:g}s" if retry_after is not None else ""),
                    retry_after=retry_after,
                ) from None
            except openai.APIStatusError as exc:
                if exc.status_code < 500 and exc.status_code != 408:
                    # `from None`: the SDK exception carries the raw body, which we have scrubbed.
                    raise EmbeddingError(self._status_message(exc)) from None
                reason = f"HTTP {exc.status_code}"
                hint = parse_retry_after(exc.response.headers)
                if hint is not None and hint > self._config.backoff_max_s:
                    # Longer than we would ever sleep here: hand the wait to the caller.
                    raise EmbeddingUnavailableError(
                        f"{self._spec.model_version}: {reason}, retry after {hint:g}s",
                        retry_after=hint,
                    ) from None
            except openai.APITimeoutError:
                reason = f"timeout after {self._config.timeout_s:g}s"
            except openai.APIConnectionError as exc:
                reason = f"connection error: {type(exc.__cause__ or exc).__name__}"
            except openai.APIResponseValidationError as exc:
                raise EmbeddingError(
                    f"{self._spec.model_version}: malformed response: {self._scrub(str(exc))}"
                ) from None
            else:
                return self._vectors(response, len(batch))
            if attempt + 1 < attempts:
                delay = max(self._backoff(attempt), hint or 0.0)
                log.warning(
                    "%s: %s (attempt %d/%d), retrying in %.2fs",
                    self._spec.model_version,
                    reason,
                    attempt + 1,
                    attempts,
                    delay,
                )
                self._sleep(delay)
        raise EmbeddingUnavailableError(
            f"{self._spec.model_version}: {reason} after {attempts} attempts", retry_after=hint
        )

    def _backoff(self, attempt: int) -> float:
        c = self._config
        return equal_jitter_backoff(attempt, c.backoff_base_s, c.backoff_max_s, self._rand)

    def _status_message(self, exc: openai.APIStatusError) -> str:
        body: Any = exc.body
        message: Any = body.get("message") if isinstance(body, dict) else body
        if message is None or message == "":
            message = exc.response.text
        text = self._scrub(str(message))[:_MAX_SERVER_MESSAGE]
        return (
            f"{self._spec.model_version}: embedding request rejected "
            f"(HTTP {exc.status_code}): {text}"
        )

    def _scrub(self, text: str) -> str:
        return scrub(text, self._secret)

    def _vectors(self, response: Any, count: int) -> Vectors:
        data = list(getattr(response, "data", None) or [])
        if len(data) != count:
            raise EmbeddingError(
                f"{self._spec.model_version}: endpoint returned {len(data)} embeddings "
                f"for {count} inputs"
            )
        # Servers may answer out of order: `index` says which input each vector belongs to.
        raw_indexes = [getattr(item, "index", None) for item in data]
        indexes = [i for i in raw_indexes if type(i) is int]
        if sorted(indexes) != list(range(count)):
            raise EmbeddingError(
                f"{self._spec.model_version}: response indexes {raw_indexes[:10]} "
                f"are not a permutation of 0..{count - 1}"
            )
        rows: list[Vectors | None] = [None] * count
        for item in data:
            rows[item.index] = self._decode(getattr(item, "embedding", None))
        for i, row in enumerate(rows):
            if row is None or row.ndim != 1 or row.shape[0] != self._spec.dimension:
                width = None if row is None else row.shape
                raise EmbeddingDimensionError(
                    f"{self._spec.model_version}: embedding {i} has shape {width}, "
                    f"expected ({self._spec.dimension},)"
                )
        return np.stack([row for row in rows if row is not None])

    def _decode(self, embedding: Any) -> Vectors:
        if isinstance(embedding, str):
            # Servers that ignore encoding_format=float answer in the API's base64 format:
            # little-endian float32.
            try:
                raw = base64.b64decode(embedding, validate=True)
            except ValueError as exc:
                raise EmbeddingError(f"{self._spec.model_version}: bad base64 embedding") from exc
            if len(raw) % 4:
                raise EmbeddingError(f"{self._spec.model_version}: base64 embedding not float32")
            return np.frombuffer(raw, dtype="<f4").astype(np.float32)
        try:
            return np.asarray(embedding, dtype=np.float32)
        except (TypeError, ValueError) as exc:
            raise EmbeddingError(
                f"{self._spec.model_version}: embedding is not a list of numbers"
            ) from exc
