"""Head interventions as context managers built on forward pre-hooks.

A head's output is its slice of the input to the layer's attention output projection (paper
Sec. 3, Eq. 1): reshaped, that input is `[batch, seq, n_heads, head_dim]`. Every manager here
registers one forward pre-hook per affected projection, rewrites that input, and removes its
hooks in `finally`. No module is replaced and no weight is touched.

Coefficients are given per batch row, so many interventions share one batched forward:
a tensor of shape `[batch, n_layers, n_heads]` (or `[n_layers, n_heads]` for all rows).
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Callable, NamedTuple

import torch
from torch import Tensor, nn

from juice.architectures import HeadGeometry, ModelHeads


class Head(NamedTuple):
    """An attention head: layer and query-head index, both counted from 0. Prints as `L6H3`."""

    layer: int
    head: int

    def __str__(self) -> str:
        return f"L{self.layer}H{self.head}"

    @classmethod
    def parse(cls, text: str) -> "Head":
        """Parse `L6H3` into `Head(6, 3)`.

        Raises:
            ValueError: not of that form.
        """
        text = text.strip().upper()
        if not text.startswith("L") or "H" not in text:
            raise ValueError(f"not a head name like 'L6H3': {text!r}")
        layer, head = text[1:].split("H", 1)
        return cls(int(layer), int(head))


@dataclass(frozen=True)
class HeadSelection:
    """Heads to steer: `positive` get beta+, `negative` get beta- (paper Alg. 1 output)."""

    positive: tuple[Head, ...]
    negative: tuple[Head, ...]



def check_heads(heads: Sequence[Head], geometry: HeadGeometry) -> None:
    """Raise IndexError if a head or layer index is out of range for `geometry`."""
    for layer, head in heads:
        if not (0 <= layer < geometry.n_layers and 0 <= head < geometry.n_heads):
            raise IndexError(
                f"head L{layer}H{head} is out of range for a model of {geometry.n_layers} layers x "
                f"{geometry.n_heads} heads"
            )


def head_coefficients(geometry: HeadGeometry, values: Mapping[Head, float]) -> Tensor:
    """A dense `[n_layers, n_heads]` float tensor holding `values` at their heads, 0 elsewhere.

    Raises:
        IndexError: a head is out of range.
    """
    check_heads(list(values), geometry)
    coefficients = torch.zeros(geometry.n_layers, geometry.n_heads)
    for (layer, head), value in values.items():
        coefficients[layer, head] = value
    return coefficients


def _split_heads(x: Tensor, n_heads: int) -> Tensor:
    """[batch, seq, n_heads * head_dim] -> [batch, seq, n_heads, head_dim] (a view)."""
    return x.view(*x.shape[:-1], n_heads, x.shape[-1] // n_heads)


PreHook = Callable[[int, Tensor], Tensor]
"""(layer, projection input `[batch, seq, n_heads * head_dim]`) -> new projection input."""


@contextmanager
def projection_input_hooks(heads: ModelHeads, hooks: Mapping[int, PreHook]) -> Iterator[None]:
    """Register `hooks[layer]` as a forward pre-hook on each listed layer's output projection.

    The building block of every intervention here. Hooks are removed on exit, whatever happens.
    """
    handles = []
    try:
        for layer, fn in hooks.items():
            def pre_hook(module: nn.Module, args: tuple, _fn: PreHook = fn, _layer: int = layer):
                return (_fn(_layer, args[0]), *args[1:])

            handles.append(heads.projections[layer].register_forward_pre_hook(pre_hook))
        yield
    finally:
        for handle in handles:
            handle.remove()


def _per_row(coefficients: Tensor, layer: int, x: Tensor) -> Tensor:
    """Coefficients of one layer shaped to broadcast over `[batch, seq, n_heads, head_dim]`."""
    c = coefficients[..., layer, :].to(device=x.device, dtype=x.dtype)
    if c.dim() == 1:
        return c[None, None, :, None]
    if c.shape[0] != x.shape[0]:
        raise ValueError(f"coefficients for {c.shape[0]} rows, batch has {x.shape[0]}")
    return c[:, None, :, None]


def _active_layers(coefficients: Tensor) -> list[int]:
    nonzero = coefficients.reshape(-1, *coefficients.shape[-2:]).ne(0).any(dim=0).any(dim=-1)
    return [int(i) for i in torch.nonzero(nonzero).flatten()]


@contextmanager
def scaled_heads(heads: ModelHeads, alphas: Tensor) -> Iterator[None]:
    """Scale head outputs in place of the forward: `H <- H + alpha * H` (paper Alg. 2).

    alpha = 0 changes nothing; alpha = -1 zeroes the head's output (knock-out).

    Args:
        heads: the model bound to its adapter.
        alphas: `[n_layers, n_heads]` for every row, or `[batch, n_layers, n_heads]` per row.
    """
    alphas = alphas.detach()

    def fn(layer: int, x: Tensor) -> Tensor:
        h = _split_heads(x, heads.geometry.n_heads)
        return (h * (1 + _per_row(alphas, layer, x))).reshape(x.shape)

    with projection_input_hooks(heads, {layer: fn for layer in _active_layers(alphas)}):
        yield


@contextmanager
def added_to_heads(heads: ModelHeads, additions: Mapping[int, Tensor]) -> Iterator[None]:
    """Add given tensors to head outputs: `H <- H + delta` (paper Alg. 1, step two).

    Args:
        additions: layer -> `[batch, seq, n_heads, head_dim]` to add to that layer's head outputs
            (zeros for heads left alone). `seq` must match the forward's sequence length (the new
            positions only, when decoding with a KV cache).
    """

    def fn(layer: int, x: Tensor) -> Tensor:
        delta = additions[layer].to(device=x.device, dtype=x.dtype)
        return (_split_heads(x, heads.geometry.n_heads) + delta).reshape(x.shape)

    with projection_input_hooks(heads, {layer: fn for layer in additions}):
        yield


@contextmanager
def captured_heads(heads: ModelHeads, layers: Sequence[int]) -> Iterator[dict[int, Tensor]]:
    """Capture the head outputs of `layers` on each forward (paper Alg. 1, "Save Important Streams").

    Yields a dict filled on every forward with layer -> `[batch, seq, n_heads, head_dim]`
    (a detached copy; a later forward overwrites it).
    """
    store: dict[int, Tensor] = {}

    def fn(layer: int, x: Tensor) -> Tensor:
        store[layer] = _split_heads(x, heads.geometry.n_heads).detach().clone()
        return x

    with projection_input_hooks(heads, {layer: fn for layer in layers}):
        yield store


@dataclass(frozen=True)
class RowPlan:
    """Per-row head interventions for one batched forward (JuNE and JuICE rows side by side).

    Row `r`'s head outputs become `H[r] * (1 + scale[r]) + add[r] * H[source[r]]`, where the source
    row is an unmodified (clean) row of the same batch holding the same tokens. Batch rows never
    interact in a forward pass, so the source row *is* JuICE's first run and row `r` its second.

    Attributes:
        scale: `[rows, n_layers, n_heads]`, JuNE's beta (paper Alg. 4); 0 leaves a head alone.
        add: `[rows, n_layers, n_heads]`, JuICE's beta (paper Alg. 1, step two).
        source: `[rows]` long, the clean row whose outputs row `r` adds; -1 for none.
    """

    scale: Tensor
    add: Tensor
    source: Tensor

    def __post_init__(self) -> None:
        rows = self.source.shape[0]
        if self.scale.shape[0] != rows or self.add.shape[0] != rows:
            raise ValueError("scale, add and source must have one entry per row")
        sources = self.source[self.source >= 0]
        if sources.numel() and (self.source[sources].ge(0).any() or self.scale[sources].ne(0).any()):
            raise ValueError("a source row must be a clean row (no scaling, no source of its own)")
        if self.add[self.source < 0].ne(0).any():
            raise ValueError("a row with additions needs a source row")


@contextmanager
def planned_rows(heads: ModelHeads, plan: RowPlan) -> Iterator[None]:
    """Apply a :class:`RowPlan` on every forward inside the block.

    A forward whose batch holds only the plan's first m rows at some layer (the growing prefill
    of :func:`juice.engine.generate`: a steered row joins the batch at the first layer it
    steers) applies the plan's first m rows there; the rows not yet in the batch must have
    coefficients 0 at that layer."""
    scale, add = plan.scale.detach(), plan.add.detach()
    added_rows = torch.nonzero(plan.source >= 0).flatten()
    sources = plan.source[added_rows]
    scaled_layers = set(_active_layers(scale))
    added_layers = set(_active_layers(add))
    rows = plan.source.shape[0]

    def fn(layer: int, x: Tensor) -> Tensor:
        h = _split_heads(x, heads.geometry.n_heads)
        m = x.shape[0]
        out = h * (1 + _per_row(scale if m == rows else scale[:m], layer, x)) if layer in scaled_layers else h.clone()
        if layer in added_layers:
            present = added_rows if m == rows else added_rows[added_rows < m]
            beta = add[present, layer].to(device=x.device, dtype=x.dtype)[:, None, :, None]
            src = sources if m == rows else plan.source[present]
            out[present.to(x.device)] += beta * h[src.to(x.device)]
        return out.reshape(x.shape)

    with projection_input_hooks(heads, {layer: fn for layer in sorted(scaled_layers | added_layers)}):
        yield
