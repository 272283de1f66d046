"""Evaluation runners: contextual metrics end to end, likelihoods, Prompt and CAD methods."""

from __future__ import annotations

import torch

from juice.baselines.cad import CadPolicy, jsd_alpha
from juice.baselines.prompt import contextual_prompt
from juice.data.paraconflict import build_domain
from juice.data.records import ContextualExample
from juice.eval.runner import evaluate, evaluate_contextual
from juice.recipe import Method
from juice.interventions import Head, HeadSelection, added_to_heads, captured_heads
from juice.reference import continuation_logprobs
from juice.steering import Steering, steering_coefficients
from juice.tokens import token_ids

SELECTION = HeadSelection(positive=(Head(0, 1), Head(2, 3)), negative=(Head(1, 0),))


def _examples():
    return [
        ContextualExample("proverb_ending", "0", "the capital : france is", "france is", (" paris.",), (" rome.",),
                          "completion", "memotrap"),
        ContextualExample("proverb_ending", "1", "tennis golf : w40 w41 is", "w40 w41 is", (" golf",), (" tennis",),
                          "completion", "memotrap"),
        ContextualExample("nqswap", "0", "Context: w7 w8 paris\nQuestion: w9?\nAnswer:", "Question: w9?\nAnswer:",
                          ("paris",), ("rome",), "qa", "nqswap"),
    ]


def _naive_logprob(lm, prompt, continuation, steering=None):
    base = token_ids(lm.tokenizer, prompt)
    full = token_ids(lm.tokenizer, prompt + continuation)
    cont = full[len(base):]
    ids = torch.tensor([full], device=lm.device)
    with torch.no_grad():
        if steering is not None and steering.kind == "add":
            layers = [int(i) for i in steering.coefficients.ne(0).any(-1).nonzero().flatten()]
            with captured_heads(lm.heads, layers) as saved:
                lm.model(input_ids=ids)
            add = {l: steering.coefficients[l].to(saved[l].device)[None, None, :, None] * saved[l] for l in layers}
            with added_to_heads(lm.heads, add):
                logits = lm.model(input_ids=ids).logits[0]
        else:
            logits = lm.model(input_ids=ids).logits[0]
    lp = logits.log_softmax(-1)
    return sum(float(lp[len(base) - 1 + j, t]) for j, t in enumerate(cont))


def test_continuation_logprobs_equal_full_forward_logprobs(tiny):
    prompts = ["the capital of france is", "tennis golf w40 w41 w42 is"]
    conts = [" paris .", " golf"]
    for steering in (Steering(), Steering("add", steering_coefficients(tiny.heads.geometry, SELECTION, 2, -1))):
        got = continuation_logprobs(tiny, prompts, conts, steering, max_rows=2)
        for i in range(2):
            assert abs(float(got[i]) - _naive_logprob(tiny, prompts[i], conts[i], steering)) < 1e-4


def test_evaluate_contextual_covers_every_method_and_metric(tiny_llama):
    lm = tiny_llama
    coef = steering_coefficients(lm.heads.geometry, SELECTION, 2, -1)
    methods = {"Original": Method(), "Prompt": Method(instructed=True), "CAD": Method(contrast=CadPolicy(1.0)),
               "AdaCAD": Method(contrast=CadPolicy(jsd_alpha)), "JuICE": Method(Steering("add", coef))}
    exs = _examples()
    results = evaluate_contextual(lm, exs, methods, max_rows=4)
    assert len(results) == len(exs) * len(methods)
    assert {r.method for r in results} == set(methods)
    memo = [r for r in results if r.domain == "proverb_ending"]
    assert all(r.likelihood_correct is not None for r in memo)
    assert all(r.likelihood_correct is None for r in results if r.domain == "nqswap")
    nq = [r for r in results if r.domain == "nqswap"]
    assert all(len(lm.tokenizer(r.output, add_special_tokens=False)["input_ids"]) <= 20 for r in nq)
    compared = {(r.method, r.domain) for r in results if r.likelihood_correct is not None}
    assert compared == {(m, "proverb_ending") for m in methods}   # every method, MemoTrap's items only
    # batched equals one example at a time
    for ex in exs:
        alone = evaluate_contextual(lm, [ex], methods, max_rows=64)
        together = [r for r in results if r.domain == ex.dataset and r.subject == ex.uid]
        assert [r.output for r in alone] == [r.output for r in together]


