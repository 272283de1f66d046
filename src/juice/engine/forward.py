"""The engine's forward pass and KV cache: one cached forward of the base model returning the
last position's hidden state, its compiled form for the static cache, the site where a row plan
is applied, and the cache edits of a batch whose rows join and leave (left padding, trimming,
appending rows)."""

from __future__ import annotations

import functools
import inspect
import weakref
from collections.abc import Callable, Iterable
from contextlib import AbstractContextManager

import torch
from torch import Tensor

from juice.architectures import ModelHeads
from juice.interventions import RowPlan, planned_rows
from juice.models import LoadedModel
from juice.post_norm import post_norm_rows
from juice.steering import Steering


@functools.lru_cache(maxsize=None)
def cache_keyword(model_class: type) -> str:
    """The name under which `model_class.forward` takes the KV cache: "cache" from transformers
    5.24 on (where `past_key_values` is deprecated, removed in 5.40), else "past_key_values"
    (5.23, the oldest version juice supports)."""
    return "cache" if "cache" in inspect.signature(model_class.forward).parameters else "past_key_values"


def forward_last(lm: LoadedModel, input_ids: Tensor, mask: Tensor, positions: Tensor, past=None,
                 every_position: bool = False):
    """One cached forward of the base model (no LM head).

    Args:
        input_ids, mask, positions: `[batch, seq]` (left padded; see :class:`juice.tokens.Batch`).
        past: the KV cache of the previous steps, or None.
        every_position: return the hidden state of every position, not only the last (a
            prefill whose prompt log-probabilities are asked for, the server's `echo`).

    Returns:
        (`[batch, hidden]` last-position hidden state, or `[batch, seq, hidden]` with
        `every_position`; the updated KV cache).
    """
    base = lm.model.base_model
    keyword = cache_keyword(type(base))
    out = base(input_ids=input_ids, attention_mask=mask, position_ids=positions, use_cache=True, **{keyword: past})
    return (out.last_hidden_state if every_position else out.last_hidden_state[:, -1]), out[keyword]


_COMPILED: "weakref.WeakKeyDictionary[torch.nn.Module, Callable]" = weakref.WeakKeyDictionary()


def compiled_forward(lm: LoadedModel) -> Callable:
    """:func:`forward_last` through `torch.compile`, one compiled function per model (kept while
    the model lives): mode "reduce-overhead" (CUDA graphs) on CUDA, the default mode elsewhere.
    The head hooks of :func:`juice.interventions.planned_rows` are traced with it. For the
    fixed-shape steps of the static KV cache (:func:`juice.engine.generate`, `compile_step`). Shapes
    are left to torch's automatic dynamic: Gemma 3's static sliding-window cache layers keep their
    length as a Python int, which would otherwise recompile every step; with it the second step
    recompiles once with that length symbolic (measured on tiny Gemma 3: 1 recompile in 12 steps).
    Its calls run with dynamo's guards on module hooks (`skip_nnmodule_hook_guards=False`; torch
    skips them by default), else a step traced without head hooks (a chunk of Original or CAD
    streams) would be reused, silently, for later chunks of steered rows."""
    fn = _COMPILED.get(lm.model)
    if fn is None:
        mode = "reduce-overhead" if lm.device.type == "cuda" else "default"
        compiled = torch.compile(forward_last, mode=mode, dynamic=None)

        def fn(*args, **kwargs):
            with torch._dynamo.config.patch(skip_nnmodule_hook_guards=False):
                return compiled(*args, **kwargs)

        _COMPILED[lm.model] = fn
    return fn


def plan_applier(steerings: Iterable[Steering]) -> Callable[[ModelHeads, RowPlan], AbstractContextManager]:
    """How the row plans of these steerings are applied: at their common site
    (:data:`juice.steering.SITES`); Original steerings have none.

    Raises:
        ValueError: the steerings act at different sites (decode each site in its own call).
    """
    sites = {s.site for s in steerings if s.steers}
    if len(sites) > 1:
        raise ValueError(f"the steered streams of one call must share a site, got {sorted(sites)}")
    return post_norm_rows if sites == {"post_norm"} else planned_rows


def cache_layers(cache) -> list:
    """The layers of a transformers Cache.

    Raises:
        TypeError: a cache without layers.
    """
    layers = getattr(cache, "layers", None)
    if layers is None:
        raise TypeError(f"continuous batching needs a transformers Cache with layers, got {type(cache).__name__}")
    return layers


def _stored(layer, length: int) -> int:
    """Positions a layer keeps of `length` cached ones (a sliding-window layer its last W - 1)."""
    window = getattr(layer, "sliding_window", None)
    return length if window is None else min(length, window - 1)


def pad_cache(cache, length: int, to: int) -> None:
    """Left-pad every layer of `cache` (holding `length` positions) to `to` positions with zeros
    (the attention mask hides them)."""
    if to == length:
        return
    for layer in cache_layers(cache):
        if not getattr(layer, "is_initialized", False):
            continue
        extra = _stored(layer, to) - _stored(layer, length)
        if extra:
            pad = layer.keys.new_zeros(*layer.keys.shape[:2], extra, layer.keys.shape[-1])
            layer.keys = torch.cat([pad, layer.keys], dim=-2)
            pad = layer.values.new_zeros(*layer.values.shape[:2], extra, layer.values.shape[-1])
            layer.values = torch.cat([pad, layer.values], dim=-2)
        if hasattr(layer, "cumulative_length"):
            layer.cumulative_length = to


def trim_cache(cache, length: int, drop: int) -> None:
    """Drop the first `drop` of `length` positions of every layer (masked in every row)."""
    for layer in cache_layers(cache):
        if not getattr(layer, "is_initialized", False):
            continue
        cut = _stored(layer, length) - _stored(layer, length - drop)
        if cut:
            layer.keys, layer.values = layer.keys[:, :, cut:], layer.values[:, :, cut:]
        if hasattr(layer, "cumulative_length"):
            layer.cumulative_length = length - drop


def concat_cache(cache, other) -> None:
    """Append `other`'s rows to `cache` (both hold the same number of positions)."""
    for layer, extra in zip(cache_layers(cache), cache_layers(other), strict=True):
        if getattr(layer, "is_initialized", False):
            layer.keys = torch.cat([layer.keys, extra.keys], dim=0)
            layer.values = torch.cat([layer.values, extra.values], dim=0)


__all__ = ["cache_layers", "compiled_forward", "concat_cache", "forward_last", "pad_cache", "plan_applier",
           "trim_cache"]
