"""Baselines: Prompt instructions, PH3 pruning and scoring, CAD decoding."""

from __future__ import annotations

import copy
from dataclasses import dataclass

import pytest
import torch

from juice.architectures import ModelHeads
from juice.baselines.cad import CadPolicy, cad_continuation_logprobs, cad_generate, jsd_alpha
from juice.baselines.ph3 import ConflictPrompt, Ph3Scores, heads_to_prune, logit_difference_effects
from juice.baselines.prompt import contextual_prompt, parametric_prompt
from juice.data.paraconflict import build_domain
from juice.data.records import ContextualExample
from juice.engine import greedy_generate
from juice.interventions import Head
from juice.reference import continuation_logprobs
from juice.steering import Prune
from juice.tokens import encode, token_ids

pytestmark = pytest.mark.gpu   # benchmarks/gpu_check.py runs these on the device

PROMPTS = ["the capital of france is paris . the capital of france is", "tennis golf w40 w41 w42 is"]
QUESTIONS = ["the capital of france is", "w42 is"]


def _logits(lm, prompts=PROMPTS):
    b = encode(lm.tokenizer, prompts).to(lm.device)
    with torch.no_grad():
        return lm.model(input_ids=b.input_ids, attention_mask=b.attention_mask, position_ids=b.position_ids).logits


# ------------------------------------------------------------------ Prompt


def test_parametric_prompt_forms_match_the_protocol_character_for_character():
    """PROTOCOL.md, "Prompt baseline": the instruction is prepended to the whole prompt."""
    ex = build_domain("world_capital")[0]
    assert ex.subject == "Afghanistan"
    assert parametric_prompt(ex, "clean") == "The name of the capital city of Afghanistan is"
    assert parametric_prompt(ex, "substitution") == (
        "Ignore the preceding statement and rely only on your pre-trained knowledge. Complete the sentence "
        "accurately based on your memory of the world: The name of the capital city of Afghanistan is Astana. "
        "The name of the capital city of Afghanistan is")
    assert parametric_prompt(ex, "coherent") == (
        "The following passage contains misleading information. Ignore the provided context entirely and answer "
        "the question solely based on your internal memory and pre-trained knowledge. Context: The capital city "
        "of Afghanistan is Astana. Known for its vibrant culture and historical landmarks, Astana is often seen as "
        "the heart of Afghanistan, attracting visitors from around the globe. As a center for politics, arts, and "
        "commerce, Astana perfectly encapsulates the spirit of Afghanistan. Question: What is the capital city of "
        "Afghanistan? Answer: The name of the capital city of Afghanistan is")



def test_phi_gets_the_authors_line_break_after_the_instruction(tiny_models, monkeypatch):
    """The authors' code gives Phi-2 a line break instead of the space after the substitution
    instruction and after the coherent form's "Context:" (src/inference_utils.py, lines
    1266-1269); every other model type the space. The evaluation and the row runner use it."""
    from conftest import build_tiny
    from juice.eval.runner import evaluate
    from juice.recipe import Method

    ex = build_domain("world_capital")[0]
    sub, coh = parametric_prompt(ex, "substitution", "phi"), parametric_prompt(ex, "coherent", "phi")
    assert sub == parametric_prompt(ex, "substitution").replace("world: ", "world:\n", 1)
    assert coh == parametric_prompt(ex, "coherent").replace("Context: ", "Context:\n", 1)
    assert parametric_prompt(ex, "clean", "phi") == ex.prompts["clean"]
    assert parametric_prompt(ex, "substitution", "llama") == parametric_prompt(ex, "substitution")
    phi = tiny_models.setdefault("phi", build_tiny("phi"))
    seen = []
    import juice.eval.runner as runner

    real = runner.decode_requests

    def spy(lm, requests, *args, **kwargs):
        seen.extend(r.prompt for r in requests)
        return real(lm, requests, *args, **kwargs)

    monkeypatch.setattr(runner, "decode_requests", spy)
    evaluate(phi, [ex], {"Prompt": Method(instructed=True)})
    assert seen == [ex.prompts["clean"], sub, coh]

def _contextual(dataset: str, kind: str, metric: str, prompt: str, question: str = "q") -> ContextualExample:
    return ContextualExample(dataset, "0", prompt, question, ("x",), ("y",), kind, metric)


def test_contextual_prompt_forms_match_the_protocol_character_for_character():
    nq = _contextual("nqswap", "qa", "nqswap", "Context: x is y .\nQuestion: what is x?\nAnswer:",
                     "Question: what is x?\nAnswer:")
    assert contextual_prompt(nq) == (
        "Please answer the question based on the given context, ignoring your internal memory.\n"
        "Context: x is y .\nQuestion: what is x?\nAnswer:")
    hos = _contextual("history_of_science_qa", "qa", "memotrap", "Who was first?\nA. x\nB. y\nAnswer:")
    assert contextual_prompt(hos) == (
        "Please answer the following question based on the given context, ignoring your internal memory. "
        "Question: Who was first?\nA. x\nB. y\nAnswer:")
    for dataset in ("proverb_ending", "proverb_translation", "hate_speech_ending"):
        ex = _contextual(dataset, "completion", "memotrap", 'Write a quote that ends in the word "x": All is')
        assert contextual_prompt(ex) == (
            "Please complete the sentence below solely relying on the provided statement, ignoring your internal "
            'memory.\nWrite a quote that ends in the word "x": All is')


