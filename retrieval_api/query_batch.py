"""Concurrent requests' queries embedded together, in one model call.

Why: a short query costs the local model about 6 ms of CPU alone, and 3.5-3.7 ms in a batch of
4 to 16. Several Retrieve requests are in flight whenever the server is busy, so batching their
queries saves CPU exactly when CPU is scarce (docs/decisions/retrieve-processes.md).

Opportunistic: a request never waits to collect company. The first query to arrive while no
batch is running is embedded at once, alone. Queries that arrive meanwhile queue; when that
call returns, the longest-waiting queued request leads the next batch, with every query queued
by then (up to `max_batch`). So a lone request pays nothing, and under load a batch forms
from whatever arrived during the previous call. Each request leads at most one batch: the one
holding its own query.

Rows are bit-identical to single-query embeddings for the local model (padding is masked out
of attention and pooling; tested), so results do not depend on which requests shared a batch.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

import numpy as np

from ragcore.embedders.base import Vectors
from ragcore.errors import EmbeddingError, RagstreamError

__all__ = ["QueryBatcher"]


@dataclass
class _Query:
    text: str
    done: threading.Event = field(default_factory=threading.Event)
    lead: bool = False
    vector: Vectors | None = None
    error: BaseException | None = None


class QueryBatcher:
    """`embed(text)` for many threads; concurrent texts go to `embed_many` together."""

    def __init__(
        self,
        embed_many: Callable[[Sequence[str]], Vectors],
        *,
        max_batch: int = 16,
        observe: Callable[[int], None] | None = None,
    ) -> None:
        """`embed_many` embeds a list of queries; `observe` is told each batch's size."""
        if max_batch < 1:
            raise ValueError("max_batch must be >= 1")
        self._embed_many = embed_many
        self._max_batch = max_batch
        self._observe = observe or (lambda size: None)
        self._lock = threading.Lock()
        self._queued: list[_Query] = []
        self._running = False

    def embed(self, text: str) -> Vectors:
        """The query's vector, shape (dimension,); the embedder's errors are raised as is."""
        query = _Query(text)
        with self._lock:
            self._queued.append(query)
            if not self._running:
                self._running = True
                query.lead = True
        while True:
            if query.lead:
                query.lead = False
                self._run_batch()
            query.done.wait()
            if query.lead:  # woken to lead the next batch (its own query is in it)
                query.done.clear()
                continue
            if query.error is not None:
                raise query.error
            assert query.vector is not None
            return query.vector

    def _run_batch(self) -> None:
        with self._lock:
            batch = self._queued[: self._max_batch]
            del self._queued[: self._max_batch]
        self._observe(len(batch))
        vectors: Vectors | None = None
        error: RagstreamError | None = None
        try:
            vectors = self._embed_many([q.text for q in batch])
            if len(vectors) != len(batch):
                raise EmbeddingError(f"{len(vectors)} vectors for {len(batch)} queries")
        except RagstreamError as exc:  # every request of the batch gets the embedder's error
            error = exc
        finally:
            # on any other exception the leader raises it, and nobody is left waiting
            for i, q in enumerate(batch):
                if error is None and vectors is not None and len(vectors) == len(batch):
                    q.vector = np.asarray(vectors[i], dtype=np.float32)
                else:
                    q.error = error or EmbeddingError(
                        "the embedding call of this query's batch failed (logged by the request"
                        " that ran it)"
                    )
            with self._lock:
                successor = self._queued[0] if self._queued else None
                if successor is not None:
                    successor.lead = True
                else:
                    self._running = False
            for q in batch:
                q.done.set()
            if successor is not None:
                successor.done.set()
