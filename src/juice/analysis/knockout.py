"""Fig. 3 (paper Sec. 3.1, Observation 1; App. D): knock out one component at a time.

Per layer l, three knock-outs, one at a time:

- *layer*: the whole decoder layer is skipped, its output equals its input (residual stream
  passed through unchanged);
- *attention*: the attention block's contribution to the residual stream is zero (the output of
  the output projection, bias included, is zeroed; for Gemma 2/3 it then passes
  `post_attention_layernorm`, which maps 0 to 0). Equals zeroing the projection's weight and bias
  (tested), and, without a bias, zeroing every head output of the layer;
- *MLP*: the MLP block's output is zero (for Gemma 2/3 it then passes
  `post_feedforward_layernorm`: 0 again).

For each filtered World Capital item and conflict type, the score is the change of the
probability, at the last position, of the parametric answer's first token (App. D: "the first
(correct) token"). The figure shows the mean change per layer with the standard deviation over
items shaded; the table adds 95% bootstrap intervals of the mean. The paper counts, on Gemma-2b
(26 layers), the components whose knock-out raises that probability in all three conflict types:
0 whole layers, 1 MLP, 6 attention blocks.

Batched like Stage 1 (:func:`juice.readout.intervention_readout`): one forward per prompt holds
the clean row and every knock-out row; a row knocking out layer l's component joins the batch at
layer l's input as a copy of the clean residual stream.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator, Sequence
from contextlib import AbstractContextManager, contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, NamedTuple

import numpy as np
import torch
from torch import Tensor, nn

from juice.analysis.common import (
    AnalysisOptions,
    Progress,
    cut,
    no_progress,
    unit_checkpoint,
    world_capital_items,
    write_outputs,
)
from juice.architectures import ModelHeads, UnsupportedArchitectureError
from juice.data.records import CONFLICT_TYPES, ConflictExample
from juice.eval.stats import Interval, bootstrap_interval
from juice.interventions import Head
from juice.io import UnitCheckpoint
from juice.models import LoadedModel
from juice.readout import growing_readout, intervention_readout
from juice.tokens import answer_first_token
from juice.progress import OnProgress

KINDS: tuple[str, ...] = ("layer", "attention", "mlp")
"""The knocked-out components of Fig. 3: whole layer, attention block, MLP block."""
KIND_TITLES = {"layer": "Whole layer", "attention": "Attention", "mlp": "MLP"}
PAPER_COUNTS = {"layer": 0, "attention": 6, "mlp": 1}
"""Fig. 3's counts on Gemma-2b (of 26 layers): components helping the parametric answer in all
three conflict types (paper Sec. 3.1, Observation 1)."""
SIZES = {"default": 16, "quick": 3, "full": None}
"""Filtered World Capital items per mode (`--full`: all of them; Gemma 3 270M knows 48 of the 181 for
seed 0). One item costs about 15-25 s on 2 busy CPU cores (docs/development.md, "Measured")."""


class Component(NamedTuple):
    """A knocked-out component: `kind` in KINDS and its layer (from 0). Prints as `L6 attention`."""

    kind: str
    layer: int

    def __str__(self) -> str:
        return f"L{self.layer} {self.kind}"


def mlp_module(heads: ModelHeads, layer: int) -> nn.Module:
    """The MLP block of decoder layer `layer` (the `mlp` attribute of every supported architecture).

    Raises:
        UnsupportedArchitectureError: the layer has no `mlp` module.
        IndexError: no such layer.
    """
    if not 0 <= layer < len(heads.layers):
        raise IndexError(f"layer {layer} is out of range for a model of {len(heads.layers)} layers")
    module = getattr(heads.layers[layer], "mlp", None)
    if module is None:
        raise UnsupportedArchitectureError(f"{type(heads.layers[layer]).__name__} has no 'mlp' module")
    return module


def _check_components(heads: ModelHeads, components: Sequence[Component]) -> None:
    for c in components:
        if c.kind not in KINDS:
            raise ValueError(f"unknown component kind {c.kind!r}; choose from {KINDS}")
        if not 0 <= c.layer < len(heads.layers):
            raise IndexError(f"layer {c.layer} is out of range for a model of {len(heads.layers)} layers")


def _first(output: Any) -> Tensor:
    return output[0] if isinstance(output, tuple) else output


def _replace_first(output: Any, tensor: Tensor) -> Any:
    return (tensor, *output[1:]) if isinstance(output, tuple) else tensor


@contextmanager
def knocked_out(heads: ModelHeads, rows_of: dict[Component, Callable[[int], Any]]) -> Iterator[None]:
    """Knock out components on the rows `rows_of[c](batch)` selects (an index, a slice, a tensor).

    Forward hooks: on the decoder layer (output := input), on the output projection (output :=
    0), on the MLP (output := 0). Removed on exit, whatever happens.
    """
    _check_components(heads, list(rows_of))
    handles = []

    def zero(select: Callable[[int], Any]):
        def hook(module: nn.Module, args: tuple, output: Any):
            x = _first(output).clone()
            x[select(x.shape[0])] = 0
            return _replace_first(output, x)
        return hook

    def skip(select: Callable[[int], Any]):
        def hook(module: nn.Module, args: tuple, kwargs: dict, output: Any):
            hidden = args[0] if args else kwargs["hidden_states"]
            x = _first(output).clone()
            rows = select(x.shape[0])
            x[rows] = hidden[rows].to(x.dtype)
            return _replace_first(output, x)
        return hook

    try:
        for c, select in rows_of.items():
            if c.kind == "layer":
                handles.append(heads.layers[c.layer].register_forward_hook(skip(select), with_kwargs=True))
            elif c.kind == "attention":
                handles.append(heads.projections[c.layer].register_forward_hook(zero(select)))
            else:
                handles.append(mlp_module(heads, c.layer).register_forward_hook(zero(select)))
        yield
    finally:
        for h in handles:
            h.remove()


@torch.inference_mode()
def knockout_readout(
    lm: LoadedModel, prompt: str, components: Sequence[Component], readout: Callable[[Tensor], Tensor],
    max_rows: int | str = 256,
) -> tuple[Tensor, Tensor]:
    """Last-position readouts of the clean model and of each single-component knock-out, batched.

    One forward per chunk of `max_rows` knock-outs; a knock-out at layer l joins the batch at
    layer l's input (module docstring); the LM head runs at the last position only.

    Args:
        prompt: one prompt (no padding).
        components: what to knock out, one at a time.
        readout: maps last-position logits `[rows, vocab]` (float32) to `[rows, ...]`.
        max_rows: most knock-out rows per forward, or "auto".

    Returns:
        (clean readout `[...]`, `[len(components), ...]` readouts under each knock-out).

    Raises:
        ValueError: an unknown component kind.
        IndexError: a layer out of range.
    """
    _check_components(lm.heads, components)
    order = sorted(range(len(components)), key=lambda i: (components[i].layer, KINDS.index(components[i].kind)))

    def intervene(plan: dict[int, list[int]]) -> AbstractContextManager:
        rows_of: dict[Component, Callable[[int], Any]] = {}
        for idx in plan.values():
            # the rows joining at layer l are the last len(idx) rows of the batch at that layer
            for j, i in enumerate(idx):
                rows_of[components[i]] = lambda b, _k=len(idx) - j: b - _k
        return knocked_out(lm.heads, rows_of)

    return growing_readout(lm, prompt, order, lambda i: components[i].layer, intervene, readout, max_rows)


def all_components(n_layers: int) -> list[Component]:
    """Every (kind, layer) of Fig. 3, layer-major."""
    return [Component(kind, layer) for layer in range(n_layers) for kind in KINDS]


# ---------------------------------------------------------------- per-head knock-out


def head_knockout_deltas(
    lm: LoadedModel, items: Sequence[ConflictExample], conflict_types: Sequence[str],
    *, max_rows: int | str = 256, checkpoint: UnitCheckpoint | None = None,
    on_progress: OnProgress | None = None,
) -> tuple[Tensor, Tensor]:
    """Change of the context and the parametric answer's first-token probability when each head is
    knocked out alone (`H <- 0`, :func:`juice.readout.intervention_readout`), per item and type.

    The superposition table and Table 3's ranking read it (paper Sec. 3.1; App. D).

    Returns:
        (deltas `[n_items, n_types, 2, n_layers, n_heads]` (index 0 of the third axis: context
        answer, 1: parametric answer), clean probabilities `[n_items, n_types, 2]`), float64.

    Raises:
        EmptyAnswerError: an answer tokenizes to nothing.
    """
    g = lm.geometry
    heads = [Head(l, h) for l in range(g.n_layers) for h in range(g.n_heads)]
    interventions = [(head, -1.0) for head in heads]
    deltas = torch.zeros(len(items), len(conflict_types), 2, g.n_layers, g.n_heads, dtype=torch.float64)
    clean = torch.zeros(len(items), len(conflict_types), 2, dtype=torch.float64)
    step = 0
    for i, ex in enumerate(items):
        for j, t in enumerate(conflict_types):
            prompt = ex.prompts[t]
            tokens = [answer_first_token(lm.tokenizer, prompt, ex.context_answer),
                      answer_first_token(lm.tokenizer, prompt, ex.answer)]
            unit = UnitCheckpoint.unit_id("head_knockout", prompt, tokens, g.n_layers, g.n_heads)
            done = checkpoint.get(unit) if checkpoint else None
            if done is None:
                p0, p = intervention_readout(lm, prompt, interventions,
                                             lambda logits: logits.softmax(-1)[:, tokens], max_rows)
                done = {"clean": p0.double().tolist(), "probs": p.double().tolist()}
                if checkpoint:
                    checkpoint.put(unit, done)
            p0 = torch.tensor(done["clean"], dtype=torch.float64)
            p = torch.tensor(done["probs"], dtype=torch.float64)          # [n_heads_total, 2]
            clean[i, j] = p0
            deltas[i, j] = (p - p0).T.reshape(2, g.n_layers, g.n_heads)
            if on_progress:
                on_progress(1)
            step += 1
    return deltas, clean


# ---------------------------------------------------------------- Fig. 3


@dataclass
class KnockoutResult:
    """Fig. 3's numbers.

    Attributes:
        deltas: `[n_items, n_types, n_kinds, n_layers]` change of the parametric answer's
            first-token probability under each knock-out (kinds in KINDS order).
        clean_probs: `[n_items, n_types]` the unmodified model's probabilities.
        mean, std: `[n_types, n_kinds, n_layers]` over items (std: population, ddof = 0).
        intervals: kind -> type -> per-layer 95% bootstrap intervals of the mean change.
        helps_all: kind -> layers whose knock-out raises the mean probability in every type.
        counts: kind -> (count, its 95% bootstrap interval over items: low, high).
    """

    title: str
    model: dict[str, Any]
    conflict_types: tuple[str, ...]
    subjects: list[str]
    deltas: np.ndarray
    clean_probs: np.ndarray
    mean: np.ndarray
    std: np.ndarray
    intervals: dict[str, dict[str, list[Interval]]]
    helps_all: dict[str, list[int]]
    counts: dict[str, tuple[int, float, float]]
    items: dict[str, int]
    options: dict[str, Any]
    files: list[Path] = field(default_factory=list)
    wall_s: float = 0.0

    def to_json(self) -> dict[str, Any]:
        n_layers = self.deltas.shape[-1]
        return {
            "title": self.title,
            "source": "paper Sec. 3.1 (Observation 1), Fig. 3; App. D",
            "model": self.model,
            "options": self.options,
            "n_items": len(self.subjects),
            "items": self.items,
            "subjects": self.subjects,
            "conflict_types": list(self.conflict_types),
            "kinds": list(KINDS),
            "n_layers": n_layers,
            "clean_prob_mean": {t: float(self.clean_probs[:, j].mean()) for j, t in enumerate(self.conflict_types)},
            "per_layer": {k: {t: [{"layer": l, "std": float(self.std[j, ki, l]), **self.intervals[k][t][l].to_json()}
                                  for l in range(n_layers)] for j, t in enumerate(self.conflict_types)}
                          for ki, k in enumerate(KINDS)},
            "helps_all_types": {k: v for k, v in self.helps_all.items()},
            "counts": {k: {"count": c, "low": lo, "high": hi, "of": n_layers, "paper_gemma_2b": PAPER_COUNTS[k],
                           "paper_of": 26} for k, (c, lo, hi) in self.counts.items()},
            "deltas": self.deltas.round(6).tolist(),
            "wall_s": self.wall_s,
        }


def count_interval(deltas: np.ndarray, resamples: int, seed: int) -> dict[str, tuple[int, float, float]]:
    """Per kind, the number of layers whose mean change is > 0 in every conflict type, and the
    95% percentile bootstrap interval of that count (items resampled with replacement).

    Args:
        deltas: `[n_items, n_types, n_kinds, n_layers]`.
    """
    n = deltas.shape[0]
    helps = (deltas.mean(0) > 0).all(0)                       # [kinds, layers]
    rng = np.random.default_rng(seed)
    idx = rng.integers(0, n, size=(resamples, n))
    weights = np.zeros((resamples, n))
    np.add.at(weights, (np.arange(resamples)[:, None], idx), 1.0)
    means = (weights @ deltas.reshape(n, -1) / n).reshape(resamples, *deltas.shape[1:])
    boot = (means > 0).all(1).sum(-1)                         # [resamples, kinds]
    low, high = np.quantile(boot, [0.025, 0.975], axis=0)
    return {k: (int(helps[ki].sum()), float(low[ki]), float(high[ki])) for ki, k in enumerate(KINDS)}


def component_deltas(
    lm: LoadedModel, items: Sequence[ConflictExample], conflict_types: Sequence[str] = CONFLICT_TYPES,
    *, max_rows: int | str = 256, checkpoint: UnitCheckpoint | None = None,
    on_progress: OnProgress | None = None,
) -> tuple[np.ndarray, np.ndarray]:
    """Change of the parametric answer's first-token probability under each knock-out of Fig. 3.

    Returns:
        (deltas `[n_items, n_types, n_kinds, n_layers]`, clean probabilities `[n_items, n_types]`).
    """
    n_layers = lm.geometry.n_layers
    components = all_components(n_layers)
    deltas = np.zeros((len(items), len(conflict_types), len(KINDS), n_layers))
    clean = np.zeros((len(items), len(conflict_types)))
    step = 0
    for i, ex in enumerate(items):
        for j, t in enumerate(conflict_types):
            prompt = ex.prompts[t]
            token = answer_first_token(lm.tokenizer, prompt, ex.answer)
            unit = UnitCheckpoint.unit_id("component_knockout", prompt, token, n_layers)
            done = checkpoint.get(unit) if checkpoint else None
            if done is None:
                p0, p = knockout_readout(lm, prompt, components, lambda logits: logits.softmax(-1)[:, token], max_rows)
                done = {"clean": float(p0), "probs": p.double().tolist()}
                if checkpoint:
                    checkpoint.put(unit, done)
            clean[i, j] = done["clean"]
            probs = np.asarray(done["probs"]).reshape(n_layers, len(KINDS))
            deltas[i, j] = (probs - done["clean"]).T
            if on_progress:
                on_progress(1)
            step += 1
    return deltas, clean


def knockout_figure(result: KnockoutResult):
    """Three panels stacked (whole layer, attention, MLP): mean change per layer, one line per conflict
    type, the standard deviation over items shaded (paper Fig. 3)."""
    from matplotlib.figure import Figure
    from matplotlib.ticker import MaxNLocator

    fig = Figure(figsize=(7.5, 3.0 * len(KINDS) + 0.8))
    axes = fig.subplots(len(KINDS), 1, sharex=True, sharey=True)
    layers = np.arange(result.deltas.shape[-1])
    colours = {"clean": "tab:green", "substitution": "tab:orange", "coherent": "tab:blue"}
    for ki, (ax, kind) in enumerate(zip(axes, KINDS)):
        for j, t in enumerate(result.conflict_types):
            m, s = result.mean[j, ki], result.std[j, ki]
            ax.plot(layers, m, marker="o", ms=3, color=colours.get(t), label=t)
            ax.fill_between(layers, m - s, m + s, color=colours.get(t), alpha=0.15)
        ax.axhline(0, color="black", lw=0.6)
        count, lo, hi = result.counts[kind]
        ax.set_title(f"{KIND_TITLES[kind]} knocked out: helps in all 3 types in {count} of {len(layers)} "
                     f"layers (95% CI {lo:.0f}-{hi:.0f}; Gemma-2b: {PAPER_COUNTS[kind]} of 26)", fontsize=10)
        ax.set_ylabel("change of P")
        ax.xaxis.set_major_locator(MaxNLocator(integer=True))
        ax.grid(alpha=0.3)
    axes[-1].set_xlabel("layer (counted from 0)")
    axes[0].legend(fontsize=9, ncol=len(result.conflict_types), loc="upper left")
    fig.suptitle(f"{result.model.get('name', '')}: knock-out per layer on filtered World Capital\n"
                 f"P = probability of the parametric answer's first token; n = {len(result.subjects)} items; "
                 "shaded: ±1 sd over items", fontsize=10)
    fig.tight_layout()
    return fig


def knockout_markdown(result: KnockoutResult) -> str:
    n_layers = result.deltas.shape[-1]
    short = {"clean": "clean", "substitution": "subs", "coherent": "coh"}
    lines = [f"# {result.title}\n",
             f"Model {result.model.get('name')}; filtered World Capital, n = {len(result.subjects)} items "
             f"(each under {len(result.conflict_types)} conflict types). Cell: mean change of the probability of the "
             "parametric answer's first token when the component is knocked out, ± half-width of its 95% bootstrap "
             "interval (sd over items in the JSON and the figure). `*`: the knock-out raises the mean in all three "
             "conflict types.\n",
             "## Components whose knock-out helps the parametric answer in all three conflict types\n",
             "| Component | count | 95% bootstrap interval | layers | Gemma-2b (paper, of 26) |",
             "|---|---|---|---|---|"]
    for kind in KINDS:
        c, lo, hi = result.counts[kind]
        lines.append(f"| {KIND_TITLES[kind]} | {c} of {n_layers} | [{lo:.0f}, {hi:.0f}] | "
                     f"{', '.join(f'L{l}' for l in result.helps_all[kind]) or '-'} | {PAPER_COUNTS[kind]} |")
    lines += ["", "Clean probability of the parametric answer's first token (mean over items): " + ", ".join(
        f"{t} {result.clean_probs[:, j].mean():.3f}" for j, t in enumerate(result.conflict_types)), "",
        "## Per layer\n"]
    head = ["Layer"] + [f"{KIND_TITLES[k]} {short.get(t, t)}" for k in KINDS for t in result.conflict_types]
    lines += ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for l in range(n_layers):
        cells = [f"L{l}"]
        for ki, k in enumerate(KINDS):
            star = "*" if l in result.helps_all[k] else ""
            for t in result.conflict_types:
                iv = result.intervals[k][t][l]
                cells.append(f"{iv.mean:+.3f} ±{iv.half_width:.3f}{star}")
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines) + "\n"


def run_knockout(lm: LoadedModel, options: AnalysisOptions, progress: Progress = no_progress,
                 n_items: int | None | str = "mode") -> KnockoutResult:
    """Fig. 3: knock out each layer, its attention block and its MLP block, one at a time, on
    filtered World Capital; writes `knockout.json`, `knockout.md`, `knockout.png` to `options.out`.

    Args:
        n_items: items to use ("mode": SIZES of the options' mode; None: all).

    Returns:
        :class:`KnockoutResult`.

    Raises:
        ValueError: no filtered item (the model knows no World Capital item).
    """
    start = time.perf_counter()
    items_all = world_capital_items(lm, options, progress)
    size = SIZES[options.mode] if n_items == "mode" else n_items
    items = cut(items_all.filtered, size)
    if not items:
        raise ValueError("no World Capital item the model answers correctly on the clean prompt: nothing to knock out")
    types = CONFLICT_TYPES
    advance = progress(f"knock-out: {len(items)} items x {len(types)} conflict types", len(items) * len(types))
    deltas, clean = component_deltas(lm, items, types, max_rows=options.max_rows,
                                     checkpoint=unit_checkpoint(lm, options, "knockout"), on_progress=advance)
    boot = dict(resamples=options.bootstrap_resamples, seed=options.seed)
    intervals = {k: {t: [bootstrap_interval(deltas[:, j, ki, l], **boot) for l in range(deltas.shape[-1])]
                     for j, t in enumerate(types)} for ki, k in enumerate(KINDS)}
    mean = deltas.mean(0)
    helps = (mean > 0).all(0)
    result = KnockoutResult(
        title="Fig. 3: knock-out of whole layers, attention and MLP blocks (parametric answer)",
        model=lm.fingerprint(), conflict_types=types, subjects=[ex.subject for ex in items], deltas=deltas,
        clean_probs=clean, mean=mean, std=deltas.std(0), intervals=intervals,
        helps_all={k: [int(l) for l in np.flatnonzero(helps[ki])] for ki, k in enumerate(KINDS)},
        counts=count_interval(deltas, options.bootstrap_resamples, options.seed),
        items={**items_all.counts, "used": len(items)}, options=options.to_json(),
    )
    result.wall_s = time.perf_counter() - start
    result.files = write_outputs(options.out, "knockout", result.to_json(), knockout_markdown(result),
                                 knockout_figure(result))
    return result


__all__ = ["Component", "KINDS", "KnockoutResult", "all_components", "component_deltas", "count_interval",
           "head_knockout_deltas", "knocked_out", "knockout_readout", "mlp_module",
           "run_knockout"]
