"""`ragstream eval`: run an eval set through the real system and score it.

The entities go into a SQLite SoR and through the real ingest path (decode, plan, normalize,
chunk, embed, write to qdrant-edge); each tenant's index is then calibrated as a reindex would
(`retrieval_api.calibration`: self-supervised, no labels); every query goes through the real gRPC
Retrieve server (auth, validation, search, evidence score, ranking, SoR verification). One run
compares several retrieval configurations on the same index: BM25 only, dense only, the fusion
methods, thresholds; per-query metrics, paired significance against the default configuration,
an optional regression gate and an HTML/JSON report.
"""

from __future__ import annotations

import asyncio
import hashlib
import json
import sqlite3
import tempfile
import threading
import time
from collections.abc import Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

import grpc
from prometheus_client import CollectorRegistry
from pydantic import Field
from pydantic_settings import BaseSettings, SettingsConfigDict

from ragcore.documents import DocumentSource, decode_document
from ragcore.embedders import build_embedder
from ragcore.embedders.base import Embedder
from ragcore.embedders.cache import CachedEmbedder, EmbeddingCacheConfig
from ragcore.embedders.local_onnx import LocalEmbedderConfig
from ragcore.kafka_config import KafkaSettings
from ragcore.mapping import TableMapping
from ragcore.plan import PlanConfig
from ragcore.quality.dataset import EvalEntity, EvalSet, passage_id
from ragcore.quality.metrics import EvalResult, QueryRun, Status, evaluate
from ragcore.quality.significance import compare
from ragcore.resources import package_dir
from ragcore.settings import SorSettings, StoreSettings
from ragcore.sparse import Bm25Encoder
from ragcore.store.base import PayloadSchema, VectorStore
from ragcore.wiring import build_store
from ragdev.eval.configs import DEFAULT_CONFIGS
from ragdev.sor.debezium_format import change_event, encode_key, encode_value
from retrieval_api.app import build_app
from retrieval_api.calibration import CalibrationSettings, calibrate_version
from retrieval_api.candidates import CandidateSearch
from retrieval_api.pipeline_settings import RetrievalConfig
from retrieval_api.settings import AuthSettings, GrpcSettings, RetrieveSettings
from schemas.entities import ContentFormat
from schemas.events import Op, RawRecord
from schemas.proto.ragstream.retrieval.v1 import retrieval_pb2 as pb
from schemas.proto.ragstream.retrieval.v1 import retrieval_pb2_grpc as pb_grpc
from streams.app import build_worker
from streams.settings import IngestSettings


@dataclass(frozen=True)
class ConfigResult:
    """One configuration's scores."""

    name: str
    overrides: Mapping[str, Any]
    result: EvalResult


#: The eval set's entities are rows of the default `entities` table.
EVAL_TABLE = TableMapping()
#: Entities whose format is a document (PDF, DOCX, ...): their content is the file, base64.
EVAL_DOCUMENTS = TableMapping(
    table="public.documents",
    key_columns=("id",),
    tenant_column="company_id",
    type_column="entity_type",
    title_column="name",
    metadata_column=None,
    content_hash_column=None,
    document=DocumentSource(column="body", format_column="format", name_column="file_name"),
)
EVAL_PLAN = PlanConfig(tables=(EVAL_TABLE, EVAL_DOCUMENTS))
_DOCUMENTS_DDL = """
CREATE TABLE IF NOT EXISTS documents (
    id TEXT PRIMARY KEY, company_id TEXT NOT NULL, entity_type TEXT NOT NULL, name TEXT,
    file_name TEXT, format TEXT NOT NULL, body BLOB NOT NULL, created_at TEXT NOT NULL,
    updated_at TEXT NOT NULL, deleted_at TEXT
);
"""
_TIME = "2026-01-01T00:00:00Z"


def _eval_id(indexed: str) -> str:
    """An entity or chunk id as the eval set names it: without the table part of the index's
    ids (`entities:<id>`, `documents:<id>`)."""
    for table in (EVAL_TABLE, EVAL_DOCUMENTS):
        if indexed.startswith(f"{table.label}:"):
            return indexed.removeprefix(f"{table.label}:")
    return indexed


