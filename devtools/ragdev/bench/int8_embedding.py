"""Would an int8 execution of the local model embed cheaper, and how far would its vectors move?

Today's local model (the int8 export of all-MiniLM-L6-v2) runs its 48 MatMuls in fp32:
onnxruntime folds the export's int8 weights (Cast, Mul by the scale) into fp32 constants at
load. This measures, side by side in one process, that session against int8 executions of the
same folded graph made by onnxruntime's dynamic quantization (MatMul -> DynamicQuantizeLinear +
MatMulInteger; weights int8 per tensor or per output channel, or uint8): CPU per call of one
short query and of a batch of passages (one onnxruntime thread, as a Retrieve server runs it;
rounds interleaved so every variant sees the same machine load), the cosine of each variant's
vectors to today's, and whether quantizing twice gives the same bytes.

Nothing here changes what ragstream runs: an index embedded with one execution must never be
searched with another (issue 28; docs/decisions/cpu-on-the-hot-paths.md).

Run: `ragstream bench int8_embedding` (prints JSON; needs the `onnx` package, a dev
dependency).
"""

from __future__ import annotations

import argparse
import hashlib
import os
import statistics
import sys
import tempfile
import time
from collections.abc import Callable, Sequence
from functools import partial
from pathlib import Path
from typing import Any

import numpy as np
import numpy.typing as npt
import onnxruntime as ort
from onnxruntime.quantization import QuantType, quantize_dynamic

from ragcore.embedders.local_onnx import LocalEmbedderConfig, LocalOnnxEmbedder
from ragcore.onnx_common import cpu_session
from ragdev.bench.embedder import QUERIES, passages
from ragdev.bench.machine import emit, machine_info
from ragstream.cli import HelpFormatter

__all__ = ["QUERY", "VARIANTS", "run"]

#: 13 tokens with [CLS] and [SEP]: a typical Retrieve query.
QUERY = "how do I reset the badge reader at the dock?"

#: Short questions for the cosine of query vectors (the embedder benchmark's, and QUERY).
_QUESTIONS = (*QUERIES, QUERY)

#: name -> quantize_dynamic arguments (MatMul nodes only).
VARIANTS: dict[str, dict[str, Any]] = {
    "int8_per_tensor": {"weight_type": QuantType.QInt8},
    "int8_per_channel": {"weight_type": QuantType.QInt8, "per_channel": True},
    "uint8_per_tensor": {"weight_type": QuantType.QUInt8},
}

Rows = npt.NDArray[np.float64]


def _folded_fp32(model: bytes, out: Path) -> Path:
    """The graph onnxruntime runs today (constants folded: fp32 MatMul weights), saved."""
    options = ort.SessionOptions()
    options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_BASIC
    options.optimized_model_filepath = str(out)
    ort.InferenceSession(model, sess_options=options, providers=["CPUExecutionProvider"])
    return out


def _quantized(fp32: Path, out: Path, arguments: dict[str, Any]) -> bytes:
    quantize_dynamic(str(fp32), str(out), op_types_to_quantize=["MatMul"], **arguments)
    return out.read_bytes()


def _unit(rows: npt.NDArray[np.float32]) -> Rows:
    as64 = np.asarray(rows, dtype=np.float64)
    norms: Rows = np.linalg.norm(as64, axis=-1, keepdims=True)
    return as64 / norms


def _cpu_ms(call: Callable[[], object], repeat: int) -> float:
    call()
    start = time.thread_time()
    for _ in range(repeat):
        call()
    return (time.thread_time() - start) / repeat * 1000.0


def run(*, rounds: int = 5, batch: int = 32, passage_tokens: int = 216) -> dict[str, Any]:
    """Measure every variant against today's session; a JSON-able report."""
    load_before = os.getloadavg()
    embedder = LocalOnnxEmbedder(LocalEmbedderConfig(intra_op_threads=1))
    try:
        return _measure(embedder, rounds, batch, passage_tokens, load_before)
    finally:
        embedder.close()