def test_prompt_method_decodes_the_instructed_prompt(tiny_llama):
    lm = tiny_llama
    for ex in (_examples()[0], _examples()[2]):   # a completion subtask and NQ-Swap
        r = evaluate_contextual(lm, [ex], {"Prompt": Method(instructed=True)}, likelihood=False)[0]
        plain = evaluate_contextual(lm, [ContextualExample(**{**ex.__dict__, "prompt": contextual_prompt(ex)})],
                                    {"Original": Method()}, likelihood=False)[0]
        assert r.output == plain.output


def test_parametric_prompt_baseline_leaves_clean_prompts_alone(tiny_llama):
    ex = build_domain("world_capital")[0]
    results = evaluate(tiny_llama, [ex], {"Original": Steering(), "Prompt": Method(instructed=True)})
    by = {(r.method, r.conflict_type): r.output for r in results}
    assert by[("Original", "clean")] == by[("Prompt", "clean")]
    assert len(results) == 6



def test_forced_decoding_likelihoods_equal_the_teacher_forced_reference(tiny_llama):
    from juice.baselines.cad import cad_continuation_logprobs
    from juice.eval.runner import likelihood_wins

    lm = tiny_llama
    exs = [ex for ex in _examples() if ex.metric == "memotrap"]
    coef = steering_coefficients(lm.heads.geometry, SELECTION, 3, -2)
    methods = {"Original": Method(), "JuNE": Method(Steering("scale", coef)), "JuICE": Method(Steering("add", coef)),
               "CAD": Method(contrast=CadPolicy(1.0)), "AdaCAD": Method(contrast=CadPolicy(jsd_alpha)), "Prompt": Method(instructed=True),
               "Prompt+AdaCAD": Method(instructed=True, contrast=CadPolicy(jsd_alpha))}
    wins = likelihood_wins(lm, exs, methods, max_rows=3)
    for name, method in methods.items():
        for j, ex in enumerate(exs):
            prompt = contextual_prompt(ex) if method.instructed else ex.prompt
            pair = [ex.context_answer, ex.parametric_answer]
            if method.contrast is not None:
                lp = cad_continuation_logprobs(lm, [prompt] * 2, [ex.question] * 2, pair, method.contrast.alpha)
            else:
                lp = continuation_logprobs(lm, [prompt] * 2, pair, method.steering)
            assert wins[name][j] == bool(lp[0] > lp[1]), (name, j)


def test_forced_logprobs_match_the_reference_values(tiny):
    from juice.engine import Stream, generate

    prompts = ["the capital of france is", "tennis golf w40 w41 w42 is"]
    conts = [" paris .", " golf"]
    coef = steering_coefficients(tiny.heads.geometry, SELECTION, 2, -1)
    for steering in (Steering(), Steering("scale", coef), Steering("add", coef)):
        ids = [continuation_ids_(tiny, p, c) for p, c in zip(prompts, conts)]
        forced = torch.zeros(2, 2, dtype=torch.long)
        for i, c in enumerate(ids):
            forced[i, : len(c)] = torch.tensor(c)
        gen = generate(tiny, prompts, [Stream(0, steering), Stream(1, steering)], 2, forced_tokens=forced)
        ref = continuation_logprobs(tiny, prompts, conts, steering)
        for i, c in enumerate(ids):
            assert abs(float(gen.forced_logprobs[i, : len(c)].sum()) - float(ref[i])) < 1e-4


def continuation_ids_(lm, prompt, cont):
    from juice.engine.likelihood import continuation_ids

    return continuation_ids(lm.tokenizer, prompt, cont)[1]


