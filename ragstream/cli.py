"""The `ragstream` command line."""

from __future__ import annotations

import argparse
import json
import logging
import os
import signal
import sys
from collections.abc import Sequence
from importlib.metadata import entry_points
from pathlib import Path
from typing import TYPE_CHECKING, Any

from pydantic import ValidationError
from pydantic_settings import SettingsError

from ragcore.errors import RagstreamError

if TYPE_CHECKING:
    from ragcore.settings import ServiceSettings
    from ragcore.store.base import VectorStore
    from ragcore.store.registry import IndexRegistry
    from schemas.entities import ContentFormat
    from streams.settings import IngestSettings

#: Entry-point group through which other distributions add subcommands: each entry is a
#: callable taking the subparsers action (see devtools/ragdev/cli.py).
COMMANDS_GROUP = "ragstream.commands"
#: The file in its data dir where a running `ragstream dev` describes itself (ragdev.stack).
DEV_STACK_FILE = "dev-stack.json"


class HelpFormatter(argparse.ArgumentDefaultsHelpFormatter):
    """`--help` that shows the default of every option that has one, help text or not."""

    def add_argument(self, action: argparse.Action) -> None:
        """Give an option without help text one that shows its default."""
        if (
            action.help is None
            and action.option_strings
            and action.default not in (None, False, argparse.SUPPRESS)
        ):
            action.help = "(default: %(default)s)"
        super().add_argument(action)

    def _get_help_string(self, action: argparse.Action) -> str | None:
        # No "(default: None)" or "(default: False)": an unset option or a flag says nothing.
        if action.default in (None, False, []) or "(default:" in (action.help or ""):
            return action.help
        return super()._get_help_string(action)


