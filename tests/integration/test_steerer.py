"""The Steerer: one object built from a model and its heads; generate (greedy = the engine = HF,
sampled and seeded), EOS and stop strings, chat templates, streaming."""

from __future__ import annotations

import pytest

import juice
from juice.engine import Stream, generate, greedy_generate
from juice.engine.sampling import Sampling
from juice.stage1 import HeadsArtifact
from juice.stage1.shipped import NoShippedHeadsError
from juice.steerer import Steerer
from juice.completion_text import cut_at_stop

PROMPTS = ["the capital of france is", "the name of the capital city of japan is"]
SEL = juice.HeadSelection((juice.Head(1, 2),), (juice.Head(0, 1),))


def test_generate_equals_the_engine_cut_at_eos(tiny_llama):
    s = Steerer(tiny_llama, SEL, method="juice", beta_plus=2, beta_minus=-1)
    texts = s.generate(PROMPTS, 6)
    tokens = greedy_generate(tiny_llama, PROMPTS, 6, juice.JuICE(tiny_llama, SEL, 2, -1)).tokens.tolist()
    eos = tiny_llama.tokenizer.eos_token_id
    for text, row in zip(texts, tokens):
        row = row[: row.index(eos)] if eos in row else row
        assert text == tiny_llama.tokenizer.decode(row, skip_special_tokens=True)
    assert Steerer(tiny_llama, method="original").generate(PROMPTS[0], 6) == Steerer(
        tiny_llama, SEL, method="juice", beta_plus=0, beta_minus=0).generate(PROMPTS[0], 6)


def test_sampling_options_and_seeds(tiny_llama):
    s = Steerer(tiny_llama, SEL, method="june", beta_plus=1, beta_minus=0)
    a = s.generate(PROMPTS, 8, temperature=1.3, top_p=0.9, seed=5)
    assert a == s.generate(PROMPTS, 8, temperature=1.3, top_p=0.9, seed=5)
    engine = generate(tiny_llama, PROMPTS, [Stream(i, s.steering, Sampling(1.3, 0, 0.9, 5 + i)) for i in range(2)], 8)
    assert [s._finish(r, ()) for r in engine.tokens.tolist()] == a
    assert s.generate(PROMPTS, 8, do_sample=True, top_k=1) == s.generate(PROMPTS, 8)   # top_k 1 = greedy


def test_stop_strings_cut_where_they_should():
    assert cut_at_stop("Paris.\n\nThe next", ["\n\n"]) == "Paris."
    assert cut_at_stop("a b c", ["c", "b"]) == "a "
    assert cut_at_stop("no stop here", ["zz", ""]) == "no stop here"


def test_stream_pieces_join_to_the_generated_text(tiny_llama):
    s = Steerer(tiny_llama, SEL, method="juice", beta_plus=2, beta_minus=-1)
    for prompt in PROMPTS:
        pieces = list(s.stream(prompt, 8))
        assert "".join(pieces) == s.generate(prompt, 8)[0]
        text = s.generate(prompt, 8)[0]
        if len(text.split()) > 2:
            word = text.split()[1]
            assert "".join(s.stream(prompt, 8, stop=[word])) == s.generate(prompt, 8, stop=[word])[0] == cut_at_stop(text, [word])


def test_chat_uses_the_template_without_a_second_bos(tiny_llama):
    tok = tiny_llama.tokenizer
    s = Steerer(tiny_llama, method="original")
    with pytest.raises(ValueError, match="no chat template"):
        s.chat([{"role": "user", "content": "the capital of france"}])
    tok.chat_template = "{{ bos_token }}{% for m in messages %}{{ m['content'] }} {% endfor %}is"
    try:
        prompt = s.chat_prompt([{"role": "user", "content": "the capital of france"}])
        assert prompt == "the capital of france is"
        assert s.chat([{"role": "user", "content": "the capital of france"}], 5) == s.generate(prompt, 5)[0]
    finally:
        tok.chat_template = None


