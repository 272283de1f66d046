"""The runtime guard: the first padded batch on an unverified backend is checked against
one-at-a-time decoding; a mismatch falls back to eager attention (saying so) or stops the run."""

from __future__ import annotations

import pytest
import torch
from conftest import build_tiny

import juice.engine.batch as st
from juice.engine import guard
from juice.engine import Stream, generate
from juice.tokens import token_ids

pytestmark = pytest.mark.gpu   # benchmarks/gpu_check.py runs these on the device

PROMPTS = ["the capital of france is",                        # 6 tokens with BOS: the most padded
           "the name of the capital city of japan is",       # 10
           "w1 w2 w3 the name of the capital city of spain is"]   # 13: one length bucket for all three


@pytest.fixture(autouse=True)
def fresh_guard(monkeypatch):
    guard.forget_verifications()
    monkeypatch.setenv("JUICE_BATCH_CHECK", "always")
    yield
    guard.forget_verifications()


def count_chunks(monkeypatch) -> list[int]:
    """Record the number of prompts of every decoded chunk."""
    seen, real = [], st._generate_chunk

    def counting(lm, batch, *args, **kwargs):
        seen.append(len(batch))
        return real(lm, batch, *args, **kwargs)

    monkeypatch.setattr(st, "_generate_chunk", counting)
    return seen


def test_an_exact_backend_is_checked_once_and_then_trusted(tiny_llama, monkeypatch):
    assert len({len(token_ids(tiny_llama.tokenizer, p)) for p in PROMPTS}) == 3   # really padded
    seen = count_chunks(monkeypatch)
    streams = [Stream(i) for i in range(3)]
    first = generate(tiny_llama, PROMPTS, streams, 6, max_rows=64)
    assert seen == [3, 1, 1, 1]                    # the batch, then its 3 rows one at a time
    assert guard.combination(tiny_llama) in guard._verified
    second = generate(tiny_llama, PROMPTS, streams, 6, max_rows=64)
    assert seen[4:] == [3] and torch.equal(first.tokens, second.tokens)


def _corrupt_batches(monkeypatch, when):
    """Simulate the CUDA bug: batches of several prompts come back wrong while `when(lm)`."""
    real = st._generate_chunk

    def corrupted(lm, batch, *args, **kwargs):
        tokens, probs, lps = real(lm, batch, *args, **kwargs)
        if len(batch) > 1 and when(lm):
            tokens = (tokens + 1) % lm.model.config.vocab_size
        return tokens, probs, lps

    monkeypatch.setattr(st, "_generate_chunk", corrupted)


def test_a_mismatch_switches_to_eager_attention_and_says_so(monkeypatch):
    lm = build_tiny("llama")   # its own copy: the fallback changes the model
    lm.model.set_attn_implementation("sdpa")   # the fallback starts from sdpa, whatever JUICE_TEST_ATTENTION says
    assert guard.attention_implementation(lm) == "sdpa"
    alone = [generate(lm, [p], [Stream(0)], 6).tokens[0] for p in PROMPTS]
    _corrupt_batches(monkeypatch, lambda lm: guard.attention_implementation(lm) != "eager")
    with pytest.warns(RuntimeWarning, match="switching the model to eager attention"):
        out = generate(lm, PROMPTS, [Stream(i) for i in range(3)], 6)
    assert guard.attention_implementation(lm) == "eager"
    for i in range(3):
        assert torch.equal(out.tokens[i], alone[i])


def test_a_mismatch_that_eager_does_not_fix_stops_the_run(tiny_llama, monkeypatch):
    _corrupt_batches(monkeypatch, lambda lm: True)
    lm = build_tiny("llama")
    lm.model.set_attn_implementation("eager")
    with pytest.raises(guard.BatchingMismatchError, match="differs from one-at-a-time decoding on 3 of 3"):
        generate(lm, PROMPTS, [Stream(i) for i in range(3)], 6)
    assert not guard._verified


def test_policy(monkeypatch, tiny_llama):
    monkeypatch.setenv("JUICE_BATCH_CHECK", "auto")
    # the CPU is checked by the test suite instead; any other device (not yet verified) at run time
    assert guard.needs_check(tiny_llama) == (tiny_llama.device.type != "cpu")
    monkeypatch.setenv("JUICE_BATCH_CHECK", "off")
    assert not guard.needs_check(tiny_llama)
    monkeypatch.setenv("JUICE_BATCH_CHECK", "always")
    assert guard.needs_check(tiny_llama)
    monkeypatch.setenv("JUICE_BATCH_CHECK", "sometimes")
    with pytest.raises(ValueError, match="JUICE_BATCH_CHECK must be one of auto, always, off"):
        guard.needs_check(tiny_llama)


def test_batches_without_padding_are_not_checked_yet():
    calls = []
    out = guard.check_batch(None, [5, 5], torch.zeros(2, 3), lambda r: calls.append(r), lambda: None)
    assert not calls and out.shape == (2, 3)


def test_cad_batches_are_checked_too(monkeypatch):
    import juice.baselines.cad as cad

    lm = build_tiny("llama")
    lm.model.set_attn_implementation("sdpa")   # the fallback starts from sdpa, whatever JUICE_TEST_ATTENTION says
    questions = ["the capital of france is", "the capital of japan is", "the capital of spain is"]
    alone = [cad.cad_generate(lm, [p], [q], 5).tokens[0] for p, q in zip(PROMPTS, questions)]
    real = st._generate_chunk   # CAD streams decode in the engine's chunks

    def corrupted(lm, batch, prompt_of, *args, **kwargs):   # chunks of several CAD streams
        tokens, probs, lps = real(lm, batch, prompt_of, *args, **kwargs)
        if len(prompt_of) > 1 and guard.attention_implementation(lm) != "eager":
            tokens = (tokens + 1) % lm.model.config.vocab_size
        return tokens, probs, lps

    monkeypatch.setattr(st, "_generate_chunk", corrupted)
    with pytest.warns(RuntimeWarning, match="eager attention"):
        out = cad.cad_generate(lm, PROMPTS, questions, 5)
    assert all(torch.equal(out.tokens[i], alone[i]) for i in range(3))


def test_teacher_forcing_is_checked_on_its_log_probabilities(monkeypatch):
    """Forced tokens agree by construction: the guard must compare the log-probabilities."""
    lm = build_tiny("llama")
    lm.model.set_attn_implementation("eager")
    real = st._generate_chunk

    def corrupted(lm, batch, *args, **kwargs):
        tokens, probs, lps = real(lm, batch, *args, **kwargs)
        if len(batch) > 1:
            lps = lps + 1.0
        return tokens, probs, lps

    monkeypatch.setattr(st, "_generate_chunk", corrupted)
    forced = torch.full((3, 4), 7, dtype=torch.long)
    with pytest.raises(guard.BatchingMismatchError):
        generate(lm, PROMPTS, [Stream(i) for i in range(3)], 4, forced_tokens=forced)
    assert not guard._verified


def test_a_verification_holds_for_one_model_only(tiny_llama, tiny_gemma3, monkeypatch):
    seen = count_chunks(monkeypatch)
    generate(tiny_llama, PROMPTS, [Stream(i) for i in range(3)], 3)
    generate(tiny_gemma3, PROMPTS, [Stream(i) for i in range(3)], 3)
    assert seen == [3, 1, 1, 1, 3, 1, 1, 1]   # the second architecture is checked too
    assert guard.combination(tiny_llama) != guard.combination(tiny_gemma3)
