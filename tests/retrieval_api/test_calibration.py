"""Calibration end to end: fitted from the index's own chunks, stored with the index version,
reproducible, used by Retrieve; and the dev stack's showcase identifier query through gRPC."""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Iterator, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from numpy.typing import NDArray
from prometheus_client import CollectorRegistry

from ragcore.embedders.base import Embedder
from ragcore.embedders.local_onnx import LocalOnnxEmbedder
from ragcore.kafka_config import KafkaSettings
from ragcore.quality.dataset import EvalEntity, EvalQuery, EvalSet, QueryKind
from ragcore.quality.metrics import Status
from ragcore.settings import StoreSettings
from ragcore.sparse import Bm25Encoder
from ragcore.store.base import Placement
from ragcore.store.edge import EdgeStore
from ragcore.store.registry import FileIndexRegistry, ResolvedIndex
from ragdev.eval.configs import DEFAULT_CONFIGS
from ragdev.eval.runner import _records, run_eval
from retrieval_api import calibration as calibration_module
from retrieval_api.calibration import CalibrationSettings, calibrate_version, fit_calibration
from retrieval_api.candidates import (
    CalibrationMismatchError,
    CandidateSearch,
    RawPool,
    pool_evidence,
)
from retrieval_api.evidence_score import QUERY_FEATURES, EvidenceCalibration, feature_matrix
from retrieval_api.pipeline_settings import RetrievalConfig
from streams.app import build_worker
from streams.settings import IngestSettings

pytestmark = [pytest.mark.integration, pytest.mark.slow]

TOPICS = [
    ("refund", "Annual subscriptions are refunded pro rata within thirty days of renewal."),
    ("travel", "Hotel stays are reimbursed up to 250 dollars per night in major cities."),
    ("pump", "Grease the bearings of the GX-PMP-4200 every 2,000 operating hours."),
    ("seal", "Replace the mechanical seal GX-SEAL-KIT-42 when the pump leaks at the shaft."),
    ("oncall", "Engineers on call get a weekly stipend and a day off after a night page."),
    ("vpn", "The staging VPN certificate expires every ninety days and is renewed by IT."),
    ("saml", "SAML logins fail when the identity provider clock drifts by sixty seconds."),
    ("export", "Large CSV exports run in the background and arrive by email as a zip file."),
    ("forklift", "Only trained staff with a yellow badge may drive a forklift in the hall."),
    ("incident", "A SEV1 incident needs a public postmortem within five business days."),
]


def small_set() -> EvalSet:
    entities = [
        EvalEntity(
            entity_id=f"kb-{name}",
            tenant="acme",
            entity_type="KNOWLEDGE_ARTIFACT",
            title=f"{name.title()} policy",
            content=f"# {name.title()} policy\n\n{text} " * 3,
        )
        for name, text in TOPICS
    ]
    query = EvalQuery(
        query_id="q",
        text="refund",
        tenant="acme",
        kind=QueryKind.KEYWORD,
        answerable=True,
        relevant={"kb-refund": 3},
    )
    return EvalSet(name="small", version="1", entities=tuple(entities), queries=(query,))


@pytest.fixture
def index(
    tmp_path: Path, embedder: LocalOnnxEmbedder
) -> Iterator[tuple[EdgeStore, FileIndexRegistry, ResolvedIndex]]:
    store = EdgeStore(tmp_path / "store")
    worker = build_worker(
        IngestSettings(
            kafka=KafkaSettings(bootstrap_servers="127.0.0.1:1"),  # never contacted
            store=StoreSettings(data_dir=tmp_path / "store"),
            embedding_cache=None,
        ),
        CollectorRegistry(),
        store=store,
        embedder=embedder,
    )
    assert not worker.handler.handle(_records(small_set()))
    registry = FileIndexRegistry(tmp_path / "store", store)
    try:
        yield store, registry, registry.lookup("acme", None)
    finally:
        worker.close()
        store.close()


