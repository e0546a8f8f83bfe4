"""The error taxonomy: every backpressure error is an `UnavailableError` with its own code."""

from __future__ import annotations

import pytest

from ragcore import errors
from ragcore.errors import RagstreamError, UnavailableError
from ragcore.rerankers import RerankError, RerankUnavailableError

pytestmark = pytest.mark.unit


@pytest.mark.parametrize(
    ("error", "family", "code"),
    [
        (errors.EmbeddingUnavailableError, errors.EmbeddingError, "EMBEDDING_UNAVAILABLE"),
        (errors.StoreUnavailableError, errors.StoreError, "STORE_UNAVAILABLE"),
        (RerankUnavailableError, RerankError, "RERANK_UNAVAILABLE"),
        (errors.SorUnavailableError, RagstreamError, "SOR_UNAVAILABLE"),
        (errors.DeadLetterUnavailableError, RagstreamError, "DLQ_UNAVAILABLE"),
    ],
)
def test_each_unavailable_error_keeps_its_family_and_code_and_carries_the_hint(
    error: type[UnavailableError], family: type[RagstreamError], code: str
) -> None:
    raised = error("busy", retry_after=2.5)
    assert isinstance(raised, family) and isinstance(raised, UnavailableError)
    assert (raised.code, raised.message, raised.retry_after) == (code, "busy", 2.5)
    assert error("down").retry_after is None
