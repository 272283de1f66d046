"""CoCoA, confidence- and context-aware adjustment, as TriState-Bench runs it (Jiang et al., "From
Context-Aware to Conflict-Aware: Generalizing Contrastive Decoding for Knowledge Conflict in
LLMs", arXiv 2606.10298; repository `keith-Jiang/conflict-aware-decoding` at 581a4d5,
`methods/cocoa.py`, the authors' "simplified single-GPU" version of CoCoA): a baseline of the
TriState measurement (:mod:`juice.data.tristate`).

At every step, from the two branches' log-probabilities `lc = log p(. | passage, question)` and
`lp = log p(. | question)`:

    s = a * lc + (1 - a) * lp + gamma * (lc - lp)
    s = s + lambda * clamp((s - median(s)) / (MAD(s) + 1e-8), -100, 100)

with the median and the median absolute deviation over the vocabulary, per row, and the repository's
defaults a = 0.5 (`--cocoa_global_alpha`), gamma = 1 (`--cocoa_gamma`), lambda = 100
(`--cocoa_lambda_pm`). The second line is increasing in `s`, so the greedy token is the argmax of
`1.5 * lc - 0.5 * lp`: CAD at alpha 0.5. Its docstring and `get_tau` call this interpolation
(tau 0.5); the weight on the context is 1.5 (extrapolation). The benchmark's copy of the original
two-process CoCoA (`CoCoA/group_decode_fileio_CoCoA.py`, read, not run here) computes an entropy
gap, a Renyi divergence and an adaptive weight, then sets the weight to 0.5 before use; it also
bans the end of sequence at every step (its `gen_len < 5` never stops holding: `gen_len` is never
incremented), so its outputs run to the token budget where this rule's would stop.

juice's choices: the median is torch's (the lower of the two middle values for an even
vocabulary, as theirs); each row is its own (their runner decodes one input at a time).
Decoded by the engine as a contrastive stream (:class:`juice.engine.Contrast`) whose question
branch is the benchmark's question-only prompt.
"""

from __future__ import annotations

from dataclasses import dataclass

from torch import Tensor

GLOBAL_ALPHA = 0.5
GAMMA = 1.0
LAMBDA = 100.0


@dataclass(frozen=True)
class CocoaPolicy:
    """CoCoA's rule as a :data:`juice.engine.ContrastRule` (module docstring).

    Attributes:
        global_alpha, gamma, lambda_pm: the repository's `--cocoa_*` settings.
    """

    global_alpha: float = GLOBAL_ALPHA
    gamma: float = GAMMA
    lambda_pm: float = LAMBDA

    def __call__(self, with_context: Tensor, without_context: Tensor) -> Tensor:
        """`[rows, vocab]` scores to choose the next token from, given `[rows, vocab]` with- and
        without-context logits (any scale: each row is log-softmaxed first)."""
        lc = with_context.float().log_softmax(-1)
        lp = without_context.float().log_softmax(-1)
        s = self.global_alpha * lc + (1 - self.global_alpha) * lp + self.gamma * (lc - lp)
        median = s.median(-1, keepdim=True).values
        mad = (s - median).abs().median(-1, keepdim=True).values + 1e-8
        return s + self.lambda_pm * ((s - median) / mad).clamp(-100.0, 100.0)


__all__ = ["CocoaPolicy", "GAMMA", "GLOBAL_ALPHA", "LAMBDA"]
