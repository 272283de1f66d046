"""What the `juice` commands share: the console, progress bars, option parsing, defaults."""

from __future__ import annotations

import math
from typing import Optional

import typer

from juice.apps.progress import make_console, progress_bars

console = make_console(width=200)

CONTEXT_LIMIT = 40
"""`juice evaluate --contexts`'s default items per source (about 15 minutes on 2 cores for NQ-Swap and
every method on the embedded model); `--full` evaluates every item."""

BETA_MINUS_GRID_HELP = ("tuning grid of beta-, comma-separated (default the paper's 0,-1,-2,-3; the authors' "
                        "contextual script: 0,-1,-2,-3,-4,-5)")


def progress():
    """Rich progress bars on the console (:func:`juice.apps.progress.progress_bars`)."""
    return progress_bars(console)


def parse_grid(text: Optional[str], option: str) -> Optional[tuple[float, ...]]:
    """A comma-separated grid of finite numbers, or None for the default; a usage error otherwise."""
    if text is None:
        return None
    try:
        values = tuple(float(v) for v in text.split(",") if v.strip())
    except ValueError:
        values = ()
    if not values or not all(math.isfinite(v) for v in values):
        raise typer.BadParameter(f"{option} must be comma-separated finite numbers, e.g. 0,-1,-2, not {text!r}")
    return values


__all__ = ["BETA_MINUS_GRID_HELP", "CONTEXT_LIMIT", "console", "parse_grid", "progress"]
