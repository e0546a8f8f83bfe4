"""A running Retrieve stack for tests: PostgreSQL SoR, qdrant-edge, the real local embedder,
the real ingest path (decode -> plan -> chunk -> embed -> write, fed records directly, no
Kafka), and the gRPC server on a loopback port in a background event loop.

Audit records and reindex requests go to `RecordingPublisher` (a test double for Kafka; the
Kafka publisher itself is tested against the tansu broker in test_publish.py).
"""

from __future__ import annotations

import asyncio
import hashlib
import threading
import uuid
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import grpc
import psycopg
from prometheus_client import CollectorRegistry
from psycopg.rows import dict_row
from psycopg.types.json import Jsonb
from pydantic import SecretStr

from ragcore.embedders.base import Embedder
from ragcore.kafka_config import KafkaSettings
from ragcore.mapping import TableMapping
from ragcore.plan import PlanConfig
from ragcore.prepare import Preparer
from ragcore.settings import SorSettings, StoreSettings
from ragcore.store.base import Placement, VectorStore
from ragcore.store.edge import EdgeStore
from ragcore.tracing import Tracing
from ragcore.wiring import build_store, payload_schema
from ragdev.sor.debezium_format import change_event, encode_key, encode_value, topic_for
from retrieval_api.admission import AdmissionSettings
from retrieval_api.app import RetrieveApp, build_app
from retrieval_api.settings import AuthSettings, GrpcSettings, RetrieveSettings
from schemas.events import Op, RawRecord
from schemas.proto.ragstream.retrieval.v1 import retrieval_pb2 as pb
from schemas.proto.ragstream.retrieval.v1 import retrieval_pb2_grpc as pb_grpc
from streams.app import IngestWorker, build_worker
from streams.settings import IngestSettings
from tests.streams.support import entities_plan

SQL = Path(__file__).resolve().parents[2] / "schemas" / "sql" / "entities.postgres.sql"
TOKENS = {"acme": "acme-secret-token", "globex": "globex-secret-token", "initech": "ini-token"}


def bearer(tenant: str) -> tuple[tuple[str, str], ...]:
    """Call metadata authenticating as `tenant`."""
    return (("authorization", f"Bearer {TOKENS[tenant]}"),)


@dataclass
class RecordingPublisher:
    """Keeps published records in memory."""

    records: list[tuple[str, str, dict[str, Any]]] = field(default_factory=list)
    #: the tenant each record was published for, in the same order
    tenants: list[str] = field(default_factory=list)

    def publish(self, topic: str, key: str, record: Mapping[str, Any], *, tenant: str) -> None:
        self.records.append((topic, key, dict(record)))
        self.tenants.append(tenant)

    def close(self, timeout_s: float = 10.0) -> None:
        return None

    def on(self, topic: str) -> list[dict[str, Any]]:
        return [r for t, _, r in self.records if t == topic]


