"""What a steering is: its coefficients, for a head in one set or in both (paper Alg. 1, Alg. 4)."""

from __future__ import annotations

import pytest
import torch

from juice.interventions import Head, HeadSelection, head_coefficients, scaled_heads
from juice.steering import JuICE, JuNE, steering_coefficients
from juice.tokens import encode

pytestmark = pytest.mark.gpu   # benchmarks/gpu_check.py runs these on the device

BOTH = HeadSelection((Head(1, 2), Head(0, 1)), (Head(1, 2), Head(2, 0)))   # L1H2 is in both sets


def _last_probs(lm, ids):
    return lm.model(input_ids=ids).logits[0, -1].float().softmax(-1)


def test_june_on_a_head_in_both_sets_scales_it_twice_in_sequence(tiny_llama):
    """Alg. 4 applied for the positive set, then for the negative one: (1 + b+)(1 + b-) on L1H2."""
    lm = tiny_llama
    g = lm.heads.geometry
    bp, bm = 2.0, -0.5
    coeff = JuNE(lm, BOTH, bp, bm).coefficients
    assert coeff[1, 2].item() == pytest.approx((1 + bp) * (1 + bm) - 1)
    assert coeff[0, 1].item() == bp and coeff[2, 0].item() == bm
    ids = encode(lm.tokenizer, ["the capital of france is"]).input_ids.to(lm.device)
    with torch.no_grad():
        with scaled_heads(lm.heads, coeff.to(lm.device)):
            once = _last_probs(lm, ids)
        first = head_coefficients(g, {Head(1, 2): bp, Head(0, 1): bp})
        second = head_coefficients(g, {Head(1, 2): bm, Head(2, 0): bm})
        with scaled_heads(lm.heads, first.to(lm.device)), scaled_heads(lm.heads, second.to(lm.device)):
            twice = _last_probs(lm, ids)
    torch.testing.assert_close(once.cpu(), twice.cpu(), rtol=1e-5, atol=1e-6)


def test_juice_on_a_head_in_both_sets_adds_both_betas(tiny_llama):
    """Alg. 1 adds beta+ and then beta- times the clean output: the sum."""
    coeff = JuICE(tiny_llama, BOTH, 2.0, -0.5).coefficients
    assert coeff[1, 2].item() == pytest.approx(1.5)
    assert torch.equal(coeff, steering_coefficients(tiny_llama.heads.geometry, BOTH, 2.0, -0.5))


def test_disjoint_sets_give_the_same_coefficients_to_both_methods(tiny_llama):
    sel = HeadSelection((Head(0, 1),), (Head(2, 0),))
    g = tiny_llama.heads.geometry
    assert torch.equal(steering_coefficients(g, sel, 3.0, -1.0, "scale"), steering_coefficients(g, sel, 3.0, -1.0))
    # a head in one set gets its beta exactly, also a beta that float32 rounds (no (1 + 0)(1 + b) - 1)
    june = steering_coefficients(g, sel, 0.3, -0.1, "scale")
    assert june[2, 0].item() == torch.tensor(-0.1).item() and june[0, 1].item() == torch.tensor(0.3).item()
    with pytest.raises(ValueError, match="kinds add or scale"):
        steering_coefficients(g, sel, 3.0, -1.0, "prune")


def test_the_run_kind_is_the_steerings_not_a_name_the_engine_compares(tiny_llama):
    """The engine asks a steering how it runs (`dual_run`, `steers`), never its method's name."""
    from juice.engine import Stream
    from juice.steering import ORIGINAL, Prune

    sel = HeadSelection((Head(1, 2),), (Head(0, 1),))
    juice_, june = JuICE(tiny_llama, sel, 2.0, -1.0), JuNE(tiny_llama, sel, 2.0, -1.0)
    assert juice_.dual_run and juice_.steers
    assert not june.dual_run and june.steers
    assert not ORIGINAL.dual_run and not ORIGINAL.steers
    assert not Prune(tiny_llama, [Head(0, 1)]).dual_run
    assert [Stream(0, s).rows for s in (ORIGINAL, june, juice_)] == [1, 1, 2]
