"""The GPU check's parts, on the CPU (benchmarks/gpu_check.py, benchmarks/bench_gpu.py): what runs on
the GPU machine in one call must work before it gets there."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest
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


def test_pytest_verdicts_are_read_per_test_line_with_or_without_xdist_and_when_cut_short():
    plain = ("tests/integration/test_a.py::test_x[llama] PASSED   [ 10%]\n"
             "tests/integration/test_a.py::test_x[gemma2] FAILED   [ 20%]\n"
             "tests/integration/test_a.py::test_y SKIPPED (no data)   [ 30%]\n"
             "FAILED tests/integration/test_a.py::test_x[gemma2] - AssertionError: tokens differ\n")
    counts, failed = gpu_check.parse_pytest(plain, ["gemma2", "llama"])
    assert counts == {"llama": {"passed": 1, "failed": 0, "skipped": 0},
                      "gemma2": {"passed": 0, "failed": 1, "skipped": 0},
                      "-": {"passed": 0, "failed": 0, "skipped": 1}}
    assert failed == [{"test": "tests/integration/test_a.py::test_x[gemma2]",
                       "message": "AssertionError: tokens differ"}]
    xdist = ("[gw0] [ 50%] PASSED tests/integration/test_a.py::test_x[llama] \n"
             "[gw1] [100%] ERROR tests/integration/test_b.py::test_z[gemma2] \n")   # cut short: no summary
    counts, failed = gpu_check.parse_pytest(xdist, ["gemma2", "llama"])
    assert counts["llama"]["passed"] == 1 and counts["gemma2"]["failed"] == 1
    assert failed == [{"test": "tests/integration/test_b.py::test_z[gemma2]", "message": ""}]


def test_a_section_gets_its_share_of_what_is_left():
    budget = gpu_check.Budget(100.0)
    assert abs(budget.section("checks", ["checks", "tests", "bench"]) - 30.0) < 0.5
    assert abs(budget.section("bench", ["bench"]) - 100.0) < 0.5   # time the others left goes to the last
    assert gpu_check.Budget(-5.0).section("tests", ["tests"]) == 0.0


def test_the_requirements_resolve_here_and_a_missing_one_is_named(monkeypatch):
    import importlib.metadata as md

    found = gpu_check.requirements()
    assert found["unmet"] == [] and {"transformers", "fastapi", "openai", "pytest"} <= set(found["resolved"])
    real = md.distribution

    def without_starlette(name):
        if name.lower() == "starlette":
            raise md.PackageNotFoundError(name)
        return real(name)

    monkeypatch.setattr(md, "distribution", without_starlette)
    unmet = gpu_check.requirements()["unmet"]
    assert len(unmet) == 1 and unmet[0].startswith("starlette") and "needed by fastapi" in unmet[0]


def test_one_check_passes_on_an_exact_backend_and_logs_the_guard(monkeypatch):
    """fp32 on the CPU: the four invariants hold exactly; the guard verifies."""
    monkeypatch.setenv("JUICE_BATCH_CHECK", "auto")
    row = gpu_check.check_one("llama", "cpu", "fp32", "sdpa", new=4)
    assert row["passed"] and row["guard"] == "verified" and all(row["invariants"].values())
    assert row["batched_vs_alone_token_mismatches"] == [] and row["cached_vs_uncached_token_mismatches"] == []
    assert row["batched_vs_alone_max_prob_diff"] <= 1e-5 and row["hook_vs_weight_edit_max_prob_diff"] <= 1e-5
    assert row["zero_alphas_logits_equal"] and row["zero_betas_token_mismatches"] == []


def test_a_check_fails_when_the_uncached_reference_disagrees(monkeypatch):
    import juice.reference

    real = juice.reference.greedy_generate_naive
    monkeypatch.setattr(juice.reference, "greedy_generate_naive", lambda *a, **k: real(*a, **k) + 1)
    row = gpu_check.check_one("gpt2", "cpu", "fp32", "eager", new=3)
    assert not row["passed"] and not row["invariants"]["cached_equals_uncached"]
    assert row["cached_vs_uncached_token_mismatches"] == list(range(6))


def test_the_weight_edit_check_sees_a_hook_that_scales_by_the_wrong_factor(monkeypatch):
    from conftest import build_tiny

    lm = build_tiny("qwen2", device="cpu")
    assert gpu_check.hook_vs_weight_edit(lm, 1, 2, 2.5) <= 1e-5
    import juice.interventions

    real = juice.interventions.scaled_heads
    monkeypatch.setattr(juice.interventions, "scaled_heads", lambda heads, alphas: real(heads, alphas * 0.5))
    assert gpu_check.hook_vs_weight_edit(lm, 1, 2, 2.5) > 1e-3


def test_the_summary_counts_what_the_record_holds():
    record = {"started": "t", "budget_s": 480, "env": {"device": "cuda", "gpu": "H200", "juice_dirty": True},
              "requirements": {"unmet": ["openai>=1.30 (needed by juice[vllm]): not installed"],
                               "resolved": {"torch": "2.11.0"}, "carried": []},
              "sections": {"checks": {"status": "done", "seconds": 12.0, "share_s": 144}},
              "tests": [{"attention": "sdpa", "seconds": 1.0, "returncode": 1,
                         "per_architecture": {"llama": {"passed": 3, "failed": 1, "skipped": 0}},
                         "failed": [{"test": "tests.test_decoding::test_a[llama]", "message": "x"}]}],
              "checks": {"planned": 50, "skipped_for_time": 49,
                         "rows": [{"architecture": "llama", "attention": "sdpa", "dtype": "bf16", "passed": False,
                                   "invariants": {"batched_equals_alone": False, "hook_equals_weight_edit": True},
                                   "guard": "fell back to eager"}]},
              "bench": [{"config": "gemma-2b", "dtype": "bfloat16", "new_tokens": 32, "parameters": 2_506_172_416,
                         "decoding": [{"batch": 32, "path": "static", "plain_over_hf": 0.9, "juice_over_plain": 1.2}],
                         "stage1": {"exact_over_naive_speed": 12.5, "interventions": 192, "max_prob_diff": 1e-3},
                         "skipped_for_time": ["decoding at batch 1"]}]}
    text = gpu_check.summary(record)
    assert "(dirty tree)" in text and "missing: openai>=1.30" in text and "- checks: done (12.0 s of 144 s)" in text
    assert "3 passed, 1 failed, 0 skipped" in text and "test_a[llama]" in text
    assert "0 of 1 checks passed (49 of 50 skipped for time)" in text
    assert "| bf16 | sdpa | 0 | 1 (llama (batched_equals_alone)) | llama |" in text
    assert "gemma-2b (2.51 B parameters, bfloat16" in text
    assert "JuICE/plain 1.20x (target <= 1.1)" in text and "12.5x one intervention per forward" in text
    assert "skipped for time: decoding at batch 1" in text


def test_a_run_cut_short_still_writes_a_complete_record(tmp_path):
    """A budget of 0 s: every section starts with no time, skips its work and says so; the JSON and
    the Markdown are both there and parse."""
    import json

    status = gpu_check.main([str(tmp_path), "--dry-run", "--budget-s", "0", "--skip", "tests"])
    record = json.loads((tmp_path / "gpu-check.json").read_text())
    assert status == 0 and record["requirements"]["unmet"] == []
    assert record["checks"]["rows"] == [] and record["checks"]["skipped_for_time"] == record["checks"]["planned"] > 0
    assert all(b["skipped_for_time"] == ["all"] for b in record["bench"])
    assert set(record["sections"]) == {"checks", "bench"} and "Invariants: 0 of 0" in (
        tmp_path / "gpu-check.md").read_text()


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


def test_the_main_jobs_record_says_where_it_comes_from():
    """Issue 75: the engines' comparison records the command as run, the commit read at the start
    and whether the tree was dirty, the versions, vLLM's device and whether it compared earlier runs."""
    import bench_main_job

    source = bench_main_job.provenance(Path("old-runs"), argv=["--engine", "vllm", "--from-runs", "old-runs"])
    assert source["command"] == "python benchmarks/bench_main_job.py --engine vllm --from-runs old-runs"
    assert len(source["commit"]) == 40 and isinstance(source["dirty"], bool) and source["from_runs"] == "old-runs"
    assert source["torch"] == torch.__version__ and {"juice", "vllm", "vllm_torch", "vllm_device"} <= set(source)
    assert bench_main_job.provenance(argv=[])["from_runs"] is None