class CommandParser(argparse.ArgumentParser):
    """The parser of a subcommand: its `--help` names it in full (`ragstream sor`, set by
    argparse from the parent's prog) and shows every default."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        kwargs.setdefault("formatter_class", HelpFormatter)
        super().__init__(*args, **kwargs)


def print_json(doc: Any) -> None:
    json.dump(doc, sys.stdout, indent=2, ensure_ascii=False, default=str)
    sys.stdout.write("\n")


def _cmd_inspect_event(args: argparse.Namespace) -> int:
    from ragcore.embedders.local_onnx import MINILM_SPEC
    from ragcore.prepare import ChunkingSettings, Preparer
    from ragstream.inspect import inspect_record, read_record
    from streams.settings import IngestSettings

    if args.file is None and args.value is None and args.key is None:
        raise RagstreamError("give a record file, or --key/--value files")
    raw = read_record(args.file, args.key, args.value, args.topic)
    preparer = Preparer(MINILM_SPEC, ChunkingSettings(max_tokens=args.max_tokens))
    # the worker's own table mappings and decode options (RAGSTREAM_PLAN__*, _DECODE__*)
    settings = IngestSettings()
    print_json(
        inspect_record(
            raw,
            preparer=preparer,
            plan_config=settings.plan,
            decode_options=settings.decode.options(),
        )
    )
    return 0


def _cmd_chunk_preview(args: argparse.Namespace) -> int:
    from ragcore.embedders.local_onnx import MINILM_SPEC
    from ragcore.tokenizers import chunk_budget, load_token_counter
    from ragstream.chunk_preview import preview

    fmt = _preview_format(args)
    text: str | bytes
    if fmt.is_document:
        text = args.file.read_bytes() if args.file is not None else sys.stdin.buffer.read()
    else:
        text = args.file.read_text() if args.file is not None else sys.stdin.read()
    tokenizer = args.tokenizer or MINILM_SPEC.tokenizer
    max_tokens = args.max_tokens
    if args.tokenizer is None:
        # the model's own budget caps what was asked for
        max_tokens = chunk_budget(MINILM_SPEC, load_token_counter(tokenizer), args.max_tokens)
    elif max_tokens is None:
        raise RagstreamError("--max-tokens is required with a custom --tokenizer")
    report = preview(
        text,
        fmt,
        tokenizer_ref=tokenizer,
        max_tokens=max_tokens,
        overlap_tokens=args.overlap,
        strategy=args.strategy,
        redact_pii=args.redact_pii,
        document_name=args.file.name if args.file is not None else None,
    )
    print_json(report)
    return 0


def _preview_format(args: argparse.Namespace) -> ContentFormat:
    """--format, else a document format sniffed from the file (PDF, DOCX, XLSX), else text."""
    from ragcore.documents import sniff
    from schemas.entities import ContentFormat as Format

    if args.format is not None:
        return Format(args.format)
    if args.file is not None:
        with args.file.open("rb") as handle:
            head = handle.read(4096)
        if head.startswith(b"PK"):
            head = args.file.read_bytes()  # a ZIP package is told by its part names
        found = sniff(head)
        if found is not None and found is not Format.CSV:
            return found
        if args.file.suffix.lower() == ".csv":
            return Format.CSV
    return Format.TEXT


def _cmd_ingest(args: argparse.Namespace) -> int:
    from streams.app import main as ingest_main

    return ingest_main()


def _cmd_serve(args: argparse.Namespace) -> int:
    from retrieval_api.app import main as serve_main

    return serve_main()


def _cmd_query(args: argparse.Namespace) -> int:
    from ragstream.query import print_pack, query

    pack = query(
        args.target,
        args.token,
        args.question,
        tenant=args.tenant,
        top_k=args.top_k,
        index_version=args.index_version,
        timeout_s=args.timeout,
        data_dir=args.data_dir,
        max_context_tokens=args.max_context_tokens,
    )
    print_pack(pack, as_json=args.json, detail=args.detail, scores=args.scores)
    return 0


def _cmd_calibrate(args: argparse.Namespace) -> int:
    import time

    from ragcore.calibration_state import DEFAULT_STALE_RATIO, calibration_state
    from ragcore.embedding_models import EmbeddingModels
    from ragcore.errors import IndexNotFoundError, RagstreamError
    from ragcore.rerankers import RerankerAdapter, build_reranker
    from ragcore.store.base import StoreFilter
    from ragcore.wiring import build_core, open_store, payload_schema
    from retrieval_api.calibration import CalibrationSettings, calibrate_version
    from retrieval_api.candidates import CandidateSearch
    from retrieval_api.settings import RetrieveSettings

    settings = RetrieveSettings()
    # the store a live process holds (ragstream dev), else the configured one; the rest is
    # wired by the one builder, as Retrieve wires it
    store = open_store(settings.store, payload_schema(settings.plan))
    owned: list[Any] = [store]
    try:
        core = build_core(settings, store=store)
        owned.append(core)
        models = EmbeddingModels(core.embedder, [core.next_embedder] if core.next_embedder else [])
        reranker: RerankerAdapter | None = None
        if settings.retrieval.rerank_enabled and settings.reranker is not None:
            reranker = build_reranker(settings.reranker)
            owned.append(reranker)
        search = CandidateSearch(
            config=settings.retrieval,
            encoder=core.sparse,
            store=core.store,
            registry=core.registry,
            rerank=reranker.score if reranker is not None else None,
        )
        fit = CalibrationSettings.from_command(
            args.queries,
            seed=args.seed,
            max_false_abstention=args.max_false_abstention,
            threshold_queries=args.threshold_queries,
        )

        def calibrate(tenant: str, version: int | None) -> dict[str, Any]:
            index = core.registry.lookup(tenant, version)
            embedder = models.for_manifest(index.manifest, core.sparse.model_version)
            calibration = calibrate_version(
                search,
                core.registry,
                index,
                embedder,
                core.store,
                settings=fit,
                with_rerank=reranker is not None,
                progress=lambda line: print(f"calibrate: {line}", file=sys.stderr, flush=True),
            )
            t = calibration.thresholds
            return {
                "tenant": index.tenant,
                "version": index.version,
                "index": index.collection,
                "fingerprint": calibration.fingerprint,
                "order": calibration.ranking.label,
                "thresholds": {"hard": t.hard, "medium": t.medium, "high": t.high},
                "report": calibration.report,
            }

        if args.tenant is not None:
            print_json(calibrate(args.tenant, args.version))
            return 0
        # every tenant's active version whose calibration is due (--stale) or all of them
        started = time.monotonic()
        due: list[tuple[float, str, dict[str, Any]]] = []
        for tenant in sorted(core.registry.list_tenants()):
            try:
                index = core.registry.lookup(tenant, None)
            except IndexNotFoundError:
                continue  # no active version: nothing serves, nothing to calibrate
            chunks = core.store.count(index.collection, StoreFilter(tenant_id=tenant))
            state = calibration_state(
                core.registry,
                tenant,
                index.version,
                chunks,
                stale_ratio=DEFAULT_STALE_RATIO if args.stale_ratio is None else args.stale_ratio,
            )
            if args.stale and state.state == "fitted":
                continue
            # the uncalibrated and the most changed first, larger indexes first among equals
            change = state.change
            urgency = float("inf") if change is None else change
            due.append((urgency, tenant, {"version": index.version, **state.to_dict()}))
        due.sort(key=lambda d: (-d[0], -int(d[2]["chunks"]), d[1]))
        results: list[dict[str, Any]] = []
        failed = 0
        for _, tenant, before in due:
            row: dict[str, Any] = {"tenant": tenant, "before": before}
            if args.dry_run:
                row["calibrated"] = False
            elif args.max_seconds is not None and time.monotonic() - started > args.max_seconds:
                row["calibrated"] = False
                row["skipped"] = f"--max-seconds {args.max_seconds:g} spent (the next run goes on)"
            else:
                began = time.monotonic()
                try:
                    done = calibrate(tenant, before["version"])
                except RagstreamError as exc:
                    failed += 1
                    row.update(calibrated=False, error=f"{type(exc).__name__}: {exc}")
                else:
                    row.update(
                        calibrated=True,
                        fingerprint=done["fingerprint"],
                        thresholds=done["thresholds"],
                        seconds=round(time.monotonic() - began, 2),
                    )
            results.append(row)
        print_json(
            {
                "selected": "stale" if args.stale else "all",
                "dry_run": args.dry_run,
                "tenants": results,
                "calibrated": sum(1 for r in results if r["calibrated"]),
                "failed": failed,
            }
        )
        return 1 if failed else 0
    finally:
        for part in reversed(owned):
            part.close()


def _hosted_store(settings: ServiceSettings) -> VectorStore | None:
    """The embedded store through the live process that holds it (`ragstream dev`), or None:
    the command then opens the store itself."""
    from ragcore.store.host import advertised_store

    if settings.store.backend != "edge":
        return None
    return advertised_store(settings.store.data_dir)


def _cmd_reconcile(args: argparse.Namespace) -> int:
    from prometheus_client import CollectorRegistry

    from ragcore.errors import ConfigError
    from streams.app import build_worker
    from streams.reconcile import reconcile
    from streams.settings import IngestSettings

    settings = IngestSettings()
    hosted = _hosted_store(settings)
    worker = build_worker(settings, CollectorRegistry(), store=hosted)
    try:
        if worker.sor is None:
            raise ConfigError("reconcile reads the system of record: set RAGSTREAM_SOR__KIND")
        sor, store, registry = worker.sor, worker.store, worker.registry
        report = reconcile(
            args.tenant,
            sor=sor,
            store=store,
            registry=registry,
            handler=worker.handler,
            repair=args.repair,
        )
        doc = report.to_dict()
        remaining = report.drift
        if args.repair and report.drift:
            after = reconcile(args.tenant, sor=sor, store=store, registry=registry)
            doc["after_repair"] = after.to_dict()
            remaining = after.drift
        print_json(doc)
    finally:
        worker.close()
        if hosted is not None:
            hosted.close()
    return 0 if remaining == 0 else 1


def _cmd_dlq(args: argparse.Namespace) -> int:
    from ragstream.dlq import (
        KafkaLetters,
        describe_letters,
        list_group,
        parking_topic_of,
    )
    from streams.decode import decode_record
    from streams.settings import IngestSettings

    settings = IngestSettings()
    dlq_topic = settings.consumer.dlq_topic
    parking = args.parking_topic or parking_topic_of(dlq_topic)
    topic = parking if args.parked else (args.topic or dlq_topic)
    options = settings.decode.options()
    if args.action == "list":
        with KafkaLetters(
            settings.kafka,
            topic,
            list_group(topic),
            from_beginning=True,
            idle_s=args.idle_s,
            missing_ok=topic == parking,
        ) as letters:
            records = letters.read().records
        print_json(
            describe_letters(
                records,
                decode=lambda raw: decode_record(raw, options),
                config=settings.plan,
                reindex_topic=settings.consumer.reindex_topic,
            )
        )
        return 0
    return _dlq_replay(args, settings, topic, parking)


def _dlq_replay(
    args: argparse.Namespace, settings: IngestSettings, topic: str, parking: str
) -> int:
    from prometheus_client import CollectorRegistry

    from ragcore.errors import ConfigError, UnavailableError
    from ragstream.dlq import KafkaLetters, ReplayReport, replay_dlq, sor_locator
    from streams.app import build_worker
    from streams.decode import decode_record

    worker = build_worker(settings, CollectorRegistry())
    try:
        sor = worker.sor
        if sor is None:
            raise ConfigError("dlq replay re-reads the SoR: set RAGSTREAM_SOR__KIND")
        options = settings.decode.options()
        try:
            worker.check()
        except UnavailableError as exc:  # an outage before anything was read
            report = ReplayReport(topic, parking).unavailable(exc)
        else:
            with KafkaLetters(
                settings.kafka,
                topic,
                args.group or f"{settings.consumer.group_id}-dlq-replay",
                from_beginning=args.from_beginning,
                idle_s=args.idle_s,
                high_watermark_slack=settings.consumer.high_watermark_slack,
                missing_ok=topic == parking,
            ) as letters:
                report = replay_dlq(
                    letters,
                    parking_topic=parking,
                    decode=lambda raw: decode_record(raw, options),
                    config=settings.plan,
                    handler=worker.handler,
                    known_tenants=worker.targets.known_tenants,
                    locate=sor_locator(sor),
                    reindex_topic=settings.consumer.reindex_topic,
                    max_attempts=args.max_attempts,
                )
    finally:
        worker.close()
    print_json(report.as_dict())
    return report.exit_code


def _cmd_slots(args: argparse.Namespace) -> int:
    from dataclasses import asdict

    from ragcore.errors import ConfigError
    from ragcore.sor.base import SlotSource
    from ragcore.wiring import build_sor
    from streams.settings import IngestSettings

    settings = IngestSettings()
    sor = build_sor(settings.sor, settings.plan.catalog, lambda text, _fmt: "")
    if sor is None or not isinstance(sor, SlotSource):
        raise ConfigError("slots reads a PostgreSQL SoR: set RAGSTREAM_SOR__KIND=postgres")
    try:
        slots = sor.replication_slots()
    finally:
        sor.close()
    print_json([asdict(slot) for slot in slots])
    inactive = [s for s in slots if not s.active or s.wal_status == "lost"]
    return 1 if inactive else 0


def _cmd_reindex(args: argparse.Namespace) -> int:
    from prometheus_client import CollectorRegistry

    from ragcore.errors import ConfigError
    from ragcore.prepare import Preparer
    from ragcore.wiring import new_tenant_placement
    from ragstream.parity import ParitySettings
    from ragstream.reindex import ReindexOptions, calibrate_with, reindex, retriever_search
    from retrieval_api.metrics import RetrieveMetrics
    from retrieval_api.retriever import Retriever
    from retrieval_api.settings import RetrieveSettings
    from streams.app import build_worker
    from streams.settings import IngestSettings

    settings = IngestSettings()
    hosted = _hosted_store(settings)
    worker = build_worker(settings, CollectorRegistry(), store=hosted)
    try:
        if worker.sor is None:
            raise ConfigError("reindex reads the system of record: set RAGSTREAM_SOR__KIND")
        models = worker.models
        embedder = models.primary if args.model is None else models.get(args.model)
        if embedder is None:
            raise ConfigError(
                f"model {args.model!r} is not configured (configured: "
                f"{', '.join(models.versions())}); set RAGSTREAM_NEXT_EMBEDDER__* to the new "
                f"model here and on the ingest workers and Retrieve"
            )
        config = RetrieveSettings().retrieval
        # the worker's parts (built by ragcore.wiring.build_core): Retrieve's pipeline over them
        sparse = worker.sparse
        retriever = Retriever(
            config=config,
            embedder=models.primary,
            other_embedders=list(models)[1:],
            sparse=sparse,
            store=worker.store,
            registry=worker.registry,
            sor=worker.sor,
            metrics=RetrieveMetrics(CollectorRegistry()),
        )
        parity = ParitySettings(
            tolerance=args.tolerance, sample=args.parity_sample, top_k=args.parity_top_k
        )
        options = ReindexOptions(
            parity=parity,
            parity_queries=args.parity_queries,
            force=args.force,
            switch=not args.no_switch,
            grace_s=args.grace_s,
            retire=not args.no_retire,
            drop_retired=args.drop_retired,
            settle_s=args.settle_s,
            placement=args.placement,
            dedicated_above_points=settings.store.dedicated_above_points,
            new_tenants=new_tenant_placement(settings.store, worker.store),
        )
        report = reindex(
            args.tenant,
            embedder=embedder,
            preparer=Preparer(embedder.spec, settings.chunking),
            handler=worker.handler,
            registry=worker.registry,
            store=worker.store,
            sor=worker.sor,
            sparse_encoder=sparse.model_version,
            search=None if args.skip_parity else retriever_search(retriever, parity.top_k),
            calibrate=None if args.skip_calibration else calibrate_with(retriever, embedder),
            options=options,
            progress=lambda line: print(f"reindex: {line}", file=sys.stderr, flush=True),
        )
        print_json(report.to_dict())
    finally:
        worker.close()
        if hosted is not None:
            hosted.close()
    return {"switched": 0, "built": 0, "parity_failed": 3, "drift": 4}[report.outcome]


def _cmd_index(args: argparse.Namespace) -> int:
    from ragcore.store.base import StoreFilter
    from ragcore.wiring import build_registry, open_store, payload_schema
    from streams.settings import IngestSettings

    settings = IngestSettings()
    store = open_store(settings.store, payload_schema(settings.plan))
    try:
        registry = build_registry(settings.store, store)
        if args.action == "placement":
            print_json(_placements(registry, store, settings.store.dedicated_above_points))
            return 0
        if args.tenant is None:
            raise RagstreamError(f"`ragstream index {args.action}` needs --tenant")
        if args.action == "activate":
            registry.activate(args.tenant, _version(args))
        elif args.action == "retire":
            retired = registry.retire(args.tenant, _version(args))
            if args.drop:
                store.drop_collection(retired.index_name)
        active = registry.active_version(args.tenant)
        rows = []
        for manifest in registry.list_versions(args.tenant):
            live = store.collection_exists(manifest.index_name)
            points = (
                store.count(manifest.index_name, StoreFilter(tenant_id=args.tenant))
                if live
                else None
            )
            rows.append(
                {
                    **manifest.model_dump(mode="json"),
                    "active": manifest.version == active,
                    "points": points,
                }
            )
        print_json({"tenant": args.tenant, "active": active, "versions": rows})
    finally:
        store.close()
    return 0


def _cmd_status(args: argparse.Namespace) -> int:
    from ragstream.status import Slos, from_metrics, from_prometheus, render

    slos = Slos(
        freshness_p95_s=args.slo_freshness_p95,
        backlog_age_s=args.slo_backlog_age,
        lag_records=args.slo_lag,
        dlq_per_hour=args.slo_dlq_per_hour,
        drift_entities=args.slo_drift,
        retrieve_p95_s=args.slo_retrieve_p95,
        error_rate=args.slo_error_rate,
    )
    if args.prometheus:
        report = from_prometheus(args.prometheus, slos, args.selector)
    else:
        urls = args.metrics or _default_metrics_urls()
        report = from_metrics(urls, slos, window_s=args.window)
    if args.json:
        print_json(report.to_dict())
    else:
        print(render(report))
    return 1 if report.breached else 0


def _default_metrics_urls() -> list[str]:
    """Both services' /metrics as the RAGSTREAM_* settings place them."""
    from retrieval_api.settings import RetrieveSettings
    from streams.settings import IngestSettings

    urls = []
    for settings in (IngestSettings(), RetrieveSettings()):
        host = settings.metrics_host
        host = f"[{host}]" if ":" in host else host
        urls.append(f"http://{host}:{settings.metrics_port}/metrics")
    return list(dict.fromkeys(urls))