def _measure(
    embedder: LocalOnnxEmbedder,
    rounds: int,
    batch: int,
    passage_tokens: int,
    load_before: Sequence[float],
) -> dict[str, Any]:
    # the embedder's own tokenizer and batch runner, so every variant pools and pads alike
    tokenizer = embedder._tokenizer
    onnx_path = embedder._onnx_path
    texts = passages(batch, tokenizer, target_tokens=passage_tokens)
    passage_batch = tokenizer.encode_batch(texts)
    query = tokenizer.encode_batch([QUERY])
    questions = [tokenizer.encode_batch([q]) for q in _QUESTIONS]

    sessions: dict[str, Any] = {"fp32_today": embedder._session}
    files: dict[str, dict[str, Any]] = {}
    with tempfile.TemporaryDirectory(prefix="ragstream-int8-") as tmp:
        fp32 = _folded_fp32(onnx_path.read_bytes(), Path(tmp) / "folded.onnx")
        for name, arguments in VARIANTS.items():
            started = time.perf_counter()
            data = _quantized(fp32, Path(tmp) / f"{name}.onnx", arguments)
            seconds = time.perf_counter() - started
            again = _quantized(fp32, Path(tmp) / f"{name}.again.onnx", arguments)
            files[name] = {
                "bytes": len(data),
                "sha256": hashlib.sha256(data).hexdigest(),
                "quantize_seconds": round(seconds, 2),
                "same_bytes_quantized_twice": data == again,
            }
            sessions[name] = cpu_session(data, Path(tmp) / f"{name}.onnx", 1)

    def embed(session: Any, encodings: list[Any]) -> npt.NDArray[np.float32]:
        return embedder._run_batch(session, encodings)

    reference_q = np.vstack([_unit(embed(sessions["fp32_today"], q)) for q in questions])
    reference_p = _unit(embed(sessions["fp32_today"], passage_batch))
    timings: dict[str, dict[str, list[float]]] = {n: {"q": [], "p": []} for n in sessions}
    for _ in range(rounds):
        for name, session in sessions.items():  # interleaved: the same load for each
            timings[name]["q"].append(_cpu_ms(partial(embed, session, query), 200))
            timings[name]["p"].append(_cpu_ms(partial(embed, session, passage_batch), 3))
    base_q = statistics.median(timings["fp32_today"]["q"])
    base_p = statistics.median(timings["fp32_today"]["p"])
    results: dict[str, Any] = {}
    for name, session in sessions.items():
        q_ms = statistics.median(timings[name]["q"])
        p_ms = statistics.median(timings[name]["p"])
        cos_q = (np.vstack([_unit(embed(session, q)) for q in questions]) * reference_q).sum(1)
        cos_p = (_unit(embed(session, passage_batch)) * reference_p).sum(1)
        results[name] = {
            "query_cpu_ms": round(q_ms, 3),
            "query_speedup": round(base_q / q_ms, 2),
            "batch_cpu_ms": round(p_ms, 1),
            "batch_speedup": round(base_p / p_ms, 2),
            "cosine_to_today_queries_min_mean": [
                round(float(cos_q.min()), 4),
                round(float(cos_q.mean()), 4),
            ],
            "cosine_to_today_passages_min_mean": [
                round(float(cos_p.min()), 4),
                round(float(cos_p.mean()), 4),
            ],
            **files.get(name, {}),
        }
    return {
        "what": (__doc__ or "").split("\n\n")[1].replace("\n", " "),
        "model_version": embedder.spec.model_version,
        "query": {"text": QUERY, "tokens": len(query[0].ids)},
        "batch": {"passages": batch, "tokens": sorted({len(e.ids) for e in passage_batch})},
        "rounds": rounds,
        "intra_op_threads": 1,
        "machine": machine_info(load_before, os.getloadavg(), ("onnxruntime", "onnx")),
        "variants": results,
    }


def main(argv: list[str] | None = None, prog: str | None = None) -> int:
    """Command line entry: print the measurement as JSON."""
    parser = argparse.ArgumentParser(prog=prog, formatter_class=HelpFormatter, description=__doc__)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--batch", type=int, default=32)
    parser.add_argument("--passage-tokens", type=int, default=216)
    args = parser.parse_args(argv)
    return emit(run(rounds=args.rounds, batch=args.batch, passage_tokens=args.passage_tokens))


if __name__ == "__main__":
    sys.exit(main())
