"""The dev tools' subcommands of `ragstream`: dev, sor, bench, eval.

Registered through the `ragstream.commands` entry point of the ragstream-dev distribution, so
the production install (the `ragstream` distribution alone) has none of them.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

from ragcore.errors import RagstreamError
from ragdev.eval.configs import DEFAULT_CONFIGS
from ragstream.cli import print_json

#: `ragstream bench TARGET [options]`: the module of each benchmark (its options:
#: `ragstream bench TARGET --help`) and what it measures.
BENCHMARKS = {
    "store": "the embedded store (qdrant-edge) on synthetic data",
    "embedder": "the local embedder's bulk throughput and single-query latency",
    "ingest": "end-to-end ingest, Debezium change events in Kafka -> worker -> qdrant-edge",
    "retrieve": "the gRPC Retrieve server's client-side latency and QPS",
    "reconcile": "the cost of reconcile (no repair) at scale",
    "cdc": "PostgreSQL commit -> searchable through Retrieve, with real Debezium",
    "tenants": "what N small tenants cost, shared (partitions) or dedicated (collections)",
    "noisy": "does a quiet tenant keep its latency while another floods Retrieve",
    "calibration": "what one index's calibration costs (CPU, wall), with a hash of its result",
}
#: `ragstream eval --dataset`: the named eval sets (or a path).
DATASETS = (
    "golden | manpages | faqs | demo | neardomain | paraphrase | documents | beir:<dir> | "
    "<evalset.json>"
)


def _cmd_bench(args: argparse.Namespace) -> int:
    import importlib

    module = importlib.import_module(f"ragdev.bench.{args.target}")
    # each benchmark prints exactly one JSON document on stdout (logs go to stderr)
    code: int = module.main(args.options, prog=f"ragstream bench {args.target}")
    return code


def _cmd_eval(args: argparse.Namespace) -> int:
    from ragcore.quality.metrics import result_reliability
    from ragdev.eval.gate import check_gate, load_gate
    from ragdev.eval.report import summary_table, write_report
    from ragdev.eval.runner import (
        ConfigResult,
        comparison,
        retrieval_from_environment,
        run_eval,
    )
    from ragdev.eval.sets import load_named
    from retrieval_api.calibration import CalibrationSettings

    evalset = load_named(args.dataset, beir_dir=args.beir_dir)
    names = args.configs.split(",") if args.configs else list(DEFAULT_CONFIGS)
    unknown = [n for n in names if n not in DEFAULT_CONFIGS]
    if unknown:
        raise RagstreamError(f"unknown configurations {unknown}; known: {list(DEFAULT_CONFIGS)}")
    baselines = args.baselines.split(",") if args.baselines else []
    if baselines:
        # bm25s is a `dev` dependency: import it only when a baseline is asked for
        from ragdev.eval.lexical import BASELINES

        unknown = [n for n in baselines if n not in BASELINES]
        if unknown:
            raise RagstreamError(f"unknown baselines {unknown}; known: {list(BASELINES)}")
    base, from_environment = retrieval_from_environment()
    print(
        f"evaluating {evalset.name}: {len(evalset.entities)} entities, "
        f"{len(evalset.queries)} queries, configurations {names}, baselines {baselines}"
        + (f", RAGSTREAM_RETRIEVAL__* settings {from_environment}" if from_environment else ""),
        file=sys.stderr,
        flush=True,
    )
    calibration = CalibrationSettings.from_command(
        args.calibration_queries,
        seed=args.seed,
        max_false_abstention=args.max_false_abstention,
        threshold_queries=args.threshold_queries,
    )
    results = run_eval(
        evalset,
        configs={n: DEFAULT_CONFIGS[n] for n in names},
        base=base,
        top_k=args.top_k,
        max_context_tokens=args.max_context_tokens,
        calibrate=not args.no_calibrate,
        calibration=calibration,
        cache_dir=args.cache_dir,
        execution=args.embedder_execution,
    )
    for name in baselines:
        results.append(ConfigResult(name, {"baseline": name}, BASELINES[name](evalset, args.top_k)))
    doc: dict[str, Any] = {
        "dataset": {
            "name": evalset.name,
            "entities": len(evalset.entities),
            "queries": len(evalset.queries),
        },
        "retrieval_from_environment": from_environment,
        "configs": {r.name: {"overrides": r.overrides, **r.result.to_dict()} for r in results},
        "significance": comparison(results) if len(results) > 1 else {},
        "reliability": {
            r.name: [b.to_dict() for b in result_reliability(r.result)]
            for r in results
            if r.name not in baselines
        },
    }
    aggregates = {r.name: r.result.aggregates for r in results}
    print(summary_table(aggregates, doc["significance"]), file=sys.stderr)
    code = 0
    if args.gate is not None:
        gate = check_gate(
            results[0].result.aggregates, load_gate(args.gate), results[0].result.by_kind
        )
        doc["gate"] = {"file": str(args.gate), "passed": gate.passed, "summary": gate.summary()}
        print(gate.summary(), file=sys.stderr)
        code = 0 if gate.passed else 1
    if args.report is not None:
        paths = write_report(
            args.report,
            {r.name: dict(r.result.aggregates) for r in results},
            {r.name: [row.to_dict() for row in r.result.rows] for r in results},
            title=f"ragstream evaluation: {evalset.name}",
            reliability=doc["reliability"],
            significance=doc["significance"],
        )
        print(f"report: {paths}", file=sys.stderr)
    if args.json is not None:
        args.json.write_text(json.dumps(doc, indent=2, default=str))
    else:
        print_json(doc)
    return code


def _cmd_dev(args: argparse.Namespace) -> int:
    from ragdev.dev import DevPorts, run_dev

    ports = DevPorts(
        kafka=args.kafka_port,
        grpc=args.grpc_port,
        metrics=args.metrics_port,
        postgres=args.postgres_port,
    )
    return run_dev(args.data_dir, ports=ports, sample_limit=args.sample_size, sor=args.sor)


def _cmd_sor(args: argparse.Namespace) -> int:
    from ragdev.sor.rows import key_values, row_for_put
    from ragdev.stack import open_sor_writer

    writer = open_sor_writer(args.data_dir)
    try:
        mapping = writer.mapping(args.table)
        key = key_values(mapping, args.id)
        entity_id = mapping.entity_id(key)
        where = f"table {mapping.table}, topic {writer.topic(args.table)}"
        if args.action == "put":
            if args.text is None and args.file is None:
                raise RagstreamError("give the content with --text or --file")
            values = dict(_assignment(a) for a in args.set)
            text: str | bytes
            if mapping.document is not None and args.file is not None:
                text = args.file.read_bytes()  # a PDF, DOCX, XLSX or CSV file
                if mapping.document.name_column is not None:
                    values.setdefault(mapping.document.name_column, args.file.name)
            else:
                text = args.text if args.text is not None else args.file.read_text()
            row = row_for_put(
                mapping,
                key=args.id,
                tenant=args.tenant,
                text=text,
                title=args.title,
                entity_type=args.type,
                content_format=args.format,
                values=values,
            )
            op = writer.put(args.table, row)
            print(f"{'created' if op.value == 'c' else 'updated'} {entity_id} ({where})")
        elif args.action == "delete":
            done = (
                writer.soft_delete(args.table, key) if args.soft else writer.delete(args.table, key)
            )
            if not done:
                raise RagstreamError(f"no row {args.id!r} in {mapping.table}")
            print(f"{'soft-' if args.soft else ''}deleted {entity_id} ({where})")
        else:
            print_json(writer.row(args.table, key))
    finally:
        writer.close()
    return 0


def _assignment(text: str) -> tuple[str, str]:
    column, sep, value = text.partition("=")
    if not sep or not column:
        raise RagstreamError(f"--set takes column=value, got {text!r}")
    return column, value


def register(sub: Any) -> None:
    """Add the dev tools' subcommands to the `ragstream` parser's subparsers action."""
    p = sub.add_parser(
        "bench",
        help="benchmarks: one JSON report on stdout (`ragstream bench TARGET --help`)",
        description="Run one benchmark; it prints one JSON report on stdout. Targets: "
        + "; ".join(f"{name}: {what}" for name, what in BENCHMARKS.items())
        + ".",
    )
    p.add_argument(
        "target",
        choices=list(BENCHMARKS),
        help="the benchmark (its options: ragstream bench TARGET --help)",
    )
    p.add_argument(
        "options", nargs=argparse.REMAINDER, help="the benchmark's own options (see its --help)"
    )
    p.set_defaults(func=_cmd_bench)

    p = sub.add_parser("eval", help="evaluate retrieval quality through the real Retrieve path")
    p.add_argument(
        "--dataset",
        default="golden",
        help=DATASETS,
    )
    p.add_argument(
        "--baselines",
        default=None,
        help="in-process lexical baselines beside the configurations: bm25s, bm25s_k1.2, "
        "ragstream_bm25_doc (comma-separated)",
    )
    p.add_argument(
        "--beir-dir", type=Path, default=None, help="faqs: keep the BEIR files written here"
    )
    p.add_argument(
        "--max-context-tokens",
        type=int,
        default=None,
        help="send this token budget with every query (results carry context; the report "
        "gains context_p95_ms)",
    )
    p.add_argument(
        "--configs",
        default=None,
        help="comma-separated configurations (default: all): " + ", ".join(DEFAULT_CONFIGS),
    )
    p.add_argument("--top-k", type=int, default=10)
    p.add_argument("--gate", type=Path, default=None, help="fail (exit 1) below these floors")
    p.add_argument("--report", type=Path, default=None, help="write JSON + HTML report here")
    p.add_argument("--json", type=Path, default=None, help="write the full JSON here")
    p.add_argument(
        "--cache-dir", type=Path, default=None, help="keep the embedding cache here between runs"
    )
    p.add_argument(
        "--no-calibrate",
        action="store_true",
        help="score with the prior model instead of calibrating each index first",
    )
    p.add_argument(
        "--calibration-queries",
        type=int,
        default=150,
        help="self-supervised positives (and as many negatives) per index",
    )
    p.add_argument("--seed", type=int, default=0, help="seed of the calibration queries")
    p.add_argument(
        "--embedder-execution",
        choices=("float", "int8"),
        default="float",
        help="the local embedder's execution (RAGSTREAM_EMBEDDER__EXECUTION)",
    )
    p.add_argument(
        "--max-false-abstention",
        type=float,
        default=0.2,
        help="calibration: the hard threshold keeps at most this share of the answerable "
        "calibration queries (scored out of fold) from abstaining",
    )
    p.add_argument(
        "--threshold-queries",
        type=int,
        default=None,
        help="calibration: choose the hard threshold on this many times --calibration-queries",
    )
    p.set_defaults(func=_cmd_eval)

    p = sub.add_parser("dev", help="run the whole system on its embedded defaults")
    p.add_argument("--data-dir", type=Path, default=Path("data"), help="state directory")
    p.add_argument("--sample-size", type=int, default=None, help="load only N sample docs")
    p.add_argument("--kafka-port", type=int, default=19092)
    p.add_argument("--grpc-port", type=int, default=50051)
    p.add_argument("--metrics-port", type=int, default=9464)
    p.add_argument("--postgres-port", type=int, default=15432, help="with --sor postgres")
    p.add_argument(
        "--sor",
        choices=["sqlite", "postgres"],
        default="sqlite",
        help=(
            "sqlite: the light embedded SoR that publishes its own change events (default); "
            "postgres: PostgreSQL + real Debezium (Kafka Connect), production-like (needs a "
            "JRE and the `cdc` extra)"
        ),
    )
    p.set_defaults(func=_cmd_dev)

    p = sub.add_parser("sor", help="change the SoR of a running `ragstream dev`")
    p.add_argument("action", choices=["put", "delete", "get"])
    p.add_argument("--table", default="entities", help="mapped table (default: entities)")
    p.add_argument(
        "--id", required=True, help="the row's key (composite keys: values joined by commas)"
    )
    p.add_argument("--tenant", default="acme")
    p.add_argument("--title", default=None)
    p.add_argument("--type", default=None, help="entity type (tables with a type column)")
    p.add_argument("--format", choices=["text", "markdown", "html"], default=None)
    p.add_argument("--text", default=None, help="content (the table's last content column)")
    p.add_argument(
        "--file",
        type=Path,
        default=None,
        help="content from a file (a document table: the PDF, DOCX, XLSX or CSV itself)",
    )
    p.add_argument(
        "--set", action="append", default=[], metavar="COLUMN=VALUE", help="set any column"
    )
    p.add_argument("--soft", action="store_true", help="delete: set deleted_at instead")
    p.add_argument("--data-dir", type=Path, default=Path("data"))
    p.set_defaults(func=_cmd_sor)