def _placements(registry: IndexRegistry, store: VectorStore, threshold: int) -> dict[str, Any]:
    """Every tenant's active placement and size, and which shared ones are due for promotion
    (`ragstream reindex --tenant T` promotes them; docs/decisions/tiered-tenancy.md)."""
    from ragcore.store.base import StoreFilter

    tenants: list[dict[str, Any]] = []
    for tenant in registry.list_tenants():
        active = registry.active_version(tenant)
        if active is None:
            tenants.append({"tenant": tenant, "active": None})
            continue
        manifest = registry.manifest(tenant, active)
        points = store.count(manifest.index_name, StoreFilter(tenant_id=tenant))
        tenants.append(
            {
                "tenant": tenant,
                "active": active,
                "placement": manifest.placement,
                "points": points,
                "due_for_promotion": manifest.placement == "shared" and points > threshold,
            }
        )
    by_placement = {
        p: sum(1 for t in tenants if t.get("placement") == p) for p in ("shared", "dedicated")
    }
    return {
        "dedicated_above_points": threshold,
        "tenants_by_placement": by_placement,
        "due_for_promotion": [t["tenant"] for t in tenants if t.get("due_for_promotion")],
        "tenants": tenants,
    }


def _version(args: argparse.Namespace) -> int:
    if args.version is None:
        raise RagstreamError(f"`ragstream index {args.action}` needs --version")
    return int(args.version)


