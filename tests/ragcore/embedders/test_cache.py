"""The persistent embedding cache and the caching embedder."""

from __future__ import annotations

import hashlib
import sqlite3
import threading
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import numpy as np
import numpy.typing as npt
import pytest
from prometheus_client import CollectorRegistry

from ragcore.embedders.base import Embedder, embed_queries, l2_normalize
from ragcore.embedders.cache import (
    CachedEmbedder,
    EmbeddingCache,
    EmbeddingCacheConfig,
    content_hash,
)
from ragcore.embedders.spec import EmbeddingSpec
from ragcore.errors import ConfigError, EmbeddingDimensionError, EmbeddingError

DIM = 4


def vector_of(text: str, dim: int = DIM) -> npt.NDArray[np.float32]:
    seed = int.from_bytes(hashlib.sha256(text.encode()).digest()[:8], "little")
    vectors = l2_normalize(np.random.default_rng(seed).standard_normal((1, dim)))
    return vectors.reshape(dim)


class FakeEmbedder:
    """Deterministic embedder that records every call."""

    def __init__(
        self,
        version: str = "v1",
        document_prefix: str = "",
        dim: int = DIM,
        query_prefix: str = "q: ",
    ) -> None:
        self.spec = EmbeddingSpec(
            name="fake",
            version=version,
            dimension=DIM,
            max_input_tokens=100,
            tokenizer="tiktoken:cl100k_base",
            document_prefix=document_prefix,
            query_prefix=query_prefix,
        )
        self._dim = dim
        self.calls: list[list[str]] = []
        self.query_calls: list[str] = []
        self.closed = False
        self._lock = threading.Lock()

    def embed_documents(self, texts: Sequence[str]) -> npt.NDArray[np.float32]:
        with self._lock:
            self.calls.append(list(texts))
        return np.stack(
            [vector_of(self.spec.document_prefix + t, self._dim) for t in texts]
        ).astype(np.float32)

    def embed_query(self, text: str) -> npt.NDArray[np.float32]:
        self.query_calls.append(text)
        return vector_of(self.spec.query_prefix + text)

    def check(self) -> None:
        pass

    def close(self) -> None:
        self.closed = True


def sample(registry: CollectorRegistry, name: str) -> float:
    value = registry.get_sample_value(name)
    assert value is not None, name
    return value


def make(path: Path, registry: CollectorRegistry | None = None, **kw: float) -> EmbeddingCache:
    return EmbeddingCache(path, registry=registry or CollectorRegistry(), **kw)  # type: ignore[arg-type]


@pytest.mark.unit
def test_reembedding_unchanged_text_makes_no_inner_call(tmp_path: Path) -> None:
    registry = CollectorRegistry()
    inner = FakeEmbedder()
    embedder = CachedEmbedder(inner, make(tmp_path / "c.db", registry))
    assert isinstance(embedder, Embedder)
    texts = ["alpha", "beta", "alpha", "gamma"]
    first = embedder.embed_documents(texts)
    assert inner.calls == [["alpha", "beta", "gamma"]]  # misses deduplicated, one call
    second = embedder.embed_documents(texts)
    assert len(inner.calls) == 1
    np.testing.assert_array_equal(first, second)
    np.testing.assert_allclose(second, np.stack([vector_of(t) for t in texts]), atol=1e-7)
    embedder.embed_documents(["beta", "delta"])
    assert inner.calls[-1] == ["delta"]
    # Counted per distinct text looked up: 3 misses, then 3 hits, then 1 hit + 1 miss.
    assert sample(registry, "ragstream_embedding_cache_hits_total") == 3 + 1
    assert sample(registry, "ragstream_embedding_cache_misses_total") == 3 + 1
    assert sample(registry, "ragstream_embedding_cache_entries") == 4
    assert embedder.embed_documents([]).shape == (0, DIM)
    embedder.close()
    assert inner.closed


@pytest.mark.unit
def test_cache_persists_across_reopen(tmp_path: Path) -> None:
    path = tmp_path / "sub" / "cache.db"
    first = CachedEmbedder(FakeEmbedder(), make(path))
    vectors = first.embed_documents(["one", "two"])
    first.close()

    inner = FakeEmbedder()
    cache = make(path)
    assert len(cache) == 2
    again = CachedEmbedder(inner, cache)
    np.testing.assert_array_equal(again.embed_documents(["two", "one"]), vectors[::-1])
    assert inner.calls == []
    assert sqlite3.connect(path).execute("PRAGMA journal_mode").fetchone()[0] == "wal"
    again.close()


