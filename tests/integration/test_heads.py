"""Stage 1: batched exact head scoring equals one intervention per forward; Alg. 3 selection."""

from __future__ import annotations

import json

import pytest
import torch

from juice.data.paraconflict import build_domain
from juice.stage1 import HeadScores, HeadsFileMismatchError, load_heads, make_artifact, save_heads, score_heads, scoring_prompts, select_heads
from juice.interventions import Head
from juice.reference import intervention_probs_naive
from juice.readout import intervention_probs

PROMPT = "the capital of france is paris . the capital of france is"


def all_interventions(lm, alphas=(1.0, -1.0, 30.0)):
    g = lm.heads.geometry
    return [(Head(l, h), a) for l in range(g.n_layers) for h in range(g.n_heads) for a in alphas]


@pytest.mark.parametrize("max_rows", [256, 5])
def test_batched_growing_scoring_equals_one_forward_per_intervention(tiny, max_rows):
    inter = all_interventions(tiny)
    clean, fast = intervention_probs(tiny, PROMPT, 9, inter, max_rows=max_rows)
    clean_ref, slow = intervention_probs_naive(tiny, PROMPT, 9, inter)
    assert clean == pytest.approx(clean_ref, abs=1e-6)
    torch.testing.assert_close(fast, slow, rtol=0, atol=1e-6)
    assert (slow - clean_ref).abs().max() > 1e-4  # the interventions do something


def test_scale_zero_scores_zero(tiny_llama):
    _, p = intervention_probs(tiny_llama, PROMPT, 9, all_interventions(tiny_llama, (0.0,)))
    clean, _ = intervention_probs_naive(tiny_llama, PROMPT, 9, [])
    torch.testing.assert_close(p, torch.full_like(p, clean), rtol=0, atol=1e-6)


def _scores(per_type_plus, per_type_minus):
    t = torch.stack([per_type_plus, per_type_minus], dim=-1)  # one alpha each
    return HeadScores(t, (1.0, -1.0), 1, ("clean", "substitution", "coherent"), torch.zeros(3, 1))


def test_selection_drops_inconsistent_heads_and_ranks_by_sum():
    plus = torch.zeros(3, 2, 2)
    plus[:, 0, 0] = torch.tensor([5.0, 5.0, -0.1])   # best sum but negative for one type: dropped
    plus[:, 0, 1] = torch.tensor([1.0, 1.0, 1.0])
    plus[:, 1, 0] = torch.tensor([0.0, 2.0, 0.5])
    plus[:, 1, 1] = torch.tensor([-1.0, 0.0, 0.0])   # dropped
    minus = -plus
    sel = select_heads(_scores(plus, minus), k=5)
    assert sel.positive == (Head(0, 1), Head(1, 0))  # sums 3.0 and 2.5
    assert sel.negative == (Head(1, 1),)


def test_score_heads_shapes_and_sign_split(tiny_llama):
    examples = build_domain("world_capital")[:2]
    prompts = scoring_prompts(tiny_llama, examples)
    scores = score_heads(tiny_llama, prompts, (1.0, 3.0), (-1.0,))
    g = tiny_llama.heads.geometry
    assert scores.scores.shape == (3, g.n_layers, g.n_heads, 3)
    torch.testing.assert_close(scores.per_type("+"), scores.scores[..., :2].sum(-1))
    naive = score_heads(tiny_llama, prompts, (1.0, 3.0), (-1.0,), probs=intervention_probs_naive)
    torch.testing.assert_close(scores.scores, naive.scores, rtol=0, atol=1e-5)


def test_many_prompts_per_call_give_the_same_scores_and_resume_from_a_checkpoint(tiny_llama, tmp_path):
    """Issue 75: Stage 1 asking an engine for several prompts at once (`probs_many`, what vLLM's
    engine batches per (head, alpha)) gives the per-prompt scores; calls hold at most
    `prompts_per_call` prompts; a checkpoint's prompts are not asked again."""
    from juice.engine.backend import JUICE_ENGINE
    from juice.io import UnitCheckpoint

    prompts = scoring_prompts(tiny_llama, build_domain("world_capital")[:2])   # 6 prompts
    one = score_heads(tiny_llama, prompts, (1.0, 3.0), (-1.0,))
    calls = []

    def many(lm, targets, interventions, max_rows):
        calls.append([t for _, t in targets])
        return JUICE_ENGINE.intervention_probs_many(lm, targets, interventions, max_rows)

    together = score_heads(tiny_llama, prompts, (1.0, 3.0), (-1.0,), probs_many=many, prompts_per_call=4)
    torch.testing.assert_close(together.scores, one.scores, rtol=0, atol=0)
    assert [len(c) for c in calls] == [4, 2] and torch.equal(together.clean_probs, one.clean_probs)
    checkpoint = UnitCheckpoint(tmp_path / "units.json", scope="tiny")
    score_heads(tiny_llama, prompts[:3], (1.0, 3.0), (-1.0,), checkpoint=checkpoint)
    calls.clear()
    resumed = score_heads(tiny_llama, prompts, (1.0, 3.0), (-1.0,), probs_many=many, prompts_per_call=4,
                          checkpoint=checkpoint)
    assert [len(c) for c in calls] == [3]   # the three the checkpoint lacks, in one call
    torch.testing.assert_close(resumed.scores, one.scores, rtol=0, atol=1e-12)


