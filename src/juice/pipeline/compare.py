"""Two runs' results.json side by side: are their tables, choices and item verdicts the same?

For changes that must not move a number (a faster engine, a refactoring): every table cell and
interval, every paired difference, the heads, every domain's betas, k and pruned heads, every
grid point's accuracy and every item's verdicts must be equal. First-token probabilities may
differ in the last bits when batches are cut differently (a matrix product's rounding depends
on its shape), so they are compared to a tolerance; an item's output may be a prefix of the
other run's (evaluation stops a row once its first five words are final,
:func:`juice.eval.runner.evaluate`). Wall times and the output folder are not compared.
"""

from __future__ import annotations

import json
import math
from collections.abc import Collection
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

SKIPPED = {("timings_s",), ("config", "out_dir")}
"""Paths of results.json that may differ between two runs of the same computation."""

ENGINE_RECORD = {("config", "engine"), ("config", "vllm_args"), ("config", "vllm_offline"), ("config", "stage1_engine"),
                 ("protocol", "engine"), ("notes",)}
"""Paths that say which engine ran (and its notes: which stages it handed to juice's engine): skipped
when two engines' runs are compared (`juice reproduce` against `juice reproduce --engine vllm`)."""


@dataclass
class Comparison:
    """What :func:`compare_results` found.

    Attributes:
        differences: one line per value that must be equal and is not (path: before -> after).
        max_p_difference: the largest absolute difference of a probability (`p_*` fields).
        shortened_outputs: items whose output in `after` is a proper prefix of `before`'s.
        compared: how many values were compared.
    """

    differences: list[str] = field(default_factory=list)
    max_p_difference: float = 0.0
    shortened_outputs: int = 0
    compared: int = 0

    @property
    def same(self) -> bool:
        return not self.differences


def _is_probability(path: tuple) -> bool:
    return bool(path) and isinstance(path[-1], str) and path[-1].startswith("p_")


def compare_results(before: dict[str, Any], after: dict[str, Any], p_tolerance: float = 1e-5,
                    skip: Collection[tuple] = ()) -> Comparison:
    """Compare two results.json documents (:func:`juice.experiments.table1.reproduce`'s, or the
    contextual table's) value by value.

    Args:
        before, after: the parsed files.
        p_tolerance: largest accepted absolute difference of a probability field (`p_*`: the
            items' first-token probabilities, a grid point's `p_answer`, the summary's means).
        skip: more paths not compared (e.g. :data:`ENGINE_RECORD`).

    Returns:
        :class:`Comparison`; `same` when every table, choice and verdict is equal.
    """
    out = Comparison()

    skipped = SKIPPED | set(skip)

    def walk(a: Any, b: Any, path: tuple) -> None:
        if path in skipped:
            return
        where = "/".join(map(str, path)) or "(root)"
        if isinstance(a, dict) and isinstance(b, dict):
            for k in sorted(set(a) | set(b), key=str):
                if k not in a or k not in b:
                    out.differences.append(f"{where}/{k}: only in {'before' if k in a else 'after'}")
                else:
                    walk(a[k], b[k], (*path, k))
            return
        if isinstance(a, list) and isinstance(b, list):
            if len(a) != len(b):
                out.differences.append(f"{where}: {len(a)} entries -> {len(b)}")
                return
            for i, (x, y) in enumerate(zip(a, b)):
                walk(x, y, (*path, i))
            return
        out.compared += 1
        if path and path[-1] == "output" and isinstance(a, str) and isinstance(b, str):
            if a != b:
                if a.startswith(b):
                    out.shortened_outputs += 1
                else:
                    out.differences.append(f"{where}: {a!r} -> {b!r}")
            return
        if _is_probability(path) and isinstance(a, (int, float)) and isinstance(b, (int, float)) \
                and not isinstance(a, bool) and not isinstance(b, bool):
            gap = abs(float(a) - float(b))
            out.max_p_difference = max(out.max_p_difference, gap if math.isfinite(gap) else math.inf)
            if not gap <= p_tolerance:
                out.differences.append(f"{where}: {a!r} -> {b!r} (more than {p_tolerance:g} apart)")
            return
        if a != b or type(a) is not type(b):
            out.differences.append(f"{where}: {a!r} -> {b!r}")

    walk(before, after, ())
    return out


def compare_files(before: str | Path, after: str | Path, p_tolerance: float = 1e-5,
                  skip: Collection[tuple] = ()) -> Comparison:
    """:func:`compare_results` on two results.json files."""
    return compare_results(json.loads(Path(before).read_text("utf-8")), json.loads(Path(after).read_text("utf-8")),
                           p_tolerance, skip)


__all__ = ["ENGINE_RECORD", "Comparison", "compare_files", "compare_results"]
