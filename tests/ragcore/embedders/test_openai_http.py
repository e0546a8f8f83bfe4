"""The OpenAI-compatible embedder against a loopback stub of `/v1/embeddings`."""

from __future__ import annotations

import base64
import functools
import hashlib
import json
import socket
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import numpy as np
import numpy.typing as npt
import pytest
from pydantic import SecretStr, ValidationError

from ragcore.embedders.base import Embedder, embed_queries
from ragcore.embedders.openai_http import OpenAIEmbedder, OpenAIEmbedderConfig
from ragcore.errors import EmbeddingDimensionError, EmbeddingError, EmbeddingUnavailableError
from ragcore.http_common import parse_retry_after
from tests.http_stub import Response, ScriptedStub, Sleeps

DIM = 8
KEY = "sk-test-Secret-4242"


def stub_vector(text: str, dim: int = DIM) -> list[float]:
    """Deterministic, deliberately non-normalized vector of `text`."""
    seed = int.from_bytes(hashlib.sha256(text.encode()).digest()[:8], "little")
    return [float(x) for x in np.random.default_rng(seed).standard_normal(dim) * 3.0]


def expected(texts: list[str]) -> npt.NDArray[np.float32]:
    v = np.array([stub_vector(t) for t in texts], dtype=np.float64)
    normalized: npt.NDArray[np.float32] = (v / np.linalg.norm(v, axis=1, keepdims=True)).astype(
        np.float32
    )
    return normalized


@dataclass
class Reply:
    """One scripted answer: an error status, or a 200 with a twist."""

    status: int = 200
    headers: dict[str, str] = field(default_factory=dict)
    body: Any = None  # JSON body for error statuses
    dim: int = DIM
    shuffle: bool = False
    drop_one: bool = False
    base64: bool = False
    delay_s: float = 0.0


Stub = ScriptedStub[Reply, OpenAIEmbedder]


def inputs(stub: Stub) -> list[list[str]]:
    """The `input` of every request the stub received."""
    return [body["input"] for _, _, body in stub.requests]


def _answer(stub: Stub, path: str, headers: dict[str, str], body: Any) -> Response:
    reply = stub.next_reply(path, headers, body)
    if path != "/v1/embeddings":
        return 404, json.dumps({"error": {"message": f"no route {path}"}}).encode(), {}
    if reply.delay_s:
        time.sleep(reply.delay_s)
    if reply.status != 200:
        error = reply.body or {"error": {"message": "boom"}}
        return reply.status, json.dumps(error).encode(), reply.headers
    data: list[dict[str, Any]] = []
    for i, text in enumerate(body["input"]):
        vector = stub_vector(text, reply.dim)
        embedding: Any = vector
        if reply.base64:
            embedding = base64.b64encode(np.array(vector, "<f4").tobytes()).decode()
        data.append({"object": "embedding", "index": i, "embedding": embedding})
    if reply.shuffle:
        data.reverse()
    if reply.drop_one:
        data.pop()
    answer = {"object": "list", "data": data, "model": body["model"], "usage": {}}
    return 200, json.dumps(answer).encode(), reply.headers


@pytest.fixture
def stub() -> Iterator[Stub]:
    stub = Stub(Reply)
    with stub.serving(functools.partial(_answer, stub), "/v1"):
        yield stub


def make(
    stub: Stub,
    sleeps: Sleeps | None = None,
    rand: Callable[[], float] = lambda: 0.5,
    **overrides: Any,
) -> OpenAIEmbedder:
    settings: dict[str, Any] = {
        "base_url": stub.url,
        "model": "stub-embed",
        "api_key": SecretStr(KEY),
        "dimension": DIM,
        "version": "stub-1",
        "batch_size": 100,
        "max_retries": 3,
        "backoff_base_s": 0.1,
        "backoff_max_s": 1.0,
        "timeout_s": 5.0,
    }
    settings.update(overrides)
    embedder = OpenAIEmbedder(
        OpenAIEmbedderConfig(**settings),
        sleep=sleeps if sleeps is not None else Sleeps(),
        rand=rand,
    )
    stub.clients.append(embedder)
    return embedder