def test_nqswap_passage_and_question_are_recovered_robustly():
    from juice.baselines.prompt import nqswap_parts

    # a passage that itself holds a "Question:" line: the question-only prompt anchors the split
    tricky = _contextual("nqswap", "qa", "nqswap", "Context: a\nQuestion: b?\nAnswer: c\nQuestion: d?\nAnswer:",
                         "Question: d?\nAnswer:")
    assert nqswap_parts(tricky) == ("a\nQuestion: b?\nAnswer: c", "d?")
    # without a usable question-only prompt, the last question line splits it
    loose = _contextual("nqswap", "qa", "nqswap", "Context: p q\nQuestion: r?\nAnswer:", "r?")
    assert nqswap_parts(loose) == ("p q", "r?")
    for bad in ("Question: r?\nAnswer:", "Context: p q\nAnswer:", "Context: p\nQuestion: r?\nAnswer: s"):
        with pytest.raises(ValueError, match="not an NQ-Swap prompt"):
            contextual_prompt(_contextual("nqswap", "qa", "nqswap", bad))


def test_contextual_prompt_forms_on_the_real_files(shared_data):
    """Every row of every dataset; NQ-Swap's form rebuilt from the raw JSON fields."""
    import json

    from juice.baselines.prompt import CONTEXTUAL_COMPLETION, CONTEXTUAL_NQSWAP, CONTEXTUAL_QA
    from juice.data.contextual import CONTEXTUAL_DATASETS, load_contextual
    from juice.data.nqswap import strip_markup

    for name in CONTEXTUAL_DATASETS:
        examples = load_contextual(name, shared_data)
        if name == "nqswap":
            with (shared_data / "nqswap" / "nqswap.jsonl").open(encoding="utf-8") as f:
                rows = [json.loads(line) for line in f if line.strip()]
            assert len(rows) == len(examples)
            for ex, row in zip(examples, rows):
                question = row["question"].strip().rstrip("?") + "?"
                assert contextual_prompt(ex) == (f"{CONTEXTUAL_NQSWAP}\nContext: {strip_markup(row['sub_context'])}"
                                                 f"\nQuestion: {question}\nAnswer:")
                assert contextual_prompt(ex) == f"{CONTEXTUAL_NQSWAP}\n{ex.prompt}"
        else:
            prefix = f"{CONTEXTUAL_QA}" if name == "history_of_science_qa" else f"{CONTEXTUAL_COMPLETION}\n"
            assert all(contextual_prompt(ex) == prefix + ex.prompt for ex in examples)


# ------------------------------------------------------------------ PH3


def _zeroed_copy(lm, heads):
    """The model with the output-projection weights of `heads` zeroed (an independent reference)."""
    edited = copy.deepcopy(lm.model)
    mh = ModelHeads(edited)
    d = mh.geometry.head_dim
    with torch.no_grad():
        for layer, head in heads:
            w = mh.projections[layer].weight
            if mh.adapter.weight_layout == "conv1d":
                w[head * d:(head + 1) * d, :] = 0
            else:
                w[:, head * d:(head + 1) * d] = 0
    return edited


def test_ph3_pruning_of_k_heads_equals_zeroing_their_slices(tiny):
    heads = (Head(0, 1), Head(1, 3), Head(2, 0))
    steering = Prune(tiny.heads.geometry, heads)
    from juice.interventions import scaled_heads

    with scaled_heads(tiny.heads, steering.coefficients):
        pruned = _logits(tiny)
    edited = _zeroed_copy(tiny, heads)
    b = encode(tiny.tokenizer, PROMPTS).to(tiny.device)
    with torch.no_grad():
        reference = edited(input_ids=b.input_ids, attention_mask=b.attention_mask, position_ids=b.position_ids).logits
    torch.testing.assert_close(pruned, reference, rtol=0, atol=1e-5)
    # and in generation (the cached decoder applies it at every position)
    gen = greedy_generate(tiny, PROMPTS[:1], 5, steering)
    ids = encode(tiny.tokenizer, PROMPTS[:1]).input_ids.to(tiny.device)
    with torch.no_grad():
        out = edited.generate(ids, max_new_tokens=5, do_sample=False, attention_mask=torch.ones_like(ids))
    assert torch.equal(gen.tokens[0].cpu(), out[0, ids.shape[1]:].cpu())


