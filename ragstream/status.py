"""`ragstream status`: the first command an SRE runs. One screen of the service-level figures,
read from the services' `/metrics` or from a Prometheus, each judged against its SLO; the exit
code is 1 when one is breached.

From `/metrics` the figures are taken over a window: two scrapes `window_s` apart, rates and
quantiles from the differences (with no traffic in the window, counters and histograms fall back
to their totals since the process started, and say so). From Prometheus they are the PromQL of
the dashboard and alerts: quantiles over 5 minutes, the DLQ over the last hour.

A metric that a service does not export (an older version, or one of the metrics issue 25 adds
in parallel: consumer lag, backlog age, the request counter's `code` label) reads
"n/a (metric not exported)" and breaches nothing.
"""

from __future__ import annotations

import json
import math
import statistics
import time
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import asdict, dataclass, field
from typing import Any

from ragcore.errors import RagstreamError
from ragcore.grpc_codes import SERVER_ERROR_CODES

__all__ = [
    "NOT_EXPORTED",
    "Row",
    "Slos",
    "StatusError",
    "from_metrics",
    "from_prometheus",
    "render",
]

NOT_EXPORTED = "n/a (metric not exported)"
RETRIEVE_METHOD = "Retrieve"
#: Labels that name a tenant (or a bounded class of tenants).
TENANT_LABELS = ("tenant", "tenant_class")

FRESHNESS = "ragstream_ingest_freshness_seconds"
#: the freshness SLO's lane (a snapshot or a reindex is judged by its own alert)
LIVE = 'lane="live"'
#: the oldest live change waiting (by tenant class and lane)
BACKLOG_AGE = "ragstream_ingest_backlog_oldest_age_seconds"
LAG = "ragstream_ingest_consumer_lag_records"
DLQ = "ragstream_ingest_dlq_records_total"
DRIFT = "ragstream_reconcile_drift_entities"
HANDLING = "grpc_server_handling_seconds"
HANDLED = "grpc_server_handled_total"
REQUESTS = "ragstream_retrieve_requests_total"
DUE = "ragstream_tenants_due_for_promotion"
CALIBRATION = "ragstream_tenants_calibration"
#: The calibration states a refit is due for (`ragcore.calibration_state`).
REFIT_STATES = ("stale", "unreadable")
ADMISSION = "ragstream_retrieve_admission_total"
ASSIGNED = "ragstream_ingest_assigned_partitions"
HEARTBEAT = "ragstream_ingest_loop_heartbeat_timestamp_seconds"
#: How old a worker's loop heartbeat may be before its loop counts as lost (the threads beat
#: every poll or batch: seconds, or one batch's length: a batch of two documents at their
#: limits takes minutes), as the RagstreamIngestStalled alert judges it.
HEARTBEAT_LIMIT_S = 300.0


STALE_ROW = "tenants with a stale calibration"
REFIT_NOTE = "`ragstream calibrate --stale` refits them"


class StatusError(RagstreamError):
    """A metrics endpoint or Prometheus could not be read."""

    code = "STATUS_UNREADABLE"


@dataclass(frozen=True)
class Slos:
    """The objectives `status` judges by (the alert rules' thresholds by default)."""

    freshness_p95_s: float = 2.0
    backlog_age_s: float = 2.0
    lag_records: float = 10_000
    dlq_per_hour: float = 10
    drift_entities: float = 100
    retrieve_p95_s: float = 0.5
    error_rate: float = 0.05


@dataclass(frozen=True)
class Row:
    """One figure: its value (None: unknown), how it reads, and its SLO."""

    name: str
    value: float | None
    shown: str
    slo: str = ""
    breached: bool = False
    note: str = ""


@dataclass
class Report:
    """The rows and the tenants that stand out."""

    source: str
    rows: list[Row]
    tenants: list[str] = field(default_factory=list)

    @property
    def breached(self) -> list[Row]:
        """The rows over their SLO."""
        return [r for r in self.rows if r.breached]

    def to_dict(self) -> dict[str, object]:
        """JSON-ready."""
        return {
            "source": self.source,
            "rows": [asdict(r) for r in self.rows],
            "tenants": self.tenants,
            "breached": [r.name for r in self.breached],
        }


# --- formatting ------------------------------------------------------------------------------


def _seconds(value: float) -> str:
    if value < 1:
        return f"{value * 1000:.0f} ms"
    return f"{value:.2f} s" if value < 120 else f"{value / 60:.1f} min"


