"""JuICE and JuNE generation: the cached, batched decoder equals the paper's literal algorithm."""

from __future__ import annotations

import pytest
import torch

from juice.engine import Stream, generate, greedy_generate
from juice.interventions import HeadSelection
from juice.interventions import Head
from juice.reference import greedy_generate_naive
from juice.steering import Steering, steering_coefficients
from juice.tokens import encode

pytestmark = pytest.mark.gpu   # benchmarks/gpu_check.py runs these on the device

PROMPTS = [
    "the capital of france is paris . the capital of france is",
    "tennis golf w40 w41 w42 is",
    "w7 w8 w9 w10 w11 w12 w13 w14 w15 w16 w17 w18 the",
]
SELECTION = HeadSelection(positive=(Head(0, 1), Head(2, 3)), negative=(Head(1, 0), Head(2, 3)))


def coefficients(lm, beta_plus=2.0, beta_minus=-1.0):
    return steering_coefficients(lm.heads.geometry, SELECTION, beta_plus, beta_minus)


def test_logits_helper_equals_the_models_own_head(tiny):
    b = encode(tiny.tokenizer, PROMPTS).to(tiny.device)
    with torch.no_grad():
        full = tiny.model(input_ids=b.input_ids, attention_mask=b.attention_mask, position_ids=b.position_ids)
        hidden = tiny.model.base_model(
            input_ids=b.input_ids, attention_mask=b.attention_mask, position_ids=b.position_ids
        ).last_hidden_state
    torch.testing.assert_close(tiny.logits(hidden[:, -1]), full.logits[:, -1], rtol=0, atol=1e-5)


@pytest.mark.parametrize("kind", ["none", "scale", "add"])
def test_cached_generation_equals_naive_rerun(tiny, kind):
    steering = Steering(kind, None if kind == "none" else coefficients(tiny))
    cached = greedy_generate(tiny, PROMPTS, 8, steering)
    for i, prompt in enumerate(PROMPTS):
        naive = greedy_generate_naive(tiny, prompt, 8, steering)
        assert torch.equal(cached.tokens[i], naive), (kind, i)


def test_juice_with_zero_betas_equals_the_original_model(tiny):
    zero = Steering("add", coefficients(tiny, 0.0, 0.0))
    original = greedy_generate(tiny, PROMPTS, 6)
    steered = greedy_generate(tiny, PROMPTS, 6, zero)
    assert torch.equal(original.tokens, steered.tokens)


def test_juice_changes_something_when_betas_are_large(tiny_llama):
    strong = Steering("add", coefficients(tiny_llama, 8.0, -3.0))
    probes = torch.arange(8).repeat(len(PROMPTS), 1)
    a = greedy_generate(tiny_llama, PROMPTS, 4, probe_tokens=probes)
    b = greedy_generate(tiny_llama, PROMPTS, 4, strong, probe_tokens=probes)
    assert not torch.allclose(a.first_probs, b.first_probs)


def test_mixed_streams_in_one_batch_equal_separate_runs(tiny):
    c1, c2 = coefficients(tiny, 2.0, -1.0), coefficients(tiny, 5.0, 0.0)
    streams = [
        Stream(0, Steering("add", c1)), Stream(1), Stream(0, Steering("scale", c2)),
        Stream(2, Steering("add", c2)), Stream(0), Stream(1, Steering("add", c1)),
    ]
    probes = torch.tensor([[3, 4]] * len(streams))
    together = generate(tiny, PROMPTS, streams, 5, probe_tokens=probes, max_rows=64)
    split = generate(tiny, PROMPTS, streams, 5, probe_tokens=probes, max_rows=2)
    assert torch.equal(together.tokens, split.tokens)
    torch.testing.assert_close(together.first_probs, split.first_probs, rtol=0, atol=1e-5)
    for k, s in enumerate(streams):
        alone = greedy_generate_naive(tiny, PROMPTS[s.prompt], 5, s.steering)
        assert torch.equal(together.tokens[k], alone), k


def test_rows_that_join_the_prefill_at_their_first_steered_layer_equal_the_naive_rerun(tiny):
    """The growing prefill: a steered row enters the batch at the first layer it steers, as a
    copy of its prompt's clean row (padded prompts, so the mask and positions are indexed too);
    every stream's tokens equal the paper's literal algorithm and its first-step probabilities
    equal those of the stream decoded alone."""
    from juice.steering import JuICE, JuNE

    g = tiny.heads.geometry
    last = g.n_layers - 1
    s1 = HeadSelection((Head(last, 0),), (Head(1, 1),))
    s2 = HeadSelection((Head(last - 1, 1), Head(last, 0)), ())
    prune = Steering("scale", steering_coefficients(g, HeadSelection((), (Head(last, 1),)), 0, -1.0, "scale"))
    streams = [Stream(0, JuICE(tiny, s1, 3, -2)), Stream(1), Stream(0, JuNE(tiny, s2, 2, 0)),
               Stream(2, JuICE(tiny, s2, 4, 0)), Stream(0), Stream(1, prune), Stream(2, JuNE(tiny, s1, 1, -0.5)),
               Stream(2)]
    probes = torch.tensor([[3, 4]] * len(streams))
    gen = generate(tiny, PROMPTS, streams, 6, probe_tokens=probes)
    for k, s in enumerate(streams):
        assert torch.equal(gen.tokens[k], greedy_generate_naive(tiny, PROMPTS[s.prompt], 6, s.steering)), k
        alone = generate(tiny, PROMPTS, [s], 6, probe_tokens=probes[:1])
        torch.testing.assert_close(gen.first_probs[k], alone.first_probs[0], rtol=0, atol=1e-6)


