"""`ragstream query`: call Retrieve over gRPC and print the evidence pack for people or JSON."""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path
from typing import TextIO

import grpc
from google.protobuf.json_format import MessageToDict

from ragstream.errors import RagstreamError
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
) -> pb.EvidencePack:
    """One Retrieve call; a non-OK status becomes a QueryError naming the status and code."""
    secret = token or os.environ.get("RAGSTREAM_TOKEN") or _dev_token(tenant, data_dir)
    # optional fields: set only what was given (an empty string is a present, invalid value)
    request = pb.RetrieveRequest(query_text=question, top_k=top_k)
    if tenant:
        request.tenant = tenant
    if index_version:
        request.index_version = index_version
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


def print_pack(pack: pb.EvidencePack, *, as_json: bool, out: TextIO = sys.stdout) -> None:
    """Readable text (rank, score, title, locator, snippet, exclusions) or JSON."""
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
    for result in pack.results:
        loc = result.locator
        where = " > ".join(loc.section_path) or f"chunk {loc.chunk_index}"
        snippet = " ".join(result.text.split())[:160]
        out.write(
            f"{result.rank:>2}. [{result.scores.final:.3f}] {result.title or result.entity_id}"
            f"  ({result.entity_id}, {where}, chars {loc.char_start}-{loc.char_end})\n"
            f"    {snippet}\n"
        )
    for item in pack.excluded:
        reason = pb.ExclusionReason.Name(item.reason).removeprefix("EXCLUSION_REASON_")
        out.write(f"    excluded {item.chunk_id}: {reason.lower()}\n")
    timings = ", ".join(f"{k}={pack.timings_ms[k]:.1f}ms" for k in sorted(pack.timings_ms))
    out.write(f"timings: {timings}\n")