def _assert_no_key(*objects: object) -> None:
    for obj in objects:
        assert KEY not in str(obj)
        assert KEY not in repr(obj)


@pytest.mark.integration
def test_batches_of_at_most_batch_size_in_order_with_auth_header(stub: Stub) -> None:
    embedder = make(stub)
    assert isinstance(embedder, Embedder)
    texts = [f"passage number {i}" for i in range(150)]
    vectors = embedder.embed_documents(texts)
    assert [len(batch) for batch in inputs(stub)] == [100, 50]
    assert [t for batch in inputs(stub) for t in batch] == texts
    np.testing.assert_allclose(vectors, expected(texts), atol=1e-6)
    assert vectors.dtype == np.float32
    for _, headers, body in stub.requests:
        assert headers["authorization"] == f"Bearer {KEY}"
        assert body["model"] == "stub-embed"
        assert body["encoding_format"] == "float"
        assert "dimensions" not in body
    embedder.close()


@pytest.mark.integration
def test_retries_5xx_with_backoff_then_succeeds(stub: Stub) -> None:
    stub.script = [Reply(status=500), Reply(status=503), Reply(status=502)]
    sleeps = Sleeps()
    embedder = make(stub, sleeps, rand=lambda: 1.0)
    vectors = embedder.embed_documents(["a", "b"])
    np.testing.assert_allclose(vectors, expected(["a", "b"]), atol=1e-6)
    assert len(stub.requests) == 4
    # Ceilings 0.1, 0.2, 0.4 (base 0.1 doubling, max 1.0); rand=1.0 -> the full ceiling.
    assert sleeps.delays == pytest.approx([0.1, 0.2, 0.4])
    embedder.close()


@pytest.mark.unit
def test_backoff_has_equal_jitter_and_a_cap() -> None:
    config = OpenAIEmbedderConfig(
        base_url="http://127.0.0.1:9/v1",
        model="m",
        dimension=4,
        backoff_base_s=1.0,
        backoff_max_s=5.0,
    )
    low = OpenAIEmbedder(config, rand=lambda: 0.0)
    high = OpenAIEmbedder(config, rand=lambda: 0.999999)
    assert [low._backoff(a) for a in range(5)] == pytest.approx([0.5, 1.0, 2.0, 2.5, 2.5])
    assert [high._backoff(a) for a in range(5)] == pytest.approx(
        [1.0, 2.0, 4.0, 5.0, 5.0], rel=1e-5
    )
    low.close()
    high.close()


@pytest.mark.integration
def test_5xx_retry_after_is_a_minimum_delay_or_handed_to_the_caller(stub: Stub) -> None:
    stub.script = [Reply(status=503, headers={"Retry-After": "0.7"})]
    sleeps = Sleeps()
    embedder = make(stub, sleeps)  # backoff ceiling 0.1 at the first retry, max 1.0
    embedder.embed_documents(["x"])
    assert sleeps.delays == [0.7]
    stub.script = [Reply(status=503, headers={"Retry-After": "120"})]
    with pytest.raises(EmbeddingUnavailableError, match="retry after 120s") as info:
        embedder.embed_documents(["x"])
    assert info.value.retry_after == 120.0
    assert len(stub.requests) == 3 and sleeps.delays == [0.7]


@pytest.mark.integration
def test_retries_exhausted_raise_unavailable(stub: Stub) -> None:
    stub.script = [Reply(status=503)] * 3
    sleeps = Sleeps()
    embedder = make(stub, sleeps, max_retries=2)
    with pytest.raises(EmbeddingUnavailableError, match="HTTP 503 after 3 attempts") as info:
        embedder.embed_documents(["x"])
    assert info.value.retry_after is None
    assert len(stub.requests) == 3
    assert len(sleeps.delays) == 2
    _assert_no_key(info.value)


