"""Lexical baselines beside the real Retrieve path: bm25s and our own BM25, in process.

`ragstream eval --baselines bm25s` adds these rows to a run, scored by the same metrics on the
same queries (paired tests apply):

- `bm25s`: the bm25s library (Lucene BM25, k1 1.5, b 0.75, its English stopwords and a
  PyStemmer English stemmer), over each entity's content;
- `bm25s_k1.2`: the same with k1 1.2, our parameter;
- `ragstream_bm25_doc`: our tokenizer (identifiers whole and split, Snowball stems) and exact
  BM25 (`ragcore.sparse.Bm25Scorer`, k1 1.2, b 0.75, the corpus' own average length) over the
  same whole documents: the library comparison without chunking in between.

The system's own lexical channel (`bm25_only`, through gRPC Retrieve) ranks chunks (entity =
its best chunk), so its difference to `ragstream_bm25_doc` is the effect of chunking.
A baseline never abstains: abstention metrics are undefined for it.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence

import bm25s  # type: ignore[import-untyped]
import numpy as np
import Stemmer  # type: ignore[import-not-found]

from ragcore.quality.dataset import EvalSet
from ragcore.quality.metrics import EvalResult, QueryRun, Status, evaluate
from ragcore.sparse import Bm25Encoder, Bm25Scorer, LexiconStats

Baseline = Callable[[EvalSet, int], EvalResult]


def _by_tenant(evalset: EvalSet) -> dict[str, list[int]]:
    groups: dict[str, list[int]] = {}
    for i, entity in enumerate(evalset.entities):
        groups.setdefault(entity.tenant, []).append(i)
    return groups


def bm25s_runs(evalset: EvalSet, top_k: int, *, k1: float = 1.5, b: float = 0.75) -> EvalResult:
    """The bm25s library over each tenant's entity contents (see the module docstring)."""
    stemmer = Stemmer.Stemmer("english")
    runs: list[QueryRun] = []
    for tenant, members in sorted(_by_tenant(evalset).items()):
        ids = [evalset.entities[i].entity_id for i in members]
        corpus = [evalset.entities[i].content for i in members]
        tokens = bm25s.tokenize(corpus, stopwords="en", stemmer=stemmer, show_progress=False)
        model = bm25s.BM25(k1=k1, b=b)
        model.index(tokens, show_progress=False)
        for query in evalset.queries_of(tenant):
            began = time.perf_counter()
            q = bm25s.tokenize([query.text], stopwords="en", stemmer=stemmer, show_progress=False)
            k = min(top_k, len(ids))
            if not q.vocab:
                ranked: list[str] = []
            else:
                docs, scores = model.retrieve(q, k=k, show_progress=False)
                ranked = [ids[int(d)] for d, s in zip(docs[0], scores[0], strict=True) if s > 0]
            runs.append(_run(query.query_id, ranked, began))
    return evaluate(evalset, runs)


def ragstream_doc_runs(evalset: EvalSet, top_k: int) -> EvalResult:
    """Our tokenizer and exact BM25 over whole documents (see the module docstring)."""
    encoder = Bm25Encoder()
    runs: list[QueryRun] = []
    for tenant, members in sorted(_by_tenant(evalset).items()):
        ids = [evalset.entities[i].entity_id for i in members]
        corpus = [evalset.entities[i].content for i in members]
        scorer = Bm25Scorer(encoder, LexiconStats.build(corpus, encoder))
        for query in evalset.queries_of(tenant):
            began = time.perf_counter()
            lexical = scorer.query(query.text)
            scores = np.array([m.score for m in scorer.match_all(lexical, corpus)])
            order = [int(i) for i in np.argsort(-scores, kind="stable")[:top_k] if scores[i] > 0]
            runs.append(_run(query.query_id, [ids[i] for i in order], began))
    return evaluate(evalset, runs)


def _run(query_id: str, ranked: Sequence[str], began: float) -> QueryRun:
    return QueryRun(
        query_id,
        Status.SUCCESS if ranked else Status.NO_EVIDENCE,
        entity_ids=tuple(ranked),
        latency_ms=(time.perf_counter() - began) * 1000,
    )


BASELINES: dict[str, Baseline] = {
    "bm25s": bm25s_runs,
    "bm25s_k1.2": lambda evalset, top_k: bm25s_runs(evalset, top_k, k1=1.2),
    "ragstream_bm25_doc": ragstream_doc_runs,
}
