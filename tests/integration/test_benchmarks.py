"""The GPU check's parts, on the CPU (benchmarks/gpu_check.py, benchmarks/bench_gpu.py): what runs on
the GPU machine in one call must work before it gets there."""

from __future__ import annotations

import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "benchmarks"))

import bench_gpu  # noqa: E402
import gpu_check  # noqa: E402




def test_a_built_in_config_builds_and_its_tokenizer_covers_the_benchmarks_prompts():
    fields = dict(bench_gpu.CONFIGS["gemma-3-270m"], num_hidden_layers=2, hidden_size=64, intermediate_size=64,
                  layer_types=["sliding_attention", "full_attention"], vocab_size=4096, head_dim=16)
    saved = bench_gpu.CONFIGS["gemma-3-270m"]
    bench_gpu.CONFIGS["gemma-3-270m"] = fields
    try:
        lm = bench_gpu.config_model("gemma-3-270m", "cpu", torch.float32)
    finally:
        bench_gpu.CONFIGS["gemma-3-270m"] = saved
    ids = lm.tokenizer("The capital of France is").input_ids
    assert ids[0] == 1 and lm.tokenizer.unk_token_id not in ids
    assert lm.heads.geometry.n_layers == 2 and max(lm.tokenizer.get_vocab().values()) < 4096


def test_the_architecture_of_a_test_id():
    known = ["gemma", "gemma2", "llama"]
    assert gpu_check._architecture("test_x[gemma2]", known) == "gemma2"
    assert gpu_check._architecture("test_y[3-gemma]", known) == "gemma"
    assert gpu_check._architecture("test_z", known) == "-"


def test_one_check_passes_on_an_exact_backend_and_logs_the_guard(monkeypatch):
    """fp32 on the CPU: batched = alone and cached = uncached exactly; the guard verifies."""
    monkeypatch.setenv("JUICE_BATCH_CHECK", "auto")
    row = gpu_check.check_one("llama", "cpu", "fp32", "sdpa", new=4)
    assert row["passed"] and row["guard"] == "verified"
    assert row["batched_vs_alone_token_mismatches"] == [] and row["cached_vs_uncached_token_mismatches"] == []
    assert row["batched_vs_alone_max_prob_diff"] <= 1e-5


def test_the_summary_counts_what_the_record_holds():
    record = {"started": "t", "env": {"device": "cuda", "gpu": "H100"},
              "tests": [{"attention": "sdpa", "seconds": 1.0, "returncode": 1,
                         "per_architecture": {"llama": {"passed": 3, "failed": 1, "skipped": 0}},
                         "failed": [{"test": "tests.test_decoding::test_a[llama]", "message": "x"}]}],
              "checks": [{"architecture": "llama", "attention": "sdpa", "dtype": "bf16", "passed": False,
                          "guard": "fell back to eager"}],
              "bench": [{"config": "gemma-2b", "dtype": "bfloat16", "new_tokens": 32,
                         "decoding": [{"batch": 16, "path": "static", "plain_over_hf": 0.9, "juice_over_plain": 1.2}]}]}
    text = gpu_check.summary(record)
    assert "3 passed, 1 failed, 0 skipped" in text and "test_a[llama]" in text
    assert "| bf16 | sdpa | 0 | 1 (llama) | llama |" in text
    assert "JuICE/plain 1.20x (target <= 1.1)" in text


def test_the_when_to_steer_study_reads_table2s_heads_and_nqswap_betas(tmp_path):
    """benchmarks/when_to_steer_study.py: the heads of a contextual reproduction with NQ-Swap's
    tuned betas in `tuned`, what `juice.Steerer` and the study read."""
    import json

    import when_to_steer_study

    (tmp_path / "heads_contextual.json").write_text(json.dumps({"direction": "contextual", "tuned": {}}))
    (tmp_path / "results_contextual.json").write_text(json.dumps({"choices": {"nqswap": {"betas": {
        "juice": {"beta_plus": 1.0, "beta_minus": -1.0, "accuracy": 100.0},
        "june": {"beta_plus": 2.0, "beta_minus": 0.0, "accuracy": 90.0}}}}}))
    out = when_to_steer_study.heads_with_table2_betas(tmp_path, tmp_path / "out" / "heads.json")
    tuned = json.loads(out.read_text())["tuned"]
    assert tuned["juice"] == {"beta_plus": 1.0, "beta_minus": -1.0} and tuned["june"] == {"beta_plus": 2.0,
                                                                                          "beta_minus": 0.0}