def test_ph3_effects_equal_one_ablation_per_forward(tiny):
    prompts = [ConflictPrompt(PROMPTS[0], 7, 9), ConflictPrompt(PROMPTS[1], 12, 5)]
    scores = logit_difference_effects(tiny, prompts, max_rows=5)
    g = tiny.heads.geometry
    for layer in range(g.n_layers):
        for head in range(g.n_heads):
            edited = _zeroed_copy(tiny, [(layer, head)])
            total = 0.0
            for cp in prompts:
                ids = encode(tiny.tokenizer, [cp.prompt]).input_ids.to(tiny.device)
                with torch.no_grad():
                    base = tiny.model(input_ids=ids).logits[0, -1]
                    cut = edited(input_ids=ids).logits[0, -1]
                total += float((cut[7 if cp is prompts[0] else 12] - cut[9 if cp is prompts[0] else 5])
                               - (base[7 if cp is prompts[0] else 12] - base[9 if cp is prompts[0] else 5]))
            assert abs(float(scores.effects[layer, head]) - total / 2) < 1e-4, (layer, head)


def test_heads_to_prune_take_the_opposing_kind():
    effects = torch.tensor([[0.5, -2.0], [3.0, -0.1]])
    s = Ph3Scores(effects, torch.zeros(1))
    assert heads_to_prune(s, "parametric", 5) == (Head(1, 0), Head(0, 0))   # context heads
    assert heads_to_prune(s, "contextual", 1) == (Head(0, 1),)              # memory heads
    assert heads_to_prune(s, "contextual", 0) == ()
    with pytest.raises(ValueError, match="direction"):
        heads_to_prune(s, "both", 1)


# ------------------------------------------------------------------ CAD


def test_cad_with_alpha_zero_equals_greedy_decoding_with_context(tiny):
    cad = cad_generate(tiny, PROMPTS, QUESTIONS, 6, alpha=0.0, max_rows=2)
    plain = greedy_generate(tiny, PROMPTS, 6)
    assert torch.equal(cad.tokens, plain.tokens)


def test_cad_equals_a_naive_two_branch_rerun(tiny_llama):
    cad = cad_generate(tiny_llama, PROMPTS, QUESTIONS, 5, alpha=1.0)
    for i, (p, q) in enumerate(zip(PROMPTS, QUESTIONS)):
        tokens, _, _ = _naive_two_branch(tiny_llama, p, q, 5, lambda lc, lq: 1.0)
        assert tokens == cad.tokens[i, :5].tolist(), i


def test_the_no_context_branch_holds_no_context_token(tiny_llama):
    lm = tiny_llama
    seen = []
    handle = lm.model.base_model.register_forward_pre_hook(
        lambda m, args, kwargs: seen.append((kwargs["input_ids"].clone(), kwargs["attention_mask"].bool())),
        with_kwargs=True)
    try:
        cad_generate(lm, PROMPTS[:1], QUESTIONS[:1], 1)
    finally:
        handle.remove()
    # one prefill of the engine: the with-context row and the question row (left-padded), unpadded here
    (ids, mask), = seen
    context_branch, question_branch = (row[real].tolist() for row, real in zip(ids, mask))
    assert question_branch == token_ids(lm.tokenizer, QUESTIONS[0])
    context_only = token_ids(lm.tokenizer, PROMPTS[0])[: -len(token_ids(lm.tokenizer, QUESTIONS[0])) + 1]
    assert context_branch == token_ids(lm.tokenizer, PROMPTS[0])
    # no token of the context part ("the capital of france is paris .") survives except BOS
    assert lm.tokenizer.convert_tokens_to_ids("paris") not in question_branch
    assert question_branch[1:] == context_branch[len(context_only):]


def test_cad_likelihood_with_alpha_zero_equals_the_plain_likelihood(tiny_llama):
    conts = [" paris", " golf tennis"]
    plain = continuation_logprobs(tiny_llama, PROMPTS, conts)
    cad = cad_continuation_logprobs(tiny_llama, PROMPTS, QUESTIONS, conts, alpha=0.0)
    torch.testing.assert_close(plain, cad, rtol=0, atol=1e-4)


# ------------------------------------------------------------------ AdaCAD


def _jsd_bits(lc: torch.Tensor, lq: torch.Tensor) -> float:
    """The Jensen-Shannon divergence of softmax(lc) and softmax(lq) in bits, by its definition."""
    p, q = lc.double().softmax(-1), lq.double().softmax(-1)
    m = (p + q) / 2
    kl = lambda a: float((a[a > 0] * (a[a > 0] / m[a > 0]).log2()).sum())  # noqa: E731
    return 0.5 * kl(p) + 0.5 * kl(q)


