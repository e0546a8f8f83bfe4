"""Shared fixtures: real services on loopback, started by the tests themselves.

Under CI (`CI=true`) a skipped test fails the run unless it is marked `external` (it needs a
service that cannot exist on this machine kind, e.g. a Docker engine): CI can never go green
by skipping the broker, Postgres or storage-engine suites.
"""

from __future__ import annotations

import ast
import os
from collections.abc import Iterator
from pathlib import Path

import pytest

from ragdev.services.postgres import PostgresCluster
from ragdev.services.tansu import TansuBroker

REPO_ROOT = Path(__file__).resolve().parents[1]


def _find_vectors() -> Path:
    """The shared test vectors (never copied into the repo): `$RAGSTREAM_TEST_VECTORS`, else
    `shared/vectors` beside the checkout or beside one of its ancestors, else
    `/work/shared/vectors`, where these machines keep them (a checkout cloned elsewhere, e.g.
    into a temp dir, still finds them)."""
    configured = os.environ.get("RAGSTREAM_TEST_VECTORS")
    if configured:
        return Path(configured)
    for base in REPO_ROOT.parents:
        candidate = base / "shared" / "vectors"
        if candidate.is_dir():
            return candidate
    return Path("/work/shared/vectors")


VECTORS = _find_vectors()


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


@pytest.fixture(scope="session")
def vectors_dir() -> Path:
    """The external test vectors (see `_find_vectors`); skipped (a failure under CI) when absent."""
    if not VECTORS.is_dir():
        pytest.skip(f"shared test vectors not found at {VECTORS}")
    return VECTORS


@pytest.fixture(scope="session")
def kafka_broker() -> Iterator[TansuBroker]:
    """A real Kafka-protocol broker (tansu) on a loopback port for the whole session."""
    with TansuBroker() as broker:
        yield broker


@pytest.fixture(scope="session")
def postgres() -> Iterator[PostgresCluster]:
    """A throwaway PostgreSQL cluster from the installed binaries, for the whole session, with
    logical decoding on (real Debezium reads it)."""
    with PostgresCluster(logical=True) as cluster:
        yield cluster
