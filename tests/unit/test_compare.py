"""juice.pipeline.compare: two results.json documents, value by value."""

from __future__ import annotations

import copy
import json

from juice.pipeline.compare import compare_files, compare_results

RUN = {
    "config": {"out_dir": "/a", "limit": "default"},
    "timings_s": {"tuning": 480.0},
    "heads": {"positive": ["L6H3"], "negative": ["L3H3"]},
    "choices": {"world_capital": {"betas": {"juice": {"beta_plus": 2.0, "beta_minus": -1.0, "accuracy": 75.0,
                                                      "p_answer": 0.25}}}},
    "table": {"cells": {"JuICE": {"world_capital": {"clean": {"mean": 0.5, "low": 0.2, "high": 0.8, "n": 30}}}}},
    "items": [{"domain": "world_capital", "item": "facts#1", "method": "JuICE", "output": " Paris, the capital of France",
               "correct": True, "p_parametric": 0.5, "p_context": 0.1}],
}


def _changed(**edits):
    run = copy.deepcopy(RUN)
    for path, value in edits.items():
        *keys, last = path.split("__")
        node = run
        for k in keys:
            node = node[int(k)] if k.isdigit() else node[k]
        node[int(last) if last.isdigit() else last] = value
    return run


def test_a_run_equals_itself_and_wall_times_and_folders_are_not_compared():
    c = compare_results(RUN, _changed(timings_s__tuning=12.0, config__out_dir="/b"))
    assert c.same and c.compared > 5 and c.max_p_difference == 0 and c.shortened_outputs == 0


def test_a_changed_verdict_cell_or_choice_is_a_difference():
    for edit in [{"items__0__correct": False}, {"table__cells__JuICE__world_capital__clean__mean": 0.6},
                 {"choices__world_capital__betas__juice__beta_plus": 3.0}, {"heads__positive": ["L6H2"]},
                 {"config__limit": 10}]:
        c = compare_results(RUN, _changed(**edit))
        assert not c.same and len(c.differences) == 1, edit


def test_probabilities_are_compared_to_a_tolerance_and_outputs_may_end_earlier():
    c = compare_results(RUN, _changed(items__0__p_parametric=0.5 + 3e-7, items__0__output=" Paris, the capital"))
    assert c.same and c.shortened_outputs == 1 and 0 < c.max_p_difference < 1e-6
    assert not compare_results(RUN, _changed(items__0__p_parametric=0.51)).same
    assert not compare_results(RUN, _changed(items__0__output=" Rome")).same


def test_files(tmp_path):
    (tmp_path / "a.json").write_text(json.dumps(RUN))
    (tmp_path / "b.json").write_text(json.dumps(_changed(items__0__correct=False)))
    assert compare_files(tmp_path / "a.json", tmp_path / "a.json").same
    c = compare_files(tmp_path / "a.json", tmp_path / "b.json")
    assert c.differences == ["items/0/correct: True -> False"]
