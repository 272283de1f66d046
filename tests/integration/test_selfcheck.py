"""The load-time self-check refuses a tokenizer or weights that loaded wrong, with one line that
names the check and the package versions; a sound embedded model passes."""

from __future__ import annotations

import pytest
import torch

from juice.models import load_model
from juice.selfcheck import SENTENCE, ModelLoadError, check_loaded_model, check_tokenizer


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


@pytest.mark.slow
def test_the_embedded_model_passes_and_simulated_breakage_is_refused():
    lm = load_model("gemma-3-270m")   # runs the self-check
    check_loaded_model(lm, "gemma-3-270m")

    real = lm.tokenizer.__class__.__call__

    class NoBos(type(lm.tokenizer)):   # what transformers 5.20 did to this GGUF: the same ids, no BOS
        def __call__(self, *args, **kwargs):
            out = real(self, *args, **kwargs)
            out["input_ids"] = out["input_ids"][1:]
            return out

    lm.tokenizer.__class__ = NoBos
    try:
        with pytest.raises(ModelLoadError, match="needs BOS"):
            check_loaded_model(lm, "gemma-3-270m")
    finally:
        lm.tokenizer.__class__ = NoBos.__mro__[1]
    check_loaded_model(lm, "gemma-3-270m")

    # weights that converted wrong: the canary's known answer loses its probability
    embed = lm.model.get_input_embeddings().weight
    saved = embed.detach().clone()
    with torch.no_grad():
        embed.mul_(0.0)
    try:
        with pytest.raises(ModelLoadError, match="canary"):
            check_loaded_model(lm, "gemma-3-270m")
    finally:
        with torch.no_grad():
            embed.copy_(saved)
