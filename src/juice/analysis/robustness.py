"""Fig. 5: robustness of JuICE, and of JuNE beside it, to |D|, K and (beta+, beta-).

Paper Sec. 4.3 and App. D ("Details on Robustness Study"), docs/protocol.md "Analyses": on World
Capital's test split, vary one hyperparameter at a time, all else fixed:

- (a) the size of the head identification set |D| (paper: 1 to 10), K and the betas fixed;
- (b) the number of heads K per sign (paper: 1 to 30), |D| and the betas fixed;
- (c) (beta+, beta-) over {0, 0.5, ..., 5} x {0, -0.5, ..., -5}, |D| and K fixed, as a heat
  map of the mean accuracy over the three conflict types.

The paper shows JuICE only; here JuICE and JuNE are run side by side on the same items, heads and
betas, since their comparison is the point of the dual run.

Choices (the paper is silent; all written into the outputs):

- D of size n is the first n known items of World Capital's filtered development pool, in the
  pool's seeded order (nested sets; D_4 is `juice reproduce`'s D). Stage 1 is exact (paper Alg. 2);
  its per-prompt results are saved in `<out>/state/units.json`, the file `juice reproduce` uses,
  so the sets share their prompts' scores and an interrupted run resumes.
- Fixed values: |D| = 4, K = 5 (the paper's for small models), and (beta+, beta-) = (2, -1) for
  both methods in sweeps (a) and (b) (a documented fixed choice, the middle of the tuning grid;
  the heat map (c) shows every other choice).
- Items: by default the test items the model knows (Original correct on the clean prompt). The
  paper's Gemma-2b knows about 95% of World Capital, so its unfiltered test split is nearly all
  known items; on a small model the unfiltered split is mostly facts it does not know, which no
  steering toward memory can recover. `split="unfiltered"` uses the unfiltered test split.
- Sizes: `--full` is the paper's grid and every test item; the default is a reduced grid that
  fits minutes on 2 CPU cores (|D| in {1, 2, 3, 4}, whose Stage 1 costs no more than D_4's, K in
  {1, 3, 5, 10, 20, 30}, betas in steps of 1.0, 8 test items); `--quick` a smoke test. Reduced
  outputs say so in their titles.

Statistics: a cell's accuracy is the mean over the three conflict types; its 95% interval is the
percentile bootstrap over items of each item's mean over types (n = items); per-type intervals
and the paired difference against Original on the same items are reported as well.
"""

from __future__ import annotations

import math
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any


from juice.analysis.common import (
    AnalysisOptions,
    Progress,
    cut,
    no_progress,
    world_capital_items,
    write_outputs,
)
from juice.data.records import CONFLICT_TYPES, ConflictExample
from juice.eval.runner import ItemResult, evaluate, results_from_json, results_to_json
from juice.eval.stats import Interval, bootstrap_interval, paired_difference_interval
from juice.interventions import HeadSelection
from juice.stage1 import ALPHAS_NEGATIVE, ALPHAS_POSITIVE, HeadScores, score_heads, scoring_prompts, select_heads
from juice.io import UnitCheckpoint, settings_key
from juice.methods import REGISTRY, TUNED_STEERINGS, UNSTEERED, MethodInputs, build
from juice.models import LoadedModel
from juice.steering import Steering

METHODS = {m: REGISTRY[m].title for m in TUNED_STEERINGS}
GROUP_SIZE = 12
"""Steering settings evaluated (and checkpointed) together: one batched pass per group."""


def _steps(stop: float, step: float) -> tuple[float, ...]:
    n = int(round(abs(stop) / step))
    return tuple(round(math.copysign(i * step, stop), 6) + 0.0 for i in range(n + 1))


