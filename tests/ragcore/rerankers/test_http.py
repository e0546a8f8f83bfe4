"""The HTTP reranker against a loopback stub of TEI `/rerank` and Cohere `/v1/rerank`."""

from __future__ import annotations

import functools
import json
import socket
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any, Literal

import pytest
from pydantic import SecretStr, ValidationError

from ragcore.rerankers import RerankError, RerankUnavailableError, build_reranker
from ragcore.rerankers.http import HttpReranker, HttpRerankerConfig, sigmoid
from retrieval_api.retriever import Reranker
from tests.http_stub import Response, ScriptedStub, Sleeps

KEY = "rk-test-Secret-4242"
QUERY = "pump pressure drop"
PASSAGES = [
    "the motor bearing is noisy",
    "pump pressure drop after the seal was replaced",
    "pressure sensor drift",
    "pump inspection report",
]


def overlap(query: str, text: str) -> float:
    """The stub's relevance: share of query words found in the text (in [0, 1])."""
    words = query.split()
    return sum(w in text.split() for w in words) / len(words)


@dataclass
class Reply:
    """One scripted answer: an error status, or a 200 with a twist."""

    status: int = 200
    headers: dict[str, str] = field(default_factory=dict)
    raw: bytes | None = None  # a body sent verbatim
    body: Any = None  # a JSON body sent as is
    logits: bool = False  # answer logit(score) instead of the probability
    drop_one: bool = False
    delay_s: float = 0.0


Stub = ScriptedStub[Reply, HttpReranker]


def _scores(reply: Reply, query: str, texts: list[str]) -> list[tuple[int, float]]:
    scored = [(i, overlap(query, t)) for i, t in enumerate(texts)]
    if reply.logits:
        scored = [(i, 8.0 * s - 4.0) for i, s in scored]
    # Both APIs answer best first, not in input order.
    scored.sort(key=lambda pair: -pair[1])
    if reply.drop_one:
        scored.pop()
    return scored


def _answer(stub: Stub, path: str, headers: dict[str, str], body: Any) -> Response:
    reply = stub.next_reply(path, headers, body)
    if reply.delay_s:
        time.sleep(reply.delay_s)
    if reply.raw is not None or reply.body is not None or reply.status != 200:
        payload = reply.raw if reply.raw is not None else json.dumps(reply.body).encode()
        return reply.status, payload, reply.headers
    if path == "/rerank":
        answer: Any = [
            {"index": i, "score": s} for i, s in _scores(reply, body["query"], body["texts"])
        ]
    elif path == "/v1/rerank":
        scored = _scores(reply, body["query"], body["documents"])[: body["top_n"]]
        answer = {
            "id": "stub",
            "results": [{"index": i, "relevance_score": s} for i, s in scored],
            "meta": {},
        }
    else:
        return 404, b'{"error": "no route"}', {}
    return 200, json.dumps(answer).encode(), reply.headers


@pytest.fixture
def stub() -> Iterator[Stub]:
    stub = Stub(Reply)
    with stub.serving(functools.partial(_answer, stub)):
        yield stub


def make(
    stub: Stub,
    api: Literal["tei", "cohere"] = "tei",
    sleeps: Sleeps | None = None,
    rand: Callable[[], float] = lambda: 0.5,
    **overrides: Any,
) -> HttpReranker:
    settings: dict[str, Any] = {
        "api": api,
        "base_url": stub.url,
        "model": "stub-rerank" if api == "cohere" else None,
        "api_key": SecretStr(KEY),
        "max_retries": 2,
        "backoff_base_s": 0.1,
        "backoff_max_s": 1.0,
    }
    settings.update(overrides)
    reranker = HttpReranker(
        HttpRerankerConfig(**settings), sleep=sleeps if sleeps is not None else Sleeps(), rand=rand
    )
    stub.clients.append(reranker)
    return reranker


def _assert_no_key(*objects: object) -> None:
    for obj in objects:
        assert KEY not in str(obj)
        assert KEY not in repr(obj)


@pytest.mark.integration
@pytest.mark.parametrize("api", ["tei", "cohere"])
def test_scores_come_back_in_input_order(stub: Stub, api: Literal["tei", "cohere"]) -> None:
    reranker = make(stub, api)
    port: Reranker = reranker  # the Retriever's port, checked statically (mypy)
    assert port is reranker
    scores = reranker.score(QUERY, PASSAGES)
    assert scores == [overlap(QUERY, p) for p in PASSAGES]
    assert scores.index(max(scores)) == 1  # the stub answered it first: mapped back by index
    ((path, headers, body),) = stub.requests
    assert headers["authorization"] == f"Bearer {KEY}"
    if api == "tei":
        assert path == "/rerank"
        assert body == {"query": QUERY, "texts": PASSAGES, "raw_scores": False, "truncate": True}
    else:
        assert path == "/v1/rerank"
        assert body == {
            "model": "stub-rerank",
            "query": QUERY,
            "documents": PASSAGES,
            "top_n": len(PASSAGES),
        }


