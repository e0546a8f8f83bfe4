"""Persistent embedding cache: re-indexing unchanged text costs no embedding call
(docs/decisions/embedders-and-cache.md).

Entries are keyed by (sha256 of the exact text the model sees, prefix included; model_version),
so a model or version change can never serve stale vectors. Storage is one SQLite file in WAL
mode (readers do not block the writer, and other processes may share the file), vectors are
little-endian float32 bytes whose length and values are checked on every read, and the size is
bounded by evicting the least recently used entries in batches.
"""

from __future__ import annotations

import hashlib
import logging
import sqlite3
import threading
import time
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path

import numpy as np
from prometheus_client import CollectorRegistry, Counter, Gauge
from pydantic import BaseModel, ConfigDict, Field

from ragcore.embedders.base import (
    Embedder,
    Vectors,
    check_dimension,
    embed_queries,
    with_prefix,
)
from ragcore.embedders.spec import EmbeddingSpec
from ragcore.errors import ConfigError, EmbeddingError, EmbeddingUnavailableError

__all__ = [
    "CachedEmbedder",
    "EmbeddingCache",
    "EmbeddingCacheConfig",
    "EmbeddingCacheMetrics",
    "content_hash",
]

log = logging.getLogger(__name__)

_SCHEMA_VERSION = 1
# Stay far below SQLite's host-parameter limit in `IN (...)` lists.
_MAX_PARAMS = 500

_SCHEMA = """
CREATE TABLE IF NOT EXISTS embeddings (
    id            INTEGER PRIMARY KEY,
    content_hash  BLOB    NOT NULL,
    model_version TEXT    NOT NULL,
    dim           INTEGER NOT NULL,
    vector        BLOB    NOT NULL,
    last_used     INTEGER NOT NULL,
    UNIQUE (content_hash, model_version)
);
CREATE INDEX IF NOT EXISTS embeddings_last_used ON embeddings (last_used, id);
"""


def content_hash(text: str) -> bytes:
    """The cache key of `text`: sha256 of its UTF-8 bytes (32 bytes)."""
    return hashlib.sha256(text.encode("utf-8")).digest()


# Query keys are tagged: with empty prefixes (MiniLM's) a query and a passage of the same text
# would share a key, and an embedder need not give both the same vector (int8 1.0.0 quantized a
# passage with its batch-mates; today's local executions do give the same), so one never
# serves the other.
_QUERY_KEY_TAG = b"query\x00"


def query_hash(text: str) -> bytes:
    """The cache key of a query whose model input is `text` (never a document's key)."""
    return hashlib.sha256(_QUERY_KEY_TAG + text.encode("utf-8")).digest()


class EmbeddingCacheConfig(BaseModel):
    """Settings of the persistent embedding cache."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    path: Path = Field(description="SQLite file (created with its directory if absent).")
    max_entries: int = Field(default=1_000_000, ge=1)
    evict_fraction: float = Field(
        default=0.05,
        gt=0,
        le=0.5,
        description="Share of max_entries freed at once when the bound is exceeded.",
    )
    cache_queries: bool = Field(
        default=False, description="Cache query vectors too (they rarely repeat exactly)."
    )


class EmbeddingCacheMetrics:
    """The cache's Prometheus metrics, registered on an injected registry."""

    def __init__(self, registry: CollectorRegistry) -> None:
        self.hits = Counter(
            "ragstream_embedding_cache_hits",
            "Texts whose vector was served from the embedding cache.",
            registry=registry,
        )
        self.misses = Counter(
            "ragstream_embedding_cache_misses",
            "Texts not found (or found invalid) in the embedding cache.",
            registry=registry,
        )
        self.evictions = Counter(
            "ragstream_embedding_cache_evictions",
            "Entries evicted from the embedding cache (least recently used first).",
            registry=registry,
        )
        self.invalid = Counter(
            "ragstream_embedding_cache_invalid",
            "Cached rows rejected on read (wrong dimension, bad length, non-finite values).",
            registry=registry,
        )
        self.entries = Gauge(
            "ragstream_embedding_cache_entries",
            "Entries in the embedding cache.",
            registry=registry,
        )


