"""A tiny generated cross-encoder (ONNX graph + WordPiece tokenizer.json) for the adapter tests.

No cross-encoder weights ship on PyPI, so the tests build one whose score
is a known function of its input, with the real model's interface: inputs input_ids /
attention_mask / token_type_ids (int64, (batch, seq)), output `logits` (batch, 1) or (batch,).

    logit = SCALE * dot(mean(query-segment embeddings), mean(passage-segment embeddings)) + BIAS

The segments come from the pair encoding (token_type_ids 0 / 1, masked by attention_mask), the
mean counts special tokens, whose embeddings (like [UNK]'s and [PAD]'s) are zero. The word
embeddings are the rows of a random orthogonal matrix: the dot product of the two means is
(matching token pairs) / (n_query * n_passage), so it is 0 exactly when query and passage share
no word, and positive when they share one. `reference_logit` computes the same in numpy.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import numpy.typing as npt
import onnx
from onnx import TensorProto, helper, numpy_helper
from tokenizers import Encoding, Tokenizer, models, normalizers, pre_tokenizers, processors

SPECIALS = ["[PAD]", "[UNK]", "[CLS]", "[SEP]"]
WORDS = [
    "the", "a", "is", "of", "and", "after", "was", "in",
    "pump", "pressure", "drop", "valve", "leak", "seal", "replaced", "bearing",
    "noise", "motor", "overheating", "filter", "clogged", "sensor", "drift", "calibration",
    "oil", "low", "temperature", "high", "vibration", "alarm", "report", "##s",
]  # fmt: skip
SCALE = 16.0
BIAS = -2.0


def embedding_table(seed: int = 7) -> npt.NDArray[np.float32]:
    """Zero rows for the special tokens, orthonormal random rows for the words."""
    rng = np.random.default_rng(seed)
    q, _ = np.linalg.qr(rng.standard_normal((len(WORDS), len(WORDS))))
    table = np.zeros((len(SPECIALS) + len(WORDS), len(WORDS)), dtype=np.float32)
    table[len(SPECIALS) :] = q.astype(np.float32)
    return table


def build_tokenizer() -> Tokenizer:
    """A BERT-style WordPiece tokenizer with pair post-processing, saved padded like HF files."""
    vocab = {token: i for i, token in enumerate(SPECIALS + WORDS)}
    tokenizer = Tokenizer(models.WordPiece(vocab, unk_token="[UNK]"))
    tokenizer.normalizer = normalizers.BertNormalizer(lowercase=True)
    tokenizer.pre_tokenizer = pre_tokenizers.BertPreTokenizer()
    tokenizer.post_processor = processors.TemplateProcessing(
        single="[CLS] $A [SEP]",
        pair="[CLS] $A [SEP] $B:1 [SEP]:1",
        special_tokens=[("[CLS]", vocab["[CLS]"]), ("[SEP]", vocab["[SEP]"])],
    )
    # Shipped tokenizer.json files often pad and truncate to fixed lengths: the adapter undoes it.
    tokenizer.enable_padding(pad_id=0, pad_token="[PAD]", length=128)
    tokenizer.enable_truncation(max_length=128)
    return tokenizer


def _segment_mean(prefix: str, weights: str, nodes: list[onnx.NodeProto]) -> str:
    """Nodes computing mean over `weights` (N, L) of `emb` (N, L, D) -> `{prefix}_mean` (N, D)."""
    nodes += [
        helper.make_node("Unsqueeze", [weights, "axis2"], [f"{prefix}_w3"]),
        helper.make_node("Mul", ["emb", f"{prefix}_w3"], [f"{prefix}_weighted"]),
        helper.make_node(
            "ReduceSum", [f"{prefix}_weighted", "axis1"], [f"{prefix}_sum"], keepdims=0
        ),
        helper.make_node("ReduceSum", [weights, "axis1"], [f"{prefix}_count"], keepdims=1),
        helper.make_node("Max", [f"{prefix}_count", "one"], [f"{prefix}_count1"]),
        helper.make_node("Div", [f"{prefix}_sum", f"{prefix}_count1"], [f"{prefix}_mean"]),
    ]
    return f"{prefix}_mean"


def build_model(
    *,
    squeeze: bool = False,
    logit_width: int = 1,
    input_names: tuple[str, str, str] = ("input_ids", "attention_mask", "token_type_ids"),
) -> onnx.ModelProto:
    """The graph described in the module docstring (`squeeze`: output shape (batch,))."""
    table = embedding_table()
    ids, mask, types = input_names
    inputs = [
        helper.make_tensor_value_info(name, TensorProto.INT64, ["batch", "seq"])
        for name in input_names
    ]
    initializers = [
        numpy_helper.from_array(table, "table"),
        numpy_helper.from_array(np.full((table.shape[1], logit_width), SCALE, np.float32), "w"),
        numpy_helper.from_array(np.array([BIAS], np.float32), "bias"),
        numpy_helper.from_array(np.array([1.0], np.float32), "one"),
        numpy_helper.from_array(np.array([1], np.int64), "axis1"),
        numpy_helper.from_array(np.array([2], np.int64), "axis2"),
    ]
    nodes = [
        helper.make_node("Gather", ["table", ids], ["emb"], axis=0),
        helper.make_node("Cast", [mask], ["m"], to=TensorProto.FLOAT),
        helper.make_node("Cast", [types], ["t"], to=TensorProto.FLOAT),
        helper.make_node("Mul", ["m", "t"], ["wp"]),
        helper.make_node("Sub", ["m", "wp"], ["wq"]),
    ]
    query_mean = _segment_mean("q", "wq", nodes)
    passage_mean = _segment_mean("p", "wp", nodes)
    nodes += [
        helper.make_node("Mul", [query_mean, passage_mean], ["prod"]),
        helper.make_node("MatMul", ["prod", "w"], ["dot"]),
        helper.make_node("Add", ["dot", "bias"], ["raw" if squeeze else "logits"]),
    ]
    shape: list[str | int] = ["batch", logit_width]
    if squeeze:
        nodes.append(helper.make_node("Squeeze", ["raw", "axis1"], ["logits"]))
        shape = ["batch"]
    output = helper.make_tensor_value_info("logits", TensorProto.FLOAT, shape)
    graph = helper.make_graph(nodes, "tiny-cross-encoder", inputs, [output], initializers)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8  # readable by every onnxruntime the project allows
    onnx.checker.check_model(model, full_check=True)
    return model


def write_model_dir(directory: Path, **options: object) -> Path:
    """`directory` with model.onnx and tokenizer.json of the tiny cross-encoder."""
    directory.mkdir(parents=True, exist_ok=True)
    onnx.save(build_model(**options), str(directory / "model.onnx"))  # type: ignore[arg-type]
    build_tokenizer().save(str(directory / "tokenizer.json"))
    return directory


def reference_logit(encoding: Encoding) -> float:
    """The graph's logit for one unpadded pair encoding, in numpy (float64)."""
    table = embedding_table().astype(np.float64)
    ids = np.array(encoding.ids)
    mask = np.array(encoding.attention_mask, dtype=np.float64)
    types = np.array(encoding.type_ids, dtype=np.float64)
    emb = table[ids]
    wp = mask * types
    wq = mask - wp
    mean_q = (emb * wq[:, None]).sum(0) / max(wq.sum(), 1.0)
    mean_p = (emb * wp[:, None]).sum(0) / max(wp.sum(), 1.0)
    return float(SCALE * mean_q @ mean_p + BIAS)


def reference_score(query: str, passage: str, max_length: int = 512) -> float:
    """sigmoid(reference_logit) of the pair, tokenized as the adapter must."""
    tokenizer = build_tokenizer()
    tokenizer.no_padding()
    tokenizer.enable_truncation(max_length=max_length, strategy="longest_first")
    logit = reference_logit(tokenizer.encode(query, passage))
    return float(1.0 / (1.0 + np.exp(-logit)))
