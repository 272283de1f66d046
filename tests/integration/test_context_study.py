"""The when-to-steer study (:mod:`juice.when_to_steer.study`): validation and test share no question,
the best static method and `auto` come from validation only, the oracle router is right where a
candidate is, and an interrupted study resumes from its cache without decoding again."""

from __future__ import annotations

import json

import pytest

from helpers.auto import book_rows, nqswap_file, tiny_heads, tiny_model_and_heads, word_rows


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
    static = ["original", "prompt-mem", "prompt-ctx", "cad", "adacad", "juice-ctx"]   # row keys (titled on disk)
    assert test.methods == [*static, "Question-only", "auto-ctx", ORACLE] and "juice/2-ctx" in val.methods
    static.append("Question-only")
    means = val.means()["use_relevant"]
    assert test.best_static == best_static_method({"means": val.means(), "methods": static}, among=static)
    assert means[test.best_static]["mean"] == max(means[m]["mean"] for m in static)
    assert f"auto-ctx - {test.best_static}" in test.summary["use_relevant"].differences or test.best_static == "auto-ctx"
    saved = json.loads((tmp_path / "s" / "heads_auto.json").read_text())["tuned"]["auto"]
    assert saved["picks"] == list(study.fit.policy.picks) and saved["data"]["split"] == "validation"
    candidates = ["original", "Question-only", "adacad", "juice-ctx", "juice/2-ctx"]
    by = {(r.item, r.conflict_type, r.method): r.correct for r in val.results}
    for (item, kind, method), right in by.items():
        if method == ORACLE:
            assert right == any(by[item, kind, c] for c in candidates)
    boot = test.summary["use_relevant"]
    assert boot.cells[ORACLE][MEAN].mean >= max(boot.cells[m][MEAN].mean for m in ("original", "adacad", "juice-ctx"))
    for name in ("study.md", "study.json", "validation/contexts.json", "test/contexts.md"):
        assert (tmp_path / "s" / name).is_file()
    # the files show titles; read back, they are the same rows
    from juice.methods import row_key, row_title

    on_disk = json.loads((tmp_path / "s" / "validation" / "contexts.json").read_text())
    assert on_disk["methods"] == [row_title(m) for m in val.methods] and "JuICE/2-ctx" in on_disk["methods"]
    assert [row_key(m) for m in on_disk["methods"]] == val.methods
    written = json.loads((tmp_path / "s" / "study.json").read_text())
    assert written["best_static"] == row_title(test.best_static) and set(written["test"]["use_relevant"]["cells"]) \
        == {row_title(m) for m in test.methods}
    assert best_static_method(on_disk, among=static) == test.best_static   # a saved run's choice, as a key

    def no_decoding(*args, **kwargs):
        raise AssertionError("the cache should hold every chunk")

    monkeypatch.setattr(study_module, "evaluate_context_types", no_decoding)
    again = run_study(lm, tiny_heads(lm), rows_file, out=tmp_path / "s", names=names, resamples=1000)
    assert [r.output for r in again.test.results] == [r.output for r in test.results]
    for half in ("validation", "test"):   # the decoding time is the cache's, not the re-run's
        key = f"{half} decoding (all chunks)"
        assert again.timings[key] == pytest.approx(study.timings[key]) and study.timings[key] > 0


@pytest.fixture(scope="module")
def word_file(tmp_path_factory):
    return nqswap_file(tmp_path_factory.mktemp("words") / "rows.jsonl", word_rows(24))