@pytest.mark.unit
def test_model_version_isolation(tmp_path: Path) -> None:
    cache = make(tmp_path / "c.db")
    CachedEmbedder(FakeEmbedder("v1"), cache, close_cache=False).embed_documents(["same text"])
    other = FakeEmbedder("v2")
    CachedEmbedder(other, cache, close_cache=False).embed_documents(["same text"])
    assert other.calls == [["same text"]]
    assert len(cache) == 2
    cache.close()


@pytest.mark.unit
def test_key_is_the_exact_text_embedded_prefix_included(tmp_path: Path) -> None:
    cache = make(tmp_path / "c.db")
    inner = FakeEmbedder(document_prefix="passage: ")
    CachedEmbedder(inner, cache, close_cache=False).embed_documents(["x"])
    version = inner.spec.model_version
    assert cache.get_many([content_hash("passage: x")], version, DIM)[0] is not None
    assert cache.get_many([content_hash("x")], version, DIM)[0] is None
    cache.close()


@pytest.mark.unit
def test_eviction_keeps_the_bound_and_drops_least_recently_used(tmp_path: Path) -> None:
    registry = CollectorRegistry()
    cache = make(tmp_path / "c.db", registry, max_entries=10, evict_fraction=0.2)
    inner = FakeEmbedder()
    embedder = CachedEmbedder(inner, cache)
    embedder.embed_documents([f"t{i}" for i in range(10)])
    assert len(cache) == 10
    embedder.embed_documents(["t0", "t1", "t2"])  # touched: now the most recently used
    embedder.embed_documents(["new"])  # 11 > 10: evict down to 8 in one batch
    assert len(cache) == 8
    assert sample(registry, "ragstream_embedding_cache_evictions_total") == 3
    inner.calls.clear()
    embedder.embed_documents(["t0", "t1", "t2", "new", "t6", "t7", "t8", "t9"])
    assert inner.calls == []  # the survivors
    embedder.embed_documents(["t3"])
    assert inner.calls == [["t3"]]  # evicted, recomputed
    for i in range(40):
        embedder.embed_documents([f"bulk{i}", f"bulk{i}b", f"bulk{i}c"])
        assert len(cache) <= 10
    embedder.embed_documents([f"big{i}" for i in range(25)])  # one put larger than the bound
    assert len(cache) <= 10
    assert sample(registry, "ragstream_embedding_cache_entries") == len(cache)
    embedder.close()


@pytest.mark.unit
def test_invalid_rows_are_misses_counted_and_overwritten(tmp_path: Path) -> None:
    path = tmp_path / "c.db"
    registry = CollectorRegistry()
    inner = FakeEmbedder()
    embedder = CachedEmbedder(inner, make(path, registry))
    embedder.embed_documents(["short", "wrongdim", "nan", "fine"])
    with sqlite3.connect(path) as db:
        db.execute(
            "UPDATE embeddings SET vector = substr(vector, 1, 8) WHERE content_hash = ?",
            (content_hash("short"),),
        )
        db.execute(
            "UPDATE embeddings SET dim = 3 WHERE content_hash = ?", (content_hash("wrongdim"),)
        )
        db.execute(
            "UPDATE embeddings SET vector = ? WHERE content_hash = ?",
            (np.full(DIM, np.nan, "<f4").tobytes(), content_hash("nan")),
        )
    inner.calls.clear()
    vectors = embedder.embed_documents(["short", "wrongdim", "nan", "fine"])
    assert inner.calls == [["short", "wrongdim", "nan"]]
    np.testing.assert_allclose(
        vectors[:3], np.stack([vector_of(t) for t in ["short", "wrongdim", "nan"]])
    )
    assert sample(registry, "ragstream_embedding_cache_invalid_total") == 3
    inner.calls.clear()
    embedder.embed_documents(["short", "wrongdim", "nan"])
    assert inner.calls == []  # overwritten with valid rows
    embedder.close()


@pytest.mark.unit
def test_queries_bypass_the_cache_unless_configured(tmp_path: Path) -> None:
    registry = CollectorRegistry()
    inner = FakeEmbedder()
    embedder = CachedEmbedder(inner, make(tmp_path / "c.db", registry), close_cache=False)
    embedder.embed_query("hello")
    embedder.embed_query("hello")
    assert inner.query_calls == ["hello", "hello"]
    assert sample(registry, "ragstream_embedding_cache_misses_total") == 0
    caching = CachedEmbedder(inner, embedder.cache, cache_queries=True)
    inner.query_calls.clear()
    first = caching.embed_query("hello")
    second = caching.embed_query("hello")
    assert inner.query_calls == ["hello"]
    np.testing.assert_array_equal(first, second)
    # A query and a document of the same text are different keys (different prefixes).
    caching.embed_documents(["hello"])
    assert inner.calls == [["hello"]]
    caching.close()


