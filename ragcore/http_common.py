"""What the HTTP adapters share (OpenAI-compatible embedder, HTTP reranker): API keys from a
value or a file, `Retry-After` parsing, jittered backoff, and scrubbing secrets from server text.
"""

from __future__ import annotations

import email.utils
import logging
import math
from collections.abc import Callable, Mapping
from datetime import UTC, datetime
from pathlib import Path

from pydantic import SecretStr

from ragcore.errors import ConfigError

log = logging.getLogger(__name__)


def resolve_api_key(api_key: SecretStr | None, api_key_file: Path | None) -> str | None:
    """The key from `api_key` or `api_key_file` (stripped), or None when neither is set."""
    if api_key is not None:
        return api_key.get_secret_value()
    if api_key_file is None:
        return None
    try:
        key = api_key_file.read_text("utf-8").strip()
    except OSError as exc:
        raise ConfigError(
            f"cannot read api_key_file {api_key_file}: {exc.strerror or exc}"
        ) from exc
    if not key:
        raise ConfigError(f"api_key_file {api_key_file} is empty")
    return key


def equal_jitter_backoff(
    attempt: int, base_s: float, max_s: float, rand: Callable[[], float]
) -> float:
    """Capped exponential delay with "equal jitter": half fixed, half random.

    The fixed half guarantees a minimum pause; the random half spreads retries of many workers
    so they do not hit a recovering server in lockstep.
    """
    ceiling = min(max_s, base_s * 2.0**attempt)
    return ceiling / 2.0 + rand() * ceiling / 2.0


def scrub(text: str, secret: str | None) -> str:
    """`text` with `secret` masked: a server may echo the request, headers included."""
    return text.replace(secret, "***") if secret else text


def parse_retry_after(
    headers: Mapping[str, str], now: Callable[[], datetime] | None = None
) -> float | None:
    """Seconds to wait from `retry-after-ms`, or `Retry-After` (seconds or an HTTP date).

    `headers` should be case-insensitive (the SDK's response headers are).
    """
    millis = headers.get("retry-after-ms")
    if millis is not None:
        try:
            value = float(millis) / 1000.0
        except ValueError:
            value = math.nan
        if math.isfinite(value):
            return max(value, 0.0)
    raw = headers.get("retry-after")
    if raw is None:
        return None
    try:
        seconds = float(raw)
    except ValueError:
        try:
            when = email.utils.parsedate_to_datetime(raw)
        except (TypeError, ValueError):
            log.warning("ignoring unparsable Retry-After header %r", raw[:64])
            return None
        current = now() if now is not None else datetime.now(UTC)
        seconds = (when - current).total_seconds()
    return max(seconds, 0.0) if math.isfinite(seconds) else None
