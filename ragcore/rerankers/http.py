"""HTTP reranker: a TEI-compatible or Cohere-compatible rerank endpoint, on `httpx`.

- `api="tei"`: `POST {base_url}/rerank` with `{"query", "texts", "raw_scores": false,
  "truncate"}`, answering `[{"index": i, "score": s}, ...]` (text-embeddings-inference, and
  servers copying its API).
- `api="cohere"`: `POST {base_url}/v1/rerank` with `{"model", "query", "documents", "top_n"}`,
  answering `{"results": [{"index": i, "relevance_score": s}, ...]}` (Cohere, and the many
  servers copying its API).

Both answer sorted by score, not by input: scores are mapped back to the passages by `index`,
which must be a permutation of the inputs. Passages are sent in batches of `batch_size` (TEI
refuses more than `--max-client-batch-size`, 32 by default); a cross-encoder scores each pair
on its own, so batches do not change scores.

Scores must be relevance probabilities in [0, 1] (the thresholds in `rerank_thresholds` are).
An endpoint that answers logits must be configured with `scores_are_logits`, which applies the
sigmoid to every score; otherwise a score outside [0, 1] is a `RerankError`, never clipped.

Retries follow the embedders' HTTP adapter: 5xx, 408, timeouts and connection errors are
retried with capped exponential backoff and jitter (at least a 5xx's Retry-After); HTTP 429 is
raised at once as `RerankUnavailableError(retry_after=...)`. The defaults are short: a rerank sits
on the Retrieve request path, under the caller's deadline.

The API key is a `SecretStr` (or a file read at construction), sent as a bearer token, masked in
every repr and scrubbed from error messages.
"""

from __future__ import annotations

import json
import logging
import math
import random
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any, Literal
from urllib.parse import urlsplit

import httpx
from pydantic import BaseModel, ConfigDict, Field, SecretStr, model_validator

from ragcore.http_common import (
    equal_jitter_backoff,
    parse_retry_after,
    resolve_api_key,
    scrub,
)
from ragcore.rerankers import RerankError, RerankUnavailableError

__all__ = ["HttpReranker", "HttpRerankerConfig", "sigmoid"]

log = logging.getLogger(__name__)

_MAX_SERVER_MESSAGE = 500
_PATHS = {"tei": "/rerank", "cohere": "/v1/rerank"}


def sigmoid(x: float) -> float:
    """The logistic function, without overflow for large |x|."""
    if x >= 0:
        return 1.0 / (1.0 + math.exp(-x))
    z = math.exp(x)
    return z / (1.0 + z)


