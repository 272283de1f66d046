"""The one progress display of the command line: rich bars behind the library's `progress`
callback, `(description, total) -> advance(n)` (:data:`juice.pipeline.run.Progress`)."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import contextmanager


@contextmanager
def progress_bars(console=None) -> Iterator[Callable[[str, int], Callable[[int], None]]]:
    """Rich progress bars (description, a bar, done/total, elapsed time) as a
    `progress(description, total) -> advance(n)` callable; the bars stay on screen.

    Args:
        console: the `rich.console.Console` to draw on; default rich's own.
    """
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

    with Progress(TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn(),
                  console=console, transient=False) as bars:
        def task(description: str, total: int) -> Callable[[int], None]:
            tid = bars.add_task(description, total=total)
            return lambda n: bars.advance(tid, n)

        yield task
