"""The Retrieve pipeline: resolve index -> embed -> hybrid search -> calibrate -> rank ->
verify against the SoR -> evidence pack; then reindex requests and audit records.

Every stage here is blocking (ONNX, store, SoR); the gRPC servicer runs `retrieve` in a thread
pool. Domain failures raise typed `RagstreamError`s that the servicer maps to status codes.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from datetime import UTC, datetime
from typing import Protocol

import numpy as np
from numpy.typing import NDArray

from ragstream.embedders.base import Embedder
from ragstream.embedders.models import EmbeddingModels
from ragstream.errors import IndexNotFoundError, ManifestMismatchError, RagstreamError
from ragstream.fusion import FusedHit, fuse
from ragstream.publish import Publisher
from ragstream.sor.base import SystemOfRecord
from ragstream.sparse import Bm25Encoder
from ragstream.store.base import VectorStore
from ragstream.store.registry import IndexRegistry, ResolvedIndex
from retrieval_api.audit import fingerprint_query, request_record, result_records
from retrieval_api.config import RetrievalConfig
from retrieval_api.evidence import (
    IndexInfo,
    build_pack,
    entities_to_verify,
    reindex_requests,
    verdicts_from_sor,
)
from retrieval_api.metrics import RetrieveMetrics
from retrieval_api.ranking import ScoreKind, calibrate, needs_similarity, rank
from retrieval_api.validate import ValidatedRequest
from schemas.proto.ragstream.retrieval.v1 import retrieval_pb2 as pb


class DeadlineExceededError(RagstreamError):
    """The caller's deadline passed before the pipeline finished."""

    code = "DEADLINE_EXCEEDED"


class Reranker(Protocol):
    """Scores (query, passage) pairs; relevance probabilities in [0, 1]."""

    def score(self, query: str, passages: Sequence[str]) -> list[float]:
        """One score per passage, in order."""
        ...


_STATUS = {
    pb.RETRIEVAL_STATUS_SUCCESS: "SUCCESS",
    pb.RETRIEVAL_STATUS_NO_EVIDENCE: "NO_EVIDENCE",
    pb.RETRIEVAL_STATUS_FAILED: "FAILED",
}


