"""What the ONNX adapters share (local embedder, cross-encoder reranker): reading model files
with a clear error, sha256 pinning, and one CPU session setup."""

from __future__ import annotations

import hashlib
from pathlib import Path
from typing import Any

import onnxruntime as ort
from onnxruntime.capi import onnxruntime_pybind11_state as ort_state

from ragcore.errors import ConfigError

#: onnxruntime's own exception types (translated to ConfigError when loading, by callers
#: into their own error types when running).
ORT_ERRORS: tuple[type[Exception], ...] = (
    ort_state.Fail,
    ort_state.InvalidArgument,
    ort_state.InvalidGraph,
    ort_state.InvalidProtobuf,
    ort_state.NoSuchFile,
    ort_state.NoModel,
    ort_state.RuntimeException,
    ort_state.EPFail,
)


def sha256_hex(data: bytes) -> str:
    """Hex SHA-256 of `data`."""
    return hashlib.sha256(data).hexdigest()


def read_file(path: Path, what: str) -> bytes:
    """The file's bytes; ConfigError naming `what` and the path when it cannot be read."""
    try:
        return path.read_bytes()
    except OSError as exc:
        raise ConfigError(f"cannot read {what} file {path}: {exc.strerror or exc}") from exc


def read_pinned(path: Path, what: str, expected_sha256: str | None) -> bytes:
    """The file's bytes, checked against a pinned sha256 when one is given."""
    data = read_file(path, what)
    if expected_sha256 is not None and sha256_hex(data) != expected_sha256:
        raise ConfigError(f"sha256 of {path} does not match the expected {expected_sha256}")
    return data


def cpu_session(model: bytes, path: Path, intra_op_threads: int | None) -> Any:
    """An onnxruntime CPU session over the very bytes that were verified (not re-read)."""
    options = ort.SessionOptions()
    options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_ALL
    options.execution_mode = ort.ExecutionMode.ORT_SEQUENTIAL
    options.inter_op_num_threads = 1
    if intra_op_threads is not None:
        options.intra_op_num_threads = intra_op_threads
    try:
        return ort.InferenceSession(model, sess_options=options, providers=["CPUExecutionProvider"])
    except ORT_ERRORS as exc:
        raise ConfigError(f"onnxruntime cannot load ONNX model {path}: {exc}") from exc
