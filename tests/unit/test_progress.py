"""The command line's output off a terminal (juice.apps.progress): one plain line per stage and
one per interval inside a long stage, with elapsed time; tables in full as Markdown."""

from __future__ import annotations

import io

from juice.apps.progress import make_console, plain_progress, progress_bars, table_markdown


def test_plain_progress_prints_a_line_per_stage_and_per_interval():
    now = [0.0]
    lines: list[str] = []
    with plain_progress(lines.append, interval_s=60, clock=lambda: now[0]) as task:
        advance = task("stage1: scoring heads", 10)
        for _ in range(9):
            now[0] += 20
            advance(1)
        now[0] += 5
        advance(1)
        filtering = task("filter: known items", 90)
        now[0] += 7
        filtering(4)   # enough known items: the stage ends before its total
        task("tuning", 0)
        now[0] += 1
    assert lines == ["[     0 s] stage1: scoring heads: 0/10",
                     "[    60 s] stage1: scoring heads: 3/10 (30%)",
                     "[   120 s] stage1: scoring heads: 6/10 (60%)",
                     "[   180 s] stage1: scoring heads: 9/10 (90%)",
                     "[   185 s] stage1: scoring heads: 10/10 done in 185 s",
                     "[   185 s] filter: known items: 0/90",
                     "[   192 s] filter: known items: ended at 4/90 after 7 s",
                     "[   192 s] tuning: 0/0",
                     "[   193 s] tuning: ended at 0/0 after 1 s"]


def test_off_a_terminal_tables_print_in_full_as_markdown_and_bars_as_lines():
    from rich.table import Table

    out = io.StringIO()
    console = make_console(file=out, width=40)   # a file: not a terminal, and narrow
    table = Table(title="Table 1: accuracy, % (95% interval half-width)")
    for name in ("Method", "World Capital", "Official Language", "Company Headquarter"):
        table.add_column(name)
    table.add_row("[bold]JuICE[/bold]", "93.3 ±4.4", "88.0 ±6.1", "71.2 ±8.0")
    console.print(table)
    with progress_bars(console) as task:
        task("evaluate: 4 methods x 2 rows", 8)(8)
    text = out.getvalue()
    assert ("Table 1: accuracy, % (95% interval half-width)\n\n| Method | World Capital | Official Language | "
            "Company Headquarter |\n|---|---|---|---|\n| JuICE | 93.3 ±4.4 | 88.0 ±6.1 | 71.2 ±8.0 |") in text
    assert "…" not in text and "evaluate: 4 methods x 2 rows: 8/8 done in" in text
    assert table_markdown(Table("a|b")).startswith("| a\\|b |")