class EmbeddingCache:
    """A bounded, thread-safe SQLite store of vectors keyed by (content hash, model_version).

    Without `metrics` (or `registry`), metrics go to a private registry: pass the service's
    registry to export them. SQLite `OperationalError`s (locked, I/O) surface as
    `EmbeddingUnavailableError`, other database errors as `EmbeddingError`: a failing cache is
    never silently bypassed.
    """

    def __init__(
        self,
        path: Path | str,
        *,
        max_entries: int = 1_000_000,
        evict_fraction: float = 0.05,
        registry: CollectorRegistry | None = None,
        metrics: EmbeddingCacheMetrics | None = None,
    ) -> None:
        if max_entries < 1 or not 0 < evict_fraction <= 0.5:
            raise ConfigError("max_entries must be >= 1 and evict_fraction in (0, 0.5]")
        self._path = Path(path)
        self._max_entries = max_entries
        # Evict down to this low-water mark, so eviction runs once per batch, not per insert.
        self._low_water = max_entries - max(1, int(max_entries * evict_fraction))
        self._metrics = metrics or EmbeddingCacheMetrics(registry or CollectorRegistry())
        self._lock = threading.Lock()
        self._last_used = 0
        conn = self._open()
        self._conn: sqlite3.Connection | None = conn
        self._count = _exact_count(conn)
        self._metrics.entries.set(self._count)

    @classmethod
    def from_config(
        cls, config: EmbeddingCacheConfig, *, registry: CollectorRegistry | None = None
    ) -> EmbeddingCache:
        """A cache built from its settings."""
        return cls(
            config.path,
            max_entries=config.max_entries,
            evict_fraction=config.evict_fraction,
            registry=registry,
        )

    def __repr__(self) -> str:
        return f"EmbeddingCache(path={str(self._path)!r}, max_entries={self._max_entries})"

    # --- lifecycle -----------------------------------------------------------------------

    def _open(self) -> sqlite3.Connection:
        try:
            self._path.parent.mkdir(parents=True, exist_ok=True)
            # One connection guarded by our lock; autocommit mode, explicit transactions.
            conn = sqlite3.connect(self._path, check_same_thread=False, isolation_level=None)
        except (OSError, sqlite3.Error) as exc:
            raise ConfigError(f"cannot open embedding cache {self._path}: {exc}") from exc
        try:
            mode = conn.execute("PRAGMA journal_mode=WAL").fetchone()[0]
            if str(mode).lower() != "wal":
                raise ConfigError(
                    f"embedding cache {self._path}: WAL mode unavailable (got {mode!r}); "
                    "put the cache on a local filesystem"
                )
            # NORMAL is crash-consistent in WAL mode; a lost last transaction only costs
            # re-embedding, never a wrong vector.
            conn.execute("PRAGMA synchronous=NORMAL")
            conn.execute("PRAGMA busy_timeout=5000")
            version = conn.execute("PRAGMA user_version").fetchone()[0]
            if version not in (0, _SCHEMA_VERSION):
                raise ConfigError(
                    f"embedding cache {self._path} has schema {version}, expected "
                    f"{_SCHEMA_VERSION}: delete the file (it is only a cache)"
                )
            conn.executescript(_SCHEMA)
            conn.execute(f"PRAGMA user_version={_SCHEMA_VERSION}")
            self._last_used = int(
                conn.execute("SELECT COALESCE(MAX(last_used), 0) FROM embeddings").fetchone()[0]
            )
        except sqlite3.DatabaseError as exc:
            conn.close()
            raise ConfigError(f"embedding cache {self._path} is unusable: {exc}") from exc
        except ConfigError:
            conn.close()
            raise
        return conn

    def close(self) -> None:
        """Close the database. Idempotent; later calls raise `EmbeddingError`."""
        with self._lock:
            if self._conn is not None:
                self._conn.close()
                self._conn = None

    def check(self) -> None:
        """Raise when the database cannot be read."""
        with self._db() as conn:
            conn.execute("SELECT 1 FROM embeddings LIMIT 1").fetchall()

    def __len__(self) -> int:
        with self._db() as conn:
            return _exact_count(conn)

    @property
    def metrics(self) -> EmbeddingCacheMetrics:
        """The metrics this cache updates."""
        return self._metrics

    # --- reads and writes ----------------------------------------------------------------

    def get_many(
        self, keys: Sequence[bytes], model_version: str, dimension: int
    ) -> list[Vectors | None]:
        """Cached vectors for `keys` (None for a miss), marking hits as recently used.

        A row whose dimension, byte length or values are wrong counts as a miss (and in
        `ragstream_embedding_cache_invalid_total`); storing the fresh vector overwrites it.
        """
        if not keys:
            return []
        found: dict[bytes, Vectors] = {}
        invalid = 0
        with self._db() as conn:
            for part in _parts(list(dict.fromkeys(keys))):
                rows = conn.execute(
                    "SELECT content_hash, dim, vector FROM embeddings "
                    f"WHERE model_version = ? AND content_hash IN ({_marks(part)})",
                    (model_version, *part),
                ).fetchall()
                for key, dim, blob in rows:
                    vector = _decode(dim, blob, dimension)
                    if vector is None:
                        invalid += 1
                    else:
                        found[bytes(key)] = vector
            if found:
                now = self._tick()
                with _transaction(conn):
                    for part in _parts(list(found)):
                        conn.execute(
                            f"UPDATE embeddings SET last_used = ? WHERE model_version = ? "
                            f"AND content_hash IN ({_marks(part)})",
                            (now, model_version, *part),
                        )
        result = [found.get(key) for key in keys]
        hits = sum(v is not None for v in result)
        self._metrics.hits.inc(hits)
        self._metrics.misses.inc(len(result) - hits)
        if invalid:
            self._metrics.invalid.inc(invalid)
            log.warning("embedding cache: %d invalid rows for %s ignored", invalid, model_version)
        return result

    def put_many(self, items: Sequence[tuple[bytes, Vectors]], model_version: str) -> None:
        """Store (key, vector) pairs for `model_version`, replacing existing rows; then evict
        least recently used entries if the cache exceeds `max_entries`."""
        if not items:
            return
        latest = dict(items)  # the last vector wins for a key given twice
        with self._db() as conn:
            now = self._tick()
            with _transaction(conn):
                existing = 0
                for part in _parts(list(latest)):
                    existing += conn.execute(
                        f"SELECT COUNT(*) FROM embeddings WHERE model_version = ? "
                        f"AND content_hash IN ({_marks(part)})",
                        (model_version, *part),
                    ).fetchone()[0]
                conn.executemany(
                    "INSERT INTO embeddings (content_hash, model_version, dim, vector, last_used) "
                    "VALUES (?, ?, ?, ?, ?) ON CONFLICT (content_hash, model_version) DO UPDATE "
                    "SET dim = excluded.dim, vector = excluded.vector, "
                    "last_used = excluded.last_used",
                    [(key, model_version, *_encode(vector), now) for key, vector in latest.items()],
                )
            self._count += len(latest) - existing
            if self._count > self._max_entries:
                self._evict(conn)
            self._metrics.entries.set(self._count)

    # --- internals -----------------------------------------------------------------------

    @contextmanager
    def _db(self) -> Iterator[sqlite3.Connection]:
        """The connection, under the lock, with SQLite errors translated."""
        with self._lock:
            if self._conn is None:
                raise EmbeddingError(f"embedding cache {self._path} is closed")
            try:
                yield self._conn
            except sqlite3.OperationalError as exc:
                raise EmbeddingUnavailableError(
                    f"embedding cache {self._path} unavailable: {exc}"
                ) from exc
            except sqlite3.DatabaseError as exc:
                raise EmbeddingError(f"embedding cache {self._path} failed: {exc}") from exc

    def _tick(self) -> int:
        # Wall-clock nanoseconds (comparable across processes sharing the file), forced to
        # increase within this process so LRU order never ties.
        self._last_used = max(time.time_ns(), self._last_used + 1)
        return self._last_used

    def _evict(self, conn: sqlite3.Connection) -> None:
        # Other processes may share the file: decide on the exact count, not our estimate.
        self._count = _exact_count(conn)
        excess = self._count - self._low_water
        if self._count <= self._max_entries or excess <= 0:
            return
        with _transaction(conn):
            removed = conn.execute(
                "DELETE FROM embeddings WHERE id IN "
                "(SELECT id FROM embeddings ORDER BY last_used, id LIMIT ?)",
                (excess,),
            ).rowcount
        self._count -= removed
        self._metrics.evictions.inc(removed)
        log.info("embedding cache: evicted %d least recently used entries", removed)


