"""From tokens to text, shared by `juice.Steerer` and `juice serve` (:mod:`juice.completion_text`):
streamed pieces join to the final text, cut at EOS and at the first stop string; the chat
prompt holds one BOS."""

from __future__ import annotations

import pytest
from hypothesis import given, settings, strategies as st

from conftest import WORDS, make_tokenizer
from juice.completion_text import TextStream, chat_prompt, final_text
from juice.tokens import token_ids

TOKENIZER = make_tokenizer()
WORD_IDS = [TOKENIZER.convert_tokens_to_ids(w) for w in WORDS[:20]]


@settings(max_examples=200, deadline=None)
@given(tokens=st.lists(st.sampled_from(WORD_IDS + [TOKENIZER.eos_token_id]), max_size=12),
       stop=st.lists(st.sampled_from(["capital", "is a", "e", " of", "xyz", ""]), max_size=3))
def test_streamed_pieces_join_to_the_final_text(tokens, stop):
    stream = TextStream(TOKENIZER, stop)
    pieces = [stream.add(t) for t in tokens]
    final = final_text(TOKENIZER, tokens, stop)
    assert "".join(pieces) + stream.rest(final) == final
    assert "".join(pieces) + stream.rest() == final
    for s in stop:
        assert not s or s not in final


def test_the_final_text_ends_at_eos_and_at_the_first_stop_string():
    ids = TOKENIZER("the capital of france", add_special_tokens=False)["input_ids"]
    assert final_text(TOKENIZER, ids + [TOKENIZER.eos_token_id] + ids) == "the capital of france"
    assert final_text(TOKENIZER, ids, [" of", "capital"]) == "the "


def test_the_chat_prompt_holds_one_bos_and_names_a_missing_template():
    tok = make_tokenizer()
    tok.chat_template = "{{ bos_token }}{% for m in messages %}{{ m['content'] }} {% endfor %}is"
    prompt = chat_prompt(tok, [{"role": "user", "content": "the capital of france"}])
    assert prompt == "the capital of france is"
    assert token_ids(tok, prompt).count(tok.bos_token_id) == 1
    tok.chat_template = None
    with pytest.raises(ValueError, match="tiny's tokenizer has no chat template"):
        chat_prompt(tok, [{"role": "user", "content": "x"}], "tiny")
