"""Choosing hyperparameters on the validation split (paper App. D.1, "Hyperparameters").

- JuICE and JuNE: grid beta+ in {0, ..., 5} x beta- in {0, -1, -2, -3}.
- PH3: the number of pruned heads k in {1, 3, 5, 7, 9, 15}.

Both are chosen per domain (dataset) on that domain's own validation split (docs/protocol.md,
"Tuning grids"). Every grid point also records its share of degenerate outputs
(:mod:`juice.eval.degeneration`), which the paper's criterion does not read; `juice tune` on your
own rows also guards against it (:func:`juice.workflow.tune`). The setting with the best accuracy wins (mean over conflict types
in the parametric direction; the dataset's accuracy in the contextual one), ties broken by the
mean first-token probability of the target answer, then by the order of the grid (smaller
first). With a `degeneration_margin` (juice's option, `juice reproduce --degeneration-margin`;
not the paper's protocol) a setting whose share of degenerate validation outputs exceeds
Original's (the grid's (0, 0) point, which is the unmodified model) by more than the margin is
not chosen, as `juice tune` does. All settings of all domains are evaluated in the same batches, sharing each prompt's
clean prefill.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, replace

from juice.baselines.ph3 import PRUNE_K, Ph3Scores, heads_to_prune
from juice.data.records import CONFLICT_TYPES, ConflictExample, ContextualExample, Direction
from juice.engine.backend import Engine
from juice.eval.runner import ItemResult, evaluate, evaluate_contextual
from juice.interventions import HeadSelection
from juice.io import UnitCheckpoint
from juice.models import LoadedModel
from juice.methods import TUNED_STEERINGS, MethodInputs, build
from juice.progress import OnProgress

BETA_PLUS_GRID: tuple[float, ...] = (0.0, 1.0, 2.0, 3.0, 4.0, 5.0)
BETA_MINUS_GRID: tuple[float, ...] = (0.0, -1.0, -2.0, -3.0)


@dataclass(frozen=True)
class GridSetting:
    """One setting of a tuning grid (paper App. D.1): a steering method ("juice", "june") with its
    (beta+, beta-), or a PH3 variant (e.g. "PH3-l") with its number of pruned heads `k`."""

    method: str
    beta_plus: float = 0.0
    beta_minus: float = 0.0
    k: int | None = None

    @property
    def label(self) -> str:
        """The name of its results in a batched run (`ItemResult.method`), e.g. "juice:2:-1" or
        "PH3-l:k=5". A label only: settings are looked up by it, never parsed back from it."""
        if self.k is not None:
            return f"{self.method}:k={self.k}"
        return f"{self.method}:{self.beta_plus:g}:{self.beta_minus:g}"


@dataclass(frozen=True)
class GridPoint:
    """A grid setting's validation result. PH3's points carry their `k` (betas 0)."""

    method: str
    beta_plus: float
    beta_minus: float
    accuracy: float          # mean over groups (conflict types or datasets), percent
    p_answer: float          # mean first-token probability of the target answer
    per_type: tuple[float, ...] = ()  # accuracy per group, percent
    k: int | None = None     # PH3's number of pruned heads; None for JuICE and JuNE
    degeneration: float = 0.0  # degenerate outputs, percent (juice.eval.degeneration; a criterion only with a margin)

    @property
    def key(self) -> tuple[float, float]:
        return (self.accuracy, self.p_answer)


def _run(lm, validation, steerings, direction, conflict_types, max_rows, on_progress, engine, checkpoint
         ) -> list[ItemResult]:
    if Direction.parse(direction) == Direction.CONTEXTUAL:
        return evaluate_contextual(lm, validation, steerings, likelihood=False, max_rows=max_rows,
                                   on_progress=on_progress, engine=engine, checkpoint=checkpoint)
    return evaluate(lm, validation, steerings, conflict_types, max_rows=max_rows, on_progress=on_progress,
                    engine=engine, checkpoint=checkpoint)


def grid_points(
    results: Sequence[ItemResult], groups: Sequence[str], direction: str = "parametric", *,
    settings: Iterable[GridSetting],
) -> list[GridPoint]:
    """Aggregate validation results into one point per setting of `settings` that has results
    (matched by :attr:`GridSetting.label`); accuracy is the mean over `groups` (conflict types,
    or datasets for the contextual direction)."""
    by_label = {s.label: s for s in settings}
    points = []
    field = "domain" if direction == "contextual" else "conflict_type"
    for name in dict.fromkeys(r.method for r in results):
        setting = by_label.get(name)
        if setting is None:
            continue
        rs = [r for r in results if r.method == name]
        per_group = [
            sum(r.correct for r in rs if getattr(r, field) == g) / max(1, sum(getattr(r, field) == g for r in rs))
            for g in groups
        ]
        p = [r.p_context if direction == "contextual" else r.p_parametric for r in rs]
        points.append(GridPoint(setting.method, float(setting.beta_plus), float(setting.beta_minus),
                                100.0 * sum(per_group) / len(per_group), sum(p) / len(p),
                                tuple(100.0 * a for a in per_group), setting.k,
                                100.0 * sum(r.degenerate for r in rs) / len(rs)))
    return points


@dataclass(frozen=True)
class PruneChoice:
    """PH3's chosen number of pruned heads on one domain's validation split, with the accuracy
    of every k tried (ties: the smaller k)."""

    k: int
    accuracy: float                  # mean over groups, percent
    per_k: dict[int, float]          # k -> mean accuracy, percent


@dataclass(frozen=True)
class DomainChoice:
    """The hyperparameters chosen on one domain's (or dataset's) own validation split.

    Attributes:
        betas: steering method ("juice", "june") -> its best grid point.
        prune: PH3 variant (e.g. "PH3-l") -> its number of pruned heads.
        grid: every grid point of this domain, for the record.
        n_validation: validation items behind the choice.
    """

    betas: dict[str, GridPoint]
    prune: dict[str, PruneChoice]
    grid: tuple[GridPoint, ...]
    n_validation: int


def _within_margin(points: Sequence[GridPoint], method: str, margin: float | None) -> Callable[[GridPoint], bool]:
    """Whether a point's degeneration is within `margin` points of Original's (`method`'s (0, 0)
    point on the same rows); always true without a margin."""
    if margin is None:
        return lambda g: True
    original = next(g.degeneration for g in points if g.method == method and g.beta_plus == 0 and g.beta_minus == 0)
    return lambda g: g.degeneration <= original + margin + 1e-9


def tune_per_domain(
    lm: LoadedModel,
    validation: Mapping[str, Sequence[ConflictExample] | Sequence[ContextualExample]],
    selection: HeadSelection,
    ph3: Mapping[str, Ph3Scores] | None = None,
    *,
    methods: Sequence[str] = TUNED_STEERINGS,
    beta_plus_grid: Sequence[float] = BETA_PLUS_GRID,
    beta_minus_grid: Sequence[float] = BETA_MINUS_GRID,
    ks: Sequence[int] = PRUNE_K,
    conflict_types: Sequence[str] = CONFLICT_TYPES,
    direction: str = "parametric",
    max_rows: int | str = 64,
    on_progress: OnProgress | None = None,
    site: str = "o_proj_input",
    degeneration_margin: float | None = None,
    engine: Engine | None = None,
    checkpoint: UnitCheckpoint | None = None,
) -> dict[str, DomainChoice]:
    """JuICE's and JuNE's (beta+, beta-) and PH3's k, chosen per domain on that domain's own
    validation split (docs/protocol.md, "Tuning grids"; paper App. D.1).

    Every setting of every domain is decoded in one call, so all settings of a prompt share its
    clean prefill; the choice for a domain reads only that domain's results. The criterion is
    the mean accuracy over conflict types (parametric) or the dataset's accuracy (contextual),
    ties broken by the mean first-token probability of the target, then by grid order (the
    smaller k first for PH3).

    Args:
        validation: domain (dataset) -> its validation items; domains with none are left out of
            the result.
        ph3: PH3 variant name -> its head scores; their k is tuned alongside the betas.
        site: where JuICE and JuNE steer (:data:`juice.steering.SITES`; "post_norm": after the
            attention output norm, `juice analyze norm`).
        degeneration_margin: percentage points of degenerate validation outputs a chosen setting
            (betas or k) may add to Original's on the same domain (module docstring); None: the
            paper's criterion, accuracy only.
        engine: what decodes (:mod:`juice.engine.backend`); None: juice's own engine.
        checkpoint: where the decoded chunks are kept, so a killed tuning resumes with the same
            results (:func:`juice.eval.runner.decode_requests`); its scope must pin the
            validation items, heads, grids and model (the tuning stage's key does).

    Returns:
        domain -> :class:`DomainChoice`.

    Raises:
        ValueError: a negative margin, or a margin without (0, 0) in both beta grids (Original's
            reference).
    """
    if degeneration_margin is not None and (degeneration_margin < 0 or 0.0 not in beta_plus_grid
                                            or 0.0 not in beta_minus_grid or not methods):
        raise ValueError("a degeneration margin needs a margin >= 0 and (0, 0) in the beta grids (Original)")
    ph3 = dict(ph3 or {})
    settings = [GridSetting(m, bp, bm) for m in methods for bp in beta_plus_grid for bm in beta_minus_grid]
    steerings = {s.label: replace(build(s.method, MethodInputs(lm, selection, beta_plus=s.beta_plus,
                                                               beta_minus=s.beta_minus)).method.steering, site=site)
                 for s in settings}
    for name, scores in ph3.items():
        for k in ks:
            setting = GridSetting(name, k=k)
            settings.append(setting)
            steerings[setting.label] = build("ph3", MethodInputs(
                lm, pruned=heads_to_prune(scores, direction, k))).method.steering
    items = [ex for exs in validation.values() for ex in exs]
    results = _run(lm, items, steerings, direction, conflict_types, max_rows, on_progress, engine,
                   checkpoint) if items else []
    out = {}
    for domain, exs in validation.items():
        if not exs:
            continue
        mine = [r for r in results if r.domain == domain]
        groups = [domain] if direction == "contextual" else list(conflict_types)
        points = grid_points(mine, groups, direction, settings=settings)
        allowed = _within_margin(points, methods[0] if methods else "", degeneration_margin)
        betas = {m: max((g for g in points if g.method == m and allowed(g)), key=lambda g: g.key) for m in methods}
        prune = {}
        for name in ph3:
            pts = [g for g in points if g.method == name and allowed(g)] or [g for g in points if g.method == name]
            best = max(pts, key=lambda g: (g.accuracy, g.p_answer, -g.k))
            prune[name] = PruneChoice(best.k, best.accuracy, {g.k: g.accuracy for g in pts})
        out[domain] = DomainChoice(betas, prune, tuple(g for g in points if g.method in methods), len(exs))
    return out
