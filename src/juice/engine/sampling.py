"""How a decoding step chooses its token: greedy, sampled (:class:`Sampling`, Hugging Face's
temperature / top-k / top-p), or forced (teacher forcing), after Hugging Face's repetition
penalty. Used by the engine in :mod:`juice.engine`.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch
from torch import Tensor


@dataclass(frozen=True)
class Sampling:
    """Sampling instead of greedy decoding, as Hugging Face means these settings: the logits are
    divided by `temperature`, then only the `top_k` most probable tokens (0: all) and the smallest
    set whose probability reaches `top_p` (1: all) are kept, and one token is drawn.

    Each stream draws from its own `torch.Generator` seeded with `seed`, one draw per step, so
    a stream's tokens do not depend on the other streams of its batch.

    Raises:
        ValueError: temperature <= 0, top_k < 0, or top_p outside (0, 1].
    """

    temperature: float = 1.0
    top_k: int = 0
    top_p: float = 1.0
    seed: int = 0

    def __post_init__(self) -> None:
        if not self.temperature > 0:
            raise ValueError(f"temperature must be > 0 (greedy decoding: no Sampling), got {self.temperature}")
        if self.top_k < 0:
            raise ValueError(f"top_k must be >= 0, got {self.top_k}")
        if not 0 < self.top_p <= 1:
            raise ValueError(f"top_p must lie in (0, 1], got {self.top_p}")

    def draw(self, logits: Tensor, generator: torch.Generator) -> int:
        """One token id from `[vocab]` logits (float32, on the CPU)."""
        logits = logits / self.temperature
        if self.top_k:
            kth = logits.topk(min(self.top_k, logits.numel())).values[-1]
            logits = logits.masked_fill(logits < kth, float("-inf"))
        if self.top_p < 1:
            order = logits.argsort(descending=True)
            probs = logits[order].softmax(-1)
            drop = probs.cumsum(-1) - probs >= self.top_p   # keep the token that crosses top_p
            logits = logits.clone()
            logits[order[drop]] = float("-inf")
        return int(torch.multinomial(logits.softmax(-1), 1, generator=generator))


def penalize_repetition(logits: Tensor, seen: Tensor, penalty: Tensor) -> Tensor:
    """Hugging Face's repetition penalty (:class:`Stream`) on `[rows, vocab]` logits, given the
    `[rows, vocab]` bool mask of tokens already in each row's sequence and `[rows]` penalties."""
    p = penalty.to(logits.device, logits.dtype)[:, None]
    penalized = torch.where(logits < 0, logits * p, logits / p)
    return torch.where(seen.to(logits.device), penalized, logits)


def pick_token(logits: Tensor, forced: Sequence[int | None] | None = None,
               samplers: Sequence[tuple[Sampling, torch.Generator] | None] | None = None) -> tuple[Tensor, Tensor | None]:
    """The next token of every row: the forced one, a sampled one, or the greedy one. Called from
    one place, :meth:`juice.engine.session.DecodingSession._choose`.

    Args:
        logits: `[rows, vocab]` last-position logits (after any repetition penalty).
        forced: per row, the token id to feed (teacher forcing) or None to choose; None: none.
        samplers: per row, its :class:`Sampling` and generator, or None for greedy decoding.

    Returns:
        (`[rows]` token ids on the logits' device, `[rows]` float64 log-probabilities (nats) of
        the forced tokens on the CPU, NaN where a row was not forced; None without forced rows).
    """
    token = logits.argmax(-1)
    if samplers is not None and any(samplers):
        rows = logits.float().cpu()
        token = token.clone()
        for r, sampler in enumerate(samplers):
            if sampler is not None and (forced is None or forced[r] is None):
                token[r] = sampler[0].draw(rows[r], sampler[1])
    if forced is None or all(f is None for f in forced):
        return token, None
    taught = [r for r, f in enumerate(forced) if f is not None]
    index = torch.tensor(taught, device=logits.device)
    given = torch.tensor([forced[r] for r in taught], device=logits.device)
    token = token.clone()
    token[index] = given
    lp = torch.full((logits.shape[0],), float("nan"), dtype=torch.float64)
    lp[taught] = logits[index].log_softmax(-1).gather(1, given[:, None])[:, 0].double().cpu()
    return token, lp


__all__ = ["Sampling", "penalize_repetition", "pick_token"]