class HttpRerankerConfig(BaseModel):
    """Settings of a TEI- or Cohere-compatible rerank endpoint."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    kind: Literal["http"] = "http"
    api: Literal["tei", "cohere"] = Field(
        default="tei", description="Request/response format: TEI /rerank or Cohere /v1/rerank."
    )
    base_url: str = Field(
        description="Server root without the API path, e.g. http://tei:8080 or "
        "https://api.cohere.com (the adapter appends /rerank or /v1/rerank)."
    )
    model: str | None = Field(
        default=None, min_length=1, description="Model name sent in each request (cohere only)."
    )
    api_key: SecretStr | None = Field(default=None, description="The key itself (masked).")
    api_key_file: Path | None = Field(
        default=None, description="File holding the key (e.g. a mounted secret), read at start."
    )
    scores_are_logits: bool = Field(
        default=False,
        description="The endpoint answers logits: apply the sigmoid to every score. Otherwise "
        "a score outside [0, 1] is an error.",
    )
    truncate: bool = Field(
        default=True,
        description="TEI only: let the server truncate pairs longer than the model accepts "
        "(TEI rejects them otherwise).",
    )
    batch_size: int = Field(default=32, ge=1, le=1000, description="Passages per request.")
    trust_env: bool = Field(
        default=False,
        description="Honour HTTP(S)_PROXY / NO_PROXY / SSL_CERT_FILE from the environment.",
    )
    timeout_s: float = Field(default=5.0, gt=0)
    max_retries: int = Field(default=2, ge=0, description="Retries after the first attempt.")
    backoff_base_s: float = Field(default=0.1, gt=0)
    backoff_max_s: float = Field(default=2.0, gt=0)

    @model_validator(mode="after")
    def _check(self) -> HttpRerankerConfig:
        if self.api_key is not None and self.api_key_file is not None:
            raise ValueError("set api_key or api_key_file, not both")
        if self.backoff_max_s < self.backoff_base_s:
            raise ValueError("backoff_max_s must be >= backoff_base_s")
        if self.api == "cohere" and self.model is None:
            raise ValueError("api 'cohere' needs `model`")
        parts = urlsplit(self.base_url)
        if parts.scheme not in ("http", "https") or not parts.hostname:
            raise ValueError("base_url must be an absolute http(s) URL")
        if "@" in parts.netloc:
            raise ValueError("base_url must not contain credentials: use api_key/api_key_file")
        if parts.query or parts.fragment:
            raise ValueError("base_url must not have a query or fragment")
        return self

    @property
    def url(self) -> str:
        """The endpoint requests are posted to."""
        return self.base_url.rstrip("/") + _PATHS[self.api]

    def resolve_api_key(self) -> str | None:
        """The key from `api_key` or `api_key_file` (stripped), or None when neither is set."""
        return resolve_api_key(self.api_key, self.api_key_file)


class HttpReranker:
    """`Reranker` over a rerank endpoint; see the module docstring.

    `sleep` and `rand` (uniform in [0, 1)) are injectable so tests run without waiting;
    `transport` lets tests substitute an httpx transport. Safe to share between threads.
    """

    def __init__(
        self,
        config: HttpRerankerConfig,
        *,
        sleep: Callable[[float], None] = time.sleep,
        rand: Callable[[], float] = random.random,
        transport: httpx.BaseTransport | None = None,
    ) -> None:
        self._config = config
        self._sleep = sleep
        self._rand = rand
        key = config.resolve_api_key()
        # Kept only to scrub it from server messages; never logged or shown.
        self._secret = key
        headers = {"Accept": "application/json"}
        if key:
            headers["Authorization"] = f"Bearer {key}"
        self._client = httpx.Client(
            headers=headers,
            timeout=config.timeout_s,
            transport=transport,
            follow_redirects=False,
            trust_env=config.trust_env,
        )
        self._label = f"reranker {config.api} {config.url}"
        self._closed = False

    @property
    def config(self) -> HttpRerankerConfig:
        """The configuration this reranker was built from (the key stays masked)."""
        return self._config

    def __repr__(self) -> str:
        return (
            f"HttpReranker(api={self._config.api!r}, url={self._config.url!r}, "
            f"model={self._config.model!r})"
        )

    __str__ = __repr__

    def score(self, query: str, passages: Sequence[str]) -> list[float]:
        """One relevance probability in [0, 1] per passage, in input order."""
        if self._closed:
            raise RerankError(f"{self._label}: reranker is closed")
        texts = list(passages)
        size = self._config.batch_size
        out: list[float] = []
        for start in range(0, len(texts), size):
            out.extend(self._score_batch(query, texts[start : start + size]))
        return out

    def check(self) -> None:
        """Score one pair: proves reachability, the key and the answer format."""
        self.score("ragstream health check", ["health check"])

    def close(self) -> None:
        """Close the HTTP connection pool. Idempotent."""
        if not self._closed:
            self._closed = True
            self._client.close()

    # --- internals -----------------------------------------------------------------------

    def _body(self, query: str, texts: list[str]) -> dict[str, Any]:
        if self._config.api == "tei":
            return {
                "query": query,
                "texts": texts,
                "raw_scores": False,
                "truncate": self._config.truncate,
            }
        return {
            "model": self._config.model,
            "query": query,
            "documents": texts,
            "top_n": len(texts),
        }

    def _score_batch(self, query: str, texts: list[str]) -> list[float]:
        attempts = self._config.max_retries + 1
        body = self._body(query, texts)
        hint: float | None = None  # a 5xx's Retry-After: the least we wait before retrying
        reason = "no attempt"
        for attempt in range(attempts):
            hint = None
            try:
                response = self._client.post(self._config.url, json=body)
            except httpx.TimeoutException:
                reason = f"timeout after {self._config.timeout_s:g}s"
            except httpx.TransportError as exc:
                # The class name only: a message may quote the request.
                reason = f"connection error: {type(exc).__name__}"
            else:
                status = response.status_code
                if status == 429:
                    retry_after = parse_retry_after(response.headers)
                    raise RerankUnavailableError(
                        f"{self._label}: rate limited (HTTP 429)"
                        + (f", retry after {retry_after:g}s" if retry_after is not None else ""),
                        retry_after=retry_after,
                    )
                if status < 300:
                    return self._scores(response, len(texts))
                if status < 500 and status != 408:
                    raise RerankError(self._status_message(response))
                reason = f"HTTP {status}"
                hint = parse_retry_after(response.headers)
                if hint is not None and hint > self._config.backoff_max_s:
                    # Longer than we would ever sleep here: hand the wait to the caller.
                    raise RerankUnavailableError(
                        f"{self._label}: {reason}, retry after {hint:g}s", retry_after=hint
                    )
            if attempt + 1 < attempts:
                delay = max(self._backoff(attempt), hint or 0.0)
                log.warning(
                    "%s: %s (attempt %d/%d), retrying in %.2fs",
                    self._label,
                    reason,
                    attempt + 1,
                    attempts,
                    delay,
                )
                self._sleep(delay)
        raise RerankUnavailableError(
            f"{self._label}: {reason} after {attempts} attempts", retry_after=hint
        )

    def _backoff(self, attempt: int) -> float:
        c = self._config
        return equal_jitter_backoff(attempt, c.backoff_base_s, c.backoff_max_s, self._rand)

    def _status_message(self, response: httpx.Response) -> str:
        text = response.text
        try:
            payload = json.loads(text)
        except ValueError:
            payload = None
        if isinstance(payload, dict):
            for name in ("error", "message", "detail"):
                if isinstance(payload.get(name), str) and payload[name]:
                    text = payload[name]
                    break
        text = self._scrub(text)[:_MAX_SERVER_MESSAGE]
        return f"{self._label}: request rejected (HTTP {response.status_code}): {text}"

    def _scrub(self, text: str) -> str:
        return scrub(text, self._secret)

    def _malformed(self, why: str) -> RerankError:
        return RerankError(f"{self._label}: malformed response: {self._scrub(why)}")

    def _scores(self, response: httpx.Response, count: int) -> list[float]:
        try:
            payload: Any = response.json()
        except ValueError:
            raise self._malformed("not JSON") from None
        if self._config.api == "cohere":
            if not isinstance(payload, dict) or not isinstance(payload.get("results"), list):
                raise self._malformed("expected an object with a `results` list")
            items, field = payload["results"], "relevance_score"
        else:
            if not isinstance(payload, list):
                raise self._malformed("expected a list of {index, score}")
            items, field = payload, "score"
        if len(items) != count:
            raise self._malformed(f"{len(items)} scores for {count} passages")
        scores: list[float | None] = [None] * count
        for item in items:
            index = item.get("index") if isinstance(item, dict) else None
            value = item.get(field) if isinstance(item, dict) else None
            if type(index) is not int or not 0 <= index < count or scores[index] is not None:
                raise self._malformed(
                    f"indexes are not a permutation of 0..{count - 1} (got {index!r})"
                )
            if (
                isinstance(value, bool)
                or not isinstance(value, int | float)
                or not math.isfinite(value)
            ):
                raise self._malformed(f"score of passage {index} is not a finite number")
            scores[index] = self._probability(float(value), index)
        return [s for s in scores if s is not None]

    def _probability(self, value: float, index: int) -> float:
        if self._config.scores_are_logits:
            return sigmoid(value)
        if not 0.0 <= value <= 1.0:
            raise RerankError(
                f"{self._label}: score {value:g} of passage {index} is outside [0, 1]; set "
                "scores_are_logits if the endpoint answers logits"
            )
        return value
