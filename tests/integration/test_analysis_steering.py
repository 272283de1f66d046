"""`juice analyze robustness`, `paraphrase` and `norm` on tiny models: the properties behind
Fig. 5, the paraphrase table and the post-norm variant, and each command's `--quick` outputs."""

from __future__ import annotations

import json
from dataclasses import replace

import pytest
import torch

from juice.analysis.common import AnalysisOptions
from juice.analysis.robustness import RobustnessGrid, evaluate_settings, heads_by_size, run_robustness
from juice.data.paraconflict import DOMAINS, build_domain
from juice.data.paraphrases import PARAPHRASES, paraphrase_example, paraphrase_templates, template_choice
from juice.data.records import CONFLICT_TYPES
from juice.engine import Stream, generate
from juice.eval.runner import evaluate
from juice.interventions import Head, HeadSelection, RowPlan, projection_input_hooks
from juice.post_norm import head_contributions, norm_gain, post_norm_modules, post_norm_rows
from juice.reference import greedy_generate_post_norm_naive
from juice.stage1 import score_heads, scoring_prompts, select_heads
from juice.steering import JuICE, JuNE, Steering

SEL = HeadSelection(positive=(Head(1, 2), Head(2, 0)), negative=(Head(0, 1),))
PROMPTS = ["the capital city of france is", "the author of the book w3 was written by",
           "paris is the capital . the capital city of germany is"]


def post_norm(steering: Steering) -> Steering:
    """The same steering at the post-norm site (Original stays Original)."""
    return replace(steering, site="post_norm")


def generate_post_norm(lm, prompts, streams, max_new_tokens, **kw):
    """The engine's decoding with every stream's steering at the post-norm site."""
    return generate(lm, prompts, [replace(s, steering=post_norm(s.steering)) for s in streams], max_new_tokens, **kw)


def evaluate_post_norm(lm, items, methods):
    """The shared runner with every method's steering at the post-norm site."""
    return evaluate(lm, items, {n: post_norm(m) for n, m in methods.items()})


def _options(tmp_path, **kw) -> AnalysisOptions:
    return AnalysisOptions(out=tmp_path / "out", quick=True, filter=False, max_rows=64, bootstrap_resamples=1000, **kw)


# ---------------------------------------------------------------- paraphrase templates


def test_every_domain_has_five_paraphrases_per_conflict_type_that_end_before_the_answer():
    assert set(PARAPHRASES) == set(DOMAINS)
    ex = build_domain("official_language")[0]
    for domain in DOMAINS:
        for t in CONFLICT_TYPES:
            templates = paraphrase_templates(domain, t)
            assert len(templates) >= 5 and len(set(templates)) == len(templates)
            assert all("{s}" in x for x in templates)
            if t != "clean":
                assert all("{c}" in x for x in templates)
    para, chosen = paraphrase_example(ex, seed=0)
    assert para.answers == ex.answers and para.context_answer == ex.context_answer
    assert all(para.prompts[t] != ex.prompts[t] for t in CONFLICT_TYPES)
    assert para.prompts["coherent"].endswith(DOMAINS["official_language"].stem.format(s=ex.subject))
    stem = paraphrase_templates("official_language", "clean")[chosen["clean"]].format(s=ex.subject)
    assert para.prompts["substitution"] == f"{stem} {ex.context_answer}. {stem}"


def test_template_draws_are_seeded_and_spread_over_the_templates():
    items = build_domain("world_capital")[:40]
    first = [template_choice(ex, "coherent", seed=0) for ex in items]
    assert first == [template_choice(ex, "coherent", seed=0) for ex in items]
    assert first != [template_choice(ex, "coherent", seed=1) for ex in items]
    assert set(first) == set(range(5))
    with pytest.raises(KeyError, match="no paraphrases"):
        paraphrase_templates("nqswap", "clean")
    with pytest.raises(ValueError, match="conflict type"):
        paraphrase_templates("world_capital", "context")


# ---------------------------------------------------------------- robustness