def _count(value: float) -> str:
    return f"{value:.0f}" if abs(value - round(value)) < 1e-9 else f"{value:.2f}"


def _percent(value: float) -> str:
    return f"{value * 100:.2f}%"


def _row(
    name: str,
    value: float | None,
    fmt: Callable[[float], str],
    limit: float | None,
    *,
    missing: str = "no data",
    note: str = "",
    minimum: float | None = None,
) -> Row:
    """A figure judged by its SLO: at most `limit`, or (`minimum`) at least that."""
    slo = f"<= {fmt(limit)}" if limit is not None else ""
    slo = f">= {fmt(minimum)}" if minimum is not None else slo
    if value is None or math.isnan(value):
        return Row(name, None, missing, slo, False, note)
    breached = (limit is not None and value > limit) or (minimum is not None and value < minimum)
    return Row(name, value, fmt(value), slo, breached, note)


def _ingest_rows(assigned: float | None, heartbeat_age: float | None, exported: bool) -> list[Row]:
    """Whether any worker consumes and whether its loops go round: 0 partitions assigned (no
    member holds any: nobody consumes) and a heartbeat older than `HEARTBEAT_LIMIT_S` (a worker
    whose processing loop died or hangs) are breaches, not a quiet stack."""
    if not exported:
        return [
            _row("ingest partitions assigned", None, _count, None, missing=NOT_EXPORTED),
            _row("ingest loop heartbeat age", None, _seconds, None, missing=NOT_EXPORTED),
        ]
    return [
        _row(
            "ingest partitions assigned",
            assigned,
            _count,
            None,
            minimum=1,
            note="0: no worker consumes",
        ),
        _row(
            "ingest loop heartbeat age",
            heartbeat_age,
            _seconds,
            HEARTBEAT_LIMIT_S,
            note="the oldest thread of any worker",
        ),
    ]


# --- /metrics --------------------------------------------------------------------------------


#: (metric name, labels) -> value; names as exposed (`_bucket`, `_total`, ...).
class Samples(dict[tuple[str, frozenset[tuple[str, str]]], float]):
    """Samples by (name, labels), and `declared`: the sample names of every family exposed,
    with samples or not (a labelled counter has none until its first increment)."""

    def __init__(self) -> None:
        super().__init__()
        self.declared: set[str] = set()


_SUFFIXES = {"counter": ("_total",), "histogram": ("_bucket", "_sum", "_count")}


def parse(text: str) -> Samples:
    """The samples of one Prometheus text exposition."""
    # here, not at the top: the command line builds `status`'s options from this module
    from prometheus_client.parser import text_string_to_metric_families  # noqa: PLC0415

    samples = Samples()
    for family in text_string_to_metric_families(text):
        samples.declared.add(family.name)
        samples.declared.update(family.name + x for x in _SUFFIXES.get(family.type, ()))
        for sample in family.samples:
            key = (sample.name, frozenset(sample.labels.items()))
            samples[key] = samples.get(key, 0.0) + sample.value
    return samples


def scrape(urls: Sequence[str], timeout_s: float = 10.0) -> Samples:
    """Every endpoint's samples merged (the same series on two services add up)."""
    merged = Samples()
    for url in urls:
        try:
            with urllib.request.urlopen(url, timeout=timeout_s) as response:
                text = response.read().decode("utf-8")
        except (urllib.error.URLError, OSError) as exc:
            raise StatusError(f"cannot read {url}: {exc}") from exc
        parsed = parse(text)
        merged.declared |= parsed.declared
        for key, value in parsed.items():
            merged[key] = merged.get(key, 0.0) + value
    return merged


