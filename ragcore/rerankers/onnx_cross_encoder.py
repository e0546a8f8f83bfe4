"""Local cross-encoder reranker on onnxruntime + tokenizers (e.g. an ms-marco-MiniLM export).

The model directory holds `model.onnx` (or `onnx/model.onnx`, the layout of HF ONNX exports)
and `tokenizer.json`. The graph takes `input_ids`, `attention_mask` and optionally
`token_type_ids` (int64 or int32, shape (batch, seq)) and outputs one logit per pair, shape
(batch, 1) or (batch,): output `logits` when present, else the graph's only output.

Each (query, passage) pair is encoded with the tokenizer's pair encoding (its post-processor adds
the special tokens and segment ids), truncated to `max_length` tokens ("longest first", as
sentence-transformers' CrossEncoder does), sorted by length and batched with padding to the
longest pair of each batch. The score is sigmoid(logit), a relevance probability in [0, 1].

No weights ship with ragstream and nothing is downloaded: the deployment provides the directory
and may pin the files' sha256 (checked once at load, on the very bytes handed to onnxruntime).
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from pathlib import Path
from typing import Any, Literal

import numpy as np
import numpy.typing as npt
from pydantic import BaseModel, ConfigDict, Field
from tokenizers import Encoding, Tokenizer

from ragcore.errors import ConfigError
from ragcore.onnx_common import (
    cpu_session,
    encoder_inputs,
    padded_inputs,
    read_file,
    read_pinned,
    run_single_output,
    sha256_hex,
)
from ragcore.rerankers import RerankError

__all__ = ["OnnxCrossEncoder", "OnnxRerankerConfig"]

log = logging.getLogger(__name__)

# onnxruntime's own exception classes derive straight from Exception; translate exactly these.
_PAD_TOKENS = ("[PAD]", "<pad>")


class OnnxRerankerConfig(BaseModel):
    """Settings of the local ONNX cross-encoder."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    kind: Literal["onnx"] = "onnx"
    model_dir: Path = Field(
        description="Directory holding model.onnx (or onnx/model.onnx) and tokenizer.json."
    )
    name: str | None = Field(
        default=None, min_length=1, description="Label for logs; defaults to the directory name."
    )
    onnx_sha256: str | None = Field(
        default=None, pattern=r"^[0-9a-f]{64}$", description="Expected sha256 of the ONNX file."
    )
    tokenizer_sha256: str | None = Field(
        default=None, pattern=r"^[0-9a-f]{64}$", description="Expected sha256 of tokenizer.json."
    )
    max_length: int = Field(
        default=512,
        ge=4,
        le=8192,
        description="Tokens per (query, passage) pair, special tokens included (the model's "
        "position limit: 512 for BERT-style cross-encoders).",
    )
    batch_size: int = Field(default=16, ge=1, le=1024)
    intra_op_threads: int | None = Field(
        default=None, ge=1, description="onnxruntime intra-op threads; None = one per core."
    )


def _resolve_paths(model_dir: Path) -> tuple[Path, Path]:
    """(model.onnx or onnx/model.onnx, tokenizer.json) of a model directory."""
    candidates = [model_dir / "model.onnx", model_dir / "onnx" / "model.onnx"]
    onnx_path = next((p for p in candidates if p.is_file()), None)
    if onnx_path is None:
        raise ConfigError(f"no ONNX model file {candidates[0]} (or {candidates[1]})")
    tokenizer_path = model_dir / "tokenizer.json"
    if not tokenizer_path.is_file():
        raise ConfigError(f"tokenizer file {tokenizer_path} does not exist")
    return onnx_path, tokenizer_path


def _sigmoid(x: npt.NDArray[np.float64]) -> npt.NDArray[np.float64]:
    """The logistic function, without overflow for large |x|."""
    z = np.exp(-np.abs(x))
    return np.where(x >= 0, 1.0 / (1.0 + z), z / (1.0 + z))


