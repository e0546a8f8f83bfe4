"""The retrieval.proto contract: import path, wire names, and generated code up to date."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from schemas.proto.ragstream.retrieval.v1 import retrieval_pb2 as pb
from schemas.proto.ragstream.retrieval.v1 import retrieval_pb2_grpc as pb_grpc

pytestmark = pytest.mark.unit

PROTO_ROOT = Path(__file__).resolve().parents[2] / "schemas" / "proto"
GENERATED = "ragstream/retrieval/v1"


def test_wire_names_stay_in_the_versioned_package() -> None:
    assert pb.DESCRIPTOR.name == "ragstream/retrieval/v1/retrieval.proto"
    service = pb.DESCRIPTOR.services_by_name["RetrievalService"]
    assert service.full_name == "ragstream.retrieval.v1.RetrievalService"
    method = service.methods_by_name["Retrieve"]
    assert method.input_type.full_name == "ragstream.retrieval.v1.RetrieveRequest"
    assert method.output_type.full_name == "ragstream.retrieval.v1.EvidencePack"
    assert pb_grpc.RetrievalServiceStub.__module__.startswith("schemas.proto.ragstream.")


def test_optional_fields_have_presence() -> None:
    req = pb.RetrieveRequest()
    assert not req.HasField("top_k") and not req.HasField("min_similarity_override")
    req.top_k = 0
    assert req.HasField("top_k")
    assert not pb.Scores().HasField("rerank")


def test_generated_code_matches_the_proto(tmp_path: Path) -> None:
    env = {**os.environ, "PYTHON": sys.executable}
    subprocess.run(
        ["bash", str(PROTO_ROOT / "generate.sh"), str(tmp_path)],
        check=True,
        env=env,
        capture_output=True,
    )
    fresh = sorted(p.name for p in (tmp_path / GENERATED).iterdir())
    assert fresh == [
        "__init__.py",
        "retrieval_pb2.py",
        "retrieval_pb2.pyi",
        "retrieval_pb2_grpc.py",
        "retrieval_pb2_grpc.pyi",
    ]
    for name in fresh:
        committed = (PROTO_ROOT / GENERATED / name).read_bytes()
        if name == "__init__.py":
            continue  # created once, not regenerated
        assert (tmp_path / GENERATED / name).read_bytes() == committed, (
            f"{name} is stale: run schemas/proto/generate.sh"
        )