@dataclass(frozen=True)
class RobustnessGrid:
    """What Fig. 5 varies, and the fixed values of the other hyperparameters.

    Attributes:
        d_sizes: sizes |D| of the head identification set, sweep (a).
        ks: heads per sign K, sweep (b).
        beta_plus, beta_minus: the heat map's axes, sweep (c).
        test_items: test items evaluated (None: all).
        label: "paper" (the paper's grid), "reduced" (the default) or "quick".
        fixed_d, fixed_k: |D| and K wherever they are not varied.
        fixed_beta_plus, fixed_beta_minus: the betas of sweeps (a) and (b).

    Raises:
        ValueError: an empty axis, a size below 1, a positive beta- or a negative beta+.
    """

    d_sizes: tuple[int, ...]
    ks: tuple[int, ...]
    beta_plus: tuple[float, ...]
    beta_minus: tuple[float, ...]
    test_items: int | None
    label: str
    fixed_d: int = 4
    fixed_k: int = 5
    fixed_beta_plus: float = 2.0
    fixed_beta_minus: float = -1.0

    def __post_init__(self) -> None:
        for name in ("d_sizes", "ks", "beta_plus", "beta_minus"):
            if not getattr(self, name):
                raise ValueError(f"the robustness grid needs at least one value of {name}")
        if min(self.d_sizes) < 1 or min(self.ks) < 1 or self.fixed_d < 1 or self.fixed_k < 1:
            raise ValueError("|D| and K must be at least 1")
        if min(self.beta_plus) < 0 or max(self.beta_minus) > 0 or self.fixed_beta_plus < 0 or self.fixed_beta_minus > 0:
            raise ValueError("beta+ must be >= 0 and beta- <= 0 (paper Alg. 1)")
        if self.test_items is not None and self.test_items < 1:
            raise ValueError(f"test_items must be at least 1 (or None for all), got {self.test_items}")

    def to_json(self) -> dict[str, Any]:
        return dict(self.__dict__)


PAPER_GRID = RobustnessGrid(tuple(range(1, 11)), tuple(range(1, 31)), _steps(5, 0.5), _steps(-5, 0.5), None, "paper")
"""The paper's App. D grid: |D| 1..10, K 1..30, betas in steps of 0.5, every test item."""
REDUCED_GRID = RobustnessGrid((1, 2, 3, 4), (1, 3, 5, 10, 20, 30), _steps(5, 1.0), _steps(-5, 1.0), 8, "reduced")
"""The default: minutes on 2 CPU cores (module docstring)."""
QUICK_GRID = RobustnessGrid((1, 2), (1, 3), (0.0, 2.0), (0.0, -2.0), 3, "quick", fixed_d=2, fixed_k=3)
"""`--quick`: a smoke test."""


def robustness_grid(options: AnalysisOptions) -> RobustnessGrid:
    """The grid of the options' mode: quick, reduced (default) or the paper's (`full`)."""
    return QUICK_GRID if options.quick else PAPER_GRID if options.full else REDUCED_GRID


@dataclass(frozen=True)
class Setting:
    """One steering setting of a sweep (a typed grid point)."""

    method: str            # a head steering's registry name (:data:`METHODS`)
    d: int
    k: int
    beta_plus: float
    beta_minus: float

    @property
    def title(self) -> str:
        return METHODS[self.method]


@dataclass
class SweepCell:
    """One evaluated point of a sweep.

    Attributes:
        sweep: "d" (a), "k" (b) or "betas" (c); "original" for the unsteered model.
        setting: the steering setting (None for Original).
        accuracy: mean over conflict types of exact-match accuracy, a fraction, with its 95%
            bootstrap interval over items (n = items).
        per_type: conflict type -> accuracy interval (n = items).
        vs_original: paired difference of `accuracy` against Original on the same items.
    """

    sweep: str
    setting: Setting | None
    accuracy: Interval
    per_type: dict[str, Interval]
    vs_original: Interval | None = None

    def to_json(self) -> dict[str, Any]:
        return {"sweep": self.sweep, "setting": None if self.setting is None else dict(self.setting.__dict__),
                "accuracy": self.accuracy.to_json(), "per_type": {t: iv.to_json() for t, iv in self.per_type.items()},
                "vs_original": None if self.vs_original is None else self.vs_original.to_json()}


@dataclass
class RobustnessResult:
    """What :func:`run_robustness` returns; `robustness.json` holds the same.

    Attributes:
        title: one line, with the grid's label.
        files: JSON, Markdown, PNG written.
        wall_s: seconds (model loading excluded).
        grid: the grid run.
        split: "known" or "unfiltered" test items.
        subjects: the test items' subjects, in order.
        heads: |D| -> the head selection at K = max(ks) (positive and negative, best first; a
            smaller K takes its first K).
        original: Original's cell.
        cells: every steered cell of the three sweeps.
        summary: per method, over the heat map: mean, min and max accuracy, the share of cells
            above Original with a paired interval excluding 0, and the best cell.
        notes: anything the reader must know (e.g. fewer heads than K passed the filter).
    """

    title: str
    files: list[Path]
    wall_s: float
    grid: RobustnessGrid
    split: str
    subjects: list[str]
    heads: dict[int, HeadSelection]
    original: SweepCell
    cells: list[SweepCell]
    summary: dict[str, dict[str, Any]] = field(default_factory=dict)
    notes: list[str] = field(default_factory=list)

    def sweep(self, name: str, method: str) -> list[SweepCell]:
        """The cells of one sweep ("d", "k", "betas") and method ("juice", "june"), in grid order."""
        return [c for c in self.cells if c.sweep == name and c.setting.method == method]

    def to_json(self) -> dict[str, Any]:
        return {"title": self.title, "wall_s": self.wall_s, "grid": self.grid.to_json(), "split": self.split,
                "subjects": self.subjects,
                "heads": {str(d): {"positive": [str(h) for h in s.positive], "negative": [str(h) for h in s.negative]}
                          for d, s in self.heads.items()},
                "original": self.original.to_json(), "cells": [c.to_json() for c in self.cells],
                "summary": self.summary, "notes": self.notes}


