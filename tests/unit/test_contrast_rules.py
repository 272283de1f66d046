"""TriState-Bench's decoding rules (CoCoA, COIECD, GRD: :mod:`juice.baselines.cocoa`,
:mod:`juice.baselines.coiecd`, :mod:`juice.baselines.grd`) on hand-built logits: each equals its
definition in the module docstring, row by row."""

from __future__ import annotations

import math

import pytest
import torch

from juice.baselines.cad import contrast
from juice.baselines.cocoa import CocoaPolicy
from juice.baselines.coiecd import CoiecdPolicy
from juice.baselines.grd import CONTEXT, PRIOR, UNDECIDED, GrdPolicy
from juice.engine import StatefulContrastRule


def _logits(rows: int = 5, vocab: int = 40, seed: int = 0) -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    return torch.randn(rows, vocab, generator=g) * 3, torch.randn(rows, vocab, generator=g) * 3


def test_cocoa_scores_follow_the_formula_and_pick_cad_at_alpha_one_half():
    ctx, prior = _logits()
    got = CocoaPolicy()(ctx, prior)
    lc, lp = ctx.log_softmax(-1), prior.log_softmax(-1)
    for r in range(ctx.shape[0]):
        s = 0.5 * lc[r] + 0.5 * lp[r] + (lc[r] - lp[r])
        ordered = s.sort().values
        median = ordered[(len(s) - 1) // 2]          # the lower middle of an even vocabulary
        mad = (s - median).abs().sort().values[(len(s) - 1) // 2] + 1e-8
        torch.testing.assert_close(got[r], s + 100 * ((s - median) / mad).clamp(-100, 100))
    assert torch.equal(got.argmax(-1), contrast(ctx, prior, 0.5).argmax(-1))
    torch.testing.assert_close(CocoaPolicy()(ctx + 7.0, prior - 3.0), got, rtol=0, atol=1e-3)   # log-probabilities


def test_coiecd_uses_cad_on_the_tokens_the_context_makes_likely_and_the_blend_elsewhere():
    # p(. | context) over 6 tokens: 0.5, 0.2, 0.12, 0.1, 0.05, 0.03 -> T = p <= 0.125, F = p < 0.12
    p = torch.tensor([[0.5, 0.2, 0.12, 0.1, 0.05, 0.03]])
    ctx, prior = p.log(), torch.tensor([[0.1, 0.3, 0.2, 0.2, 0.1, 0.1]]).log()
    rule = CoiecdPolicy(alpha=1.0)
    assert rule.constrained(ctx).tolist() == [[True, True, False, True, True, True]]
    got = rule(ctx, prior)[0]
    lc, lp = ctx[0], prior[0]
    cad = 2 * lc - lp
    torch.testing.assert_close(got[[0, 1, 3, 4, 5]], cad[[0, 1, 3, 4, 5]])
    torch.testing.assert_close(got[2], lc[2])   # alpha 1: alpha * lc + (1 - alpha) * lp = lc


def test_coiecd_takes_the_whole_vocabulary_when_only_the_top_token_stands_out():
    p = torch.tensor([[0.9, 0.04, 0.03, 0.02, 0.01]])
    rule = CoiecdPolicy(alpha=0.5)
    c = rule.constrained(p.log())
    assert c.tolist() == [[False, False, True, True, True]]   # T = V; F = p < 4 * 0.01
    prior = torch.tensor([[0.2] * 5]).log()
    torch.testing.assert_close(rule(p.log(), prior)[0, 0], 0.5 * p.log()[0, 0] + 0.5 * prior[0, 0])


def test_coiecd_rows_are_their_own():
    ctx, prior = _logits(rows=4)
    together = CoiecdPolicy()(ctx, prior)
    for r in range(4):
        torch.testing.assert_close(together[r], CoiecdPolicy()(ctx[r:r + 1], prior[r:r + 1])[0])


def _two_token_step(p_ctx: float, p_prior: float) -> tuple[torch.Tensor, torch.Tensor]:
    """Logits over 3 tokens where the context prefers token 0 and the prior token 1."""
    ctx = torch.tensor([[p_ctx, 1 - p_ctx - 0.01, 0.01]]).log()
    prior = torch.tensor([[1 - p_prior - 0.01, p_prior, 0.01]]).log()
    return ctx, prior


def test_grd_is_a_stateful_rule_whose_gate_is_decided_at_the_first_conflict_only():
    rule = GrdPolicy()
    assert isinstance(rule, StatefulContrastRule)
    agree = torch.tensor([[0.7, 0.2, 0.1]]).log()
    scores, gates = rule.step(agree, agree, [UNDECIDED])
    assert gates == [UNDECIDED] and int(scores.argmax()) == 0
    # a confident, sure prior against an unsure context: trust the prior from here on
    ctx, prior = _two_token_step(0.5, 0.95)
    scores, gates = rule.step(ctx, prior, gates)
    assert gates == [PRIOR] and int(scores.argmax()) == 1
    # a later conflict that, alone, would route to the context keeps the decided gate
    ctx2, prior2 = _two_token_step(0.9, 0.55)
    assert rule.step(ctx2, prior2, [UNDECIDED])[1] == [CONTEXT]
    assert rule.step(ctx2, prior2, gates)[1] == [PRIOR]


def test_grd_mixes_at_lambda_short_of_the_weight_where_the_top_tokens_tie():
    ctx, prior = _two_token_step(0.6, 0.8)
    lc, lp = ctx.log_softmax(-1)[0], prior.log_softmax(-1)[0]
    m_c, m_p = lc[0] - lc[1], lp[1] - lp[0]
    tie = m_p / (m_c + m_p)
    at_tie = tie * lc + (1 - tie) * lp
    torch.testing.assert_close(at_tie[0], at_tie[1])   # tau*: the two top tokens tie
    for lam in (0.0, 0.75):
        scores, _ = GrdPolicy(grd_lambda=lam).step(ctx, prior, [PRIOR])
        tau = (1 - lam) * tie
        torch.testing.assert_close(scores[0], tau * lc + (1 - tau) * lp)
    scores, _ = GrdPolicy().step(ctx, prior, [CONTEXT])
    torch.testing.assert_close(scores[0], lc)   # the context trusted: its own distribution


@pytest.mark.parametrize("mode,expected", [("full", CONTEXT), ("conf_only", PRIOR), ("ent_only", CONTEXT)])
def test_grd_gate_modes_read_their_signals(mode, expected):
    # prior confident (0.6 > 0.5) but less certain than the context (entropy higher)
    ctx = torch.tensor([[0.98, 0.01, 0.01]]).log()
    prior = torch.tensor([[0.3, 0.6, 0.1]]).log()
    h = lambda x: float(-(x.exp() * x).sum())   # noqa: E731
    assert h(prior.log_softmax(-1)) > h(ctx.log_softmax(-1)) and math.exp(float(prior.max())) > 0.5
    assert GrdPolicy(gate_mode=mode).step(ctx, prior, [UNDECIDED])[1] == [expected]


def test_grd_refuses_an_unknown_gate_mode():
    with pytest.raises(ValueError, match="gate mode"):
        GrdPolicy(gate_mode="both")


def test_grd_rows_are_their_own():
    ctx, prior = _logits(rows=6, seed=3)
    states = [UNDECIDED, PRIOR, CONTEXT, UNDECIDED, PRIOR, CONTEXT]
    together, gates = GrdPolicy().step(ctx, prior, states)
    for r in range(6):
        alone, gate = GrdPolicy().step(ctx[r:r + 1], prior[r:r + 1], [states[r]])
        torch.testing.assert_close(together[r], alone[0])
        assert gates[r] == gate[0]