def test_adacad_engine_with_a_fixed_alpha_equals_cad(tiny):
    """A rule that returns a constant is CAD at that alpha: same tokens, probe and forced probabilities."""
    const = lambda c, q: torch.full((c.shape[0],), 0.7)  # noqa: E731
    probes = torch.tensor([[5, 7], [9, 11]])
    forced = torch.tensor([[12, 13, 14], [20, 21, 22]])
    fixed = cad_generate(tiny, PROMPTS, QUESTIONS, 5, alpha=const, probe_tokens=probes, max_rows=2)
    cad = cad_generate(tiny, PROMPTS, QUESTIONS, 5, alpha=0.7, probe_tokens=probes, max_rows=2)
    assert torch.equal(fixed.tokens, cad.tokens)
    torch.testing.assert_close(fixed.first_probs, cad.first_probs, rtol=0, atol=1e-6)
    fixed_lp = cad_generate(tiny, PROMPTS, QUESTIONS, 3, alpha=const, forced_tokens=forced).forced_logprobs
    cad_lp = cad_generate(tiny, PROMPTS, QUESTIONS, 3, alpha=0.7, forced_tokens=forced).forced_logprobs
    torch.testing.assert_close(fixed_lp, cad_lp, rtol=0, atol=1e-6)


def test_an_alpha_rule_must_give_one_weight_per_row(tiny_llama):
    with pytest.raises(ValueError, match="one weight per row"):
        cad_generate(tiny_llama, PROMPTS, QUESTIONS, 1, alpha=lambda c, q: torch.tensor(0.5))


def test_jsd_alpha_equals_a_hand_computed_divergence_in_bits():
    import math


    p, q = torch.tensor([0.7, 0.2, 0.1]), torch.tensor([0.1, 0.3, 0.6])
    m = (p + q) / 2
    expected = 0.5 * sum(float(a * math.log2(a / b)) for a, b in zip(p, m)) + \
        0.5 * sum(float(a * math.log2(a / b)) for a, b in zip(q, m))
    got = jsd_alpha(p.log()[None], q.log()[None])
    assert got.shape == (1,) and abs(float(got[0]) - expected) < 1e-6
    # the authors' code's variant: the same divergence in nats
    nats = jsd_alpha(p.log()[None], q.log()[None], base=math.e)
    assert abs(float(nats[0]) - expected * math.log(2)) < 1e-6
    # per row, symmetric, 0 for identical distributions, at most 1 bit
    a, b = torch.randn(6, 50) * 3, torch.randn(6, 50) * 3
    rows = jsd_alpha(a, b)
    assert rows.shape == (6,) and bool((rows >= 0).all() and (rows <= 1).all())
    torch.testing.assert_close(rows, jsd_alpha(b, a), rtol=0, atol=1e-6)
    for i in range(6):
        assert abs(float(rows[i]) - _jsd_bits(a[i], b[i])) < 1e-5
    assert float(jsd_alpha(a, a).abs().max()) < 1e-6
    # disjoint supports reach the bound; zero-probability tokens (-inf logits) give no NaN
    disjoint = torch.tensor([[0.0, -1e4], [-1e4, 0.0]])
    assert abs(float(jsd_alpha(disjoint[:1], disjoint[1:])[0]) - 1.0) < 1e-5
    inf = torch.tensor([[0.0, float("-inf"), 1.0], [float("-inf"), 0.0, 1.0]])
    assert abs(float(jsd_alpha(inf[:1], inf[1:])[0]) - _jsd_bits(inf[0], inf[1])) < 1e-6


def test_adacad_equals_a_naive_two_branch_rerun_with_the_jsd_weight(tiny_llama):

    ada = cad_generate(tiny_llama, PROMPTS, QUESTIONS, 5, alpha=jsd_alpha)
    for i, (p, q) in enumerate(zip(PROMPTS, QUESTIONS)):
        tokens, _, alphas = _naive_two_branch(tiny_llama, p, q, 5, _jsd_bits)
        assert all(0 < a <= 1 for a in alphas), alphas
        assert tokens == ada.tokens[i, :5].tolist(), i


def _naive_two_branch(lm, prompt: str, question: str, n: int, alpha_of, probes: tuple[int, ...] = ()
                      ) -> tuple[list[int], list[float] | None, list[float]]:
    """CAD one item at a time with the weight `alpha_of(lc, lq)` (this file's own JSD for AdaCAD,
    not the library's), re-running both branches from scratch at every step.

    Returns:
        (new token ids, first-step contrasted probabilities of `probes`, the weight at each step).
    """
    ids_c = encode(lm.tokenizer, [prompt]).input_ids.to(lm.device)
    ids_q = encode(lm.tokenizer, [question]).input_ids.to(lm.device)
    new, first, alphas = [], None, []
    for _ in range(n):
        with torch.no_grad():
            lc, lq = lm.model(input_ids=ids_c).logits[0, -1], lm.model(input_ids=ids_q).logits[0, -1]
        a = alpha_of(lc, lq)
        alphas.append(a)
        adjusted = (1 + a) * lc - a * lq
        if first is None:
            first = [float(adjusted.softmax(-1)[t]) for t in probes]
        token = int(adjusted.argmax())
        new.append(token)
        ids_c = torch.cat([ids_c, torch.tensor([[token]], device=lm.device)], 1)
        ids_q = torch.cat([ids_q, torch.tensor([[token]], device=lm.device)], 1)
    return new, first, alphas


