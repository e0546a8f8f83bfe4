"""A real Prometheus for the tests: Debian's `prometheus` binary as a child process on
loopback, scraping the services' `/metrics` every second and evaluating a copy of the shipped
alert rules, generated from deploy/prometheus/alerts.yml with shorter `for:` durations and
range windows (thresholds, matchers and aggregations stay as shipped), so an alert fires and
resolves within seconds of a real fault.

Also: the dashboard's PromQL with Grafana's variables substituted, for the panel coverage test.
"""

from __future__ import annotations

import json
import re
import subprocess
import time
import urllib.parse
import urllib.request
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

from ragdev.services.tansu import free_port
from tests.deploy.support import ALERTS_FILE, DASHBOARD_FILE

#: `for:` of a rule in the generated copy (the shipped ones run from 15 seconds to an hour).
SHORT_FOR = "2s"
#: Range windows of the generated copy (shipped: 5m to 15m): ten one-second scrapes.
SHORT_WINDOW = "10s"
#: `for:` of a rule whose shipped `for:` is at least its range window (the quantile and ratio
#: rules): longer than the short window, as in production. A window that reaches back to a
#: series' first samples is a partial one: `rate()` extrapolates a cumulative bucket that was
#: still 0 at the window's first sample less far than one that was not (Prometheus stops
#: extrapolating at the counter's zero point), so a few fast changes after a slow start-up
#: snapshot read as a p95 in the snapshot's bucket for up to one window. Production's
#: `for: 10m` over `[5m]` never pages on that; `for: 2s` over `[10s]` would.
FULL_WINDOW_FOR = "12s"
#: What Grafana's `$__rate_interval` becomes at a 1 s scrape interval (4 x scrape interval,
#: at least the window the rules use).
RATE_INTERVAL = SHORT_WINDOW

_FOR = re.compile(r"^(\s+for:\s*)(\S+)\s*$", re.MULTILINE)
_WINDOW = re.compile(r"\[(\d+[smh])\]")
_RULE = re.compile(r"^\s+- (?:alert|record):", re.MULTILINE)
_UNIT_S = {"s": 1, "m": 60, "h": 3600}


def _seconds(duration: str) -> int:
    return int(duration[:-1]) * _UNIT_S[duration[-1]]


def shortened_rules(text: str) -> str:
    """The shipped rules with every range window set to SHORT_WINDOW and every `for:` to
    SHORT_FOR, or to FULL_WINDOW_FOR where the shipped `for:` is at least the rule's longest
    window; nothing else changes."""
    starts = [m.start() for m in _RULE.finditer(text)]
    pieces = [text[: starts[0]] if starts else text]
    for begin, end in zip(starts, [*starts[1:], len(text)], strict=True):
        rule = text[begin:end]
        windows = [_seconds(w) for w in _WINDOW.findall(rule)]

        def short_for(m: re.Match[str], windows: list[int] = windows) -> str:
            full = bool(windows) and _seconds(m.group(2)) >= max(windows)
            return f"{m.group(1)}{FULL_WINDOW_FOR if full else SHORT_FOR}"

        pieces.append(_WINDOW.sub(f"[{SHORT_WINDOW}]", _FOR.sub(short_for, rule)))
    return "".join(pieces)


def alert_names(path: Path = ALERTS_FILE) -> list[str]:
    """Every alert of a rules file, in file order."""
    data = yaml.safe_load(path.read_text(encoding="utf-8"))
    return [r["alert"] for g in data["groups"] for r in g["rules"] if "alert" in r]


@dataclass(frozen=True)
class Panel:
    """One dashboard panel and the PromQL of its targets, Grafana variables substituted."""

    title: str
    exprs: tuple[str, ...]


def dashboard_panels(path: Path = DASHBOARD_FILE) -> list[Panel]:
    """Every non-row panel of the dashboard (nested ones too), with the variables `$ingest_job`
    and `$retrieve_job` as `.*` (Grafana's All) and `$__rate_interval` as RATE_INTERVAL."""
    data = json.loads(path.read_text(encoding="utf-8"))
    variables = {
        v["name"]: v.get("allValue", ".*")
        for v in data["templating"]["list"]
        if v["type"] == "query"
    }

    def substitute(expr: str) -> str:
        expr = expr.replace("$__rate_interval", RATE_INTERVAL)
        for name, value in variables.items():
            expr = expr.replace("${" + name + "}", value).replace("$" + name, value)
        assert "$" not in expr, f"unsubstituted variable in {expr}"
        return expr

    def walk(panels: Sequence[Mapping[str, Any]]) -> Iterator[Panel]:
        for panel in panels:
            if panel["type"] != "row":
                exprs = tuple(substitute(t["expr"]) for t in panel.get("targets", []))
                yield Panel(panel["title"], exprs)
            yield from walk(panel.get("panels", []))

    return list(walk(data["panels"]))


class PrometheusError(AssertionError):
    """Prometheus did not start, or an API call failed."""


