"""Tenancy benchmark: what N small tenants cost, shared (partitions of one collection, the
default) or dedicated (a collection each): docs/decisions/tiered-tenancy.md.

For each N: N tenants with `docs` short documents each are written to an SQLite SoR
(`schemas/sql/entities.sqlite.sql`) and ingested through the worker's write path
(`streams.app.build_worker` -> `IngestHandler.upsert_entities`: chunk, BM25, per-tenant
bootstrap of its first index version (a partition of the shared pool, or a qdrant-edge
collection) and its manifest, upsert). The broker is left out: its
cost per record does not depend on tenants. The embedder costs nothing (`PrecomputedEmbedder`,
the real model's spec and tokenizer), so what is measured is the cost of tenancy, not of the
model. Then, in the same process:

- ingest wall time, and this process's open files and resident memory after it;
- Retrieve start-up: `retrieval_api.app.build_app` plus its first health check (which lists
  every tenant and reads every active manifest);
- Retrieve latency for `queries` requests to random tenants (in process, `Retriever.retrieve`,
  validation and SoR verification included): first touch (a dedicated tenant's shard opens),
  then the same requests again;
- reconcile of every tenant against the SoR (`IngestWorker.reconcile_once`);
- open files and resident memory at the end.

Run: `ragstream bench tenants --tenants 100,1000,10000 [--placement dedicated]` (prints one
JSON document). What it measured: docs/decisions/tenant-collections-limits.md and
docs/decisions/tiered-tenancy.md.
"""

from __future__ import annotations

import argparse
import logging
import os
import random
import resource
import sqlite3
import sys
import time
from collections.abc import Sequence
from contextlib import ExitStack
from pathlib import Path
from typing import Any

from prometheus_client import CollectorRegistry

from ragcore.embedders.local_onnx import MINILM_SPEC
from ragcore.errors import ConfigError, StoreError
from ragcore.kafka_config import KafkaSettings
from ragcore.prepare import Preparer
from ragcore.resources import package_dir
from ragcore.settings import SorSettings, StoreSettings
from ragcore.store.base import Placement, StoreFilter
from ragdev.bench.ingest import PrecomputedEmbedder, prose_paragraphs, short_texts
from ragdev.bench.machine import (
    emit,
    flat,
    int_list,
    machine_info,
    percentiles,
    proc_status_mib,
    run_dir,
)
from ragstream.cli import HelpFormatter
from retrieval_api.app import build_app
from retrieval_api.settings import RetrieveSettings
from retrieval_api.validate import validate_request
from schemas.entities import ContentFormat, Entity
from schemas.proto.ragstream.retrieval.v1 import retrieval_pb2 as pb
from streams.app import build_worker
from streams.settings import IngestSettings

__all__ = ["run"]

log = logging.getLogger(__name__)


def _open_files() -> int:
    return len(os.listdir("/proc/self/fd"))


def _memory_maps() -> int:
    return len(Path("/proc/self/maps").read_text().splitlines())


def _max_map_count() -> int:
    return int(Path("/proc/sys/vm/max_map_count").read_text())


def _rss_mib() -> float:
    rss = proc_status_mib("VmRSS")
    if rss is None:
        raise ConfigError("VmRSS not found in /proc/self/status")
    return rss


def _tenant(i: int) -> str:
    return f"t{i:05d}"


def _write_sor(path: Path, rows: Sequence[tuple[str, str, str]]) -> None:
    conn = sqlite3.connect(path)
    try:
        conn.executescript((package_dir("schemas") / "sql" / "entities.sqlite.sql").read_text())
        conn.executemany(
            "INSERT INTO entities (id, company_id, entity_type, name, content, metadata, "
            "created_at, updated_at) VALUES (?, ?, 'KNOWLEDGE_ARTIFACT', ?, ?, "
            "'{\"format\": \"text\"}', '2026-01-01T00:00:00Z', '2026-01-01T00:00:00Z')",
            [(key, tenant, key, text) for key, tenant, text in rows],
        )
        conn.commit()
    finally:
        conn.close()


