"""The load-time self-check refuses a tokenizer or weights that loaded wrong, with one line that
names the check and the package versions; a sound embedded model passes."""

from __future__ import annotations

import pytest

from juice.selfcheck import SENTENCE, ModelLoadError, check_tokenizer


class FakeTokenizer:
    """Word-level stand-in: `ids` is what encoding SENTENCE gives, `text` what decoding gives back."""

    def __init__(self, ids, text=SENTENCE, bos=2, unk=3):
        self.ids, self.text, self.bos_token_id, self.unk_token_id = ids, text, bos, unk

    def __call__(self, text, add_special_tokens=True):
        return {"input_ids": list(self.ids)}

    def decode(self, ids, skip_special_tokens=True):
        return self.text


@pytest.mark.parametrize("tokenizer, model_type, message", [
    (FakeTokenizer([]), "llama", "no token"),
    (FakeTokenizer([2, 10, 11], text="The capital"), "llama", "does not round-trip"),
    (FakeTokenizer([2, 10, 500]), "llama", "outside the model's vocabulary of 100"),
    (FakeTokenizer([2, 10, 3, 11]), "llama", "unknown token"),
    (FakeTokenizer([10, 11, 12]), "gemma3_text", "needs BOS"),   # the transformers 5.17-5.20 GGUF conversion
])
def test_broken_tokenizers_are_refused_in_one_line(tokenizer, model_type, message):
    with pytest.raises(ModelLoadError, match=message) as err:
        check_tokenizer(tokenizer, model_type, 100, name="m")
    text = str(err.value)
    assert "\n" not in text and "transformers" in text and "self_check=False" in text


def test_a_sound_tokenizer_passes_and_bos_is_only_required_where_needed():
    assert check_tokenizer(FakeTokenizer([2, 10, 11]), "gemma3_text", 100) == [2, 10, 11]
    assert check_tokenizer(FakeTokenizer([10, 11]), "llama", 100) == [10, 11]   # SmolLM2 adds no BOS


