"""The calibration's feature rows, computed once per pool, score every pool exactly as
`pool_evidence` does (retrieval_api.calibration._PoolRows): with channels that found only
part of the pool too, whose own pools `pool_evidence` scores apart."""

from __future__ import annotations

from dataclasses import replace

import pytest

from ragcore.sparse import Bm25Encoder, LexiconStats
from retrieval_api import calibration
from retrieval_api.candidates import RawPool, channel_pools, pool_evidence
from retrieval_api.evidence_score import CHUNK_FEATURES
from retrieval_api.prior import prior_calibration
from tests.retrieval_api.test_calibration_threshold import _examples

pytestmark = pytest.mark.unit


def _split_channels(raw: RawPool, n: int) -> RawPool:
    """`raw` with some candidates found by one channel alone (varying with `n`)."""
    hits = tuple(
        replace(
            h,
            dense_rank=None if (i + n) % 3 == 1 else h.dense_rank,
            sparse_rank=None if (i + n) % 3 == 2 else h.sparse_rank,
        )
        for i, h in enumerate(raw.hits)
    )
    return replace(raw, hits=hits)


def test_pool_rows_give_pool_evidence_for_every_model() -> None:
    examples = _examples(40, 40, seed=3)
    for n, e in enumerate(examples):
        if n % 4:  # a quarter keeps both channels over the whole pool
            e.raw = _split_channels(e.raw, n)
    assert sum(len(channel_pools(e.raw)) == 2 for e in examples) > 30
    prior = prior_calibration(LexiconStats.build(["a b c"], Bm25Encoder()))
    model, query_model = calibration._fit_models(examples, CHUNK_FEATURES, 1.0)
    fitted = replace(prior, model=model, query_model=query_model, source="fitted")
    empty = calibration._Example(examples[0].query, RawPool(examples[0].raw.query, (), ()), [])
    for scorer in (prior, fitted):
        for e in (*examples, empty):
            assert e.features.evidence(scorer) == pool_evidence(e.raw, scorer)