# ---------------------------------------------------------------- heads


def heads_by_size(lm: LoadedModel, known: Sequence[ConflictExample], sizes: Sequence[int], k: int,
                  checkpoint: UnitCheckpoint | None, max_rows: int | str = "auto",
                  progress: Progress = no_progress) -> dict[int, HeadSelection]:
    """Exact Stage 1 (paper Alg. 2, 3) on the nested sets D_n = `known[:n]` for each n in `sizes`.

    Each item's three prompts are scored once (scores add up over D), and read back from
    `checkpoint` when present.

    Returns:
        n -> the top-`k` heads per sign on D_n (fewer where fewer pass the consistency filter).

    Raises:
        ValueError: fewer known items than the largest size.
    """
    largest = max(sizes)
    if len(known) < largest:
        raise ValueError(f"|D| = {largest} needs {largest} known World Capital items; the model knows {len(known)}")
    advance = progress(f"stage 1: exact head scores on D_1 .. D_{largest}", 3 * largest)
    per_item: list[HeadScores] = []
    for ex in known[:largest]:
        per_item.append(score_heads(lm, scoring_prompts(lm, [ex]), ALPHAS_POSITIVE, ALPHAS_NEGATIVE,
                                    max_rows=max_rows, on_progress=advance, checkpoint=checkpoint))
    out = {}
    for n in sorted(set(sizes)):
        first = per_item[0]
        total = HeadScores(sum(s.scores for s in per_item[:n]), first.alphas, first.n_positive,
                           first.conflict_types, first.clean_probs, first.scored)
        out[n] = select_heads(total, k)
    return out


def _top(selection: HeadSelection, k: int) -> HeadSelection:
    return HeadSelection(selection.positive[:k], selection.negative[:k])


# ---------------------------------------------------------------- evaluation


def _steering_key(steering: Steering) -> str:
    """Settings whose steering is the same (same method and coefficients) are decoded once."""
    coefficients = None if steering.coefficients is None else steering.coefficients.tolist()
    return settings_key({"kind": steering.kind, "coefficients": coefficients})


def evaluate_settings(lm: LoadedModel, items: Sequence[ConflictExample], steerings: dict[str, Steering],
                      checkpoint: UnitCheckpoint | None, max_rows: int | str = "auto",
                      progress: Progress = no_progress) -> dict[str, list[ItemResult]]:
    """Decode every item x conflict type under every steering, GROUP_SIZE steerings per batched
    pass (:func:`juice.eval.runner.evaluate`: each prompt's clean prefill is shared), each group's
    results saved to `checkpoint` as soon as it is done.

    Returns:
        name -> its results (items x conflict types).
    """
    names = list(steerings)
    items_key = [ex.to_json() for ex in items]
    todo, out = [], {}
    for name in names:
        unit = UnitCheckpoint.unit_id("robustness-eval", _steering_key(steerings[name]), items_key)
        saved = checkpoint.get(unit) if checkpoint else None
        if saved is not None:
            out[name] = results_from_json(saved)
        else:
            todo.append((name, unit))
    advance = progress(f"decode {len(todo)} steering settings x {len(items)} items x 3 conflict types",
                       len(todo) * len(items) * len(CONFLICT_TYPES))
    for start in range(0, len(todo), GROUP_SIZE):
        group = todo[start:start + GROUP_SIZE]
        results = evaluate(lm, items, {name: steerings[name] for name, _ in group}, max_rows=max_rows,
                           on_progress=advance)
        for name, unit in group:
            mine = [r for r in results if r.method == name]
            out[name] = mine
            if checkpoint:
                checkpoint.put(unit, results_to_json(mine))
    return {name: out[name] for name in names}


