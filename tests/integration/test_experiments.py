"""The Table 1 pipeline end to end on a tiny model, and its resume after an interruption."""

from __future__ import annotations

import json
from dataclasses import replace

import pytest

import juice.pipeline.domains as domains
import juice.pipeline.run as run_mod
import juice.pipeline.stages as stages
from juice.pipeline.run import ReproduceConfig
from juice.experiments.table1 import reproduce

from helpers.data import authors_layout, write_contextual_data


def _two_domain_folder(shared_data, root):
    """The paper's layout with two domains: World Capital and a renamed copy of it."""
    import shutil

    for name in ("world_capital", "capital_copy"):
        shutil.copytree(shared_data / "paraconflict" / "world_capital", root / name)
    return root


def test_pipeline_evaluates_every_domain_of_the_paper_layout_writes_outputs_and_resumes(
        shared_data, tiny_llama, tmp_path):
    data = _two_domain_folder(shared_data, tmp_path / "data")
    cfg = ReproduceConfig(out_dir=tmp_path / "out", data=data, limit=3, validation_size=2, filter=False,
                          alphas_positive=(1.0,), alphas_negative=(-1.0,), k=2, ph3_dev_size=3,
                          bootstrap_resamples=1000)
    first = reproduce(cfg, lm=tiny_llama)
    out = tmp_path / "out"
    results = json.loads((out / "results.json").read_text())
    methods = {"Original", "Prompt", "PH3-l", "PH3-s", "JuNE", "JuICE"}
    assert set(results["table"]["cells"]) == methods
    assert set(results["table"]["cells"]["JuICE"]) == {"world_capital", "capital_copy", "Average"}
    assert len(results["items"]) == 2 * 3 * 3 * 6
    assert set(results["choices"]) == {"world_capital", "capital_copy"}
    assert results["choices"]["capital_copy"]["chosen_on"] == "capital_copy"   # tuned on its own validation
    assert results["choices"]["world_capital"]["prune"]["PH3-l"]["k"] in (1, 3, 5, 7, 9, 15)
    assert results["protocol"]["scoring"] == "exact"
    assert results["protocol"]["ph3_scoring"] == {"PH3-l": "path patching", "PH3-s": "path patching"}
    assert results["protocol"]["beta_grid"] == {"beta_plus": [0.0, 1.0, 2.0, 3.0, 4.0, 5.0],
                                                "beta_minus": [0.0, -1.0, -2.0, -3.0]}
    cell = results["table"]["cells"]["Original"]["world_capital"]["clean"]
    assert cell["n"] == 3 and cell["low"] <= cell["mean"] <= cell["high"]
    assert "JuICE - Original" in results["table"]["differences"]
    md = (out / "table.md").read_text()
    assert "±" in md and "Test items the model knows" in md and "Paired differences" in md
    assert "## Degenerate outputs" in md and set(results["degeneration"]["cells"]) == methods
    assert results["degeneration"]["cells"]["JuICE"]["Average"]["clean"]["n"] == 6
    assert all("degeneration" in c["betas"]["juice"] for c in results["choices"].values())
    # issue 49: the second score, correct and not degenerate, with its paired differences
    usable = results["correct_not_degenerate"]
    assert set(usable["cells"]) == methods and "JuICE - Original" in usable["differences"]
    assert "## Correct and not degenerate" in md and "Paired differences, correct and not degenerate" in md
    from juice.eval.degeneration import correct_not_degenerate
    from juice.eval.runner import results_from_json
    rows = [r for r in results_from_json(results["items"]) if r.method == "JuICE" and r.domain == "world_capital"
            and r.conflict_type == "clean"]
    assert usable["cells"]["JuICE"]["world_capital"]["clean"]["mean"] == pytest.approx(
        sum(map(correct_not_degenerate, rows)) / len(rows))
    assert (out / "table_correct_not_degenerate.png").read_bytes()[:4] == b"\x89PNG"
    assert (out / "table.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    heads = json.loads((out / "heads.json").read_text())
    assert heads["model"]["model_type"] == "llama" and len(heads["head_set"]) == 4
    # the authors' splits (issue 33), their item ids in results.json: D from the head domain's
    # head-finding file, each domain's validation split from its own validation file
    wc, copy = results["splits"]["world_capital"], results["splits"]["capital_copy"]
    assert wc["head_set_ids"] == [f"head_finding_set_size_4#{i}" for i in range(4)]
    assert wc["validation_ids"] == copy["validation_ids"] == ["filtered_validation#0", "filtered_validation#1"]
    assert wc["ph3_dev_ids"] == [f"filtered_validation#{i}" for i in (2, 3, 4)] and copy["ph3_dev_ids"] == []
    assert copy["head_set_ids"] == [] and copy["test_ids"] == [f"unfiltered_test#{i}" for i in range(3)]

    # An interrupted run: one domain's evaluation is lost; nothing else is recomputed.
    (out / "state" / "eval_capital_copy.json").unlink()

    def boom(*args, **kwargs):
        raise AssertionError("stage recomputed")

    mp = pytest.MonkeyPatch()
    for module, name in ((stages, "identify_heads"), (stages, "tune_per_domain"), (stages, "path_patching_effects"),
                         (domains, "clean_outputs")):
        mp.setattr(module, name, boom)
    try:
        second = reproduce(cfg, lm=tiny_llama)
    finally:
        mp.undo()
    assert second.table.to_json() == first.table.to_json() and second.selection == first.selection

    # The state folder copied elsewhere (another machine, another session) resumes there: its
    # keys hold no path, so nothing is recomputed, evaluations included.
    import shutil

    from juice.eval import runner

    shutil.copytree(out / "state", tmp_path / "elsewhere" / "state")
    mp = pytest.MonkeyPatch()
    for module, name in ((stages, "identify_heads"), (stages, "tune_per_domain"), (stages, "path_patching_effects"),
                         (domains, "clean_outputs"), (runner, "decode_requests")):
        mp.setattr(module, name, boom)
    try:
        moved = reproduce(replace(cfg, out_dir=tmp_path / "elsewhere"), lm=tiny_llama)
    finally:
        mp.undo()
    assert moved.table.to_json() == first.table.to_json()
    assert json.dumps(moved.choices) == json.dumps(first.choices)   # tuples read back as lists


def test_a_run_killed_in_the_tuning_resumes_at_its_next_chunk_with_the_same_results(shared_data, tiny_llama, tmp_path):
    """Issue 89's resume at any point: a run killed in the middle of the per-domain tuning decodes,
    when run again, only the tuning's chunks it had not finished (the stage's chunk checkpoint),
    and gives the choices, table and outputs of a run never killed; the checkpoint goes once the
    stage is saved."""
    import juice.engine.batch as batch
    from juice.io import UnitCheckpoint

    data = _two_domain_folder(shared_data, tmp_path / "data")
    cfg = ReproduceConfig(out_dir=tmp_path / "whole", data=data, limit=2, validation_size=2, filter=False,
                          alphas_positive=(1.0,), alphas_negative=(-1.0,), k=2, ph3_dev_size=3,
                          bootstrap_resamples=1000, max_rows=16)
    real_put, real_run = UnitCheckpoint.put, batch._run_chunk
    put: list[str] = []   # the tuning's chunks decoded (each is put in its checkpoint once decoded)

    def counted(self, unit, value):
        if self.path.name == "tuning_parametric.chunks.json":
            put.append(unit)
        return real_put(self, unit, value)

    def dying(*args, **kwargs):
        if len(put) == 3:
            raise KeyboardInterrupt
        return real_run(*args, **kwargs)

    mp = pytest.MonkeyPatch()
    mp.setattr(UnitCheckpoint, "put", counted)
    try:
        whole = reproduce(cfg, lm=tiny_llama)
        n_chunks, out = len(put), tmp_path / "killed"
        put.clear()
        mp.setattr(batch, "_run_chunk", dying)
        with pytest.raises(KeyboardInterrupt):
            reproduce(replace(cfg, out_dir=out), lm=tiny_llama)
        assert (out / "state" / "tuning_parametric.chunks.json").is_file()
        assert not (out / "state" / "tuning_parametric.json").exists()
        done = list(put)
        put.clear()
        mp.setattr(batch, "_run_chunk", real_run)
        again = reproduce(replace(cfg, out_dir=out), lm=tiny_llama)
    finally:
        mp.undo()
    assert n_chunks > 4 and len(done) == 3 and len(put) == n_chunks - 3 and not set(done) & set(put)
    assert not (out / "state" / "tuning_parametric.chunks.json").exists()
    assert json.dumps(again.choices) == json.dumps(whole.choices)
    assert again.table.to_json() == whole.table.to_json() and again.selection == whole.selection
    assert json.loads((out / "results.json").read_text())["items"] == json.loads(
        (tmp_path / "whole" / "results.json").read_text())["items"]


def test_filtering_gives_known_disjoint_splits_and_stops_decoding_early(tiny_llama, tmp_path, monkeypatch):
    """With a simulated model that knows every third item: D, validation and PH3-l's
    development set hold only known items, are disjoint from each other and from the test split,
    and the pool is decoded only until enough known items are found."""
    decoded = []

    def fake_clean_outputs(lm, examples, max_rows, on_progress=None, engine=None):
        decoded.extend(ex.subject for ex in examples)
        return [f" {ex.answers[0]} is it" if sum(map(ord, ex.subject)) % 3 == 0 else " no idea" for ex in examples]

    monkeypatch.setattr(domains, "clean_outputs", fake_clean_outputs)
    monkeypatch.setattr(domains, "prefer_aliases", lambda lm, exs, outs, **kw: list(exs))
    cfg = ReproduceConfig(out_dir=tmp_path, domains=("world_capital", "athlete_sport"), limit=4,
                          validation_size=3, ph3_dev_size=5)
    state = run_mod.StageFiles(tmp_path / "state")
    splits, _, head, counts = domains.prepare_domains(run_mod.StageRun(tiny_llama, cfg, state), {"seed": 0})
    assert head == "world_capital"
    wc = splits["world_capital"]
    assert (len(wc.head_set), len(wc.validation), len(wc.ph3_dev)) == (4, 3, 5)
    known = {s for s in decoded if sum(map(ord, s)) % 3 == 0}
    for sp in splits.values():
        dev = [ex.subject for ex in (*sp.head_set, *sp.validation, *sp.ph3_dev)]
        assert set(dev) <= known and len(set(dev)) == len(dev)
        assert not set(dev) & {ex.subject for ex in sp.test}
    assert len(splits["athlete_sport"].validation) == 3 and not splits["athlete_sport"].ph3_dev
    assert counts["athlete_sport"]["decoded"] < counts["athlete_sport"]["pool"]


def test_the_authors_files_give_the_authors_splits_refiltered_for_the_model(shared_data, tiny_llama, tmp_path,
                                                                           monkeypatch):
    """`--data` with the authors' files (issue 33): D is the head domain's known head-finding
    items (topped up from its validation file, with a note, where the model knows fewer than 4),
    every domain's validation split its own known `filtered_validation.json` items (never the
    head-finding file), PH3-l's set the head domain's next known validation items, the test split
    `unfiltered_test.json`."""
    data = _two_domain_folder(shared_data, tmp_path / "data")
    head_file = json.loads((data / "world_capital" / "head_finding_set_size_4.json").read_text())
    unknown = {head_file[0]["Subject"]} | {ex["Subject"] for ex in json.loads(
        (data / "world_capital" / "filtered_validation.json").read_text())[1::3]}
    monkeypatch.setattr(domains, "clean_outputs", lambda lm, exs, max_rows, on_progress=None, engine=None:
                        [" no idea" if ex.subject in unknown else f" {ex.answers[0]}" for ex in exs])
    monkeypatch.setattr(domains, "prefer_aliases", lambda lm, exs, outs, **kw: list(exs))
    cfg = ReproduceConfig(out_dir=tmp_path, data=data, limit=2, validation_size=3, ph3_dev_size=2)
    run = run_mod.StageRun(tiny_llama, cfg, run_mod.StageFiles(tmp_path / "s"))
    splits, _, head, _ = domains.prepare_domains(run, {"seed": 0})
    wc, copy = splits["world_capital"], splits["capital_copy"]
    # validation items 0, 2, 3, 5, 6, 8, ... are known (every third from 1 is not)
    assert [ex.uid for ex in wc.head_set] == [f"head_finding_set_size_4#{i}" for i in (1, 2, 3)] + \
        ["filtered_validation#0"]
    assert [ex.uid for ex in wc.validation] == [f"filtered_validation#{i}" for i in (2, 3, 5)]
    assert [ex.uid for ex in wc.ph3_dev] == [f"filtered_validation#{i}" for i in (6, 8)]
    assert [ex.uid for ex in copy.validation] == [f"filtered_validation#{i}" for i in (0, 2, 3)]
    assert not copy.head_set and not copy.ph3_dev
    assert [ex.uid for ex in copy.test] == ["unfiltered_test#0", "unfiltered_test#1"]
    assert any("knows 3 of the head-finding file's 4 items" in n for n in run.notes)


def test_tiny_prompt_too_long_and_empty_answer_errors(tiny_llama):
    from juice.engine import greedy_generate
    from juice.tokens import EmptyAnswerError, PromptTooLongError, answer_first_token

    with pytest.raises(PromptTooLongError, match="context holds"):
        greedy_generate(tiny_llama, ["w1 " * 300], 4)
    with pytest.raises(EmptyAnswerError):
        answer_first_token(tiny_llama.tokenizer, "the capital of france is", "   ")


def test_contextual_pipeline_runs_writes_table2_and_resumes(tiny_llama, tmp_path):
    import juice.experiments.table2 as rc

    write_contextual_data(tmp_path / "data")
    cfg = ReproduceConfig(out_dir=tmp_path / "out", data_root=tmp_path / "data", limit=2, validation_per_dataset=1,
                          ph3_dev_size=2, scoring="exact", alphas_positive=(1.0,), alphas_negative=(-1.0,), k=2,
                          bootstrap_resamples=1000, contexts=("nqswap", "paraconflict"))
    first = rc.reproduce_contextual(cfg, lm=tiny_llama)
    results = json.loads((tmp_path / "out" / "results_contextual.json").read_text())
    methods = {"Original", "Prompt", "CAD", "AdaCAD", "PH3-l", "PH3-s", "JuNE", "JuICE"}
    assert set(results["table"]["cells"]) == methods
    assert len(results["items"]) == 5 * 2 * 8
    assert set(results["likelihood"]["cells"]["CAD"]) == {"proverb_ending", "proverb_translation",
                                                          "hate_speech_ending", "history_of_science_qa", "Average"}
    assert set(results["choices"]) == {"nqswap", "hate_speech_ending", "history_of_science_qa", "proverb_ending",
                                       "proverb_translation"}
    table = (tmp_path / "out" / "table2.md").read_text()
    assert "NQ-Swap" in table and "Proverb Translation" in table and "likelihood" in table
    assert "## Degenerate outputs" in table and "## Correct and not degenerate" in table
    assert set(results["correct_not_degenerate"]["cells"]) == methods
    # when to steer: NQ-Swap's 2 test questions under every context type, every method
    contexts = results["contexts"]
    assert set(contexts) == {"use_relevant", "trust_memory", "follows_context", "use_relevant_not_degenerate",
                            "degenerate"}
    assert set(contexts["use_relevant"]["cells"]) == methods
    assert {g: c["n"] for g, c in contexts["use_relevant"]["cells"]["JuICE"]["nqswap"].items()} == {
        "gold": 2, "conflicting": 2, "irrelevant": 2, "distractor": 2, "none": 2}
    assert "When to steer" in table and "trust memory" in table
    # the when-to-steer study (issue 44, part 4): Table 2's heads with NQ-Swap's tuned betas, split by question
    study = results["when_to_steer"]["nqswap"]
    folder = tmp_path / "out" / "when-to-steer-nqswap"
    assert study["study"] == str(folder / "study.md") and (folder / "study.md").is_file()
    assert study["best_static"] in study["means"] and "oracle" in study["means"]
    assert any(k.startswith("auto-ctx - ") for k in study) and study["questions"] >= 1
    studied = json.loads((folder / "heads_table2.json").read_text())["tuned"]
    assert {m: studied[m] for m in ("juice", "june")} == {
        m: {k: results["choices"]["nqswap"]["betas"][m][k] for k in ("beta_plus", "beta_minus")} for m in ("juice", "june")}
    assert "## When to steer, the study" in table and "nqswap:" in table
    paraconflict = results["when_to_steer"]["paraconflict"]   # the six built-in domains, the same heads and betas
    assert paraconflict["questions"] >= 6 and (tmp_path / "out" / "when-to-steer-paraconflict" / "study.md").is_file()

    (tmp_path / "out" / "state" / "eval_contextual_nqswap.json").unlink()

    def boom(*args, **kwargs):
        raise AssertionError("stage recomputed")

    mp = pytest.MonkeyPatch()
    mp.setattr(stages, "tune_per_domain", boom)
    mp.setattr(stages, "identify_heads", boom)
    mp.setattr(stages, "path_patching_effects", boom)
    mp.setattr("juice.when_to_steer.study.evaluate_context_types", boom)   # the study's decoding is cached
    try:
        second = rc.reproduce_contextual(cfg, lm=tiny_llama)
    finally:
        mp.undo()
    assert second.table.to_json() == first.table.to_json()
    assert {k: t.to_json() for k, t in second.contexts.items()} == {k: t.to_json() for k, t in first.contexts.items()}
    assert second.studies == first.studies


def test_a_new_contextual_dataset_is_one_entry(tiny_llama, tmp_path, monkeypatch):
    """A sixth contextual dataset with a metric of its own: its loader plus one entry in
    juice.data.contextual.DATASETS (and one in juice.data.metrics.METRICS) put it through the whole
    Table 2 pipeline: loaded and split, a column of every table under its title, scored by its metric."""
    import juice.experiments.table2 as rc
    from juice.data import contextual, metrics
    from juice.data.records import ContextualExample

    def load_riddles(folder):
        rows = [json.loads(line) for line in (folder / "riddles.jsonl").read_text().splitlines()]
        return [ContextualExample("riddles", str(i), f"{r['clue']} So the answer is", "So the answer is",
                                  (f" {r['answer']}",), (f" {r['usual']}",), "completion", "keyword")
                for i, r in enumerate(rows)]

    scored = []

    def keyword(output, answers):
        scored.append(output)
        return any(a.strip() in output for a in answers)

    monkeypatch.setitem(metrics.METRICS, "keyword", metrics.Metric(
        "keyword", 4, "a test's metric: the answer anywhere in the output", keyword, frozenset({metrics.CONTEXTUAL})))
    monkeypatch.setitem(contextual.DATASETS, "riddles", contextual.ContextualDataset(
        "riddles", "Riddles", "keyword", "riddles", load_riddles))
    write_contextual_data(tmp_path / "data")
    (tmp_path / "data" / "riddles").mkdir()
    words = "paris berlin tokyo madrid rome golf tennis".split()
    (tmp_path / "data" / "riddles" / "riddles.jsonl").write_text("".join(
        json.dumps({"clue": f"w{i} is {words[i % 7]}, not {words[(i + 1) % 7]}.", "answer": words[i % 7],
                    "usual": words[(i + 1) % 7]}) + "\n" for i in range(14)))
    cfg = ReproduceConfig(out_dir=tmp_path / "out", data_root=tmp_path / "data", limit=2, validation_per_dataset=1,
                          ph3_dev_size=2, scoring="exact", alphas_positive=(1.0,), alphas_negative=(-1.0,), k=2,
                          bootstrap_resamples=1000, contexts=())
    rc.reproduce_contextual(cfg, lm=tiny_llama)
    results = json.loads((tmp_path / "out" / "results_contextual.json").read_text())
    assert results["splits"]["riddles"]["test"] == 2 and "riddles" in results["choices"]
    assert all("riddles" in cells for cells in results["table"]["cells"].values())
    assert {r["domain"] for r in results["items"]} >= {"riddles", "nqswap", "proverb_ending"}
    assert scored and "Riddles" in (tmp_path / "out" / "table2.md").read_text()
    (tmp_path / "data" / "riddles" / "riddles.jsonl").unlink()
    (tmp_path / "data" / "riddles").rmdir()
    with pytest.raises(FileNotFoundError, match="no riddles/"):
        rc.reproduce_contextual(cfg, lm=tiny_llama)


def test_contextual_pipeline_explains_missing_data(tiny_llama, tmp_path):
    import juice.experiments.table2 as rc

    with pytest.raises(FileNotFoundError, match="--data-root"):
        rc.reproduce_contextual(ReproduceConfig(out_dir=tmp_path, data_root=tmp_path / "nowhere"), lm=tiny_llama)


def test_filter_state_is_keyed_on_the_model_and_the_seed(tiny_llama, tiny_gemma3, tmp_path, monkeypatch):
    """Regression (`juice identify` cached its filtered items under a constant key, so a second
    model in the same folder reused the first model's items and `--seed 1` raised KeyError)."""
    calls = []

    def fake_clean_outputs(lm, examples, max_rows, on_progress=None, engine=None):
        calls.append(lm.name)
        return [f" {ex.answers[0]}" for ex in examples]   # this fake model knows everything

    monkeypatch.setattr(domains, "clean_outputs", fake_clean_outputs)
    monkeypatch.setattr(domains, "prefer_aliases", lambda lm, exs, outs, **kw: list(exs))
    state = run_mod.StageFiles(tmp_path / ".juice-state")
    subjects, recomputed = {}, []
    for lm, seed in ((tiny_llama, 0), (tiny_gemma3, 0), (tiny_llama, 1), (tiny_llama, 0)):
        cfg = ReproduceConfig(domains=("world_capital",), limit=0, validation_size=0, baselines=False, seed=seed)
        before = len(calls)
        splits, *_ = domains.prepare_domains(run_mod.StageRun(lm, cfg, state), run_mod.run_key_base(lm, cfg, command="identify"))
        subjects[(lm.name, seed)] = [ex.subject for ex in splits["world_capital"].head_set]
        recomputed.append(len(calls) > before)
    # another model and another seed recompute; the first setting, run again, reads its own state
    assert recomputed == [True, True, True, False]
    assert subjects[(tiny_llama.name, 0)] != subjects[(tiny_llama.name, 1)]   # the seed changes D


def test_full_splits_the_head_domains_known_items_between_validation_and_ph3(tiny_llama, tmp_path, monkeypatch):
    """Under --full (validation_size None) PH3-l still gets known development items."""
    monkeypatch.setattr(domains, "clean_outputs", lambda lm, exs, max_rows, on_progress=None, engine=None:
                        [f" {ex.answers[0]}" if sum(map(ord, ex.subject)) % 2 else " no" for ex in exs])
    monkeypatch.setattr(domains, "prefer_aliases", lambda lm, exs, outs, **kw: list(exs))
    cfg = ReproduceConfig(out_dir=tmp_path, domains=("world_capital",), limit=2, validation_size=None,
                          ph3_dev_size=200)
    splits, *_ = domains.prepare_domains(run_mod.StageRun(tiny_llama, cfg, run_mod.StageFiles(tmp_path / "s")), {"seed": 0})
    wc = splits["world_capital"]
    assert len(wc.ph3_dev) > 0 and abs(len(wc.validation) - len(wc.ph3_dev)) <= 1


def test_too_few_known_items_in_the_head_domain_is_a_clear_error(tiny_llama, tmp_path, monkeypatch):
    monkeypatch.setattr(domains, "clean_outputs", lambda lm, exs, max_rows, on_progress=None, engine=None: [" no idea"] * len(exs))
    cfg = ReproduceConfig(out_dir=tmp_path, domains=("world_capital",), limit=2, validation_size=2)
    with pytest.raises(ValueError, match="answered correctly on the clean prompt"):
        domains.prepare_domains(run_mod.StageRun(tiny_llama, cfg, run_mod.StageFiles(tmp_path / "s")), {"seed": 0})


def test_identify_needs_only_d_and_too_few_known_items_name_the_options(tiny_llama, tmp_path, monkeypatch):
    """Issue 38: `juice identify` (no validation split) needs |D| known items, not |D| + 1; too
    few is one line naming --head-set-size (with a size that fits), --data and another domain."""
    known = {ex.subject for ex in domains.domain_sources(ReproduceConfig(domains=("world_capital",)))[0][
        "world_capital"].pool[:4]}
    monkeypatch.setattr(domains, "clean_outputs", lambda lm, exs, max_rows, on_progress=None, engine=None:
                        [f" {ex.answers[0]}" if ex.subject in known else " no idea" for ex in exs])
    monkeypatch.setattr(domains, "prefer_aliases", lambda lm, exs, outs, **kw: list(exs))
    identify = ReproduceConfig(out_dir=tmp_path, domains=("world_capital",), limit=0, validation_size=0,
                               baselines=False)
    splits, *_ = domains.prepare_domains(run_mod.StageRun(tiny_llama, identify, run_mod.StageFiles(tmp_path / "a")),
                                         {"seed": 0})
    assert {ex.subject for ex in splits["world_capital"].head_set} == known   # exactly the 4 known items
    reproduce_cfg = replace(identify, validation_size=2)
    with pytest.raises(ValueError) as err:
        domains.prepare_domains(run_mod.StageRun(tiny_llama, reproduce_cfg, run_mod.StageFiles(tmp_path / "b")),
                                {"seed": 0})
    message = str(err.value)
    assert "only 4 development items" in message and "need at least 5" in message and "\n" not in message
    assert "--head-set-size 3" in message and "--data FILE" in message and "another domain" in message
    # `juice identify`'s library call: Stage 1 on those 4 items, the artifact naming its data
    from juice.io import UnitCheckpoint
    from juice.pipeline.stages import identify_on_domain

    cfg = ReproduceConfig(out_dir=tmp_path, domains=("world_capital",), k=2, alphas_positive=(1.0,),
                          alphas_negative=(-1.0,), validation_size=3)   # ignored: identify asks for none
    units = UnitCheckpoint(tmp_path / "units.json", tiny_llama.fingerprint())
    artifact = identify_on_domain(tiny_llama, cfg, run_mod.StageFiles(tmp_path / "c"), command="identify",
                                  checkpoint=units)
    assert artifact.data == {"folder": "built-in", "domain": "world_capital", "rows": 4}
    assert len(artifact.selection.positive) <= 2 and artifact.model == tiny_llama.fingerprint()
    # with a checkpoint, every prompt's scores are saved: a second Stage 1 reads them, computes none
    from juice.engine.backend import JuiceEngine

    def boom(*args, **kwargs):
        raise AssertionError("a saved prompt was scored again")

    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(JuiceEngine, "intervention_probs_many", boom)
        again = identify_on_domain(tiny_llama, cfg, run_mod.StageFiles(tmp_path / "c"), command="identify",
                                   checkpoint=UnitCheckpoint(tmp_path / "units.json", tiny_llama.fingerprint()))
    assert again.scores == artifact.scores and again.selection == artifact.selection


def test_without_the_filter_the_items_used_still_get_the_preferred_alias(tiny_llama, tmp_path, monkeypatch):
    """--no-filter keeps every pool item, but D, validation and PH3-l (the first `need` items)
    are decoded and get the model's preferred alias (PROTOCOL.md, "answer alias")."""
    decoded = []

    def fake_clean_outputs(lm, examples, max_rows, on_progress=None, engine=None):
        decoded.extend(examples)
        return [" no idea"] * len(examples)

    monkeypatch.setattr(domains, "clean_outputs", fake_clean_outputs)
    marked = lambda lm, exs, outs, **kw: [replace(ex, answers=(*ex.answers, "ALIAS")) for ex in exs]
    monkeypatch.setattr(domains, "prefer_aliases", marked)
    cfg = ReproduceConfig(out_dir=tmp_path, domains=("world_capital",), limit=2, validation_size=3, filter=False,
                          baselines=False)
    splits, _, _, counts = domains.prepare_domains(run_mod.StageRun(tiny_llama, cfg, run_mod.StageFiles(tmp_path / "s")), {"seed": 0})
    wc = splits["world_capital"]
    assert counts["world_capital"]["decoded"] == 4 + 3 == len(decoded) - 2   # D + validation, and the 2 test items
    assert all(ex.answers[-1] == "ALIAS" for ex in (*wc.head_set, *wc.validation, *wc.test))


def test_the_filter_stage_is_keyed_on_the_items_content(tiny_llama, tmp_path, monkeypatch):
    """An alias added to a data file changes the key: the saved answers are not reused."""
    calls = []

    def fake_clean_outputs(lm, examples, max_rows, on_progress=None, engine=None):
        calls.append(len(examples))
        return [f" {ex.answers[0]}" for ex in examples]

    monkeypatch.setattr(domains, "clean_outputs", fake_clean_outputs)
    monkeypatch.setattr(domains, "prefer_aliases", lambda lm, exs, outs, **kw: list(exs))
    cfg = ReproduceConfig(out_dir=tmp_path, domains=("world_capital",), limit=2, validation_size=1, baselines=False)
    state = run_mod.StageFiles(tmp_path / "s")
    sources, _ = domains.domain_sources(cfg)
    domains.prepare_domains(run_mod.StageRun(tiny_llama, cfg, state), {"seed": 0})
    n = len(calls)
    domains.prepare_domains(run_mod.StageRun(tiny_llama, cfg, state), {"seed": 0})
    assert len(calls) == n   # same items: read from the state
    first = sources["world_capital"].test[0]
    changed = {"world_capital": replace(sources["world_capital"], test=(
        replace(first, answers=(*first.answers, "another alias")), *sources["world_capital"].test[1:]))}
    monkeypatch.setattr(domains, "domain_sources", lambda cfg: (changed, {"world_capital": "World Capital"}))
    splits, *_ = domains.prepare_domains(run_mod.StageRun(tiny_llama, cfg, state), {"seed": 0})
    assert len(calls) > n and "another alias" in splits["world_capital"].test[0].answers


def test_a_repeated_test_subject_in_the_authors_layout_is_two_items_in_every_table(shared_data, tiny_llama, tmp_path):
    """Issue 25: the paper's Official Language test split holds Australia twice (two distractors);
    the run used to crash after every stage with "two results for ...". Now the authors' folder
    is read as it is and both items are evaluated, tabulated and reported."""
    factual = authors_layout(shared_data, tmp_path / "data")
    cfg = ReproduceConfig(out_dir=tmp_path / "out", data=factual, limit=3, validation_size=2, filter=False,
                          alphas_positive=(1.0,), alphas_negative=(-1.0,), k=2, baselines=False,
                          bootstrap_resamples=1000)
    result = reproduce(cfg, lm=tiny_llama)
    items = json.loads((tmp_path / "out" / "results.json").read_text())["items"]
    copy = [r for r in items if r["domain"] == "capital_copy" and r["method"] == "Original" and r["conflict_type"] == "clean"]
    assert [r["item"] for r in copy] == ["unfiltered_test#0", "unfiltered_test#1", "unfiltered_test#2"]
    assert copy[0]["subject"] == copy[1]["subject"]
    assert result.table.cells["original"]["capital_copy"]["clean"].n == 3   # the result keys rows, the file titles them
    assert result.splits["capital_copy"]["test"] == 3


def test_every_data_check_runs_before_the_model_loads(shared_data, tmp_path, monkeypatch):
    def no_model(*args, **kwargs):
        raise AssertionError("the model was loaded before the data was checked")

    monkeypatch.setattr(run_mod, "load_model", no_model)
    factual = authors_layout(shared_data, tmp_path / "data")
    bad = factual / "capital_copy_gemma" / "head_size_4" / "unfiltered_test.json"
    rows = json.loads(bad.read_text())
    rows[5]["Coherent Conflict"] = ""
    bad.write_text(json.dumps(rows))
    with pytest.raises(ValueError, match=r"unfiltered_test.json: item 5"):
        reproduce(ReproduceConfig(out_dir=tmp_path / "out", data=factual))
    bad.write_text("[]")
    with pytest.raises(ValueError, match=r"unfiltered_test.json: no items"):
        reproduce(ReproduceConfig(out_dir=tmp_path / "out", data=factual))
    with pytest.raises(FileNotFoundError, match="no ParaConflict domain"):
        reproduce(ReproduceConfig(out_dir=tmp_path / "out", data=tmp_path))


def test_the_beta_minus_grid_is_a_setting_and_reaches_the_tuning(shared_data, tiny_llama, tmp_path):
    """The authors' contextual script tunes beta- down to -5 (PROTOCOL.md): `beta_minus_grid`
    (`--beta-minus-grid`) is the grid the tuning searches, recorded in results.json."""
    data = _two_domain_folder(shared_data, tmp_path / "data")
    cfg = ReproduceConfig(out_dir=tmp_path / "out", data=data, limit=2, validation_size=2, filter=False,
                          alphas_positive=(1.0,), alphas_negative=(-1.0,), k=2, baselines=False,
                          bootstrap_resamples=1000, beta_plus_grid=(0.0, 1.0), beta_minus_grid=(0.0, -5.0))
    result = reproduce(cfg, lm=tiny_llama)
    grid = result.choices["world_capital"]["grid"]
    assert sorted({(g["beta_plus"], g["beta_minus"]) for g in grid}) == [(0.0, -5.0), (0.0, 0.0), (1.0, -5.0),
                                                                          (1.0, 0.0)]
    saved = json.loads((tmp_path / "out" / "results.json").read_text())
    assert saved["protocol"]["beta_grid"] == {"beta_plus": [0.0, 1.0], "beta_minus": [0.0, -5.0]}


def test_reproduce_from_the_command_line_prints_the_tables_and_the_degeneration(shared_data, tmp_path, capsys):
    """`juice reproduce` on a tiny model saved to a folder: the tables, the degeneration table
    (issue 38) and the files it names."""
    import juice.apps.cli as cli
    from conftest import build_tiny

    lm = build_tiny("llama")
    folder = tmp_path / "model"
    lm.model.save_pretrained(folder)
    lm.tokenizer.save_pretrained(folder)
    data = _two_domain_folder(shared_data, tmp_path / "data")
    out = tmp_path / "out"
    assert cli.main(["reproduce", "--model", str(folder), "--data", str(data), "--limit", "2", "--no-filter",
                     "--validation-size", "1", "--k", "1", "--scoring", "attribution", "--no-baselines",
                     "--out", str(out), "--device", "cpu"]) == 0
    printed = capsys.readouterr().out
    assert "Table 1 layout" in printed and "degenerate outputs" in printed and "results.json" in printed
    assert json.loads((out / "results.json").read_text())["degeneration"]["cells"].keys() == {"Original", "JuNE",
                                                                                              "JuICE"}
