"""Reports: one SVG bar per (configuration, metric), heights proportional to the values."""

from __future__ import annotations

import json
import xml.etree.ElementTree as ET
from html.parser import HTMLParser
from pathlib import Path
from typing import Any

import pytest

from ragdev.eval.report import PLOT_HEIGHT, render_html, render_svg, write_report

pytestmark = pytest.mark.unit

SVG = "{http://www.w3.org/2000/svg}"
RESULTS: dict[str, dict[str, float | None]] = {
    "bm25": {"recall@5": 0.6, "mrr@10": 0.45, "ndcg@5": 0.5, "latency_p95_ms": 12.0},
    "dense": {"recall@5": 0.8, "mrr@10": 0.7, "ndcg@5": 0.72, "latency_p95_ms": 30.0},
    "hybrid <0.5>": {"recall@5": 0.9, "mrr@10": 0.75, "ndcg@5": 0.0, "latency_p95_ms": 35.0},
}
ROWS: dict[str, list[dict[str, Any]]] = {
    "bm25": [
        {"query_id": "q1", "status": "SUCCESS", "metrics": {"recall@5": 1.0}, "top": ["a", "b"]},
        {"query_id": "q2", "status": "NO_EVIDENCE", "metrics": {}, "latency_ms": None},
    ]
}


def bars(svg: str) -> list[ET.Element]:
    return ET.fromstring(svg).findall(f"{SVG}rect[@class='bar']") + ET.fromstring(svg).findall(
        f"{SVG}rect[@class='bar missing']"
    )


def test_one_bar_per_config_and_metric_with_proportional_heights() -> None:
    svg = render_svg(RESULTS)
    found = bars(svg)
    # Default chart metrics present in RESULTS: recall@5, mrr@10, ndcg@5 (latency is not charted).
    assert len(found) == 3 * 3
    pairs = {(b.get("data-config"), b.get("data-metric")) for b in found}
    assert pairs == {(c, m) for c in RESULTS for m in ("recall@5", "mrr@10", "ndcg@5")}
    for bar in found:
        value = RESULTS[bar.get("data-config", "")][bar.get("data-metric", "")]
        assert value is not None
        # y axis is 0..1 for rates: height = value * PLOT_HEIGHT.
        assert float(bar.get("height", "nan")) == pytest.approx(value * PLOT_HEIGHT, abs=1e-3)
        assert float(bar.get("data-value", "nan")) == pytest.approx(value)
    # All bars stand on the same baseline.
    assert len({round(float(b.get("y", 0)) + float(b.get("height", 0)), 3) for b in found}) == 1


def test_values_above_one_rescale_the_axis_and_missing_values_get_empty_bars() -> None:
    results: dict[str, dict[str, float | None]] = {
        "a": {"latency_p95_ms": 40.0},
        "b": {"latency_p95_ms": 80.0},
        "c": {"latency_p95_ms": None},
    }
    found = bars(render_svg(results, ["latency_p95_ms"]))
    heights = {b.get("data-config"): float(b.get("height", "nan")) for b in found}
    assert heights["b"] == pytest.approx(PLOT_HEIGHT)  # the largest value fills the axis
    assert heights["a"] == pytest.approx(PLOT_HEIGHT / 2)
    assert heights["c"] == 0.0
    missing = [b for b in found if "missing" in (b.get("class") or "")]
    assert [b.get("data-config") for b in missing] == ["c"]


def test_unknown_chart_metric_is_an_error() -> None:
    with pytest.raises(ValueError, match="not in any configuration"):
        render_svg(RESULTS, ["recall@1000"])


class _Collector(HTMLParser):
    def __init__(self) -> None:
        super().__init__()
        self.tags: list[str] = []
        self.srcs: list[str] = []

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        self.tags.append(tag)
        self.srcs.extend(v or "" for k, v in attrs if k in ("src", "href"))


