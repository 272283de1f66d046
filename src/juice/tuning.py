"""Choosing hyperparameters on the validation split (paper App. D.1, "Hyperparameters").

- JuICE and JuNE: grid beta+ in {0, ..., 5} x beta- in {0, -1, -2, -3}.
- PH3: the number of pruned heads k in {1, 3, 5, 7, 9, 15}.

The setting with the best mean accuracy wins (mean over conflict types in the parametric
direction, over datasets in the contextual one), ties broken by the mean first-token probability
of the target answer, then by the order of the grid (smaller first). All settings of one search
are evaluated in the same batches, sharing each prompt's clean prefill.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

from juice.baselines.ph3 import PRUNE_K, Ph3Scores, heads_to_prune, pruning
from juice.data.records import CONFLICT_TYPES, ConflictExample, ContextualExample
from juice.evaluation import ItemResult, evaluate, evaluate_contextual
from juice.models import LoadedModel
from juice.steering import HeadSelection, Steering, steering_coefficients

BETA_PLUS_GRID: tuple[float, ...] = (0.0, 1.0, 2.0, 3.0, 4.0, 5.0)
BETA_MINUS_GRID: tuple[float, ...] = (0.0, -1.0, -2.0, -3.0)


@dataclass(frozen=True)
class GridPoint:
    method: str
    beta_plus: float
    beta_minus: float
    accuracy: float          # mean over groups (conflict types or datasets), percent
    p_answer: float          # mean first-token probability of the target answer
    per_type: tuple[float, ...] = ()  # accuracy per group, percent

    @property
    def key(self) -> tuple[float, float]:
        return (self.accuracy, self.p_answer)


def grid_name(method: str, beta_plus: float, beta_minus: float) -> str:
    return f"{method}:{beta_plus:g}:{beta_minus:g}"


def _run(lm, validation, steerings, direction, conflict_types, max_rows, on_progress) -> list[ItemResult]:
    if direction == "contextual":
        return evaluate_contextual(lm, validation, steerings, likelihood=False, max_rows=max_rows,
                                   on_progress=on_progress)
    if direction != "parametric":
        raise ValueError(f"direction must be 'parametric' or 'contextual', not {direction!r}")
    return evaluate(lm, validation, steerings, conflict_types, max_rows=max_rows, on_progress=on_progress)


def _groups(results: Sequence[ItemResult], direction: str, conflict_types: Sequence[str]) -> list[str]:
    if direction == "contextual":
        return list(dict.fromkeys(r.domain for r in results))
    return list(conflict_types)


def tune_betas(
    lm: LoadedModel,
    validation: Sequence[ConflictExample] | Sequence[ContextualExample],
    selection: HeadSelection,
    methods: Sequence[str] = ("juice", "june"),
    beta_plus_grid: Sequence[float] = BETA_PLUS_GRID,
    beta_minus_grid: Sequence[float] = BETA_MINUS_GRID,
    conflict_types: Sequence[str] = CONFLICT_TYPES,
    *,
    direction: str = "parametric",
    max_rows: int | str = 64,
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
    results = _run(lm, validation, steerings, direction, conflict_types, max_rows, on_progress)
    grid = grid_points(results, _groups(results, direction, conflict_types), direction)
    best = {m: max((g for g in grid if g.method == m), key=lambda g: g.key) for m in methods}
    return best, grid


def grid_points(
    results: Sequence[ItemResult], groups: Sequence[str], direction: str = "parametric"
) -> list[GridPoint]:
    """Aggregate validation results named by :func:`grid_name` into grid points; accuracy is the
    mean over `groups` (conflict types, or datasets for the contextual direction)."""
    points = []
    field = "domain" if direction == "contextual" else "conflict_type"
    for name in dict.fromkeys(r.method for r in results):
        rs = [r for r in results if r.method == name]
        per_group = [
            sum(r.correct for r in rs if getattr(r, field) == g) / max(1, sum(getattr(r, field) == g for r in rs))
            for g in groups
        ]
        method, bp, bm = name.split(":")
        p = [r.p_context if direction == "contextual" else r.p_parametric for r in rs]
        points.append(GridPoint(method, float(bp), float(bm), 100.0 * sum(per_group) / len(per_group),
                                sum(p) / len(p), tuple(100.0 * a for a in per_group)))
    return points


@dataclass(frozen=True)
class PruneChoice:
    k: int
    accuracy: float                  # mean over groups, percent
    per_k: dict[int, float]          # k -> mean accuracy, percent


def tune_prune_k(
    lm: LoadedModel,
    validation: Sequence[ConflictExample] | Sequence[ContextualExample],
    scores: Ph3Scores,
    ks: Sequence[int] = PRUNE_K,
    conflict_types: Sequence[str] = CONFLICT_TYPES,
    *,
    direction: str = "parametric",
    max_rows: int | str = 64,
    on_progress: Callable[[int], None] | None = None,
) -> PruneChoice:
    """PH3's number of pruned heads, chosen on `validation` (Jin et al. 2024; paper App. D.1)."""
    steerings = {grid_name("ph3", k, 0): pruning(lm.heads.geometry, heads_to_prune(scores, direction, k)) for k in ks}
    results = _run(lm, validation, steerings, direction, conflict_types, max_rows, on_progress)
    points = grid_points(results, _groups(results, direction, conflict_types), direction)
    best = max(points, key=lambda g: (g.accuracy, g.p_answer, -g.beta_plus))
    return PruneChoice(int(best.beta_plus), best.accuracy, {int(g.beta_plus): g.accuracy for g in points})
