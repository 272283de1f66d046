"""COIECD, conflict-of-interest entropy-constrained decoding (Yuan et al., "Discerning and
Resolving Knowledge Conflicts through Adaptive Decoding with Contextual Information-Entropy
Constraint", Findings of ACL 2024), as TriState-Bench runs it (repository
`keith-Jiang/conflict-aware-decoding` at 581a4d5, `methods/coiecd.py`, a copy of the authors'
`COIECD/decoding.py`; runner defaults `--alpha 1.0 --threshold_ratio 4`): a baseline of the
TriState measurement (:mod:`juice.data.tristate`).

At every step, from the two branches' log-probabilities `lc` (passage and question) and `lp`
(question alone), `p = exp(lc)` and the ratio r = 4:

- T, the tokens the context makes no more than 1/r as likely as its top token
  (`p(y) <= max p / r`); when exactly one token lies outside T, T is the whole vocabulary;
- F, the tokens less than r times as likely as the least likely one (`p(y) < r * min p`);
- c(y) = 0 on T minus F, 1 elsewhere, and the scores
  `c * lc + (1 - c) * lp + alpha * (lc - lp)`:
  CAD's `(1 + alpha) * lc - alpha * lp` on the tokens the context makes likely (outside T) and
  on F, and `alpha * lc + (1 - alpha) * lp` (with alpha 1: `lc`) on the rest.

The code's entropy constraint, the prior's entropy subtracted from `-lc` before a log-softmax,
is a constant per row that the log-softmax removes: the sets above do not depend on the prior's
entropy, in theirs as here (so the method's name promises more than its code does). The branches
are log-softmaxed first, as TriState's runner does (`logits - logsumexp`): unlike CAD's, this
rule's argmax depends on it.

juice's choices: each row is its own (their "exactly one token outside T" count runs over the
batch, which is one input in their runner). Decoded by the engine as a contrastive stream
(:class:`juice.engine.Contrast`).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from torch import Tensor

ALPHA = 1.0
THRESHOLD_RATIO = 4.0


@dataclass(frozen=True)
class CoiecdPolicy:
    """COIECD's rule as a :data:`juice.engine.ContrastRule` (module docstring).

    Attributes:
        alpha: the contrast's weight (`--alpha`).
        threshold_ratio: r (`--threshold_ratio`).
    """

    alpha: float = ALPHA
    threshold_ratio: float = THRESHOLD_RATIO

    def constrained(self, with_context: Tensor) -> Tensor:
        """`[rows, vocab]` bool: c(y) = 1 (CAD's score), from `[rows, vocab]` with-context logits."""
        lc = with_context.float().log_softmax(-1)
        log_r = math.log(self.threshold_ratio)
        top = lc.max(-1, keepdim=True).values
        typical = lc <= top - log_r                            # T: p(y) <= max p / r
        whole = (~typical).sum(-1, keepdim=True) == 1          # only the top token outside T
        typical = typical | whole
        floor = lc < lc.min(-1, keepdim=True).values + log_r   # F: p(y) < r * min p
        return ~typical | floor

    def __call__(self, with_context: Tensor, without_context: Tensor) -> Tensor:
        """`[rows, vocab]` scores to choose the next token from, given `[rows, vocab]` with- and
        without-context logits."""
        lc = with_context.float().log_softmax(-1)
        lp = without_context.float().log_softmax(-1)
        c = self.constrained(lc).to(lc.dtype)
        return c * lc + (1 - c) * lp + self.alpha * (lc - lp)


__all__ = ["ALPHA", "CoiecdPolicy", "THRESHOLD_RATIO"]