class Stack:
    """SoR writes (PostgreSQL + the change records they produce), ingest, and a gRPC client."""

    def __init__(
        self,
        dsn: str,
        data_dir: Path,
        embedder: Embedder,
        *,
        placement: Placement | None = None,
        tracing: Tracing | None = None,
        auth: AuthSettings | None = None,
        admission: AdmissionSettings | None = None,
        tables: Sequence[TableMapping] = (),
        retrieve_sor_dsn: str | None = None,
        **retrieval: Any,
    ) -> None:
        """`placement`: None for an engine store (dedicated collections), else the tiered
        store `ragstream` builds with every new tenant placed so; `tracing`: the server's
        (default: off, whatever the environment says); `tables`: mapped tables beside the
        stack's `entities` table (the test creates them; `record` makes their change
        records); `retrieve_sor_dsn`: the SoR Retrieve verifies against (default: `dsn`,
        which ingest reads)."""
        self.dsn = dsn
        self.table = f"entities_{uuid.uuid4().hex[:8]}"
        with psycopg.connect(dsn, autocommit=True) as conn:
            ddl = SQL.read_text().replace("entities", self.table)
            conn.execute(ddl.encode())
        self.lsn = 5000
        self.clock = datetime(2026, 3, 1, tzinfo=UTC)
        self.publisher = RecordingPublisher()
        self.preparer = Preparer(embedder.spec)
        self.registry = CollectorRegistry()
        sor = SorSettings(kind="postgres", dsn=SecretStr(dsn))
        plan = PlanConfig(tables=(*entities_plan(f"public.{self.table}").tables, *tables))
        store_settings = StoreSettings(data_dir=data_dir, new_tenants=placement)
        self.store: VectorStore = (
            EdgeStore(data_dir)
            if placement is None
            else build_store(store_settings, payload_schema(plan))
        )
        ingest = IngestSettings(
            kafka=KafkaSettings(bootstrap_servers="127.0.0.1:1"),  # never contacted
            store=store_settings,
            sor=sor,
            plan=plan,
            embedding_cache=None,
        )
        self.worker: IngestWorker = build_worker(
            ingest, CollectorRegistry(), store=self.store, embedder=embedder
        )
        settings = RetrieveSettings(
            grpc=GrpcSettings(port=0),
            auth=auth
            or AuthSettings(
                tokens={t: hashlib.sha256(v.encode()).hexdigest() for t, v in TOKENS.items()}
            ),
            admission=admission or AdmissionSettings(),
            store=store_settings,
            sor=sor
            if retrieve_sor_dsn is None
            else SorSettings(kind="postgres", dsn=SecretStr(retrieve_sor_dsn)),
            plan=plan,
            publish_enabled=False,
            retrieval=retrieval.get("retrieval", RetrieveSettings().retrieval),
        )
        self.app: RetrieveApp = build_app(
            settings,
            self.registry,
            store=self.store,
            embedder=embedder,
            publisher=self.publisher,
            tracing=tracing or Tracing.off(),
        )
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._loop.run_forever, daemon=True)
        self._thread.start()
        asyncio.run_coroutine_threadsafe(self.app.server.start(), self._loop).result(30)
        self.target = f"127.0.0.1:{self.app.server.port}"
        self.channel = grpc.insecure_channel(self.target)
        self.client = pb_grpc.RetrievalServiceStub(self.channel)

    # --- the system of record ---------------------------------------------------------------

    def _tick(self) -> datetime:
        self.lsn += 16
        self.clock += timedelta(seconds=1)
        return self.clock

    def row(self, entity_id: str) -> dict[str, Any] | None:
        with (
            psycopg.connect(self.dsn) as conn,
            conn.cursor(row_factory=dict_row) as cur,
        ):
            cur.execute(f"SELECT * FROM {self.table} WHERE id = %s", (entity_id,))
            return cur.fetchone()

    def write(
        self,
        entity_id: str,
        tenant: str,
        content: str,
        *,
        title: str = "",
        entity_type: str = "KNOWLEDGE_ARTIFACT",
        metadata: dict[str, Any] | None = None,
        ingest: bool = True,
    ) -> RawRecord:
        """Upsert a row in PostgreSQL; ingest its change event unless `ingest` is False."""
        now = self._tick()
        before = self.row(entity_id)
        meta = metadata or {"format": "text"}
        with psycopg.connect(self.dsn, autocommit=True) as conn:
            conn.execute(
                f"INSERT INTO {self.table} (id, company_id, entity_type, name, content, metadata,"
                " created_at, updated_at) VALUES (%s, %s, %s, %s, %s, %s::jsonb, %s, %s)"
                " ON CONFLICT (id) DO UPDATE SET company_id = EXCLUDED.company_id,"
                " entity_type = EXCLUDED.entity_type, name = EXCLUDED.name,"
                " content = EXCLUDED.content, metadata = EXCLUDED.metadata,"
                " updated_at = EXCLUDED.updated_at, deleted_at = NULL",
                (
                    entity_id,
                    tenant,
                    entity_type,
                    title,
                    content,
                    Jsonb(meta),
                    now,
                    now,
                ),
            )
        after = self.row(entity_id)
        record = self._record(Op.UPDATE if before else Op.CREATE, before, after, entity_id)
        if ingest:
            self.ingest(record)
        return record

    def delete(self, entity_id: str, *, ingest: bool = True) -> RawRecord:
        """Hard-delete a row."""
        self._tick()
        before = self.row(entity_id)
        with psycopg.connect(self.dsn, autocommit=True) as conn:
            conn.execute(f"DELETE FROM {self.table} WHERE id = %s", (entity_id,))
        record = self._record(Op.DELETE, before, None, entity_id)
        if ingest:
            self.ingest(record)
        return record

    def soft_delete(self, entity_id: str) -> None:
        """Set deleted_at in the SoR only (the index has not caught up)."""
        with psycopg.connect(self.dsn, autocommit=True) as conn:
            conn.execute(
                f"UPDATE {self.table} SET deleted_at = now() WHERE id = %s",
                (entity_id,),
            )

    def _record(
        self,
        op: Op,
        before: dict[str, Any] | None,
        after: dict[str, Any] | None,
        key: str,
        *,
        table: str | None = None,
    ) -> RawRecord:
        table = table or self.table
        value = change_event(op, before=before, after=after, table=table, lsn=self.lsn)
        self.offset = getattr(self, "offset", -1) + 1
        return RawRecord(
            topic=topic_for(table=table),
            partition=0,
            offset=self.offset,
            key=encode_key({"id": key}),
            value=encode_value(value),
        )

    def record(self, table: str, op: Op, after: dict[str, Any], key: str) -> RawRecord:
        """The change record of a row of another mapped table (`tables`), keyed by `id`."""
        self._tick()
        return self._record(op, None, after, key, table=table)

    def ingest(self, *records: RawRecord) -> None:
        """Run records through the real ingest handler (what the worker does per batch)."""
        letters = self.worker.handler.handle(list(records))
        assert not letters, [(d.code, d.message) for d in letters]

    # --- calls -------------------------------------------------------------------------------

    def sample(self, name: str, **labels: str) -> float:
        """The server's metric sample `name` with `labels` (0 when it was never set)."""
        return self.registry.get_sample_value(name, labels) or 0.0

    def retrieve(self, caller: str, query: str, **fields: Any) -> pb.EvidencePack:
        request = pb.RetrieveRequest(query_text=query, **fields)
        pack: pb.EvidencePack = self.client.Retrieve(request, metadata=bearer(caller), timeout=30)
        return pack

    def close(self) -> None:
        self.channel.close()
        asyncio.run_coroutine_threadsafe(self.app.server.stop(), self._loop).result(30)
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(10)
        self.app.close()