@pytest.mark.integration
def test_429_raises_unavailable_at_once_with_retry_after(stub: Stub) -> None:
    stub.script = [Reply(status=429, headers={"Retry-After": "7"})]
    sleeps = Sleeps()
    embedder = make(stub, sleeps)
    with pytest.raises(EmbeddingUnavailableError) as info:
        embedder.embed_documents(["x"])
    assert info.value.retry_after == 7.0
    assert info.value.code == "EMBEDDING_UNAVAILABLE"
    assert len(stub.requests) == 1
    assert sleeps.delays == []

    stub.script = [Reply(status=429)]
    with pytest.raises(EmbeddingUnavailableError) as info:
        embedder.embed_documents(["x"])
    assert info.value.retry_after is None


@pytest.mark.unit
def test_parse_retry_after_forms() -> None:
    now = datetime(2024, 1, 1, 12, 0, 0, tzinfo=UTC)
    assert parse_retry_after({"retry-after": "2.5"}) == 2.5
    assert parse_retry_after({"retry-after": "-3"}) == 0.0
    assert parse_retry_after({"retry-after-ms": "1500", "retry-after": "9"}) == 1.5
    assert parse_retry_after({"retry-after": "Mon, 01 Jan 2024 12:00:30 GMT"}, lambda: now) == 30.0
    assert parse_retry_after({"retry-after": "soon"}) is None
    assert parse_retry_after({}) is None


@pytest.mark.integration
def test_wrong_dimension_raises_dimension_error(stub: Stub) -> None:
    stub.script = [Reply(dim=DIM + 1)]
    with pytest.raises(EmbeddingDimensionError, match=f"expected \\({DIM},\\)"):
        make(stub).embed_documents(["x", "y"])


@pytest.mark.integration
def test_shuffled_indexes_are_put_back_in_order(stub: Stub) -> None:
    stub.script = [Reply(shuffle=True)]
    texts = ["first", "second", "third"]
    np.testing.assert_allclose(make(stub).embed_documents(texts), expected(texts), atol=1e-6)


@pytest.mark.integration
def test_missing_embedding_is_an_error(stub: Stub) -> None:
    stub.script = [Reply(drop_one=True)]
    with pytest.raises(EmbeddingError, match="2 embeddings for 3 inputs"):
        make(stub).embed_documents(["a", "b", "c"])


@pytest.mark.integration
def test_base64_answers_are_decoded(stub: Stub) -> None:
    stub.script = [Reply(base64=True)]
    np.testing.assert_allclose(
        make(stub).embed_documents(["a", "b"]), expected(["a", "b"]), atol=1e-6
    )


@pytest.mark.integration
def test_4xx_is_a_permanent_error_with_the_server_message_and_no_key(stub: Stub) -> None:
    echo = {"error": {"message": f"input too long (request had Authorization: Bearer {KEY})"}}
    stub.script = [Reply(status=400, body=echo)]
    sleeps = Sleeps()
    embedder = make(stub, sleeps)
    with pytest.raises(EmbeddingError) as info:
        embedder.embed_documents(["x"])
    assert not isinstance(info.value, EmbeddingUnavailableError)
    assert "HTTP 400" in str(info.value)
    assert "input too long" in str(info.value)
    assert "***" in str(info.value)
    assert info.value.__cause__ is None and info.value.__suppress_context__
    _assert_no_key(info.value, info.value.args)
    assert len(stub.requests) == 1 and sleeps.delays == []


@pytest.mark.integration
def test_key_never_in_repr_str_or_errors(stub: Stub, tmp_path: Path) -> None:
    key_file = tmp_path / "key"
    key_file.write_text(KEY + "\n")
    config = OpenAIEmbedderConfig(
        base_url=stub.url,
        model="stub-embed",
        api_key_file=key_file,
        dimension=DIM,
        max_retries=0,
    )
    embedder = OpenAIEmbedder(config)
    embedder.embed_documents(["x"])
    assert stub.requests[-1][1]["authorization"] == f"Bearer {KEY}"
    inline = OpenAIEmbedderConfig(
        base_url=stub.url, model="m", api_key=SecretStr(KEY), dimension=DIM
    )
    _assert_no_key(config, embedder, inline, inline.model_dump(), inline.model_dump_json())
    embedder.close()


