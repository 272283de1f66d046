"""How a long computation reports progress: one callback type, :data:`OnProgress`.

Every function that takes a while (Stage 1 scoring, decoding, evaluation, PH3, the analyses)
takes `on_progress: OnProgress | None` and calls it with the number of units (prompts,
streams, items) it has just finished; resumed units from a checkpoint count too. A run of
several stages takes a :data:`Progress`, which makes one such callback per stage from its
description and its number of units (the command line's bars, :mod:`juice.apps.progress`).
"""

from __future__ import annotations

from collections.abc import Callable

OnProgress = Callable[[int], None]
"""Called with the number of units just finished (>= 1)."""

Progress = Callable[[str, int], OnProgress]
"""(description, total units) -> the stage's :data:`OnProgress`."""


def no_progress(description: str, total: int) -> OnProgress:
    """The :data:`Progress` that shows nothing."""
    return lambda n: None


__all__ = ["OnProgress", "Progress", "no_progress"]
