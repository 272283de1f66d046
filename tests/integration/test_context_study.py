"""The when-to-steer study (:mod:`juice.when_to_steer.study`): validation and test share no question,
the best static method and `auto` come from validation only, the oracle router is right where a
candidate is, and an interrupted study resumes from its cache without decoding again."""

from __future__ import annotations

import json

import pytest

from helpers.auto import book_rows, nqswap_file, tiny_heads, tiny_model_and_heads


@pytest.fixture(scope="module")
def rows_file(tmp_path_factory):
    return nqswap_file(tmp_path_factory.mktemp("study") / "rows.jsonl", book_rows(16))


def test_the_study_chooses_on_validation_and_reports_on_test(tiny_llama, rows_file, tmp_path, monkeypatch):
    import juice.when_to_steer.study as study_module
    from juice.when_to_steer.study import ORACLE, run_study
    from juice.when_to_steer import MEAN, best_static_method

    lm = tiny_llama
    names = ("original", "prompt", "cad", "adacad", "juice")
    study = run_study(lm, tiny_heads(lm), rows_file, out=tmp_path / "s", names=names, resamples=1000)
    val, test = study.validation, study.test
    val_q = {(r.domain, r.subject) for r in val.results}
    test_q = {(r.domain, r.subject) for r in test.results}
    assert val_q and test_q and not val_q & test_q
    static = ["Original", "Prompt-mem", "Prompt-ctx", "CAD", "AdaCAD", "JuICE-ctx"]
    assert test.methods == [*static, "Question-only", "auto-ctx", ORACLE] and "JuICE/2-ctx" in val.methods
    static.append("Question-only")
    means = val.means()["use_relevant"]
    assert test.best_static == best_static_method({"means": val.means(), "methods": static}, among=static)
    assert means[test.best_static]["mean"] == max(means[m]["mean"] for m in static)
    assert f"auto-ctx - {test.best_static}" in test.summary["use_relevant"].differences or test.best_static == "auto-ctx"
    saved = json.loads((tmp_path / "s" / "heads_auto.json").read_text())["tuned"]["auto"]
    assert saved["picks"] == list(study.fit.policy.picks) and saved["data"]["split"] == "validation"
    candidates = ["Original", "Question-only", "AdaCAD", "JuICE-ctx", "JuICE/2-ctx"]
    by = {(r.item, r.conflict_type, r.method): r.correct for r in val.results}
    for (item, kind, method), right in by.items():
        if method == ORACLE:
            assert right == any(by[item, kind, c] for c in candidates)
    boot = test.summary["use_relevant"]
    assert boot.cells[ORACLE][MEAN].mean >= max(boot.cells[m][MEAN].mean for m in ("Original", "AdaCAD", "JuICE-ctx"))
    for name in ("study.md", "study.json", "validation/contexts.json", "test/contexts.md"):
        assert (tmp_path / "s" / name).is_file()

    def no_decoding(*args, **kwargs):
        raise AssertionError("the cache should hold every chunk")

    monkeypatch.setattr(study_module, "evaluate_context_types", no_decoding)
    again = run_study(lm, tiny_heads(lm), rows_file, out=tmp_path / "s", names=names, resamples=1000)
    assert [r.output for r in again.test.results] == [r.output for r in test.results]
    for half in ("validation", "test"):   # the decoding time is the cache's, not the re-run's
        key = f"{half} decoding (all chunks)"
        assert again.timings[key] == pytest.approx(study.timings[key]) and study.timings[key] > 0


def test_juice_evaluate_contexts_study_from_the_command_line(tmp_path, rows_file, capsys):
    import juice.apps.cli as cli

    folder, heads = tiny_model_and_heads(tmp_path)
    out = tmp_path / "out"
    assert cli.main(["evaluate", "--contexts", "gold,conflicting,irrelevant,none", "--study", "--data", str(rows_file),
                     "--heads", str(heads), "--methods", "original,adacad,juice,auto", "--limit", "3",
                     "--model", str(folder), "--device", "cpu", "--out", str(out)]) == 0
    printed = capsys.readouterr().out
    assert "best static method on validation" in printed
    saved = json.loads((out / "test" / "contexts.json").read_text())
    assert saved["methods"] == ["Original", "AdaCAD", "JuICE-ctx", "Question-only", "auto-ctx", "oracle"]
    assert saved["data"]["split"] == "test" and len({r["subject"] for r in saved["results"]}) == 3
    assert cli.main(["evaluate", "--study", "--data", str(rows_file), "--heads", str(heads)]) == 2


def _rigged(decode, right: str):
    """`decode_cached` whose second call (the test half) scores `right` right on every item and every
    other method wrong: what a study that read its test verdicts would follow."""
    from dataclasses import replace

    calls = []

    def wrapped(lm, items, methods, *args, **kwargs):
        results = decode(lm, items, methods, *args, **kwargs)
        calls.append(len(items))
        if len(calls) == 1:
            return results
        return [replace(r, correct=r.method == right, follows_parametric=r.method == right) for r in results]

    return wrapped


def test_no_test_verdict_moves_the_best_static_method_autos_policy_or_its_cross_validation(
        tiny_llama, rows_file, tmp_path, monkeypatch):
    """The leak paths of a study: the best static method chosen on test, and auto's fit (the study's
    own, `_fit_auto`) reading a test item. Two studies whose test verdicts favour two different
    methods must choose and fit the same, and the test tables must show the rigging."""
    import juice.when_to_steer.study as study_module
    from juice.when_to_steer.study import run_study
    from juice.when_to_steer import MEAN, best_static_method

    lm, real = tiny_llama, study_module.decode_cached
    names = ("original", "prompt", "cad", "adacad", "juice")
    studies = {}
    for right in ("JuICE-ctx", "AdaCAD"):
        monkeypatch.setattr(study_module, "decode_cached", _rigged(real, right))
        studies[right] = run_study(lm, tiny_heads(lm), rows_file, out=tmp_path / "s", names=names, resamples=1000)
    a, b = studies.values()
    static = [*a.validation.methods[:6], "Question-only"]
    chosen = best_static_method({"means": a.validation.means(), "methods": static}, among=static)
    assert a.test.best_static == b.test.best_static == chosen
    assert a.fit.policy == b.fit.policy and a.fit.to_json() == b.fit.to_json()
    assert a.cross_validation == b.cross_validation
    for right, study in studies.items():   # the rigging reached the test tables
        cells = study.test.summary["use_relevant"].cells
        assert cells[right][MEAN].mean == 1.0 and cells["Original"][MEAN].mean == 0.0
