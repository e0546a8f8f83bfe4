"""Retrieve's health covers the models: a server that cannot search some tenant's active index
(built with a model it does not hold, e.g. after a blue-green switch without
`RAGSTREAM_NEXT_EMBEDDER`) reports NOT_SERVING over the real gRPC health service, and
SERVING once it holds that model. HashEmbedder doubles stand in for the models (no model
weights are needed to tell manifests apart)."""

from __future__ import annotations

import asyncio
import sqlite3
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import grpc
import pytest
from grpc_health.v1 import health_pb2, health_pb2_grpc
from prometheus_client import CollectorRegistry

from ragcore.embedders.spec import EmbeddingSpec
from ragcore.settings import SorSettings, StoreSettings
from ragcore.sparse import Bm25Encoder
from ragcore.store.edge import EdgeStore
from ragcore.store.registry import FileIndexRegistry
from retrieval_api.app import build_app
from retrieval_api.settings import GrpcSettings, RetrieveSettings
from tests.conftest import REPO_ROOT
from tests.streams.support import HASH_SPEC, HashEmbedder

pytestmark = pytest.mark.integration

NEW = EmbeddingSpec(
    name="hash-test", version="2", dimension=48, max_input_tokens=48, tokenizer=HASH_SPEC.tokenizer
)


@contextmanager
def serving(store: EdgeStore, sor: Path, *embedders: HashEmbedder) -> Iterator[int]:
    settings = RetrieveSettings(
        grpc=GrpcSettings(port=0),
        store=StoreSettings(data_dir=sor.parent / "store"),  # where the registry lives
        sor=SorSettings(kind="sqlite", sqlite_path=sor),
        publish_enabled=False,
    )
    app = build_app(
        settings,
        CollectorRegistry(),
        store=store,
        embedder=embedders[0],
        next_embedder=embedders[1] if len(embedders) > 1 else None,
    )
    loop = asyncio.new_event_loop()
    thread = threading.Thread(target=loop.run_forever, daemon=True)
    thread.start()
    try:
        asyncio.run_coroutine_threadsafe(app.server.start(), loop).result(30)
        with grpc.insecure_channel(f"127.0.0.1:{app.server.port}") as channel:
            check = health_pb2_grpc.HealthStub(channel).Check
            yield check(health_pb2.HealthCheckRequest(service=""), timeout=10).status
    finally:
        asyncio.run_coroutine_threadsafe(app.server.stop(), loop).result(30)
        loop.call_soon_threadsafe(loop.stop)
        thread.join(10)
        app.close()


def test_a_server_without_the_active_versions_model_is_not_serving(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    sor = tmp_path / "sor.sqlite"
    with sqlite3.connect(sor) as conn:
        conn.executescript((REPO_ROOT / "schemas" / "sql" / "entities.sqlite.sql").read_text())
    store = EdgeStore(tmp_path / "store")
    try:
        registry = FileIndexRegistry(tmp_path / "store", store)
        for spec in (HASH_SPEC, NEW):
            made = registry.create_version("acme", spec, sparse_encoder=Bm25Encoder().model_version)
            registry.mark_ready("acme", made.version, total_vectors=0)
        registry.activate("acme", 2)  # switched to the new model

        with serving(store, sor, HashEmbedder(HASH_SPEC)) as status:
            assert status == health_pb2.HealthCheckResponse.NOT_SERVING
        assert (
            "acme (hash-test@2)" in caplog.text and "this server holds hash-test@1" in caplog.text
        )

        with serving(store, sor, HashEmbedder(HASH_SPEC), HashEmbedder(NEW)) as status:
            assert status == health_pb2.HealthCheckResponse.SERVING
    finally:
        store.close()