class CachedEmbedder:
    """An `Embedder` that asks `inner` only for texts the cache does not hold.

    Document texts are looked up in one query; all misses (deduplicated) go to `inner` in one
    `embed_documents` call and are stored. Queries bypass the cache unless `cache_queries`.
    `close()` closes `inner` and, when `close_cache`, the cache.
    """

    def __init__(
        self,
        inner: Embedder,
        cache: EmbeddingCache,
        *,
        cache_queries: bool = False,
        close_cache: bool = True,
    ) -> None:
        self._inner = inner
        self._cache = cache
        self._cache_queries = cache_queries
        self._close_cache = close_cache

    @property
    def spec(self) -> EmbeddingSpec:
        """The inner embedder's spec (cache entries are keyed by its model_version)."""
        return self._inner.spec

    @property
    def inner(self) -> Embedder:
        """The wrapped embedder."""
        return self._inner

    @property
    def cache(self) -> EmbeddingCache:
        """The cache in use."""
        return self._cache

    def __repr__(self) -> str:
        return f"CachedEmbedder(inner={self._inner!r}, cache={self._cache!r})"

    def embed_documents(self, texts: Sequence[str]) -> Vectors:
        """Vectors for `texts`, from the cache where possible, in input order."""
        spec = self._inner.spec
        exact = with_prefix(spec.document_prefix, texts)
        keys = [content_hash(t) for t in exact]
        first: dict[bytes, int] = {}
        for i, key in enumerate(keys):
            first.setdefault(key, i)
        unique = list(first)
        cached = dict(
            zip(
                unique,
                self._cache.get_many(unique, spec.model_version, spec.dimension),
                strict=True,
            )
        )
        missing = [key for key in unique if cached[key] is None]
        if missing:
            # The inner embedder applies the prefix itself: hand it the caller's raw texts.
            fresh = self._inner.embed_documents([texts[first[key]] for key in missing])
            check_dimension(fresh, spec, len(missing))
            self._cache.put_many(list(zip(missing, fresh, strict=True)), spec.model_version)
            cached.update(zip(missing, fresh, strict=True))
        out = np.empty((len(keys), spec.dimension), dtype=np.float32)
        for i, key in enumerate(keys):
            out[i] = cached[key]
        return out

    def embed_query(self, text: str) -> Vectors:
        """The query vector; from the cache only when `cache_queries` is set."""
        if not self._cache_queries:
            return self._inner.embed_query(text)
        spec = self._inner.spec
        key = query_hash(with_prefix(spec.query_prefix, [text])[0])
        (hit,) = self._cache.get_many([key], spec.model_version, spec.dimension)
        if hit is not None:
            return hit
        vector = self._inner.embed_query(text)
        self._cache.put_many([(key, vector)], spec.model_version)
        return vector

    def embed_queries(self, texts: Sequence[str]) -> Vectors:
        """`embed_query` of each text; the texts not served by the cache go to the inner
        embedder's batch path (`embed_queries`)."""
        if not self._cache_queries:
            return embed_queries(self._inner, texts)
        spec = self._inner.spec
        keys = [query_hash(t) for t in with_prefix(spec.query_prefix, texts)]
        hits = self._cache.get_many(keys, spec.model_version, spec.dimension)
        missing = [i for i, hit in enumerate(hits) if hit is None]
        fresh = embed_queries(self._inner, [texts[i] for i in missing])
        if missing:
            pairs = dict(zip((keys[i] for i in missing), fresh, strict=True))
            self._cache.put_many(list(pairs.items()), spec.model_version)
        out = np.empty((len(texts), spec.dimension), dtype=np.float32)
        for i, hit in enumerate(hits):
            if hit is not None:
                out[i] = hit
        for i, vector in zip(missing, fresh, strict=True):
            out[i] = vector
        return out

    def check(self) -> None:
        """Check the cache, then the inner embedder."""
        self._cache.check()
        self._inner.check()

    def close(self) -> None:
        """Close the inner embedder and (when owned) the cache."""
        self._inner.close()
        if self._close_cache:
            self._cache.close()