def test_heat_map_zero_cell_decodes_exactly_as_original(tiny_gemma3):
    """The (0, 0) cell of the heat map is JuICE / JuNE with every beta 0: the same tokens and
    first-step probabilities as the unmodified model, item by item."""
    items = build_domain("world_capital")[:3]
    g = tiny_gemma3.heads.geometry
    steerings = {"Original": Steering(), "juice 0 0": JuICE(g, SEL, 0.0, 0.0), "june 0 0": JuNE(g, SEL, 0.0, 0.0),
                 "juice 5 -5": JuICE(g, SEL, 5.0, -5.0)}
    out = evaluate_settings(tiny_gemma3, items, steerings, None, max_rows=64)
    original = [(r.output, r.p_parametric) for r in out["Original"]]
    assert [(r.output, r.p_parametric) for r in out["juice 0 0"]] == original
    assert [(r.output, r.p_parametric) for r in out["june 0 0"]] == original
    assert [r.p_parametric for r in out["juice 5 -5"]] != [p for _, p in original]


def test_heads_of_nested_sets_equal_stage1_on_the_whole_set(tiny_llama):
    """Stage 1 scores add up over D: scoring item by item and summing gives the heads of scoring
    D_n at once."""
    items = build_domain("world_capital")[:3]
    by_size = heads_by_size(tiny_llama, items, [1, 3], k=3, checkpoint=None, max_rows=64)
    for n in (1, 3):
        joint = select_heads(score_heads(tiny_llama, scoring_prompts(tiny_llama, items[:n]), max_rows=64), 3)
        assert by_size[n] == joint
    with pytest.raises(ValueError, match="needs 4 known"):
        heads_by_size(tiny_llama, items, [4], k=3, checkpoint=None)


def test_robustness_quick_writes_its_files_and_resumes(tiny_llama, tmp_path, monkeypatch):
    options = _options(tmp_path)
    result = run_robustness(tiny_llama, options)
    names = sorted(p.name for p in result.files)
    assert names == ["robustness.json", "robustness.md", "robustness.png"]
    data = json.loads((options.out / "robustness.json").read_text())
    assert {c["sweep"] for c in data["cells"]} == {"d", "k", "betas"}
    assert len(data["cells"]) == 2 * (2 + 2 + 4)
    zero = [c for c in result.sweep("betas", "juice") if c.setting.beta_plus == 0 and c.setting.beta_minus == 0]
    assert zero[0].accuracy == result.original.accuracy and zero[0].vs_original.mean == 0
    assert "quick grid, not the paper size" in (options.out / "robustness.md").read_text()
    assert (options.out / "robustness.png").read_bytes()[:4] == b"\x89PNG"

    import juice.analysis.robustness as rob

    def boom(*args, **kwargs):
        raise AssertionError("recomputed")

    monkeypatch.setattr(rob, "evaluate", boom)
    monkeypatch.setattr(rob, "score_heads", lambda *a, **k: boom() if k.get("checkpoint") is None else
                        score_heads(*a, **k))
    again = run_robustness(tiny_llama, options)   # every cell and Stage 1 prompt read back from the checkpoint
    assert again.original.accuracy == result.original.accuracy


def test_robustness_bad_input_is_one_line_value_error(tiny_llama, tmp_path):
    with pytest.raises(ValueError, match="beta\\+ must be >= 0"):
        RobustnessGrid((1,), (1,), (-1.0,), (0.0,), 3, "x")
    with pytest.raises(ValueError, match="at least one value of ks"):
        RobustnessGrid((1,), (), (0.0,), (0.0,), 3, "x")
    with pytest.raises(ValueError, match="split must be"):
        run_robustness(tiny_llama, _options(tmp_path), split="bogus")


# ---------------------------------------------------------------- the post-norm variant


def _capture_layer(lm, layer: int, prompt: str):
    """(output projection input H, norm input y, norm output) at `layer` on one forward."""
    from juice.tokens import encode

    store = {}
    norm = post_norm_modules(lm.heads)[layer]
    handle = norm.register_forward_hook(lambda m, a, o: store.update(y=a[0], out=o))
    try:
        with projection_input_hooks(lm.heads, {layer: lambda l, x: store.update(h=x) or x}):
            lm.model(input_ids=encode(lm.tokenizer, [prompt]).input_ids.to(lm.device))
    finally:
        handle.remove()
    return store["h"], store["y"], store["out"]


@pytest.mark.parametrize("model_type", ["gemma3_text", "gemma2"])
def test_head_contributions_after_the_norm_sum_to_the_attention_output(model_type, tiny_models):
    from conftest import build_tiny

    lm = tiny_models.setdefault(model_type, build_tiny(model_type))
    h, y, out = _capture_layer(lm, 1, PROMPTS[2])
    n = lm.heads.geometry.n_heads
    c = head_contributions(lm.heads, 1, h, range(n)) * norm_gain(post_norm_modules(lm.heads)[1], y)[..., None, :]
    torch.testing.assert_close(c.sum(-2), out.float(), rtol=1e-5, atol=1e-5)


