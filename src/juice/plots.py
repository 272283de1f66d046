"""Figures of result tables: grouped bars with their bootstrap intervals (matplotlib)."""

from __future__ import annotations

import math
import os
import tempfile
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

from juice.eval.stats import Interval


def have_matplotlib() -> bool:
    """Whether matplotlib is installed (the `plots` extra); without it, commands skip their PNGs."""
    import importlib.util

    return importlib.util.find_spec("matplotlib") is not None


def interval_bars(
    ax: Any, cells: Mapping[str, Mapping[str, Interval]], groups: Sequence[str], *, scale: float = 100.0,
    hatch: Callable[[str], str | None] | None = None,
) -> tuple[set[int], list[float]]:
    """Draw grouped bars on a matplotlib axis: one colour per method (outer key of `cells`),
    `groups` along the x axis (labelled), asymmetric error bars from each interval; missing
    groups and NaN means are left out.

    Args:
        scale: multiplies means and bounds (100: fractions drawn as percent).
        hatch: method -> hatch pattern for its bars, or None.

    Returns:
        (the distinct n of the intervals drawn, every drawn mean and bound, scaled).
    """
    methods = list(cells)
    width = 0.8 / max(1, len(methods))
    ns: set[int] = set()
    values: list[float] = []
    for i, m in enumerate(methods):
        xs, ys, err = [], [], [[], []]
        for j, g in enumerate(groups):
            iv = cells[m].get(g)
            if iv is None or iv.n == 0 or math.isnan(iv.mean):
                continue
            ns.add(iv.n)
            xs.append(j - 0.4 + width * (i + 0.5))
            ys.append(iv.mean * scale)
            err[0].append(max(0.0, (iv.mean - iv.low) * scale))
            err[1].append(max(0.0, (iv.high - iv.mean) * scale))
            values += [v * scale for v in (iv.low, iv.mean, iv.high) if not math.isnan(v)]
        ax.bar(xs, ys, width, yerr=err, capsize=2, label=m, hatch=hatch(m) if hatch else None)
    ax.set_xticks(range(len(groups)), list(groups))
    return ns, values


def interval_bar_chart(
    cells: Mapping[str, Mapping[str, Interval]], path: str | Path, *, title: str, ylabel: str = "accuracy (%)",
    scale: float = 100.0, interval_label: str = "95% bootstrap intervals",
) -> Path:
    """Grouped bars: one colour per method (outer key), groups (inner key, e.g. conflict types or
    datasets) along the x axis, asymmetric error bars from each interval; written atomically.

    Args:
        cells: method -> group -> interval; missing groups and NaN means are left out.
        path: the PNG to write (parent folders are created; an existing file is replaced).
        title: the figure's title; the items' n (every distinct n drawn) is added below it.
        scale: multiplies means and bounds (100: fractions drawn as percent). The y axis spans
            0 to `scale` unless a bound lies outside (e.g. a negative difference).
        interval_label: what the error bars are, for the caption.

    Returns:
        The path written.
    """
    from matplotlib.figure import Figure

    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    methods = list(cells)
    groups = list(dict.fromkeys(g for m in methods for g in cells[m]))
    fig = Figure(figsize=(max(6.0, 1.2 * len(groups) * max(1, len(methods)) / 3), 4.2), dpi=120)
    ax = fig.add_subplot()
    ns, values = interval_bars(ax, cells, groups, scale=scale)
    ax.set_ylabel(ylabel)
    bounds = [0.0, scale, *values]
    low, high = min(bounds), max(bounds)   # 0 to `scale` (accuracy: 0-100 %) unless a bound lies outside
    pad = 0.03 * (high - low)
    ax.set_ylim(low - pad if low < 0 else 0.0, high + pad if high > scale else scale)
    n_text = "n = " + "/".join(str(n) for n in sorted(ns)) + "; " if ns else ""
    ax.set_title(f"{title}\n{n_text}error bars: {interval_label}", fontsize=9)
    ax.legend(fontsize=7, ncol=min(4, max(1, len(methods))))
    ax.grid(axis="y", alpha=0.3)
    fig.tight_layout()
    return save_png(fig, path)


def average_views_figure(tables: Sequence[tuple[str, Any]], methods: Sequence[str], groups: Sequence[str], title: str,
                         *, figsize: tuple[float, float] = (11, 4.2), legend_size: int = 8,
                         hatch: Callable[[str], str | None] | None = None) -> Any:
    """One panel per view (e.g. the unfiltered test split and the items the model knows): each
    method's "Average" column per group (conflict type) as bars with their 95% intervals, the
    view's n in its title; `title` above both. Needs matplotlib (the `plots` extra).

    Args:
        tables: (view name, :class:`juice.eval.tables.IntervalTable`) per panel.
        methods: the methods drawn, in order; `groups`: the x axis.

    Returns:
        the matplotlib `Figure` (write it with :func:`save_png`).
    """
    from matplotlib.figure import Figure

    fig = Figure(figsize=figsize)
    axes = fig.subplots(1, len(tables))
    for ax, (view, table) in zip(axes, tables):
        interval_bars(ax, {m: table.cells[m]["Average"] for m in methods}, groups, hatch=hatch)
        clean = table.cells.get(methods[0], {}).get("Average", {}).get(groups[0])
        ax.set_ylim(0, 100)
        ax.set_ylabel("accuracy (%), mean over domains")
        ax.set_title(f"{view} (n = {clean.n if clean is not None else 0} per type)", fontsize=9)
        ax.legend(fontsize=legend_size)
        ax.grid(axis="y", alpha=0.3)
    fig.suptitle(f"{title}\nerror bars: 95% bootstrap intervals", fontsize=9)
    fig.tight_layout()
    return fig


def save_png(figure: Any, path: str | Path, dpi: float | None = None) -> Path:
    """Write a matplotlib figure to `path` as PNG atomically (a temporary file in the same
    folder, then a rename; nothing half-written is left), then close it if pyplot owns it.

    Args:
        dpi: dots per inch; None: matplotlib's default (100).
    """
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=path.name + ".", suffix=".png", dir=path.parent)
    os.close(fd)
    try:
        figure.savefig(tmp, format="png", **({"dpi": dpi} if dpi is not None else {}))
        os.replace(tmp, path)
    finally:
        if os.path.exists(tmp):
            os.unlink(tmp)
        try:
            import matplotlib.pyplot as plt

            plt.close(figure)
        except Exception:   # a bare matplotlib.figure.Figure is not registered with pyplot
            pass
    return path
