"""The superposition table (paper Sec. 3.1, Table "top 4 heads"; App. D).

Each attention head is knocked out alone (`H <- 0`, i.e. scaled by alpha = -1) on the
substitution and the coherent prompt of every filtered World Capital item. Heads are ranked by
the mean gain of the context answer's first-token probability on substitution conflicts (the
"memory heads" of Jin et al. 2024: knocking them out promotes the context); the table reports the
top 4 heads' mean change of the context and of the parametric probability on substitution and on
coherent conflicts. Colours as in the paper: green is the desired behaviour (context up, parametric
down), red the undesired one. The paper finds, on Gemma-2b, that half of the top 4 turn red on
coherent conflicts: L9H3 and L13H5 there raise the parametric answer.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import torch

from juice.analysis.common import (
    AnalysisOptions,
    Progress,
    cut,
    no_progress,
    unit_checkpoint,
    world_capital_items,
    write_outputs,
)
from juice.analysis.knockout import head_knockout_deltas
from juice.eval.stats import Interval, bootstrap_interval
from juice.interventions import Head
from juice.models import LoadedModel

TYPES: tuple[str, ...] = ("substitution", "coherent")
ANSWERS: tuple[str, ...] = ("context", "parametric")
TOP = 4
SIZES = {"default": 16, "quick": 3, "full": None}
"""Filtered World Capital items per mode (`--full`: all of them). One item costs about 20-35 s on 2
busy CPU cores."""
PAPER_TABLE = {
    "L8H0": {"substitution": (0.18, -0.03), "coherent": (0.04, -0.03)},
    "L15H6": {"substitution": (0.16, -0.04), "coherent": (0.08, -0.04)},
    "L9H3": {"substitution": (0.13, -0.08), "coherent": (-0.17, 0.09)},
    "L13H5": {"substitution": (0.11, -0.03), "coherent": (-0.13, 0.07)},
}
"""The paper's table on Gemma-2b: head -> type -> (change of context prob, of parametric prob)."""
GREEN, RED = "#c8f0c8", "#f5c6c6"