def _row(e: EvalEntity) -> tuple[TableMapping, dict[str, Any]]:
    """The entity's table and SoR row: a document's file in `documents`, text in `entities`."""
    if e.format.is_document:
        return EVAL_DOCUMENTS, {
            "id": e.entity_id,
            "company_id": e.tenant,
            "entity_type": e.entity_type,
            "name": e.title,
            "file_name": str(e.metadata.get("file_name") or f"{e.entity_id}.{e.format.value}"),
            "format": e.format.value,
            "body": decode_document(e.content),
            "created_at": _TIME,
            "updated_at": _TIME,
            "deleted_at": None,
        }
    return EVAL_TABLE, {
        "id": e.entity_id,
        "company_id": e.tenant,
        "entity_type": e.entity_type,
        "name": e.title,
        "content": e.content,
        "metadata": {**e.metadata, "format": e.format.value},
        "content_hash": None,
        "created_at": _TIME,
        "updated_at": _TIME,
        "deleted_at": None,
    }


def _sqlite_sor(path: Path, evalset: EvalSet) -> None:
    ddl = (package_dir("schemas") / "sql" / "entities.sqlite.sql").read_text()
    conn = sqlite3.connect(path)
    with conn:
        conn.executescript(ddl + _DOCUMENTS_DDL)
        for e in evalset.entities:
            table, row = _row(e)
            values = {k: json.dumps(v) if isinstance(v, dict) else v for k, v in row.items()}
            conn.execute(
                f"INSERT INTO {table.table_name} ({', '.join(values)})"
                f" VALUES ({', '.join('?' * len(values))})",
                list(values.values()),
            )
    conn.close()


def _records(evalset: EvalSet) -> list[RawRecord]:
    """Snapshot `r` events of every entity, as Debezium would publish them."""
    out = []
    for n, e in enumerate(evalset.entities):
        table, row = _row(e)
        value = change_event(
            Op.READ, before=None, after=row, table=table.table_name, lsn=100 + n, snapshot="true"
        )
        out.append(
            RawRecord(
                topic=table.topic_name(EVAL_PLAN.topic_prefix),
                partition=0,
                offset=n,
                key=encode_key({"id": e.entity_id}),
                value=encode_value(value),
            )
        )
    return out


class _RetrievalEnvironment(BaseSettings):
    """Only the `retrieval` part of Retrieve's settings, from `RAGSTREAM_RETRIEVAL__*`."""

    model_config = SettingsConfigDict(
        env_prefix="RAGSTREAM_", env_nested_delimiter="__", extra="ignore", frozen=True
    )

    retrieval: RetrievalConfig = Field(default_factory=RetrievalConfig)


def retrieval_from_environment() -> tuple[RetrievalConfig, dict[str, Any]]:
    """The retrieval settings a `ragstream serve` in this environment would use
    (`RAGSTREAM_RETRIEVAL__*`), and the top-level fields that differ from the defaults: the
    eval's base configuration, so a setting is A/B-tested as it would be served."""
    config = _RetrievalEnvironment().retrieval
    defaults = RetrievalConfig().model_dump(mode="json")
    dumped = config.model_dump(mode="json")
    return config, {k: v for k, v in dumped.items() if defaults.get(k) != v}


@contextmanager
def _server(settings: RetrieveSettings, store: VectorStore, embedder: Embedder) -> Iterator[str]:
    app = build_app(settings, CollectorRegistry(), store=store, embedder=embedder)
    loop = asyncio.new_event_loop()
    thread = threading.Thread(target=loop.run_forever, daemon=True)
    thread.start()
    try:
        asyncio.run_coroutine_threadsafe(app.server.start(), loop).result(30)
        yield f"127.0.0.1:{app.server.port}"
    finally:
        asyncio.run_coroutine_threadsafe(app.server.stop(), loop).result(30)
        loop.call_soon_threadsafe(loop.stop)
        thread.join(10)
        app.close()