class _View:
    """Reads a metric from the second scrape, or its increase since the first."""

    def __init__(self, before: Samples | None, after: Samples) -> None:
        self._before = before
        self._after = after
        self.names = after.declared | {name for name, _ in after}

    def series(
        self, name: str, match: Callable[[dict[str, str]], bool] = lambda _: True
    ) -> list[tuple[dict[str, str], float, float | None]]:
        """(labels, current value, increase over the window or None) of matching series."""
        rows = []
        for (sample, labels), value in self._after.items():
            if sample != name:
                continue
            as_dict = dict(labels)
            if not match(as_dict):
                continue
            before = None
            if self._before is not None:
                before = value - self._before.get((sample, labels), 0.0)
            rows.append((as_dict, value, before))
        return rows

    def sample(self, name: str, labels: frozenset[tuple[str, str]]) -> tuple[float, float | None]:
        """One series: (current value, increase over the window or None)."""
        value = self._after[(name, labels)]
        if self._before is None:
            return value, None
        return value, value - self._before.get((name, labels), 0.0)

    def counter(
        self, name: str, match: Callable[[dict[str, str]], bool] = lambda _: True
    ) -> tuple[float, float | None]:
        """(total, increase over the window or None)."""
        rows = self.series(name, match)
        total = sum(v for _, v, _ in rows)
        deltas = [d for _, _, d in rows if d is not None]
        return total, (sum(deltas) if self._before is not None else None)

    def quantile(
        self, name: str, q: float, match: Callable[[dict[str, str]], bool] = lambda _: True
    ) -> tuple[float | None, str]:
        """The q-quantile of a histogram over the window (since start when the window saw
        none), interpolated in its bucket as histogram_quantile does; and which it is."""
        buckets: dict[float, tuple[float, float]] = {}
        for labels, value, delta in self.series(f"{name}_bucket", match):
            le = float(labels["le"])
            total, recent = buckets.get(le, (0.0, 0.0))
            buckets[le] = (total + value, recent + (delta or 0.0))
        if not buckets:
            return None, ""
        edges = sorted(buckets)
        window = [buckets[e][1] for e in edges]
        if self._before is not None and window[-1] > 0:
            return _bucket_quantile(q, edges, window), "window"
        totals = [buckets[e][0] for e in edges]
        if totals[-1] <= 0:
            return None, ""
        return _bucket_quantile(q, edges, totals), "since start"


def _bucket_quantile(q: float, edges: Sequence[float], counts: Sequence[float]) -> float:
    """histogram_quantile over cumulative bucket counts (the last edge is +Inf)."""
    rank = q * counts[-1]
    lower, below = 0.0, 0.0
    for edge, count in zip(edges, counts, strict=True):
        if count >= rank:
            if math.isinf(edge):
                return lower  # Prometheus returns the highest finite bound
            if count == below:
                return edge
            return lower + (edge - lower) * (rank - below) / (count - below)
        lower, below = edge, count
    return lower


def _retrieve(labels: Mapping[str, str]) -> bool:
    return labels.get("grpc_method") == RETRIEVE_METHOD


def _server_error(labels: Mapping[str, str]) -> bool:
    return _retrieve(labels) and labels.get("grpc_code") in SERVER_ERROR_CODES