def test_post_norm_june_adds_beta_times_the_heads_contribution(tiny_gemma3):
    """JuNE after the norm moves the block's output by exactly beta * c_h (a pre-norm JuNE does not:
    the norm rescales it)."""
    h, y, out = _capture_layer(tiny_gemma3, 2, PROMPTS[0])
    norm = post_norm_modules(tiny_gemma3.heads)[2]
    c = head_contributions(tiny_gemma3.heads, 2, h, [1])[..., 0, :] * norm_gain(norm, y)
    beta = torch.zeros(1, 3, 4)
    beta[0, 2, 1] = 3.0
    from juice.tokens import encode

    store = {}
    with post_norm_rows(tiny_gemma3.heads, RowPlan(beta, torch.zeros(1, 3, 4), torch.tensor([-1]))):
        # registered after post_norm_rows's hook, so it sees the steered output
        handle = norm.register_forward_hook(lambda m, a, o: store.update(out=o))
        try:
            tiny_gemma3.model(input_ids=encode(tiny_gemma3.tokenizer, [PROMPTS[0]]).input_ids.to(tiny_gemma3.device))
        finally:
            handle.remove()
    torch.testing.assert_close(store["out"] - out, 3.0 * c, rtol=1e-4, atol=1e-5)


def test_post_norm_with_zero_betas_equals_the_original_model(tiny_gemma3):
    g = tiny_gemma3.heads.geometry
    streams = [Stream(i, s) for i in range(len(PROMPTS)) for s in (JuICE(g, SEL, 0, 0), JuNE(g, SEL, 0, 0))]
    post = generate_post_norm(tiny_gemma3, PROMPTS, streams, 6)
    ref = generate(tiny_gemma3, PROMPTS, [Stream(s.prompt) for s in streams], 6)
    assert torch.equal(post.tokens, ref.tokens)


def test_without_an_output_norm_the_post_norm_variant_equals_the_papers(tiny_llama):
    """Llama adds o_proj's output to the residual stream directly: adding beta * W_h H_h there is
    the same as adding beta * H_h at o_proj's input."""
    g = tiny_llama.heads.geometry
    steerings = [JuICE(g, SEL, 3.0, -2.0), JuNE(g, SEL, 3.0, -2.0), Steering()]
    streams = [Stream(i, s) for i in range(len(PROMPTS)) for s in steerings]
    probes = torch.tensor([[5, 7]] * len(streams))
    post = generate_post_norm(tiny_llama, PROMPTS, streams, 6, probe_tokens=probes)
    pre = generate(tiny_llama, PROMPTS, streams, 6, probe_tokens=probes)
    assert torch.equal(post.tokens, pre.tokens)
    torch.testing.assert_close(post.first_probs, pre.first_probs, rtol=1e-4, atol=1e-6)


def test_on_gemma3_the_two_variants_differ(tiny_gemma3):
    g = tiny_gemma3.heads.geometry
    streams = [Stream(i, JuNE(g, SEL, 4.0, 0.0)) for i in range(len(PROMPTS))]
    probes = torch.tensor([[5, 7]] * len(streams))
    post = generate_post_norm(tiny_gemma3, PROMPTS, streams, 1, probe_tokens=probes)
    pre = generate(tiny_gemma3, PROMPTS, streams, 1, probe_tokens=probes)
    assert not torch.allclose(post.first_probs, pre.first_probs, rtol=1e-3)


@pytest.mark.parametrize("method", ["juice", "june"])
def test_cached_post_norm_generation_equals_naive_rerun(tiny_gemma3, method):
    g = tiny_gemma3.heads.geometry
    steering = (JuICE if method == "juice" else JuNE)(g, SEL, 4.0, -3.0)
    batched = generate_post_norm(tiny_gemma3, PROMPTS, [Stream(i, steering) for i in range(len(PROMPTS))], 6)
    for i, prompt in enumerate(PROMPTS):
        assert torch.equal(batched.tokens[i], greedy_generate_post_norm_naive(tiny_gemma3, prompt, 6, post_norm(steering)))


def test_post_norm_evaluation_scores_like_the_standard_one_at_zero_betas(tiny_gemma3):
    items = build_domain("world_capital")[:2]
    g = tiny_gemma3.heads.geometry
    post = evaluate_post_norm(tiny_gemma3, items, {"x": JuICE(g, SEL, 0, 0)})
    pre = evaluate(tiny_gemma3, items, {"x": Steering()})
    assert [(r.output, r.correct, r.p_parametric) for r in post] == [(r.output, r.correct, r.p_parametric) for r in pre]


