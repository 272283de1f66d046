"""The post-norm intervention site: a head's steering applied after the attention block's output
norm instead of at the output projection's input (beyond the paper; `juice analyze norm`).

On architectures that normalize the attention block's output before the residual add (Gemma 2
and 3: `post_attention_layernorm`; OLMo 2 too), a head's change at the output projection's input
passes through that norm, `post_norm(y) = w * y / rms(y)`, which rescales the whole block's
output by the new `rms(y)`: part of the intervention is undone.

**Definition.** Let `y = o_proj(H)` be a row's attention output before the norm (`[batch, seq,
hidden]`) and `g(y) = w_eff / sqrt(mean(y^2) + eps)` the norm's gain (`w_eff` the norm's effective
weight, `1 + weight` on Gemma). The *contribution of head h to the residual stream* is

    c_h = g(y) * (W_h H_h)        ([batch, seq, hidden]; W_h: the head's columns of o_proj)

so that `sum_h c_h = post_norm(y)` exactly (no bias is part of a head's contribution). A row of
a :class:`juice.interventions.RowPlan` applied here leaves `y` and the norm alone and adds to the
block's output `sum_h scale_h * c_h` (JuNE: the row's own contributions) and
`sum_h add_h * c_h[source]` (JuICE: the clean run's). With every beta 0 both equal the unmodified
model; without an output norm the gain is 1 and, by linearity of the output projection, the
post-norm site *equals* the output projection's input (tested on Llama).

A steering picks its site (:attr:`juice.steering.Steering.site`); :func:`juice.engine.generate`
and :func:`juice.engine.likelihood.sequence_logits` apply :func:`post_norm_rows` for "post_norm".
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager

import torch
from torch import Tensor, nn

from juice.architectures import ModelHeads
from juice.interventions import RowPlan, projection_input_hooks


POST_NORMS: dict[str, str] = {
    "gemma2": "post_attention_layernorm",
    "gemma3_text": "post_attention_layernorm",
    "olmo2": "post_attention_layernorm",
}
"""model_type -> the decoder layer's module that normalizes the attention output before the
residual add. Elsewhere the attention block's contribution is the output projection's output."""


def post_norm_modules(heads: ModelHeads) -> list[nn.Module] | None:
    """Each layer's attention output norm, or None when the architecture has none."""
    path = POST_NORMS.get(heads.model.config.model_type)
    if path is None:
        return None
    return [getattr(layer, path) for layer in heads.layers]


def _norm_eps(norm: nn.Module) -> float:
    for name in ("eps", "variance_epsilon"):
        if isinstance(getattr(norm, name, None), float):
            return float(getattr(norm, name))
    raise ValueError(f"{type(norm).__name__}: not an RMS norm with an eps (the post-norm variant needs one)")


def norm_gain(norm: nn.Module, y: Tensor, weight_cache: dict[int, Tensor] | None = None) -> Tensor:
    """The per-coordinate gain `g(y)` of an RMS norm: `norm(y) = g(y) * y`.

    `w_eff` is read from the norm itself, `norm(ones) * sqrt(1 + eps)` (so both `weight` and
    Gemma's `1 + weight` work).

    Args:
        y: `[..., hidden]`, the norm's input.

    Returns:
        `[..., hidden]` float32 gain.
    """
    key = id(norm)
    if weight_cache is None or key not in weight_cache:
        eps = _norm_eps(norm)
        ones = torch.ones(1, y.shape[-1], device=y.device, dtype=y.dtype)
        w_eff = norm.forward(ones).float()[0] * math.sqrt(1 + eps)   # forward(): no hooks
        if weight_cache is not None:
            weight_cache[key] = w_eff
    else:
        w_eff = weight_cache[key]
    eps = _norm_eps(norm)
    return w_eff * torch.rsqrt(y.float().pow(2).mean(-1, keepdim=True) + eps)


