"""Result tables for the terminal (rich, the `cli` extra), in the layouts of
:mod:`juice.eval.report`."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from rich.table import Table

from juice.eval.report import interval_rows, n_row


def interval_rich(table: Any, methods: Sequence[str], columns: Sequence[tuple[str, str]], headers: Sequence[str],
                  title: str = "", caption: str = "", bold: bool = True) -> "Table":
    """:func:`juice.eval.report.interval_markdown`'s table for the terminal: a cell prints as
    "47.6 ±4.1" (percent, half-width of the 95% interval), bold where it beats the runner-up
    (unless `bold` is False, for a table where higher is not better)."""
    out = Table(title=title, caption=caption, pad_edge=False)
    out.add_column("Method", no_wrap=True)
    for h in headers:
        out.add_column(h, justify="right", no_wrap=True)
    for m, cells in interval_rows(table, methods, columns):
        out.add_row(m, *(f"[bold]{s}[/bold]" if b and bold else s for s, b in cells))
    out.add_row("n", *n_row(table, methods, columns))
    return out