class Retriever:
    """Runs one validated request through the pipeline (thread-safe)."""

    def __init__(
        self,
        *,
        config: RetrievalConfig,
        embedder: Embedder,
        sparse: Bm25Encoder,
        store: VectorStore,
        registry: IndexRegistry,
        sor: SystemOfRecord,
        metrics: RetrieveMetrics,
        publisher: Publisher | None = None,
        audit_topic: str = "ragstream.audit",
        reindex_topic: str = "ragstream.reindex-requests",
        audit_key: bytes | None = None,
        reranker: Reranker | None = None,
        attribute_fields: Sequence[str] = (),
        other_embedders: Sequence[Embedder] = (),
        clock: Callable[[], datetime] = lambda: datetime.now(UTC),
    ) -> None:
        """`embedder` is the primary model; `other_embedders` (e.g. the next model during a
        model change) let versions built with them be searched too."""
        if config.rerank_enabled and reranker is None:
            raise RagstreamError("retrieval.rerank_enabled is set but no reranker is configured")
        self.config = config
        self._models = EmbeddingModels(embedder, other_embedders)
        self._sparse = sparse
        self._store = store
        self._registry = registry
        self._sor = sor
        self._metrics = metrics
        self._publisher = publisher
        self._audit_topic = audit_topic
        self._reindex_topic = reindex_topic
        self._audit_key = audit_key
        self._reranker = reranker if config.rerank_enabled else None
        self._attribute_fields = tuple(attribute_fields)
        self._clock = clock

    def resolve(self, tenant: str, version: int | None) -> tuple[ResolvedIndex, Embedder]:
        """The index to search and the embedder its manifest names; INDEX_NOT_FOUND /
        MANIFEST_MISMATCH as typed errors. The active version is read per request, so a switch
        takes effect at once and each request sees one version only."""
        index = self._registry.lookup(tenant, version)
        return index, self._models.for_manifest(index.manifest, self._sparse.model_version)

    def check_models(self) -> None:
        """Raise ManifestMismatchError naming every tenant whose active index version was built
        with a model this server does not hold (it could only answer MANIFEST_MISMATCH there):
        part of the health check, so a server missing `RAGSTREAM_NEXT_EMBEDDER` after a model
        switch is NOT_SERVING instead of failing that tenant's requests."""
        missing = []
        for tenant in self._registry.list_tenants():
            try:
                index = self._registry.lookup(tenant, None)
            except IndexNotFoundError:
                continue  # no active version yet: nothing to serve
            try:
                self._models.for_manifest(index.manifest, self._sparse.model_version)
            except ManifestMismatchError:
                missing.append(f"{tenant} ({index.manifest.embedding_model_version})")
        if missing:
            raise ManifestMismatchError(
                f"no configured model can search the active index of {len(missing)} tenant(s): "
                f"{', '.join(missing[:10])}; this server holds "
                f"{', '.join(self._models.versions())} (set RAGSTREAM_EMBEDDER or "
                f"RAGSTREAM_NEXT_EMBEDDER)"
            )

    def retrieve(self, request: ValidatedRequest, deadline: float | None = None) -> pb.EvidencePack:
        """The evidence pack of one request; `deadline` is a `time.monotonic()` instant."""
        timings: dict[str, float] = {}
        started = time.perf_counter()
        requested_at = self._clock()
        stage = _Stages(timings, self._metrics, deadline)

        with stage("resolve"):
            index, embedder = self.resolve(request.tenant, request.index_version)
        with stage("embed"):
            query_vector = embedder.embed_query(request.query)
        with stage("search"):
            fused = self._search(index.collection, request, query_vector)
        self._metrics.candidates.observe(len(fused))
        with stage("rerank"):
            rerank_scores = self._rerank(request.query, fused) if self._reranker else None
        with stage("rank"):
            cosines = self._cosines_of_sparse_only(
                index.collection, request.tenant, fused, query_vector
            )
            # a sparse-only hit whose point is gone by the time its vector is read was deleted
            # by a concurrent write: it is no evidence any more (found by the live-reindex test)
            fused = [h for h in fused if h.dense_score is not None or h.point_id in cosines]
            candidates = calibrate(
                fused, similarity_for_sparse_only=cosines, rerank_scores=rerank_scores
            )
            score_kind = ScoreKind.RERANK if rerank_scores is not None else ScoreKind.COSINE
            ranking = rank(
                candidates,
                store_filter=request.store_filter,
                top_k=request.top_k,
                thresholds=request.thresholds(self.config, score_kind),
                score_kind=score_kind,
                dedup_per_entity=self.config.dedup_per_entity,
                order=self.config.order,
            )
        with stage("verify"):
            ids = entities_to_verify(ranking)
            states = self._sor.verify(request.tenant, ids) if ids else {}
            checked_at = self._clock()
            verdicts = verdicts_from_sor(ranking.survivors, states)
        with stage("evidence"):
            info = IndexInfo(
                name=index.collection,
                version=index.version,
                embedding_model_version=index.manifest.embedding_model_version,
            )
            pack = build_pack(
                request,
                info,
                ranking,
                verdicts,
                retrieved_at=checked_at,
                timings_ms=timings,
                attribute_fields=self._attribute_fields,
            )
        # the evidence stage ends after the pack copied the timings: record it and the total
        pack.timings_ms["evidence"] = timings["evidence"]
        pack.timings_ms["total"] = (time.perf_counter() - started) * 1000
        self._after(pack, request, requested_at)
        return pack

    def _search(
        self, collection: str, request: ValidatedRequest, query_vector: NDArray[np.float32]
    ) -> list[FusedHit]:
        limit = request.candidate_k
        if not self.config.hybrid:
            hits = self._store.search_dense(
                collection, query_vector, request.store_filter, limit=limit
            )
            return fuse(hits, [], dense_weight=1.0, sparse_weight=0.0, limit=limit)
        result = self._store.search_hybrid(
            collection,
            query_vector,
            self._sparse.encode_query(request.query),
            request.store_filter,
            limit=limit,
            prefetch_limit=limit,
        )
        fused = result.fused(
            dense_weight=self.config.dense_weight,
            sparse_weight=self.config.sparse_weight,
            k=self.config.rrf_k,
            method=self.config.fusion_method,
        )
        # a zero-weight branch only supplies scores, never rank: keep the other branch's hits
        if self.config.dense_weight == 0:
            fused = [h for h in fused if h.sparse_rank is not None]
        if self.config.sparse_weight == 0:
            fused = [h for h in fused if h.dense_rank is not None]
        return fused

    def _cosines_of_sparse_only(
        self,
        collection: str,
        tenant: str,
        fused: Sequence[FusedHit],
        query_vector: NDArray[np.float32],
    ) -> dict[str, float]:
        """Cosine of the query and the stored vector of hits the dense branch did not return:
        thresholds apply to a calibrated score, never to a fusion score."""
        missing = [h.point_id for h in needs_similarity(fused)]
        if not missing:
            return {}
        points = self._store.retrieve(collection, missing, tenant, with_vectors=True)
        out: dict[str, float] = {}
        for point in points:
            if point.dense is not None:
                out[point.point_id] = float(np.dot(point.dense, query_vector))
        return out

    def _rerank(self, query: str, fused: Sequence[FusedHit]) -> dict[str, float]:
        assert self._reranker is not None
        texts = [str(h.payload.get("text", "")) for h in fused]
        scores = self._reranker.score(query, texts) if texts else []
        return {h.point_id: s for h, s in zip(fused, scores, strict=True)}

    def _after(self, pack: pb.EvidencePack, request: ValidatedRequest, at: datetime) -> None:
        """Count, request reindexing of what the SoR check excluded, and audit."""
        self._metrics.requests.labels(_STATUS[pack.status]).inc()
        for item in pack.excluded:
            reason = pb.ExclusionReason.Name(item.reason).removeprefix("EXCLUSION_REASON_")
            self._metrics.excluded.labels(reason.lower()).inc()
        stale = reindex_requests(pack)
        if self._publisher is None:
            return
        for entity_id, reason in stale:
            self._metrics.reindex_requests.inc()
            self._publisher.publish(
                self._reindex_topic,
                f"{request.tenant}:{entity_id}",
                {
                    "tenant": request.tenant,
                    "entity_id": entity_id,
                    "reason": reason.value,
                    "request_id": request.request_id,
                    "index_name": pack.index_name,
                    "requested_at": at.isoformat(),
                },
            )
        self.audit(pack, request.query, at)

    def record_failure(self, pack: pb.EvidencePack, query: str, at: datetime) -> None:
        """Count and audit a request that failed before or during the pipeline."""
        self._metrics.requests.labels(_STATUS[pack.status]).inc()
        self.audit(pack, query, at)

    def audit(self, pack: pb.EvidencePack, query: str, at: datetime) -> None:
        """One request record and one record per result (hashed query only)."""
        if self._publisher is None:
            return
        fingerprint = fingerprint_query(query, key=self._audit_key)
        record = request_record(pack, query=fingerprint, requested_at=at)
        self._publisher.publish(self._audit_topic, pack.request_id, record)
        for row in result_records(pack, requested_at=at):
            self._publisher.publish(self._audit_topic, pack.request_id, row)


class _Stages:
    """Times named stages into `timings` (ms) and the stage histogram; enforces the deadline."""

    def __init__(
        self, timings: dict[str, float], metrics: RetrieveMetrics, deadline: float | None
    ) -> None:
        self._timings = timings
        self._metrics = metrics
        self._deadline = deadline

    @contextmanager
    def __call__(self, name: str) -> Iterator[None]:
        if self._deadline is not None and time.monotonic() > self._deadline:
            raise DeadlineExceededError(f"deadline exceeded before stage {name!r}")
        started = time.perf_counter()
        try:
            yield
        finally:
            elapsed = time.perf_counter() - started
            self._timings[name] = elapsed * 1000
            self._metrics.stage_seconds.labels(name).observe(elapsed)
