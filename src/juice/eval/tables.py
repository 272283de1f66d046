"""Result tables with their statistics: every cell's n and 95% bootstrap interval, and paired
bootstrap intervals of accuracy differences over the same items.

A table maps method -> column -> row group -> :class:`juice.eval.stats.Interval` of the accuracy
(a fraction; reports print percent). Columns are domains (datasets in the contextual
direction) plus "Average"; row groups are conflict types (or "context"). The "Average" cell is
the mean of that group's column accuracies (the paper's average over domains; columns with no
item are left out), its interval a bootstrap that resamples within each column
(:func:`juice.eval.stats.stratified_interval`); its n counts every item.

Differences compare methods item by item (same domain, item id and conflict type): the focus
method (JuICE) against every other method, and every method against the baseline (Original).
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from juice.eval.runner import ItemResult
from juice.methods import FOCUS, UNSTEERED, row_title
from juice.eval.stats import Interval, bootstrap_interval, stratified_interval

AVERAGE = "Average"
Cells = dict[str, dict[str, dict[str, Interval]]]
"""name -> column -> group -> interval."""


@dataclass
class IntervalTable:
    """Accuracy intervals per cell and paired differences.

    Attributes:
        cells: method -> column -> group -> accuracy interval (fraction of items correct).
        differences: "A - B" -> column -> group -> interval of mean(correct_A - correct_B) over
            the items both methods were evaluated on.
        resamples, confidence, seed: the bootstrap's settings.
    """

    cells: Cells
    differences: Cells
    resamples: int
    confidence: float
    seed: int

    def to_json(self) -> dict:
        def conv(c: Cells) -> dict:
            return {a: {col: {g: iv.to_json() for g, iv in gs.items()} for col, gs in cols.items()}
                    for a, cols in c.items()}

        return {"cells": conv(self.cells), "differences": conv(self.differences), "bootstrap": {
            "resamples": self.resamples, "confidence": self.confidence, "seed": self.seed, "method": "percentile"}}

    def titled(self, title: Callable[[str], str] = row_title) -> "IntervalTable":
        """The same table with its rows and differences named by `title` (default: row keys to
        their titles, "juice - original" to "JuICE - Original": :func:`juice.methods.row_title`),
        for what renders or records it."""
        return IntervalTable({title(m): cols for m, cols in self.cells.items()},
                             {title(d): cols for d, cols in self.differences.items()},
                             self.resamples, self.confidence, self.seed)

    def means(self) -> dict[str, dict[str, dict[str, float]]]:
        """method -> column -> group -> accuracy in percent (the plain table)."""
        return {m: {c: {g: 100.0 * iv.mean for g, iv in gs.items()} for c, gs in cols.items()}
                for m, cols in self.cells.items()}


def comparisons(methods: Sequence[str], focus: str = FOCUS, baseline: str = UNSTEERED) -> list[tuple[str, str]]:
    """The (A, B) pairs whose difference A - B is reported: focus vs every other method, then
    every other method vs the baseline."""
    pairs = [(focus, m) for m in methods if m != focus] if focus in methods else []
    if baseline in methods:
        pairs += [(m, baseline) for m in methods if m not in (baseline, focus)]
    return pairs


def interval_table(
    results: Sequence[ItemResult],
    methods: Sequence[str],
    *,
    keep: Callable[[ItemResult], bool] | None = None,
    value: Callable[[ItemResult], bool] = lambda r: r.correct,
    focus: str = FOCUS,
    baseline: str = UNSTEERED,
    resamples: int = 2000,
    confidence: float = 0.95,
    seed: int = 0,
) -> IntervalTable:
    """Bootstrap every cell and every comparison of `results` (module docstring).

    Args:
        results: item results of every method (column = `domain`, group = `conflict_type`).
        methods: the methods to tabulate, in order.
        keep: only results for which it is true (e.g. the items the model knows).
        value: what a cell counts (default: exact match); e.g. `lambda r: r.degenerate` gives the
            share of degenerate outputs (:mod:`juice.eval.degeneration`).
        focus, baseline: the rows compared with every other (default: JuICE's and Original's keys,
            :class:`juice.methods.Row`; results labelled otherwise name theirs).
    """
    outcome: dict[str, dict[tuple[str, str, str], bool]] = defaultdict(dict)
    for r in results:
        if r.method in methods and (keep is None or keep(r)):
            key = (*r.item_key, r.conflict_type)
            if key in outcome[r.method]:
                raise ValueError(f"{r.method}: two results for item {key[1]!r} ({r.subject}) of {key[0]}, "
                                 f"{key[2]}: an item was evaluated twice")
            outcome[r.method][key] = bool(value(r))
    columns = list(dict.fromkeys(key[0] for o in outcome.values() for key in o))
    groups = list(dict.fromkeys(key[2] for o in outcome.values() for key in o))

    def keys_of(method: str, column: str, group: str) -> list[tuple[str, str, str]]:
        return [k for k in outcome[method] if k[2] == group and k[0] == column]

    boot = dict(resamples=resamples, confidence=confidence, seed=seed)
    cells: Cells = {}
    for m in methods:
        cells[m] = {c: {g: bootstrap_interval([outcome[m][k] for k in keys_of(m, c, g)], **boot) for g in groups}
                    for c in columns}
        cells[m][AVERAGE] = {g: stratified_interval(
            [[outcome[m][k] for k in keys_of(m, c, g)] for c in columns], **boot) for g in groups}
    differences: Cells = {}
    for a, b in comparisons(methods, focus, baseline):
        name = f"{a} - {b}"
        differences[name] = {}
        per_column: dict[str, dict[str, list[float]]] = {}
        for c in columns:
            differences[name][c], per_column[c] = {}, {}
            for g in groups:
                shared = [k for k in keys_of(a, c, g) if k in outcome[b]]
                diff = [float(outcome[a][k]) - float(outcome[b][k]) for k in shared]
                per_column[c][g] = diff
                differences[name][c][g] = bootstrap_interval(diff, **boot)
        differences[name][AVERAGE] = {g: stratified_interval([per_column[c][g] for c in columns], **boot)
                                      for g in groups}
    return IntervalTable(cells, differences, resamples, confidence, seed)