def _item_means(results: Sequence[ItemResult], items: Sequence[str]) -> list[float]:
    """Each item's accuracy over its conflict types, in the order of `items` (item ids)."""
    by_item: dict[str, list[bool]] = {s: [] for s in items}
    for r in results:
        by_item[r.item_key[1]].append(r.correct)
    return [sum(v) / len(v) for v in by_item.values()]


def cell_of(sweep: str, setting: Setting | None, results: Sequence[ItemResult], subjects: Sequence[str],
            original: Sequence[ItemResult] | None, resamples: int = 2000, seed: int = 0) -> SweepCell:
    """A sweep cell's intervals from its item results (module docstring, "Statistics")."""
    boot = dict(resamples=resamples, seed=seed)
    means = _item_means(results, subjects)
    per_type = {t: bootstrap_interval([r.correct for r in results if r.conflict_type == t], **boot)
                for t in CONFLICT_TYPES}
    diff = None
    if original is not None:
        diff = paired_difference_interval(means, _item_means(original, subjects), **boot)
    return SweepCell(sweep, setting, bootstrap_interval(means, **boot), per_type, diff)


# ---------------------------------------------------------------- the study


def sweep_settings(grid: RobustnessGrid) -> list[tuple[str, Setting]]:
    """Every (sweep, setting) of the three sweeps, for both methods."""
    out = []
    for m in METHODS:
        out += [("d", Setting(m, d, grid.fixed_k, grid.fixed_beta_plus, grid.fixed_beta_minus)) for d in grid.d_sizes]
        out += [("k", Setting(m, grid.fixed_d, k, grid.fixed_beta_plus, grid.fixed_beta_minus)) for k in grid.ks]
        out += [("betas", Setting(m, grid.fixed_d, grid.fixed_k, bp, bm))
                for bp in grid.beta_plus for bm in grid.beta_minus]
    return out


def run_robustness(lm: LoadedModel, options: AnalysisOptions, progress: Progress = no_progress, *,
                   grid: RobustnessGrid | None = None, split: str = "known") -> RobustnessResult:
    """Fig. 5 for JuICE and JuNE (module docstring); writes `robustness.json`, `.md`, `.png` to
    `options.out`.

    Args:
        grid: what to vary; default :func:`robustness_grid` of the options' mode.
        split: "known" (test items the model knows; default) or "unfiltered" (the test split).

    Raises:
        ValueError: a bad split; fewer known development items than the largest |D|; no test item.
    """
    if split not in ("known", "unfiltered"):
        raise ValueError(f"split must be 'known' or 'unfiltered', not {split!r}")
    start = time.perf_counter()
    grid = grid or robustness_grid(options)
    items = world_capital_items(lm, options, progress)
    test = cut(items.test_known if split == "known" else items.test, grid.test_items)
    if not test:
        raise ValueError(f"no World Capital test item in the {split} split (the model knows none)")
    units = UnitCheckpoint(options.state.folder / "units.json", lm.fingerprint())
    largest_k = max(*grid.ks, grid.fixed_k)
    heads = heads_by_size(lm, items.known, sorted({*grid.d_sizes, grid.fixed_d}), largest_k, units,
                          options.max_rows, progress)
    notes = []
    for d, sel in heads.items():
        if len(sel.positive) < largest_k or len(sel.negative) < largest_k:
            notes.append(f"|D| = {d}: only {len(sel.positive)} positive / {len(sel.negative)} negative heads pass "
                         f"the consistency filter; a larger K steers those")

    g = lm.geometry
    plan = sweep_settings(grid)
    steerings: dict[str, Steering] = {UNSTEERED: Steering()}
    name_of: dict[Setting, str] = {}
    for _, s in plan:
        steering = build(s.method, MethodInputs(g, _top(heads[s.d], s.k), beta_plus=s.beta_plus,
                                                beta_minus=s.beta_minus)).method.steering
        name_of[s] = _steering_key(steering)
        steerings.setdefault(name_of[s], steering)
    results = evaluate_settings(lm, test, steerings, units, options.max_rows, progress)

    subjects = [ex.subject for ex in test]
    items = [ex.uid for ex in test]
    boot = dict(resamples=options.bootstrap_resamples, seed=options.seed)
    original = cell_of("original", None, results[UNSTEERED], items, None, **boot)
    cells = [cell_of(sweep, s, results[name_of[s]], items, results[UNSTEERED], **boot) for sweep, s in plan]
    result = RobustnessResult(
        title=f"Fig. 5: robustness of JuICE and JuNE to |D|, K and (beta+, beta-) on World Capital "
              f"({grid.label} grid{'' if grid.label == 'paper' else ', not the paper size'})",
        files=[], wall_s=0.0, grid=grid, split=split, subjects=subjects, heads=heads, original=original,
        cells=cells, notes=notes)
    result.summary = heat_map_summary(result)
    result.wall_s = time.perf_counter() - start
    result.files = write_outputs(options.out, "robustness", {**result.to_json(), "model": lm.fingerprint(),
                                                               "options": options.to_json()},
                                 robustness_markdown(result, lm.name), robustness_figure(result, lm.name))
    return result


