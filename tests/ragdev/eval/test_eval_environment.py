"""`ragstream eval` takes its base retrieval settings from `RAGSTREAM_RETRIEVAL__*`, as
`ragstream serve` does, so a setting can be A/B-tested without an eval configuration."""

from __future__ import annotations

import pytest

from ragdev.eval.runner import retrieval_from_environment
from retrieval_api.pipeline_settings import RetrievalConfig

pytestmark = pytest.mark.unit


def test_no_retrieval_variables_give_the_defaults(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("RAGSTREAM_RETRIEVAL__HYBRID", raising=False)
    monkeypatch.delenv("RAGSTREAM_RETRIEVAL__DENSE_WEIGHT", raising=False)
    config, changed = retrieval_from_environment()
    assert config == RetrievalConfig()
    assert changed == {}


def test_retrieval_variables_become_the_base_and_are_named(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("RAGSTREAM_RETRIEVAL__HYBRID", "false")
    monkeypatch.setenv("RAGSTREAM_RETRIEVAL__DENSE_WEIGHT", "0.8")
    monkeypatch.setenv("RAGSTREAM_GRPC__PORT", "not a port")  # another service's: not read
    config, changed = retrieval_from_environment()
    assert config.hybrid is False
    assert config.dense_weight == 0.8
    assert changed == {"hybrid": False, "dense_weight": 0.8}


def test_an_invalid_retrieval_variable_is_refused(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("RAGSTREAM_RETRIEVAL__DENSE_WEIGHT", "heavy")
    with pytest.raises(ValueError, match="dense_weight"):
        retrieval_from_environment()
