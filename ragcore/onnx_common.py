"""What the ONNX adapters share (local embedder, cross-encoder reranker): reading model files
with a clear error, sha256 pinning, and one CPU session setup."""

from __future__ import annotations

import hashlib
import logging
import tempfile
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np
import numpy.typing as npt
import onnxruntime as ort
from onnxruntime.capi import onnxruntime_pybind11_state as ort_state

from ragcore.errors import ConfigError

if TYPE_CHECKING:
    from tokenizers import Encoding

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


_REQUIRED_INPUTS = frozenset({"input_ids", "attention_mask"})
_OPTIONAL_INPUTS = frozenset({"token_type_ids"})
_ORT_INT_TYPES: dict[str, type[np.integer[Any]]] = {
    "tensor(int64)": np.int64,
    "tensor(int32)": np.int32,
}


def encoder_inputs(session: Any, path: Path) -> dict[str, type[np.integer[Any]]]:
    """The graph's inputs and their integer dtypes: `input_ids`, `attention_mask` and optionally
    `token_type_ids`, int64 or int32 (what `padded_inputs` feeds); ConfigError otherwise."""
    inputs = {i.name: i for i in session.get_inputs()}
    missing = _REQUIRED_INPUTS - inputs.keys()
    unknown = inputs.keys() - _REQUIRED_INPUTS - _OPTIONAL_INPUTS
    if missing or unknown:
        raise ConfigError(
            f"{path}: unsupported inputs {sorted(inputs)} (need input_ids, attention_mask, "
            "optionally token_type_ids)"
        )
    for name, meta in inputs.items():
        if meta.type not in _ORT_INT_TYPES:
            raise ConfigError(f"{path}: input {name} has type {meta.type}, expected int64/32")
    return {name: _ORT_INT_TYPES[meta.type] for name, meta in inputs.items()}


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
    # Idle pool threads sleep instead of spinning: a server embedding one query at a time
    # otherwise burns the cores between requests that other requests need
    # (docs/decisions/cpu-on-the-hot-paths.md).
    options.add_session_config_entry("session.intra_op.allow_spinning", "0")
    try:
        return ort.InferenceSession(model, sess_options=options, providers=["CPUExecutionProvider"])
    except ORT_ERRORS as exc:
        raise ConfigError(f"onnxruntime cannot load ONNX model {path}: {exc}") from exc


def int8_dynamic(model: bytes, path: Path) -> bytes:
    """`model` with its MatMuls in int8: weights quantized per output channel, activations
    quantized per call (onnxruntime's dynamic quantization), everything else unchanged.

    The graph is first optimized at the basic level (constant folding), so an export that
    stores int8 weights behind Cast/Mul nodes quantizes its folded float weights. The output
    is deterministic (same input and library versions, same bytes). Needs the `onnx` package.
    """
    try:
        # imported here: it needs the onnx package, which only int8 execution uses
        from onnxruntime.quantization import QuantType, quantize_dynamic  # noqa: PLC0415
    except ImportError as exc:
        raise ConfigError(
            f"int8 execution of {path} needs the onnx package (`pip install onnx`): {exc}"
        ) from exc
    with tempfile.TemporaryDirectory(prefix="ragstream-int8-") as tmp:
        folded, quantized = Path(tmp) / "folded.onnx", Path(tmp) / "int8.onnx"
        options = ort.SessionOptions()
        options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_BASIC
        options.optimized_model_filepath = str(folded)
        root = logging.getLogger()
        root.addFilter(_no_preprocessing_advice)
        try:
            ort.InferenceSession(model, sess_options=options, providers=["CPUExecutionProvider"])
            quantize_dynamic(
                folded,
                quantized,
                weight_type=QuantType.QInt8,
                per_channel=True,
                op_types_to_quantize=["MatMul"],
            )
        except ORT_ERRORS as exc:
            raise ConfigError(f"onnxruntime cannot quantize ONNX model {path}: {exc}") from exc
        finally:
            root.removeFilter(_no_preprocessing_advice)
        return quantized.read_bytes()


