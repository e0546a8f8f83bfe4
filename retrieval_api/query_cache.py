"""Query vectors of recent requests, so a repeated question is not embedded again.

Keyed by (tenant, model version, query text after validation): a hit never crosses tenants, so
its shorter latency cannot tell one tenant what another asked. Least recently used entries go
first; the vectors handed out are read-only (docs/decisions/query-vector-cache.md).
"""

from __future__ import annotations

import threading
from collections import OrderedDict
from collections.abc import Callable

import numpy as np

from ragcore.embedders.base import Vectors


class QueryVectorCache:
    """A bounded LRU of query vectors (thread-safe); `entries` 0 turns it off."""

    def __init__(self, entries: int, record: Callable[[str], None] | None = None) -> None:
        self._entries = entries
        self._record = record or (lambda outcome: None)
        self._vectors: OrderedDict[tuple[str, str, str], Vectors] = OrderedDict()
        self._lock = threading.Lock()

    def vector(
        self, tenant: str, model_version: str, query: str, embed: Callable[[str], Vectors]
    ) -> Vectors:
        """The query's vector: cached, else `embed(query)` (then cached)."""
        if self._entries <= 0:
            return embed(query)
        key = (tenant, model_version, query)
        with self._lock:
            hit = self._vectors.get(key)
            if hit is not None:
                self._vectors.move_to_end(key)
        if hit is not None:
            self._record("hit")
            return hit
        self._record("miss")
        vector = np.array(embed(query), dtype=np.float32)  # a copy the cache owns
        vector.setflags(write=False)
        with self._lock:
            self._vectors[key] = vector
            self._vectors.move_to_end(key)
            while len(self._vectors) > self._entries:
                self._vectors.popitem(last=False)
        return vector
