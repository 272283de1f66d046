"""Printed tables: bold only for a separated best value, n per column, differences marked only
when their interval excludes 0."""

from __future__ import annotations

import math

from juice.eval.report import difference_markdown, interval_markdown, separated_best, table1_columns
from juice.eval.stats import Interval
from juice.eval.tables import IntervalTable


def test_bold_only_when_the_best_interval_lies_above_the_runner_up():
    a, b, c = Interval(0.8, 0.7, 0.9, 30), Interval(0.5, 0.4, 0.6, 30), Interval(0.65, 0.55, 0.75, 30)
    assert separated_best([a, b]) == 0
    assert separated_best([b, a, None]) == 1
    assert separated_best([a, c]) is None                           # overlapping intervals
    assert separated_best([a, Interval(math.nan, math.nan, math.nan, 0)]) is None
    touching = Interval(0.6 + 1e-17, 0.5 + 1e-17, 0.7, 10)          # float noise of a mean of means
    assert separated_best([touching, Interval(0.4, 0.3, 0.5, 10)]) is None


def test_markdown_table_and_differences():
    iv, low = Interval(0.9, 0.8, 1.0, 20), Interval(0.3, 0.2, 0.4, 20)
    cells = {"Original": {"d": {"clean": low}}, "JuICE": {"d": {"clean": iv}}}
    diffs = {"JuICE - Original": {"d": {"clean": Interval(0.6, 0.45, 0.75, 20)}},
             "JuNE - Original": {"d": {"clean": Interval(-0.0001, 1e-18, 0.1, 20)}}}
    table = IntervalTable(cells, diffs, 1000, 0.95, 0)
    md = interval_markdown(table, ["Original", "JuICE"], [("d", "clean")], ["D 1"])
    assert "| JuICE | **90.0 ±10.0** |" in md and "| Original | 30.0 ±10.0 |" in md and "| n | 20 |" in md
    diff = difference_markdown(table, [("d", "clean")], ["D 1"])
    assert "| JuICE - Original | +60.0 [+45.0, +75.0]* |" in diff
    assert "| JuNE - Original | +0.0 [+0.0, +10.0] |" in diff          # no star at a 0 bound, no "-0.0"


def test_table1_columns_end_with_the_average():
    cols, headers = table1_columns(["world_capital"], {"world_capital": "World Capital"})
    assert cols[-1] == ("Average", "coherent") and headers[:2] == ["World Capital 1", "World Capital 2"]
