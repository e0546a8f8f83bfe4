"""Runbooks: one page per alert, named after it, linked from the rule's `runbook_url`, with the
three sections an on-call engineer needs; both copies of the rules (deploy/ and the Helm chart)."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from tests.deploy.support import ALERTS_FILE, CHART_ALERTS_FILE, REPO_ROOT, load_yaml

pytestmark = pytest.mark.unit

RUNBOOKS_DIR = REPO_ROOT / "docs" / "runbooks"
RUNBOOK_BASE = "https://github.com/ragstream/ragstream/blob/main/docs/runbooks/"
SECTIONS = ("## What it means", "## How to confirm", "## How to fix")


def _rules(path: Path) -> dict[str, dict[str, str]]:
    """alert name -> annotations of every alert rule in a rules file."""
    return {
        rule["alert"]: rule.get("annotations", {})
        for group in load_yaml(path)["groups"]
        for rule in group["rules"]
        if "alert" in rule
    }


def _pages() -> set[str]:
    return {p.stem for p in RUNBOOKS_DIR.glob("*.md") if p.name != "README.md"}


@pytest.mark.parametrize("rules_file", [ALERTS_FILE, CHART_ALERTS_FILE], ids=["deploy", "helm"])
def test_every_alert_links_its_own_runbook_and_every_runbook_has_an_alert(
    rules_file: Path,
) -> None:
    rules = _rules(rules_file)
    assert rules
    for alert, notes in rules.items():
        assert notes.get("runbook_url") == f"{RUNBOOK_BASE}{alert}.md", alert
    assert _pages() == set(rules), "docs/runbooks/<AlertName>.md and the alerts must match"


@pytest.mark.parametrize("page", sorted(_pages()))
def test_runbook_has_the_three_sections_with_something_to_run(page: str) -> None:
    text = (RUNBOOKS_DIR / f"{page}.md").read_text(encoding="utf-8")
    assert text.startswith(f"# {page}\n")
    positions = [text.find(section) for section in SECTIONS]
    assert all(p >= 0 for p in positions), (page, positions)
    assert positions == sorted(positions), f"{page}: sections out of order"
    confirm = text[positions[1] : positions[2]]
    fix = text[positions[2] :]
    # how to confirm names a metric or a command; how to fix names a command
    assert re.search(r"ragstream_\w+|kafka_consumergroup_lag|grpc_server_\w+", confirm), page
    assert re.search(r"`(ragstream|kubectl|psql|curl|grpcurl|kafka-)[^`]*`", fix), page


def test_runbook_links_between_pages_resolve() -> None:
    for page in RUNBOOKS_DIR.glob("*.md"):
        for target in re.findall(r"\]\(([^)#]+\.md)\)", page.read_text(encoding="utf-8")):
            assert (page.parent / target).is_file(), (page.name, target)