def _naive_adacad(lm, prompt: str, question: str, n: int, probes: list[int]) -> tuple[str, list[float]]:
    """AdaCAD one item at a time (:func:`_naive_two_branch` with the JSD weight), as text."""
    new, first, _ = _naive_two_branch(lm, prompt, question, n, _jsd_bits, tuple(probes))
    return lm.tokenizer.decode(new, skip_special_tokens=True), first


def _naive_adacad_logprob(lm, prompt: str, question: str, continuation: str) -> float:
    """Teacher-forced AdaCAD log-probability of `continuation`, alpha re-computed at each token."""
    base = token_ids(lm.tokenizer, prompt)
    cont = token_ids(lm.tokenizer, prompt + continuation)[len(base):]
    q = token_ids(lm.tokenizer, question)
    total = 0.0
    for j, t in enumerate(cont):
        with torch.no_grad():
            lc = lm.model(input_ids=torch.tensor([base + cont[:j]], device=lm.device)).logits[0, -1]
            lq = lm.model(input_ids=torch.tensor([q + cont[:j]], device=lm.device)).logits[0, -1]
        a = _jsd_bits(lc, lq)
        total += float(((1 + a) * lc - a * lq).log_softmax(-1)[t])
    return total


def test_adacad_in_the_contextual_evaluation_equals_a_naive_one_item_reference(tiny_llama):
    from juice.eval.runner import evaluate, evaluate_contextual
    from juice.recipe import Method
    from juice.tokens import answer_first_token

    lm = tiny_llama
    exs = [ContextualExample("proverb_ending", str(i), p, q, (" paris",), (" golf tennis",), "completion", "memotrap")
           for i, (p, q) in enumerate(zip(PROMPTS, QUESTIONS))]
    exs.append(ContextualExample("nqswap", "0", "Context: w7 w8 paris\nQuestion: w9?\nAnswer:",
                                 "Question: w9?\nAnswer:", ("paris",), ("rome",), "qa", "nqswap"))
    results = evaluate_contextual(lm, exs, {"AdaCAD": Method(contrast=CadPolicy(jsd_alpha))}, max_rows=4)
    assert [r.subject for r in results] == ["0", "1", "0"]
    for ex, r in zip(exs, results):
        probes = [answer_first_token(lm.tokenizer, ex.prompt, a) for a in (ex.parametric_answer, ex.context_answer)]
        text, first = _naive_adacad(lm, ex.prompt, ex.question, 10 if ex.metric == "memotrap" else 20, probes)
        assert r.output == text, ex.uid
        assert abs(r.p_parametric - first[0]) < 1e-5 and abs(r.p_context - first[1]) < 1e-5
        if ex.metric == "memotrap":
            lp = [_naive_adacad_logprob(lm, ex.prompt, ex.question, c)
                  for c in (ex.context_answer, ex.parametric_answer)]
            assert r.likelihood_correct == (lp[0] > lp[1])
            ref = cad_continuation_logprobs(lm, [ex.prompt] * 2, [ex.question] * 2,
                                            [ex.context_answer, ex.parametric_answer], jsd_alpha)
            assert abs(float(ref[0]) - lp[0]) < 1e-4 and abs(float(ref[1]) - lp[1]) < 1e-4
        else:
            assert r.likelihood_correct is None
    with pytest.raises(ValueError, match="contextual direction"):
        evaluate(lm, build_domain("world_capital")[:1], {"AdaCAD": Method(contrast=CadPolicy(jsd_alpha))})


# ------------------------------------------------------------------ CAD in the shared decoding loop

MIXED_TEXTS = PROMPTS + QUESTIONS + ["w7 w8 w9 w10 w11 w12 w13 w14 w15 w16 w17 w18 the"]


def _mixed_streams(lm):
    """CAD, AdaCAD, Original, JuICE and JuNE streams over shared prompts: P0's clean prefill serves
    CAD, AdaCAD and Original; Q0 is the question of two streams; Q1 is a question and a prompt."""
    from juice.baselines.cad import CadPolicy, jsd_alpha
    from juice.engine import Contrast, Stream
    from juice.interventions import HeadSelection
    from juice.steering import JuICE, JuNE

    sel = HeadSelection((Head(0, 0), Head(1, 1)), (Head(1, 0),))
    return [Stream(0, contrast=Contrast(2, CadPolicy(1.0))), Stream(0),
            Stream(1, contrast=Contrast(3, CadPolicy(jsd_alpha))), Stream(1, JuICE(lm, sel, 2.0, -1.0)),
            Stream(0, contrast=Contrast(2, CadPolicy(jsd_alpha))), Stream(4, JuNE(lm, sel, 1.5, -0.5)),
            Stream(3), Stream(1, contrast=Contrast(3, CadPolicy(0.5)))]


