"""Evaluation reports: a JSON file and a self-contained HTML page (inline SVG charts, no JS).

Input is plain data so any runner can use it: `results` maps a configuration name to its
aggregate metrics (`EvalResult.aggregates`), `rows` (optional) maps it to per-query row dicts
(`QueryRow.to_dict()`). The chart is a grouped bar chart: one group per metric, one bar per
configuration, bar height proportional to the value on a 0..`y_max` axis (`y_max` is 1 for the
default rate metrics). Latencies and counts go to the table, not the chart (another scale).
A reliability diagram (`render_reliability_svg`: observed rate of answers against the mean
evidence score per bin, with the diagonal of perfect calibration) shows how well the evidence
score is calibrated; `summary_table` is the plain-text table `ragstream eval` prints.
"""

from __future__ import annotations

import html
import json
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

#: Charted by default, in this order, when present in the results.
DEFAULT_CHART_METRICS: tuple[str, ...] = (
    "recall@5",
    "precision@5",
    "mrr@10",
    "ndcg@5",
    "ndcg@10",
    "hit@1",
    "chunk_mrr@10",
    "page_mrr@10",
    "abstention_precision",
    "abstention_recall",
)
#: Columns of `summary_table`.
SUMMARY_METRICS: tuple[str, ...] = (
    "recall@5",
    "mrr@10",
    "ndcg@5",
    "ndcg@10",
    "hit@1",
    "chunk_hit@1",
    "chunk_mrr@10",
    "page_hit@1",
    "page_mrr@10",
    "success_rate",
    "abstention_precision",
    "abstention_recall",
    "ece",
    "ece_top1",
    "near_duplicate_share@5",
    "latency_p95_ms",
)
RELIABILITY_SIZE = 260.0
#: Okabe-Ito colour-blind-safe palette (then repeats).
PALETTE: tuple[str, ...] = (
    "#0072B2",
    "#E69F00",
    "#009E73",
    "#CC79A7",
    "#56B4E9",
    "#D55E00",
    "#F0E442",
    "#000000",
)
# Chart geometry (SVG user units).
PLOT_HEIGHT = 260.0
BAR_WIDTH = 16.0
BAR_GAP = 2.0
GROUP_GAP = 24.0
MARGIN_LEFT = 48.0
MARGIN_TOP = 16.0
MARGIN_BOTTOM = 90.0
LEGEND_ROW = 18.0

Results = Mapping[str, Mapping[str, float | None]]
Rows = Mapping[str, Sequence[Mapping[str, Any]]]
#: `runner.comparison`: configuration -> metric -> {mean_diff_vs_default, ci95, p_value}
Significance = Mapping[str, Mapping[str, Mapping[str, Any]]]


@dataclass(frozen=True)
class ReportPaths:
    """Where `write_report` wrote the report."""

    json_path: Path
    html_path: Path


def chart_metrics(results: Results, wanted: Sequence[str] | None = None) -> list[str]:
    """The metrics to chart: `wanted` (all must exist), else the defaults present in `results`."""
    present = {m for values in results.values() for m in values}
    if wanted is not None:
        missing = [m for m in wanted if m not in present]
        if missing:
            raise ValueError(f"metrics not in any configuration: {missing}")
        return list(wanted)
    return [m for m in DEFAULT_CHART_METRICS if m in present]


def _value(values: Mapping[str, float | None], metric: str) -> float | None:
    value = values.get(metric)
    return float(value) if value is not None and math.isfinite(value) else None


