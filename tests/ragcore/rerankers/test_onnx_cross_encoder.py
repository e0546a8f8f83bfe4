"""The local ONNX cross-encoder on a tiny generated model (see tiny_model.py)."""

from __future__ import annotations

import hashlib
import shutil
from pathlib import Path

import numpy as np
import pytest

from ragcore.errors import ConfigError
from ragcore.fusion import FusedHit
from ragcore.rerankers import RerankError, build_reranker
from ragcore.rerankers.onnx_cross_encoder import OnnxCrossEncoder, OnnxRerankerConfig
from ragcore.store.base import StoreFilter
from retrieval_api.pipeline_settings import RetrievalConfig
from retrieval_api.ranking import Confidence, ExclusionReason, ScoreKind, calibrate, rank
from retrieval_api.retriever import Reranker
from tests.ragcore.rerankers.tiny_model import BIAS, reference_score, write_model_dir

pytestmark = pytest.mark.unit

QUERY = "pump pressure drop"
PASSAGES = [
    "motor bearing noise",  # nothing in common with the query
    "pump pressure drop after the seal was replaced",
    "the pressure sensor drift",
    "Pumps leak",  # "pump" + "##s"
    "oil temperature high",
    "pump pressure drop",
    "",
]
UNRELATED = 1.0 / (1.0 + np.exp(-BIAS))  # the score of a pair sharing no word


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return write_model_dir(tmp_path_factory.mktemp("tiny-cross-encoder"))


def make(model_dir: Path, **overrides: object) -> OnnxCrossEncoder:
    return OnnxCrossEncoder(OnnxRerankerConfig(model_dir=model_dir, **overrides))  # type: ignore[arg-type]


def test_scores_are_the_model_s_sigmoid_in_input_order(model_dir: Path) -> None:
    reranker = make(model_dir)
    port: Reranker = reranker  # the Retriever's port, checked statically (mypy)
    scores = port.score(QUERY, PASSAGES)
    assert len(scores) == len(PASSAGES)
    assert scores == pytest.approx([reference_score(QUERY, p) for p in PASSAGES], abs=1e-6)
    assert all(0.0 < s < 1.0 for s in scores)
    assert reranker.score(QUERY, PASSAGES) == scores  # deterministic, bit for bit
    assert reranker.score(QUERY, []) == []


def test_a_passage_sharing_the_query_s_words_scores_higher(model_dir: Path) -> None:
    by_passage = dict(zip(PASSAGES, make(model_dir).score(QUERY, PASSAGES), strict=True))
    # Orthonormal word embeddings: no shared word gives exactly the bias.
    for unrelated in ("motor bearing noise", "oil temperature high", ""):
        assert by_passage[unrelated] == pytest.approx(UNRELATED, abs=1e-6)
    for related in [*PASSAGES[1:4], "pump pressure drop"]:
        assert by_passage[related] > UNRELATED + 0.01
    # The more of the query a passage holds (and the less else), the higher it scores.
    assert by_passage["pump pressure drop"] == max(by_passage.values())
    assert by_passage["pump pressure drop"] > by_passage[PASSAGES[1]] > by_passage[PASSAGES[2]]


def test_batching_and_length_sorting_equal_one_by_one(model_dir: Path) -> None:
    batched = make(model_dir, batch_size=3).score(QUERY, PASSAGES)
    single = [make(model_dir, batch_size=1).score(QUERY, [p])[0] for p in PASSAGES]
    np.testing.assert_allclose(batched, single, rtol=0, atol=1e-6)


def test_long_passages_are_truncated_to_max_length(model_dir: Path) -> None:
    long_passage = " ".join(["pump", "leak"] + ["the motor bearing noise"] * 200)
    reranker = make(model_dir, max_length=16)
    (score,) = reranker.score(QUERY, [long_passage])
    # [CLS] + 3 query tokens + [SEP] + passage + [SEP] = 16: the passage keeps 10 tokens.
    head = " ".join(long_passage.split()[:10])
    assert score == pytest.approx(reference_score(QUERY, head), abs=1e-6)
    assert score == pytest.approx(reference_score(QUERY, long_passage, max_length=16), abs=1e-6)
    # Untruncated, the filler would dilute the shared words far more.
    assert score > reference_score(QUERY, long_passage) + 0.02
    # A query longer than max_length is truncated too ("longest first"), never an error.
    (both_long,) = reranker.score(" ".join(["pump"] * 100), [long_passage])
    assert both_long == pytest.approx(
        reference_score(" ".join(["pump"] * 100), long_passage, max_length=16), abs=1e-6
    )


def test_an_output_of_shape_batch_is_accepted(tmp_path: Path, model_dir: Path) -> None:
    squeezed = write_model_dir(tmp_path / "squeezed", squeeze=True)
    assert make(squeezed).score(QUERY, PASSAGES) == pytest.approx(
        make(model_dir).score(QUERY, PASSAGES), abs=1e-7
    )


