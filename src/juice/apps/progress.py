"""The one progress display of the command line, behind the library's `progress` callback,
`(description, total) -> advance(n)` (:data:`juice.pipeline.run.Progress`): rich bars on a
terminal; one plain line per stage, and one every :data:`PLAIN_INTERVAL_S` seconds inside a long
stage, with progress and elapsed time, when the output is a file or a CI log (issue 37). Also the
command line's console, which prints tables in full as Markdown when the output is not a terminal
(a terminal table cut to the window's width would lose columns in a log)."""

from __future__ import annotations

import os
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager

from juice.progress import OnProgress, Progress

PLAIN_INTERVAL_S = float(os.environ.get("JUICE_PROGRESS_INTERVAL", "60"))
"""Seconds between two plain progress lines of one stage (`$JUICE_PROGRESS_INTERVAL`)."""


def table_markdown(table) -> str:
    """A `rich.table.Table` as a Markdown pipe table (its title as a line above), cells as plain text."""
    from rich.text import Text

    def plain(cell) -> str:
        text = cell.plain if isinstance(cell, Text) else Text.from_markup(str(cell)).plain
        return text.replace("|", "\\|").replace("\n", " ")

    columns = table.columns
    head = [plain(c.header) for c in columns]
    rows = [[plain(c._cells[r]) if r < len(c._cells) else "" for c in columns] for r in range(table.row_count)]
    lines = [f"{plain(table.title)}", ""] if table.title else []
    lines += ["| " + " | ".join(head) + " |", "|" + "|".join("---" for _ in head) + "|"]
    lines += ["| " + " | ".join(row) + " |" for row in rows]
    return "\n".join(lines)


def make_console(**kwargs):
    """The command line's `rich.console.Console`: on a terminal, rich's; elsewhere (a file, a
    pipe, a CI log) every table is printed in full as Markdown (:func:`table_markdown`)."""
    from rich.console import Console
    from rich.table import Table

    class _Console(Console):
        def print(self, *objects, **options):   # noqa: A003 (rich's name)
            if not self.is_terminal and any(isinstance(o, Table) for o in objects):
                objects = tuple(table_markdown(o) + "\n" if isinstance(o, Table) else o for o in objects)
                options.setdefault("markup", False)
                options.setdefault("highlight", False)
                options.setdefault("soft_wrap", True)
            return super().print(*objects, **options)

    return _Console(**kwargs)


@contextmanager
def plain_progress(write: Callable[[str], None] = print, interval_s: float | None = None,
                   clock: Callable[[], float] = time.monotonic) -> Iterator[Progress]:
    """Plain-line progress: `[elapsed] description: done/total` when a stage starts, every
    `interval_s` seconds while it runs (default :data:`PLAIN_INTERVAL_S`), and when it ends
    (reaching its total; or, when the next stage starts or the run ends first, where it stopped)."""
    interval = PLAIN_INTERVAL_S if interval_s is None else interval_s
    start = clock()
    open_stages: list[tuple[str, int, dict]] = []

    def stamp() -> str:
        return f"[{clock() - start:6.0f} s]"

    def close_open() -> None:   # a stage that ended before its total (e.g. a filter with enough items)
        for description, total, state in open_stages:
            if state["last"] != float("inf"):
                write(f"{stamp()} {description}: ended at {state['done']}/{total} after "
                      f"{clock() - state['began']:.0f} s")
                state["last"] = float("inf")
        open_stages.clear()

    def task(description: str, total: int) -> OnProgress:
        close_open()
        state = {"done": 0, "began": clock(), "last": clock()}
        open_stages.append((description, total, state))
        write(f"{stamp()} {description}: 0/{total}")

        def advance(n: int) -> None:
            state["done"] += n
            now, done = clock(), state["done"]
            if total and done >= total:
                write(f"{stamp()} {description}: {done}/{total} done in {now - state['began']:.0f} s")
                state["last"] = float("inf")   # nothing more for a finished stage
            elif now - state["last"] >= interval:
                share = f" ({100 * done / total:.0f}%)" if total else ""
                write(f"{stamp()} {description}: {done}/{total}{share}")
                state["last"] = now

        return advance

    try:
        yield task
    finally:
        close_open()


@contextmanager
def progress_bars(console=None) -> Iterator[Progress]:
    """Rich progress bars (description, a bar, done/total, elapsed time) as a
    `progress(description, total) -> advance(n)` callable; the bars stay on screen. When the
    console is not a terminal, plain lines instead (:func:`plain_progress`).

    Args:
        console: the `rich.console.Console` to draw on; default rich's own.
    """
    from rich.console import Console
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

    console = console or Console()
    if not console.is_terminal:
        with plain_progress(lambda line: console.print(line, markup=False, highlight=False, soft_wrap=True)) as task:
            yield task
        return
    with Progress(TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn(),
                  console=console, transient=False) as bars:
        def task(description: str, total: int) -> OnProgress:
            tid = bars.add_task(description, total=total)
            return lambda n: bars.advance(tid, n)

        yield task