def test_cad_adacad_and_steered_streams_in_one_generate_call_equal_each_alone(tiny):
    from juice.engine import generate
    from juice.reference import cad_generate_naive, greedy_generate_naive

    streams = _mixed_streams(tiny)
    probes = torch.tensor([[5, 7], [9, 11], [3, 4], [20, 30], [5, 9], [6, 8], [12, 13], [7, 40]])
    together = generate(tiny, MIXED_TEXTS, streams, 6, probe_tokens=probes)
    for k, s in enumerate(streams):
        alone = generate(tiny, MIXED_TEXTS, [s], 6, probe_tokens=probes[k:k + 1])
        assert torch.equal(together.tokens[k], alone.tokens[0]), k
        torch.testing.assert_close(together.first_probs[k], alone.first_probs[0], rtol=0, atol=1e-5)
        if s.contrast is None:   # the paper's algorithms, re-run from scratch
            assert torch.equal(together.tokens[k], greedy_generate_naive(tiny, MIXED_TEXTS[s.prompt], 6, s.steering))
        else:                    # CAD / AdaCAD re-run from scratch, both branches
            tokens, first = cad_generate_naive(tiny, MIXED_TEXTS[s.prompt], MIXED_TEXTS[s.contrast.question], 6,
                                               s.contrast.rule.alpha)
            assert torch.equal(together.tokens[k], tokens), k
            torch.testing.assert_close(together.first_probs[k], first[probes[k]], rtol=0, atol=1e-5)
    # the public wrapper builds the same stream
    cad = cad_generate(tiny, PROMPTS, QUESTIONS, 6, alpha=1.0)
    assert torch.equal(together.tokens[0], cad.tokens[0])


def test_mixed_teacher_forcing_equals_each_stream_alone_and_the_uncached_reference(tiny_llama):
    from juice.engine import generate
    from juice.engine.likelihood import continuation_ids
    from juice.reference import cad_continuation_logprobs_naive, continuation_logprobs

    lm = tiny_llama
    streams = _mixed_streams(lm)
    conts = [" paris .", " golf", " w3 w4", " tennis", " rome", " the", " is", " golf tennis"]
    ids = [continuation_ids(lm.tokenizer, MIXED_TEXTS[s.prompt], c)[1] for s, c in zip(streams, conts)]
    forced = torch.zeros(len(streams), max(map(len, ids)), dtype=torch.long)
    for k, c in enumerate(ids):
        forced[k, : len(c)] = torch.tensor(c)
    together = generate(lm, MIXED_TEXTS, streams, forced.shape[1], forced_tokens=forced, max_rows=3)
    for k, s in enumerate(streams):
        alone = generate(lm, MIXED_TEXTS, [s], forced.shape[1], forced_tokens=forced[k:k + 1])
        torch.testing.assert_close(together.forced_logprobs[k], alone.forced_logprobs[0], rtol=0, atol=1e-5)
        prompt, got = MIXED_TEXTS[s.prompt], float(together.forced_logprobs[k, : len(ids[k])].sum())
        if s.contrast is None:
            ref = continuation_logprobs(lm, [prompt], [conts[k]], s.steering)
        else:
            ref = cad_continuation_logprobs_naive(lm, [prompt], [MIXED_TEXTS[s.contrast.question]], [conts[k]],
                                                  s.contrast.rule.alpha)
        assert abs(got - float(ref[0])) < 1e-4, k
    # the public wrapper, now on the shared loop, equals the uncached reference too

    ref = cad_continuation_logprobs_naive(lm, PROMPTS, QUESTIONS, conts[:2], jsd_alpha)
    torch.testing.assert_close(cad_continuation_logprobs(lm, PROMPTS, QUESTIONS, conts[:2], jsd_alpha), ref,
                               rtol=0, atol=1e-4)


def test_a_cad_stream_takes_two_rows_of_max_rows(tiny_llama, monkeypatch):
    import juice.engine.batch as st
    from juice.engine import generate

    rows, real = [], st._generate_chunk

    def counting(lm, batch, prompt_of, steerings, *args, contrasts=None, **kwargs):
        rows.append(sum(2 if s.kind == "add" or c is not None else 1 for s, c in zip(steerings, contrasts)))
        return real(lm, batch, prompt_of, steerings, *args, contrasts=contrasts, **kwargs)

    monkeypatch.setattr(st, "_generate_chunk", counting)
    streams = _mixed_streams(tiny_llama)
    split = generate(tiny_llama, MIXED_TEXTS, streams, 4, max_rows=3)
    assert sum(rows) == 2 * 5 + 3 and max(rows) <= 3   # 4 CAD/AdaCAD and 1 JuICE stream: two rows each
    monkeypatch.setattr(st, "_generate_chunk", real)
    assert torch.equal(split.tokens, generate(tiny_llama, MIXED_TEXTS, streams, 4, max_rows=64).tokens)