def test_hf_export_layout_and_sha256_pins(tmp_path: Path, model_dir: Path) -> None:
    layout = tmp_path / "hf"
    (layout / "onnx").mkdir(parents=True)
    shutil.copy(model_dir / "model.onnx", layout / "onnx" / "model.onnx")
    shutil.copy(model_dir / "tokenizer.json", layout / "tokenizer.json")
    onnx_sha = hashlib.sha256((model_dir / "model.onnx").read_bytes()).hexdigest()
    tok_sha = hashlib.sha256((model_dir / "tokenizer.json").read_bytes()).hexdigest()
    make(layout, onnx_sha256=onnx_sha, tokenizer_sha256=tok_sha).check()
    with pytest.raises(ConfigError, match=r"sha256 of .*model\.onnx does not match"):
        make(layout, onnx_sha256="0" * 64)
    with pytest.raises(ConfigError, match=r"sha256 of .*tokenizer\.json does not match"):
        make(layout, tokenizer_sha256="0" * 64)


def test_missing_files_are_config_errors_naming_the_path(tmp_path: Path, model_dir: Path) -> None:
    empty = tmp_path / "empty"
    empty.mkdir()
    with pytest.raises(ConfigError, match="no ONNX model file") as info:
        make(empty)
    assert str(empty / "model.onnx") in str(info.value)
    no_tokenizer = tmp_path / "no-tokenizer"
    no_tokenizer.mkdir()
    shutil.copy(model_dir / "model.onnx", no_tokenizer / "model.onnx")
    with pytest.raises(ConfigError) as info:
        make(no_tokenizer)
    assert str(no_tokenizer / "tokenizer.json") in str(info.value)


def test_unusable_files_are_config_errors(tmp_path: Path, model_dir: Path) -> None:
    broken = tmp_path / "broken"
    broken.mkdir()
    (broken / "model.onnx").write_bytes(b"not a model")
    (broken / "tokenizer.json").write_text("{}")
    with pytest.raises(ConfigError, match="cannot parse tokenizer"):
        make(broken)
    shutil.copy(model_dir / "tokenizer.json", broken / "tokenizer.json")
    with pytest.raises(ConfigError, match="cannot load ONNX model"):
        make(broken)
    wide = write_model_dir(tmp_path / "wide", logit_width=2)
    with pytest.raises(ConfigError, match="one relevance logit per pair"):
        make(wide)
    renamed = write_model_dir(
        tmp_path / "renamed", input_names=("input_ids", "attention_mask", "segment_ids")
    )
    with pytest.raises(ConfigError, match="unsupported inputs"):
        make(renamed)


def test_build_reranker_check_and_close(model_dir: Path) -> None:
    reranker = build_reranker(OnnxRerankerConfig(model_dir=model_dir, batch_size=4))
    assert isinstance(reranker, OnnxCrossEncoder)
    reranker.check()
    reranker.close()
    with pytest.raises(RerankError, match="closed"):
        reranker.score(QUERY, PASSAGES)


def _hit(i: int, text: str) -> FusedHit:
    return FusedHit(
        point_id=f"p{i}",
        chunk_id=f"c{i}",
        score=1.0 / (60 + i),  # fusion order: the input order
        dense_score=0.9,  # every cosine clears its thresholds: only the rerank score can fail
        dense_rank=i + 1,
        sparse_score=None,
        sparse_rank=None,
        payload={"tenant_id": "acme", "entity_id": f"e{i}", "chunk_id": f"c{i}", "text": text},
    )


def test_thresholds_and_order_apply_to_the_rerank_score(model_dir: Path) -> None:
    hits = [_hit(i, text) for i, text in enumerate(PASSAGES)]
    scores = make(model_dir).score(QUERY, [str(h.payload["text"]) for h in hits])
    config = RetrievalConfig(rerank_enabled=True)  # rerank thresholds 0.10 / 0.50 / 0.80
    thresholds = config.thresholds(ScoreKind.RERANK, override=0.2)  # above the no-overlap score
    ranking = rank(
        calibrate(hits, rerank_scores={h.point_id: s for h, s in zip(hits, scores, strict=True)}),
        store_filter=StoreFilter(tenant_id="acme"),
        top_k=10,
        thresholds=thresholds,
        score_kind=ScoreKind.RERANK,
        order=config.order,
    )
    kept = [r.chunk_id for r in ranking.results]
    assert kept[0] == "c5"  # "pump pressure drop" itself, last in the fusion order
    assert [r.final for r in ranking.results] == sorted(
        (r.final for r in ranking.results), reverse=True
    )
    below = {e.chunk_id for e in ranking.excluded if e.reason is ExclusionReason.BELOW_THRESHOLD}
    assert below == {"c0", "c4", "c6"}  # the passages sharing no word with the query
    assert set(kept) == {"c1", "c2", "c3", "c5"}
    assert thresholds.classify(ranking.results[0].final) is Confidence.MEDIUM  # 0.60