class OnnxCrossEncoder:
    """`Reranker` running a cross-encoder with onnxruntime on the CPU; see the module docstring.

    Thread-safe: onnxruntime sessions and tokenizers may be shared between threads.
    """

    def __init__(self, config: OnnxRerankerConfig) -> None:
        self._config = config
        self._name = config.name or config.model_dir.name or str(config.model_dir)
        onnx_path, tokenizer_path = _resolve_paths(config.model_dir)
        self._onnx_path = onnx_path
        self._tokenizer = self._load_tokenizer(tokenizer_path)
        self._session: Any = self._load_session(onnx_path)
        self._closed = False
        log.info(
            "cross-encoder %s loaded from %s (max_length %d, batch %d)",
            self._name,
            onnx_path,
            config.max_length,
            config.batch_size,
        )

    @property
    def config(self) -> OnnxRerankerConfig:
        """The configuration this reranker was built from."""
        return self._config

    def __repr__(self) -> str:
        return (
            f"OnnxCrossEncoder(name={self._name!r}, onnx={str(self._onnx_path)!r}, "
            f"max_length={self._config.max_length}, batch_size={self._config.batch_size})"
        )

    # --- loading -------------------------------------------------------------------------

    def _load_tokenizer(self, path: Path) -> Tokenizer:
        data = read_file(path, "tokenizer")
        expected = self._config.tokenizer_sha256
        if expected is not None and sha256_hex(data) != expected:
            raise ConfigError(f"sha256 of {path} does not match the expected {expected}")
        try:
            tokenizer = Tokenizer.from_str(data.decode("utf-8"))
        # tokenizers reports a malformed file as a bare Exception; it is re-raised typed here.
        except Exception as exc:
            raise ConfigError(f"cannot parse tokenizer {path}: {exc}") from exc
        padding = tokenizer.padding
        pad_id = padding.get("pad_id") if padding else None
        if not isinstance(pad_id, int):
            ids = (tokenizer.token_to_id(t) for t in _PAD_TOKENS)
            pad_id = next((i for i in ids if i is not None), 0)
        self._pad_id: int = pad_id
        # Shipped tokenizer.json files often pad to a fixed length: we pad per batch ourselves.
        tokenizer.no_padding()
        tokenizer.enable_truncation(max_length=self._config.max_length, strategy="longest_first")
        processor = tokenizer.post_processor
        if processor is None or processor.num_special_tokens_to_add(True) == 0:
            log.warning(
                "tokenizer %s adds no special tokens to a pair: query and passage are simply "
                "concatenated, which a cross-encoder was probably not trained on",
                path,
            )
        return tokenizer

    def _load_session(self, path: Path) -> Any:
        data = read_pinned(path, "ONNX model", self._config.onnx_sha256)
        session = cpu_session(data, path, self._config.intra_op_threads)
        self._check_signature(session, path)
        return session

    def _check_signature(self, session: Any, path: Path) -> None:
        self._inputs = encoder_inputs(session, path)

        outputs = {o.name: o for o in session.get_outputs()}
        if "logits" in outputs:
            self._output = "logits"
        elif len(outputs) == 1:
            (self._output,) = outputs
        else:
            raise ConfigError(f"{path}: no `logits` output among {sorted(outputs)}")
        shape = outputs[self._output].shape
        # A symbolic width (a name or None) is checked at run time.
        if not (
            len(shape) == 1
            or (len(shape) == 2 and (shape[1] == 1 or not isinstance(shape[1], int)))
        ):
            raise ConfigError(
                f"{path}: output {self._output} has shape {shape}, expected (batch, 1) or "
                "(batch,): one relevance logit per pair"
            )

    # --- Reranker ------------------------------------------------------------------------

    def score(self, query: str, passages: Sequence[str]) -> list[float]:
        """sigmoid(logit) of each (query, passage) pair, in input order."""
        session = self._session
        if self._closed or session is None:
            raise RerankError(f"cross-encoder {self._name}: reranker is closed")
        if not passages:
            return []
        try:
            encodings: list[Encoding] = self._tokenizer.encode_batch(
                [(query, passage) for passage in passages]
            )
        # tokenizers raises bare Exceptions (e.g. a query too long for longest-first to fit).
        except Exception as exc:
            raise RerankError(f"cross-encoder {self._name}: tokenization failed: {exc}") from exc
        # Stable sort by length: similar lengths share a batch, so little padding is computed.
        order = sorted(range(len(encodings)), key=lambda i: len(encodings[i].ids))
        logits = np.empty(len(encodings), dtype=np.float64)
        size = self._config.batch_size
        for start in range(0, len(order), size):
            rows = order[start : start + size]
            logits[rows] = self._run_batch(session, [encodings[i] for i in rows])
        return [float(s) for s in _sigmoid(logits)]

    def check(self) -> None:
        """Score one pair; raises `RerankError` when the session is closed or broken."""
        self.score("ragstream health check", ["health check"])

    def close(self) -> None:
        """Drop the onnxruntime session. Later calls raise `RerankError`."""
        self._closed = True
        self._session = None

    # --- inference -----------------------------------------------------------------------

    def _run_batch(self, session: Any, encodings: list[Encoding]) -> npt.NDArray[np.float64]:
        feed, _ = padded_inputs(encodings, self._pad_id, self._inputs)
        output = run_single_output(
            session, self._output, feed, RerankError, f"cross-encoder {self._name}"
        )
        logits = np.asarray(output, dtype=np.float64)
        if logits.shape not in ((len(encodings),), (len(encodings), 1)):
            raise RerankError(
                f"cross-encoder {self._name}: output {self._output} has shape {logits.shape}, "
                f"expected ({len(encodings)}, 1) or ({len(encodings)},)"
            )
        if not np.all(np.isfinite(logits)):
            raise RerankError(f"cross-encoder {self._name}: non-finite logits")
        return logits.reshape(len(encodings))