def heat_map_summary(result: RobustnessResult) -> dict[str, dict[str, Any]]:
    """Per method, over the heat map's cells: mean, min and max accuracy (fractions), the share
    of cells whose paired interval against Original lies above 0, and the best cell."""
    out = {}
    for m, title in METHODS.items():
        cells = result.sweep("betas", m)
        accs = [c.accuracy.mean for c in cells]
        best = max(cells, key=lambda c: c.accuracy.mean)
        out[title] = {"cells": len(cells), "mean": sum(accs) / len(accs), "min": min(accs), "max": max(accs),
                      "share_above_original": sum(c.vs_original.low > 1e-9 for c in cells) / len(cells),
                      "best": {"beta_plus": best.setting.beta_plus, "beta_minus": best.setting.beta_minus,
                               "accuracy": best.accuracy.to_json()}}
    return out


# ---------------------------------------------------------------- outputs


def _pct(iv: Interval) -> str:
    return iv.format()


def robustness_markdown(result: RobustnessResult, model_name: str) -> str:
    """The numbers behind the figure: the |D| and K sweeps (mean over types and per type, with
    intervals), both heat maps, and the summary."""
    g = result.grid
    n = len(result.subjects)
    lines = [f"# {result.title}\n",
             f"Model {model_name}; {n} World Capital test items ({'the model knows them' if result.split == 'known' else 'unfiltered'}); "
             f"accuracy (%) = exact match averaged over the three conflict types, ± the half-width of the 95% "
             f"bootstrap interval over items (n = {n} items, {3 * n} prompts per cell). Fixed: |D| = {g.fixed_d}, "
             f"K = {g.fixed_k}, (beta+, beta-) = ({g.fixed_beta_plus:g}, {g.fixed_beta_minus:g}) where not varied. "
             f"Original: {_pct(result.original.accuracy)} (clean {_pct(result.original.per_type['clean'])}, "
             f"substitution {_pct(result.original.per_type['substitution'])}, coherent "
             f"{_pct(result.original.per_type['coherent'])}).\n"]
    for sweep, label in (("d", "|D|"), ("k", "K")):
        title = "(a) head identification set size |D|" if sweep == "d" else "(b) heads per sign K"
        lines += [f"## {title}\n",
                  f"| {label} | " + " | ".join(f"{t} | {t} 1 / 2 / 3 | {t} - Original" for t in METHODS.values()) + " |",
                  "|---" * (1 + 3 * len(METHODS)) + "|"]
        for same in zip(*(result.sweep(sweep, m) for m in METHODS)):
            value = same[0].setting.d if sweep == "d" else same[0].setting.k
            row = [str(value)]
            for c in same:
                row += [_pct(c.accuracy), " / ".join(f"{100 * c.per_type[t].mean:.0f}" for t in CONFLICT_TYPES),
                        _diff(c.vs_original)]
            lines.append("| " + " | ".join(row) + " |")
        lines.append("")
    for m, title in METHODS.items():
        cells = {(c.setting.beta_plus, c.setting.beta_minus): c for c in result.sweep("betas", m)}
        lines += [f"## (c) {title}: mean accuracy over (beta+, beta-)\n",
                  "| beta+ \\ beta- | " + " | ".join(f"{b:g}" for b in g.beta_minus) + " |",
                  "|" + "---|" * (len(g.beta_minus) + 1)]
        for bp in g.beta_plus:
            lines.append(f"| {bp:g} | " + " | ".join(_pct(cells[(bp, bm)].accuracy) for bm in g.beta_minus) + " |")
        s = result.summary[title]
        lines.append(f"\n{title} over the {s['cells']} cells: mean {100 * s['mean']:.1f}%, range "
                     f"{100 * s['min']:.1f}-{100 * s['max']:.1f}%; {100 * s['share_above_original']:.0f}% of cells "
                     f"above Original (paired interval excluding 0); best ({s['best']['beta_plus']:g}, "
                     f"{s['best']['beta_minus']:g}) at {100 * s['best']['accuracy']['mean']:.1f}%.\n")
    lines.append("Heads (exact Stage 1, K = the largest K): " + "; ".join(
        f"|D| = {d}: + {', '.join(map(str, s.positive[:g.fixed_k]))}; - {', '.join(map(str, s.negative[:g.fixed_k]))}"
        for d, s in result.heads.items()) + f" (first {g.fixed_k} shown).\n")
    lines += [f"Note: {note}\n" for note in result.notes]
    lines.append(f"Wall time {result.wall_s:.0f} s (model loading excluded).")
    return "\n".join(lines)