def test_bad_construction(tiny_llama):
    with pytest.raises(ValueError, match="unknown method .both.; choose from original, june, juice, auto"):
        Steerer(tiny_llama, SEL, method="both")
    with pytest.raises(NoShippedHeadsError, match=r"no parametric heads file ships for .*`juice reproduce --model"):
        Steerer(tiny_llama, None, method="juice")   # no heads, and none ship for this model: how to make them
    with pytest.raises(NoShippedHeadsError, match="--direction contextual"):
        Steerer(tiny_llama, method="june", direction="context")
    artifact = HeadsArtifact(tiny_llama.fingerprint(), "parametric", 1, [1.0], [-1.0], SEL)
    with pytest.raises(ValueError, match="the heads are parametric and direction='contextual'"):
        Steerer(tiny_llama, artifact, method="juice", direction="contextual", beta_plus=1, beta_minus=0)
    assert Steerer(tiny_llama, artifact, method="juice", direction="memory", beta_plus=1, beta_minus=0).heads == SEL


def test_a_stream_closed_early_leaves_no_decoding_running(tiny_llama):
    s = Steerer(tiny_llama, SEL, method="juice", beta_plus=2, beta_minus=-1)
    before = s.generate(PROMPTS, 12)
    for _ in range(3):
        it = s.stream(PROMPTS[1], 200)
        next(it)
        it.close()   # the reader stops after one piece: the worker must be gone before we go on
        assert s.generate(PROMPTS, 12) == before


def test_repetition_penalty_reaches_the_engine(tiny_llama):
    from juice.engine import Stream, generate

    s = Steerer(tiny_llama, SEL, method="june", beta_plus=2, beta_minus=-1)
    texts = s.generate(PROMPTS, 6, repetition_penalty=1.5)
    streams = [Stream(i, juice.JuNE(tiny_llama, SEL, 2, -1), repetition_penalty=1.5) for i in range(len(PROMPTS))]
    tokens = generate(tiny_llama, PROMPTS, streams, 6).tokens.tolist()
    eos = tiny_llama.tokenizer.eos_token_id
    for text, row in zip(texts, tokens):
        row = row[: row.index(eos)] if eos in row else row
        assert text == tiny_llama.tokenizer.decode(row, skip_special_tokens=True)
    assert "".join(s.stream(PROMPTS[1], 6, repetition_penalty=1.5)) == texts[1]


def test_steering_without_betas_on_an_untuned_file_warns_and_names_juice_tune(tiny_llama):
    """Issue 38: JuICE/JuNE without betas on a heads file that holds no tuned ones runs the
    defaults (2, 0) with one warning naming `juice tune`; tuned or given betas warn nothing."""
    import warnings

    from juice.stage1 import HeadsArtifact
    from juice.steering import UntunedBetasWarning

    untuned = HeadsArtifact(tiny_llama.fingerprint(), "parametric", 1, [1.0], [-1.0], SEL)
    for method in ("juice", "june"):
        with pytest.warns(UntunedBetasWarning, match="run `juice tune`") as caught:
            s = Steerer(tiny_llama, untuned, method=method)
        assert (s.beta_plus, s.beta_minus) == (2.0, 0.0) and len(caught) == 1
        assert "\n" not in str(caught[0].message)
    tuned = HeadsArtifact(tiny_llama.fingerprint(), "parametric", 1, [1.0], [-1.0], SEL,
                          tuned={"juice": {"beta_plus": 3.0, "beta_minus": -1.0}})
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert Steerer(tiny_llama, tuned).beta_plus == 3.0
        Steerer(tiny_llama, SEL, beta_plus=2, beta_minus=0)
        Steerer(tiny_llama, method="original")
    with pytest.warns(UntunedBetasWarning):   # tuned for JuICE only: JuNE is not
        Steerer(tiny_llama, tuned, method="june")