def render_svg(
    results: Results, metrics: Sequence[str] | None = None, *, y_max: float | None = None
) -> str:
    """A grouped bar chart (one `<rect class="bar">` per (configuration, metric)).

    Every bar carries `data-config`, `data-metric` and `data-value` (empty when the metric is
    undefined for that configuration: a zero-height bar marked `missing`).
    """
    configs = list(results)
    names = chart_metrics(results, metrics)
    if not configs or not names:
        raise ValueError("nothing to chart: no configurations or no metrics")
    values = [_value(results[c], m) for c in configs for m in names]
    top = y_max if y_max is not None else max([1.0, *(v for v in values if v is not None)])
    if top <= 0:
        raise ValueError(f"y_max must be positive, got {top}")
    group_width = len(configs) * (BAR_WIDTH + BAR_GAP) - BAR_GAP
    plot_width = len(names) * (group_width + GROUP_GAP)
    legend_height = LEGEND_ROW * len(configs)
    width = MARGIN_LEFT + plot_width + 10
    height = MARGIN_TOP + PLOT_HEIGHT + MARGIN_BOTTOM + legend_height
    base = MARGIN_TOP + PLOT_HEIGHT
    out = [
        f'<svg xmlns="http://www.w3.org/2000/svg" class="chart" width="{width:.0f}" '
        f'height="{height:.0f}" viewBox="0 0 {width:.1f} {height:.1f}" role="img" '
        f'aria-label="metrics by configuration" font-family="sans-serif" font-size="11">'
    ]
    for i in range(5):  # gridlines and y labels at 0, 25, 50, 75, 100 % of the axis
        fraction = i / 4
        y = base - fraction * PLOT_HEIGHT
        out.append(
            f'<line x1="{MARGIN_LEFT}" y1="{y:.2f}" x2="{MARGIN_LEFT + plot_width:.2f}" '
            f'y2="{y:.2f}" stroke="#ddd"/>'
            f'<text x="{MARGIN_LEFT - 6}" y="{y + 4:.2f}" text-anchor="end">'
            f"{fraction * top:.2f}</text>"
        )
    for g, metric in enumerate(names):
        x0 = MARGIN_LEFT + GROUP_GAP / 2 + g * (group_width + GROUP_GAP)
        for c, config in enumerate(configs):
            value = _value(results[config], metric)
            bar = 0.0 if value is None else max(0.0, value) / top * PLOT_HEIGHT
            x = x0 + c * (BAR_WIDTH + BAR_GAP)
            shown = "n/a" if value is None else f"{value:.4f}"
            out.append(
                f'<rect class="bar{" missing" if value is None else ""}" '
                f'data-config="{_attr(config)}" data-metric="{_attr(metric)}" '
                f'data-value="{"" if value is None else repr(value)}" x="{x:.2f}" '
                f'y="{base - bar:.4f}" width="{BAR_WIDTH}" height="{bar:.4f}" '
                f'fill="{PALETTE[c % len(PALETTE)]}">'
                f"<title>{_text(config)} · {_text(metric)} = {shown}</title></rect>"
            )
        label_x = x0 + group_width / 2
        out.append(
            f'<text x="{label_x:.2f}" y="{base + 12:.2f}" text-anchor="end" '
            f'transform="rotate(-35 {label_x:.2f} {base + 12:.2f})">{_text(metric)}</text>'
        )
    out.append(
        f'<line x1="{MARGIN_LEFT}" y1="{base}" x2="{MARGIN_LEFT + plot_width:.2f}" y2="{base}" '
        f'stroke="#333"/>'
    )
    legend_top = base + MARGIN_BOTTOM
    for c, config in enumerate(configs):
        y = legend_top + c * LEGEND_ROW
        out.append(
            f'<rect class="legend" x="{MARGIN_LEFT}" y="{y:.2f}" width="12" height="12" '
            f'fill="{PALETTE[c % len(PALETTE)]}"/>'
            f'<text x="{MARGIN_LEFT + 18}" y="{y + 10:.2f}">{_text(config)}</text>'
        )
    out.append("</svg>")
    return "\n".join(out)


def render_reliability_svg(bins: Sequence[Mapping[str, Any]], *, label: str = "") -> str:
    """A reliability diagram: one point per non-empty bin at (mean score, observed rate), its
    area growing with the bin's count, over the diagonal of perfect calibration. `bins` are
    `ReliabilityBin.to_dict()` rows (low, high, count, mean_score, observed)."""
    size, pad = RELIABILITY_SIZE, 36.0
    total = sum(int(b.get("count") or 0) for b in bins) or 1
    out = [
        f'<svg xmlns="http://www.w3.org/2000/svg" class="reliability" width="{size + 2 * pad:.0f}"'
        f' height="{size + 2 * pad:.0f}" role="img" aria-label="reliability {_attr(label)}"'
        f' font-family="sans-serif" font-size="10">',
        f'<rect x="{pad}" y="{pad}" width="{size}" height="{size}" fill="none" stroke="#333"/>',
        f'<line class="diagonal" x1="{pad}" y1="{pad + size}" x2="{pad + size}" y2="{pad}" '
        f'stroke="#999" stroke-dasharray="4"/>',
        f'<text x="{pad + size / 2}" y="{pad + size + 26}" text-anchor="middle">'
        f"mean evidence score</text>",
        f'<text x="10" y="{pad + size / 2}" transform="rotate(-90 10 {pad + size / 2})" '
        f'text-anchor="middle">observed share answering</text>',
    ]
    for i in range(5):
        v = i / 4
        out.append(
            f'<text x="{pad + v * size:.1f}" y="{pad + size + 12}" text-anchor="middle">'
            f"{v:.2f}</text>"
            f'<text x="{pad - 4}" y="{pad + size - v * size + 3:.1f}" text-anchor="end">'
            f"{v:.2f}</text>"
        )
    for b in bins:
        count = int(b.get("count") or 0)
        mean, observed = b.get("mean_score"), b.get("observed")
        if not count or mean is None or observed is None:
            continue
        x = pad + float(mean) * size
        y = pad + size - float(observed) * size
        radius = 2.5 + 9.0 * math.sqrt(count / total)
        out.append(
            f'<circle class="bin" data-count="{count}" data-mean="{float(mean)!r}" '
            f'data-observed="{float(observed)!r}" cx="{x:.2f}" cy="{y:.2f}" r="{radius:.2f}" '
            f'fill="#0072B2" fill-opacity="0.6"><title>[{b.get("low")}, {b.get("high")}): '
            f"{count} items, mean {float(mean):.3f}, observed {float(observed):.3f}</title>"
            f"</circle>"
        )
    out.append("</svg>")
    return "\n".join(out)


