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
    assert set(results["table"]) == {"Original", "JuNE", "JuICE"}
    assert len(results["items"]) == 3 * 3 * 3
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