def test_calibration_is_fitted_from_the_index_stored_with_it_and_reproducible(
    index: tuple[EdgeStore, FileIndexRegistry, ResolvedIndex], embedder: LocalOnnxEmbedder
) -> None:
    store, registry, resolved = index
    search = _search(index)
    prior = search.calibration(resolved)
    assert prior.source == "prior"  # never calibrated yet
    # the default order is the calibrated one; the prior's order was chosen on another corpus
    assert search.config.order == "calibrated"
    assert search.choice(prior) == search.fused_choice()
    assert search.fused_choice().label == "convex(dense 0.5, lexical 0.5)"
    settings = CalibrationSettings(positives=40, negatives=40, seed=5)
    first = fit_calibration(search, resolved, embedder, store, settings=settings)
    again = fit_calibration(search, resolved, embedder, store, settings=settings)
    assert first.fingerprint == again.fingerprint
    assert first.lexicon.n_docs == len(TOPICS)
    report = first.report
    assert report["queries"]["total"] >= 60
    assert {"ece", "abstention"} <= set(report["held_out"])
    # the threshold is chosen on the out-of-fold scores of every decidable query, the models'
    # and those generated for it alone (3x as many by default)
    assert report["queries"]["threshold_only"] >= 2 * report["queries"]["total"]
    threshold = report["hard_threshold"]
    assert threshold["value"] == first.thresholds.hard
    assert threshold["folds"] == 5
    assert report["queries"]["held_out"] < threshold["queries"]
    assert threshold["queries"] <= report["queries"]["total"] + report["queries"]["threshold_only"]
    assert threshold["false_abstention"] <= settings.max_false_abstention
    assert report["order"]["chosen"] == first.ranking.label
    table = report["order"]["table"]
    # the configured fusion is the baseline; fusions are compared on every paraphrase, the
    # models' and the threshold's (more than the models' paraphrases alone: the vote's power),
    # the fitted evidence order on those its models were not fitted on
    assert table[0]["order"] == "convex(dense 0.5, lexical 0.5)"
    assert [row["order"] for row in table].count("convex(dense 0.5, lexical 0.5)") == 1
    evidence_row = next(row for row in table if row["order"] == "evidence")
    paraphrases = report["queries"]["by_kind"]["paraphrase"]
    assert paraphrases < evidence_row["queries"] < table[0]["queries"]
    assert table[0]["queries"] <= paraphrases + report["queries"]["threshold_only"]

    stored = calibrate_version(search, registry, resolved, embedder, store, settings=settings)
    text = registry.load_calibration("acme", resolved.version)
    assert text is not None and json.loads(text)["source"] == "fitted"
    assert EvidenceCalibration.from_json(text).fingerprint == stored.fingerprint
    assert search.calibration(resolved).fingerprint == stored.fingerprint  # cache was dropped


@dataclass(frozen=True)
class _DirectRows:
    """The calibration's pool rows as they were computed before they were cached: the
    features again for every model and fit, the evidence by `pool_evidence` itself."""

    raw: RawPool
    names: tuple[str, ...]

    @property
    def query_row(self) -> NDArray[np.float64]:
        return feature_matrix(self.raw.query, self.raw.signals[:1], QUERY_FEATURES)

    @property
    def rows(self) -> NDArray[np.float64]:
        return feature_matrix(self.raw.query, self.raw.signals, self.names)

    def evidence(self, calibration: EvidenceCalibration) -> list[float]:
        return pool_evidence(self.raw, calibration)


def _scan_hard(
    best: Sequence[float], answerable: Sequence[bool], max_false: float
) -> tuple[float, dict[str, Any]]:
    """`_choose_hard` as a scan of every query for every candidate threshold (as before the
    bisection): the lowest of the thresholds with the best balanced accuracy."""
    positives = sum(answerable)
    negatives = len(answerable) - positives
    if not positives or not negatives:
        return 0.5, {"reason": "held-out queries lack a class: 0.5"}
    allowed: dict[float, float] = {}
    for t in sorted({round(v, 4) for v in best} | {0.5}):
        below = [a for b, a in zip(best, answerable, strict=True) if b < t]
        wrong, right = sum(below), len(below) - sum(below)
        if wrong / positives <= max_false:
            allowed[t] = 0.5 * ((positives - wrong) / positives + right / negatives)
    if not allowed:
        return 0.0, {"balanced_accuracy": -1.0}
    chosen = max(allowed, key=lambda t: (allowed[t], -t))
    return min(max(chosen, 0.0), 1.0), {"balanced_accuracy": round(allowed[chosen], 4)}


