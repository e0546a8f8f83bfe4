"""Shared fixtures: real services on loopback, started by the tests themselves.

Under CI (`CI=true`) a skipped test fails the run unless it is marked `external` (it needs a
service that cannot exist on this machine kind, e.g. a Docker engine, or third-party files kept
beside the checkout): CI can never go green by skipping the broker, Postgres or storage-engine
suites.

The tests are self-contained: a test not marked `external` that opens a file outside the
checkout, the temp dir, the caches the tests create and the installed software fails
(`tests/reads.py`).
"""

from __future__ import annotations

import ast
import os
import sys
from collections.abc import Generator, Iterator
from pathlib import Path

import pytest

from ragdev.services.postgres import PostgresCluster
from ragdev.services.tansu import TansuBroker
from tests.reads import AUDIT
from tests.streams.support import MockKafka

REPO_ROOT = Path(__file__).resolve().parents[1]


def find_vectors(start: Path = REPO_ROOT) -> Path | None:
    """The third-party test vectors (not ours to copy into the repository): `shared/vectors`
    beside the checkout or beside one of its ancestors, `$RAGSTREAM_TEST_VECTORS` when set;
    None when there are none."""
    configured = os.environ.get("RAGSTREAM_TEST_VECTORS")
    if configured:
        return Path(configured) if Path(configured).is_dir() else None
    for base in start.parents:
        candidate = base / "shared" / "vectors"
        if candidate.is_dir():
            return candidate
    return None


VECTORS = find_vectors()


def _in_ci() -> bool:
    return os.environ.get("CI", "").lower() in {"1", "true", "yes"}


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item: pytest.Item, call: pytest.CallInfo[None]) -> Iterator[None]:
    """Under CI, turn the skip of a non-`external` test into a failure with the skip reason."""
    outcome = yield
    report: pytest.TestReport = outcome.get_result()  # type: ignore[attr-defined]
    if _in_ci() and report.skipped and item.get_closest_marker("external") is None:
        if hasattr(report, "wasxfail"):
            return
        reason = report.longrepr[2] if isinstance(report.longrepr, tuple) else report.longrepr
        report.outcome = "failed"
        report.longrepr = f"skipped under CI (only `external` tests may skip): {reason}"


def pytest_configure(config: pytest.Config) -> None:
    """Install the read audit (once per process: audit hooks cannot be removed)."""
    if not getattr(sys, "_ragstream_read_audit", False):
        sys.addaudithook(AUDIT)
        sys._ragstream_read_audit = True  # type: ignore[attr-defined]


@pytest.hookimpl(wrapper=True)
def pytest_runtest_call(item: pytest.Item) -> Generator[None, None, None]:
    """Fail a test (not marked `external`) that opened a file outside the checkout, the temp
    dir, the tests' caches and the installed software while it ran."""
    audited = item.get_closest_marker("external") is None
    if audited:
        AUDIT.arm()
    try:
        yield
    finally:
        outside = AUDIT.disarm()
    if audited and outside:
        pytest.fail(f"the test read outside the checkout: {outside}", pytrace=False)


#: Every test has exactly one of these markers (see pyproject `markers`).
TEST_KINDS = frozenset({"unit", "integration", "external"})


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Refuse to run a test with none or several of the kinds unit/integration/external."""
    wrong = []
    for item in items:
        kinds = sorted({mark.name for mark in item.iter_markers()} & TEST_KINDS)
        if len(kinds) != 1:
            wrong.append(f"{item.nodeid}: {', '.join(kinds) or 'no kind'}")
    if wrong:
        listed = "\n  ".join(wrong)
        raise pytest.UsageError(
            f"every test needs exactly one of the markers {sorted(TEST_KINDS)}:\n  {listed}"
        )


def _marked_external(path: Path | None) -> bool:
    """Whether a test module's `pytestmark` names `external`, read from its source (importing
    the module again would raise its skip again)."""
    if path is None or path.suffix != ".py":
        return False
    for node in ast.parse(path.read_text(), filename=str(path)).body:
        if isinstance(node, ast.Assign) and any(
            isinstance(t, ast.Name) and t.id == "pytestmark" for t in node.targets
        ):
            return "external" in ast.unparse(node.value)
    return False


@pytest.hookimpl(hookwrapper=True)
def pytest_make_collect_report(collector: pytest.Collector) -> Iterator[None]:
    """Under CI, a module skipped at collection (`pytest.skip(allow_module_level=True)`,
    `pytest.importorskip` at the top) fails like a skipped test, unless it is `external`."""
    outcome = yield
    report: pytest.CollectReport = outcome.get_result()  # type: ignore[attr-defined]
    if not (_in_ci() and report.skipped):
        return
    if _marked_external(getattr(collector, "path", None)):
        return
    reason = report.longrepr[2] if isinstance(report.longrepr, tuple) else report.longrepr
    report.outcome = "failed"
    report.longrepr = f"skipped at collection under CI (only `external` may skip): {reason}"


def require_vectors() -> Path:
    """The third-party test vectors, or a skip with the reason (tests that call this are marked
    `external`, so a checkout without the vectors reports why instead of failing)."""
    if VECTORS is None:
        pytest.skip(
            "third-party test vectors not found: no shared/vectors beside the checkout or its"
            " parents, and RAGSTREAM_TEST_VECTORS is not set"
        )
    return VECTORS


@pytest.fixture(scope="session")
def vectors_dir() -> Path:
    """The third-party test vectors (`find_vectors`), skipped with the reason when absent."""
    return require_vectors()


@pytest.fixture(scope="session")
def kafka_broker() -> Iterator[TansuBroker]:
    """A real Kafka-protocol broker (tansu) on a loopback port for the whole session."""
    with TansuBroker() as broker:
        yield broker


@pytest.fixture(scope="session")
def mock_kafka() -> Iterator[MockKafka]:
    """librdkafka's mock cluster, the only broker here with retention (`MockKafka`)."""
    cluster = MockKafka()
    yield cluster
    cluster.producer.flush(10)


@pytest.fixture(scope="session")
def postgres() -> Iterator[PostgresCluster]:
    """A throwaway PostgreSQL cluster from the installed binaries, for the whole session, with
    logical decoding on (real Debezium reads it)."""
    with PostgresCluster(logical=True) as cluster:
        yield cluster