def _compared(significance: Significance | None) -> list[str]:
    """The metrics of a `comparison` result, in first-seen order."""
    metrics: list[str] = []
    for tests in (significance or {}).values():
        metrics.extend(m for m in tests if m not in metrics)
    return metrics


def _delta(test: Mapping[str, Any]) -> str:
    low, high = test["ci95"]
    return f"{test['mean_diff_vs_default']:+.3f} [{low:+.3f}, {high:+.3f}], p={test['p_value']:.4f}"


def summary_table(
    aggregates: Mapping[str, Mapping[str, float | None]],
    significance: Significance | None = None,
    metrics: Sequence[str] = SUMMARY_METRICS,
) -> str:
    """The plain-text table of `ragstream eval`: one row per configuration, then for each
    metric of `significance` (`runner.comparison`) the paired bootstrap against the first
    configuration (this one's value minus the first's, 95% CI, p)."""
    width = max([16, *(len(name) + 2 for name in aggregates)])
    compared = _compared(significance)
    head = f"{'config':<{width}}" + "".join(f"{m:>{max(10, len(m) + 2)}}" for m in metrics)
    lines = [head + ("   Δ vs first (95% CI, p)" if compared else "")]
    for name, values in aggregates.items():
        cells = []
        for m in metrics:
            value = values.get(m)
            cells.append(f"{'n/a' if value is None else f'{value:.3f}':>{max(10, len(m) + 2)}}")
        tests = (significance or {}).get(name, {})
        extra = "".join(f"   {m} {_delta(tests[m])}" for m in compared if m in tests)
        lines.append(f"{name:<{width}}" + "".join(cells) + extra)
    return "\n".join(lines)


def _attr(value: str) -> str:
    return html.escape(value, quote=True)


def _text(value: object) -> str:
    return html.escape(str(value), quote=False)


def _cell(value: object) -> str:
    if value is None:
        return '<td class="na">–</td>'
    if isinstance(value, bool):
        return f"<td>{'yes' if value else 'no'}</td>"
    if isinstance(value, float):
        shown = f"{value:.0f}" if value.is_integer() and abs(value) >= 1 else f"{value:.4f}"
        return f'<td class="num">{shown}</td>'
    if isinstance(value, int):
        return f'<td class="num">{value}</td>'
    if isinstance(value, list | tuple):
        return f"<td>{_text(', '.join(map(str, value)))}</td>"
    return f"<td>{_text(value)}</td>"


def _flatten(row: Mapping[str, Any]) -> dict[str, Any]:
    flat = {k: v for k, v in row.items() if k != "metrics"}
    metrics = row.get("metrics")
    if isinstance(metrics, Mapping):
        flat.update(metrics)
    return flat


def _table(header: Sequence[str], body: Sequence[Sequence[object]], css: str) -> str:
    head = "".join(f"<th>{_text(h)}</th>" for h in header)
    rows = "".join("<tr>" + "".join(_cell(v) for v in row) + "</tr>" for row in body)
    return f'<table class="{css}"><thead><tr>{head}</tr></thead><tbody>{rows}</tbody></table>'