def _cmd_tables(args: argparse.Namespace) -> int:
    from ragstream import tables

    try:
        if args.action == "discover":
            return _tables_discover(args)
        return _tables_check(args)
    except tables.UnreachableError as exc:
        print(f"ragstream: error [{exc.code}]: {exc}", file=sys.stderr)
        return tables.EXIT_UNREACHABLE


def _tables_discover(args: argparse.Namespace) -> int:
    from ragstream import tables
    from ragstream.connector import ConnectorTarget
    from ragstream.discover import DiscoverOptions

    dsn = tables.dsn_from(args.dsn)
    target = ConnectorTarget(
        name=args.connector_name,
        topic_prefix=args.topic_prefix or os.environ.get("RAGSTREAM_PLAN__TOPIC_PREFIX") or "sor",
        publication=args.publication or "ragstream",
        slot=args.slot,
        partitions=args.partitions or 1,
        database=tables.dsn_parts(dsn),
    )
    report = tables.discover(
        tables.DiscoverRequest(
            dsn=dsn,
            schemas=tuple(args.schema or ()),
            tables=tuple(args.table or ()),
            exclude=tuple(args.exclude or ()),
            options=DiscoverOptions(tenant_column=args.tenant_column, tenant=args.tenant),
            sample_rows=1000 if args.sample_rows is None else args.sample_rows,
            connector=args.connector is not None,
            target=target,
            publication_given=args.publication is not None,
            bootstrap_servers=args.bootstrap_servers
            or os.environ.get("RAGSTREAM_KAFKA__BOOTSTRAP_SERVERS")
            or "127.0.0.1:9092",
        )
    )
    print_json(report)
    if args.write is not None:
        for path in tables.write_files(report, args.write):
            print(f"wrote {path}", file=sys.stderr)
    proposed = report["RAGSTREAM_PLAN__TABLES"]
    problems = [p for t in report["tables"] for p in t["problems"]] + report["problems"]
    tables.print_lines(problems)
    print(
        f"{len(proposed)} table(s) proposed, {len(report['left_out'])} left out, "
        f"{len(problems)} problem(s) to review (`ragstream tables check` re-checks)",
        file=sys.stderr,
    )
    return tables.EXIT_OK if proposed else tables.EXIT_PROBLEMS