def test_auto_routed_from_the_cache_is_auto_decoded(tiny_llama, word_file, tmp_path):
    """auto is never decoded by the study: its test results are its chosen candidates' cached
    outputs. The same items decoded live give the same tokens, for the fitted policy, for one
    that picks three candidates (a confidence-gain gate to the question alone, Original and JuICE
    in two bins cut at the median JSD), and for one whose lower bin is the Prompt baseline toward
    memory (the instructed prompt, a third prompt row in the engine)."""
    import juice
    from juice.methods import MethodInputs, build
    from juice.when_to_steer import context_items
    from juice.when_to_steer.auto import AutoPolicy, candidate_betas
    from juice.when_to_steer.auto_tuning import policy_picks, record_fit
    from juice.when_to_steer.evaluation import evaluate_context_types
    from juice.when_to_steer.signals import CONFIDENCE_GAIN
    from juice.when_to_steer.study import features_cached, routed_results, run_study

    lm = tiny_llama
    study = run_study(lm, tiny_heads(lm), word_file, out=tmp_path / "s",
                      names=("original", "prompt", "adacad", "juice"), resamples=1000)
    fitted = juice.load_heads(tmp_path / "s" / "heads_auto.json", lm)
    items = context_items(word_file, split="test")[0].items
    signal, gates, passage = features_cached(lm, items, tmp_path / "s" / "cache")
    median = midway([x for x, p in zip(signal, passage) if p])
    gain = midway([g for g, p in zip(gates[CONFIDENCE_GAIN], passage) if p])
    three = AutoPolicy((median,), ("original", "juice"), {"juice": candidate_betas(fitted.tuned)["juice"]},
                       relevance=gain, gate=CONFIDENCE_GAIN)
    instructed = AutoPolicy((median,), ("prompt-mem", "juice"), {"juice": candidate_betas(fitted.tuned)["juice"]},
                            relevance=gain, gate=CONFIDENCE_GAIN)
    keys = {"original": "original", "question": "Question-only", "juice": "juice-ctx", "adacad": "adacad",
            "juice/2": "juice/2-ctx", "prompt-mem": "prompt-mem"}
    for policy in (study.fit.policy, three, instructed):
        record_fit(fitted, replace_fit(study.fit, policy))
        picks = policy_picks(policy, signal, passage, gates)
        if policy is three:
            assert len(set(picks)) == 3
        if policy is instructed:   # and Original where there is no passage
            assert set(picks) == {"original", "question", "prompt-mem", "juice"}
        routed = ([r for r in study.test.results if r.method == "auto-ctx"] if policy is study.fit.policy
                  else routed_results(items, study.test.results, picks, keys, "auto"))
        live = evaluate_context_types(lm, items, {"auto": build("auto", MethodInputs(lm, fitted.selection,
                                                                                     fitted.tuned)).method})
        assert len(routed) == len(live) == len(items)
        assert [(r.item, r.conflict_type, r.output, r.correct) for r in live] == \
            [(r.item, r.conflict_type, r.output, r.correct) for r in routed]