@pytest.mark.unit
def test_a_query_never_shares_a_key_with_a_document_of_the_same_model_input(
    tmp_path: Path,
) -> None:
    # No prefixes (as MiniLM): the model input of both is "hello", yet a passage's vector is not
    # always bitwise the query's (the float execution pads a batch of passages).
    inner = FakeEmbedder(query_prefix="")
    caching = CachedEmbedder(inner, make(tmp_path / "c.db"), cache_queries=True)
    caching.embed_documents(["hello"])
    caching.embed_query("hello")
    caching.embed_queries(["hello"])
    assert inner.query_calls == ["hello"]  # the query missed the passage's entry, then hit its own
    caching.embed_query("hello")
    assert inner.query_calls == ["hello"]
    assert inner.calls == [["hello"]]
    caching.close()


@pytest.mark.unit
def test_embed_queries_is_embed_query_of_each_text(tmp_path: Path) -> None:
    inner = FakeEmbedder()  # no batch path: one `embed_query` call per text
    texts = ["hello", "world", "hello"]
    expected = np.stack([inner.embed_query(t) for t in texts])
    plain = CachedEmbedder(inner, make(tmp_path / "c.db"), close_cache=False)
    inner.query_calls.clear()
    np.testing.assert_array_equal(plain.embed_queries(texts), expected)
    assert inner.query_calls == texts  # not cached without cache_queries
    caching = CachedEmbedder(inner, plain.cache, cache_queries=True)
    caching.embed_query("world")
    inner.query_calls.clear()
    np.testing.assert_array_equal(caching.embed_queries(texts), expected)
    assert inner.query_calls == ["hello", "hello"]  # the misses only
    inner.query_calls.clear()
    np.testing.assert_array_equal(caching.embed_queries(texts), expected)
    assert inner.query_calls == []
    assert embed_queries(caching, []).shape == (0, DIM)
    caching.close()


@pytest.mark.unit
def test_wrong_inner_dimension_is_refused_and_not_stored(tmp_path: Path) -> None:
    cache = make(tmp_path / "c.db")
    embedder = CachedEmbedder(FakeEmbedder(dim=DIM + 1), cache)
    with pytest.raises(EmbeddingDimensionError):
        embedder.embed_documents(["x"])
    assert len(cache) == 0
    embedder.close()


@pytest.mark.unit
def test_concurrent_use_from_threads(tmp_path: Path) -> None:
    inner = FakeEmbedder()
    embedder = CachedEmbedder(inner, make(tmp_path / "c.db", max_entries=10_000))
    texts = [f"text {i}" for i in range(200)]
    start = threading.Barrier(8)

    def work(offset: int) -> None:
        start.wait()
        for round_ in range(10):
            batch = [texts[(offset * 17 + round_ * 13 + j) % 200] for j in range(25)]
            got = embedder.embed_documents(batch)
            np.testing.assert_allclose(got, np.stack([vector_of(t) for t in batch]))

    with ThreadPoolExecutor(max_workers=8) as pool:
        for future in [pool.submit(work, i) for i in range(8)]:
            future.result(timeout=60)  # re-raises a worker's failure here
    seen = {t for call in inner.calls for t in call}
    assert len(embedder.cache) == len(seen)
    inner.calls.clear()
    embedder.embed_documents(sorted(seen))
    assert inner.calls == []
    embedder.close()


@pytest.mark.unit
def test_closed_and_unusable_caches_fail_loudly(tmp_path: Path) -> None:
    cache = make(tmp_path / "c.db")
    cache.check()
    cache.close()
    cache.close()
    with pytest.raises(EmbeddingError, match="closed"):
        cache.get_many([content_hash("x")], "m@1", DIM)
    garbage = tmp_path / "garbage.db"
    garbage.write_bytes(b"definitely not sqlite" * 100)
    with pytest.raises(ConfigError, match="unusable"):
        make(garbage)
    with pytest.raises(ConfigError):
        make(tmp_path / "x.db", max_entries=0)


@pytest.mark.unit
def test_from_config_registers_metrics_on_the_given_registry(tmp_path: Path) -> None:
    registry = CollectorRegistry()
    cache = EmbeddingCache.from_config(
        EmbeddingCacheConfig(path=tmp_path / "c.db", max_entries=5), registry=registry
    )
    assert sample(registry, "ragstream_embedding_cache_entries") == 0
    assert "c.db" in repr(cache)
    cache.close()
