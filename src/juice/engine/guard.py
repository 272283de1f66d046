"""A runtime guard: batched decoding must equal one-at-a-time decoding.

Batched generation left-pads prompts of different lengths. On some device / attention-kernel /
library combinations that is not exact: with transformers 5.17 and SDPA attention on CUDA,
left-padded rows came back as garbage while eager attention and the CPU were exact (issue 14;
transformers #47651 reports the same family: a fully masked padded query row turns into NaN in
PyTorch's SDPA kernels, and the NaN reaches the real tokens). So, the first time a process
decodes a padded batch of a model on a (device type, attention implementation, dtype,
transformers version) it has not verified, the guard re-decodes a few of that batch's most
padded rows one at a time and compares tokens, first-step probabilities and teacher-forced
log-probabilities (:func:`check_batch`):

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

from juice.models import LoadedModel

ROWS = 4
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
    return str(getattr(lm.config, "_attn_implementation", None) or "unknown")


def combination(lm: LoadedModel) -> tuple[str, ...]:
    """What a verification holds for: the model (class, model_type, name: masks differ by
    architecture), device type, attention implementation, dtype, transformers version."""
    import transformers

    return (type(lm.model).__name__, str(lm.config.model_type), lm.name, lm.device.type,
            attention_implementation(lm), str(lm.dtype), transformers.__version__)


def needs_check(lm: LoadedModel) -> bool:
    """True if the next padded batch of this model must be checked (policy and not yet verified)."""
    p = policy()
    if p == "off" or (p == "auto" and lm.device.type == "cpu"):
        return False
    return combination(lm) not in _verified


def forget_verifications() -> None:
    """Clear the verified combinations (tests)."""
    _verified.clear()


def _row(result, r: int) -> tuple:
    return tuple(None if t is None else t[r].detach().cpu().float() for t in result)


def _compare(alone: tuple, batched: tuple, atol: float) -> str:
    """"same"; "tokens" (other greedy tokens); "broken" (non-finite or distant probabilities)."""
    for a, b in zip(alone[1:], batched[1:]):
        if a is not None and not (torch.isfinite(b).all() and torch.allclose(a, b, atol=atol, rtol=0)):
            return "broken"
    return "same" if torch.equal(alone[0], batched[0]) else "tokens"


def check_batch(
    lm: LoadedModel,
    lengths: Sequence[int | tuple[int, ...]],
    batched: tuple,
    decode_alone: Callable[[int], tuple],
    redo_batch: Callable[[], tuple],
    *,
    fallback: bool = True,
) -> tuple:
    """Check one padded batch (see the module docstring) and return its results.

    A checked row agrees when its tokens are equal and its first-step probabilities and forced
    log-probabilities (teacher forcing, where the tokens agree by construction) are finite and
    within `atol` (1e-3 in float32, 5e-2 in half precision). In half precision one row of `ROWS`
    may differ in its tokens (a near-tie flipped by other kernels' rounding); in float32 none may,
    and no row may have non-finite or distant probabilities in any precision.

    Args:
        lengths: `[rows]` prompt length (tokens) of each row of the batch (a tuple for rows of
            several prompts, e.g. CAD's two branches); the shortest are the most padded.
        batched: the batch's results as decoded together: (`[rows, new_tokens]` tokens,
            `[rows, k]` first-step probabilities or None, `[rows, new_tokens]` forced
            log-probabilities or None).
        decode_alone: row index -> the same triple for that row decoded alone (batch of 1).
        redo_batch: decodes the batch again (after a switch to eager attention), returns the triple.
        fallback: switch to eager attention on a mismatch instead of raising at once.

    Returns:
        The triple that agrees with one-at-a-time decoding on the checked rows.

    Raises:
        BatchingMismatchError: the rows differ (after the eager fallback, if allowed).
    """
    if len(set(lengths)) < 2:
        return batched   # nothing padded: nothing to check yet
    half = lm.dtype in (torch.bfloat16, torch.float16)
    atol, allowed = (5e-2, 1) if half else (1e-3, 0)
    rows = sorted(range(len(lengths)), key=lambda r: (lengths[r], r))[:ROWS]   # shortest = most padded
    verdicts = [_compare(_row(decode_alone(r), 0), _row(batched, r), atol) for r in rows]
    differ = [v for v in verdicts if v != "same"]
    if "broken" not in differ and len(differ) <= (allowed if len(rows) == ROWS else 0):
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