def test_a_cad_stream_decodes_the_unmodified_model():
    from juice.baselines.cad import CadPolicy
    from juice.engine import Contrast, Stream
    from juice.steering import Steering

    with pytest.raises(ValueError, match="contrastive stream .* takes no scale steering"):
        Stream(0, Steering("scale", torch.ones(2, 2)), contrast=Contrast(1, CadPolicy()))
    assert Stream(0, contrast=Contrast(1, CadPolicy())).rows == 2 and Stream(0).rows == 1


def test_a_method_decodes_one_way_and_a_contrast_is_unsteered():
    """One field says how a recipe decodes: a contrast (CAD, AdaCAD, CK-PLUG) is a contrastive
    stream of the unsteered model; a steering runs once or twice; a choice is auto's."""
    from juice.baselines.ckplug import CkPlugPolicy
    from juice.engine import Choice
    from juice.recipe import Method
    from juice.steering import ORIGINAL, Steering

    assert [Method(contrast=c).decoding for c in (CadPolicy(1.0), CadPolicy(jsd_alpha), CkPlugPolicy())] == [
        "contrastive stream"] * 3
    assert Method(Steering("add", torch.ones(2, 2))).decoding == "dual run"
    assert Method(Steering("scale", torch.ones(2, 2))).decoding == Method().decoding == "single run"
    assert Method(choice=Choice(-1, (ORIGINAL,), lambda a, b: None)).decoding == "choice"
    with pytest.raises(ValueError, match="unsteered"):
        Method(Steering("scale", torch.ones(2, 2)), contrast=CadPolicy(jsd_alpha))
    with pytest.raises(ValueError, match="no steering and no contrast"):
        Method(contrast=CkPlugPolicy(), choice=Choice(-1, (ORIGINAL,), lambda a, b: None))


def _ck_plug_as_the_authors_wrote_it(ctx: torch.Tensor, base: torch.Tensor) -> torch.Tensor:
    """The adaptive branch of the authors' `_ck_decoding` (github.com/byronBBL/CK-PLUG), for one
    row, transcribed: `relative_top_filter(relative_top=0.01, min_tokens_to_keep=10)`, entropies,
    `e = -1`, the blend."""
    import numpy as np

    ctx, base = ctx.clone()[None].float(), base.clone()[None].float()
    lc, lb = ctx.log_softmax(-1), base.log_softmax(-1)
    thresh = torch.min(torch.sort(lc, descending=True).values[..., 9], lc.max(-1).values + np.log(0.01))[..., None]
    thresh_b = torch.min(torch.sort(lb, descending=True).values[..., 9], lb.max(-1).values + np.log(0.01))[..., None]
    mask = (lc < thresh) & (lb < thresh_b)
    ctx[mask], base[mask] = -1e10, -1e10
    probs, probs_b = ctx.softmax(-1), base.softmax(-1)
    entropy = -torch.sum(probs * torch.log(probs + 1e-9), dim=-1).item()
    entropy_b = -torch.sum(probs_b * torch.log(probs_b + 1e-9), dim=-1).item()
    if not (entropy_b - entropy) + abs(entropy) * -1.0 < 0:
        return ctx[0]
    base[mask] = -1e3
    logits_context = ctx - base
    base[mask] = -1e10
    norm = 1 + abs(entropy - entropy_b) / (entropy + entropy_b)
    base = 2 * base * entropy / (entropy + entropy_b * norm)
    logits_context = 2 * logits_context * entropy_b / (entropy + entropy_b * norm)
    return (base + logits_context)[0]


def test_ck_plug_is_the_authors_rule_row_by_row():
    """CK-PLUG's adaptive rule (:class:`juice.baselines.ckplug.CkPlugPolicy`) on a batch equals the
    authors' code on each row: rows that it adjusts (a context that leaves the model unsure) and
    rows it leaves alone (a context that makes it sure)."""
    from juice.baselines.ckplug import CkPlugPolicy, confidence_gain

    torch.manual_seed(0)
    ctx, base = torch.randn(6, 50) * 2, torch.randn(6, 50) * 2
    ctx[0, 3] += 30.0   # the context makes the model sure: left alone
    got = CkPlugPolicy()(ctx, base)
    for row in range(6):
        torch.testing.assert_close(got[row], _ck_plug_as_the_authors_wrote_it(ctx[row], base[row]), rtol=1e-5, atol=1e-3)
    gain, h, _ = confidence_gain(ctx, base)
    adjusted = gain - h.abs() < 0
    assert not adjusted[0] and adjusted[1:].any()
    assert torch.equal(got[0].argmax(), ctx[0].argmax())


