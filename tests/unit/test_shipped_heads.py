"""The heads files shipped for the embedded models (:mod:`juice.stage1.shipped`): each one a valid
heads file with tuned betas and its provenance, one per embedded model and direction; and the maker
(:mod:`juice.experiments.shipped_heads`) turning a `juice reproduce` folder into one. That they fit
the models' weights is tests/slow/test_shipped_heads_on_models.py (it loads the models)."""

from __future__ import annotations

import json

import pytest

from juice.data.records import Direction
from juice.experiments.shipped_heads import shipped_heads_json
from juice.methods import STEERINGS
from juice.models import EMBEDDED_MODELS
from juice.stage1.heads_file import heads_from_json
from juice.stage1.shipped import SHIPPED_DIR, shipped_path

SHIPPED = sorted(SHIPPED_DIR.glob("*.json"))


def test_one_file_ships_per_embedded_model_and_direction():
    assert {p.name for p in SHIPPED} == {shipped_path(m, d).name for m in EMBEDDED_MODELS for d in Direction}


@pytest.mark.parametrize("path", SHIPPED, ids=lambda p: p.name)
def test_a_shipped_file_is_a_tuned_heads_file_with_its_provenance(path):
    data = json.loads(path.read_text(encoding="utf-8"))
    artifact = heads_from_json(data, path)
    model, direction = path.name.removesuffix(".json").rsplit(".", 1)
    assert artifact.model["name"] == model and artifact.direction == direction
    assert artifact.k == 5 and max(len(artifact.selection.positive), len(artifact.selection.negative)) == 5
    assert min(len(artifact.selection.positive), len(artifact.selection.negative)) >= 1   # fewer passed the filter
    for method in STEERINGS:
        assert artifact.tuned.betas(method) is not None, method
        assert artifact.tuned.beta_range(method) == ((0.0, 5.0), (-3.0, 0.0)), method   # the paper's grid
    prov = data["provenance"]
    flag = "" if direction == "parametric" else " --direction contextual"
    assert prov["command"] == f"juice reproduce --model {model}{flag}"
    assert prov["commit"] not in ("", "unknown") and not prov["commit"].endswith("+changes")
    assert len(prov["head_set"]["ids"]) == len(data["head_set"]) == 4
    assert len(prov["tuned_on"]["validation_ids"]) == prov["tuned_on"]["validation_items"] > 0


def _run(tmp_path, model="gemma-3-270m"):
    heads = {"format": "juice-heads/1", "model": {"name": model}, "direction": "parametric", "k": 1,
             "alphas_positive": [1.0], "alphas_negative": [-1.0], "positive_heads": ["L1H0"],
             "negative_heads": ["L0H1"], "head_set": [{"domain": "world_capital"}], "scores": {}, "data": {}}
    betas = {m: {"beta_plus": 3.0, "beta_minus": -1.0, "accuracy": 75.0, "p_answer": 0.3, "degeneration": 0.0,
                 "per_type": [75.0]} for m in STEERINGS}
    results = {"config": {"model": model, "seed": 0},
               "protocol": {"heads_from": "world_capital D", "scoring_label": "exact Stage 1 (paper Alg. 2)",
                            "beta_grid": {"beta_plus": [0.0, 1.0, 3.0], "beta_minus": [0.0, -1.0]}},
               "choices": {"world_capital": {"betas": betas, "n_validation": 2},
                           "book_author": {"betas": {m: {**betas[m], "beta_plus": 1.0} for m in STEERINGS},
                                           "n_validation": 2}},
               "splits": {"world_capital": {"head_set_ids": ["facts#1"], "validation_ids": ["facts#2", "facts#3"]}}}
    (tmp_path / "heads.json").write_text(json.dumps(heads))
    (tmp_path / "results.json").write_text(json.dumps(results))
    return tmp_path


def test_the_maker_takes_the_heads_and_the_betas_tuned_on_ds_own_domain(tmp_path):
    made = shipped_heads_json(_run(tmp_path), "gemma-3-270m", "parametric", "abc1234")
    artifact = heads_from_json(made, "made")
    assert [str(h) for h in artifact.selection.positive] == ["L1H0"]
    for method in STEERINGS:   # World Capital's (D's domain), not Book Author's
        assert (artifact.tuned.betas(method).beta_plus, artifact.tuned.betas(method).beta_minus) == (3.0, -1.0)
        assert "p_answer" not in made["tuned"][method] and made["tuned"][method]["degeneration"] == 0.0
        assert artifact.tuned.beta_range(method) == ((0.0, 3.0), (-1.0, 0.0))   # the run's grid, for the warning
    assert made["provenance"]["command"] == "juice reproduce --model gemma-3-270m"
    assert made["provenance"]["commit"] == "abc1234"
    assert made["provenance"]["head_set"]["ids"] == ["facts#1"]
    assert made["provenance"]["tuned_on"]["validation_ids"] == ["facts#2", "facts#3"]


def test_the_maker_refuses_a_run_of_another_model_or_without_betas(tmp_path):
    with pytest.raises(ValueError, match="is a run of 'smollm2-135m', not 'gemma-3-270m'"):
        shipped_heads_json(_run(tmp_path, "smollm2-135m"), "gemma-3-270m", "parametric", "abc1234")
    results = json.loads((tmp_path / "results.json").read_text())
    del results["choices"]["world_capital"]
    (tmp_path / "results.json").write_text(json.dumps({**results, "config": {"model": "gemma-3-270m", "seed": 0}}))
    with pytest.raises(ValueError, match="no tuned betas for world_capital"):
        shipped_heads_json(tmp_path, "gemma-3-270m", "parametric", "abc1234")
