"""Table 3 and Fig. 6 (paper Sec. 3.1 Observation 2; Sec. 4.4 "Effect of running twice"; App. D):
several individually helpful knock-outs together.

On a small held-in part of filtered World Capital, every head is knocked out alone on the
coherent prompt and ranked by the mean gain of the parametric answer's first-token probability;
only heads with a positive mean gain are kept ("individually effective"). On the held-out rest,
the top n heads are knocked out together, for each n in NS, two ways:

- *run once* (JuNE-style, PH3's pruning): the live outputs of the n heads are scaled in one
  forward, `H <- H + (-1) H = 0`; a later head sees a residual stream already changed by the
  earlier knock-outs (paper Alg. 4 with beta = -1);
- *run twice* (JuICE-style): run 1 is the unmodified model; run 2 adds -1 times run 1's outputs
  of the n heads, `H <- H - H_run1` (paper Alg. 1 with beta = -1), so each head's change is fixed
  by the clean run.

With one head both are the same forward (the head's live output equals its run-1 output, since
nothing before it changed); they differ from the second intervened head on (tested). Table 3
reports the target probability (the parametric answer's first token under coherent conflicts)
for None and the top 1, 3, 10 heads run once (Gemma-2b: 0.03, 0.12, 0.24 at top 3, 0.14 at top
10); Fig. 6 plots both ways against n.

Batched: one forward per held-out prompt holds the clean row (run 1), one run-once row and one
run-twice row per n (:class:`juice.interventions.RowPlan`: a run-twice row adds its clean row's
head outputs).
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch import Tensor

from juice.analysis.common import (
    AnalysisOptions,
    Progress,
    no_progress,
    unit_checkpoint,
    world_capital_items,
    write_outputs,
)
from juice.analysis.knockout import head_knockout_deltas
from juice.analysis.superposition import rank_heads
from juice.budget import resolve_max_rows
from juice.data.records import ConflictExample
from juice.eval.stats import Interval, bootstrap_interval, paired_difference_interval
from juice.interventions import (
    Head,
    RowPlan,
    head_coefficients,
    planned_rows,
)
from juice.io import UnitCheckpoint
from juice.models import LoadedModel
from juice.tokens import answer_first_token, encode

NS: tuple[int, ...] = (1, 2, 3, 4, 5, 6, 8, 10, 15, 20)
"""Numbers of top heads intervened together (capped at the number of individually helpful heads)."""
CONFLICT_TYPE = "coherent"
PAPER_TABLE3 = {0: 0.03, 1: 0.12, 3: 0.24, 10: 0.14}
"""Table 3 on Gemma-2b: top n heads knocked out together (run once) -> target probability."""
SIZES = {"default": (8, 24), "quick": (2, 2), "full": (None, None)}
"""(held-in, held-out) items per mode; `--full`: a fifth of the filtered items (at least 5) held in,
the rest held out."""
HELD_IN_FRACTION = 0.2


def cumulative_plan(geometry, ranked: Sequence[Head], ns: Sequence[int], alpha: float = -1.0) -> RowPlan:
    """Rows of one batched forward: row 0 clean, then one run-once row per n (scale the top n by
    `alpha`), then one run-twice row per n (add `alpha` times row 0's outputs of the top n).

    Returns:
        A :class:`RowPlan` of `1 + 2 len(ns)` rows, tensors `[rows, n_layers, n_heads]`.

    Raises:
        ValueError: an n < 1 or larger than `len(ranked)`.
    """
    if any(n < 1 or n > len(ranked) for n in ns):
        raise ValueError(f"every n must lie in 1..{len(ranked)} (the ranked heads), got {list(ns)}")
    rows = 1 + 2 * len(ns)
    scale = torch.zeros(rows, geometry.n_layers, geometry.n_heads)
    add = torch.zeros_like(scale)
    source = torch.full((rows,), -1, dtype=torch.long)
    for i, n in enumerate(ns):
        coefficients = head_coefficients(geometry, {h: alpha for h in ranked[:n]})
        scale[1 + i] = coefficients
        add[1 + len(ns) + i] = coefficients
        source[1 + len(ns) + i] = 0
    return RowPlan(scale, add, source)


@torch.inference_mode()
def cumulative_probs(
    lm: LoadedModel, prompt: str, token: int, ranked: Sequence[Head], ns: Sequence[int],
    max_rows: int | str = 256, alpha: float = -1.0,
) -> tuple[float, Tensor, Tensor]:
    """Probability of `token` at the last position with the top n of `ranked` intervened together,
    run once and run twice, for every n in `ns` (module docstring); batched.

    Args:
        token: the target token (the parametric answer's first token).
        ranked: heads, best first.
        alpha: the scale (-1: knock-out).
        max_rows: most rows per forward (at least 3: a clean row and both ways of one n), or "auto".

    Returns:
        (clean probability, run once `[len(ns)]`, run twice `[len(ns)]`).
    """
    ids = encode(lm.tokenizer, [prompt]).input_ids.to(lm.device)
    max_rows = max(3, resolve_max_rows(max_rows, lm, ids.shape[1]))
    per_chunk = max(1, (max_rows - 1) // 2)
    once, twice, clean = [], [], 0.0
    for start in range(0, len(ns), per_chunk):
        chunk = list(ns[start:start + per_chunk])
        plan = cumulative_plan(lm.geometry, ranked, chunk, alpha)
        rows = plan.source.shape[0]
        with planned_rows(lm.heads, plan):
            hidden = lm.model.base_model(input_ids=ids.expand(rows, -1), use_cache=False).last_hidden_state[:, -1]
        p = lm.logits(hidden).float().softmax(-1)[:, token].cpu()
        clean = float(p[0])
        once.append(p[1:1 + len(chunk)])
        twice.append(p[1 + len(chunk):])
    return clean, torch.cat(once), torch.cat(twice)


def split_items(items: Sequence[ConflictExample], options: AnalysisOptions) -> tuple[list, list]:
    """(held-in, held-out) parts of the filtered items for the options' mode (SIZES)."""
    held_in, held_out = SIZES[options.mode]
    if held_in is None:
        held_in = min(len(items) - 1, max(5, round(HELD_IN_FRACTION * len(items))))
    held_in = max(0, min(held_in, len(items)))
    rest = list(items[held_in:])
    return list(items[:held_in]), rest if held_out is None else rest[:held_out]


@dataclass
class MultipleResult:
    """Table 3's and Fig. 6's numbers.

    Attributes:
        ranking: the individually helpful heads (mean gain > 0 on the held-in part), best first.
        individual_gain: each ranked head's mean gain on the held-in part.
        ns: the n evaluated (NS capped at len(ranking)).
        clean: `[n_held_out]` target probability of the unmodified model.
        once, twice: `[n_held_out, len(ns)]` target probability, top n run once / run twice.
        intervals: "None" and ("once" | "twice", n) -> 95% bootstrap interval of the mean;
            ("twice - once", n) -> paired interval of the difference.
    """

    title: str
    model: dict[str, Any]
    held_in: list[str]
    held_out: list[str]
    ranking: list[Head]
    individual_gain: list[float]
    ns: list[int]
    clean: np.ndarray
    once: np.ndarray
    twice: np.ndarray
    intervals: dict[str, dict[int, Interval]]
    items: dict[str, int]
    options: dict[str, Any]
    files: list[Path] = field(default_factory=list)
    wall_s: float = 0.0

    def to_json(self) -> dict[str, Any]:
        return {
            "title": self.title,
            "source": "paper Sec. 3.1 (Observation 2), Table 3; Sec. 4.4, Fig. 6; App. D",
            "model": self.model,
            "options": self.options,
            "conflict_type": CONFLICT_TYPE,
            "target": "first token of the parametric answer, last position",
            "items": self.items,
            "held_in": self.held_in,
            "held_out": self.held_out,
            "ranking": [{"head": str(h), "held_in_gain": g} for h, g in zip(self.ranking, self.individual_gain)],
            "ns": self.ns,
            "none": self.intervals["none"][0].to_json(),
            "run_once": {str(n): self.intervals["once"][n].to_json() for n in self.ns},
            "run_twice": {str(n): self.intervals["twice"][n].to_json() for n in self.ns},
            "twice_minus_once": {str(n): self.intervals["twice - once"][n].to_json() for n in self.ns},
            "paper_table3_gemma_2b": {("None" if n == 0 else f"Top {n}"): v for n, v in PAPER_TABLE3.items()},
            "per_item": {"clean": self.clean.round(6).tolist(), "once": self.once.round(6).tolist(),
                         "twice": self.twice.round(6).tolist()},
            "wall_s": self.wall_s,
        }


def multiple_markdown(result: MultipleResult) -> str:
    iv = result.intervals
    n_out = len(result.held_out)
    lines = [f"# {result.title}\n",
             f"Model {result.model.get('name')}; filtered World Capital, coherent conflicts. Heads ranked on "
             f"{len(result.held_in)} held-in items by the mean gain of the parametric answer's first-token probability "
             f"when knocked out alone; {len(result.ranking)} heads gain individually ("
             + ", ".join(f"{h} {g:+.3f}" for h, g in list(zip(result.ranking, result.individual_gain))[:10])
             + (", ..." if len(result.ranking) > 10 else "") + f"). Evaluated on n = {n_out} held-out items. "
             "Cell: mean target probability ± half-width of its 95% bootstrap interval; last column: paired "
             "difference, run twice minus run once (95% paired bootstrap interval).\n",
             "| Intervened heads | Run once (JuNE-style, Table 3) | Run twice (JuICE-style) | Twice - once | Gemma-2b (paper, run once) |",
             "|---|---|---|---|---|",
             f"| None (original model) | {_fmt(iv['none'][0])} | {_fmt(iv['none'][0])} | - | {PAPER_TABLE3[0]:.2f} |"]
    for n in result.ns:
        d = iv["twice - once"][n]
        paper = f"{PAPER_TABLE3[n]:.2f}" if n in PAPER_TABLE3 else ""
        lines.append(f"| Top {n} | {_fmt(iv['once'][n])} | {_fmt(iv['twice'][n])} | {d.mean:+.3f} "
                     f"[{d.low:+.3f}, {d.high:+.3f}] | {paper} |")
    return "\n".join(lines) + "\n"


def _fmt(iv: Interval) -> str:
    return f"{iv.mean:.3f} ±{iv.half_width:.3f}"


def multiple_figure(result: MultipleResult):
    """Fig. 6: mean target probability against the number of heads intervened together, run once
    and run twice, 95% bootstrap intervals shaded, the unmodified model dashed."""
    from matplotlib.figure import Figure

    fig = Figure(figsize=(6.4, 4.2))
    ax = fig.add_subplot()
    ns = np.asarray(result.ns)
    for key, label, colour in (("once", "run once (scale live outputs, JuNE-style)", "tab:red"),
                               ("twice", "run twice (add run-1 outputs, JuICE-style)", "tab:blue")):
        ivs = [result.intervals[key][n] for n in result.ns]
        ax.plot(ns, [i.mean for i in ivs], marker="o", ms=4, color=colour, label=label)
        ax.fill_between(ns, [i.low for i in ivs], [i.high for i in ivs], color=colour, alpha=0.15)
    none = result.intervals["none"][0]
    ax.axhline(none.mean, color="gray", ls="--", label=f"original model ({none.mean:.3f})")
    ax.set_xlabel("top-n individually helpful heads knocked out together")
    ax.set_xticks(ns)
    ax.set_ylabel("P(first token of parametric answer)")
    ax.set_title(f"{result.model.get('name', '')}: coherent conflicts, n = {len(result.held_out)} held-out items\n"
                 "shaded: 95% bootstrap intervals", fontsize=9)
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8)
    fig.tight_layout()
    return fig


def run_multiple(lm: LoadedModel, options: AnalysisOptions, progress: Progress = no_progress,
                 ns: Sequence[int] = NS) -> MultipleResult:
    """Table 3 and Fig. 6 (module docstring); writes `multiple.json`, `.md` and `.png` to
    `options.out`.

    Raises:
        ValueError: fewer than 2 filtered items (one held in, one held out); no head gains
            individually on the held-in part.
    """
    start = time.perf_counter()
    items_all = world_capital_items(lm, options, progress)
    held_in, held_out = split_items(items_all.filtered, options)
    if not held_in or not held_out:
        raise ValueError(f"need at least one held-in and one held-out item; the model knows "
                         f"{len(items_all.filtered)} World Capital items")
    advance = progress(f"rank heads: knock out each head on {len(held_in)} held-in coherent prompts", len(held_in))
    deltas, _ = head_knockout_deltas(lm, held_in, (CONFLICT_TYPE,), max_rows=options.max_rows,
                                     checkpoint=unit_checkpoint(lm, options, "head_knockout"),
                                     on_progress=advance)
    gain = deltas[:, 0, 1].mean(0).numpy()                       # parametric answer, [n_layers, n_heads]
    ranking = [h for h in rank_heads(gain) if gain[h.layer, h.head] > 0]
    if not ranking:
        raise ValueError("no head raises the parametric probability when knocked out alone on the held-in items")
    use = sorted({n for n in ns if n <= len(ranking)} or {len(ranking)})
    checkpoint = unit_checkpoint(lm, options, "multiple")
    advance = progress(f"top-n heads together, run once and twice: {len(held_out)} held-out prompts", len(held_out))
    clean, once, twice = [], [], []
    for ex in held_out:
        prompt = ex.prompts[CONFLICT_TYPE]
        token = answer_first_token(lm.tokenizer, prompt, ex.answer)
        unit = UnitCheckpoint.unit_id("cumulative", prompt, token, [str(h) for h in ranking[: max(use)]], use)
        done = checkpoint.get(unit)
        if done is None:
            p0, p1, p2 = cumulative_probs(lm, prompt, token, ranking, use, options.max_rows)
            done = {"clean": p0, "once": p1.double().tolist(), "twice": p2.double().tolist()}
            checkpoint.put(unit, done)
        clean.append(done["clean"])
        once.append(done["once"])
        twice.append(done["twice"])
        advance(1)
    clean_a, once_a, twice_a = np.asarray(clean), np.asarray(once), np.asarray(twice)
    boot = dict(resamples=options.bootstrap_resamples, seed=options.seed)
    intervals = {
        "none": {0: bootstrap_interval(clean_a, **boot)},
        "once": {n: bootstrap_interval(once_a[:, i], **boot) for i, n in enumerate(use)},
        "twice": {n: bootstrap_interval(twice_a[:, i], **boot) for i, n in enumerate(use)},
        "twice - once": {n: paired_difference_interval(twice_a[:, i], once_a[:, i], **boot) for i, n in enumerate(use)},
    }
    result = MultipleResult(
        title="Table 3 / Fig. 6: top-n individually helpful heads knocked out together, run once vs run twice",
        model=lm.fingerprint(), held_in=[ex.subject for ex in held_in], held_out=[ex.subject for ex in held_out],
        ranking=ranking, individual_gain=[float(gain[h.layer, h.head]) for h in ranking], ns=use,
        clean=clean_a, once=once_a, twice=twice_a, intervals=intervals,
        items={**items_all.counts, "held_in": len(held_in), "held_out": len(held_out)}, options=options.to_json(),
    )
    result.wall_s = time.perf_counter() - start
    result.files = write_outputs(options.out, "multiple", result.to_json(), multiple_markdown(result),
                                 multiple_figure(result))
    return result


__all__ = ["MultipleResult", "NS", "cumulative_plan", "cumulative_probs",
           "run_multiple", "split_items"]