def run_eval(
    evalset: EvalSet,
    *,
    configs: Mapping[str, Mapping[str, Any]] | None = None,
    base: RetrievalConfig | None = None,
    top_k: int = 10,
    max_context_tokens: int | None = None,
    data_dir: Path | None = None,
    embedder: Embedder | None = None,
    progress: bool = True,
    calibrate: bool = True,
    calibration: CalibrationSettings | None = None,
    cache_dir: Path | None = None,
    execution: Literal["float", "int8"] = "float",
) -> list[ConfigResult]:
    """Index `evalset` once, calibrate each tenant's index (unless `calibrate` is False: the
    prior model then scores), then score every configuration through gRPC Retrieve (with
    `max_context_tokens` as every request's token budget when given).
    `cache_dir` keeps the embedding cache between runs, the calibration's practice queries
    included (the same dataset and seed asks the same ones); `execution` is the local
    embedder's (when no `embedder` is given)."""
    configs = configs or DEFAULT_CONFIGS
    base = base or RetrievalConfig()
    tokens = {t: hashlib.sha256(t.encode()).hexdigest()[:32] for t in evalset_tenants(evalset)}
    with tempfile.TemporaryDirectory(prefix="ragstream-eval-") as tmp:
        root = data_dir or Path(tmp)
        root.mkdir(parents=True, exist_ok=True)
        sor_path = root / "sor.sqlite"
        sor_path.unlink(missing_ok=True)
        _sqlite_sor(sor_path, evalset)
        store_settings = StoreSettings(data_dir=root / "store")
        store = build_store(store_settings, PayloadSchema())
        own = embedder is None
        model = embedder or build_embedder(
            LocalEmbedderConfig(execution=execution),
            cache=EmbeddingCacheConfig(
                path=(cache_dir or root) / "embedding-cache.sqlite", max_entries=2_000_000
            ),
        )
        sor = SorSettings(kind="sqlite", sqlite_path=sor_path)
        try:
            worker = build_worker(
                IngestSettings(
                    kafka=KafkaSettings(bootstrap_servers="127.0.0.1:1"),  # never contacted
                    store=store_settings,
                    sor=sor,
                    plan=EVAL_PLAN,
                    embedding_cache=None,
                ),
                CollectorRegistry(),
                store=store,
                embedder=model,
            )
            records = _records(evalset)
            started = time.perf_counter()
            for i in range(0, len(records), 64):
                letters = worker.handler.handle(records[i : i + 64])
                if letters:
                    raise RuntimeError(f"eval entities were rejected: {letters[:3]}")
                if progress:
                    done = min(i + 64, len(records))
                    rate = done / (time.perf_counter() - started)
                    print(f"  indexed {done}/{len(records)} entities ({rate:.1f}/s)", flush=True)
            for tenant in tokens:
                version = worker.registry.active_version(tenant)
                if version is not None:
                    store.optimize(worker.registry.manifest(tenant, version).index_name)
            if calibrate:
                practice = _practice_embedder(model, cache_dir)
                search = CandidateSearch(
                    config=base,
                    encoder=Bm25Encoder(),
                    store=store,
                    registry=worker.registry,
                )
                for tenant in tokens:
                    index = worker.registry.lookup(tenant, None)
                    began = time.perf_counter()
                    fitted = calibrate_version(
                        search, worker.registry, index, practice, store, settings=calibration
                    )
                    if progress:
                        held = fitted.report.get("held_out", {})
                        print(
                            f"  calibrated {tenant}: order {fitted.ranking.label}, hard "
                            f"{fitted.thresholds.hard:.3f}, held-out ECE {held.get('ece')}, "
                            f"abstention {held.get('abstention')} "
                            f"({time.perf_counter() - began:.1f}s)",
                            flush=True,
                        )
                        # which order the calibration's paraphrases preferred, and how surely
                        for row in fitted.report.get("order", {}).get("table", []):
                            print(f"    order {row}", flush=True)
            worker.close()
            results = []
            hashed = {t: hashlib.sha256(v.encode()).hexdigest() for t, v in tokens.items()}
            for name, overrides in configs.items():
                retrieval = RetrievalConfig.model_validate({**base.model_dump(), **overrides})
                settings = RetrieveSettings(
                    grpc=GrpcSettings(port=0),
                    auth=AuthSettings(tokens=hashed),
                    store=store_settings,
                    sor=sor,
                    plan=EVAL_PLAN,
                    publish_enabled=False,
                    retrieval=retrieval,
                )
                with _server(settings, store, model) as target:
                    runs = _query_all(target, evalset, tokens, top_k, max_context_tokens)
                results.append(ConfigResult(name, dict(overrides), evaluate(evalset, runs)))
                if progress:
                    agg = results[-1].result.aggregates
                    print(
                        f"  {name:<16} ndcg@5={_fmt(agg.get('ndcg@5'))} "
                        f"recall@5={_fmt(agg.get('recall@5'))} mrr@10={_fmt(agg.get('mrr@10'))}",
                        flush=True,
                    )
            return results
        finally:
            if own:
                model.close()
            store.close()


