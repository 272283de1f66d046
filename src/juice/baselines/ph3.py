"""PH3, "Pruning Head via PatH PatcHing" (Jin et al. 2024, "Cutting Off the Head Ends the
Conflict", Sec. 3-4; paper Sec. 4.1 baseline).

PH3 finds *memory heads* (their output pushes the parametric answer) and *context heads* (they
push the context answer) by patching each head's output and measuring the change of the logit
difference

    LD = logit(parametric answer) - logit(context answer)

at the last position, averaged over a development set; then it prunes (zero-ablates at every
position) the top-k heads of the kind that opposes the wanted answer: context heads to make the
model follow its memory, memory heads to make it follow the context. k is tuned on validation
from {1, 3, 5, 7, 9, 15}.

Points decided here (the PH3 paper describes path patching from a counterfactual run; its text
and code were not available offline where this was written, so these choices are ours):

- the patch is a zero-ablation of the head's output at every position (its slice of the
  `o_proj` input), the same operation as the pruning applied afterwards, so the score measures
  exactly the effect the method then exploits;
- the effect of head h is `LD(h zeroed) - LD(clean)`, averaged over the development prompts:
  negative = memory head (removing it lowers LD), positive = context head;
- the answers' first tokens stand for the answers (as in JuICE's Stage 1);
- for ParaConflict the development prompts are the substitution and coherent conflict prompts
  (clean prompts have no conflict); for MemoTrap the prompt itself.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

import torch
from torch import Tensor

from juice.architectures import HeadGeometry
from juice.interventions import Head, head_coefficients
from juice.models import LoadedModel
from juice.scoring import UnitCheckpoint, intervention_readout
from juice.steering import Steering

PRUNE_K: tuple[int, ...] = (1, 3, 5, 7, 9, 15)


@dataclass(frozen=True)
class ConflictPrompt:
    """A prompt with the first tokens of its parametric and its context answer."""

    prompt: str
    parametric_token: int
    context_token: int


@dataclass
class Ph3Scores:
    """Per-head effect of zero-ablation on the logit difference.

    Attributes:
        effects: `[n_layers, n_heads]`, mean over prompts of LD(head zeroed) - LD(clean), logits.
        clean_ld: `[n_prompts]` the unmodified model's LD.
    """

    effects: Tensor
    clean_ld: Tensor

    def ranked(self, kind: str) -> tuple[Head, ...]:
        """Memory heads (`kind="memory"`, effect < 0, most negative first) or context heads
        (`kind="context"`, effect > 0, largest first)."""
        sign = -1.0 if kind == "memory" else 1.0
        if kind not in ("memory", "context"):
            raise ValueError(f"kind must be 'memory' or 'context', not {kind!r}")
        flat = (sign * self.effects).flatten()
        n_heads = self.effects.shape[1]
        order = flat.argsort(descending=True)
        return tuple(Head(int(i) // n_heads, int(i) % n_heads) for i in order if flat[i] > 0)


def logit_difference_effects(
    lm: LoadedModel,
    prompts: Sequence[ConflictPrompt],
    *,
    max_rows: int | str = 256,
    on_prompt: Callable[[int], None] | None = None,
    checkpoint: UnitCheckpoint | None = None,
) -> Ph3Scores:
    """Zero-ablate every head alone on every prompt and record the change of LD (module docstring).

    Cost: one batched forward per prompt holding `n_layers * n_heads` ablation rows (the
    growing batch of :func:`juice.scoring.intervention_readout`). With `checkpoint`, each
    prompt's result is saved as soon as it is computed (an interrupted sweep resumes).

    Raises:
        ValueError: no prompts.
    """
    if not prompts:
        raise ValueError("PH3 needs at least one development prompt")
    g = lm.heads.geometry
    heads = [Head(l, h) for l in range(g.n_layers) for h in range(g.n_heads)]
    interventions = [(head, -1.0) for head in heads]
    total = torch.zeros(g.n_layers * g.n_heads, dtype=torch.float64)
    clean_ld = []
    for i, cp in enumerate(prompts):
        unit = UnitCheckpoint.unit_id("ph3", cp, g) if checkpoint else ""
        done = checkpoint.get(unit) if checkpoint else None
        if done is None:
            pair = torch.tensor([cp.parametric_token, cp.context_token])
            clean, values = intervention_readout(
                lm, cp.prompt, interventions, lambda logits: logits[:, pair.to(logits.device)], max_rows)
            done = {"clean_ld": float(clean[0] - clean[1]), "ld": (values[:, 0] - values[:, 1]).double().tolist()}
            if checkpoint:
                checkpoint.put(unit, done)
        ld0 = done["clean_ld"]
        total += torch.tensor(done["ld"], dtype=torch.float64) - ld0
        clean_ld.append(ld0)
        if on_prompt:
            on_prompt(i)
    return Ph3Scores((total / len(prompts)).view(g.n_layers, g.n_heads), torch.tensor(clean_ld))


def heads_to_prune(scores: Ph3Scores, direction: str, k: int) -> tuple[Head, ...]:
    """The top-k heads that oppose `direction`: context heads for "parametric", memory heads for
    "contextual" (fewer if fewer have an effect of that sign).

    Raises:
        ValueError: unknown direction or k < 0.
    """
    if direction not in ("parametric", "contextual"):
        raise ValueError(f"direction must be 'parametric' or 'contextual', not {direction!r}")
    if k < 0:
        raise ValueError(f"k must be >= 0, got {k}")
    return scores.ranked("context" if direction == "parametric" else "memory")[:k]


def pruning(geometry: HeadGeometry, heads: Sequence[Head]) -> Steering:
    """Zero-ablation of `heads` at every position: a single-run scaling with alpha = -1
    (`H <- H - H = 0`)."""
    return Steering("june", head_coefficients(geometry, {h: -1.0 for h in heads}))