@pytest.mark.integration
def test_passages_are_sent_in_batches_and_empty_input_sends_nothing(stub: Stub) -> None:
    reranker = make(stub, batch_size=3)
    passages = PASSAGES * 2
    assert reranker.score(QUERY, passages) == [overlap(QUERY, p) for p in passages]
    assert [len(body["texts"]) for _, _, body in stub.requests] == [3, 3, 2]
    assert reranker.score(QUERY, []) == []
    assert len(stub.requests) == 3


@pytest.mark.integration
@pytest.mark.parametrize("api", ["tei", "cohere"])
def test_a_5xx_is_retried_with_backoff_then_succeeds(
    stub: Stub, api: Literal["tei", "cohere"]
) -> None:
    sleeps = Sleeps()
    stub.script = [Reply(status=500, body={"error": "warming up"})]
    reranker = make(stub, api, sleeps=sleeps, rand=lambda: 1.0)
    assert reranker.score(QUERY, PASSAGES) == [overlap(QUERY, p) for p in PASSAGES]
    assert len(stub.requests) == 2
    assert sleeps.delays == [pytest.approx(0.1)]  # base 0.1, jitter at its maximum


@pytest.mark.integration
def test_retries_are_bounded_and_end_unavailable(stub: Stub) -> None:
    sleeps = Sleeps()
    stub.script = [Reply(status=503, body={"error": "down"})] * 3
    reranker = make(stub, sleeps=sleeps, rand=lambda: 0.0)
    with pytest.raises(RerankUnavailableError, match="HTTP 503 after 3 attempts") as info:
        reranker.score(QUERY, PASSAGES)
    assert info.value.code == "RERANK_UNAVAILABLE"
    assert len(stub.requests) == 3
    assert sleeps.delays == [pytest.approx(0.05), pytest.approx(0.1)]  # equal jitter, doubling


@pytest.mark.integration
def test_a_5xx_retry_after_beyond_the_backoff_cap_goes_to_the_caller(stub: Stub) -> None:
    stub.script = [Reply(status=503, headers={"Retry-After": "30"}, body={"error": "x"})]
    with pytest.raises(RerankUnavailableError) as info:
        make(stub).score(QUERY, PASSAGES)
    assert info.value.retry_after == 30.0
    assert len(stub.requests) == 1


@pytest.mark.integration
@pytest.mark.parametrize("api", ["tei", "cohere"])
def test_429_is_unavailable_with_retry_after_and_not_retried(
    stub: Stub, api: Literal["tei", "cohere"]
) -> None:
    sleeps = Sleeps()
    stub.script = [Reply(status=429, headers={"Retry-After": "7"}, body={"error": "slow down"})]
    with pytest.raises(RerankUnavailableError, match="HTTP 429") as info:
        make(stub, api, sleeps=sleeps).score(QUERY, PASSAGES)
    assert info.value.retry_after == 7.0
    assert isinstance(info.value, RerankError)
    assert len(stub.requests) == 1
    assert sleeps.delays == []


@pytest.mark.integration
def test_a_timeout_is_retried(stub: Stub) -> None:
    sleeps = Sleeps()
    stub.script = [Reply(delay_s=1.0)]
    reranker = make(stub, sleeps=sleeps, timeout_s=0.2)
    assert reranker.score(QUERY, PASSAGES) == [overlap(QUERY, p) for p in PASSAGES]
    assert len(stub.requests) == 2
    assert len(sleeps.delays) == 1


@pytest.mark.integration
def test_a_refused_connection_is_retried_then_unavailable(stub: Stub) -> None:
    with socket.socket() as sock:  # a loopback port nothing listens on
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    sleeps = Sleeps()
    reranker = make(stub, sleeps=sleeps, base_url=f"http://127.0.0.1:{port}", max_retries=1)
    with pytest.raises(RerankUnavailableError, match="connection error: ConnectError after 2"):
        reranker.score(QUERY, PASSAGES)
    assert len(sleeps.delays) == 1


@pytest.mark.integration
def test_a_4xx_is_rejected_at_once_with_the_server_message(stub: Stub) -> None:
    stub.script = [
        Reply(status=413, body={"error": "batch size 40 > maximum allowed batch size 32"})
    ]
    with pytest.raises(RerankError, match=r"HTTP 413\): batch size 40") as info:
        make(stub).score(QUERY, PASSAGES)
    assert not isinstance(info.value, RerankUnavailableError)
    assert info.value.code == "RERANK_FAILED"
    assert len(stub.requests) == 1