def _practice_embedder(model: Embedder, cache_dir: Path | None) -> Embedder:
    """The embedder of the calibration's practice queries: with a kept cache, one that caches
    their vectors too (a run re-embedded ~2,300 per golden run and tens of thousands on the
    public sets). The eval's own queries are not cached: their latencies are reported."""
    if cache_dir is None or not isinstance(model, CachedEmbedder):
        return model
    # A view over the same inner embedder and cache, never closed itself (the model owns both).
    return CachedEmbedder(model.inner, model.cache, cache_queries=True, close_cache=False)


def evalset_tenants(evalset: EvalSet) -> list[str]:
    """The tenants of an eval set, sorted."""
    return sorted({e.tenant for e in evalset.entities})


def _fmt(value: float | None) -> str:
    return "n/a" if value is None else f"{value:.3f}"


def _query_all(
    target: str,
    evalset: EvalSet,
    tokens: Mapping[str, str],
    top_k: int,
    max_context_tokens: int | None = None,
) -> list[QueryRun]:
    runs = []
    with grpc.insecure_channel(target) as channel:
        stub = pb_grpc.RetrievalServiceStub(channel)
        for n, q in enumerate(evalset.queries):
            # query ids (e.g. man page names like c++filt.1) need not be valid request ids
            request = pb.RetrieveRequest(query_text=q.text, top_k=top_k, request_id=f"eval-{n:06d}")
            if max_context_tokens is not None:
                request.max_context_tokens = max_context_tokens
            began = time.perf_counter()
            try:
                pack = stub.Retrieve(
                    request, metadata=(("authorization", f"Bearer {tokens[q.tenant]}"),), timeout=30
                )
            except grpc.RpcError as err:
                elapsed = (time.perf_counter() - began) * 1000
                runs.append(
                    QueryRun(
                        q.query_id, Status.FAILED, latency_ms=elapsed, error_code=err.code().name
                    )
                )
                continue
            elapsed = (time.perf_counter() - began) * 1000
            status = Status.parse(pb.RetrievalStatus.Name(pack.status))
            scored = [(_eval_id(r.entity_id), r.scores.final) for r in pack.results]
            scored += [
                (_eval_id(x.entity_id), x.score)
                for x in pack.excluded
                if x.reason == pb.EXCLUSION_REASON_BELOW_THRESHOLD
            ]
            runs.append(
                QueryRun(
                    q.query_id,
                    status,
                    entity_ids=tuple(_eval_id(r.entity_id) for r in pack.results),
                    chunk_ids=tuple(_eval_id(r.chunk_id) for r in pack.results),
                    latency_ms=elapsed,
                    scored=tuple(scored),
                    texts=tuple(r.text for r in pack.results),
                    context_ms=pack.timings_ms.get("context"),
                    passages=tuple(_passage(r) for r in pack.results),
                )
            )
    return runs


_DOCUMENT_FORMATS = frozenset(f.value for f in ContentFormat if f.is_document)


def _passage(result: pb.Result) -> str:
    """The result's passage id (`ragcore.quality.dataset.passage_id`): its entity and its
    citation after the file name (a document's page, DOCX section or row block; a text entity's
    heading path)."""
    path = list(result.locator.section_path)
    if result.locator.extracted_from in _DOCUMENT_FORMATS and path:
        path = path[1:]  # a document's citation starts with its file name
    return passage_id(_eval_id(result.entity_id), path)


#: Metrics `comparison` tests: nDCG@5 (the golden set's headline) and nDCG@10 (the BEIR
#: convention, and issue 26 item 5's criterion).
COMPARED_METRICS: tuple[str, ...] = ("ndcg@5", "ndcg@10")


def comparison(
    results: Sequence[ConfigResult], metrics: Sequence[str] = COMPARED_METRICS
) -> dict[str, dict[str, dict[str, Any]]]:
    """Paired bootstrap of each configuration against the first (the default), per metric:
    {configuration: {metric: {mean_diff_vs_default, ci95, p_value}}}; the difference is the
    configuration's value minus the default's. A metric no query has is left out."""
    baseline = results[0]
    out: dict[str, dict[str, dict[str, Any]]] = {}
    for other in results[1:]:
        tests: dict[str, dict[str, Any]] = {}
        for metric in metrics:
            base_values = baseline.result.metric_values(metric)
            if not base_values:
                continue
            test = compare(base_values, other.result.metric_values(metric))
            tests[metric] = {
                "mean_diff_vs_default": test.mean_diff,
                "ci95": [test.ci_low, test.ci_high],
                "p_value": test.p_value,
            }
        out[other.name] = tests
    return out
