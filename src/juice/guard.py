"""A runtime guard: batched decoding must equal one-at-a-time decoding.

Batched generation left-pads prompts of different lengths. On some device / attention-kernel /
library combinations that is not exact: with transformers 5.17 and SDPA attention on CUDA,
left-padded rows came back as garbage while eager attention and the CPU were exact (issue 14;
transformers #47651 reports the same family: a fully masked padded query row turns into NaN in
PyTorch's SDPA kernels, and the NaN reaches the real tokens). So, the first time a process
decodes a padded batch on a (device type, attention implementation, dtype, transformers
version) it has not verified, the guard re-decodes a few of that batch's most padded rows one at
a time and compares the tokens:

- equal: the combination is marked verified for the rest of the process;
- different: with `fallback` (the default) the model is switched to eager attention, a warning
  says so, and the batch is decoded again and checked again; if it still differs, or without
  `fallback`, :class:`BatchingMismatchError` stops the run. Nothing is ever returned unchecked.

Policy, from `$JUICE_BATCH_CHECK` (read on every check): "auto" (default: every device but the
CPU, where the test suite checks batched = one-by-one on every architecture), "always", "off".
Cost: up to `ROWS` extra single-row decodes, once per combination and process.
"""

from __future__ import annotations

import os
import warnings
from collections.abc import Callable, Sequence

import torch
from torch import Tensor

from juice.models import LoadedModel

ROWS = 3
"""Rows of the first padded batch re-decoded one at a time (the most padded ones)."""

POLICIES = ("auto", "always", "off")
_verified: set[tuple[str, ...]] = set()


class BatchingMismatchError(RuntimeError):
    """Batched decoding gave other tokens than one-at-a-time decoding of the same rows."""


def policy() -> str:
    """`$JUICE_BATCH_CHECK`, validated.

    Raises:
        ValueError: a value other than auto, always or off.
    """
    value = os.environ.get("JUICE_BATCH_CHECK", "auto").strip().lower() or "auto"
    if value not in POLICIES:
        raise ValueError(f"JUICE_BATCH_CHECK must be one of {', '.join(POLICIES)}, not {value!r}")
    return value


def attention_implementation(lm: LoadedModel) -> str:
    """The model's attention implementation ("sdpa", "eager", "flash_attention_2", ...)."""
    return str(getattr(lm.model.config, "_attn_implementation", None) or "unknown")


def combination(lm: LoadedModel) -> tuple[str, ...]:
    """What a verification holds for: device type, attention implementation, dtype, transformers."""
    import transformers

    return (lm.device.type, attention_implementation(lm), str(lm.model.dtype), transformers.__version__)


def needs_check(lm: LoadedModel) -> bool:
    """True if the next padded batch of this model must be checked (policy and not yet verified)."""
    p = policy()
    if p == "off" or (p == "auto" and lm.device.type == "cpu"):
        return False
    return combination(lm) not in _verified


def forget_verifications() -> None:
    """Clear the verified combinations (tests)."""
    _verified.clear()


def check_batch(
    lm: LoadedModel,
    lengths: Sequence[int | tuple[int, ...]],
    batched: Tensor,
    decode_alone: Callable[[int], Tensor],
    redo_batch: Callable[[], Tensor],
    *,
    fallback: bool = True,
) -> Tensor:
    """Check one padded batch (see the module docstring) and return its tokens.

    Args:
        lengths: `[rows]` prompt length (tokens) of each row of the batch (a tuple for rows of
            several prompts, e.g. CAD's two branches); the shortest are the most padded.
        batched: `[rows, new_tokens]` the batch's tokens as decoded together.
        decode_alone: row index -> `[new_tokens]` that row decoded with no other row (no padding).
        redo_batch: decodes the batch again (after a switch to eager attention).
        fallback: switch to eager attention on a mismatch instead of raising at once.

    Returns:
        `[rows, new_tokens]` tokens that agree with one-at-a-time decoding on the checked rows.

    Raises:
        BatchingMismatchError: the rows differ (after the eager fallback, if allowed).
    """
    if len(set(lengths)) < 2:
        return batched   # nothing padded: nothing to check yet
    rows = sorted(range(len(lengths)), key=lambda r: (lengths[r], r))[:ROWS]   # shortest = most padded
    differ = [r for r in rows if not torch.equal(decode_alone(r).cpu(), batched[r].cpu())]
    if not differ:
        _verified.add(combination(lm))
        return batched
    where = ", ".join(combination(lm))
    if fallback and attention_implementation(lm) != "eager":
        warnings.warn(f"batched decoding differs from one-at-a-time decoding on {len(differ)} of {len(rows)} "
                      f"checked rows ({where}); switching the model to eager attention", RuntimeWarning, stacklevel=3)
        lm.model.set_attn_implementation("eager")
        return check_batch(lm, lengths, redo_batch(), decode_alone, redo_batch, fallback=False)
    raise BatchingMismatchError(
        f"batched decoding differs from one-at-a-time decoding on {len(differ)} of {len(rows)} checked rows "
        f"({where}); results would be wrong. Try load_model(..., attn_implementation='eager'), another "
        f"transformers version, or max_rows=1; JUICE_BATCH_CHECK=off skips this check at your own risk")


__all__ = ["BatchingMismatchError", "POLICIES", "ROWS", "check_batch", "combination", "forget_verifications",
           "needs_check", "policy"]