def test_html_is_self_contained_and_escaped() -> None:
    page = render_html(RESULTS, ROWS, title="Golden <run>", meta={"command": "ragstream eval"})
    parser = _Collector()
    parser.feed(page)
    assert "script" not in parser.tags and parser.srcs == []  # no JS, nothing fetched
    assert parser.tags.count("svg") == 1
    assert "Golden &lt;run&gt;" in page and "hybrid &lt;0.5&gt;" in page
    assert "Per-query rows: bm25 (2)" in page
    assert page.count("<tr>") >= 1 + len(RESULTS) + 1 + len(ROWS["bm25"])


def test_write_report_writes_json_and_html(tmp_path: Path) -> None:
    paths = write_report(tmp_path / "out", RESULTS, ROWS, title="t", meta={"seed": 1})
    data = json.loads(paths.json_path.read_text(encoding="utf-8"))
    assert data["configs"]["dense"]["aggregates"]["recall@5"] == 0.8
    assert data["configs"]["bm25"]["rows"][0]["query_id"] == "q1"
    assert data["configs"]["dense"]["rows"] == []
    assert data["meta"] == {"seed": 1}
    assert paths.html_path.read_text(encoding="utf-8").startswith("<!DOCTYPE html>")


def test_reliability_diagram_has_one_point_per_non_empty_bin_and_the_diagonal() -> None:
    from ragdev.eval.report import render_reliability_svg

    bins: list[dict[str, Any]] = [
        {"low": 0.0, "high": 0.1, "count": 8, "mean_score": 0.05, "observed": 0.0},
        {"low": 0.1, "high": 0.2, "count": 0, "mean_score": None, "observed": None},
        {"low": 0.9, "high": 1.0, "count": 2, "mean_score": 0.95, "observed": 1.0},
    ]
    svg = render_reliability_svg(bins, label="default")
    assert svg.count('class="bin"') == 2
    assert 'class="diagonal"' in svg
    assert 'data-count="8"' in svg and 'data-observed="1.0"' in svg


SIGNIFICANCE: dict[str, dict[str, dict[str, Any]]] = {
    "dense_only": {
        "ndcg@5": {"mean_diff_vs_default": -0.05, "ci95": [-0.08, -0.02], "p_value": 0.001},
        "ndcg@10": {"mean_diff_vs_default": 0.012, "ci95": [-0.004, 0.031], "p_value": 0.17},
    }
}


def test_summary_table_lists_configurations_with_the_paired_difference_per_metric() -> None:
    from ragdev.eval.report import summary_table

    table = summary_table(
        {"default": {"ndcg@5": 0.85, "ece": None}, "dense_only": {"ndcg@5": 0.80}},
        SIGNIFICANCE,
        metrics=("ndcg@5", "ece"),
    )
    lines = table.splitlines()
    assert lines[0].startswith("config") and "ndcg@5" in lines[0]
    assert "0.850" in lines[1] and "n/a" in lines[1]
    assert "ndcg@5 -0.050 [-0.080, -0.020], p=0.0010" in lines[2]
    assert "ndcg@10 +0.012 [-0.004, +0.031], p=0.1700" in lines[2]


def test_report_carries_the_paired_bootstrap_of_each_metric(tmp_path: Path) -> None:
    paths = write_report(
        tmp_path,
        {"default": {"ndcg@10": 0.46}, "dense_only": {"ndcg@10": 0.47}},
        significance=SIGNIFICANCE,
    )
    data = json.loads(paths.json_path.read_text())
    assert data["significance"]["dense_only"]["ndcg@10"]["ci95"] == [-0.004, 0.031]
    assert data["significance"]["dense_only"]["ndcg@5"]["p_value"] == 0.001
    page = paths.html_path.read_text()
    assert 'class="significance"' in page
    assert "<td>dense_only</td><td>ndcg@10</td>" in page and "0.0310" in page


def test_html_report_embeds_the_reliability_diagrams(tmp_path: Path) -> None:
    bins = [{"low": 0.0, "high": 1.0, "count": 3, "mean_score": 0.4, "observed": 0.33}]
    paths = write_report(tmp_path, {"default": {"recall@5": 0.9}}, reliability={"default": bins})
    page = paths.html_path.read_text()
    assert "Calibration of the evidence score" in page and 'class="reliability"' in page
    assert json.loads(paths.json_path.read_text())["reliability"]["default"][0]["count"] == 3
