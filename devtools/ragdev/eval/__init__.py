"""Retrieval evaluation harness: eval sets and their data, the runner, reports and gates.

- `ragcore.quality` (production uses it too): the `EvalSet` model, metrics, significance tests.
- `sets`: named sets (golden, manpages, faqs, neardomain, paraphrase, documents, BEIR
  directories, files).
- `beir`: BEIR-format directories -> `EvalSet`; `faqs`: the FAQ set written as BEIR files.
- `manpages`: the pinned known-item benchmark built from `/usr/share/man/man1`.
- `lexical`: in-process lexical baselines (bm25s, ours over whole documents).
- `runner`: indexes a set through the real ingest path and queries gRPC Retrieve.
- `report`: JSON + self-contained HTML (inline SVG chart) reports.
- `gate`: floors/ceilings on aggregate metrics (the CI regression gate).
"""

from __future__ import annotations

from pathlib import Path

DATA_DIR = Path(__file__).resolve().parent / "data"
GOLDEN_PATH = DATA_DIR / "golden.json"
GOLDEN_GATE_PATH = DATA_DIR / "golden.gate.json"
DOCUMENTS_GATE_PATH = DATA_DIR / "documents.gate.json"
PARAPHRASE_GATE_PATH = DATA_DIR / "paraphrase.gate.json"
SCHEMA_PATH = DATA_DIR / "evalset.schema.json"
MANPAGES_PIN_PATH = DATA_DIR / "manpages.pin.json"

__all__ = [
    "DATA_DIR",
    "DOCUMENTS_GATE_PATH",
    "GOLDEN_GATE_PATH",
    "GOLDEN_PATH",
    "MANPAGES_PIN_PATH",
    "PARAPHRASE_GATE_PATH",
    "SCHEMA_PATH",
]
