"""The batched intervention readout: one forward per prompt holds many (head, scale) interventions
as batch rows, growing layer by layer (paper Alg. 2's inner loop, batched). Stage 1
(:mod:`juice.stage1.scoring`), PH3's knock-out scores (:mod:`juice.baselines.ph3`) and the knock-out
analysis read heads through it.

Row 0 is the clean model. The rows that intervene at layer l are appended at layer l's input as
copies of the clean residual stream, since every layer below l is identical for them. Logits
are computed at the last position only.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Sequence
from contextlib import AbstractContextManager, contextmanager
from typing import Any

import torch
from torch import Tensor, nn

from juice.architectures import ModelHeads
from juice.budget import resolve_max_rows
from juice.interventions import Head, projection_input_hooks
from juice.models import LoadedModel
from juice.tokens import encode


@contextmanager
def grow_rows(heads: ModelHeads, first: int, joining: Sequence[int], joins: Sequence[int]) -> Iterator[None]:
    """The growing batch: it enters the model with its `first` rows; at the input of layer
    `joins[i]` (ascending) row `first + i` is appended as a copy of row `joining[i]` (< `first`),
    since every layer below is the same computation for both. Every per-row argument of a layer
    (a tensor of >= 2 dimensions whose first is the entering batch, `first` > 1: the attention
    mask, position ids and embeddings) is indexed alike, so an appended row sees its source row's
    mask and positions; with one entering row they broadcast. Each layer's KV cache, if any,
    holds the rows present there.

    Args:
        first: rows from the embeddings on, hidden states `[first, seq, d]`.
        joining: per appended row, the row it copies.
        joins: per appended row, the layer where it joins (ascending).
    """
    if not joining:
        yield
        return
    rows = list(range(first)) + list(joining)
    handles = []

    def make(layer: int):
        before = first + sum(j < layer for j in joins)
        after = first + sum(j <= layer for j in joins)
        index = torch.tensor(rows[:after])
        new = torch.tensor(rows[before:after])

        def per_row(value: Any) -> Any:
            if isinstance(value, Tensor) and value.dim() >= 2 and value.shape[0] == first and first > 1:
                return value.index_select(0, index.to(value.device))
            if isinstance(value, tuple) and value and all(isinstance(v, Tensor) for v in value):
                return tuple(per_row(v) for v in value)
            return value

        def pre_hook(module: nn.Module, args: tuple, kwargs: dict):
            hidden = args[0] if args else kwargs["hidden_states"]
            if after > before:
                hidden = torch.cat([hidden, hidden.index_select(0, new.to(hidden.device))])
            kwargs = {k: per_row(v) for k, v in kwargs.items() if k != "hidden_states"}
            if args:
                return (hidden, *(per_row(a) for a in args[1:])), kwargs
            return args, {**kwargs, "hidden_states": hidden}

        return pre_hook

    try:
        for layer in range(joins[0], len(heads.layers)):
            handles.append(heads.layers[layer].register_forward_pre_hook(make(layer), with_kwargs=True))
        yield
    finally:
        for h in handles:
            h.remove()


def grow_batch(heads: ModelHeads, rows_at: dict[int, int]) -> AbstractContextManager:
    """At the input of each layer l in `rows_at`, append `rows_at[l]` copies of row 0 (the growing
    batch of one prompt: an intervention first acting at layer l shares the clean forward below
    l; :func:`grow_rows` with one entering row).

    Args:
        rows_at: layer -> rows to append there; hidden states go `[b, seq, d]` -> `[b + n, seq, d]`.
    """
    joins = [layer for layer in sorted(rows_at) for _ in range(rows_at[layer])]
    return grow_rows(heads, 1, [0] * len(joins), joins)


def _scale_new_rows(heads: ModelHeads, plan: dict[int, list[tuple[int, float]]]):
    """o_proj hooks: at layer l, the last len(plan[l]) rows scale (head, alpha) each."""
    n_heads = heads.geometry.n_heads

    def fn(layer: int, x: Tensor) -> Tensor:
        items = plan[layer]
        factors = torch.ones(len(items), n_heads, dtype=x.dtype, device=x.device)
        for r, (head, alpha) in enumerate(items):
            factors[r, head] = 1 + alpha
        h = x.view(*x.shape[:-1], n_heads, -1)
        tail = h[-len(items):] * factors[:, None, :, None]
        return torch.cat([h[: -len(items)], tail]).reshape(x.shape)

    return projection_input_hooks(heads, {layer: fn for layer in plan})


@torch.inference_mode()
def growing_readout(
    lm: LoadedModel,
    prompt: str,
    order: Sequence[int],
    layer_of: Callable[[int], int],
    intervene: Callable[[dict[int, list[int]]], AbstractContextManager],
    readout: Callable[[Tensor], Tensor],
    max_rows: int | str = 256,
) -> tuple[Tensor, Tensor]:
    """The growing-batch sweep every single-intervention readout shares: one forward per chunk of
    `max_rows` interventions, each joining the batch at its layer (:func:`grow_batch`), the LM head
    at the last position only.

    Args:
        prompt: one prompt (no padding).
        order: the intervention indices, sorted by layer (ties in any fixed order).
        layer_of: an intervention's layer (where its row joins the batch).
        intervene: given layer -> the chunk's interventions joining there (in row order: they
            are the last rows of the batch at that layer), a context manager applying them.
        readout: maps last-position logits `[rows, vocab]` (float32) to `[rows, ...]`.
        max_rows: most intervention rows per forward (memory bound), or "auto" to fit a share of
            the free memory (:func:`juice.budget.auto_max_rows`).

    Returns:
        (clean readout `[...]`, `[len(order), ...]` readouts, indexed like the interventions).
    """
    ids = encode(lm.tokenizer, [prompt]).input_ids.to(lm.device)
    max_rows = resolve_max_rows(max_rows, lm, ids.shape[1])
    values = None
    clean = None
    for start in range(0, max(len(order), 1), max_rows):
        chunk = list(order[start:start + max_rows])
        plan: dict[int, list[int]] = {}
        for i in chunk:
            plan.setdefault(layer_of(i), []).append(i)
        with grow_batch(lm.heads, {l: len(v) for l, v in plan.items()}), intervene(plan):
            hidden = lm.model.base_model(input_ids=ids, use_cache=False).last_hidden_state[:, -1]
        out = readout(lm.logits(hidden).float()).cpu()
        if values is None:
            values = torch.zeros(len(order), *out.shape[1:], dtype=out.dtype)
        clean = out[0]
        # rows were appended layer by layer in plan order, which is the chunk's (layer-sorted) order
        values[chunk] = out[1:]
    return clean, values


def intervention_readout(
    lm: LoadedModel,
    prompt: str,
    interventions: Sequence[tuple[Head, float]],
    readout: Callable[[Tensor], Tensor],
    max_rows: int | str = 256,
) -> tuple[Tensor, Tensor]:
    """Last-position readouts of the clean model and of each single-head intervention, batched.

    Each intervention scales one head at every position, `H <- H + alpha * H` (alpha = -1 zeroes
    it). One forward per chunk of `max_rows` rows; the batch grows layer by layer
    (:func:`growing_readout`); the LM head runs at the last position only.

    Args:
        interventions: (head, alpha) pairs.
        readout: maps last-position logits `[rows, vocab]` (float32) to `[rows, ...]`.
        max_rows: most intervention rows per forward (memory bound), or "auto" to fit a share of
            the free memory (:func:`juice.budget.auto_max_rows`).

    Returns:
        (clean readout `[...]`, `[len(interventions), ...]` readouts under each intervention).
    """
    order = sorted(range(len(interventions)), key=lambda i: interventions[i][0])

    def intervene(plan: dict[int, list[int]]) -> AbstractContextManager:
        return _scale_new_rows(lm.heads, {layer: [(interventions[i][0].head, interventions[i][1]) for i in idx]
                                          for layer, idx in plan.items()})

    return growing_readout(lm, prompt, order, lambda i: interventions[i][0].layer, intervene, readout, max_rows)


def intervention_probs(
    lm: LoadedModel, prompt: str, target_token: int, interventions: Sequence[tuple[Head, float]],
    max_rows: int | str = 256,
) -> tuple[float, Tensor]:
    """Probability of `target_token` at the last position, clean and under each intervention
    (:func:`intervention_readout` with a softmax readout).

    Returns:
        (clean probability, `[len(interventions)]` probabilities under each intervention).
    """
    clean, probs = intervention_readout(
        lm, prompt, interventions, lambda logits: logits.softmax(-1)[:, target_token], max_rows)
    return float(clean), probs