def rank_heads(mean_gain: torch.Tensor | np.ndarray) -> list[Head]:
    """Heads sorted by `mean_gain` (`[n_layers, n_heads]`), largest first (ties: lower index first)."""
    gain = np.asarray(mean_gain, dtype=np.float64)
    n_heads = gain.shape[-1]
    order = sorted(range(gain.size), key=lambda i: (-gain.flat[i], i))
    return [Head(i // n_heads, i % n_heads) for i in order]


def desired(answer: str, change: float) -> bool:
    """Green in the paper's table: the context answer's probability up, the parametric one's down."""
    return change > 0 if answer == "context" else change < 0


@dataclass
class SuperpositionResult:
    """The superposition table's numbers.

    Attributes:
        deltas: `[n_items, 2 types, 2 answers, n_layers, n_heads]` change of the first-token
            probability when the head is knocked out (types: TYPES, answers: ANSWERS).
        clean_probs: `[n_items, 2 types, 2 answers]`.
        ranking: every head, by mean context gain on substitution conflicts.
        top: the TOP heads, each with type -> answer -> 95% bootstrap interval of the mean change.
        flipped: the top heads whose coherent-conflict effect is undesired for both answers.
    """

    title: str
    model: dict[str, Any]
    subjects: list[str]
    deltas: np.ndarray
    clean_probs: np.ndarray
    ranking: list[Head]
    top: list[tuple[Head, dict[str, dict[str, Interval]]]]
    flipped: list[Head]
    items: dict[str, int]
    options: dict[str, Any]
    files: list[Path] = field(default_factory=list)
    wall_s: float = 0.0

    def to_json(self) -> dict[str, Any]:
        mean = self.deltas.mean(0)
        return {
            "title": self.title,
            "source": "paper Sec. 3.1 (superposition table, Observation 1); App. D",
            "model": self.model,
            "options": self.options,
            "n_items": len(self.subjects),
            "items": self.items,
            "subjects": self.subjects,
            "conflict_types": list(TYPES),
            "answers": list(ANSWERS),
            "clean_prob_mean": {t: {a: float(self.clean_probs[:, j, k].mean()) for k, a in enumerate(ANSWERS)}
                                for j, t in enumerate(TYPES)},
            "top": [{"head": str(h), **{t: {a: {**iv.to_json(), "desired": desired(a, iv.mean)}
                                            for a, iv in cells.items()} for t, cells in per.items()}}
                    for h, per in self.top],
            "flipped_on_coherent": [str(h) for h in self.flipped],
            "ranking": [str(h) for h in self.ranking],
            "mean_change": {t: {a: mean[j, k].round(6).tolist() for k, a in enumerate(ANSWERS)}
                            for j, t in enumerate(TYPES)},
            "paper_gemma_2b": PAPER_TABLE,
            "wall_s": self.wall_s,
        }


def superposition_markdown(result: SuperpositionResult) -> str:
    mark = {True: "🟩", False: "🟥"}
    lines = [f"# {result.title}\n",
             f"Model {result.model.get('name')}; filtered World Capital, n = {len(result.subjects)} items. Heads "
             "ranked by the mean gain of the context answer's first-token probability when knocked out alone on "
             "substitution conflicts. Cell: mean change of the first-token probability, ± half-width of the 95% "
             "bootstrap interval. 🟩 desired (context up, parametric down), 🟥 undesired (the paper's colours).\n",
             "| Head | Subs ΔContext | Subs ΔPara | Coh ΔContext | Coh ΔPara |", "|---|---|---|---|---|"]
    for head, per in result.top:
        cells = [f"{mark[desired(a, per[t][a].mean)]} {per[t][a].mean:+.3f} ±{per[t][a].half_width:.3f}"
                 for t in TYPES for a in ANSWERS]
        lines.append(f"| {head} | " + " | ".join(cells) + " |")
    lines += ["", f"Top-{len(result.top)} heads whose knock-out turns undesired on coherent conflicts (both answers): "
              f"{len(result.flipped)} ({', '.join(map(str, result.flipped)) or 'none'}); the paper (Gemma-2b): 2 of 4.",
              "", "Clean probabilities (mean over items): " + "; ".join(
                  f"{t}: context {result.clean_probs[:, j, 0].mean():.3f}, parametric {result.clean_probs[:, j, 1].mean():.3f}"
                  for j, t in enumerate(TYPES)),
              "", "## The paper's table (Gemma-2b)\n", "| Head | Subs ΔContext | Subs ΔPara | Coh ΔContext | Coh ΔPara |",
              "|---|---|---|---|---|"]
    for head, per in PAPER_TABLE.items():
        lines.append(f"| {head} | " + " | ".join(f"{v:+.2f}" for t in TYPES for v in per[t]) + " |")
    return "\n".join(lines) + "\n"


def superposition_figure(result: SuperpositionResult):
    """The table as a figure, cells coloured as the paper's (green desired, red undesired)."""
    from matplotlib.figure import Figure

    fig = Figure(figsize=(8, 0.6 + 0.45 * (len(result.top) + 1)))
    ax = fig.add_subplot()
    ax.axis("off")
    text, colours = [], []
    for head, per in result.top:
        text.append([str(head)] + [f"{per[t][a].mean:+.3f} ±{per[t][a].half_width:.3f}" for t in TYPES for a in ANSWERS])
        colours.append(["white"] + [GREEN if desired(a, per[t][a].mean) else RED for t in TYPES for a in ANSWERS])
    table = ax.table(cellText=text, cellColours=colours, loc="center", cellLoc="center",
                     colLabels=["Head", "Subs ΔContext", "Subs ΔPara", "Coh ΔContext", "Coh ΔPara"])
    table.scale(1, 1.4)
    ax.set_title(f"{result.model.get('name', '')}: top {len(result.top)} heads by context gain under knock-out "
                 f"(substitution); n = {len(result.subjects)} items, ± 95% bootstrap half-width", fontsize=9)
    fig.tight_layout()
    return fig


def run_superposition(lm: LoadedModel, options: AnalysisOptions, progress: Progress = no_progress,
                      n_items: int | None | str = "mode", top: int = TOP) -> SuperpositionResult:
    """The superposition table: top `top` heads by context-probability gain under knock-out on
    substitution conflicts, with their changes on substitution and coherent conflicts; writes
    `superposition.json`, `.md` and `.png` to `options.out`.

    Raises:
        ValueError: no filtered item; `top` < 1.
    """
    if top < 1:
        raise ValueError(f"top must be at least 1, got {top}")
    start = time.perf_counter()
    items_all = world_capital_items(lm, options, progress)
    items = cut(items_all.filtered, SIZES[options.mode] if n_items == "mode" else n_items)
    if not items:
        raise ValueError("no World Capital item the model answers correctly on the clean prompt")
    advance = progress(f"superposition: knock out each head, {len(items)} items x {len(TYPES)} types",
                       len(items) * len(TYPES))
    deltas, clean = head_knockout_deltas(lm, items, TYPES, max_rows=options.max_rows,
                                         checkpoint=unit_checkpoint(lm, options, "head_knockout"),
                                         on_progress=advance)
    deltas, clean = deltas.numpy(), clean.numpy()
    ranking = rank_heads(deltas[:, 0, 0].mean(0))
    boot = dict(resamples=options.bootstrap_resamples, seed=options.seed)
    rows = [(h, {t: {a: bootstrap_interval(deltas[:, j, k, h.layer, h.head], **boot) for k, a in enumerate(ANSWERS)}
                 for j, t in enumerate(TYPES)}) for h in ranking[:top]]
    flipped = [h for h, per in rows if not any(desired(a, per["coherent"][a].mean) for a in ANSWERS)]
    result = SuperpositionResult(
        title="Superposition: top heads by context gain under knock-out (substitution) and their coherent effect",
        model=lm.fingerprint(), subjects=[ex.subject for ex in items], deltas=deltas, clean_probs=clean,
        ranking=ranking, top=rows, flipped=flipped, items={**items_all.counts, "used": len(items)},
        options=options.to_json(),
    )
    result.wall_s = time.perf_counter() - start
    result.files = write_outputs(options.out, "superposition", result.to_json(), superposition_markdown(result),
                                 superposition_figure(result))
    return result


__all__ = ["PAPER_TABLE", "SuperpositionResult", "rank_heads", "run_superposition"]
