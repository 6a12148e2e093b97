"""The dashboard's SVG charts (tunecache.service.dashboard.charts): what they draw, where,
and that text from the data is escaped."""

from __future__ import annotations

import math
import re
import xml.etree.ElementTree as ET

from tunecache.service.dashboard.charts import MAX_BARS, Bar, LineSeries, bar_chart, line_chart, nice_ceiling

SVG = "{http://www.w3.org/2000/svg}"


def _parse(markup) -> ET.Element:
    return ET.fromstring(str(markup))  # well-formed XML: every attribute and text escaped


def test_a_line_chart_places_each_point_on_its_axes():
    chart = _parse(line_chart("c", "hit rate", [LineSeries("fleet", [(0, 100.0), (12, 50.0), (24, 0.0)]),
                                                LineSeries("key", [(6, 75.0), (18, float("nan"))])],
                              y_max=100.0, x_range=(0.0, 24.0)))
    assert chart.get("data-chart") == "line" and chart.get("data-points") == "4"  # the NaN is left out
    left, right, top, bottom = 64, 760 - 200, 14, 240 - 34
    points = {(g.get("data-series"), c.get("data-x"), c.get("data-y")): (float(c.get("cx")), float(c.get("cy")))
              for g in chart.iter(f"{SVG}g") for c in g.iter(f"{SVG}circle")}
    assert points == {
        ("fleet", "0", "100"): (left, top), ("fleet", "12", "50"): ((left + right) / 2, (top + bottom) / 2),
        ("fleet", "24", "0"): (right, bottom), ("key", "6", "75"): (round(left + (right - left) / 4, 1),
                                                                     round(top + (bottom - top) / 4, 1)),
    }
    assert [g.get("data-count") for g in chart.iter(f"{SVG}g")] == ["3", "1"]
    assert len(list(chart.iter(f"{SVG}polyline"))) == 1  # a line through the fleet's 3 points, none for one point


def test_a_line_chart_without_a_point_is_none():
    assert line_chart("c", "x", [LineSeries("a", [(1, math.inf)]), LineSeries("b", [])]) is None


def test_a_bar_chart_draws_bars_in_order_with_their_values():
    chart = _parse(bar_chart("b", "saved", [Bar("gemm", 38.0), Bar("attention", 7.5), Bar("bad", -1), Bar("nan", math.nan)]))
    bars = [(g.get("data-label"), g.get("data-value"), float(g.find(f"{SVG}rect").get("width"))) for g in chart.iter(f"{SVG}g")]
    assert [(label, value) for label, value, _ in bars] == [("gemm", "38"), ("attention", "7.5")]
    assert bars[0][2] / bars[1][2] == 38.0 / 7.5  # lengths in proportion (axis top: 50)
    assert chart.get("data-points") == "2"
    many = _parse(bar_chart("m", "many", [Bar(f"v{i}", i) for i in range(MAX_BARS + 5)]))
    assert many.get("data-points") == str(MAX_BARS)
    assert bar_chart("e", "empty", []) is None


def test_text_from_the_data_is_escaped_and_long_labels_keep_their_ends():
    evil = '<script>alert("x")</script>&"'
    line = str(line_chart("c", evil, [LineSeries(evil, [(0, 1.0)], labels=[evil])]))
    bars = str(bar_chart("b", evil, [Bar(evil, 1.0, title=evil)]))
    for markup in (line, bars):
        assert "<script>" not in markup and "&lt;script&gt;" in markup
        root = _parse(markup)
        assert all(e.tag.startswith(SVG) for e in root.iter())  # no element but the chart's own
    assert _parse(bars).find(f"{SVG}g").get("data-label") == evil  # the data itself, unchanged, as an attribute
    key_a = "deepseek-ai/DeepSeek-R1-Distill-Llama-70B (8192, 1/1/1)"
    key_b = "deepseek-ai/DeepSeek-R1-Distill-Llama-70B (16384, 1/1/1)"
    legend = [re.findall(r'class="legend">([^<]*)<', str(line_chart("c", "x", [LineSeries(k, [(0, 1.0)])])))[0]
              for k in (key_a, key_b)]
    assert legend[0] != legend[1] and "…" in legend[0] and legend[1].endswith("1/1/1)")


def test_nice_ceiling():
    assert [nice_ceiling(v) for v in (0, 0.7, 1, 3, 42, 50, 51, 180)] == [1, 1, 1, 5, 50, 50, 100, 200]
