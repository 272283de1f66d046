"""The figure of a result table: grouped bars with interval error bars, written atomically."""

from __future__ import annotations

import math

from juice.eval.stats import Interval
from juice.plots import interval_bar_chart

PNG = b"\x89PNG\r\n\x1a\n"
EMPTY = Interval(math.nan, math.nan, math.nan, 0)


def test_three_methods_by_three_groups_with_a_nan_and_a_missing_cell(tmp_path):
    iv = Interval(0.5, 0.4, 0.6, 20)
    cells = {"Original": {"clean": iv, "substitution": iv, "coherent": iv},
             "JuNE": {"clean": Interval(0.7, 0.65, 0.8, 40), "substitution": EMPTY},   # no "coherent"
             "JuICE": {"clean": iv, "substitution": iv, "coherent": Interval(1.0, 1.0, 1.0, 20)}}
    path = interval_bar_chart(cells, tmp_path / "figs" / "t.png", title="test")
    assert path == tmp_path / "figs" / "t.png"
    data = path.read_bytes()
    assert data[:8] == PNG and len(data) > 1000
    assert [p.name for p in path.parent.iterdir()] == ["t.png"]   # no temporary file left


def test_negative_differences_an_all_nan_method_and_overwriting(tmp_path):
    path = tmp_path / "d.png"
    path.write_bytes(b"old")
    cells = {"JuICE - Original": {"clean": Interval(-0.1, -0.2, 0.05, 30), "coherent": Interval(0.2, 0.1, 0.3, 30)},
             "JuNE - Original": {"clean": EMPTY}}
    out = interval_bar_chart(cells, str(path), title="differences", ylabel="difference (points)",
                             interval_label="95% paired bootstrap intervals")
    assert out == path and path.read_bytes()[:8] == PNG
    assert [p.name for p in tmp_path.iterdir()] == ["d.png"]
