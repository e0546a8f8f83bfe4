"""The eval runner end to end on a tiny set: real ingest, real gRPC Retrieve, scored runs."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

import numpy as np
import pytest

from ragcore.embedders.local_onnx import LocalOnnxEmbedder
from ragcore.quality.dataset import EvalEntity, EvalQuery, EvalSet, QueryKind
from ragcore.quality.metrics import QueryRow, Status
from ragdev.eval.configs import DEFAULT_CONFIGS
from ragdev.eval.runner import comparison, run_eval

pytestmark = [pytest.mark.integration, pytest.mark.slow]

DOCS = {
    "kb-refund": "Refunds go back to the original card within 14 days of receiving the return.",
    "kb-vpn": "Connect to the VPN with the client app; error E-1042 means your token expired.",
    "kb-pump": "Prime the P-200 pump by filling the casing with water before starting it.",
}


def tiny_set() -> EvalSet:
    return EvalSet(
        name="tiny",
        version="1",
        entities=tuple(
            EvalEntity(entity_id=k, tenant="acme", entity_type="KNOWLEDGE_ARTIFACT", content=v)
            for k, v in DOCS.items()
        ),
        queries=(
            EvalQuery(
                query_id="q1",
                text="how long until a refund reaches my card?",
                tenant="acme",
                kind=QueryKind.PARAPHRASE,
                answerable=True,
                relevant={"kb-refund": 3},
            ),
            EvalQuery(
                query_id="q2",
                text="what does error E-1042 mean?",
                tenant="acme",
                kind=QueryKind.EXACT_IDENTIFIER,
                answerable=True,
                relevant={"kb-vpn": 3},
            ),
        ),
    )


def test_runner_scores_each_configuration_through_the_real_retrieve_path() -> None:
    evalset = tiny_set()
    configs = {n: DEFAULT_CONFIGS[n] for n in ("default", "bm25_only")}
    results = run_eval(evalset, configs=configs, progress=False)
    assert [r.name for r in results] == ["default", "bm25_only"]
    default = results[0].result
    assert default.row("q1").status is Status.SUCCESS
    assert default.row("q1").top_entities[0] == "kb-refund"
    assert default.row("q2").top_entities[0] == "kb-vpn"
    assert default.aggregates["hit@1"] == 1.0
    assert "bm25_only" in comparison(results)


def test_a_kept_cache_serves_the_calibration_practice_queries_of_a_rerun(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """With `cache_dir`, a second run of one set and seed embeds none of the calibration's
    practice queries again, and scores exactly as the first."""
    embedded: list[str] = []
    batch = LocalOnnxEmbedder.embed_queries

    def counting(self: LocalOnnxEmbedder, texts: Sequence[str]) -> np.ndarray:
        embedded.extend(texts)
        return batch(self, texts)

    monkeypatch.setattr(LocalOnnxEmbedder, "embed_queries", counting)
    configs = {"default": DEFAULT_CONFIGS["default"]}
    first = run_eval(tiny_set(), configs=configs, progress=False, cache_dir=tmp_path)
    assert embedded, "the first run embeds its practice queries"
    embedded.clear()
    second = run_eval(tiny_set(), configs=configs, progress=False, cache_dir=tmp_path)
    assert embedded == []

    def scored(rows: Sequence[QueryRow]) -> list[tuple[object, ...]]:
        return [(r.status, r.top_entities, r.calibration) for r in rows]

    assert scored(second[0].result.rows) == scored(first[0].result.rows)