def test_the_when_to_steer_record_holds_the_heads_and_its_provenance(tmp_path):
    """Issue 77: the record read `positive`/`negative` where heads files say `positive_heads`, so
    it held `"heads": {}`; it now reads the file as juice does, and says the commit and whether
    the tree was dirty."""
    import when_to_steer_study

    from juice.interventions import Head, HeadSelection
    from juice.stage1 import HeadsArtifact, save_heads

    selection = HeadSelection((Head(2, 1), Head(0, 3)), (Head(1, 0),))
    save_heads(HeadsArtifact({}, "contextual", 2, [1.0], [-1.0], selection), tmp_path / "heads_contextual.json")
    rec = when_to_steer_study.record(tmp_path, "default", {"commit": "c" * 40, "dirty": True})
    assert rec["heads"] == {"positive": ["L2H1", "L0H3"], "negative": ["L1H0"]}
    assert (rec["commit"], rec["dirty"]) == ("c" * 40, True) and rec["datasets"] == {}


def test_the_gate_classifier_resumes_from_its_cached_chunks(tiny_llama, tmp_path, monkeypatch):
    """A chunk's signals are written once and read back equal (a stopped run resumes); other
    prompts are computed, not read."""
    import gate_classifier
    from juice.when_to_steer.signals import first_step_features

    prompts = ["the capital of france is paris . the capital of france is", "tennis golf w40 is"]
    questions = ["the capital of france is", "w40 is"]
    first = gate_classifier.chunk_features(tiny_llama, prompts, questions, tmp_path)
    direct = first_step_features(tiny_llama, prompts, questions)
    assert first == {n: direct[n].tolist() for n in first} and len(list(tmp_path.glob("*.json"))) == 1

    def refuse(*args, **kwargs):
        raise AssertionError("computed again")

    monkeypatch.setattr(gate_classifier, "first_step_features", refuse)
    assert gate_classifier.chunk_features(tiny_llama, prompts, questions, tmp_path) == first
    with pytest.raises(AssertionError, match="computed again"):
        gate_classifier.chunk_features(tiny_llama, prompts[:1], questions[:1], tmp_path)
