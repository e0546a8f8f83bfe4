"""`ragstream query` for people: results in the order returned, labelled scores, exclusions
summarised per reason unless asked for detail."""

from __future__ import annotations

import io

import pytest

from ragstream.query import print_pack
from schemas.proto.ragstream.retrieval.v1 import retrieval_pb2 as pb

pytestmark = pytest.mark.unit


def pack() -> pb.EvidencePack:
    result = pb.Result(
        rank=1,
        chunk_id="entities:release-2-3:chunk:0",
        entity_id="entities:release-2-3",
        title="Acme Flow 2.3 release notes",
        text="E-2113: fixed a bug where SAML logins failed when the IdP clock drifted.",
        scores=pb.Scores(order=0.0325, fused=0.0325, final=0.42, evidence=0.42),
        matched_identifiers=["e-2113"],
    )
    second = pb.Result(
        rank=2,
        chunk_id="entities:kb-errors:chunk:5",
        entity_id="entities:kb-errors",
        title="Error codes",
        text="E-5000 internal error.",
        scores=pb.Scores(order=0.0301, fused=0.0301, final=0.88, evidence=0.88),
    )
    excluded = [
        pb.Exclusion(chunk_id=f"c{i}", reason=pb.EXCLUSION_REASON_BELOW_THRESHOLD, score=0.01)
        for i in range(3)
    ] + [pb.Exclusion(chunk_id="d", reason=pb.EXCLUSION_REASON_DUPLICATE, score=0.2)]
    return pb.EvidencePack(
        status=pb.RETRIEVAL_STATUS_SUCCESS,
        tenant="acme",
        index_name="rag__acme__v1",
        confidence=pb.CONFIDENCE_LOW,
        order_by="rrf(dense 1, lexical 1, k 60)",
        min_score=0.3,
        calibration=pb.Calibration(source="fitted", fingerprint="0a1b2c3d4e5f"),
        results=[result, second],
        excluded=excluded,
        timings_ms={"total": 12.5},
    )


def render(**kwargs: object) -> str:
    out = io.StringIO()
    print_pack(pack(), as_json=False, out=out, **kwargs)  # type: ignore[arg-type]
    return out.getvalue()


def test_results_keep_the_returned_order_with_both_scores_labelled() -> None:
    text = render()
    first, second = text.index(" 1. "), text.index(" 2. ")
    assert first < second  # returned order, although the second has the higher evidence
    assert "[order 0.0325  evidence 0.42]" in text
    assert "ordered by rrf(dense 1, lexical 1, k 60)" in text
    assert "fitted 0a1b2c3d4e5f" in text and "threshold 0.30" in text
    assert "[matches e-2113]" in text


def test_one_score_can_be_chosen() -> None:
    assert "[order 0.0325]" in render(scores="order")
    assert "[evidence 0.42]" in render(scores="evidence")


def test_exclusions_are_summarised_per_reason_unless_detail_is_asked() -> None:
    text = render()
    assert "excluded: below_threshold 3, duplicate 1 (--detail lists them)" in text
    assert "excluded c0" not in text
    detailed = render(detail=True)
    assert "excluded c0: below_threshold (evidence 0.01)" in detailed
    assert "--detail lists them" not in detailed


def test_a_document_result_is_cited_by_file_and_page() -> None:
    document = pack()
    document.results[0].locator.CopyFrom(
        pb.Locator(
            chunk_index=2,
            char_start=120,
            char_end=180,
            section_path=["p100-datasheet.pdf", "p. 3"],
            extracted_from="pdf",
        )
    )
    document.results[1].locator.CopyFrom(
        pb.Locator(section_path=["Setup", "Install"], extracted_from="markdown")
    )
    out = io.StringIO()
    print_pack(document, as_json=False, out=out)
    text = out.getvalue()
    assert "(entities:release-2-3, p100-datasheet.pdf p. 3, chars 120-180)" in text
    assert "(entities:kb-errors, Setup > Install, chars 0-0)" in text


def test_duplicates_context_and_token_budget_are_shown() -> None:
    doc = pack()
    first = doc.results[0]
    first.also_in.extend(
        pb.SimilarChunk(chunk_id=f"entities:t{n}:chunk:0", entity_id=f"entities:t{n}")
        for n in range(3)
    )
    first.text_tokens = 20
    first.context.CopyFrom(
        pb.Context(
            before="## Fixes",
            after="Upgrade by running acme upgrade --to 2.3.",
            chunk_ids=["entities:release-2-3:chunk:1"],
            tokens=14,
            truncated=True,
        )
    )
    doc.context_budget.CopyFrom(
        pb.ContextBudget(
            max_context_tokens=40,
            token_budget_used=38,
            tokenizer="hf-package:minilm",
            cuts=[
                pb.BudgetCut(chunk_id="x", action=pb.BUDGET_ACTION_CONTEXT_TRUNCATED),
                pb.BudgetCut(chunk_id="y", action=pb.BUDGET_ACTION_RESULT_DROPPED),
            ],
        )
    )
    out = io.StringIO()
    print_pack(doc, as_json=False, out=out)
    text = out.getvalue()
    assert "[matches e-2113]  +3 similar\n" in text
    assert "context (14 tokens from entities:release-2-3:chunk:1, cut to fit):" in text
    assert "      before: …## Fixes\n" in text
    assert "      after:  Upgrade by running acme upgrade --to 2.3.…\n" in text
    assert (
        "token budget used: 38 of 40 (context_truncated 1, result_dropped 1) [hf-package:minilm]"
        in text
    )
    assert "also in:" not in text
    out = io.StringIO()
    print_pack(doc, as_json=False, out=out, detail=True)
    assert "    also in: entities:t0, entities:t1, entities:t2\n" in out.getvalue()
    # below-threshold chunks are exclusions, never listed as results
    assert text.count(". [order") == 2