def from_metrics(
    urls: Sequence[str],
    slos: Slos,
    *,
    window_s: float = 10.0,
    sleep: Callable[[float], None] = time.sleep,
) -> Report:
    """The report from the services' `/metrics`, over `window_s` seconds (0: one scrape)."""
    before = None
    if window_s > 0:
        before = scrape(urls)
        sleep(window_s)
    view = _View(before, scrape(urls))
    span = f"last {window_s:g} s" if window_s > 0 else "since start"
    rows: list[Row] = []

    def exported(*names: str) -> bool:
        return any(n in view.names for n in names)

    # the live lane: a snapshot or a reindex is not judged by the freshness SLO (its own alert)
    p95, basis = view.quantile(FRESHNESS, 0.95, lambda labels: labels.get("lane") == "live")
    rows.append(
        _row("freshness p95", p95, _seconds, slos.freshness_p95_s, note=f"live, {basis}")
        if exported(f"{FRESHNESS}_bucket")
        else _row("freshness p95", None, _seconds, None, missing=NOT_EXPORTED)
    )
    ages = [v for _, v, _ in view.series(BACKLOG_AGE, lambda labels: labels.get("lane") == "live")]
    rows.append(
        _row("backlog age", max(ages, default=0.0), _seconds, slos.backlog_age_s, note="live")
        if exported(BACKLOG_AGE)
        else _row("backlog age", None, _seconds, None, missing=NOT_EXPORTED)
    )
    beats = [v for _, v, _ in view.series(HEARTBEAT)]
    rows += _ingest_rows(
        sum(v for _, v, _ in view.series(ASSIGNED)),
        max((time.time() - b for b in beats), default=None),
        exported(ASSIGNED),
    )
    lags = view.series(LAG)
    rows.append(
        _row(
            "consumer lag",
            sum(v for _, v, _ in lags),
            _count,
            slos.lag_records,
            note=f"{len(lags)} partitions",
        )
        if exported(LAG)
        else _row("consumer lag", None, _count, None, missing=NOT_EXPORTED)
    )
    total, window = view.counter(DLQ)
    if not exported(DLQ):
        rows.append(_row("DLQ records", None, _count, None, missing=NOT_EXPORTED))
    elif window is None:
        rows.append(_row("DLQ records", total, _count, None, note="since start; no SLO judged"))
    else:
        per_hour = window * 3600 / window_s
        rows.append(
            _row(
                "DLQ records per hour",
                per_hour,
                _count,
                slos.dlq_per_hour,
                note=f"{_count(window)} in the {span}, {_count(total)} since start",
            )
        )
    drift = view.series(DRIFT)
    worst = max(drift, key=lambda s: s[1], default=None)
    rows.append(
        _row(
            "reconcile drift",
            worst[1] if worst else 0.0,
            _count,
            slos.drift_entities,
            note=f"worst kind: {worst[0].get('kind', '')}" if worst and worst[1] > 0 else "",
        )
        if exported(DRIFT)
        else _row("reconcile drift", None, _count, None, missing=NOT_EXPORTED)
    )
    p95, basis = view.quantile(HANDLING, 0.95, _retrieve)
    rows.append(
        _row("Retrieve p95", p95, _seconds, slos.retrieve_p95_s, note=basis)
        if exported(f"{HANDLING}_bucket")
        else _row("Retrieve p95", None, _seconds, None, missing=NOT_EXPORTED)
    )
    rows.append(_error_rate(view, slos, span))
    rows.append(_client_errors(view))
    due, _ = view.counter(DUE)
    rows.append(
        _row("tenants due for promotion", due, _count, None)
        if exported(DUE)
        else _row("tenants due for promotion", None, _count, None, missing=NOT_EXPORTED)
    )
    stale, _ = view.counter(CALIBRATION, lambda labels: labels.get("state") in REFIT_STATES)
    rows.append(
        _row(STALE_ROW, stale, _count, None, note=REFIT_NOTE)
        if exported(CALIBRATION)
        else _row(STALE_ROW, None, _count, None, missing=NOT_EXPORTED)
    )
    return Report(", ".join(urls), rows, standing_out(view))


def _error_rate(view: _View, slos: Slos, span: str) -> Row:
    if f"{HANDLED}" not in view.names:
        return _row("Retrieve server error rate", None, _percent, None, missing=NOT_EXPORTED)
    calls, calls_window = view.counter(HANDLED, _retrieve)
    errors, errors_window = view.counter(HANDLED, _server_error)
    if calls_window:
        return _row(
            "Retrieve server error rate",
            (errors_window or 0.0) / calls_window,
            _percent,
            slos.error_rate,
            note=f"{_count(errors_window or 0.0)} of {_count(calls_window)} calls, {span}",
        )
    if calls:
        return _row(
            "Retrieve server error rate",
            errors / calls,
            _percent,
            slos.error_rate,
            note=f"{_count(errors)} of {_count(calls)} calls since start"
            + (" (none in the window)" if calls_window is not None else ""),
        )
    return _row("Retrieve server error rate", None, _percent, slos.error_rate, missing="no calls")


def _client_errors(view: _View) -> Row:
    """Requests that failed by the caller's fault, from the request counter's `code` label."""
    rows = view.series(REQUESTS)
    if not rows or not any("code" in labels for labels, _, _ in rows):
        return _row("Retrieve client errors", None, _count, None, missing=NOT_EXPORTED)
    failed = [
        (labels, value, delta)
        for labels, value, delta in rows
        if labels.get("code") not in (None, "OK") and labels["code"] not in SERVER_ERROR_CODES
    ]
    total = sum(v for _, v, _ in failed)
    window = sum(d or 0.0 for _, _, d in failed)
    note = "since start" if view._before is None else f"{_count(window)} in the window"
    return _row("Retrieve client errors", total, _count, None, note=note)


