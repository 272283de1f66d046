"""Greedy decoding equals Hugging Face `generate` on every tiny architecture; seeded sampling is
reproducible, independent of the rest of its batch, equal for JuICE at beta 0 and Original, and
top_k = 1 is greedy."""

from __future__ import annotations

import pytest
import torch

from juice.engine import Stream, generate, greedy_generate
from juice.engine.sampling import Sampling
from juice.interventions import HeadSelection
from juice.interventions import Head
from juice.steering import JuICE, Steering
from juice.tokens import encode

pytestmark = pytest.mark.gpu   # benchmarks/gpu_check.py runs these on the device

PROMPTS = ["the capital of france is", "the name of the capital city of japan is",
           "w1 w2 w3 the name of the capital city of spain is"]


def test_greedy_decoding_equals_hugging_face_generate(tiny):
    """HF stops a row at EOS (and pads it after); ours decodes on: equal up to the first EOS."""
    batch = encode(tiny.tokenizer, PROMPTS).to(tiny.device)
    with torch.inference_mode():
        hf = tiny.model.generate(input_ids=batch.input_ids, attention_mask=batch.attention_mask, max_new_tokens=6,
                                 do_sample=False, pad_token_id=tiny.tokenizer.pad_token_id)
    hf = hf[:, batch.input_ids.shape[1]:]
    ours = greedy_generate(tiny, PROMPTS, 6).tokens
    eos = tiny.tokenizer.eos_token_id
    for mine, theirs in zip(ours.tolist(), hf.tolist()):
        end = mine.index(eos) + 1 if eos in mine else len(mine)
        assert mine[:end] == theirs[:end]


def test_sampling_is_seeded_and_independent_of_its_batch(tiny_llama):
    s = Sampling(temperature=1.5, top_p=0.95, seed=3)
    alone = generate(tiny_llama, PROMPTS, [Stream(0, sampling=s)], 8).tokens
    again = generate(tiny_llama, PROMPTS, [Stream(0, sampling=s)], 8).tokens
    mixed = generate(tiny_llama, PROMPTS, [Stream(1), Stream(0, sampling=s), Stream(2, sampling=Sampling(seed=9))], 8)
    assert torch.equal(alone, again) and torch.equal(mixed.tokens[1], alone[0])
    other = generate(tiny_llama, PROMPTS, [Stream(0, sampling=Sampling(temperature=1.5, top_p=0.95, seed=4))], 8)
    assert not torch.equal(other.tokens, alone)   # another seed, other draws (random tiny model: flat)


def test_sampled_juice_at_beta_zero_equals_sampled_original(tiny_llama):
    sel = HeadSelection((Head(1, 2),), (Head(0, 1),))
    s = Sampling(temperature=2.0, seed=1)
    juice0 = generate(tiny_llama, PROMPTS, [Stream(i, JuICE(tiny_llama, sel, 0.0, 0.0), s) for i in range(3)], 6)
    original = generate(tiny_llama, PROMPTS, [Stream(i, Steering(), s) for i in range(3)], 6)
    assert torch.equal(juice0.tokens, original.tokens)
    steered = generate(tiny_llama, PROMPTS, [Stream(i, JuICE(tiny_llama, sel, 30.0, -5.0), s) for i in range(3)], 6)
    assert not torch.equal(steered.tokens, original.tokens)


def test_top_k_one_is_greedy_and_bad_settings_are_refused(tiny_llama):
    greedy = greedy_generate(tiny_llama, PROMPTS, 5).tokens
    sampled = generate(tiny_llama, PROMPTS, [Stream(i, sampling=Sampling(top_k=1, seed=i)) for i in range(3)], 5)
    assert torch.equal(sampled.tokens, greedy)
    tiny_p = generate(tiny_llama, PROMPTS, [Stream(i, sampling=Sampling(top_p=1e-6, seed=i)) for i in range(3)], 5)
    assert torch.equal(tiny_p.tokens, greedy)   # top_p keeps at least the most probable token
    for bad in (dict(temperature=0.0), dict(top_k=-1), dict(top_p=0.0), dict(top_p=1.5)):
        with pytest.raises(ValueError):
            Sampling(**bad)


def test_draw_keeps_only_the_allowed_tokens():
    logits = torch.tensor([3.0, 2.0, 1.0, 0.0, -1.0])
    g = torch.Generator().manual_seed(0)
    assert {Sampling(top_k=2).draw(logits, g) for _ in range(200)} == {0, 1}
    # probabilities ~ .64 .23 .09 .03 .01: top_p 0.8 keeps the first two (0.64 < 0.8 <= 0.87)
    assert {Sampling(top_p=0.8).draw(logits, g) for _ in range(200)} == {0, 1}


def test_eos_stop_and_repetition_penalty_equal_hugging_face_generate(tiny):
    """With `stop_at_eos`, tokens equal HF's exactly (HF pads a finished row; we repeat EOS, so
    padding is compared as EOS); with a repetition penalty too, greedy and batched."""
    batch = encode(tiny.tokenizer, PROMPTS).to(tiny.device)
    eos, pad = tiny.tokenizer.eos_token_id, tiny.tokenizer.pad_token_id
    for penalty in (1.0, 1.3, 0.8):
        with torch.inference_mode():
            hf = tiny.model.generate(input_ids=batch.input_ids, attention_mask=batch.attention_mask, max_new_tokens=8,
                                     do_sample=False, pad_token_id=pad, eos_token_id=eos, repetition_penalty=penalty)
        hf = hf[:, batch.input_ids.shape[1]:]
        hf = torch.cat([hf, hf.new_full((hf.shape[0], 8 - hf.shape[1]), pad)], 1)   # HF stops when all rows end
        ours = generate(tiny, PROMPTS, [Stream(i, repetition_penalty=penalty) for i in range(3)], 8,
                        stop_at_eos=True).tokens
        finished = (ours == eos).long().cumsum(1) - (ours == eos).long() > 0   # after a row's first EOS
        assert torch.equal(ours.masked_fill(finished, pad).cpu(), hf.cpu()), penalty


def test_repetition_penalty_changes_only_seen_tokens_and_one_is_a_no_op(tiny_llama):
    from juice.engine.sampling import penalize_repetition

    logits = torch.tensor([[2.0, -2.0, 1.0, 0.5]])
    seen = torch.tensor([[True, True, False, False]])
    assert penalize_repetition(logits, seen, torch.tensor([2.0])).tolist() == [[1.0, -4.0, 1.0, 0.5]]
    plain = generate(tiny_llama, PROMPTS, [Stream(i) for i in range(3)], 6).tokens
    one = generate(tiny_llama, PROMPTS, [Stream(i, repetition_penalty=1.0) for i in range(3)], 6).tokens
    assert torch.equal(plain, one)
    strong = generate(tiny_llama, PROMPTS, [Stream(i, repetition_penalty=50.0) for i in range(3)], 6).tokens
    for row in strong.tolist():   # a very strong penalty: no new token repeats an earlier new token
        assert len(set(row)) == len(row)
    with pytest.raises(ValueError, match="repetition_penalty"):
        Stream(0, repetition_penalty=0.0)