def _no_preprocessing_advice(record: logging.LogRecord) -> bool:
    """Drops the quantizer's advice to run its pre-processing first (logged as a root WARNING
    on every call): the graph is already constant-folded, and its symbolic shape inference
    needs sympy for nothing this model gains from."""
    return not record.getMessage().startswith("Please consider to run pre-processing")


def padded_inputs(
    encodings: Sequence[Encoding], pad_id: int, inputs: Mapping[str, Any]
) -> tuple[dict[str, npt.NDArray[Any]], npt.NDArray[np.int64]]:
    """The feed of one batch of tokenizer encodings, right-padded with `pad_id` to the longest:
    `input_ids`, `attention_mask` (0 on padding, so it is masked out of attention and pooling)
    and `token_type_ids`, each cast to the dtype the model declares for the inputs it has.
    Also returns the attention mask as int64 (for pooling)."""
    width = max(len(e.ids) for e in encodings)
    ids = np.full((len(encodings), width), pad_id, dtype=np.int64)
    mask = np.zeros_like(ids)
    types = np.zeros_like(ids)
    for row, encoding in enumerate(encodings):
        n = len(encoding.ids)
        ids[row, :n] = encoding.ids
        mask[row, :n] = encoding.attention_mask
        types[row, :n] = encoding.type_ids
    feeds = {"input_ids": ids, "attention_mask": mask, "token_type_ids": types}
    return {name: feeds[name].astype(dtype, copy=False) for name, dtype in inputs.items()}, mask


def run_single_output(
    session: Any, output: str, feed: Mapping[str, Any], error: type[Exception], prefix: str
) -> Any:
    """Run the session for its one output; onnxruntime's errors become `error` (the adapter's
    own type) with the message `<prefix>: inference failed: ...`."""
    try:
        (result,) = session.run([output], dict(feed))
    except ORT_ERRORS as exc:
        raise error(f"{prefix}: inference failed: {exc}") from exc
    return result


