"""Choosing beta+ and beta- on the validation split (paper App. D.1).

Grid beta+ in {0, ..., 5} x beta- in {0, -1, -2, -3}; the pair with the best mean accuracy over
conflict types wins, ties broken by the mean first-token probability of the parametric answer.
Every grid point of JuICE and JuNE is evaluated in the same batches, sharing each prompt's clean
prefill.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

from juice.data.records import CONFLICT_TYPES, ConflictExample
from juice.evaluation import ItemResult, evaluate
from juice.models import LoadedModel
from juice.steering import HeadSelection, Steering, steering_coefficients

BETA_PLUS_GRID: tuple[float, ...] = (0.0, 1.0, 2.0, 3.0, 4.0, 5.0)
BETA_MINUS_GRID: tuple[float, ...] = (0.0, -1.0, -2.0, -3.0)


@dataclass(frozen=True)
class GridPoint:
    method: str
    beta_plus: float
    beta_minus: float
    accuracy: float          # mean over conflict types, percent
    p_answer: float          # mean first-token probability of the target answer
    per_type: tuple[float, ...] = ()  # accuracy per conflict type, percent

    @property
    def key(self) -> tuple[float, float]:
        return (self.accuracy, self.p_answer)


def grid_name(method: str, beta_plus: float, beta_minus: float) -> str:
    return f"{method}:{beta_plus:g}:{beta_minus:g}"


def tune_betas(
    lm: LoadedModel,
    validation: Sequence[ConflictExample],
    selection: HeadSelection,
    methods: Sequence[str] = ("juice", "june"),
    beta_plus_grid: Sequence[float] = BETA_PLUS_GRID,
    beta_minus_grid: Sequence[float] = BETA_MINUS_GRID,
    conflict_types: Sequence[str] = CONFLICT_TYPES,
    *,
    max_rows: int = 64,
    on_progress: Callable[[int], None] | None = None,
) -> tuple[dict[str, GridPoint], list[GridPoint]]:
    """Grid-search beta+ and beta- for each method on `validation`.

    Returns:
        (method -> best grid point, every grid point).
    """
    steerings = {
        grid_name(m, bp, bm): Steering(m, steering_coefficients(lm.heads.geometry, selection, bp, bm))
        for m in methods for bp in beta_plus_grid for bm in beta_minus_grid
    }
    results = evaluate(lm, validation, steerings, conflict_types, max_rows=max_rows, on_progress=on_progress)
    grid = grid_points(results, conflict_types)
    best = {m: max((g for g in grid if g.method == m), key=lambda g: g.key) for m in methods}
    return best, grid


def grid_points(results: Sequence[ItemResult], conflict_types: Sequence[str]) -> list[GridPoint]:
    """Aggregate validation results named by :func:`grid_name` into grid points."""
    points = []
    for name in dict.fromkeys(r.method for r in results):
        rs = [r for r in results if r.method == name]
        per_type = [
            sum(r.correct for r in rs if r.conflict_type == t) / max(1, sum(r.conflict_type == t for r in rs))
            for t in conflict_types
        ]
        method, bp, bm = name.split(":")
        points.append(GridPoint(method, float(bp), float(bm), 100.0 * sum(per_type) / len(per_type),
                                sum(r.p_parametric for r in rs) / len(rs), tuple(100.0 * a for a in per_type)))
    return points