def test_the_calibration_equals_the_one_of_the_direct_computation(
    index: tuple[EdgeStore, FileIndexRegistry, ResolvedIndex],
    embedder: LocalOnnxEmbedder,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The calibration's cost cuts (batched query embedding, feature rows computed once per
    pool, the threshold scan by bisection) change nothing: the stored calibration, report
    included, is the one of one `embed_query` per query, the features recomputed for every
    model and `pool_evidence` (docs/decisions/abstention-threshold.md, cost)."""
    store, _, resolved = index
    search = _search(index)
    settings = CalibrationSettings(positives=40, negatives=40, seed=2)
    fitted_at = datetime(2026, 1, 1, tzinfo=UTC)

    def fit() -> dict[str, Any]:
        fitted = fit_calibration(
            search, resolved, embedder, store, settings=settings, clock=lambda: fitted_at
        )
        stored: dict[str, Any] = json.loads(fitted.to_json())
        del stored["report"]["seconds"]  # the one field that measures the run
        return stored

    cheap = fit()
    embedded: list[str] = []

    def one_by_one(model: Embedder, texts: Sequence[str]) -> NDArray[np.float32]:
        embedded.extend(texts)
        return np.stack([model.embed_query(t) for t in texts])

    monkeypatch.setattr(calibration_module, "embed_queries", one_by_one)
    monkeypatch.setattr(
        calibration_module._PoolRows,
        "of",
        classmethod(lambda _cls, raw, names: _DirectRows(raw, tuple(names))),
    )
    monkeypatch.setattr(calibration_module, "_choose_hard", _scan_hard)
    direct = fit()
    assert len(embedded) > 4 * 60  # the route above ran, for every query
    assert cheap["report"]["hard_threshold"]["queries"] > 200
    assert cheap == direct


def test_showcase_identifier_query_returns_a_chunk_holding_the_identifier_first() -> None:
    # The dev stack's showcase ("what does error E-2113 mean?"): an error-code page lists many
    # E-codes; the release notes that fixed E-2113 hold the identifier but score low on cosine.
    codes = "\n".join(f"- E-{5000 + n}: internal error class {n}, retry later." for n in range(12))
    entities = [
        EvalEntity(
            entity_id="kb-error-codes",
            tenant="acme",
            entity_type="KNOWLEDGE_ARTIFACT",
            title="Error codes",
            content=f"# Error codes\n\nWhat an error code means.\n\n{codes}",
        ),
        *(
            EvalEntity(
                entity_id=f"release-{n}",
                tenant="acme",
                entity_type="RELEASE_NOTE",
                title=f"Release 2.{n}",
                content=f"# Release 2.{n}\n\n- E-2113: fixed a bug where SAML logins failed "
                f"when the IdP clock drifted.\n- Faster exports for workspace {n}.",
            )
            for n in range(3)
        ),
        *(
            EvalEntity(
                entity_id=f"kb-{name}",
                tenant="acme",
                entity_type="KNOWLEDGE_ARTIFACT",
                content=text,
            )
            for name, text in TOPICS
        ),
    ]
    queries = tuple(
        EvalQuery(
            query_id=qid,
            text=text,
            tenant="acme",
            kind=QueryKind.EXACT_IDENTIFIER,
            answerable=True,
            relevant={f"release-{n}": 3 for n in range(3)},
        )
        for qid, text in (("phrased", "what does error E-2113 mean?"), ("bare", "E-2113"))
    )
    evalset = EvalSet(name="showcase", version="1", entities=tuple(entities), queries=queries)
    configs = {n: DEFAULT_CONFIGS[n] for n in ("default", "no_collapse", "no_identifier_rule")}
    calibration = CalibrationSettings(positives=40, negatives=40)
    results = run_eval(evalset, configs=configs, progress=False, calibration=calibration)
    default, no_collapse = results[0].result, results[1].result
    for qid in ("phrased", "bare"):
        row = default.row(qid)
        assert row.status is Status.SUCCESS
        assert row.top_entities[0].startswith("release-"), row.top_entities
        # the three release notes say the same thing: the default collapses them into one
        # result (the others in its `also_in`), so they do not fill the top 3
        assert sum(e.startswith("release-") for e in row.top_entities[:3]) == 1, row
        apart = no_collapse.row(qid)
        assert set(apart.top_entities[:3]) == {"release-0", "release-1", "release-2"}, apart


def _search(index: tuple[EdgeStore, FileIndexRegistry, ResolvedIndex]) -> CandidateSearch:
    """A search over the fixture's index with the default configuration."""
    store, registry, _ = index
    return CandidateSearch(
        config=RetrievalConfig(), encoder=Bm25Encoder(), store=store, registry=registry
    )


