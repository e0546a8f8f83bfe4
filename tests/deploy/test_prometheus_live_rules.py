"""The rules the live-Prometheus tests evaluate (tests/deploy/prometheus_live.py): generated from
the shipped file with short windows and `for:` durations, thresholds and expressions unchanged,
and a `for:` that outlasts a partial window where production's does. promtool (Prometheus's own
rule engine) shows why the last part matters: a few fast changes after a slow start (a backlog of
live changes at start-up) read as a freshness p95 in the backlog's bucket for up to one window."""

from __future__ import annotations

import re
import subprocess
from pathlib import Path

import pytest
import yaml

from tests.deploy import prometheus_live
from tests.deploy.prometheus_live import (
    FULL_WINDOW_FOR,
    SHORT_FOR,
    SHORT_WINDOW,
    shortened_rules,
)
from tests.deploy.support import ALERTS_FILE, require_tool

_WINDOW = re.compile(r"\[\d+[smh]\]")
FRESHNESS = "ragstream_ingest_freshness_seconds_bucket"


def _rules(text: str) -> dict[str, dict[str, str]]:
    data = yaml.safe_load(text)
    return {r["alert"]: r for g in data["groups"] for r in g["rules"] if "alert" in r}


@pytest.mark.unit
def test_the_generated_rules_shorten_windows_and_for_and_change_nothing_else() -> None:
    shipped = _rules(ALERTS_FILE.read_text(encoding="utf-8"))
    generated = _rules(shortened_rules(ALERTS_FILE.read_text(encoding="utf-8")))
    assert generated.keys() == shipped.keys()
    for name, rule in shipped.items():
        short = generated[name]
        assert _WINDOW.sub("[W]", short["expr"]) == _WINDOW.sub("[W]", rule["expr"]), name
        assert set(_WINDOW.findall(short["expr"])) <= {f"[{SHORT_WINDOW}]"}, name
        assert short["labels"] == rule["labels"] and short["annotations"] == rule["annotations"]
    # production waits at least a full window on the quantile and ratio rules; so does the copy
    assert generated["RagstreamFreshnessSLOBreach"]["for"] == FULL_WINDOW_FOR
    assert generated["RagstreamRetrieveLatencyHigh"]["for"] == FULL_WINDOW_FOR
    assert generated["RagstreamSchemaDrift"]["for"] == SHORT_FOR  # 1m over [5m] shipped


def _freshness_after_a_slow_start(rules: Path) -> str:
    """A promtool test: a worker's series first scraped just after a slow start (150 live
    changes at 3-5 s freshness: a backlog the worker found when it started), then 5 changes at
    0.1 s; the generated freshness rule must not fire (the p95 of the changes in the window is
    0.1 s)."""
    buckets = {"0.25": 0, "1.0": 0, "2.0": 0, "3.0": 0, "5.0": 150, "+Inf": 150}
    series = [
        {
            "series": (
                f'{FRESHNESS}{{job="ragstream-ingest",tenant_class="default",lane="live",'
                f'le="{le}"}}'
            ),
            "values": f"{start}x3 {start + 5}x20",
        }
        for le, start in buckets.items()
    ]
    test = {
        "rule_files": [str(rules)],
        "evaluation_interval": "1s",
        "tests": [
            {
                "interval": "1s",
                "input_series": series,
                "alert_rule_test": [
                    {
                        "eval_time": f"{t}s",
                        "alertname": "RagstreamFreshnessSLOBreach",
                        "exp_alerts": [],
                    }
                    for t in range(3, 24)
                ],
            }
        ],
    }
    return yaml.safe_dump(test)


def _promtool_test(tmp_path: Path, generated: str) -> subprocess.CompletedProcess[str]:
    rules = tmp_path / "alerts.yml"
    rules.write_text(generated, encoding="utf-8")
    (tmp_path / "test.yml").write_text(_freshness_after_a_slow_start(rules), encoding="utf-8")
    return subprocess.run(
        [str(require_tool("promtool")), "test", "rules", str(tmp_path / "test.yml")],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )


@pytest.mark.integration
def test_a_few_fast_changes_after_a_slow_start_do_not_fire_the_freshness_rule(
    tmp_path: Path,
) -> None:
    result = _promtool_test(tmp_path, shortened_rules(ALERTS_FILE.read_text(encoding="utf-8")))
    assert result.returncode == 0, result.stdout + result.stderr


@pytest.mark.integration
def test_with_a_for_shorter_than_the_window_the_partial_window_would_fire(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # The artefact the longer `for:` guards against, shown by Prometheus's own rule engine.
    monkeypatch.setattr(prometheus_live, "FULL_WINDOW_FOR", SHORT_FOR)
    result = _promtool_test(tmp_path, shortened_rules(ALERTS_FILE.read_text(encoding="utf-8")))
    assert result.returncode != 0
    assert "RagstreamFreshnessSLOBreach" in result.stdout + result.stderr
