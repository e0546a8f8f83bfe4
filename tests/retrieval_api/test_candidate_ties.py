"""Equal scores at the candidate limit are cut by point id, not by the engine's storage order,
so two builds of the same index give the same candidates (and the same calibration)."""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from pathlib import Path

import pytest
from prometheus_client import CollectorRegistry

from ragcore.embedders.local_onnx import LocalOnnxEmbedder
from ragcore.kafka_config import KafkaSettings
from ragcore.quality.dataset import EvalEntity, EvalSet
from ragcore.settings import StoreSettings
from ragcore.sparse import Bm25Encoder, LexiconStats
from ragcore.store.base import ScoredHit, StoreFilter
from ragcore.store.edge import EdgeStore
from ragcore.store.registry import FileIndexRegistry
from ragdev.eval.runner import _records
from retrieval_api.calibration import index_chunks
from retrieval_api.candidates import MAX_TIE_FETCH, CandidateSearch, settled
from retrieval_api.pipeline_settings import RetrievalConfig
from streams.app import build_worker
from streams.settings import IngestSettings


def hit(point: str, score: float) -> ScoredHit:
    return ScoredHit(point_id=point, score=score, payload={})


class Branch:
    """A branch whose engine returns tied hits in a fixed, arbitrary order."""

    def __init__(self, hits: Sequence[ScoredHit]) -> None:
        self.hits = list(hits)
        self.calls: list[int] = []

    def __call__(self, k: int) -> Sequence[ScoredHit]:
        self.calls.append(k)
        return self.hits[:k]


@pytest.mark.unit
def test_a_tie_across_the_limit_is_fetched_whole_and_cut_by_point_id() -> None:
    # the engine's order inside the tie (0.5) is z, y, x, ... ; the cut must not depend on it
    tied = [hit(p, 0.5) for p in "zyxwvu"]
    branch = Branch([hit("top", 0.9), *tied, hit("low", 0.1)])
    got = settled(branch(3 + 1), 3, branch)
    assert [h.point_id for h in got] == ["top", "u", "v"]
    assert branch.calls == [4, 8]  # the first call, then one more until the tie closed


@pytest.mark.unit
def test_no_tie_at_the_limit_costs_no_second_search() -> None:
    branch = Branch([hit("b", 0.9), hit("a", 0.9), hit("c", 0.5), hit("d", 0.4)])
    got = settled(branch(2 + 1), 2, branch)
    assert [h.point_id for h in got] == ["a", "b"]  # a tie inside the cut is ordered too
    assert branch.calls == [3]
    short = Branch([hit("a", 0.5), hit("b", 0.5)])
    assert [h.point_id for h in settled(short(5), 4, short)] == ["a", "b"]
    assert short.calls == [5]


@pytest.mark.unit
def test_a_huge_tie_is_fetched_up_to_a_bound() -> None:
    branch = Branch([hit(f"p{n:04d}", 0.5) for n in range(1000)])
    got = settled(branch(2 + 1), 2, branch)
    assert len(got) == 2
    assert max(branch.calls) == MAX_TIE_FETCH * 2


TEMPLATE = "Ticket {code}: the search page was slow for the customer today."


@pytest.fixture
def built(
    tmp_path: Path, embedder: LocalOnnxEmbedder
) -> Iterator[list[tuple[CandidateSearch, EdgeStore, FileIndexRegistry]]]:
    """Two builds of one index from the same rows written in opposite orders."""
    entities = [
        EvalEntity(
            entity_id=f"t-{n}",
            tenant="acme",
            entity_type="TICKET",
            content=TEMPLATE.format(code=f"TK{n:03d}"),
        )
        for n in range(30)
    ]
    searches: list[tuple[CandidateSearch, EdgeStore, FileIndexRegistry]] = []
    closers = []
    for name, order in (("forward", entities), ("reverse", entities[::-1])):
        root = tmp_path / name
        store = EdgeStore(root)
        worker = build_worker(
            IngestSettings(
                kafka=KafkaSettings(bootstrap_servers="127.0.0.1:1"),  # never contacted
                store=StoreSettings(data_dir=root),
                embedding_cache=None,
            ),
            CollectorRegistry(),
            store=store,
            embedder=embedder,
        )
        evalset = EvalSet(name=name, version="1", entities=tuple(order), queries=())
        for record in _records(evalset):  # one write each: the storage order is the row order
            assert not worker.handler.handle([record])
        registry = FileIndexRegistry(root, store)
        search = CandidateSearch(
            config=RetrievalConfig(), encoder=Bm25Encoder(), store=store, registry=registry
        )
        searches.append((search, store, registry))
        closers.extend([worker.close, store.close])
    try:
        yield searches
    finally:
        for close in closers:
            close()


@pytest.mark.integration
def test_two_builds_written_in_other_orders_give_the_same_candidates(
    built: list[tuple[CandidateSearch, EdgeStore, FileIndexRegistry]],
    embedder: LocalOnnxEmbedder,
) -> None:
    text = "slow search page"
    vector = embedder.embed_query(text)
    pools = []
    for search, store, registry in built:
        index = registry.lookup("acme", None)
        lexicon = LexiconStats.build(
            (c.text for c in index_chunks(store, index.collection, "acme")),
            search.encoder,
        )
        # every ticket scores the same BM25 (same words, same length): the sparse branch's
        # top 5 is a tie of 30, which the engine returns in storage order
        raw = search.gather(
            index.collection,
            text,
            vector,
            StoreFilter(tenant_id="acme"),
            limit=5,
            lexicon=lexicon,
            with_rerank=False,
        )
        pools.append([h.chunk_id for h in raw.hits])
    assert pools[0] == pools[1]
    assert len(pools[0]) >= 5