@pytest.mark.integration
def test_no_key_sends_placeholder(stub: Stub) -> None:
    embedder = make(stub, api_key=None)
    embedder.embed_documents(["x"])
    assert stub.requests[0][1]["authorization"] == "Bearer EMPTY"


@pytest.mark.integration
def test_connection_refused_is_retried_then_unavailable() -> None:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    sleeps = Sleeps()
    config = OpenAIEmbedderConfig(
        base_url=f"http://127.0.0.1:{port}/v1", model="m", dimension=DIM, max_retries=2
    )
    embedder = OpenAIEmbedder(config, sleep=sleeps)
    with pytest.raises(EmbeddingUnavailableError, match="connection error"):
        embedder.embed_documents(["x"])
    embedder.close()
    assert len(sleeps.delays) == 2


@pytest.mark.integration
def test_timeout_is_retried_then_unavailable(stub: Stub) -> None:
    stub.script = [Reply(delay_s=0.6), Reply(delay_s=0.6)]
    embedder = make(stub, timeout_s=0.2, max_retries=1)
    with pytest.raises(EmbeddingUnavailableError, match="timeout"):
        embedder.embed_documents(["x"])
    assert len(stub.requests) == 2


@pytest.mark.integration
def test_query_prefix_dimensions_check_and_close(stub: Stub) -> None:
    embedder = make(stub, query_prefix="query: ", document_prefix="doc: ", send_dimensions=True)
    vector = embedder.embed_query("hello")
    assert vector.shape == (DIM,)
    np.testing.assert_allclose(vector, expected(["query: hello"])[0], atol=1e-6)
    embedder.embed_documents(["hello"])
    assert inputs(stub) == [["query: hello"], ["doc: hello"]]
    assert all(body["dimensions"] == DIM for _, _, body in stub.requests)
    assert embedder.embed_documents([]).shape == (0, DIM)
    assert len(stub.requests) == 2
    embedder.check()
    embedder.close()
    embedder.close()
    with pytest.raises(EmbeddingError, match="closed"):
        embedder.check()


@pytest.mark.integration
def test_many_queries_go_in_requests_of_batch_size_with_the_query_prefix(stub: Stub) -> None:
    embedder = make(stub, query_prefix="query: ", document_prefix="doc: ")
    texts = [f"question {i}" for i in range(150)]
    vectors = embed_queries(embedder, texts)
    assert [len(batch) for batch in inputs(stub)] == [100, 50]
    assert [t for batch in inputs(stub) for t in batch] == [f"query: {t}" for t in texts]
    np.testing.assert_allclose(vectors, np.stack([embedder.embed_query(t) for t in texts]))
    assert embed_queries(embedder, []).shape == (0, DIM)
    embedder.close()


@pytest.mark.unit
def test_config_validation_and_spec() -> None:
    base: dict[str, Any] = {
        "base_url": "http://h/v1",
        "model": "text-embedding-3-small",
        "dimension": 1536,
    }
    with pytest.raises(ValidationError, match="less than or equal to 100"):
        OpenAIEmbedderConfig(**base, batch_size=101)
    with pytest.raises(ValidationError, match="not both"):
        OpenAIEmbedderConfig(**base, api_key=SecretStr("k"), api_key_file=Path("/k"))
    with pytest.raises(ValidationError, match="absolute http"):
        OpenAIEmbedderConfig(**{**base, "base_url": "localhost:8080"})
    with pytest.raises(ValidationError, match="credentials"):
        OpenAIEmbedderConfig(**{**base, "base_url": "https://u:p@h/v1"})
    with pytest.raises(ValidationError, match="backoff_max_s"):
        OpenAIEmbedderConfig(**base, backoff_base_s=2.0, backoff_max_s=1.0)
    spec = OpenAIEmbedderConfig(**base, version="2024-01").spec
    assert spec.model_version == "text-embedding-3-small@2024-01"
    assert spec.tokenizer == "tiktoken:cl100k_base"
    assert spec.dimension == 1536