def render_html(
    results: Results,
    rows: Rows | None = None,
    *,
    title: str = "ragstream evaluation",
    metrics: Sequence[str] | None = None,
    meta: Mapping[str, Any] | None = None,
    reliability: Mapping[str, Sequence[Mapping[str, Any]]] | None = None,
    significance: Significance | None = None,
) -> str:
    """The self-contained report page: metadata, chart, reliability diagrams, aggregate table,
    the paired bootstrap against the first configuration (`significance`), per-query tables."""
    all_metrics: list[str] = []
    for values in results.values():
        all_metrics.extend(m for m in values if m not in all_metrics)
    summary = _table(
        ["configuration", *all_metrics],
        [[config, *(results[config].get(m) for m in all_metrics)] for config in results],
        "summary",
    )
    parts = [
        "<!DOCTYPE html>",
        '<html lang="en"><head><meta charset="utf-8">',
        f"<title>{_text(title)}</title>",
        "<style>body{font-family:sans-serif;margin:2em;color:#222}"
        "table{border-collapse:collapse;font-size:12px;margin:1em 0}"
        "th,td{border:1px solid #ccc;padding:3px 6px;text-align:left}"
        "td.num{text-align:right;font-variant-numeric:tabular-nums}td.na{color:#999}"
        "th{background:#f3f3f3;position:sticky;top:0}.scroll{overflow-x:auto}"
        "rect.missing{stroke:#999;stroke-dasharray:2}</style>",
        "</head><body>",
        f"<h1>{_text(title)}</h1>",
    ]
    if meta:
        items = "".join(
            f"<dt>{_text(k)}</dt><dd>{_text(json.dumps(v) if not isinstance(v, str) else v)}</dd>"
            for k, v in meta.items()
        )
        parts.append(f"<dl>{items}</dl>")
    if results and chart_metrics(results, metrics):
        parts.append(f"<h2>Metrics by configuration</h2>{render_svg(results, metrics)}")
    if reliability:
        diagrams = "".join(
            f"<figure><figcaption>{_text(config)}</figcaption>"
            f"{render_reliability_svg(bins, label=config)}</figure>"
            for config, bins in reliability.items()
        )
        parts.append(
            "<h2>Calibration of the evidence score (reliability)</h2>"
            f'<div class="scroll" style="display:flex;gap:1em">{diagrams}</div>'
        )
    parts.append(f'<h2>Aggregates</h2><div class="scroll">{summary}</div>')
    if significance:
        first = next(iter(results), "the first configuration")
        table = _table(
            ["configuration", "metric", f"Δ vs {first}", "95% CI low", "95% CI high", "p"],
            [
                [config, metric, t["mean_diff_vs_default"], *t["ci95"], t["p_value"]]
                for config, tests in significance.items()
                for metric, t in tests.items()
            ],
            "significance",
        )
        parts.append(
            f"<h2>Paired bootstrap against {_text(first)} (per-query values, this configuration"
            f" minus {_text(first)})</h2>{table}"
        )
    for config, config_rows in (rows or {}).items():
        flat = [_flatten(r) for r in config_rows]
        columns: list[str] = []
        for row in flat:
            columns.extend(k for k in row if k not in columns)
        table = _table(columns, [[row.get(c) for c in columns] for row in flat], "rows")
        parts.append(
            f"<details><summary>Per-query rows: {_text(config)} ({len(flat)})</summary>"
            f'<div class="scroll">{table}</div></details>'
        )
    parts.append("</body></html>")
    return "\n".join(parts) + "\n"


def report_data(
    results: Results,
    rows: Rows | None = None,
    *,
    title: str = "ragstream evaluation",
    meta: Mapping[str, Any] | None = None,
    significance: Significance | None = None,
) -> dict[str, Any]:
    """The JSON report: {title, meta, configs: {name: {aggregates, rows}}, significance:
    {name: {metric: {mean_diff_vs_default, ci95, p_value}}}} (`runner.comparison`)."""
    return {
        "title": title,
        "meta": dict(meta or {}),
        "configs": {
            config: {
                "aggregates": dict(values),
                "rows": [dict(r) for r in (rows or {}).get(config, [])],
            }
            for config, values in results.items()
        },
        "significance": {
            config: {metric: dict(test) for metric, test in tests.items()}
            for config, tests in (significance or {}).items()
        },
    }


def write_report(
    out_dir: Path | str,
    results: Results,
    rows: Rows | None = None,
    *,
    title: str = "ragstream evaluation",
    metrics: Sequence[str] | None = None,
    meta: Mapping[str, Any] | None = None,
    stem: str = "report",
    reliability: Mapping[str, Sequence[Mapping[str, Any]]] | None = None,
    significance: Significance | None = None,
) -> ReportPaths:
    """Write `<stem>.json` and `<stem>.html` into `out_dir` (created when missing)."""
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    json_path = out / f"{stem}.json"
    html_path = out / f"{stem}.html"
    data = report_data(results, rows, title=title, meta=meta, significance=significance)
    if reliability:
        data["reliability"] = {k: [dict(b) for b in v] for k, v in reliability.items()}
    json_path.write_text(json.dumps(data, indent=2, ensure_ascii=False) + "\n", encoding="utf-8")
    html_path.write_text(
        render_html(
            results,
            rows,
            title=title,
            metrics=metrics,
            meta=meta,
            reliability=reliability,
            significance=significance,
        ),
        encoding="utf-8",
    )
    return ReportPaths(json_path=json_path, html_path=html_path)
