"""The named evaluation sets of `ragstream eval --dataset`.

- `golden`: the hand-written golden set (`devtools/ragdev/eval/data/golden.json`);
- `manpages`: the pinned man-page known-item benchmark (`ragdev.eval.manpages`);
- `demo`: the dev stack's sample corpus with identifier queries (`ragdev.eval.demo`: repeated
  tickets, release notes that explain error codes);
- `neardomain`: the same corpus with near-miss unanswerable questions and reworded answerable
  ones (`ragdev.eval.neardomain`: abstention on questions that sound like the corpus);
- `paraphrase`: the golden corpus with held-out questions worded unlike their answers
  (`ragdev.eval.paraphrase`: found and answered, never used to fit anything);
- `documents`: generated PDFs, a DOCX and an XLSX with questions each answered by one page,
  section or row block (`ragdev.eval.documents`: page-level hit@1 and MRR);
- `faqs`: the FAQ question-answering benchmark, written in BEIR format from the FAQ files on
  this machine (`ragdev.eval.faqs`) and loaded through the BEIR loader;
- `beir:DIR`: any BEIR-format directory;
- anything else: an eval set JSON file.
"""

from __future__ import annotations

import tempfile
from pathlib import Path

from ragcore.quality.dataset import EvalSet, load_evalset
from ragcore.quality.errors import EvalDataError
from ragdev.eval import GOLDEN_PATH
from ragdev.eval.beir import load_beir
from ragdev.eval.demo import demo_evalset
from ragdev.eval.documents import documents_evalset
from ragdev.eval.faqs import TENANT as FAQ_TENANT
from ragdev.eval.faqs import collect, write_beir
from ragdev.eval.manpages import load_pinned
from ragdev.eval.neardomain import neardomain_evalset
from ragdev.eval.paraphrase import paraphrase_evalset

NAMES = ("golden", "manpages", "faqs", "demo", "neardomain", "paraphrase", "documents")


def load_named(dataset: str, *, beir_dir: Path | None = None) -> EvalSet:
    """The eval set `dataset` names (see the module docstring); `beir_dir` keeps the FAQ set's
    BEIR files (else they go to a temporary directory)."""
    if dataset == "golden":
        return load_evalset(GOLDEN_PATH)
    if dataset == "manpages":
        loaded = load_pinned()
        if loaded.evalset is None:
            raise EvalDataError(f"man-page benchmark unavailable: {loaded.skipped_reason}")
        return loaded.evalset
    if dataset == "demo":
        return demo_evalset()
    if dataset == "neardomain":
        return neardomain_evalset()
    if dataset == "paraphrase":
        return paraphrase_evalset()
    if dataset == "documents":
        return documents_evalset()
    if dataset == "faqs":
        entries, _absent = collect()
        if beir_dir is not None:
            write_beir(beir_dir, entries)
            return load_beir(beir_dir, tenant=FAQ_TENANT, name="faqs")
        with tempfile.TemporaryDirectory(prefix="ragstream-faqs-") as tmp:
            write_beir(Path(tmp), entries)
            return load_beir(Path(tmp), tenant=FAQ_TENANT, name="faqs")
    if dataset.startswith("beir:"):
        return load_beir(Path(dataset[5:]), tenant="beir")
    return load_evalset(Path(dataset))