def head_contributions(heads: ModelHeads, layer: int, h: Tensor, head_ids: Sequence[int]) -> Tensor:
    """`W_h H_h` for the listed heads of one layer: the output projection applied to one head's
    slice alone (no bias).

    Args:
        h: `[batch, seq, n_heads * head_dim]`, the output projection's input.

    Returns:
        `[batch, seq, len(head_ids), hidden]`.
    """
    d = heads.geometry.head_dim
    weight = heads.projections[layer].weight
    parts = []
    for head in head_ids:
        x = h[..., head * d:(head + 1) * d]
        if heads.adapter.weight_layout == "conv1d":
            parts.append(x @ weight[head * d:(head + 1) * d, :])
        else:
            parts.append(x @ weight[:, head * d:(head + 1) * d].T)
    return torch.stack(parts, dim=-2)


def _active(coefficients: Tensor, layer: int) -> list[int]:
    return [int(i) for i in coefficients[:, layer].ne(0).any(0).nonzero().flatten()]


@contextmanager
def post_norm_rows(heads: ModelHeads, plan: RowPlan) -> Iterator[None]:
    """Apply a :class:`juice.interventions.RowPlan` *after* the attention output norm (module
    docstring): row r's attention contribution to the residual stream becomes

        post_norm(y[r]) + sum_h scale[r, l, h] * c_h[r] + sum_h add[r, l, h] * c_h[source[r]].

    On an architecture without an output norm, the contribution is the output projection's
    output and the gain is 1. Registers a pre-hook on each active layer's output projection
    (saves its input) and a forward hook on the module whose output is added to the residual
    stream (the norm, or the projection); all removed on exit.

    Raises:
        ValueError: the norm's output is not `g(y) * y` (not an RMS norm; checked every forward).
    """
    scale, add = plan.scale.detach(), plan.add.detach()
    added_rows = torch.nonzero(plan.source >= 0).flatten()
    sources = plan.source[added_rows]
    norms = post_norm_modules(heads)
    layers = sorted({l for l in range(heads.geometry.n_layers) if _active(scale, l) or _active(add, l)})
    saved: dict[int, Tensor] = {}
    weights: dict[int, Tensor] = {}

    def save_input(layer: int, x: Tensor) -> Tensor:
        saved[layer] = x
        return x

    def make_hook(layer: int) -> Callable:
        head_ids = sorted(set(_active(scale, layer)) | set(_active(add, layer)))

        def hook(module: nn.Module, args: tuple, output: Tensor) -> Tensor:
            contributions = head_contributions(heads, layer, saved.pop(layer), head_ids).float()
            if norms is not None:
                y = args[0]
                gain = norm_gain(module, y, weights)
                if not torch.allclose(output.float(), gain * y.float(), rtol=1e-3, atol=1e-4 * float(output.detach().abs().max()) + 1e-6):
                    raise ValueError(f"{type(module).__name__} at layer {layer} is not an RMS norm of the form "
                                     "g(y) * y; the post-norm variant is not defined for it")
                contributions = contributions * gain[..., None, :]
            idx = torch.tensor(head_ids)
            s = scale[:, layer, idx].to(device=output.device, dtype=torch.float32)
            delta = torch.einsum("bshk,bh->bsk", contributions, s)
            if added_rows.numel():
                a = add[added_rows, layer][:, idx].to(device=output.device, dtype=torch.float32)
                rows = added_rows.to(output.device)
                delta[rows] += torch.einsum("bshk,bh->bsk", contributions[sources.to(output.device)], a)
            return (output.float() + delta).to(output.dtype)

        return hook

    handles = []
    try:
        with projection_input_hooks(heads, {layer: save_input for layer in layers}):
            for layer in layers:
                module = norms[layer] if norms is not None else heads.projections[layer]
                handles.append(module.register_forward_hook(make_hook(layer)))
            yield
    finally:
        for handle in handles:
            handle.remove()


__all__ = ["POST_NORMS", "head_contributions", "norm_gain", "post_norm_modules", "post_norm_rows"]