def test_a_stopped_stream_leaves_the_batch_and_the_others_decode_as_without_the_rule(tiny):
    """`stop_text`: each stream's tokens up to its stop equal the unstopped decoding's (JuICE's
    clean copy and every other row re-indexed as streams leave), its text is where the rule first
    held, and the first-step probabilities are untouched."""
    c1, c2 = coefficients(tiny, 2.0, -1.0), coefficients(tiny, 5.0, 0.0)
    streams = [Stream(0, Steering("add", c1)), Stream(1), Stream(0, Steering("scale", c2)),
               Stream(2, Steering("add", c2)), Stream(0), Stream(1, Steering("add", c1))]
    probes = torch.tensor([[3, 4]] * len(streams))
    full = generate(tiny, PROMPTS, streams, 9, probe_tokens=probes, stop_at_eos=True)
    # streams stop at different steps: 2 to 7 words
    rule = lambda text: len(text.split()) >= 2 + len(text) % 6   # noqa: E731
    cut = generate(tiny, PROMPTS, streams, 9, probe_tokens=probes, stop_at_eos=True, stop_text=rule)
    eos = tiny.tokenizer.eos_token_id
    assert torch.equal(full.first_probs, cut.first_probs)
    lengths = set()
    for k in range(len(streams)):
        decoded = [t for t in cut.tokens[k].tolist()]
        n = next((i for i, t in enumerate(decoded) if t == eos), len(decoded))
        lengths.add(n)
        assert decoded[:n] == full.tokens[k, :n].tolist(), k
        assert cut.texts[k] == tiny.tokenizer.decode(decoded[:n], skip_special_tokens=True)
        prefixes = [tiny.tokenizer.decode(decoded[:i], skip_special_tokens=True) for i in range(1, n + 1)]
        assert n == 9 or full.tokens[k, n] == eos or rule(prefixes[-1]), k   # stopped where the rule held
        assert not any(rule(t) for t in prefixes[:-1]), k                     # and not before
    assert len(lengths) > 1


def test_a_stop_rule_under_the_static_cache_gives_the_dynamic_caches_tokens(tiny):
    """`stop_text` with `kv_cache="static"`: the stopped streams stay in the fixed-shape batch and
    their later tokens are dropped, so tokens, texts and probabilities equal the dynamic cache's,
    where they leave (JUICE_KV_CACHE=static runs evaluation and tuning, issue 33)."""
    c1, c2 = coefficients(tiny, 2.0, -1.0), coefficients(tiny, 5.0, 0.0)
    streams = [Stream(0, Steering("add", c1)), Stream(1), Stream(0, Steering("scale", c2)),
               Stream(2, Steering("add", c2)), Stream(0), Stream(1, Steering("add", c1))]
    probes = torch.tensor([[3, 4]] * len(streams))
    rule = lambda text: len(text.split()) >= 2 + len(text) % 6   # noqa: E731
    dynamic = generate(tiny, PROMPTS, streams, 9, probe_tokens=probes, stop_at_eos=True, stop_text=rule)
    static = generate(tiny, PROMPTS, streams, 9, probe_tokens=probes, stop_at_eos=True, stop_text=rule,
                      kv_cache="static")
    assert torch.equal(static.tokens, dynamic.tokens)
    assert static.texts == dynamic.texts
    torch.testing.assert_close(static.first_probs, dynamic.first_probs, rtol=1e-5, atol=1e-6)
    full = generate(tiny, PROMPTS, streams, 9, stop_at_eos=True, kv_cache="static")
    assert not torch.equal(full.tokens, static.tokens)   # the rule did cut some stream