# --- helpers ---------------------------------------------------------------------------------


def _exact_count(conn: sqlite3.Connection) -> int:
    return int(conn.execute("SELECT COUNT(*) FROM embeddings").fetchone()[0])


def _parts(keys: list[bytes]) -> Iterator[list[bytes]]:
    for start in range(0, len(keys), _MAX_PARAMS):
        yield keys[start : start + _MAX_PARAMS]


def _marks(part: Sequence[object]) -> str:
    return ",".join("?" * len(part))


@contextmanager
def _transaction(conn: sqlite3.Connection) -> Iterator[None]:
    conn.execute("BEGIN IMMEDIATE")
    try:
        yield
    except BaseException:
        conn.execute("ROLLBACK")
        raise
    conn.execute("COMMIT")


def _encode(vector: Vectors) -> tuple[int, bytes]:
    array = np.asarray(vector, dtype="<f4")
    if array.ndim != 1:
        raise EmbeddingError(f"cannot cache a vector of shape {array.shape}")
    return int(array.shape[0]), array.tobytes()


def _decode(dim: object, blob: object, dimension: int) -> Vectors | None:
    """The stored vector, or None when the row does not hold a valid `dimension`-vector."""
    if dim != dimension or not isinstance(blob, bytes) or len(blob) != 4 * dimension:
        return None
    vector = np.frombuffer(blob, dtype="<f4").astype(np.float32)
    if not np.isfinite(vector).all() or not np.any(vector):
        return None
    return vector
