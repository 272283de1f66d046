"""Tables in the paper's layouts, with intervals, as Markdown (the terminal's rich tables are
:mod:`juice.apps.terminal`).

Tables come from :func:`juice.eval.tables.interval_table`; a cell prints as "47.6 ±4.1" (accuracy in
percent and the half-width of its 95% bootstrap interval), and a value is bold only where its
interval lies wholly above the runner-up's.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from juice.data.records import CONFLICT_TYPES

SHORT = {
    "athlete_sport": "Ath", "book_author": "Book", "company_founder": "Fndr",
    "company_headquarter": "HQ", "official_language": "Lang", "world_capital": "Cap", "Average": "Avg",
}


# ---------------------------------------------------------------- tables with intervals


def table1_columns(domains: Sequence[str], titles: Mapping[str, str], types: Sequence[str] = CONFLICT_TYPES,
                   short: bool = False) -> tuple[list[tuple[str, str]], list[str]]:
    """Table 1's columns: (domain, conflict type) for every domain, then the average; and their
    headers ("World Capital 1" or, with `short`, "Cap1")."""
    cols = [(d, t) for d in [*domains, "Average"] for t in types]
    name = (lambda d: SHORT.get(d, d[:4])) if short else (lambda d: titles.get(d, d))
    return cols, [f"{name(d)}{'' if short else ' '}{types.index(t) + 1}" for d, t in cols]


def table2_columns(datasets: Sequence[str], titles: Mapping[str, str]) -> tuple[list[tuple[str, str]], list[str]]:
    """Table 2's columns: one per dataset (group "context"), then the average."""
    cols = [(d, "context") for d in [*datasets, "Average"]]
    return cols, [titles.get(d, d) for d, _ in cols]


def separated_best(intervals: Sequence[Any]) -> int | None:
    """Index of the highest mean, if its interval lies wholly above the runner-up's (so a bold
    value means a difference the intervals can carry); else None."""
    ranked = sorted((i for i, iv in enumerate(intervals) if iv is not None and iv.n and iv.mean == iv.mean),
                    key=lambda i: -intervals[i].mean)
    if len(ranked) < 2:
        return None
    best, second = intervals[ranked[0]], intervals[ranked[1]]
    return ranked[0] if best.low > second.high + 1e-9 else None   # beyond float rounding


def interval_rows(table: Any, methods: Sequence[str], columns: Sequence[tuple[str, str]]):
    """Per method, its cells in `columns`: (text "47.6 ±4.1" or "-", bold) where bold marks the
    cell whose interval lies wholly above every other method's in that column."""
    values = [[table.cells.get(m, {}).get(c, {}).get(g) for c, g in columns] for m in methods]
    best = [separated_best([row[j] for row in values]) for j in range(len(columns))]
    for i, m in enumerate(methods):
        yield m, [(iv.format() if iv is not None else "-", best[j] == i) for j, iv in enumerate(values[i])]


def n_row(table: Any, methods: Sequence[str], columns: Sequence[tuple[str, str]]) -> list[str]:
    """Each column's item count n ("30", or "28/30" where the methods differ)."""
    ns = []
    for c, g in columns:
        counts = {table.cells[m][c][g].n for m in methods if g in table.cells.get(m, {}).get(c, {})}
        ns.append("/".join(str(n) for n in sorted(counts)) or "0")
    return ns


def interval_markdown(table: Any, methods: Sequence[str], columns: Sequence[tuple[str, str]],
                      headers: Sequence[str], bold: bool = True) -> str:
    """Methods as rows, `columns` as columns; cells "47.6 ±4.1" (accuracy % and the half-width
    of the 95% bootstrap interval); bold where :func:`separated_best` (unless `bold` is False,
    for a table where higher is not better); a last row with n."""
    lines = ["| Method | " + " | ".join(headers) + " |", "|" + "---|" * (len(headers) + 1)]
    for m, cells in interval_rows(table, methods, columns):
        lines.append("| " + " | ".join([m, *(f"**{s}**" if b and bold else s for s, b in cells)]) + " |")
    lines.append("| n | " + " | ".join(n_row(table, methods, columns)) + " |")
    return "\n".join(lines) + "\n"


DEGENERATION_NOTE = ("Degenerate outputs (%): outputs whose character 6-grams repeat (at least 30% seen earlier in the "
                     "same output, case ignored) or in which one word follows itself three times (juice's measure, "
                     "not the paper's: src/juice/eval/degeneration.py; precision 0.97, recall 0.90 against 258 "
                     "outputs labelled by hand), ± the "
                     "half-width of the 95% bootstrap interval; lower is better.")
"""The caption of every degeneration table."""

CORRECT_NOT_DEGENERATE_NOTE = (
    "Correct and not degenerate (%): exact match on an output that is not degenerate (the measure above), ± the "
    "half-width of the 95% bootstrap interval; juice's second score beside the paper's accuracy: exact match reads "
    "the first five words, so an answer followed by a repeated phrase counts as correct there and not here.")
"""The caption of every correct-and-not-degenerate table."""


def degeneration_markdown(degeneration: Any, usable: Any, methods: Sequence[str], columns: Sequence[tuple[str, str]],
                          headers: Sequence[str], average: Sequence[tuple[str, str]], average_headers: Sequence[str],
                          view: str = "") -> list[str]:
    """The sections a table's page shows beside accuracy: degenerate outputs, correct
    and not degenerate, and the paired differences of the latter on the average columns."""
    out: list[str] = []
    if degeneration is not None:
        out += [f"\n## Degenerate outputs{view}\n", interval_markdown(degeneration, methods, columns, headers, bold=False),
                "\n" + DEGENERATION_NOTE + "\n"]
    if usable is not None:
        out += [f"\n## Correct and not degenerate{view}\n", interval_markdown(usable, methods, columns, headers),
                "\n" + CORRECT_NOT_DEGENERATE_NOTE + "\n",
                "\n## Paired differences, correct and not degenerate (percentage points, 95% paired bootstrap "
                "interval; * excludes 0)\n", difference_markdown(usable, average, average_headers)]
    return out


def difference_markdown(table: Any, columns: Sequence[tuple[str, str]], headers: Sequence[str]) -> str:
    """Paired differences of accuracy (percentage points, 95% paired bootstrap interval) for every
    comparison of the table; "*" marks an interval that excludes 0."""
    lines = ["| Comparison | " + " | ".join(headers) + " |", "|" + "---|" * (len(headers) + 1)]
    for name, cols in table.differences.items():
        cells = []
        for c, g in columns:
            iv = cols.get(c, {}).get(g)
            if iv is None or not iv.n:
                cells.append("-")
                continue
            # a bound within float rounding of 0 (a mean of means) counts as 0
            mark = "*" if iv.low > 1e-9 or iv.high < -1e-9 else ""
            mean, low, high = (round(100 * v, 1) + 0.0 for v in (iv.mean, iv.low, iv.high))   # no "-0.0"
            cells.append(f"{mean:+.1f} [{low:+.1f}, {high:+.1f}]{mark}")
        lines.append("| " + " | ".join([name, *cells]) + " |")
    return "\n".join(lines) + "\n"