def _one(
    root: Path,
    n: int,
    *,
    docs: int,
    queries: int,
    texts: Sequence[str],
    max_rss_mib: float,
    store_options: dict[str, Any],
) -> dict[str, Any]:
    rng = random.Random(n)
    rows = [
        (f"doc-{t:05d}-{d}", _tenant(t), texts[(t * docs + d) % len(texts)])
        for t in range(n)
        for d in range(docs)
    ]
    sor_path = root / "sor.sqlite"
    _write_sor(sor_path, rows)
    sor = SorSettings(kind="sqlite", sqlite_path=sor_path)
    store = StoreSettings(data_dir=root / "store", **store_options)
    settings = IngestSettings(
        kafka=KafkaSettings(bootstrap_servers="127.0.0.1:1"),  # never contacted
        store=store,
        sor=sor,
        embedding_cache=None,
    )
    files_before, rss_before = _open_files(), _rss_mib()
    worker = build_worker(settings, CollectorRegistry(), embedder=PrecomputedEmbedder(MINILM_SPEC))
    preparer = Preparer(MINILM_SPEC, settings.chunking)
    mapping = settings.plan.tables[0]
    entities = [
        Entity(
            entity_id=mapping.entity_id([key]),
            tenant_id=tenant,
            entity_type="KNOWLEDGE_ARTIFACT",
            title=key,
            content=text,
            content_hash=preparer.content_hash(text, ContentFormat.TEXT),
        )
        for key, tenant, text in rows
    ]
    began = time.perf_counter()
    rejected = 0
    for start in range(0, len(entities), 100):
        failure: str | None = None
        try:
            batch = entities[start : start + 100]
            rejected += len(worker.handler.upsert_entities(batch, "bench"))
        except StoreError as exc:
            failure = f"the store failed: {exc}"
        if failure is None and _rss_mib() > max_rss_mib:
            failure = (
                f"this process's resident memory passed the limit of {max_rss_mib:.0f} MiB: "
                "every tenant's collection is a qdrant-edge shard held open"
            )
        if failure is not None:
            indexed = len({e.tenant_id for e in entities[:start]}) or 1
            rss, files, maps = _rss_mib(), _open_files(), _memory_maps()
            worker.close()
            return {
                "tenants": n,
                "broke": {
                    "at_tenants_indexed": indexed,
                    "rss_mib": rss,
                    "rss_mib_per_tenant": round((rss - rss_before) / indexed, 1),
                    "open_files": files,
                    "memory_maps": maps,
                    "memory_maps_limit": _max_map_count(),
                    "seconds": round(time.perf_counter() - began, 1),
                    "reason": failure,
                },
            }
    ingest_s = time.perf_counter() - began
    files_ingest, rss_ingest = _open_files(), _rss_mib()
    points = sum(
        worker.store.count(worker.registry.lookup(t, None).collection, StoreFilter(tenant_id=t))
        for t in {e.tenant_id for e in entities}
    )

    began = time.perf_counter()
    reports = worker.reconcile_once()
    reconcile_s = time.perf_counter() - began
    drift = sum(r.drift for r in reports)
    worker.close()

    retrieve_settings = RetrieveSettings(
        store=store, sor=sor, plan=settings.plan, publish_enabled=False, metrics_port=0
    )
    began = time.perf_counter()
    app = build_app(
        retrieve_settings, CollectorRegistry(), embedder=PrecomputedEmbedder(MINILM_SPEC)
    )
    app.server.check_health()  # what the gRPC health service runs first
    startup_s = time.perf_counter() - began
    # each question asks about one of its tenant's own documents (three of its longer words),
    # so requests find, rank and verify real hits rather than abstaining on empty candidates
    by_tenant: dict[str, list[str]] = {}
    for _key, tenant, text in rows:
        by_tenant.setdefault(tenant, []).append(text)
    chosen = [_tenant(rng.randrange(n)) for _ in range(queries)]
    questions = []
    for tenant in chosen:
        words = [w.strip(".,;:!?") for w in rng.choice(by_tenant[tenant]).split() if len(w) > 4]
        picked = rng.sample(words, min(3, len(words))) if words else ["anything"]
        questions.append("what about " + " ".join(picked))
    passes: list[list[float]] = []
    statuses: dict[str, int] = {}
    for _ in range(2):  # first touch (opens the tenant's shard), then with the shards open
        latencies = []
        for tenant, question in zip(chosen, questions, strict=True):
            request = validate_request(
                pb.RetrieveRequest(query_text=question), retrieve_settings.retrieval, tenant
            )
            started = time.perf_counter()
            pack = app.retriever.retrieve(request)
            latencies.append(time.perf_counter() - started)
            name = pb.RetrievalStatus.Name(pack.status)
            statuses[name] = statuses.get(name, 0) + 1
        passes.append(latencies)
    files_end, rss_end, maps_end = _open_files(), _rss_mib(), _memory_maps()
    app.close()
    return {
        "tenants": n,
        "entities": len(entities),
        "rejected": rejected,
        "ingest_s": round(ingest_s, 2),
        "ingest_entities_per_s": round(len(entities) / ingest_s, 1),
        "reconcile_all_tenants_s": round(reconcile_s, 2),
        "reconcile_drift": drift,
        "retrieve_startup_s": round(startup_s, 3),
        "retrieve_first_touch_ms": percentiles(passes[0], scale=1000.0, digits=2),
        "retrieve_shards_open_ms": percentiles(passes[1], scale=1000.0, digits=2),
        "retrieve_statuses": statuses,
        "memory_maps_after_retrieve": maps_end,
        "open_files": {
            "before": files_before,
            "after_ingest": files_ingest,
            "after_retrieve": files_end,
        },
        "rss_mib": {"before": rss_before, "after_ingest": rss_ingest, "after_retrieve": rss_end},
        "rss_mib_per_tenant_after_ingest": round((rss_ingest - rss_before) / n, 3),
        "rss_kib_per_point_after_ingest": round((rss_ingest - rss_before) * 1024 / points, 1),
        "points": points,
        "collections_on_disk": sum(1 for _ in (store.data_dir / "collections").iterdir()),
    }