def fused_attention(model: bytes, path: Path, num_heads: int) -> bytes:
    """`model` (a BERT encoder exported by torch dynamo, as all-MiniLM-L6-v2's) with each
    layer's self-attention as one onnxruntime `com.microsoft` `Attention` node: the Q/K/V
    weights packed into one (hidden, 3 * hidden) matrix, the 2D attention mask as its mask.

    onnxruntime's own attention fusion does not match this export's decomposed attention (an
    And/Where mask, an IsNaN/Where after the Softmax); the fused node saves ~20% of the CPU per
    long passage (docs/decisions/cpu-on-the-hot-paths.md). Pure `onnx` graph surgery: weights
    stored as int8 behind Cast/Mul are dequantized here exactly as constant folding would
    (float32 product of the two). Deterministic for given input bytes and `onnx` version.
    ConfigError when a layer does not have the expected shape (no silent partial rewrite).
    """
    try:
        # imported here, as in int8_dynamic: only these graph rewrites need the onnx package
        import onnx  # noqa: PLC0415
        from onnx import TensorProto, helper, numpy_helper  # noqa: PLC0415
    except ImportError as exc:
        raise ConfigError(
            f"the fused attention of {path} needs the onnx package (`pip install onnx`): {exc}"
        ) from exc

    graph_model = onnx.load_from_string(model)
    graph = graph_model.graph
    inits = {i.name: i for i in graph.initializer}
    producer = {out: node for node in graph.node for out in node.output}

    def fail(what: str) -> ConfigError:
        return ConfigError(f"{path}: cannot fuse attention: {what}")

    def only_add_with(name: str) -> Any:
        adds = [n for n in graph.node if n.op_type == "Add" and name in n.input]
        if len(adds) != 1:
            raise fail(f"{len(adds)} Add nodes use {name}, expected 1")
        return adds[0]

    def matmul_before(add: Any, bias: str) -> Any:
        (other,) = [i for i in add.input if i != bias] or [""]
        node = producer.get(other)
        if node is None or node.op_type != "MatMul":
            raise fail(f"the bias {bias} is not added to a MatMul's output")
        return node

    def weight(name: str) -> npt.NDArray[np.float32]:
        """A MatMul's constant weight: an initializer, or Mul(Cast(initializer), initializer)."""
        if name in inits:
            return np.asarray(numpy_helper.to_array(inits[name]), dtype=np.float32)
        mul = producer.get(name)
        cast = producer.get(mul.input[0]) if mul is not None and mul.op_type == "Mul" else None
        if cast is None or cast.op_type != "Cast" or mul is None or mul.input[1] not in inits:
            raise fail(f"weight {name} is neither an initializer nor Mul(Cast(q), scale)")
        if cast.input[0] not in inits:
            raise fail(f"weight {name} is not a constant")
        quantized = numpy_helper.to_array(inits[cast.input[0]]).astype(np.float32)
        scale = numpy_helper.to_array(inits[mul.input[1]])
        if scale.dtype != np.float32:
            raise fail(f"scale {mul.input[1]} of {name} is not float32")
        return np.asarray(quantized * scale, dtype=np.float32)

    layers = sorted(
        {
            int(i.split(".")[3])
            for i in inits
            if i.startswith("inner.encoder.layer.") and i.endswith(".attention.self.query.bias")
        }
    )
    if not layers:
        raise fail("no inner.encoder.layer.<n>.attention.self.query.bias initializer")
    mask = "attention_mask_int32"
    fused: dict[str, Any] = {}  # context tensor -> the Attention node computing it
    for layer in layers:
        prefix = f"inner.encoder.layer.{layer}.attention."
        weights, biases, source = [], [], None
        for part in ("query", "key", "value"):
            bias = f"{prefix}self.{part}.bias"
            matmul = matmul_before(only_add_with(bias), bias)
            if source not in (None, matmul.input[0]):
                raise fail(f"layer {layer}: Q, K and V do not project the same input")
            source = matmul.input[0]
            weights.append(weight(matmul.input[1]))
            biases.append(np.asarray(numpy_helper.to_array(inits[bias]), dtype=np.float32))
        hidden = weights[0].shape[0]
        if any(w.shape != (hidden, hidden) for w in weights) or hidden % num_heads:
            raise fail(f"layer {layer}: Q/K/V weights {[w.shape for w in weights]}")
        out_bias = f"{prefix}output.dense.bias"
        context = matmul_before(only_add_with(out_bias), out_bias).input[0]
        qkv_weight, qkv_bias = f"{prefix}qkv.weight", f"{prefix}qkv.bias"
        graph.initializer.extend(
            [
                numpy_helper.from_array(np.concatenate(weights, axis=1), qkv_weight),
                numpy_helper.from_array(np.concatenate(biases), qkv_bias),
            ]
        )
        fused[context] = helper.make_node(
            "Attention",
            [source or "", qkv_weight, qkv_bias, mask],
            [context],
            name=f"fused_attention_{layer}",
            domain="com.microsoft",
            num_heads=num_heads,
        )
    # Each Attention node takes the place of the node that computed its context, so the node
    # order stays topological; the mask's Cast goes first. Then drop what nothing uses.
    nodes = [helper.make_node("Cast", ["attention_mask"], [mask], to=TensorProto.INT32)]
    for node in graph.node:
        replaced = [fused[out] for out in node.output if out in fused]
        nodes.extend(replaced or [node])
    needed = {o.name for o in graph.output}
    kept: list[Any] = []
    for node in reversed(nodes):
        if needed.intersection(node.output):
            kept.append(node)
            needed.update(node.input)
    del graph.node[:]
    graph.node.extend(reversed(kept))
    used = [i for i in graph.initializer if i.name in needed]
    del graph.initializer[:]
    graph.initializer.extend(used)
    if not any(o.domain == "com.microsoft" for o in graph_model.opset_import):
        graph_model.opset_import.append(helper.make_opsetid("com.microsoft", 1))
    rewritten: bytes = graph_model.SerializeToString()
    return rewritten
