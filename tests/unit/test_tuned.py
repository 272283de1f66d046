"""A heads file's tuned settings: the same object on disk, typed reads, checked records, writers
that copy."""

from __future__ import annotations

import json

import pytest

from juice.stage1 import load_heads, save_heads
from juice.stage1.heads_file import HeadsArtifact
from juice.interventions import Head, HeadSelection
from juice.steering import DEFAULT_BETAS, chosen_betas
from juice.tuned import TunedBetas, TunedPh3, TunedSettings, TunedSettingsError

SAVED = {   # the "tuned" object juice tune wrote before this module existed
    "juice": {"beta_plus": 3.0, "beta_minus": -1.0, "accuracy": 61.5, "grid": [{"beta_plus": 0.0}]},
    "june": {"beta_plus": 1, "beta_minus": 0, "accuracy": 58.0},
    "ph3": {"k": 2, "pruned": ["L0H1", "L1H0"], "accuracy": 55.0},
    "auto": {"signal": "first_step_jsd_bits", "thresholds": [0.1], "picks": ["original", "juice"]},
    "data": {"file": "val.jsonl", "digest": "abc", "rows": 12},
}


def test_typed_reads_of_a_saved_object():
    t = TunedSettings(SAVED)
    assert t.betas("juice") == TunedBetas(3.0, -1.0) and t.betas("june") == TunedBetas(1.0, 0.0)
    assert t.betas("ph3") is None and t.betas("auto") is None
    assert t.ph3 == TunedPh3(2, ("L0H1", "L1H0"))
    assert t.auto == SAVED["auto"] and t.provenance == SAVED["data"]
    assert t.holds("auto") and not t.holds("data") and not t.holds("june-x")
    assert t.to_json() == SAVED and t == SAVED
    empty = TunedSettings()
    assert not empty and empty.ph3 is None and empty.auto is None and empty.provenance is None
    assert chosen_betas("juice", t) == (3.0, -1.0, None)
    bp, bm, warning = chosen_betas("juice", empty)
    assert (bp, bm) == DEFAULT_BETAS and "untuned betas" in warning


def test_writers_copy_and_check():
    t = TunedSettings({"data": {"rows": 1}})
    u = t.with_record("juice", {"beta_plus": 2.0, "beta_minus": 0.0}).with_provenance({"rows": 4})
    assert t.to_json() == {"data": {"rows": 1}}
    assert u.to_json() == {"data": {"rows": 4}, "juice": {"beta_plus": 2.0, "beta_minus": 0.0}}
    for bad, match in [({"juice": [1, 2]}, "tuned.juice must be an object"),
                       ({"juice": {"beta_plus": "2", "beta_minus": 0}}, "tuned.juice.beta_plus must be a finite number"),
                       ({"june": {"beta_plus": 1.0, "beta_minus": float("nan")}}, "tuned.june.beta_minus"),
                       ({"ph3": {"k": 2, "pruned": "L0H1"}}, "tuned.ph3.pruned must be a list"),
                       ({"ph3": {"k": 2.5, "pruned": ["L0H1"]}}, "tuned.ph3.k must be an integer")]:
        with pytest.raises(TunedSettingsError, match=match):
            TunedSettings(bad)
    with pytest.raises(TunedSettingsError):
        t.with_record("juice", {"beta_plus": True, "beta_minus": 0.0})


def test_the_heads_file_keeps_its_format(tmp_path):
    artifact = HeadsArtifact({"name": "m"}, "parametric", 1, [1.0], [-1.0],
                             HeadSelection((Head(0, 1),), (Head(1, 0),)), tuned=SAVED)
    assert isinstance(artifact.tuned, TunedSettings)
    save_heads(artifact, tmp_path / "h.json")
    on_disk = json.loads((tmp_path / "h.json").read_text())
    assert on_disk["tuned"] == SAVED
    assert load_heads(tmp_path / "h.json").tuned == SAVED
    on_disk["tuned"]["juice"]["beta_plus"] = "x"
    (tmp_path / "bad.json").write_text(json.dumps(on_disk))
    with pytest.raises(ValueError, match=r"bad.json: tuned.juice.beta_plus must be a finite number"):
        load_heads(tmp_path / "bad.json")
    untuned = HeadsArtifact({"name": "m"}, "parametric", 1, [1.0], [-1.0], HeadSelection((), ()))
    assert "tuned" not in untuned.to_json()


def test_the_tuned_range_is_the_recorded_one_else_the_span_of_the_grid_else_unknown():
    grid = [{"beta_plus": bp, "beta_minus": bm, "accuracy": 50.0} for bp in (0.0, 2.0) for bm in (0.0, -1.0)]
    tuned = TunedSettings({"juice": {"beta_plus": 2.0, "beta_minus": 0.0, "grid": grid},
                           "june": {"beta_plus": 1.0, "beta_minus": 0.0,
                                    "beta_range": {"beta_plus": [0, 5], "beta_minus": [-3, 0]}, "grid": grid},
                           "ph3": {"k": 1, "pruned": ["L0H0"], "grid": [{"k": 1}]}})
    assert tuned.beta_range("juice") == ((0.0, 2.0), (-1.0, 0.0))
    assert tuned.beta_range("june") == ((0.0, 5.0), (-3.0, 0.0))   # the recorded range wins over the grid
    assert tuned.beta_range("ph3") is None and tuned.beta_range("auto") is None