def run(
    tenants: Sequence[int] = (100, 1000),
    *,
    docs: int = 3,
    queries: int = 200,
    data_dir: Path | None = None,
    max_rss_gib: float | None = None,
    payload_in_ram: bool = True,
    search_threads: int | None = None,
    placement: Placement = "shared",
) -> dict[str, Any]:
    """Each N in turn in its own directory; a JSON-able report (see the module docstring)."""
    if not tenants or min(tenants) < 1 or docs < 1 or queries < 1:
        raise ConfigError("tenants, docs and queries must be >= 1")
    load_before = os.getloadavg()
    # stop a run before the machine runs out of memory (default: 60% of it)
    limit_mib = (max_rss_gib * 1024) if max_rss_gib else 0.6 * _mem_total_mib()
    options: dict[str, Any] = {
        "new_tenants": placement,
        "edge_payload_in_ram": payload_in_ram,
        "edge_search_threads": search_threads,
    }
    # reused in turn when there are more documents (contents repeat across tenants)
    texts = short_texts(min(5000, max(tenants) * docs), list(prose_paragraphs()))
    results = []
    with ExitStack() as stack:
        root = run_dir(stack, data_dir, "tenants")
        for n in tenants:
            log.info("%d tenants x %d documents", n, docs)
            where = root / f"n{n}"
            where.mkdir()
            results.append(
                _one(
                    where,
                    n,
                    docs=docs,
                    queries=queries,
                    texts=texts,
                    max_rss_mib=limit_mib,
                    store_options=options,
                )
            )
            if "broke" in results[-1]:
                break  # a larger N breaks the same way, sooner
    return {
        "benchmark": f"ragstream bench tenants: the cost of N small tenants, {placement}",
        "what": (__doc__ or "").split("\n\n")[1].replace("\n", " "),
        "machine": machine_info(load_before, os.getloadavg(), ("qdrant-edge-py",)),
        "config": {
            "store": (
                "TieredStore over EdgeStore (qdrant-edge, embedded): "
                + (
                    "every tenant a partition of one shared collection (rag_pool__d384)"
                    if placement == "shared"
                    else "one collection (shard) per tenant, opened on first use and kept open"
                )
            ),
            "store_settings": options,
            "documents_per_tenant": docs,
            "texts": "single sentences of 8-40 words of the machine's prose (one chunk each)",
            "embedder": "PrecomputedEmbedder (no model runs; MiniLM's spec and tokenizer)",
            "queries": queries,
            "open_files_limit": _nofile(),
            "max_rss_mib": round(limit_mib),
            "memory_maps_limit": _max_map_count(),
        },
        "results": results,
    }


def _mem_total_mib() -> float:
    for line in Path("/proc/meminfo").read_text().splitlines():
        if line.startswith("MemTotal:"):
            return int(line.split()[1]) / 1024
    raise ConfigError("MemTotal not found in /proc/meminfo")


def _nofile() -> int:
    return resource.getrlimit(resource.RLIMIT_NOFILE)[0]


def main(argv: Sequence[str] | None = None, prog: str | None = None) -> int:
    """Command line: print the report as JSON."""
    parser = argparse.ArgumentParser(
        prog=prog,
        formatter_class=HelpFormatter,
        description=(__doc__ or "").split("\n\n")[0],
    )
    parser.add_argument("--tenants", type=int_list, nargs="+", default=[[100, 1000]])
    parser.add_argument("--docs", type=int, default=3, help="documents per tenant")
    parser.add_argument("--queries", type=int, default=200)
    parser.add_argument("--data-dir", type=Path, default=None)
    parser.add_argument(
        "--max-rss-gib",
        type=float,
        default=None,
        help="stop a run above this (default 60%% of RAM)",
    )
    parser.add_argument(
        "--payload-on-disk",
        action="store_true",
        help="RAGSTREAM_STORE__EDGE_PAYLOAD_IN_RAM=false (payload pages not held in memory)",
    )
    parser.add_argument(
        "--search-threads", type=int, default=None, help="RAGSTREAM_STORE__EDGE_SEARCH_THREADS"
    )
    parser.add_argument(
        "--placement",
        choices=["shared", "dedicated"],
        default="shared",
        help="RAGSTREAM_STORE__NEW_TENANTS: where each tenant's index goes",
    )
    args = parser.parse_args(argv)
    logging.basicConfig(
        level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s"
    )
    report = run(
        tuple(flat(args.tenants)),
        docs=args.docs,
        queries=args.queries,
        data_dir=args.data_dir,
        max_rss_gib=args.max_rss_gib,
        payload_in_ram=not args.payload_on_disk,
        search_threads=args.search_threads,
        placement=args.placement,
    )
    return emit(report)


if __name__ == "__main__":
    sys.exit(main())