def test_an_evaluated_text_ends_at_eos_as_hugging_face_generate_ends_it(tiny_llama):
    """Evaluation stops a row at EOS and its text ends there (the authors' baselines decode with
    Hugging Face's `generate`, which stops at EOS); for Original the text equals `generate`'s, for
    a steered row the tokens before EOS equal the unstopped decoding's. A greedy token of the tiny
    model is made the EOS (a tokenizer of its own, the shared one untouched) so that the case occurs."""
    from dataclasses import replace

    from juice.engine import greedy_generate
    from juice.eval.runner import DecodeRequest, decode_requests

    from conftest import make_tokenizer

    prompt = "the capital of france is"
    free = greedy_generate(tiny_llama, [prompt], 6).tokens[0].tolist()
    cut = next(k for k in range(1, 6) if free[k] not in free[:k])
    lm = replace(tiny_llama, tokenizer=make_tokenizer(eos_token=tiny_llama.tokenizer.convert_ids_to_tokens(free[cut])))
    assert lm.tokenizer.eos_token_id == free[cut]
    (text, _), = decode_requests(lm, [DecodeRequest(prompt, Method(), [0])], 6)
    ids = torch.tensor([token_ids(lm.tokenizer, prompt)], device=lm.device)
    hf = lm.model.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=6, do_sample=False,
                           eos_token_id=free[cut], pad_token_id=lm.tokenizer.pad_token_id)[0, ids.shape[1]:]
    assert hf.tolist() == free[: cut + 1]     # generate stops at EOS (its last token)
    assert text == lm.tokenizer.decode(hf[:-1], skip_special_tokens=True)
    assert text != lm.tokenizer.decode(free, skip_special_tokens=True)


def test_rows_that_stop_at_the_sixth_word_keep_every_verdict_and_probability(tiny):
    """Exact match reads five words: stopping a row once its text holds a sixth changes no
    verdict and no probability, and the stored output is a prefix of the full one."""
    from juice.data.records import ConflictExample

    examples = [ConflictExample("d", f"s{i}", ("w1", "w7"), f"w{i + 3}",
                                {t: f"w{i} w{i + 1} the capital of france is {t}"
                                 for t in ("clean", "substitution", "coherent")}) for i in range(3)]
    methods = {"Original": Method(), "JuICE": Method(Steering("add", steering_coefficients(
        tiny.heads.geometry, SELECTION, 2.0, -1.0))), "JuNE": Method(Steering("scale", steering_coefficients(
            tiny.heads.geometry, SELECTION, 1.0, -0.5, "scale")))}
    full = evaluate(tiny, examples, methods, full_outputs=True)
    cut = evaluate(tiny, examples, methods)
    assert [(r.correct, r.follows_context, r.p_parametric, r.p_context) for r in cut] == \
           [(r.correct, r.follows_context, r.p_parametric, r.p_context) for r in full]
    assert all(f.output.startswith(c.output) for f, c in zip(full, cut))
    assert any(len(c.output) < len(f.output) for f, c in zip(full, cut))


def test_requests_that_are_the_same_computation_are_decoded_once(tiny_llama):
    """decode_requests decodes a repeated request, and a steering of all-zero coefficients
    (JuICE or JuNE at (0, 0)), once, as Original; every request still gets its result."""
    from juice.engine.backend import JuiceEngine
    from juice.eval.runner import DecodeRequest, decode_requests

    lm = tiny_llama
    g = lm.heads.geometry
    seen = []

    class Counting(JuiceEngine):   # juice's engine, counting the streams it is asked to decode
        def generate(self, lm, prompts, streams, *a, **k):
            seen.append(len(streams))
            return super().generate(lm, prompts, streams, *a, **k)
    juice = Method(Steering("add", steering_coefficients(g, SELECTION, 2.0, -1.0)))
    requests = [DecodeRequest("the capital of", Method(), [1]),
                DecodeRequest("the capital of", Method(Steering("add", steering_coefficients(g, SELECTION, 0, 0))), [1]),
                DecodeRequest("the capital of", Method(Steering("scale", steering_coefficients(g, SELECTION, 0, 0, "scale"))), [1]),
                DecodeRequest("the capital of", juice, [1]), DecodeRequest("the capital of", juice, [1]),
                DecodeRequest("the capital of", Method(), [2])]   # another probe: its own request
    progress = []
    out = decode_requests(lm, requests, 5, on_progress=progress.append, engine=Counting())
    assert seen == [3] and sum(progress) == len(requests)
    alone = [decode_requests(lm, [r], 5)[0] for r in requests]
    assert [t for t, _ in out] == [t for t, _ in alone]
    assert all(torch.allclose(p, q, rtol=0, atol=1e-6) for (_, p), (_, q) in zip(out, alone))   # batch shapes differ
    assert out[0][0] == out[1][0] == out[2][0] and out[3][0] == out[4][0]
