"""How a decoding step chooses its token: greedy, sampled (:class:`Sampling`, Hugging Face's
temperature / top-k / top-p), or forced (teacher forcing), after Hugging Face's repetition
penalty. Used by the engine in :mod:`juice.decoding`.
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


def pick_token(logits: Tensor, forced: Tensor | None, step: int, lps: list[Tensor],
               samplers: Sequence[tuple[Sampling, torch.Generator] | None] | None = None) -> Tensor:
    """The next token of every row: the greedy one, a sampled one, or `forced[:, step]` whose
    log-probability (`[rows]`, float64, nats) is appended to `lps`.

    Args:
        logits: `[rows, vocab]` last-position logits (after any repetition penalty).
        forced: `[rows, n_steps]` token ids to feed, or None.
        samplers: per row, its :class:`Sampling` and generator, or None for greedy decoding.
    """
    if forced is None:
        token = logits.argmax(-1)
        if samplers is not None and any(samplers):
            rows = logits.float().cpu()
            token = token.clone()
            for r, sampler in enumerate(samplers):
                if sampler is not None:
                    token[r] = sampler[0].draw(rows[r], sampler[1])
        return token
    token = forced[:, step].to(logits.device)
    lps.append(logits.log_softmax(-1).gather(1, token[:, None])[:, 0].double().cpu())
    return token


__all__ = ["Sampling", "penalize_repetition", "pick_token"]
