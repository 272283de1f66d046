"""The static KV cache (issue 14): fixed-shape decoding steps give the same tokens as the dynamic
cache on every tiny architecture, for every method (CAD and AdaCAD streams included), with sampling,
repetition penalties, probes, teacher forcing and EOS stopping."""

from __future__ import annotations

import pytest
import torch

from juice.engine import Stream, generate
from juice.engine.sampling import Sampling
from juice.interventions import HeadSelection
from juice.interventions import Head
from juice.steering import ORIGINAL, JuICE, JuNE

pytestmark = pytest.mark.gpu   # benchmarks/gpu_check.py runs these on the device

PROMPTS = ["the capital of france is", "a b c d e f g h i j k l m n the capital of", "x y"]


def _streams(lm) -> list[Stream]:
    sel = HeadSelection((Head(0, 0), Head(1, 1)), (Head(1, 0),))
    juice, june = JuICE(lm, sel, 2.0, -1.0), JuNE(lm, sel, 1.5, -0.5)
    out = [Stream(i, s) for i in range(len(PROMPTS)) for s in (ORIGINAL, juice, june)]
    out += [Stream(1, juice, Sampling(temperature=0.8, top_k=20, seed=3)), Stream(2, june, repetition_penalty=1.3)]
    return out


def test_static_cache_equals_dynamic_cache(tiny):
    streams = _streams(tiny)
    probes = torch.tensor([[5, 7]] * len(streams))
    dynamic = generate(tiny, PROMPTS, streams, 6, probe_tokens=probes, max_rows=64)
    static = generate(tiny, PROMPTS, streams, 6, probe_tokens=probes, max_rows=64, kv_cache="static")
    assert torch.equal(static.tokens, dynamic.tokens)
    assert static.texts == dynamic.texts
    torch.testing.assert_close(static.first_probs, dynamic.first_probs, rtol=1e-5, atol=1e-6)


def test_static_cache_teacher_forcing_and_eos_stop_equal_dynamic(tiny_llama):
    streams = _streams(tiny_llama)
    forced = torch.randint(3, 50, (len(streams), 5), generator=torch.Generator().manual_seed(0))
    a = generate(tiny_llama, PROMPTS, streams, 5, forced_tokens=forced)
    b = generate(tiny_llama, PROMPTS, streams, 5, forced_tokens=forced, kv_cache="static")
    torch.testing.assert_close(b.forced_logprobs, a.forced_logprobs, rtol=1e-5, atol=1e-5)
    a = generate(tiny_llama, PROMPTS, streams, 8, stop_at_eos=True, max_rows=4)
    b = generate(tiny_llama, PROMPTS, streams, 8, stop_at_eos=True, max_rows=4, kv_cache="static")
    assert torch.equal(a.tokens, b.tokens)


def _contrastive_streams() -> list[Stream]:
    """CAD and AdaCAD streams (prompt 1 against prompt 0 as its question), greedy, sampled and
    penalized, beside an Original stream of their question."""
    from juice.baselines.cad import CadPolicy, jsd_alpha
    from juice.engine import Contrast

    cad, ada = Contrast(0, CadPolicy(1.0)), Contrast(0, CadPolicy(jsd_alpha))
    return [Stream(1, contrast=cad), Stream(1, contrast=ada), Stream(0),
            Stream(1, sampling=Sampling(temperature=0.8, top_k=20, seed=3), contrast=ada),
            Stream(1, repetition_penalty=1.3, contrast=cad)]


def test_static_cache_with_cad_streams_equals_dynamic(tiny):
    streams = _contrastive_streams()
    probes = torch.tensor([[5, 7]] * len(streams))
    dynamic = generate(tiny, PROMPTS, streams, 6, probe_tokens=probes)
    static = generate(tiny, PROMPTS, streams, 6, probe_tokens=probes, kv_cache="static")
    assert torch.equal(static.tokens, dynamic.tokens)
    torch.testing.assert_close(static.first_probs, dynamic.first_probs, rtol=1e-5, atol=1e-6)


def _compiles_here(lm) -> bool:
    """Whether the engine compiles the step for `lm` here; where it refuses (the CPU under torch <
    2.13, :data:`juice.engine.batch.COMPILE_ON_CPU_FROM`), that the refusal is one line at start."""
    import juice.engine.batch as batch

    if lm.device.type != "cpu" or batch._torch_release() >= batch.COMPILE_ON_CPU_FROM:
        return True
    with pytest.raises(ValueError, match=r"compile_step on the CPU needs torch >= 2\.13"):
        generate(lm, PROMPTS, [Stream(0)], 2, kv_cache="static", compile_step=True)
    return False


def test_compiled_step_with_cad_streams_equals_the_uncompiled_one(tiny_llama):
    """CAD steers no head: its step is traced without head hooks; the steered chunks compiled after
    it must not reuse that trace (dynamo guards on the hooks, see `compiled_forward`)."""
    if not _compiles_here(tiny_llama):
        return
    streams = _contrastive_streams()
    plain = generate(tiny_llama, PROMPTS, streams, 6, kv_cache="static")
    compiled = generate(tiny_llama, PROMPTS, streams, 6, kv_cache="static", compile_step=True)
    assert torch.equal(compiled.tokens, plain.tokens)
    steered = _streams(tiny_llama)[:6]
    plain = generate(tiny_llama, PROMPTS, steered, 7, kv_cache="static")
    compiled = generate(tiny_llama, PROMPTS, steered, 7, kv_cache="static", compile_step=True)
    assert torch.equal(compiled.tokens, plain.tokens)


