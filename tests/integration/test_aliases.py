"""The preferred-alias rule (PROTOCOL.md, "Answer alias") on constructed outputs."""

from __future__ import annotations

import pytest

from juice.aliases import prefer_aliases, preferred_alias, with_answer_first
from juice.data.records import ConflictExample

ANSWERS = ("United States of America", "USA", "America")


def test_one_accepted_answer_is_that_one_whatever_the_output():
    assert preferred_alias("completely unrelated words", ("Paris",)) == "Paris"


def test_exactly_one_alias_in_the_first_five_words_wins():
    assert preferred_alias(" USA, of course, and more", ANSWERS) == "USA"


def test_several_aliases_in_the_output_give_the_longest():
    out = " United States of America"  # "America" occurs too, inside the longer alias
    assert preferred_alias(out, ANSWERS) == "United States of America"


def test_an_alias_after_the_fifth_word_does_not_count_and_probabilities_decide():
    out = " one two three four five USA"
    assert preferred_alias(out, ANSWERS, first_token_probs=[0.1, 0.2, 0.7]) == "America"
    assert preferred_alias(out, ANSWERS, first_token_probs=[0.5, 0.2, 0.3]) == "United States of America"


def test_no_alias_and_no_probabilities_is_a_clear_error():
    with pytest.raises(ValueError, match="first-token probabilities"):
        preferred_alias(" nothing here", ANSWERS)
    with pytest.raises(ValueError, match="no accepted answers"):
        preferred_alias(" x", ())


def _example(answers):
    prompts = {"clean": "the capital of france is", "substitution": "the capital of france is rome . the capital "
               "of france is", "coherent": "rome is known . the capital of france is"}
    return ConflictExample("world_capital", "france", answers, "rome", prompts)


def test_with_answer_first_moves_the_alias_and_keeps_the_rest():
    ex = with_answer_first(_example(("paris", "lutece", "city of light")), "city of light")
    assert ex.answers == ("city of light", "paris", "lutece") and ex.answer == "city of light"
    with pytest.raises(ValueError, match="not an accepted answer"):
        with_answer_first(ex, "rome")


def test_prefer_aliases_uses_the_models_first_token_probabilities_when_no_alias_is_output(tiny_llama):
    from juice.engine import Stream, generate
    from juice.tokens import answer_first_token

    ex = _example(("paris", "berlin", "tokyo"))
    prompt = ex.prompts["clean"]
    tokens = [answer_first_token(tiny_llama.tokenizer, prompt, a) for a in ex.answers]
    probs = generate(tiny_llama, [prompt], [Stream(0)], 1, probe_tokens=__import__("torch").tensor([tokens])).first_probs[0]
    expected = ex.answers[int(probs.argmax())]
    out = prefer_aliases(tiny_llama, [ex, ex], [" nothing at all", " berlin is it"])
    assert out[0].answer == expected
    assert out[1].answer == "berlin"