def _tables_check(args: argparse.Namespace) -> int:
    from ragcore.plan import PlanConfig
    from ragstream import tables
    from ragstream.connector import load_connector
    from streams.settings import IngestSettings

    if args.connector is True:
        raise RagstreamError("`ragstream tables check --connector` takes the connector's FILE")
    settings = IngestSettings()
    plan = settings.plan
    if args.tables is not None:
        plan = PlanConfig(
            tables=tuple(tables.load_tables(args.tables)),
            topic_prefix=plan.topic_prefix,
            policy=plan.policy,
        )
    dsn = args.dsn or (
        settings.sor.dsn.get_secret_value() if settings.sor.dsn is not None else None
    )
    kafka = None
    if not args.no_broker:
        kafka = settings.kafka
        if args.bootstrap_servers:
            kafka = kafka.model_copy(update={"bootstrap_servers": args.bootstrap_servers})
    consumer = settings.consumer
    report, code = tables.check(
        tables.CheckRequest(
            dsn=tables.dsn_from(dsn),
            plan=plan,
            kafka=kafka,
            required_topics=tuple(
                t for t in (consumer.dlq_topic, consumer.reindex_topic) if t is not None
            ),
            heartbeat_prefix=settings.decode.heartbeat_topic_prefix,
            connector=load_connector(args.connector) if args.connector is not None else None,
            publication=args.publication,
            partitions=args.partitions,
            sample_rows=10_000 if args.sample_rows is None else args.sample_rows,
            errors_only=args.errors_only,
        )
    )
    print_json(report)
    tables.print_lines(report["problems"])
    counts = report["counts"]
    print(
        f"{len(plan.tables)} table(s) checked: {counts['error']} error(s), "
        f"{counts['warning']} warning(s), {counts['note']} note(s)",
        file=sys.stderr,
    )
    return code


def _connector_arg(value: str) -> Path:
    return Path(value)


def _cmd_config(args: argparse.Namespace) -> int:
    from ragcore.settings import settings_report
    from ragstream.envtable import markdown, service_settings

    services = service_settings()
    if args.env_table:
        print(markdown(services))
        return 0
    chosen = [args.service] if args.service else list(services)
    if args.dev:
        print_json({name: _dev_settings(args.data_dir)[name] for name in chosen})
        return 0
    print_json({name: settings_report(services[name]()) for name in chosen})
    return 0


def _dev_settings(data_dir: Path) -> dict[str, Any]:
    """The settings a running `ragstream dev` serves with (its stack file keeps them, secrets
    masked, since it builds them in code rather than from the environment)."""
    path = data_dir / DEV_STACK_FILE
    if not path.is_file():
        raise RagstreamError(f"no running dev stack: {path} not found (start `ragstream dev`)")
    settings = json.loads(path.read_text()).get("settings")
    if not isinstance(settings, dict):
        raise RagstreamError(f"{path} holds no settings (a stack started by an older ragstream)")
    return settings