def test_unknown_cache_is_refused(tiny_llama):
    with pytest.raises(ValueError, match="kv_cache must be one of dynamic, static, not 'paged'"):
        generate(tiny_llama, PROMPTS, [Stream(0)], 2, kv_cache="paged")


@pytest.mark.parametrize("fixture", ["tiny_llama", "tiny_gemma3"])
def test_compiled_step_equals_the_uncompiled_one(fixture, request):
    """torch.compile traces the head hooks; the compiled fixed-shape step gives the same tokens
    (the first call compiles: about 30 s on 2 CPU cores). Gemma 3, with its sliding-window cache
    layers, is the default model's architecture."""
    lm = request.getfixturevalue(fixture)
    with pytest.raises(ValueError, match='compile_step needs kv_cache="static"'):
        generate(lm, PROMPTS, _streams(lm)[:1], 2, compile_step=True)
    if not _compiles_here(lm):
        return
    streams = _streams(lm)[:6]
    plain = generate(lm, PROMPTS, streams, 8, kv_cache="static")
    compiled = generate(lm, PROMPTS, streams, 8, kv_cache="static", compile_step=True)
    assert torch.equal(compiled.tokens, plain.tokens)


def test_the_models_default_cache_comes_from_the_environment(monkeypatch, tiny_llama):
    from conftest import build_tiny

    monkeypatch.setenv("JUICE_KV_CACHE", "static")
    lm = build_tiny("llama")
    assert (lm.kv_cache, lm.compile_step, tiny_llama.kv_cache) == ("static", False, "dynamic")
    seen = []
    import juice.engine.forward as decoding

    real = decoding.forward_last
    monkeypatch.setattr(decoding, "forward_last", lambda *a, **k: seen.append(type(k.get("past")).__name__) or real(*a, **k))
    generate(lm, PROMPTS[:1], [Stream(0)], 3)
    assert seen[0] == "StaticCache"
    monkeypatch.setenv("JUICE_KV_CACHE", "paged")
    with pytest.raises(ValueError, match="kv_cache must be one of dynamic, static, not 'paged'"):
        generate(build_tiny("llama"), PROMPTS[:1], [Stream(0)], 3)


def test_evaluation_and_tuning_under_the_static_cache_give_the_dynamic_verdicts(tiny_llama):
    """`JUICE_KV_CACHE=static` runs the commands that stop rows early (evaluation's exact-match
    stop rule, tuning; issue 33): every output, verdict and probability, and every tuned choice,
    equal the dynamic cache's."""
    from dataclasses import replace

    from juice.data.paraconflict import build_domain
    from juice.eval.runner import evaluate
    from juice.recipe import Method
    from juice.eval.tuning import tune_per_domain

    static = replace(tiny_llama, kv_cache="static")
    sel = HeadSelection((Head(0, 1), Head(2, 3)), (Head(1, 0),))
    examples = build_domain("world_capital")[:4]
    methods = {"Original": Method(), "JuICE": Method(JuICE(tiny_llama, sel, 2.0, -1.0)),
               "JuNE": Method(JuNE(tiny_llama, sel, 1.5, -0.5))}

    def verdicts(lm, **kw):
        return [(r.item_key, r.conflict_type, r.method, r.output, r.correct, r.follows_context,
                 round(r.p_parametric, 5), round(r.p_context, 5)) for r in evaluate(lm, examples, methods, **kw)]

    assert verdicts(static) == verdicts(tiny_llama)
    assert verdicts(tiny_llama) != verdicts(tiny_llama, full_outputs=True)   # the stop rule cut some rows
    grid = dict(beta_plus_grid=(0.0, 2.0), beta_minus_grid=(0.0, -1.0))

    def chosen(lm):
        choice = tune_per_domain(lm, {"world_capital": examples}, sel, **grid)["world_capital"]
        return {m: (p.beta_plus, p.beta_minus, p.accuracy, p.per_type, round(p.p_answer, 5))
                for m, p in choice.betas.items()}

    assert chosen(static) == chosen(tiny_llama)


def test_the_compiled_step_on_the_cpu_is_refused_in_one_line_under_an_older_torch(tiny_llama, monkeypatch):
    import juice.engine.batch as batch

    if tiny_llama.device.type != "cpu":
        pytest.skip("the refusal is for the CPU")
    monkeypatch.setattr(batch, "_torch_release", lambda: (2, 11))
    with pytest.raises(ValueError, match=r"^compile_step on the CPU needs torch >= 2\.13: .*seen with 2\.11\.0"):
        generate(tiny_llama, PROMPTS, [Stream(0)], 2, kv_cache="static", compile_step=True)
    generate(tiny_llama, PROMPTS, [Stream(0)], 2, kv_cache="static")   # uncompiled still decodes