def midway(values):
    """The midpoint of the two middle distinct values: a threshold no value lies near (a value on
    it would fall either side by the ~1e-8 of another batch layout)."""
    order = sorted(set(values))
    return (order[len(order) // 2 - 1] + order[len(order) // 2]) / 2


def replace_fit(fit, policy):
    from dataclasses import replace

    return replace(fit, policy=policy)


def test_a_change_to_the_decoding_code_decodes_again(tiny_llama, rows_file, tmp_path, monkeypatch):
    """The cache key holds the decoding code's source: the same study with other code reads none
    of the cached chunks; with the same code, all of them."""
    import juice.when_to_steer.study as study_module
    from juice.when_to_steer.evaluation import evaluate_context_types

    lm, calls = tiny_llama, []

    def counting(*args, **kwargs):
        calls.append(1)
        return evaluate_context_types(*args, **kwargs)

    monkeypatch.setattr(study_module, "evaluate_context_types", counting)
    run = lambda: study_module.run_study(lm, tiny_heads(lm), rows_file, out=tmp_path / "s",   # noqa: E731
                                         names=("original",), auto=False, resamples=1000)
    run()
    first = len(calls)
    run()
    assert first > 0 and len(calls) == first
    real = study_module.decoding_code_key
    monkeypatch.setattr(study_module, "decoding_code_key", lambda modules=study_module.DECODING_MODULES:
                        "edited" if modules == study_module.DECODING_MODULES else real(modules))
    run()
    assert len(calls) == 2 * first


def test_the_decoding_code_key_reads_the_source(tmp_path, monkeypatch):
    """:func:`decoding_code_key` changes with one byte of a module's source."""
    import sys

    from juice.when_to_steer.study import decoding_code_key

    (tmp_path / "keyed_pkg").mkdir()
    (tmp_path / "keyed_pkg" / "__init__.py").write_text("x = 1\n")
    (tmp_path / "keyed_pkg" / "inner.py").write_text("y = 1\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    before = decoding_code_key(("keyed_pkg",))
    (tmp_path / "keyed_pkg" / "inner.py").write_text("y = 2\n")
    decoding_code_key.cache_clear()
    assert decoding_code_key(("keyed_pkg",)) != before
    sys.modules.pop("keyed_pkg", None)


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
    for right in ("juice-ctx", "adacad"):
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
        assert cells[right][MEAN].mean == 1.0 and cells["original"][MEAN].mean == 0.0


def test_the_published_record_is_built_from_the_decoded_outcomes_alone(tiny_llama, word_file, rows_file, tmp_path,
                                                                       monkeypatch):
    """`--decode-only` writes outcomes.json and no study; the benchmark's pre-registered record
    reads it (no model: decoding is refused), on two datasets, and its verdict sentences and
    tables come out of it."""
    import hashlib
    import sys
    from pathlib import Path

    import juice.when_to_steer.study as study_module
    from juice.when_to_steer.study import run_study

    names = ("original", "prompt", "adacad", "juice")
    folders = {}
    for name, data in (("words", word_file), ("books", rows_file)):
        assert run_study(tiny_llama, tiny_heads(tiny_llama), data, out=tmp_path / name, names=names,
                         decode_only=True) is None
        assert (tmp_path / name / "outcomes.json").is_file() and not (tmp_path / name / "study.json").exists()
        folders[name] = tmp_path / name
    monkeypatch.setattr(study_module, "evaluate_context_types", None)
    monkeypatch.syspath_prepend(str(Path(__file__).resolve().parents[2] / "benchmarks"))
    sys.modules.pop("when_to_steer_study", None)
    import when_to_steer_study

    rec = when_to_steer_study.published_record(folders, source={"commit": "0" * 40, "dirty": False}, command="x")
    assert rec["datasets"]["words"]["outcomes_sha256"] == hashlib.sha256(
        (tmp_path / "words" / "outcomes.json").read_bytes()).hexdigest()
    assert {e["dataset"] for e in rec["estimates"]} == {"words", "books", "words -> books", "books -> words"}
    assert len(rec["plan_sha256"]) == 64
    for part in rec["datasets"].values():
        assert "auto" in part["harm"]["rows"] and "Prompt-mem" in part["harm"]["rows"]
        assert part["risk_coverage"]["auto (its bins)"][0]["coverage"] == 1.0
    text = when_to_steer_study.published_markdown(rec)
    for sentence in when_to_steer_study.verdict_sentences(rec):
        assert sentence in text
    assert "words, validation -> test: auto - " in text and "words -> books, across datasets" in text


def test_a_study_decoded_a_half_per_run_is_the_study_decoded_in_one(tiny_llama, word_file, tmp_path):
    """`decode_halves`: each run decodes one half and writes its outcomes file; the halves of two
    runs are the files one run over both writes, byte for byte, and join into its outcomes.json."""
    import hashlib

    import pytest

    from juice.when_to_steer.outcomes import outcomes_sha256, read_outcomes
    from juice.when_to_steer.study import run_study

    names = ("original", "juice")
    assert run_study(tiny_llama, tiny_heads(tiny_llama), word_file, out=tmp_path / "one", names=names,
                     decode_only=True) is None
    for half in ("validation", "test"):
        assert run_study(tiny_llama, tiny_heads(tiny_llama), word_file, out=tmp_path / half, names=names,
                         decode_only=True, decode_halves=(half,)) is None
        written = sorted(p.name for p in (tmp_path / half).glob("outcomes*.json"))
        assert written == [f"outcomes-{half}.json"]
        apart = tmp_path / half / f"outcomes-{half}.json"
        assert apart.read_bytes() == (tmp_path / "one" / f"outcomes-{half}.json").read_bytes()
        (tmp_path / "joined").mkdir(exist_ok=True)
        (tmp_path / "joined" / apart.name).write_bytes(apart.read_bytes())
    assert outcomes_sha256(read_outcomes(tmp_path / "joined")) == hashlib.sha256(
        (tmp_path / "one" / "outcomes.json").read_bytes()).hexdigest()
    with pytest.raises(ValueError, match="only --decode-only"):
        run_study(tiny_llama, tiny_heads(tiny_llama), word_file, out=tmp_path / "x", names=names,
                  decode_halves=("test",))


def test_shards_decoded_side_by_side_give_the_outcomes_one_run_gives(tiny_llama, word_file, tmp_path, monkeypatch):
    """`decode_shard`: two shards fill one cache, chunk by chunk, writing no outcomes; a run
    without a shard then decodes nothing (the engine and the signals are refused) and writes
    the halves' files one run writes, byte for byte."""
    import pytest

    import juice.when_to_steer.study as study_module
    from juice.when_to_steer.study import run_study

    monkeypatch.setattr(study_module, "CHUNK", 2)
    names = ("original", "juice")
    heads = tiny_heads(tiny_llama)
    assert run_study(tiny_llama, heads, word_file, out=tmp_path / "one", names=names, decode_only=True) is None
    for k in (0, 1):
        assert run_study(tiny_llama, heads, word_file, out=tmp_path / "shards", names=names, decode_only=True,
                         decode_shard=(k, 2)) is None
        assert not list((tmp_path / "shards").glob("outcomes*.json"))
        if k == 0:   # half the chunks: the other shard's are not in the cache yet
            assert 0 < len(list((tmp_path / "shards" / "cache").glob("*.json"))) < \
                len(list((tmp_path / "one" / "cache").glob("*.json")))
    monkeypatch.setattr(study_module, "evaluate_context_types", None)
    monkeypatch.setattr(study_module, "request_features", None)
    assert run_study(tiny_llama, heads, word_file, out=tmp_path / "shards", names=names, decode_only=True) is None
    for name in ("outcomes-validation.json", "outcomes-test.json", "outcomes.json"):
        assert (tmp_path / "shards" / name).read_bytes() == (tmp_path / "one" / name).read_bytes()
    for bad in ((2, 2), (-1, 2)):
        with pytest.raises(ValueError, match="decode_shard"):
            run_study(tiny_llama, heads, word_file, out=tmp_path / "x", names=names, decode_only=True, decode_shard=bad)
    with pytest.raises(ValueError, match="with --decode-only"):
        run_study(tiny_llama, heads, word_file, out=tmp_path / "x", names=names, decode_shard=(0, 2))
