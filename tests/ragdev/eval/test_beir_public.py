"""The default never loses to one of its own channels on public BEIR sets (issue 26, item 5).

Runs what a user runs (`ragstream eval --dataset beir:DIR --configs
default,dense_only,bm25_only`) on public BEIR-format samples that are not part of the
repository's tuning data, and requires the default's nDCG@10 to be at least each single
channel's minus 0.01.

The data is third-party and never committed: it is read from `$RAGSTREAM_BEIR_DATA/<name>/`.
How to obtain it: docs/decisions/fusion-weights-from-held-out-evidence.md ("Data"). Without it
the test skips (`external`). Opt-in by that variable, not found beside the checkout: a few
minutes per set on 2 cores (indexing 5,000 passages; 267 s for both at load 3-6), more than the
suite's budget. It runs calibration seed 0 only (dbpedia: -0.009 nDCG@10 against dense only,
the thinnest margin of seeds 0-9 with seed 5); other seeds: the decision record ("The vote on
every practice query": met at all ten on both sets).
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from ragdev.eval.beir import load_beir
from ragdev.eval.configs import DEFAULT_CONFIGS
from ragdev.eval.runner import run_eval

pytestmark = pytest.mark.external

#: entity search (DBpedia-Entity) and web passages (MS MARCO, TREC-DL 2019 judgments)
SETS = ("dbpedia", "msmarco")
#: the issue's tolerance: the default may trail a single channel by at most this nDCG@10
TOLERANCE = 0.01


def find_beir_data() -> Path | None:
    """`$RAGSTREAM_BEIR_DATA` when it names a directory; None otherwise."""
    configured = os.environ.get("RAGSTREAM_BEIR_DATA")
    return Path(configured) if configured and Path(configured).is_dir() else None


BEIR_DATA = find_beir_data()


@pytest.mark.parametrize("name", SETS)
def test_default_is_not_beaten_by_a_single_channel(name: str, tmp_path: Path) -> None:
    if BEIR_DATA is None or not (BEIR_DATA / name / "corpus.jsonl").is_file():
        pytest.skip(f"no public BEIR sample {name!r}: set RAGSTREAM_BEIR_DATA (see the docstring)")
    evalset = load_beir(BEIR_DATA / name, name=name)
    names = ("default", "dense_only", "bm25_only")
    results = run_eval(
        evalset,
        configs={n: DEFAULT_CONFIGS[n] for n in names},
        progress=False,
        cache_dir=tmp_path / "cache",
    )
    ndcg: dict[str, float] = {}
    for r in results:
        value = r.result.aggregates["ndcg@10"]
        assert value is not None, r.name
        ndcg[r.name] = value
    assert set(ndcg) == set(names)
    for channel in ("dense_only", "bm25_only"):
        assert ndcg["default"] >= ndcg[channel] - TOLERANCE, ndcg
