"""CK-PLUG (Bi et al., "Parameters vs. Context: Fine-Grained Control of Knowledge Reliance in
Language Models", ICLR 2026, arXiv 2503.15888), in its adaptive mode: an adaptive decoder of the
2025-26 generation beside AdaCAD, as a baseline of the when-to-steer evaluation.

At every step it compares the next-token distribution with the retrieved context (the prompt)
and without it (the question alone). Its signal, the **confidence gain**, is the drop of entropy
that the context brings, `CG = H(without) - H(with)`. Where the context does not make the model
more confident than its own uncertainty with it (`CG - H(with) < 0`, the code's `e = -1`), the
token is chosen from a blend of the parametric logits and the context's pointwise contribution
(with-context minus without-context logits), each weighted by the other branch's entropy;
elsewhere from the with-context logits. Adaptive mode sets the weights from the two entropies
and needs no hyperparameter.

Points taken from the authors' code (github.com/byronBBL/CK-PLUG, `transformers-4.49/src/
transformers/generation/utils.py`, `_ck_decoding` and `relative_top_filter`, with the defaults
of `eval_rag.py`: adaptive, `select_top` 10, `relative_top` 0.01, greedy), where the paper's
text gives the idea and the code the numbers:

- both branches' logits are first filtered to their plausible tokens: a token is dropped (logit
  -1e10) where its log-probability is below `max + log(relative_top)` (and below the 10th
  largest) in **both** distributions;
- entropies are in nats over the filtered softmaxes, with their `1e-9` inside the logarithm;
- adjusted logits: `2 * base * H / (H + Hb * n) + 2 * (ctx - base) * Hb / (H + Hb * n)` with
  `n = 1 + |H - Hb| / (H + Hb)`, `H` the with-context entropy, `Hb` the without-context one,
  dropped tokens kept at -1e10 (their code sets the base branch to -1e3 before the difference).

juice's choices: one row at a time as theirs (their code reads a batch of one), each row's
entropies its own; a sum of entropies under 1e-9 is taken as 1e-9 (their code would divide by
0; both branches are then one-hot and no token is adjusted). Decoded by the engine as a
contrastive stream (:class:`juice.engine.Contrast`) over the prompt's and the question's
unmodified rows, like CAD and AdaCAD.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
from torch import Tensor

RELATIVE_TOP = 0.01
"""A token stays where its probability is at least this share of the most probable one's (in
either branch); the authors' `relative_top`."""

KEEP = 10
"""At least this many tokens stay in each branch (the authors' `select_top`)."""

DROPPED = -1e10
"""The logit of a dropped token (the authors' `filter_value`)."""


def plausible(with_context: Tensor, without_context: Tensor, relative_top: float = RELATIVE_TOP,
              keep: int = KEEP) -> Tensor:
    """`[rows, vocab]` bool: the tokens CK-PLUG drops (implausible in both branches).

    Args:
        with_context, without_context: `[rows, vocab]` logits.
    """
    def below(logits: Tensor) -> Tensor:
        logp = logits.float().log_softmax(-1)
        kth = logp.topk(min(keep, logp.shape[-1]), dim=-1).values[..., -1]
        threshold = torch.minimum(kth, logp.max(-1).values + math.log(relative_top))
        return logp < threshold[..., None]

    return below(with_context) & below(without_context)


def _branches(with_context: Tensor, without_context: Tensor) -> tuple[Tensor, Tensor, Tensor, Tensor, Tensor]:
    """(dropped, filtered with-context logits, filtered without-context logits, `H(with)`,
    `H(without)`): the two branches over their plausible tokens, as CK-PLUG computes them."""
    dropped = plausible(with_context, without_context)
    ctx = with_context.float().masked_fill(dropped, DROPPED)
    base = without_context.float().masked_fill(dropped, DROPPED)
    p, q = ctx.softmax(-1), base.softmax(-1)
    h = -(p * (p + 1e-9).log()).sum(-1)
    hb = -(q * (q + 1e-9).log()).sum(-1)
    return dropped, ctx, base, h, hb


def confidence_gain(with_context: Tensor, without_context: Tensor) -> tuple[Tensor, Tensor, Tensor]:
    """(confidence gain `H(without) - H(with)`, `H(with)`, `H(without)`), each `[rows]` nats, over
    the branches' plausible tokens (:func:`plausible`), as CK-PLUG computes them."""
    _, _, _, h, hb = _branches(with_context, without_context)
    return hb - h, h, hb


@dataclass(frozen=True)
class CkPlugPolicy:
    """CK-PLUG's adaptive decoding rule, a :data:`juice.engine.ContrastRule` (module docstring)."""

    def __call__(self, with_context: Tensor, without_context: Tensor) -> Tensor:
        """`[rows, vocab]` logits to choose the next token from, given `[rows, vocab]` with- and
        without-context logits."""
        dropped, ctx, base, h, hb = _branches(with_context, without_context)   # once per step
        adjust = (hb - h) - h.abs() < 0   # the confidence gain against the uncertainty with the context
        context_part = ctx - base.masked_fill(dropped, -1e3)
        total = (h + hb).clamp_min(1e-9)
        n = 1 + (h - hb).abs() / total
        denominator = (h + hb * n).clamp_min(1e-9)[:, None]
        blended = 2 * base * h[:, None] / denominator + 2 * context_part * hb[:, None] / denominator
        return torch.where(adjust[:, None], blended, ctx)


__all__ = ["CkPlugPolicy", "DROPPED", "KEEP", "RELATIVE_TOP", "confidence_gain", "plausible"]