def test_heads_file_round_trip_and_mismatch(tiny_llama, tiny_gemma3, tmp_path):
    examples = build_domain("world_capital")[:1]
    scores = score_heads(tiny_llama, scoring_prompts(tiny_llama, examples), (1.0,), (-1.0,))
    sel = select_heads(scores, k=2)
    path = tmp_path / "heads.json"
    save_heads(make_artifact(tiny_llama, scores, sel, 2, "parametric", examples), path)
    loaded = load_heads(path, tiny_llama)
    assert loaded.selection == sel and loaded.k == 2
    assert json.loads(path.read_text())["model"]["model_type"] == "llama"
    with pytest.raises(HeadsFileMismatchError, match="was made for model"):
        load_heads(path, tiny_gemma3)


def test_attribution_is_the_derivative_of_the_exact_score(tiny):
    from juice.stage1 import head_attributions

    g = tiny.heads.geometry
    eps = 1e-2
    attribution = head_attributions(tiny, PROMPT, 9)
    inter = [(Head(l, h), eps) for l in range(g.n_layers) for h in range(g.n_heads)]
    clean, p = intervention_probs(tiny, PROMPT, 9, inter)
    finite_difference = ((p - clean) / eps).view(g.n_layers, g.n_heads)
    scale = attribution.abs().max()
    torch.testing.assert_close(attribution, finite_difference, rtol=0, atol=float(0.05 * scale) + 1e-5)
    assert scale > 0


def test_hybrid_scores_the_shortlists_exactly(tiny_llama):
    from juice.stage1 import attribution_scores, hybrid_scores, shortlist

    prompts = scoring_prompts(tiny_llama, build_domain("world_capital")[:2])
    approx = attribution_scores(tiny_llama, prompts, (1.0, 3.0), (-1.0,))
    plus, minus = shortlist(approx, 3, "+"), shortlist(approx, 3, "-")
    hybrid = hybrid_scores(tiny_llama, prompts, 3, (1.0, 3.0), (-1.0,))
    exact = score_heads(tiny_llama, prompts, (1.0, 3.0), (-1.0,))
    assert hybrid.scored[0].sum() == 3 and hybrid.scored[1].sum() == 3
    for (l, h) in plus:
        torch.testing.assert_close(hybrid.scores[:, l, h, :2], exact.scores[:, l, h, :2], rtol=0, atol=1e-6)
    for (l, h) in minus:
        torch.testing.assert_close(hybrid.scores[:, l, h, 2:], exact.scores[:, l, h, 2:], rtol=0, atol=1e-6)
    sel = select_heads(hybrid, k=5)
    assert set(sel.positive) <= set(plus) and set(sel.negative) <= set(minus)


class _Interrupt(Exception):
    pass


def test_interrupted_stage1_resumes_at_the_next_prompt(tiny_llama, tmp_path, monkeypatch):
    import juice.stage1.scoring as sc

    lm = tiny_llama
    prompts = scoring_prompts(lm, build_domain("world_capital")[:2])
    reference = score_heads(lm, prompts, (1.0,), (-1.0,))
    ckpt_path = tmp_path / "units.json"

    done = []

    def stop_after_three(n):
        done.append(n)
        if sum(done) == 3:
            raise _Interrupt

    with pytest.raises(_Interrupt):
        score_heads(lm, prompts, (1.0,), (-1.0,), on_progress=stop_after_three,
                    checkpoint=sc.UnitCheckpoint(ckpt_path, "tiny"))
    assert len(json.loads(ckpt_path.read_text())["units"]) == 3

    calls = []
    real = sc.intervention_probs
    monkeypatch.setattr(sc, "intervention_probs", lambda *a, **k: calls.append(1) or real(*a, **k))
    resumed = score_heads(lm, prompts, (1.0,), (-1.0,), checkpoint=sc.UnitCheckpoint(ckpt_path, "tiny"))
    assert len(calls) == len(prompts) - 3
    torch.testing.assert_close(resumed.scores, reference.scores, rtol=0, atol=1e-9)
    # another model (scope) never reuses these units
    assert sc.UnitCheckpoint(ckpt_path, "another model").units == {}


def test_auto_rows_fit_the_budget_and_shrink_with_length(tiny_llama):
    from juice.budget import auto_max_rows, resolve_max_rows, row_bytes

    per_row = row_bytes(tiny_llama.model.config, 50)
    assert auto_max_rows(tiny_llama, 50, budget_bytes=10 * per_row) == 10
    assert auto_max_rows(tiny_llama, 50, budget_bytes=per_row // 2) == 1        # never 0
    assert auto_max_rows(tiny_llama, 400, budget_bytes=10 * per_row) < 10       # longer rows, fewer fit
    assert resolve_max_rows("auto", tiny_llama, 20) >= 1
    assert resolve_max_rows("7", tiny_llama, 20) == 7
    with pytest.raises(ValueError, match="auto"):
        resolve_max_rows("many", tiny_llama, 20)


def test_auto_rows_give_the_same_scores(tiny_llama):
    inter = all_interventions(tiny_llama)
    _, fixed = intervention_probs(tiny_llama, PROMPT, 9, inter, max_rows=256)
    _, auto = intervention_probs(tiny_llama, PROMPT, 9, inter, max_rows="auto")
    torch.testing.assert_close(fixed, auto, rtol=0, atol=1e-6)
