"""Retrieval evaluation: eval sets, metrics, significance tests, reports and regression gates.

- `dataset`: the `EvalSet` model (entities + graded queries), JSON load/save, JSON Schema.
- `metrics`: ranking and abstention metrics from per-query runs (pure).
- `significance`: paired bootstrap and sign-flip permutation tests (pure, numpy).
- `beir`: BEIR-format directories -> `EvalSet`.
- `manpages`: the pinned known-item benchmark built from `/usr/share/man/man1`.
- `report`: JSON + self-contained HTML (inline SVG chart) reports.
- `gate`: floors/ceilings on aggregate metrics (the CI regression gate).

Nothing here talks to a service: the runner that sends queries through gRPC Retrieve feeds
`metrics.QueryRun`s in and gets `metrics.EvalResult`s out.
"""

from __future__ import annotations

from pathlib import Path

DATA_DIR = Path(__file__).resolve().parent / "data"
GOLDEN_PATH = DATA_DIR / "golden.json"
GOLDEN_GATE_PATH = DATA_DIR / "golden.gate.json"
SCHEMA_PATH = DATA_DIR / "evalset.schema.json"
MANPAGES_PIN_PATH = DATA_DIR / "manpages.pin.json"

__all__ = [
    "DATA_DIR",
    "GOLDEN_GATE_PATH",
    "GOLDEN_PATH",
    "MANPAGES_PIN_PATH",
    "SCHEMA_PATH",
]