@pytest.mark.integration
@pytest.mark.parametrize(
    ("reply", "message"),
    [
        (Reply(raw=b"<html>oops</html>"), "not JSON"),
        (Reply(body={"results": []}), "expected a list"),
        (Reply(drop_one=True), "3 scores for 4 passages"),
        (Reply(body=[{"index": 0, "score": 0.5}] * 4), "not a permutation"),
        (Reply(body=[{"index": i, "score": "high"} for i in range(4)]), "not a finite number"),
        (Reply(body=[{"index": True, "score": 0.5}] * 4), "not a permutation"),
        (Reply(body=[{"index": i} for i in range(4)]), "not a finite number"),
    ],
)
def test_a_malformed_answer_is_a_rerank_error(stub: Stub, reply: Reply, message: str) -> None:
    stub.script = [reply]
    with pytest.raises(RerankError, match=message) as info:
        make(stub).score(QUERY, PASSAGES)
    assert not isinstance(info.value, RerankUnavailableError)
    assert len(stub.requests) == 1  # not retried


@pytest.mark.integration
def test_a_cohere_answer_without_results_is_malformed(stub: Stub) -> None:
    stub.script = [Reply(body=[{"index": 0, "relevance_score": 1.0}])]
    with pytest.raises(RerankError, match="`results` list"):
        make(stub, "cohere").score(QUERY, PASSAGES)


@pytest.mark.integration
@pytest.mark.parametrize("api", ["tei", "cohere"])
def test_scores_outside_0_1_are_an_error_unless_declared_logits(
    stub: Stub, api: Literal["tei", "cohere"]
) -> None:
    stub.script = [Reply(logits=True)]
    with pytest.raises(RerankError, match=r"outside \[0, 1\]; set scores_are_logits"):
        make(stub, api).score(QUERY, PASSAGES)
    stub.script = [Reply(logits=True)]
    scores = make(stub, api, scores_are_logits=True).score(QUERY, PASSAGES)
    assert scores == pytest.approx([sigmoid(8.0 * overlap(QUERY, p) - 4.0) for p in PASSAGES])
    assert all(0.0 < s < 1.0 for s in scores)


@pytest.mark.unit
def test_sigmoid_is_stable_at_the_extremes() -> None:
    assert sigmoid(0.0) == 0.5
    assert sigmoid(1000.0) == 1.0
    assert sigmoid(-1000.0) == 0.0
    assert sigmoid(2.0) == pytest.approx(1 - sigmoid(-2.0))


@pytest.mark.integration
def test_the_key_never_shows_in_repr_or_errors(stub: Stub) -> None:
    reranker = make(stub)
    # A server that echoes the request headers in its error message.
    stub.script = [Reply(status=401, body={"error": f"bad token Bearer {KEY}"})]
    with pytest.raises(RerankError) as info:
        reranker.score(QUERY, PASSAGES)
    assert "***" in str(info.value)
    stub.script = [Reply(status=429, body={"error": KEY})]
    with pytest.raises(RerankUnavailableError) as unavailable:
        reranker.score(QUERY, PASSAGES)
    _assert_no_key(reranker, reranker.config, info.value, unavailable.value)
    assert KEY not in reranker.config.model_dump_json()


@pytest.mark.integration
def test_key_file_and_no_key(stub: Stub, tmp_path: Any) -> None:
    key_file = tmp_path / "key"
    key_file.write_text(KEY + "\n")
    make(stub, api_key=None, api_key_file=key_file).score(QUERY, PASSAGES[:1])
    make(stub, api_key=None).score(QUERY, PASSAGES[:1])
    assert stub.requests[0][1]["authorization"] == f"Bearer {KEY}"
    assert "authorization" not in stub.requests[1][1]


@pytest.mark.integration
def test_check_close_and_build_reranker(stub: Stub) -> None:
    reranker = build_reranker(HttpRerankerConfig(base_url=stub.url + "/"))
    assert isinstance(reranker, HttpReranker)
    reranker.check()
    assert stub.requests[0][0] == "/rerank"
    reranker.close()
    reranker.close()
    with pytest.raises(RerankError, match="closed"):
        reranker.score(QUERY, PASSAGES)


@pytest.mark.unit
@pytest.mark.parametrize(
    ("settings", "message"),
    [
        ({"base_url": "ftp://x"}, "absolute http"),
        ({"base_url": "http://user:pw@tei:8080"}, "credentials"),
        ({"base_url": "http://tei", "api": "cohere"}, "needs `model`"),
        ({"base_url": "http://tei", "api_key": "a", "api_key_file": "/k"}, "not both"),
        ({"base_url": "http://tei", "backoff_base_s": 2, "backoff_max_s": 1}, "backoff_max_s"),
    ],
)
def test_config_is_validated(settings: dict[str, Any], message: str) -> None:
    with pytest.raises(ValidationError, match=message):
        HttpRerankerConfig(**settings)
