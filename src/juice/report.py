"""Tables in the paper's layouts: rich for the terminal, Markdown for files."""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from rich.table import Table

from juice.data.records import CONFLICT_TYPES

SHORT = {
    "athlete_sport": "Ath", "book_author": "Book", "company_founder": "Fndr",
    "company_headquarter": "HQ", "official_language": "Lang", "world_capital": "Cap", "Average": "Avg",
}
AccuracyTable = Mapping[str, Mapping[str, Mapping[str, float]]]  # method -> domain -> type -> %


def _rows(table: AccuracyTable, methods: Sequence[str], domains: Sequence[str], types: Sequence[str]):
    for m in methods:
        cells, per_type = [], {t: [] for t in types}
        for d in domains:
            for t in types:
                v = table.get(m, {}).get(d, {}).get(t)
                cells.append(v)
                if v is not None:
                    per_type[t].append(v)
        averages = [sum(v) / len(v) if v else None for v in per_type.values()]
        yield m, cells + averages


def _best(values_by_method: list[list[float | None]]) -> list[float | None]:
    columns = zip(*values_by_method)
    return [max((v for v in col if v is not None), default=None) for col in columns]


def _fmt(v: float | None) -> str:
    return "-" if v is None else f"{v:.1f}"


def rich_table(
    table: AccuracyTable, methods: Sequence[str], domains: Sequence[str], titles: Mapping[str, str],
    types: Sequence[str] = CONFLICT_TYPES, title: str = "",
) -> Table:
    """The paper's Table 1 layout: methods as rows; domains x conflict types (1, 2, 3) as columns,
    then the average over domains. The best value of each column is bold."""
    out = Table(title=title, show_lines=False, pad_edge=False, caption=", ".join(
        f"{SHORT.get(d, d[:4])} = {titles.get(d, d)}" for d in domains))
    out.add_column("Method", no_wrap=True, min_width=8)
    for d in [*domains, "Average"]:
        for i, _ in enumerate(types, 1):
            out.add_column(f"{SHORT.get(d, d[:4])}{i}", justify="right", no_wrap=True, min_width=5)
    rows = list(_rows(table, methods, domains, types))
    best = _best([cells for _, cells in rows])
    for m, cells in rows:
        out.add_row(m, *[f"[bold]{_fmt(v)}[/bold]" if v is not None and v == b else _fmt(v)
                         for v, b in zip(cells, best)])
    return out


def markdown_table(
    table: AccuracyTable, methods: Sequence[str], domains: Sequence[str], titles: Mapping[str, str],
    types: Sequence[str] = CONFLICT_TYPES,
) -> str:
    """The same table as GitHub Markdown (best of each column in bold)."""
    header = ["Method"] + [f"{titles.get(d, d)} {i}" for d in [*domains, "Average"] for i, _ in enumerate(types, 1)]
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    rows = list(_rows(table, methods, domains, types))
    best = _best([cells for _, cells in rows])
    for m, cells in rows:
        shown = [f"**{_fmt(v)}**" if v is not None and v == b else _fmt(v) for v, b in zip(cells, best)]
        lines.append("| " + " | ".join([m, *shown]) + " |")
    legend = ", ".join(f"{i} = {t}" for i, t in enumerate(types, 1))
    return "\n".join(lines) + f"\n\nAccuracy (%), exact match. Conflict types: {legend}.\n"


def _contextual_rows(table: AccuracyTable, methods: Sequence[str], datasets: Sequence[str]):
    for m in methods:
        cells = [table.get(m, {}).get(d, {}).get("context") for d in datasets]
        known = [v for v in cells if v is not None]
        yield m, cells + [sum(known) / len(known) if known else None]


def _likelihood_rows(likelihood: Mapping[str, Mapping[str, float]], methods: Sequence[str], datasets: Sequence[str]):
    for m in methods:
        cells = [likelihood.get(m, {}).get(d) for d in datasets]
        known = [v for v in cells if v is not None]
        yield m, cells + [sum(known) / len(known) if known else None]


def _md(rows, header: list[str]) -> list[str]:
    rows = list(rows)
    best = _best([cells for _, cells in rows])
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    for m, cells in rows:
        shown = [f"**{_fmt(v)}**" if v is not None and v == b else _fmt(v) for v, b in zip(cells, best)]
        lines.append("| " + " | ".join([m, *shown]) + " |")
    return lines


def contextual_markdown(
    table: AccuracyTable, likelihood: Mapping[str, Mapping[str, float]], methods: Sequence[str],
    datasets: Sequence[str], titles: Mapping[str, str],
) -> str:
    """The paper's Table 2 layout (datasets as columns, then the average), and MemoTrap's
    likelihood comparison, as GitHub Markdown (best of each column in bold)."""
    lines = _md(_contextual_rows(table, methods, datasets), ["Method", *[titles.get(d, d) for d in datasets], "Average"])
    memo = [d for d in datasets if any(d in v for v in likelihood.values())]
    out = "\n".join(lines) + "\n\nAccuracy (%) of the contextual answer, greedy decoding (MemoTrap: exact match of " \
        "the continuation's words; NQ-Swap: normalized substring match).\n"
    if memo:
        lik = _md(_likelihood_rows(likelihood, methods, memo), ["Method", *[titles.get(d, d) for d in memo], "Average"])
        out += "\nMemoTrap by likelihood comparison (% of items where the instruction-following continuation " \
               "is more likely than the memorised one):\n\n" + "\n".join(lik) + "\n"
    return out


def contextual_rich(
    table: AccuracyTable, methods: Sequence[str], datasets: Sequence[str], titles: Mapping[str, str],
    title: str = "", likelihood: Mapping[str, Mapping[str, float]] | None = None,
) -> Table:
    """Table 2 for the terminal; with `likelihood`, the MemoTrap likelihood comparison instead."""
    if likelihood is not None:
        datasets = [d for d in datasets if any(d in v for v in likelihood.values())]
        rows = list(_likelihood_rows(likelihood, methods, datasets))
    else:
        rows = list(_contextual_rows(table, methods, datasets))
    out = Table(title=title, pad_edge=False)
    out.add_column("Method", no_wrap=True, min_width=8)
    for d in [*datasets, "Average"]:
        out.add_column(titles.get(d, d), justify="right")
    best = _best([cells for _, cells in rows])
    for m, cells in rows:
        out.add_row(m, *[f"[bold]{_fmt(v)}[/bold]" if v is not None and v == b else _fmt(v)
                         for v, b in zip(cells, best)])
    return out
