"""Head interventions: the invariants of paper Eq. 1 and Alg. 1-2, on every architecture."""

from __future__ import annotations

import copy

import pytest
import torch

from juice.interventions import Head, added_to_heads, captured_heads, head_coefficients, scaled_heads
from juice.tokens import encode

pytestmark = pytest.mark.gpu   # benchmarks/gpu_check.py runs these on the device

PROMPTS = ["the capital of france is paris . the capital of france is", "tennis golf w40 w41 w42 is"]


def logits(lm, prompts=PROMPTS):
    b = encode(lm.tokenizer, prompts).to(lm.device)
    with torch.no_grad():
        return lm.model(input_ids=b.input_ids, attention_mask=b.attention_mask, position_ids=b.position_ids).logits


def test_scale_zero_changes_nothing(tiny):
    base = logits(tiny)
    g = tiny.heads.geometry
    with scaled_heads(tiny.heads, torch.zeros(g.n_layers, g.n_heads)):
        same = logits(tiny)
    assert torch.equal(base, same)


def _zeroed_slice_copy(lm, layer, head):
    """A deep copy of the model whose output projection ignores `head`'s slice (weights edited)."""
    edited = copy.deepcopy(lm.model)
    from juice.architectures import ModelHeads

    heads = ModelHeads(edited)
    proj = heads.projections[layer]
    d = heads.geometry.head_dim
    with torch.no_grad():
        if heads.adapter.weight_layout == "conv1d":
            proj.weight[head * d:(head + 1) * d, :] = 0
        else:
            proj.weight[:, head * d:(head + 1) * d] = 0
    return edited


@pytest.mark.parametrize("layer,head", [(0, 1), (2, 3)])
def test_minus_one_equals_zeroing_the_slice_and_editing_the_weights(tiny, layer, head):
    g = tiny.heads.geometry
    alphas = head_coefficients(g, {Head(layer, head): -1.0})
    with scaled_heads(tiny.heads, alphas):
        hooked = logits(tiny)

    def zero_slice(_l, x):
        index = torch.tensor([head], device=x.device)
        return x.view(*x.shape[:-1], g.n_heads, -1).index_fill(-2, index, 0).view(x.shape)

    from juice.interventions import projection_input_hooks

    with projection_input_hooks(tiny.heads, {layer: zero_slice}):
        zeroed = logits(tiny)

    edited = _zeroed_slice_copy(tiny, layer, head)
    b = encode(tiny.tokenizer, PROMPTS).to(tiny.device)
    with torch.no_grad():
        by_weights = edited(input_ids=b.input_ids, attention_mask=b.attention_mask, position_ids=b.position_ids).logits
    mask = b.attention_mask.bool()
    torch.testing.assert_close(hooked[mask], zeroed[mask], rtol=0, atol=1e-6)
    torch.testing.assert_close(hooked[mask], by_weights[mask], rtol=0, atol=1e-5)
    assert not torch.allclose(hooked[mask], logits(tiny)[mask])


def test_scaling_by_alpha_equals_scaling_weight_columns(tiny):
    g = tiny.heads.geometry
    layer, head, alpha = 1, 2, 2.5
    with scaled_heads(tiny.heads, head_coefficients(g, {Head(layer, head): alpha})):
        hooked = logits(tiny)
    edited = copy.deepcopy(tiny.model)
    from juice.architectures import ModelHeads

    heads = ModelHeads(edited)
    proj, d = heads.projections[layer], g.head_dim
    with torch.no_grad():
        if heads.adapter.weight_layout == "conv1d":
            proj.weight[head * d:(head + 1) * d, :] *= 1 + alpha
        else:
            proj.weight[:, head * d:(head + 1) * d] *= 1 + alpha
        if getattr(proj, "bias", None) is not None:
            bias_before = proj.bias.clone()
    b = encode(tiny.tokenizer, PROMPTS).to(tiny.device)
    with torch.no_grad():
        by_weights = edited(input_ids=b.input_ids, attention_mask=b.attention_mask, position_ids=b.position_ids).logits
    mask = b.attention_mask.bool()
    torch.testing.assert_close(hooked[mask], by_weights[mask], rtol=0, atol=1e-5)
    if getattr(proj, "bias", None) is not None:
        assert torch.equal(proj.bias, bias_before)


def test_per_row_scaling_equals_one_by_one(tiny):
    g = tiny.heads.geometry
    settings = [{Head(0, 0): 3.0}, {Head(1, 2): -1.0}, {}, {Head(2, 1): 10.0, Head(0, 3): -0.5}]
    prompt = PROMPTS[:1] * len(settings)
    per_row = torch.stack([head_coefficients(g, s) for s in settings])
    with scaled_heads(tiny.heads, per_row):
        batched = logits(tiny, prompt)[:, -1]
    for i, s in enumerate(settings):
        with scaled_heads(tiny.heads, head_coefficients(g, s)):
            single = logits(tiny, prompt[:1])[0, -1]
        torch.testing.assert_close(batched[i], single, rtol=0, atol=1e-5)


def test_capture_then_add_equals_scaling(tiny):
    """Adding beta * (own output) to a head is JuNE's H <- H + beta*H on an unmodified first run."""
    g = tiny.heads.geometry
    heads = {Head(0, 1): 2.0, Head(2, 0): -1.0}
    coeff = head_coefficients(g, heads)
    with captured_heads(tiny.heads, [0, 2]) as saved:
        logits(tiny)
    additions = {l: coeff[l].to(saved[l].device)[None, None, :, None] * saved[l] for l in (0, 2)}
    with added_to_heads(tiny.heads, {0: additions[0]}):
        only_first = logits(tiny)
    with scaled_heads(tiny.heads, head_coefficients(g, {Head(0, 1): 2.0})):
        scaled = logits(tiny)
    mask = encode(tiny.tokenizer, PROMPTS).attention_mask.bool().to(tiny.device)
    torch.testing.assert_close(only_first[mask], scaled[mask], rtol=0, atol=1e-5)


def test_hooks_are_removed_even_on_error(tiny_llama):
    g = tiny_llama.heads.geometry
    with pytest.raises(RuntimeError):
        with scaled_heads(tiny_llama.heads, head_coefficients(g, {Head(0, 0): 1.0})):
            raise RuntimeError("boom")
    assert all(not p._forward_pre_hooks for p in tiny_llama.heads.projections)


def test_head_names_round_trip():
    assert str(Head(6, 3)) == "L6H3" and Head.parse("L6H3") == Head(6, 3)
    with pytest.raises(ValueError):
        Head.parse("6.3")


def test_out_of_range_head_is_refused(tiny_llama):
    with pytest.raises(IndexError, match="out of range"):
        head_coefficients(tiny_llama.heads.geometry, {Head(99, 0): 1.0})