class LivePrometheus:
    """`prometheus` on 127.0.0.1 with a 1 s scrape and evaluation interval."""

    def __init__(self, binary: Path, work_dir: Path, targets: Mapping[str, Sequence[str]]) -> None:
        """`targets`: job name -> `host:port` of each `/metrics` endpoint."""
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self._work = work_dir
        rules = work_dir / "alerts.yml"
        rules.write_text(shortened_rules(ALERTS_FILE.read_text(encoding="utf-8")))
        config = {
            "global": {"scrape_interval": "1s", "evaluation_interval": "1s"},
            "rule_files": [str(rules)],
            "scrape_configs": [
                {
                    "job_name": job,
                    "scrape_interval": "1s",
                    "scrape_timeout": "900ms",
                    "static_configs": [{"targets": list(hosts)}],
                }
                for job, hosts in targets.items()
            ],
        }
        (work_dir / "prometheus.yml").write_text(yaml.safe_dump(config))
        self._log = (work_dir / "prometheus.log").open("wb")
        self._proc = subprocess.Popen(
            [
                str(binary),
                f"--config.file={work_dir / 'prometheus.yml'}",
                f"--storage.tsdb.path={work_dir / 'data'}",
                f"--web.listen-address=127.0.0.1:{self.port}",
                "--web.enable-lifecycle",
            ],
            stdout=self._log,
            stderr=subprocess.STDOUT,
        )
        self.started = time.time()

    def wait_ready(self, timeout: float = 60.0) -> None:
        """Until `/-/ready` answers 200 (or the process died)."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self._proc.poll() is not None:
                raise PrometheusError(f"prometheus exited:\n{self.log_tail()}")
            try:
                with urllib.request.urlopen(f"{self.url}/-/ready", timeout=2) as resp:
                    if resp.status == 200:
                        return
            except OSError:
                pass  # not listening yet
            time.sleep(0.2)
        raise PrometheusError(f"prometheus not ready after {timeout}s:\n{self.log_tail()}")

    def log_tail(self, chars: int = 3000) -> str:
        """The end of Prometheus's own log."""
        self._log.flush()
        return (self._work / "prometheus.log").read_text(errors="replace")[-chars:]

    def api(self, path: str, **params: str) -> Any:
        """GET /api/v1/<path>; the `data` of a successful answer."""
        query = urllib.parse.urlencode(params)
        with urllib.request.urlopen(f"{self.url}/api/v1/{path}?{query}", timeout=10) as resp:
            body = json.loads(resp.read())
        if body.get("status") != "success":
            raise PrometheusError(f"{path} {params}: {body}")
        return body["data"]

    def query(self, expr: str) -> list[dict[str, Any]]:
        """An instant query's result vector."""
        result: list[dict[str, Any]] = self.api("query", query=expr)["result"]
        return result

    def query_range(self, expr: str, start: float, end: float) -> list[dict[str, Any]]:
        """A range query at a 1 s step (a matrix)."""
        data = self.api("query_range", query=expr, start=str(start), end=str(end), step="1")
        result: list[dict[str, Any]] = data["result"]
        return result

    def alerts(self) -> list[dict[str, Any]]:
        """Active alerts (pending and firing)."""
        alerts: list[dict[str, Any]] = self.api("alerts")["alerts"]
        return alerts

    def firing(self) -> list[dict[str, Any]]:
        """Alerts whose `for:` has passed (what would page); a pending alert has not fired."""
        return [a for a in self.alerts() if a["state"] == "firing"]

    def rule_health(self) -> dict[str, str]:
        """alert name -> `health` of its rule (ok, err, unknown)."""
        groups = self.api("rules", type="alert")["groups"]
        return {r["name"]: r["health"] for g in groups for r in g["rules"]}

    def active(self, alert: str, labels: Mapping[str, str] | None = None) -> list[str]:
        """States of the active instances of `alert` whose labels include `labels`."""
        return [
            a["state"]
            for a in self.alerts()
            if a["labels"].get("alertname") == alert
            and (labels or {}).items() <= a["labels"].items()
        ]

    def wait_firing(
        self, alert: str, labels: Mapping[str, str] | None = None, timeout: float = 90.0
    ) -> float:
        """Seconds until `alert` fires (AssertionError with the active alerts after timeout)."""
        return self._wait(lambda: "firing" in self.active(alert, labels), timeout, alert, "fire")

    def wait_resolved(
        self, alert: str, labels: Mapping[str, str] | None = None, timeout: float = 90.0
    ) -> float:
        """Seconds until no instance of `alert` (matching `labels`) is pending or firing."""
        return self._wait(lambda: not self.active(alert, labels), timeout, alert, "resolve")

    def _wait(self, done: Any, timeout: float, alert: str, what: str) -> float:
        began = time.monotonic()
        while not done():
            if time.monotonic() - began > timeout:
                raise AssertionError(
                    f"{alert} did not {what} within {timeout}s; active: {self.alerts()}; "
                    f"its rule: {self.rule_state(alert)}; targets: {self.target_health()}"
                )
            time.sleep(0.5)
        return time.monotonic() - began

    def rule_state(self, alert: str) -> list[dict[str, Any]]:
        """The alert rule's own view (state, health, last error, last evaluation): why an
        alert did not fire when the failure message needs it."""
        groups = self.api("rules", type="alert")["groups"]
        keys = ("state", "health", "lastError", "lastEvaluation", "evaluationTime")
        return [
            {k: r.get(k) for k in keys} for g in groups for r in g["rules"] if r["name"] == alert
        ]

    def target_health(self) -> list[dict[str, Any]]:
        """Each scrape target's health, last error and last scrape duration (a target whose
        scrapes time out drops its series, which resets every `for:` that reads them)."""
        active = self.api("targets", state="active")["activeTargets"]
        keys = ("scrapeUrl", "health", "lastError", "lastScrapeDuration")
        return [{k: t.get(k) for k in keys} for t in active]

    def stop(self) -> None:
        """Terminate the process (kill after 10 s) and close its log."""
        self._proc.terminate()
        try:
            self._proc.wait(10)
        except subprocess.TimeoutExpired:
            self._proc.kill()
            self._proc.wait(10)
        self._log.close()
