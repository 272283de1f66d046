"""The Table 1 pipeline end to end on a tiny model, and its resume after an interruption."""

from __future__ import annotations

import json

import pytest

import juice.reproduce as rp
from juice.reproduce import ReproduceConfig, reproduce


def test_pipeline_runs_writes_outputs_and_resumes(shared_data, tiny_llama, tmp_path):
    cfg = ReproduceConfig(out_dir=tmp_path, data=shared_data / "paraconflict" / "world_capital", limit=3,
                          validation_size=2, scoring="exact", alphas_positive=(1.0,), alphas_negative=(-1.0,), k=2)
    first = reproduce(cfg, lm=tiny_llama)
    results = json.loads((tmp_path / "results.json").read_text())
    assert set(results["table"]) == {"Original", "Prompt", "PH3-l", "PH3-s", "JuNE", "JuICE"}
    assert len(results["items"]) == 3 * 3 * 6
    assert results["baselines"]["PH3-s"]["n_dev_items"] == 4
    assert results["baselines"]["PH3-l"]["k"] in (1, 3, 5, 7, 9, 15)
    assert (tmp_path / "table.md").read_text().count("|") > 20
    heads = json.loads((tmp_path / "heads.json").read_text())
    assert heads["model"]["model_type"] == "llama" and len(heads["head_set"]) == 4

    # An interrupted run: the last domain's evaluation is lost; nothing else is recomputed.
    (tmp_path / "state" / "eval_world_capital.json").unlink()

    def boom(*args, **kwargs):
        raise AssertionError("stage recomputed")

    mp = pytest.MonkeyPatch()
    mp.setattr(rp, "identify_heads", boom)
    mp.setattr(rp, "tune_betas", boom)
    mp.setattr(rp, "logit_difference_effects", boom)
    mp.setattr(rp, "tune_prune_k", boom)
    try:
        second = reproduce(cfg, lm=tiny_llama)
    finally:
        mp.undo()
    assert second.table == first.table and second.selection == first.selection


def test_tiny_prompt_too_long_and_empty_answer_errors(tiny_llama):
    from juice.steering import greedy_generate
    from juice.tokens import EmptyAnswerError, PromptTooLongError, answer_first_token

    with pytest.raises(PromptTooLongError, match="context holds"):
        greedy_generate(tiny_llama, ["w1 " * 300], 4)
    with pytest.raises(EmptyAnswerError):
        answer_first_token(tiny_llama.tokenizer, "the capital of france is", "   ")


def _write_contextual_data(root):
    import csv

    words = "paris berlin tokyo madrid rome golf tennis".split()
    (root / "memotrap").mkdir(parents=True)
    for name in ("1-proverb-ending.csv", "2-proverb-translation.csv", "3-hate-speech-ending.csv",
                 "4-history-of-science-qa.csv"):
        with open(root / "memotrap" / name, "w", encoding="utf-8", newline="") as f:
            w = csv.writer(f)
            w.writerow(["prompt", "classes", "answer_index"])
            for i in range(14):
                a, b = words[i % 7], words[(i + 3) % 7]
                if name.startswith("2"):
                    prompt = f"translate w{i} w{i + 1}\nto:\nthe capital of france is"
                elif name.startswith("4"):
                    prompt = f"what was w{i} .\nA. {a}\nB. {b}\nAnswer:"
                else:
                    prompt = f'write "{a}": the capital of w{i} is'
                w.writerow([prompt, str([f" {a}", f" {b}"]), i % 2])
    (root / "nqswap").mkdir()
    with open(root / "nqswap" / "nqswap.jsonl", "w", encoding="utf-8") as f:
        for i in range(14):
            a, b = words[i % 7], words[(i + 2) % 7]
            f.write(json.dumps({"question": f"what is w{i}", "org_context": f"<P> w{i} is {b} </P>",
                                "org_answer": [b], "sub_context": f"<P> w{i} is {a} </P>", "sub_answer": [a]}) + "\n")


def test_contextual_pipeline_runs_writes_table2_and_resumes(tiny_llama, tmp_path):
    import juice.reproduce_contextual as rc

    _write_contextual_data(tmp_path / "data")
    cfg = ReproduceConfig(out_dir=tmp_path / "out", data_root=tmp_path / "data", limit=2, validation_per_dataset=1,
                          ph3_dev_size=2, scoring="exact", alphas_positive=(1.0,), alphas_negative=(-1.0,), k=2)
    first = rc.reproduce_contextual(cfg, lm=tiny_llama)
    results = json.loads((tmp_path / "out" / "results_contextual.json").read_text())
    methods = {"Original", "Prompt", "CAD", "PH3-l", "PH3-s", "JuNE", "JuICE"}
    assert set(results["table"]) == methods
    assert len(results["items"]) == 5 * 2 * 7
    assert set(results["likelihood"]["CAD"]) == {"proverb_ending", "proverb_translation", "hate_speech_ending",
                                                 "history_of_science_qa"}
    table = (tmp_path / "out" / "table2.md").read_text()
    assert "NQ-Swap" in table and "Proverb Translation" in table and "likelihood" in table

    (tmp_path / "out" / "state" / "eval_contextual_nqswap.json").unlink()

    def boom(*args, **kwargs):
        raise AssertionError("stage recomputed")

    mp = pytest.MonkeyPatch()
    mp.setattr(rc, "tune_betas", boom)
    mp.setattr(rp, "identify_heads", boom)
    mp.setattr(rp, "logit_difference_effects", boom)
    try:
        second = rc.reproduce_contextual(cfg, lm=tiny_llama)
    finally:
        mp.undo()
    assert second.table == first.table


def test_contextual_pipeline_explains_missing_data(tiny_llama, tmp_path):
    import juice.reproduce_contextual as rc

    with pytest.raises(FileNotFoundError, match="--data-root"):
        rc.reproduce_contextual(ReproduceConfig(out_dir=tmp_path, data_root=tmp_path / "nowhere"), lm=tiny_llama)