# ---------------------------------------------------------------- the other two commands


def test_paraphrase_quick_writes_its_files(tiny_llama, tmp_path):
    from juice.analysis.paraphrase import run_paraphrase

    options = _options(tmp_path)
    result = run_paraphrase(tiny_llama, options)
    assert sorted(p.name for p in result.files) == ["paraphrase.json", "paraphrase.md", "paraphrase.png"]
    data = json.loads((options.out / "paraphrase.json").read_text())
    assert set(data["table"]["cells"]) == {"Original", "JuNE", "JuICE"}
    cell = data["table"]["cells"]["JuICE"]["world_capital"]["coherent"]
    assert cell["n"] == 3 and cell["low"] <= cell["mean"] <= cell["high"]
    items = [r for r in data["items"] if r["method"] == "Original"]
    assert len(items) == 9 and sum(data["templates"]["world_capital"]["clean"]) == 3


def test_norm_quick_writes_its_files(tiny_gemma3, tmp_path):
    from juice.analysis.norm import run_norm

    options = _options(tmp_path)
    result = run_norm(tiny_gemma3, options)
    assert sorted(p.name for p in result.files) == ["norm.json", "norm.md", "norm.png"]
    data = json.loads((options.out / "norm.json").read_text())
    assert data["post_norm"] is True
    assert set(data["table"]["cells"]) == {"Original", "JuNE", "JuNE (post-norm)", "JuICE", "JuICE (post-norm)"}
    assert "JuICE (post-norm) - JuICE" in data["table"]["differences"]
    assert "JuNE (post-norm) - JuNE" in data["table"]["differences"]
    ratios = [v for per in data["attenuation"].values() for v in per.values()]
    assert ratios and all(0 < v < 10 for v in ratios)


def test_the_site_is_part_of_a_steering_and_one_call_steers_at_one_site(tiny_gemma3):
    g = tiny_gemma3.heads.geometry
    with pytest.raises(ValueError, match="unknown steering site"):
        Steering("add", JuICE(g, SEL, 1, 0).coefficients, site="residual")
    mixed = [Stream(0, JuNE(g, SEL, 2, 0)), Stream(0, post_norm(JuNE(g, SEL, 2, 0)))]
    with pytest.raises(ValueError, match="share a site"):
        generate(tiny_gemma3, PROMPTS[:1], mixed, 2)
    # the runner splits mixed sites into one call each: every row equals its site decoded alone
    items = build_domain("world_capital")[:2]
    methods = {"pre": JuNE(g, SEL, 3, 0), "post": post_norm(JuNE(g, SEL, 3, 0)), "orig": Steering()}
    both = evaluate(tiny_gemma3, items, methods)
    alone = [r for name in methods for r in evaluate(tiny_gemma3, items, {name: methods[name]})]
    key = lambda r: (r.item, r.conflict_type, r.method)   # noqa: E731
    assert sorted((key(r), r.output) for r in both) == sorted((key(r), r.output) for r in alone)


@pytest.mark.parametrize("method", ["juice", "june"])
def test_teacher_forcing_at_the_post_norm_site_equals_the_engines_forced_log_probabilities(tiny_gemma3, method):
    from juice.engine.likelihood import sequence_logits
    from juice.tokens import token_ids

    g = tiny_gemma3.heads.geometry
    steering = post_norm((JuICE if method == "juice" else JuNE)(g, SEL, 3.0, -1.0))
    free = generate(tiny_gemma3, PROMPTS, [Stream(i, steering) for i in range(len(PROMPTS))], 4)
    forced = generate(tiny_gemma3, PROMPTS, [Stream(i, steering) for i in range(len(PROMPTS))], 4,
                      forced_tokens=free.tokens)
    seqs = [token_ids(tiny_gemma3.tokenizer, p) + free.tokens[i].tolist() for i, p in enumerate(PROMPTS)]
    logits = sequence_logits(tiny_gemma3, seqs, [4] * len(seqs), steering)
    lp = torch.stack([l.log_softmax(-1).gather(1, free.tokens[i][:, None].to(l.device))[:, 0].double().cpu()
                      for i, l in enumerate(logits)])
    torch.testing.assert_close(lp, forced.forced_logprobs, rtol=1e-4, atol=1e-4)