def test_stop_text_ends_sampled_streams_too_and_is_refused_with_teacher_forcing(tiny_llama):
    """The one loop's stop rule holds for any stream (issue 34; it used to be greedy only): a
    sampled stream's tokens are those it gets without the rule, up to the step the rule holds,
    then EOS."""
    from juice.engine.sampling import Sampling

    streams = [Stream(0, sampling=Sampling(temperature=1.0, seed=s)) for s in range(4)]
    tok = tiny_llama.tokenizer

    def stop(text: str) -> bool:
        return len(text.split()) >= 2

    full = generate(tiny_llama, PROMPTS[:1], streams, 6, stop_at_eos=True).tokens.tolist()
    cut = generate(tiny_llama, PROMPTS[:1], streams, 6, stop_at_eos=True, stop_text=stop).tokens.tolist()
    held = 0
    for a, b in zip(full, cut):
        k = next((i + 1 for i in range(6) if stop(tok.decode(a[: i + 1], skip_special_tokens=True))), 6)
        held += k < 6
        assert b[:k] == a[:k] and all(t == tok.eos_token_id for t in b[k:])
    assert held, "the rule should end some stream early"
    with pytest.raises(ValueError, match="does not apply to forced_tokens"):
        generate(tiny_llama, PROMPTS[:1], [Stream(0)], 3, forced_tokens=torch.zeros(1, 3, dtype=torch.long),
                 stop_text=stop)


def test_unknown_kind_is_refused():
    with pytest.raises(ValueError, match="unknown steering kind"):
        Steering("juicy", torch.zeros(2, 2))
    with pytest.raises(ValueError, match="needs coefficients"):
        Steering("add")


def test_a_killed_call_resumes_from_its_checkpoint_with_the_same_results(tiny_llama, tmp_path, monkeypatch):
    """`checkpoint`: a call killed after its first chunk and made again decodes only the chunks it
    had not finished, and gives exactly the tokens, texts and first-step probabilities of a call
    never killed; a call with other steering coefficients reads nothing from it."""
    import juice.engine.batch as batch
    from juice.io import UnitCheckpoint

    steerings = [Steering(), Steering("add", coefficients(tiny_llama, 3.0, -2.0)),
                 Steering("scale", coefficients(tiny_llama, 1.0, -1.0))]
    streams = [Stream(p, s) for p in range(len(PROMPTS)) for s in steerings]
    probes = torch.arange(4).repeat(len(streams), 1)
    whole = generate(tiny_llama, PROMPTS, streams, 5, probe_tokens=probes, max_rows=2, stop_at_eos=True)
    path, scope = tmp_path / "chunks.json", {"stage": "test"}
    real, decoded = batch._run_chunk, []

    def dying(*args, **kwargs):
        if len(UnitCheckpoint(path, scope).units) == 1:
            raise KeyboardInterrupt
        decoded.append(tuple(args[-1]))
        return real(*args, **kwargs)

    monkeypatch.setattr(batch, "_run_chunk", dying)
    with pytest.raises(KeyboardInterrupt):
        generate(tiny_llama, PROMPTS, streams, 5, probe_tokens=probes, max_rows=2, stop_at_eos=True,
                 checkpoint=UnitCheckpoint(path, scope))
    first = set(decoded)
    decoded.clear()
    monkeypatch.setattr(batch, "_run_chunk", lambda *a, **k: (decoded.append(tuple(a[-1])), real(*a, **k))[1])
    resumed = generate(tiny_llama, PROMPTS, streams, 5, probe_tokens=probes, max_rows=2, stop_at_eos=True,
                       checkpoint=UnitCheckpoint(path, scope))
    assert decoded and not first & set(decoded)          # the finished chunk was read, not decoded again
    n_chunks = len(UnitCheckpoint(path, scope).units)
    assert n_chunks == len(first) + len(set(decoded)) > 2
    assert torch.equal(resumed.tokens, whole.tokens) and resumed.texts == whole.texts
    assert torch.equal(resumed.first_probs, whole.first_probs)

    decoded.clear()
    other = [Stream(s.prompt, Steering(s.steering.kind, None if s.steering.coefficients is None
                                       else 2 * s.steering.coefficients)) for s in streams]
    again = generate(tiny_llama, PROMPTS, other, 5, probe_tokens=probes, max_rows=2, stop_at_eos=True,
                     checkpoint=UnitCheckpoint(path, scope))
    assert decoded and all(any(other[i].steering.steers for i in c) for c in decoded)   # changed: decoded anew
    plain = generate(tiny_llama, PROMPTS, other, 5, probe_tokens=probes, max_rows=2, stop_at_eos=True)
    assert torch.equal(again.tokens, plain.tokens) and torch.equal(again.first_probs, plain.first_probs)


def test_a_checkpointed_chunk_reads_back_bit_for_bit():
    """A chunk's probabilities and forced log-probabilities survive the JSON checkpoint exactly."""
    import json

    from juice.engine.batch import _packed, _unpacked

    tokens = torch.tensor([[1, 2, 3], [4, 5, 6]])
    probs = torch.rand(2, 4, dtype=torch.float32) / 7
    lp = torch.log(torch.rand(2, 3, dtype=torch.float64)) / 3
    lp[1, 2] = float("-inf")
    back = _unpacked(json.loads(json.dumps(_packed(tokens, probs, lp))))
    assert torch.equal(back[0], tokens) and back[1].dtype == torch.float32 and torch.equal(back[1], probs)
    assert back[2].dtype == torch.float64 and torch.equal(back[2], lp)
    assert _unpacked(json.loads(json.dumps(_packed(tokens, None, None))))[1:] == (None, None)