def _diff(iv: Interval | None) -> str:
    if iv is None or not iv.n:
        return "-"
    mark = "*" if iv.low > 1e-9 or iv.high < -1e-9 else ""
    return f"{100 * iv.mean:+.1f} [{100 * iv.low:+.1f}, {100 * iv.high:+.1f}]{mark}"


def robustness_figure(result: RobustnessResult, model_name: str):
    """Four panels: accuracy against |D| and against K (both methods, Original dashed, shaded
    95% intervals), and one heat map per method on a shared colour scale."""
    from matplotlib.figure import Figure

    g = result.grid
    fig = Figure(figsize=(12, 9.5))
    axes = fig.subplots(2, 2)
    colors = dict(zip(METHODS, ("tab:blue", "tab:orange", "tab:green")))
    orig = result.original.accuracy
    for ax, sweep, label in ((axes[0, 0], "d", "|D| (head identification set size)"),
                             (axes[0, 1], "k", "K (heads per sign)")):
        for m, title in METHODS.items():
            cells = result.sweep(sweep, m)
            xs = [c.setting.d if sweep == "d" else c.setting.k for c in cells]
            ax.plot(xs, [100 * c.accuracy.mean for c in cells], "o-", color=colors[m], label=title)
            ax.fill_between(xs, [100 * c.accuracy.low for c in cells], [100 * c.accuracy.high for c in cells],
                            color=colors[m], alpha=0.15)
        ax.axhline(100 * orig.mean, color="gray", ls="--", label="Original")
        ax.set_xlabel(label)
        ax.set_ylabel("mean accuracy over conflict types (%)")
        ax.set_ylim(0, 100)
        ax.legend(fontsize=8)
        ax.grid(alpha=0.3)
    for ax, (m, title) in zip(axes[1], METHODS.items()):
        cells = {(c.setting.beta_plus, c.setting.beta_minus): c.accuracy.mean for c in result.sweep("betas", m)}
        data = [[100 * cells[(bp, bm)] for bm in g.beta_minus] for bp in g.beta_plus]
        im = ax.imshow(data, origin="lower", vmin=0, vmax=100, cmap="viridis", aspect="auto")
        ax.set_xticks(range(len(g.beta_minus)), [f"{b:g}" for b in g.beta_minus], fontsize=7)
        ax.set_yticks(range(len(g.beta_plus)), [f"{b:g}" for b in g.beta_plus], fontsize=7)
        ax.set_xlabel("beta-")
        ax.set_ylabel("beta+")
        ax.set_title(f"(c) {title}", fontsize=10)
        if len(g.beta_plus) * len(g.beta_minus) <= 49:
            for i, row in enumerate(data):
                for j, v in enumerate(row):
                    ax.text(j, i, f"{v:.0f}", ha="center", va="center", fontsize=7,
                            color="white" if v < 50 else "black")
        fig.colorbar(im, ax=ax, label="mean accuracy (%)")
    axes[0, 0].set_title("(a) |D|", fontsize=10)
    axes[0, 1].set_title("(b) K", fontsize=10)
    n = len(result.subjects)
    fig.suptitle(f"{model_name}: {result.title}\nWorld Capital, n = {n} test items "
                 f"({'known' if result.split == 'known' else 'unfiltered'}); shaded: 95% bootstrap intervals; "
                 f"fixed |D| = {g.fixed_d}, K = {g.fixed_k}, betas ({g.fixed_beta_plus:g}, {g.fixed_beta_minus:g})",
                 fontsize=9)
    fig.tight_layout()
    return fig


__all__ = ["PAPER_GRID", "QUICK_GRID", "REDUCED_GRID", "RobustnessGrid", "RobustnessResult", "Setting", "SweepCell",
           "heads_by_size", "robustness_grid", "run_robustness"]