def standing_out(view: _View, factor: float = 3.0) -> list[str]:
    """Tenants (or tenant classes) that stand out in any series labelled by tenant: refused
    by admission, or more than `factor` times the median of the others in a counter's window
    increase (or a gauge's value)."""
    found: list[str] = []
    families: dict[str, dict[str, float]] = {}
    for name, labels in {(n, ls) for n, ls in view._after}:
        as_dict = dict(labels)
        key = next((k for k in TENANT_LABELS if k in as_dict), None)
        if key is None or name.endswith(("_bucket", "_created", "_sum", "_count")):
            continue
        value, delta = view.sample(name, labels)
        amount = delta if delta is not None and name.endswith("_total") else value
        outcome = as_dict.get("outcome", "")
        if "admission" in name and outcome not in ("", "admitted") and (amount or 0) > 0:
            found.append(f"{as_dict[key]}: {_count(amount or 0)} refused ({outcome})")
            continue
        label = f"{name}{_other_labels(as_dict, key)}"
        per = families.setdefault(label, {})
        per[as_dict[key]] = per.get(as_dict[key], 0.0) + (amount or 0.0)
    for label, per in sorted(families.items()):
        if len(per) < 2:
            continue
        for tenant, amount in sorted(per.items()):
            others = [v for t, v in per.items() if t != tenant]
            median = statistics.median(others)
            if amount > 0 and amount > factor * max(median, 1e-9):
                found.append(f"{tenant}: {_count(amount)} in {label} (others' median {median:g})")
    return found


def _other_labels(labels: Mapping[str, str], tenant_key: str) -> str:
    rest = {k: v for k, v in sorted(labels.items()) if k != tenant_key}
    return "{" + ",".join(f'{k}="{v}"' for k, v in rest.items()) + "}" if rest else ""


# --- Prometheus ------------------------------------------------------------------------------


def _api(base: str, path: str, params: Mapping[str, str], timeout_s: float = 10.0) -> Any:
    """The `data` of one Prometheus HTTP API answer."""
    url = f"{base.rstrip('/')}/api/v1/{path}?{urllib.parse.urlencode(params)}"
    try:
        with urllib.request.urlopen(url, timeout=timeout_s) as response:
            doc = json.loads(response.read().decode("utf-8"))
    except (urllib.error.URLError, OSError, ValueError) as exc:
        raise StatusError(f"cannot query {base}: {exc}") from exc
    if doc.get("status") != "success":
        raise StatusError(f"Prometheus refused {path} {dict(params)}: {doc.get('error')}")
    return doc["data"]


def _declared(base: str) -> set[str]:
    """The metric names the scraped targets declare (HELP/TYPE metadata), with or without
    series: a labelled counter has none until its first increment."""
    names: set[str] = set()
    metadata: dict[str, list[dict[str, str]]] = _api(base, "metadata", {})
    for name, kinds in metadata.items():
        names.add(name)
        for kind in kinds:
            names.update(name + x for x in _SUFFIXES.get(kind.get("type", ""), ()))
    return names


def _query(base: str, promql: str) -> list[dict[str, object]]:
    result: list[dict[str, object]] = _api(base, "query", {"query": promql})["result"]
    return result


def _scalar(result: Iterable[dict[str, object]]) -> float | None:
    values = [float(r["value"][1]) for r in result]  # type: ignore[index]
    values = [v for v in values if not math.isnan(v)]
    return max(values) if values else None


