"""GRD, gated reversal decoding: TriState-Bench's own method (Jiang et al., "From Context-Aware to
Conflict-Aware: Generalizing Contrastive Decoding for Knowledge Conflict in LLMs", arXiv
2606.10298; repository `keith-Jiang/conflict-aware-decoding` at 581a4d5, `methods/grd.py` and
`grd_generate` in `methods/inference.py`, defaults `--grd_lambda 0.75 --grd_gate_mode full`),
re-implemented from the repository's description and compared with its outputs
(benchmarks/tristate_parity.py): a baseline of the TriState measurement (:mod:`juice.data.tristate`).

Each step reads the two branches' log-probabilities `lc` (passage and question) and `lp`
(question alone) and their top tokens `a_c`, `a_p`:

1. **The gate**, decided once per sequence, at its first step where `a_c != a_p`: trust the
   prior for the rest of the sequence where the question alone is confident, `p(a_p) > 0.5`,
   and more certain than with the passage, `H(lp) < H(lc)` (entropies in nats; mode "full";
   "conf_only" and "ent_only" use one signal); else trust the context.
2. **The token**: `a_c` where the branches agree or the context is trusted; else the argmax of
   `tau * lc + (1 - tau) * lp` with `tau = (1 - lambda) * tau*`, where
   `tau* = m_p / (m_c + m_p)` (1 where `|m_c + m_p| <= 1e-9`), `m_c = lc[a_c] - lc[a_p]`,
   `m_p = lp[a_p] - lp[a_c]`: `tau*` is the weight at which the two top tokens tie, and lambda
   (the "commitment depth", 0.75) moves the mix toward the prior.

So that the engine chooses, samples and reports probabilities as for any contrast, the rule gives
scores for every row: `tau * lc + (1 - tau) * lp` where it reverses, `lc` itself where `a_c` is
emitted (the with-context distribution): their argmax is GRD's token. The benchmark's paper v1 names
another method (ARR, deleted from the repository); GRD is what the repository's README and
scripts run, so juice runs GRD.

juice's choices: each row is its own (their runner decodes one input at a time); the gate's
state lives in the engine's stream (:class:`juice.engine.StatefulContrastRule`).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch
from torch import Tensor

LAMBDA = 0.75
GATE_MODES = ("full", "conf_only", "ent_only")

UNDECIDED, CONTEXT, PRIOR = None, "context", "prior"
"""A sequence's gate: not yet decided (no step with different top tokens so far), or the branch it trusts."""


@dataclass(frozen=True)
class GrdPolicy:
    """GRD as a :class:`juice.engine.StatefulContrastRule` (module docstring).

    Attributes:
        grd_lambda: the commitment depth lambda, in [0, 1].
        gate_mode: "full" (confidence and entropy), "conf_only" or "ent_only".

    Raises:
        ValueError: an unknown gate mode.
    """

    grd_lambda: float = LAMBDA
    gate_mode: str = "full"

    def __post_init__(self) -> None:
        if self.gate_mode not in GATE_MODES:
            raise ValueError(f"unknown GRD gate mode {self.gate_mode!r}; choose from {', '.join(GATE_MODES)}")

    def step(self, with_context: Tensor, without_context: Tensor, states: list[Any]
             ) -> tuple[Tensor, list[Any]]:
        """One step for `[rows, vocab]` with- and without-context logits and each row's gate.

        Returns:
            (`[rows, vocab]` scores `tau * lc + (1 - tau) * lp`, the rows' gates after the step).
        """
        lc = with_context.float().log_softmax(-1)
        lp = without_context.float().log_softmax(-1)
        a_c, a_p = lc.argmax(-1), lp.argmax(-1)
        conflict = a_c != a_p
        rows = torch.arange(lc.shape[0], device=lc.device)
        confident = lp[rows, a_p].exp() > 0.5
        surer = -(lp.exp() * lp).sum(-1) < -(lc.exp() * lc).sum(-1)
        route = {"full": confident & surer, "conf_only": confident, "ent_only": surer}[self.gate_mode]
        gates = list(states)
        for r, (c, to_prior) in enumerate(zip(conflict.tolist(), route.tolist())):
            if c and gates[r] is UNDECIDED:
                gates[r] = PRIOR if to_prior else CONTEXT
        m_c = lc[rows, a_c] - lc[rows, a_p]
        m_p = lp[rows, a_p] - lp[rows, a_c]
        total = m_c + m_p
        tie = torch.where(total.abs() > 1e-9, m_p / torch.where(total == 0, torch.ones_like(total), total),
                          torch.ones_like(total))
        reverse = conflict & torch.tensor([g == PRIOR for g in gates], device=lc.device)
        tau = ((1.0 - self.grd_lambda) * tie)[:, None]
        mixed = tau * lc + (1 - tau) * lp
        return torch.where(reverse[:, None], mixed, lc), gates   # lc itself elsewhere (no 0 * -inf)


__all__ = ["GATE_MODES", "GrdPolicy", "LAMBDA"]