def build_parser() -> argparse.ArgumentParser:
    """The argument parser of every subcommand."""
    parser = argparse.ArgumentParser(
        prog="ragstream",
        description="Keep a retrieval index true to its system of record.",
        formatter_class=HelpFormatter,
    )
    parser.add_argument("-v", "--verbose", action="store_true", help="debug logging")
    sub = parser.add_subparsers(dest="command", required=True, parser_class=CommandParser)

    p = sub.add_parser("inspect-event", help="what ingest would do with one Debezium record")
    p.add_argument("file", nargs="?", type=Path, help="JSON object with key, value, headers")
    p.add_argument("--key", type=Path, help="file holding the record key")
    p.add_argument("--value", type=Path, help="file holding the record value")
    p.add_argument("--topic", default="sor.public.entities", help="topic the record came from")
    p.add_argument("--max-tokens", type=int, default=None, help="chunk budget (model cap)")
    p.set_defaults(func=_cmd_inspect_event)

    p = sub.add_parser("chunk-preview", help="normalize and chunk a file, print chunks as JSON")
    p.add_argument("file", nargs="?", type=Path, help="input file (default: stdin)")
    p.add_argument(
        "--format",
        choices=["text", "html", "markdown", "pdf", "docx", "xlsx", "csv"],
        default=None,
        help="default: pdf/docx/xlsx sniffed from the file, csv by its extension, else text",
    )
    p.add_argument("--strategy", choices=["sentence", "paragraph"], default="sentence")
    p.add_argument("--max-tokens", type=int, default=None, help="chunk budget")
    p.add_argument("--overlap", type=int, default=None, help="overlap tokens")
    p.add_argument(
        "--tokenizer",
        default=None,
        help="tiktoken:<encoding> | hf:<tokenizer.json> (default: the local model's)",
    )
    p.add_argument("--redact-pii", action="store_true", help="redact emails and phone numbers")
    p.set_defaults(func=_cmd_chunk_preview)

    p = sub.add_parser("ingest", help="run the ingest worker (settings from RAGSTREAM_* env)")
    p.set_defaults(func=_cmd_ingest)

    p = sub.add_parser("serve", help="run the gRPC Retrieve server (settings from env)")
    p.set_defaults(func=_cmd_serve)

    p = sub.add_parser("query", help="call Retrieve over gRPC and print the evidence pack")
    p.add_argument("question", help="the query text")
    p.add_argument("--tenant", default="", help="tenant (optional: the token implies it)")
    p.add_argument("--target", default="127.0.0.1:50051", help="host:port of the server")
    p.add_argument(
        "--token", default=None, help="API token (default: $RAGSTREAM_TOKEN, or the dev token)"
    )
    p.add_argument("--top-k", type=int, default=5)
    p.add_argument("--index-version", default="", help="pin an index version (default: active)")
    p.add_argument(
        "--max-context-tokens",
        type=int,
        default=None,
        help="token budget: results carry the text around them, cut to fit",
    )
    p.add_argument("--timeout", type=float, default=10.0, help="deadline in seconds")
    p.add_argument("--json", action="store_true", help="print the pack as JSON")
    p.add_argument(
        "--detail", action="store_true", help="list every excluded chunk (default: counts)"
    )
    p.add_argument(
        "--scores",
        choices=["both", "order", "evidence"],
        default="both",
        help="scores shown per result: the one that ordered them, the evidence score, or both",
    )
    p.add_argument("--data-dir", type=Path, default=Path("data"), help="dev stack (tokens)")
    p.set_defaults(func=_cmd_query)

    p = sub.add_parser(
        "calibrate",
        help="fit an index version's evidence score (self-supervised) and store it with the index",
    )
    which = p.add_mutually_exclusive_group(required=True)
    which.add_argument("--tenant", help="this tenant's version (--version, default: active)")
    which.add_argument(
        "--stale",
        action="store_true",
        help="every tenant whose active version is uncalibrated, unreadable or stale (its chunk "
        "count moved more than --stale-ratio since it was calibrated), most changed first",
    )
    which.add_argument("--all", action="store_true", help="every tenant's active version")
    p.add_argument("--version", type=int, default=None, help="index version (default: active)")
    p.add_argument(
        "--stale-ratio",
        type=float,
        default=None,
        help="--stale: the share of chunks added or removed since calibrating that makes a "
        "calibration stale (default: that of the worker's gauge, "
        "RAGSTREAM_RECONCILE__CALIBRATION_STALE_RATIO's default 0.2)",
    )
    p.add_argument(
        "--dry-run", action="store_true", help="--stale/--all: list what is due, fit nothing"
    )
    p.add_argument(
        "--max-seconds",
        type=float,
        default=None,
        help="--stale/--all: start no fit after this long (a nightly job with a time budget; "
        "the most changed go first, the rest wait for the next run)",
    )
    p.add_argument(
        "--queries", type=int, default=150, help="self-supervised positives (and negatives)"
    )
    p.add_argument("--seed", type=int, default=0, help="seed of the generated queries")
    p.add_argument(
        "--max-false-abstention",
        type=float,
        default=0.2,
        help="the hard threshold keeps at most this share of the answerable calibration queries "
        "(scored out of fold) from abstaining (lower: fewer false NO_EVIDENCE, more answers to "
        "unanswerable queries)",
    )
    p.add_argument(
        "--threshold-queries",
        type=int,
        default=None,
        help="choose the hard threshold on this many times --queries (the others are generated "
        "for the threshold alone; 1: only the models' queries, about 0.3x the time)",
    )
    p.set_defaults(func=_cmd_calibrate)

    p = sub.add_parser(
        "reconcile", help="compare a tenant's SoR with its index; exit 1 while drift remains"
    )
    p.add_argument("--tenant", required=True)
    p.add_argument("--repair", action="store_true", help="fix drift through the write path")
    p.set_defaults(func=_cmd_reconcile)

    p = sub.add_parser(
        "slots",
        help="the SoR's logical replication slots: attached or not, WAL retained (bytes), "
        "wal_status; exit 1 when one is inactive or lost",
    )
    p.set_defaults(func=_cmd_slots)

    p = sub.add_parser(
        "dlq",
        help="replay: re-read from the SoR every entity a dead letter names, once its cause "
        "(e.g. a table mapping after a schema change) is fixed; what still fails is re-queued "
        "(parked after --max-attempts), what never can be replayed is parked; list: print the "
        "letters and what a replay would do with each. Replay exit codes: 0 nothing left "
        "failing in the topic replayed, 1 letters re-queued (or lost to retention), 3 an "
        "outage (nothing committed)",
    )
    p.add_argument("action", choices=["replay", "list"])
    where = p.add_mutually_exclusive_group()
    where.add_argument(
        "--topic", default=None, help="the topic to read (default: RAGSTREAM_CONSUMER__DLQ_TOPIC)"
    )
    where.add_argument(
        "--parked", action="store_true", help="read the parking topic (--parking-topic)"
    )
    p.add_argument(
        "--parking-topic",
        default=None,
        help="where letters that cannot be replayed are parked (default: <DLQ topic>.parked)",
    )
    p.add_argument(
        "--max-attempts",
        type=int,
        default=5,
        help="park a letter whose entity still cannot be indexed after this many replays "
        "(before: re-queue it at the tail of the topic replayed)",
    )
    p.add_argument(
        "--from-beginning",
        action="store_true",
        help="replay the whole topic again (default: after what the last replay read)",
    )
    p.add_argument("--group", default=None, help="consumer group (default: <group>-dlq-replay)")
    p.add_argument(
        "--idle-s", type=float, default=3.0, help="stop reading after this long without records"
    )
    p.set_defaults(func=_cmd_dlq)

    p = sub.add_parser(
        "reindex",
        help="build a new index version from the SoR, gate it on parity, switch, retire the old",
    )
    p.add_argument("--tenant", required=True)
    p.add_argument(
        "--model",
        default=None,
        help="model to build with: the name or name@version of RAGSTREAM_EMBEDDER (default) "
        "or RAGSTREAM_NEXT_EMBEDDER",
    )
    p.add_argument("--tolerance", type=float, default=0.02, help="largest allowed metric drop")
    p.add_argument("--parity-queries", type=Path, default=None, help="JSON list of EvalQuery")
    p.add_argument("--parity-sample", type=int, default=200, help="known-item queries")
    p.add_argument("--parity-top-k", type=int, default=10)
    p.add_argument("--skip-parity", action="store_true", help="no gate at all")
    p.add_argument(
        "--skip-calibration",
        action="store_true",
        help="do not fit the new version's evidence score (it is scored by the prior model)",
    )
    p.add_argument("--force", action="store_true", help="switch even if the parity gate fails")
    p.add_argument("--no-switch", action="store_true", help="build and gate only")
    p.add_argument("--grace-s", type=float, default=600.0, help="before retiring the old one")
    p.add_argument("--no-retire", action="store_true", help="keep the old version readable")
    p.add_argument("--drop-retired", action="store_true", help="delete the retired collection")
    p.add_argument("--settle-s", type=float, default=3.0, help="wait for workers to see it")
    p.add_argument(
        "--placement",
        choices=["auto", "shared", "dedicated"],
        default="auto",
        help="where the new version lives: its own collection or a partition of the shared "
        "one; auto promotes a shared tenant above RAGSTREAM_STORE__DEDICATED_ABOVE_POINTS to "
        "its own and otherwise keeps the active version's placement",
    )
    p.set_defaults(func=_cmd_reindex)

    p = sub.add_parser(
        "index",
        help="list, activate (roll back) or retire a tenant's index versions; placement: every "
        "tenant's placement, size and whether it is due for promotion to its own collection",
    )
    p.add_argument("action", choices=["list", "activate", "retire", "placement"])
    p.add_argument("--tenant", default=None, help="list/activate/retire: the tenant")
    p.add_argument("--version", type=int, default=None, help="activate/retire: version number")
    p.add_argument("--drop", action="store_true", help="retire: also delete its collection")
    p.set_defaults(func=_cmd_index)

    p = sub.add_parser(
        "status",
        help="SLO figures from the services' /metrics or Prometheus; exit 1 on a breach",
        description=(
            "Freshness p95, backlog age and consumer lag, DLQ records per hour, reconcile "
            "drift, Retrieve p95 and server error rate, and the tenants that stand out, each "
            "against its SLO (defaults: the alert rules' thresholds). Exit code 0: all met; "
            "1: an SLO is breached; 2: a source could not be read."
        ),
    )
    p.add_argument(
        "--metrics",
        action="append",
        metavar="URL",
        help="a /metrics URL (repeat for each service; default: both services' from the "
        "RAGSTREAM_* settings, http://127.0.0.1:9464/metrics and :9465)",
    )
    p.add_argument(
        "--prometheus", metavar="URL", help="read a Prometheus instead, e.g. http://prometheus:9090"
    )
    p.add_argument(
        "--selector", default="", help='with --prometheus: label matchers, e.g. namespace="prod"'
    )
    p.add_argument(
        "--window",
        type=float,
        default=10.0,
        help="with /metrics: seconds between the two scrapes rates come from (0: one scrape, "
        "totals since start)",
    )
    p.add_argument("--json", action="store_true", help="print the report as JSON")
    from ragstream.status import Slos

    defaults = Slos()
    for flag, name, unit in (
        ("--slo-freshness-p95", "freshness_p95_s", "seconds"),
        ("--slo-backlog-age", "backlog_age_s", "seconds"),
        ("--slo-lag", "lag_records", "records"),
        ("--slo-dlq-per-hour", "dlq_per_hour", "records"),
        ("--slo-drift", "drift_entities", "entities"),
        ("--slo-retrieve-p95", "retrieve_p95_s", "seconds"),
        ("--slo-error-rate", "error_rate", "fraction"),
    ):
        default = getattr(defaults, name)
        p.add_argument(flag, type=float, default=default, help=unit)
    p.set_defaults(func=_cmd_status)

    p = sub.add_parser(
        "tables",
        help="discover: propose table mappings (and the Debezium connector) from a live "
        "PostgreSQL; check: validate mappings against the database, connector and broker",
        description=(
            "discover reads a PostgreSQL catalog and the first rows of each table and prints a "
            "JSON report: RAGSTREAM_PLAN__TABLES (valid JSON for the variable), the reason for "
            "every choice, the tables left out and why, problems with their fixes, and with "
            "--connector the Kafka Connect and Debezium Server configuration. check validates "
            "RAGSTREAM_PLAN__TABLES (or --tables FILE) against the live database, a connector "
            "file and the broker. Both only read. Exit codes: 0 no problem (discover: a table "
            "proposed); 1 problems found (discover: nothing proposed); 2 usage or "
            "configuration error; 3 the database or the broker unreachable."
        ),
    )
    p.add_argument("action", choices=["discover", "check"])
    p.add_argument(
        "--dsn", default=None, help="libpq DSN of the SoR (default: $RAGSTREAM_SOR__DSN)"
    )
    p.add_argument(
        "--sample-rows",
        type=int,
        default=None,
        help="rows read per table (discover: to measure text and JSON, default 1000; check: "
        "NULL or invalid tenants, metadata that is no JSON object, default 10000; 0: none)",
    )
    p.add_argument(
        "--publication",
        default=None,
        help="the connector's publication.name (discover: default an existing publication "
        "covering every proposed table, else ragstream; check: default the connector file's, "
        "else any publication of each table)",
    )
    p.add_argument(
        "--partitions",
        type=int,
        default=None,
        help="partitions per table topic (discover --connector: more than 1 routes them by "
        "tenant; check: expected, default the connector's routing, else 1)",
    )
    p.add_argument(
        "--bootstrap-servers",
        default=None,
        help="Kafka (default: RAGSTREAM_KAFKA__BOOTSTRAP_SERVERS; discover: for the Debezium "
        "Server properties)",
    )
    group = p.add_argument_group("discover")
    group.add_argument("--schema", action="append", help="only this schema (repeatable)")
    group.add_argument("--table", action="append", help="only this schema.table (repeatable)")
    group.add_argument("--exclude", action="append", help="leave out schema.table (repeatable)")
    group.add_argument(
        "--tenant-column",
        default=None,
        help="the tenant column (tables without it are left out; default: chosen by name and "
        "foreign keys, the reason says how)",
    )
    group.add_argument(
        "--tenant", default=None, help="the tenant of tables without a tenant column"
    )
    group.add_argument(
        "--connector",
        nargs="?",
        const=True,
        default=None,
        type=_connector_arg,
        metavar="FILE",
        help="discover: also print the Debezium connector configuration; check: validate "
        "this connector file (Kafka Connect .json or Debezium Server .properties)",
    )
    group.add_argument(
        "--topic-prefix", default=None, help="(default: $RAGSTREAM_PLAN__TOPIC_PREFIX or sor)"
    )
    group.add_argument("--slot", default="ragstream", help="the connector's slot.name")
    group.add_argument("--connector-name", default="ragstream-sor")
    group.add_argument(
        "--write",
        type=Path,
        default=None,
        metavar="DIR",
        help="also write tables.json, fixes.sql, report.json (and kafka-connect.json, "
        "debezium-server.properties) there",
    )
    group = p.add_argument_group("check")
    group.add_argument(
        "--tables",
        type=Path,
        default=None,
        metavar="FILE",
        help="mappings from this JSON file (default: RAGSTREAM_PLAN__TABLES)",
    )
    group.add_argument("--no-broker", action="store_true", help="do not check the topics")
    group.add_argument(
        "--errors-only", action="store_true", help="exit 0 when only warnings are found"
    )
    p.set_defaults(func=_cmd_tables)

    p = sub.add_parser(
        "config", help="print the effective settings (from RAGSTREAM_* env), secrets masked"
    )
    p.add_argument("--service", choices=["ingest", "retrieve"], default=None)
    p.add_argument(
        "--env-table",
        action="store_true",
        help="print every variable with its default and meaning (docs/configuration.md's table)",
    )
    p.add_argument(
        "--dev",
        action="store_true",
        help="the settings of the running `ragstream dev` (from its stack file) instead",
    )
    p.add_argument("--data-dir", type=Path, default=Path("data"), help="--dev: its data dir")
    p.set_defaults(func=_cmd_config)

    for plugin in entry_points(group=COMMANDS_GROUP):
        # the dev tools' subcommands (dev, sor, bench, eval) when ragstream-dev is installed
        plugin.load()(sub)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of the `ragstream` console script."""
    args = build_parser().parse_args(argv)
    logging.basicConfig(
        level=logging.DEBUG if args.verbose else logging.INFO,
        format="%(asctime)s %(levelname)s %(name)s: %(message)s",
    )
    try:
        code: int = args.func(args)
        sys.stdout.flush()
    except BrokenPipeError:
        # The reader went away (`ragstream query ... | head`): stop quietly, as `cat` does.
        # Point stdout at /dev/null so the interpreter's final flush cannot fail again.
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 128 + signal.SIGPIPE
    except RagstreamError as exc:
        print(f"ragstream: error [{exc.code}]: {exc}", file=sys.stderr)
        return 2
    except (ValidationError, SettingsError) as exc:
        # RAGSTREAM_* settings that do not validate: name the variable's path and the reason
        cause = f": {exc.__cause__}" if isinstance(exc, SettingsError) and exc.__cause__ else ""
        print(f"ragstream: error [CONFIG_ERROR]: {exc}{cause}", file=sys.stderr)
        return 2
    return code


if __name__ == "__main__":
    sys.exit(main())