def from_prometheus(base: str, slos: Slos, selector: str = "") -> Report:
    """The report from a Prometheus at `base` (`selector`, e.g. `namespace="prod"`, narrows
    every query)."""
    sel = selector.strip("{}")
    matchers = ",".join(x for x in ('__name__=~"(ragstream|grpc_server)_.*"', sel) if x)
    names = {
        str(r["metric"]["__name__"])  # type: ignore[index]
        for r in _query(base, f"count by (__name__) ({{{matchers}}})")
    } | _declared(base)

    def m(name: str, extra: str = "") -> str:
        inner = ",".join(x for x in (sel, extra) if x)
        return f"{name}{{{inner}}}" if inner else name

    def q(promql: str) -> float | None:
        return _scalar(_query(base, promql))

    retrieve = 'grpc_method="Retrieve"'
    refit = "|".join(REFIT_STATES)
    stale_calibrations = m(CALIBRATION, f'state=~"{refit}"')
    codes = "|".join(SERVER_ERROR_CODES)

    def p95(histogram: str, extra: str = "") -> str:
        buckets = m(f"{histogram}_bucket", extra)
        return f"histogram_quantile(0.95, sum by (le) (rate({buckets}[5m])))"

    # (row, metric it needs, value, format, SLO, note)
    table: list[
        tuple[str, str, Callable[[], float | None], Callable[[float], str], float | None, str]
    ] = [
        (
            "freshness p95",
            f"{FRESHNESS}_bucket",
            lambda: q(p95(FRESHNESS, LIVE)),
            _seconds,
            slos.freshness_p95_s,
            "live, 5 min",
        ),
        (
            "backlog age",
            BACKLOG_AGE,
            lambda: q("max(" + m(BACKLOG_AGE, LIVE) + ")"),
            _seconds,
            slos.backlog_age_s,
            "live",
        ),
        ("consumer lag", LAG, lambda: q(f"sum({m(LAG)})"), _count, slos.lag_records, ""),
        (
            "DLQ records per hour",
            DLQ,
            lambda: q(f"sum(increase({m(DLQ)}[1h]))") or 0.0,
            _count,
            slos.dlq_per_hour,
            "last hour",
        ),
        ("reconcile drift", DRIFT, lambda: q(f"max({m(DRIFT)})"), _count, slos.drift_entities, ""),
        (
            "Retrieve p95",
            f"{HANDLING}_bucket",
            lambda: q(p95(HANDLING, retrieve)),
            _seconds,
            slos.retrieve_p95_s,
            "5 min",
        ),
        (
            "Retrieve server error rate",
            HANDLED,
            lambda: _ratio(q, m, retrieve, codes),
            _percent,
            slos.error_rate,
            "5 min",
        ),
        ("tenants due for promotion", DUE, lambda: q(f"max({m(DUE)})"), _count, None, ""),
        (
            STALE_ROW,
            CALIBRATION,
            lambda: q(f"sum(max by (state) ({stale_calibrations})) or vector(0)"),
            _count,
            None,
            REFIT_NOTE,
        ),
    ]
    rows = [
        _row(name, value(), fmt, limit, note=note)
        if needs in names
        else _row(name, None, fmt, None, missing=NOT_EXPORTED)
        for name, needs, value, fmt, limit, note in table
    ]
    rows[2:2] = _ingest_rows(
        q(f"sum({m(ASSIGNED)})"),
        q(f"max(time() - {m(HEARTBEAT)})") if HEARTBEAT in names else None,
        ASSIGNED in names,
    )
    tenants = []
    if ADMISSION in names:
        refusals = m(ADMISSION, 'outcome!="admitted"')
        refused = _query(base, f"sum by (tenant_class, outcome) (increase({refusals}[1h])) > 0")
        for r in refused:
            labels: dict[str, str] = r["metric"]  # type: ignore[assignment]
            value = float(r["value"][1])  # type: ignore[index]
            tenants.append(
                f"{labels.get('tenant_class', '?')}: {_count(value)} refused "
                f"({labels.get('outcome', '?')}) in the last hour"
            )
    return Report(base, rows, tenants)


def _ratio(
    q: Callable[[str], float | None], m: Callable[[str, str], str], retrieve: str, codes: str
) -> float | None:
    failing = f'{retrieve},grpc_code=~"{codes}"'
    errors = q(f"sum(rate({m(HANDLED, failing)}[5m]))") or 0.0
    calls = q(f"sum(rate({m(HANDLED, retrieve)}[5m]))")
    if not calls:
        return None
    return errors / calls


# --- output ----------------------------------------------------------------------------------


def render(report: Report) -> str:
    """The report as a fixed-width table, then the tenants that stand out and the verdict."""
    width = max(len(r.name) for r in report.rows)
    shown = max(len(r.shown) for r in report.rows)
    lines = [f"ragstream status ({report.source})", ""]
    for r in report.rows:
        mark = "BREACH" if r.breached else ("ok" if r.slo and r.value is not None else "")
        slo = f"SLO {r.slo}" if r.slo else ""
        note = f"  ({r.note})" if r.note else ""
        lines.append(f"  {r.name:<{width}}  {r.shown:>{shown}}  {mark:<6} {slo}{note}".rstrip())
    lines.append("")
    if report.tenants:
        lines.append("tenants that stand out:")
        lines.extend(f"  {t}" for t in report.tenants)
    else:
        lines.append("tenants that stand out: none")
    breached = report.breached
    lines.append("")
    lines.append(
        f"SLO breached: {', '.join(r.name for r in breached)}" if breached else "all SLOs met"
    )
    return "\n".join(lines)