def test_a_burst_of_cold_requests_loads_a_calibration_once(
    index: tuple[EdgeStore, FileIndexRegistry, ResolvedIndex], monkeypatch: pytest.MonkeyPatch
) -> None:
    """Found by the multi-process benchmark: 16 cold requests each scanned the whole index for
    the prior and all missed their deadlines. Concurrent misses now wait for one load."""
    _, registry, resolved = index
    search = _search(index)
    loads: list[int] = []
    real = registry.load_calibration

    def slow(tenant: str, version: int) -> str | None:
        loads.append(version)
        time.sleep(0.3)  # a load long enough for every other thread to miss the cache
        return real(tenant, version)

    monkeypatch.setattr(registry, "load_calibration", slow)
    with ThreadPoolExecutor(8) as pool:
        got = list(pool.map(lambda _: search.calibration(resolved), range(8)))
    assert loads == [resolved.version]
    assert len({id(c) for c in got}) == 1
    search.forget(resolved.collection)
    search.calibration(resolved)
    assert len(loads) == 2  # forgetting still forces a reload


def _clocked_search(
    index: tuple[EdgeStore, FileIndexRegistry, ResolvedIndex],
) -> tuple[CandidateSearch, list[float]]:
    """A search whose monotonic clock is the returned list's one value (set it to move time)."""
    store, registry, _ = index
    clock = [0.0]
    search = CandidateSearch(
        config=RetrievalConfig(),
        encoder=Bm25Encoder(),
        store=store,
        registry=registry,
        monotonic=lambda: clock[0],
    )
    return search, clock


def test_an_expired_calibration_is_served_while_one_background_load_replaces_it(
    index: tuple[EdgeStore, FileIndexRegistry, ResolvedIndex], monkeypatch: pytest.MonkeyPatch
) -> None:
    """The prior of a never-calibrated index recounts the index's words every 300 s; at 100k
    chunks a recount took tens of seconds, and every request that found the entry expired
    waited for it. Now an expired entry is served and one background thread reloads it."""
    _, registry, resolved = index
    search, clock = _clocked_search(index)
    first = search.calibration(resolved)
    assert first.source == "prior"
    loading, release = threading.Event(), threading.Event()
    loads: list[int] = []
    real = registry.load_calibration

    def slow(tenant: str, version: int) -> str | None:
        loads.append(version)
        loading.set()
        assert release.wait(30)
        return real(tenant, version)

    monkeypatch.setattr(registry, "load_calibration", slow)
    clock[0] = 301.0  # past the prior's TTL
    with ThreadPoolExecutor(8) as pool:
        served = list(pool.map(lambda _: search.calibration(resolved), range(8)))
    assert loading.wait(10)
    # every request got the expired entry at once, and only one reload is in flight
    assert {id(c) for c in served} == {id(first)} and loads == [resolved.version]
    release.set()
    deadline = time.monotonic() + 30
    while search.calibration(resolved) is first:
        assert time.monotonic() < deadline, "the background reload never landed"
        time.sleep(0.01)
    assert loads == [resolved.version]


def test_a_reload_that_fails_drops_the_entry_so_the_next_request_fails_loudly(
    index: tuple[EdgeStore, FileIndexRegistry, ResolvedIndex], monkeypatch: pytest.MonkeyPatch
) -> None:
    _, registry, resolved = index
    search, clock = _clocked_search(index)
    first = search.calibration(resolved)
    failed = threading.Event()

    def unusable(tenant: str, version: int) -> str | None:
        failed.set()
        return "{not json"

    monkeypatch.setattr(registry, "load_calibration", unusable)
    clock[0] = 301.0
    assert search.calibration(resolved) is first  # served while the reload runs
    assert failed.wait(10)
    deadline = time.monotonic() + 30
    while True:
        try:
            got = search.calibration(resolved)
        except CalibrationMismatchError as exc:
            assert "unusable" in str(exc)
            break
        assert got is first
        assert time.monotonic() < deadline, "the failed reload was never surfaced"
        time.sleep(0.01)