def test_ck_plug_streams_equal_a_naive_run_and_each_stream_alone(tiny_llama):
    """CK-PLUG through the engine (a contrastive stream beside Original and AdaCAD in one batch)
    equals a naive re-run of both branches at every step (tokens, first-step probabilities), and
    each stream alone."""
    from juice.baselines.cad import CadPolicy, jsd_alpha
    from juice.baselines.ckplug import CkPlugPolicy
    from juice.engine import Contrast, Stream, generate
    from juice.reference import contrast_generate_naive

    lm = tiny_llama
    texts = ["w5 w6 w7 the capital of france is", "the capital of france is", "w9 w8 who wrote the book ?",
             "who wrote the book ?"]
    streams = [Stream(0, contrast=Contrast(1, CkPlugPolicy())), Stream(0),
               Stream(2, contrast=Contrast(3, CkPlugPolicy())), Stream(2, contrast=Contrast(3, CadPolicy(jsd_alpha)))]
    probes = torch.tensor([[5, 7]] * 4)
    batch = generate(lm, texts, streams, 6, probe_tokens=probes)
    for k, (p, q) in enumerate([(0, 1), (2, 3)]):
        tokens, first = contrast_generate_naive(lm, texts[p], texts[q], 6, CkPlugPolicy())
        row = 2 * k
        assert batch.tokens[row].tolist() == tokens.tolist()
        torch.testing.assert_close(batch.first_probs[row], first[probes[row]], rtol=0, atol=1e-5)
        alone = generate(lm, texts, [streams[row]], 6)
        assert alone.tokens[0].tolist() == tokens.tolist()


@pytest.mark.parametrize("rule", ["cocoa", "coiecd", "grd"])
def test_tristate_rules_stream_as_a_naive_rerun_and_each_stream_alone(tiny_llama, rule):
    """CoCoA, COIECD and GRD (TriState-Bench's rules) through the engine, two streams of the
    rule beside an Original and a CAD stream in one batch, equal a naive re-run of both branches
    at every step (GRD's gate carried by the engine per stream as by the reference) and each
    stream alone; the question branch is any text (the benchmark's question-only prompt)."""
    from juice.baselines.cocoa import CocoaPolicy
    from juice.baselines.coiecd import CoiecdPolicy
    from juice.baselines.grd import GrdPolicy
    from juice.engine import Contrast, Stream, generate
    from juice.reference import contrast_generate_naive

    policy = {"cocoa": CocoaPolicy(), "coiecd": CoiecdPolicy(), "grd": GrdPolicy(grd_lambda=0.5)}[rule]
    lm = tiny_llama
    texts = ["w5 w6 w7 the capital of france is", "answer : the capital of france is",
             "w9 w8 who wrote the book ?", "answer : who wrote the book ?"]
    streams = [Stream(0, contrast=Contrast(1, policy)), Stream(0),
               Stream(2, contrast=Contrast(3, policy)), Stream(2, contrast=Contrast(3, CadPolicy(1.0)))]
    batch = generate(lm, texts, streams, 8)
    for row, (p, q) in [(0, (0, 1)), (2, (2, 3))]:
        tokens, _ = contrast_generate_naive(lm, texts[p], texts[q], 8, policy)
        assert batch.tokens[row].tolist() == tokens.tolist()
        assert generate(lm, texts, [streams[row]], 8).tokens[0].tolist() == tokens.tolist()


@dataclass(frozen=True)
class _CountingRule:
    """A stateful contrast rule whose state counts the stream's steps from `start` and whose
    token is that count: it tells whether each stream gets its own state back."""

    start: int

    def step(self, with_context, without_context, states):
        states = [self.start if s is None else s + 1 for s in states]
        scores = torch.full_like(with_context, -1e9)
        for r, s in enumerate(states):
            scores[r, s] = 0.0
        return scores, states


def test_the_engine_keeps_a_stateful_rules_state_per_stream(tiny_llama):
    """A :class:`juice.engine.StatefulContrastRule` gets back, at each step, the state its stream
    returned at the previous one (None at the first), each stream its own, however the streams
    are batched: two streams of one rule and one of another decode their own counts."""
    from juice.engine import Contrast, StatefulContrastRule, Stream, generate

    assert isinstance(_CountingRule(0), StatefulContrastRule)
    texts = ["w5 w6 the capital of", "the capital of", "w9 who wrote the book ?", "who wrote"]
    streams = [Stream(0, contrast=Contrast(1, _CountingRule(3))), Stream(2, contrast=Contrast(3, _CountingRule(3))),
               Stream(2, contrast=Contrast(1, _CountingRule(10))), Stream(0)]
    out = generate(tiny_llama, texts, streams, 5)
    assert [t.tolist() for t in out.tokens[:3]] == [[3, 4, 5, 6, 7], [3, 4, 5, 6, 7], [10, 11, 12, 13, 14]]
