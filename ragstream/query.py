"""`ragstream query`: call Retrieve over gRPC and print the evidence pack for people or JSON."""

from __future__ import annotations

import json
import os
import sys
from collections import Counter
from pathlib import Path
from typing import Literal, TextIO

import grpc
from google.protobuf.json_format import MessageToDict

from ragcore.errors import RagstreamError
from schemas.entities import cite
from schemas.proto.ragstream.retrieval.v1 import retrieval_pb2 as pb
from schemas.proto.ragstream.retrieval.v1 import retrieval_pb2_grpc as pb_grpc


class QueryError(RagstreamError):
    """The server answered with a non-OK status."""

    code = "QUERY_FAILED"


def dev_token_file(data_dir: Path = Path("data")) -> Path:
    """Where `ragstream dev` writes the demo tokens."""
    return data_dir / "dev-tokens.json"


def query(
    target: str,
    token: str | None,
    question: str,
    *,
    tenant: str = "",
    top_k: int = 5,
    index_version: str = "",
    timeout_s: float = 10.0,
    data_dir: Path = Path("data"),
    max_context_tokens: int | None = None,
) -> pb.EvidencePack:
    """One Retrieve call; a non-OK status becomes a QueryError naming the status and code.
    `max_context_tokens` asks for context around the results within that token budget."""
    secret = token or os.environ.get("RAGSTREAM_TOKEN") or _dev_token(tenant, data_dir)
    # optional fields: set only what was given (an empty string is a present, invalid value)
    request = pb.RetrieveRequest(query_text=question, top_k=top_k)
    if tenant:
        request.tenant = tenant
    if index_version:
        request.index_version = index_version
    if max_context_tokens is not None:
        request.max_context_tokens = max_context_tokens
    with grpc.insecure_channel(target) as channel:
        stub = pb_grpc.RetrievalServiceStub(channel)
        try:
            pack: pb.EvidencePack = stub.Retrieve(
                request, metadata=(("authorization", f"Bearer {secret}"),), timeout=timeout_s
            )
        except grpc.RpcError as exc:
            raise QueryError(f"{exc.code().name}: {exc.details()}") from None
    return pack


def _dev_token(tenant: str, data_dir: Path) -> str:
    path = dev_token_file(data_dir)
    try:
        tokens: dict[str, str] = json.loads(path.read_text())
    except (OSError, ValueError):
        raise QueryError("no token: pass --token or set RAGSTREAM_TOKEN") from None
    if tenant:
        if tenant not in tokens:
            raise QueryError(f"no dev token for tenant {tenant!r} in {path}")
        return tokens[tenant]
    return next(iter(tokens.values()))


ScoreView = Literal["both", "order", "evidence"]


def _score_label(result: pb.Result, scores: ScoreView) -> str:
    order = f"order {result.scores.order:.4f}"
    evidence = f"evidence {result.scores.final:.2f}"
    if scores == "order":
        return order
    if scores == "evidence":
        return evidence
    return f"{order}  {evidence}"


def _print_context(context: pb.Context, out: TextIO) -> None:
    cut = ", cut to fit" if context.truncated else ""
    out.write(f"    context ({context.tokens} tokens from {', '.join(context.chunk_ids)}{cut}):\n")
    before = " ".join(context.before.split())
    after = " ".join(context.after.split())
    if before:
        out.write(f"      before: …{before[-120:]}\n")
    if after:
        out.write(f"      after:  {after[:120]}…\n")


def _print_budget(budget: pb.ContextBudget, out: TextIO) -> None:
    cuts: Counter[str] = Counter(
        pb.BudgetAction.Name(c.action).removeprefix("BUDGET_ACTION_").lower() for c in budget.cuts
    )
    what = f" ({', '.join(f'{a} {n}' for a, n in sorted(cuts.items()))})" if cuts else ""
    out.write(
        f"token budget used: {budget.token_budget_used} of {budget.max_context_tokens}"
        f"{what} [{budget.tokenizer}]\n"
    )


def print_pack(
    pack: pb.EvidencePack,
    *,
    as_json: bool,
    out: TextIO = sys.stdout,
    detail: bool = False,
    scores: ScoreView = "both",
) -> None:
    """Readable text or JSON.

    Text: a header (status, index, model, confidence), what ordered the results and what the
    evidence score is, then the results *in the order returned* with the score that ordered them
    and the evidence score (labelled; `scores` picks one), title, locator, matched identifiers,
    the near-duplicates collapsed into it (`+3 similar`; `detail` names them) and a snippet,
    its context when the request set a token budget, and the budget used with what it cut;
    exclusions summarised per reason (`detail` lists each one); stage timings. Only results
    are listed as results: chunks below the hard threshold appear among the exclusions.
    """
    if as_json:
        doc = MessageToDict(pack, preserving_proto_field_name=True)
        out.write(json.dumps(doc, indent=2, ensure_ascii=False) + "\n")
        return
    status = pb.RetrievalStatus.Name(pack.status).removeprefix("RETRIEVAL_STATUS_")
    confidence = pb.Confidence.Name(pack.confidence).removeprefix("CONFIDENCE_")
    out.write(
        f"{status}  tenant={pack.tenant} index={pack.index_name} "
        f"model={pack.embedding_model_version} confidence={confidence}\n"
    )
    if pack.status != pb.RETRIEVAL_STATUS_FAILED:
        calibration = pack.calibration
        fitted = (
            f"fitted {calibration.fingerprint}"
            if calibration.source == "fitted"
            else "prior model: run `ragstream calibrate`"
        )
        out.write(
            f"ordered by {pack.order_by or 'score'}; evidence = calibrated estimate that the "
            f"chunk answers ({fitted}), threshold {pack.min_score:.2f}\n"
        )
    for result in pack.results:
        loc = result.locator
        source = loc.extracted_from if loc.HasField("extracted_from") else None
        where = cite(loc.section_path, source) or f"chunk {loc.chunk_index}"
        snippet = " ".join(result.text.split())[:160]
        matched = (
            f"  [matches {', '.join(result.matched_identifiers)}]"
            if result.matched_identifiers
            else ""
        )
        similar = f"  +{len(result.also_in)} similar" if result.also_in else ""
        out.write(
            f"{result.rank:>2}. [{_score_label(result, scores)}] "
            f"{result.title or result.entity_id}"
            f"  ({result.entity_id}, {where}, chars {loc.char_start}-{loc.char_end})"
            f"{matched}{similar}\n"
            f"    {snippet}\n"
        )
        if detail and result.also_in:
            names = ", ".join(s.entity_id for s in result.also_in)
            out.write(f"    also in: {names}\n")
        if result.HasField("context") and result.context.chunk_ids:
            _print_context(result.context, out)
    if pack.HasField("context_budget"):
        _print_budget(pack.context_budget, out)
    reasons: Counter[str] = Counter()
    for item in pack.excluded:
        reason = pb.ExclusionReason.Name(item.reason).removeprefix("EXCLUSION_REASON_").lower()
        reasons[reason] += 1
        if detail:
            out.write(f"    excluded {item.chunk_id}: {reason} (evidence {item.score:.2f})\n")
    if reasons and not detail:
        summary = ", ".join(f"{reason} {n}" for reason, n in sorted(reasons.items()))
        out.write(f"excluded: {summary} (--detail lists them)\n")
    timings = ", ".join(f"{k}={pack.timings_ms[k]:.1f}ms" for k in sorted(pack.timings_ms))
    out.write(f"timings: {timings}\n")