def test_a_load_that_began_before_forget_is_not_cached(
    index: tuple[EdgeStore, FileIndexRegistry, ResolvedIndex], monkeypatch: pytest.MonkeyPatch
) -> None:
    """`calibrate` saves a new calibration and forgets the cached one: a reload already in
    flight (which read the old one) must not put the old one back."""
    _, registry, resolved = index
    search, clock = _clocked_search(index)
    first = search.calibration(resolved)
    loading, release = threading.Event(), threading.Event()
    real = registry.load_calibration

    def slow(tenant: str, version: int) -> str | None:
        loading.set()
        assert release.wait(30)
        return real(tenant, version)

    monkeypatch.setattr(registry, "load_calibration", slow)
    clock[0] = 301.0
    assert search.calibration(resolved) is first
    assert loading.wait(10)
    search.forget(resolved.collection)
    after: list[int] = []

    def counted(tenant: str, version: int) -> str | None:
        after.append(version)
        return real(tenant, version)

    monkeypatch.setattr(registry, "load_calibration", counted)
    release.set()
    deadline = time.monotonic() + 30
    while any(t.name == f"calibration-{resolved.collection}" for t in threading.enumerate()):
        assert time.monotonic() < deadline, "the reload never finished"
        time.sleep(0.01)
    # the stale reload was discarded: the next request loads anew
    assert search.calibration(resolved) is not first
    assert after == [resolved.version]


def test_warming_loads_each_calibration_of_the_placements_asked_for_once(
    index: tuple[EdgeStore, FileIndexRegistry, ResolvedIndex], monkeypatch: pytest.MonkeyPatch
) -> None:
    """Retrieve loads calibrations at start (`warm_calibrations`) so a first request does not
    wait for a never-calibrated index's scan; the requests then find them loaded."""
    _, registry, resolved = index
    assert resolved.manifest.placement == "dedicated"  # an engine collection of its own
    search = _search(index)
    loads: list[str] = []
    real = registry.load_calibration

    def counted(tenant: str, version: int) -> str | None:
        loads.append(tenant)
        return real(tenant, version)

    monkeypatch.setattr(registry, "load_calibration", counted)
    active = sorted(t for t in registry.list_tenants() if registry.active_version(t) is not None)
    assert active
    shared: tuple[Placement, ...] = ("shared",)
    dedicated: tuple[Placement, ...] = ("dedicated",)
    assert search.warm(shared, threading.Event()) == 0 and loads == []
    stopped = threading.Event()
    stopped.set()
    assert search.warm(("dedicated", "shared"), stopped) == 0 and loads == []
    assert search.warm(dedicated, threading.Event()) == len(active)
    assert sorted(loads) == active
    assert search.calibration(resolved).source == "prior"
    assert sorted(loads) == active  # the request found it loaded


def test_an_index_that_cannot_be_warmed_is_logged_and_left_to_its_requests(
    index: tuple[EdgeStore, FileIndexRegistry, ResolvedIndex],
    monkeypatch: pytest.MonkeyPatch,
    caplog: pytest.LogCaptureFixture,
) -> None:
    _, registry, resolved = index
    search = _search(index)
    real = registry.load_calibration

    def unusable_for_acme(tenant: str, version: int) -> str | None:
        return "{not json" if tenant == "acme" else real(tenant, version)

    monkeypatch.setattr(registry, "load_calibration", unusable_for_acme)
    active = [t for t in registry.list_tenants() if registry.active_version(t) is not None]
    with caplog.at_level("WARNING", logger="retrieval_api.candidates"):
        warmed = search.warm(("dedicated", "shared"), threading.Event())
    assert warmed == len(active) - 1
    assert "calibration of tenant acme not loaded ahead of its requests" in caplog.text
    assert "unusable" in caplog.text
    with pytest.raises(CalibrationMismatchError, match="unusable"):
        search.calibration(resolved)  # its request fails as it would have
