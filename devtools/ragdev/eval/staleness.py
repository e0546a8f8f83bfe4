"""What a calibration fitted before new content arrived costs the queries about that content.

`python -m ragdev.eval.staleness [--dataset golden] [--held-back 0.4] [--seed 0]`: a seeded
share of the set's entities is held back; the rest is indexed and calibrated; then every entity
is written (the held-back ones are new content). The queries scored are the answerable ones
whose relevant entities were all held back, and every unanswerable one, through the real
Retrieve path twice: with that earlier ("stale") calibration, and with one fitted after all the
writes ("fresh"). Prints one JSON document: the two results and the calibrations' chunk counts.
"""

from __future__ import annotations

import argparse
import json
import random
import tempfile
from pathlib import Path
from typing import Any

from ragcore.quality.metrics import Status
from ragdev.eval.runner import run_eval
from ragdev.eval.sets import load_named

#: The metrics the report keeps of each run.
KEPT = ("ndcg@5", "recall@5", "abstention_precision", "abstention_recall")


def _rounded(value: float | None) -> float | None:
    return None if value is None else round(value, 4)


def measure(
    dataset: str, held_back: float, seed: int, cache_dir: Path | None, root: Path
) -> dict[str, Any]:
    """Run the comparison (see the module docstring) in `root`."""
    evalset = load_named(dataset)
    ids = sorted(e.entity_id for e in evalset.entities)
    late = set(random.Random(seed).sample(ids, round(held_back * len(ids))))
    early = evalset.model_copy(
        update={
            "entities": tuple(e for e in evalset.entities if e.entity_id not in late),
            "queries": (),
        }
    )
    fresh_queries = [
        q for q in evalset.queries if q.answerable and q.relevant and set(q.relevant) <= late
    ]
    scored = evalset.model_copy(
        update={"queries": (*fresh_queries, *(q for q in evalset.queries if not q.answerable))}
    )
    fresh_ids = {q.query_id for q in fresh_queries}
    out: dict[str, Any] = {
        "dataset": dataset,
        "seed": seed,
        "entities": len(ids),
        "held_back": len(late),
        "queries": {
            "about_new_content": len(fresh_queries),
            "unanswerable": len(scored.queries) - len(fresh_queries),
        },
    }
    # the stale calibration: fitted on the early entities only, kept while the rest arrive
    run_eval(
        early, configs={"default": {}}, data_dir=root / "stale", cache_dir=cache_dir, progress=False
    )
    for name, calibrate in (("stale", False), ("fresh", True)):
        (result,) = run_eval(
            scored,
            configs={"default": {}},
            data_dir=root / name,
            cache_dir=cache_dir,
            calibrate=calibrate,
            progress=False,
        )
        r = result.result
        out[name] = {
            **{k: _rounded(r.aggregates.get(k)) for k in KEPT},
            "new_content_abstained": sum(
                1
                for row in r.rows
                if row.query_id in fresh_ids and row.status is Status.NO_EVIDENCE
            ),
        }
    return out


def main(argv: list[str] | None = None) -> int:
    """Command line entry point."""
    parser = argparse.ArgumentParser(prog="python -m ragdev.eval.staleness", description=__doc__)
    parser.add_argument("--dataset", default="golden")
    parser.add_argument("--held-back", type=float, default=0.4)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--cache-dir", type=Path, default=None)
    args = parser.parse_args(argv)
    with tempfile.TemporaryDirectory(prefix="ragstream-staleness-") as tmp:
        doc = measure(args.dataset, args.held_back, args.seed, args.cache_dir, Path(tmp))
    print(json.dumps(doc, indent=2))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
