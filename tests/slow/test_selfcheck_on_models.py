"""The load-time self-check on the embedded Gemma itself (the slow tier: it loads the model; the
checks on tiny models are tests/integration/test_selfcheck.py)."""

from __future__ import annotations

import pytest
import torch

from juice.models import load_model
from juice.selfcheck import ModelLoadError, check_loaded_model


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
