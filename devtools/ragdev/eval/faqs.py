"""A question-answering benchmark in BEIR format from FAQ files on this machine (real text).

Each question of a frequently-asked-questions file is a query; its answer is the document (the
only relevant one; tenant `faqs`). Unlike the man-page set, whose queries are one-line
descriptions sharing most words with their page, FAQ questions are natural-language questions
whose answers are worded differently: the regime where a dense model and a lexical one differ.

Sources (Debian packages' documentation; each keeps its own licence, see the package's
`/usr/share/doc/<package>/copyright`; nothing is copied into this repository: the set is built
at run time, like the man-page set):

- `/usr/share/doc/lsof/00FAQ.gz`: numbered questions (`10.2.4  Why does ...?`); lsof licence
  (BSD-like, Purdue Research Foundation);
- `/usr/share/doc/sed/sedfaq.txt.gz`: numbered questions (`4.26. How do I ...?`); the sed FAQ
  by Eric Pement, shipped with GNU sed (GPL-3+);
- `/usr/share/doc/zlib1g-dev/FAQ.gz`: numbered questions (` 1. Is zlib Y2K-compliant?`); zlib
  licence;
- `/usr/share/doc/xz-utils/faq.txt.gz`: `Q:` / `A:` pairs; 0BSD (public domain before).

A numbered file lists its questions twice (table of contents, then the body): the *last*
occurrence of a number is the one with the answer. A question is a numbered heading ending in
`?` (wrapped headings are joined); its answer runs to the next heading. Answers shorter than
`MIN_ANSWER_WORDS` and questions whose text repeats are dropped. `write_beir` writes
`corpus.jsonl`, `queries.jsonl` and `qrels/test.tsv`; `ragstream eval --dataset faqs` builds it
into a temporary directory and loads it with `ragdev.eval.beir.load_beir`.
"""

from __future__ import annotations

import gzip
import json
import re
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path

from ragcore.quality.errors import EvalDataError

TENANT = "faqs"
MIN_ANSWER_WORDS = 12
SOURCES: tuple[tuple[str, Path, str], ...] = (
    ("lsof", Path("/usr/share/doc/lsof/00FAQ.gz"), "numbered"),
    ("sed", Path("/usr/share/doc/sed/sedfaq.txt.gz"), "numbered"),
    ("zlib", Path("/usr/share/doc/zlib1g-dev/FAQ.gz"), "numbered"),
    ("xz", Path("/usr/share/doc/xz-utils/faq.txt.gz"), "qa"),
)
_HEADING = re.compile(r"^ {0,2}(\d+(?:\.\d+)*)\.?[ \t]+(\S.*)$")


@dataclass(frozen=True)
class FaqEntry:
    """One question and its answer."""

    source: str
    number: str
    question: str
    answer: str


def _read(path: Path) -> str:
    raw = path.read_bytes()
    if path.suffix == ".gz":
        raw = gzip.decompress(raw)
    return raw.decode("utf-8", errors="replace")


def _squash(text: str) -> str:
    return " ".join(text.split())


def parse_numbered(source: str, text: str) -> list[FaqEntry]:
    """Questions of a numbered FAQ (see the module docstring)."""
    lines = text.splitlines()
    headings: list[tuple[int, int, str, str]] = []  # (line, body line, number, heading text)
    i = 0
    while i < len(lines):
        match = _HEADING.match(lines[i])
        if match is None:
            i += 1
            continue
        number, head = match.group(1), match.group(2)
        j = i + 1
        # a wrapped heading continues on indented lines until "?" ends it
        while "?" not in head and j < len(lines) and lines[j].strip() and j - i < 4:
            if _HEADING.match(lines[j]):
                break
            head += " " + lines[j].strip()
            j += 1
        headings.append((i, j, number, _squash(head)))
        i = j
    last: dict[str, int] = {}
    for k, (_, _, number, _) in enumerate(headings):
        last[number] = k
    out: list[FaqEntry] = []
    for number, k in last.items():
        _, start, _, head = headings[k]
        if not head.endswith("?"):
            continue
        end = headings[k + 1][0] if k + 1 < len(headings) else len(lines)
        answer = "\n".join(lines[start:end]).strip()
        if len(answer.split()) >= MIN_ANSWER_WORDS:
            out.append(FaqEntry(source, number, head, answer))
    return out


def parse_qa(source: str, text: str) -> list[FaqEntry]:
    """`Q:` / `A:` pairs."""
    out: list[FaqEntry] = []
    blocks = re.split(r"(?m)^Q:\s*", text)[1:]
    for n, block in enumerate(blocks, start=1):
        question, _, answer = block.partition("\nA:")
        answer = answer.strip()
        if answer and len(answer.split()) >= MIN_ANSWER_WORDS:
            out.append(FaqEntry(source, str(n), _squash(question), answer))
    return out


def collect(sources: Iterable[tuple[str, Path, str]] = SOURCES) -> tuple[list[FaqEntry], list[str]]:
    """Every usable question of the FAQ files present, and the files that were absent."""
    entries: list[FaqEntry] = []
    absent: list[str] = []
    for name, path, kind in sources:
        if not path.is_file():
            absent.append(str(path))
            continue
        text = _read(path)
        entries += parse_numbered(name, text) if kind == "numbered" else parse_qa(name, text)
    seen: set[str] = set()
    unique = []
    for entry in entries:
        key = entry.question.lower()
        if key not in seen:
            seen.add(key)
            unique.append(entry)
    return unique, absent


def write_beir(directory: Path, entries: Iterable[FaqEntry]) -> int:
    """Write the BEIR files for `entries`; returns the number of queries."""
    directory.mkdir(parents=True, exist_ok=True)
    (directory / "qrels").mkdir(exist_ok=True)
    count = 0
    with (
        (directory / "corpus.jsonl").open("w", encoding="utf-8") as corpus,
        (directory / "queries.jsonl").open("w", encoding="utf-8") as queries,
        (directory / "qrels" / "test.tsv").open("w", encoding="utf-8") as qrels,
    ):
        qrels.write("query-id\tcorpus-id\tscore\n")
        for entry in entries:
            ident = f"{entry.source}-{entry.number}"
            corpus.write(json.dumps({"_id": ident, "title": "", "text": entry.answer}) + "\n")
            queries.write(json.dumps({"_id": f"q-{ident}", "text": entry.question}) + "\n")
            qrels.write(f"q-{ident}\t{ident}\t1\n")
            count += 1
    if count == 0:
        raise EvalDataError(
            "no FAQ file found on this machine: " + ", ".join(str(s[1]) for s in SOURCES)
        )
    return count
