"""Your own data end to end (`juice.workflow`; `juice identify/tune/evaluate --data`): Stage 1 on
rows, the beta grid's choice, PH3's k, the one row runner (batched = one row at a time, Original
= plain greedy decoding), tables with intervals, and the tuned heads file driving the Steerer."""

from __future__ import annotations

import json
import math

import pytest
from conftest import build_tiny

from juice.baselines.cad import CadPolicy
from juice.baselines.ph3 import heads_to_prune
from juice.engine import greedy_generate
from juice.data.metrics import is_correct
from juice.recipe import Method
from juice.pipeline.run import ReproduceConfig
from juice.pipeline.stages import score_prompts
from juice.stage1 import ScoringPrompt, load_heads, save_heads
from juice.steerer import Steerer
from juice.steering import ORIGINAL, JuICE, JuNE, UntunedBetasWarning
from juice.tokens import answer_first_token
from juice.userdata import ConflictRow, load_rows
from juice.workflow import (
    evaluate_file,
    evaluate_rows,
    evaluation_methods,
    identify,
    instructed_prompt,
    parse_direction,
    ph3_knockout_scores,
    tune,
)

ROWS = [
    {"prompt": "the capital of france is", "target": "paris", "other": "berlin", "conflict_type": "clean"},
    {"prompt": "the capital of france is berlin . the capital of france is", "target": "paris", "other": "berlin",
     "conflict_type": "substitution", "aliases": ["rome"]},
    {"prompt": "the capital of japan is tokyo . the capital of japan is", "target": "tokyo", "other": "madrid",
     "conflict_type": "substitution", "question": "the capital of japan is"},
    {"prompt": "the capital of spain is", "target": "madrid", "other": "rome", "conflict_type": "clean",
     "question": "the capital of spain is"},
]


@pytest.fixture(scope="module")
def lm():
    return build_tiny("llama")


@pytest.fixture
def data(tmp_path):
    path = tmp_path / "rows.jsonl"
    path.write_text("\n".join(json.dumps(r) for r in ROWS) + "\n")
    return path


def test_directions_have_their_usual_names():
    assert parse_direction("context") == parse_direction("contextual") == "contextual"
    assert parse_direction("Memory") == parse_direction("parametric") == "parametric"
    with pytest.raises(ValueError, match="direction"):
        parse_direction("sideways")


def test_identify_on_rows_is_stage1_on_their_prompts(lm, data):
    artifact = identify(lm, data, direction="context", k=2)
    rows = load_rows(data)
    prompts = [ScoringPrompt(r.prompt, answer_first_token(lm.tokenizer, r.prompt, r.target), r.conflict_type)
               for r in rows]
    scores, selection = score_prompts(lm, ReproduceConfig(k=2), prompts)
    assert artifact.selection == selection and artifact.direction == "contextual"
    assert artifact.data["rows"] == 4 and artifact.data["conflict_types"] == ["clean", "substitution"]
    assert artifact.head_set[1]["aliases"] == ["rome"]


def test_original_rows_are_plain_greedy_decoding_and_scored_by_exact_match(lm, data):
    rows = load_rows(data)
    results = evaluate_rows(lm, rows, {"Original": ORIGINAL})
    texts = greedy_generate(lm, [r.prompt for r in rows], 10, stop_at_eos=True).texts   # texts end at EOS
    assert [r.output for r in results] == texts
    assert [r.correct for r in results] == [is_correct(t, row.answers) for t, row in zip(texts, rows)]
    assert [r.domain for r in results] == ["clean", "substitution", "substitution", "clean"]


def test_batched_rows_equal_one_row_at_a_time(lm, data):
    rows = load_rows(data)
    artifact = identify(lm, rows, k=2)
    methods = {"Original": Method(ORIGINAL), "Prompt": Method(ORIGINAL, instructed=True),
               "JuICE": Method(JuICE(lm, artifact.selection, 3, -1)), "JuNE": Method(JuNE(lm, artifact.selection, 2, 0)),
               "CAD": Method(contrast=CadPolicy(1.0))}
    cad_rows = [r for r in rows if r.question]
    together = evaluate_rows(lm, cad_rows, methods, max_rows=3)
    alone = [res for row in cad_rows for res in evaluate_rows(lm, [row], methods)]
    assert [(r.method, r.output) for r in together] == [(r.method, r.output) for r in alone]
    for a, b in zip(together, alone):
        assert a.p_parametric == pytest.approx(b.p_parametric, abs=1e-5)
    with pytest.raises(ValueError, match="question"):
        evaluate_rows(lm, rows, {"CAD": Method(contrast=CadPolicy(1.0))})


def test_the_prompt_baseline_uses_the_papers_forms():
    clean, subst = ConflictRow("a is", "b", conflict_type="clean"), ConflictRow("a is", "b", conflict_type="x")
    coherent = ConflictRow("a is", "b", conflict_type="coherent")
    assert instructed_prompt(clean, "parametric") == "a is"
    assert instructed_prompt(subst, "parametric").startswith("Ignore the preceding statement")
    assert instructed_prompt(coherent, "parametric").endswith(" Context: a is")
    assert instructed_prompt(clean, "contextual").startswith("Please complete the sentence")


def test_tune_picks_the_grid_best_and_the_heads_file_carries_it(lm, data, tmp_path):
    artifact = identify(lm, data, k=2)
    chosen = tune(lm, artifact, data, beta_plus_grid=(0.0, 2.0, 5.0), beta_minus_grid=(0.0, -2.0))
    rows = load_rows(data)
    for name, preset in (("juice", JuICE), ("june", JuNE)):
        grid = chosen[name].grid
        assert len(grid) == 6
        assert all(g["eligible"] == (g["degeneration"] <= chosen[name].original_degeneration + 10) for g in grid)
        grid = [g for g in grid if g["eligible"]]   # the degeneration guard (issue 38)
        best = max(g["accuracy"] for g in grid)
        assert chosen[name].accuracy == pytest.approx(best, abs=1e-3)
        first_best = next(g for g in grid if g["accuracy"] == best and g["p_target"] == max(
            h["p_target"] for h in grid if h["accuracy"] == best))
        assert (chosen[name].beta_plus, chosen[name].beta_minus) == (first_best["beta_plus"], first_best["beta_minus"])
        # the grid's accuracy at the chosen point is what the runner gives there: mean over labels
        res = evaluate_rows(lm, rows, {"x": preset(lm, artifact.selection, chosen[name].beta_plus,
                                                    chosen[name].beta_minus)})
        per = {g: [r.correct for r in res if r.domain == g] for g in ("clean", "substitution")}
        assert chosen[name].accuracy == pytest.approx(100 * sum(sum(v) / len(v) for v in per.values()) / 2)
    path = tmp_path / "heads.json"
    save_heads(artifact, path)
    loaded = load_heads(path, lm)
    assert loaded.tuned["juice"]["beta_plus"] == chosen["juice"].beta_plus and loaded.tuned["data"]["rows"] == 4
    steerer = Steerer(lm, loaded, method="june")
    assert (steerer.beta_plus, steerer.beta_minus) == (chosen["june"].beta_plus, chosen["june"].beta_minus)
    assert Steerer(lm, loaded, method="june", beta_plus=1.5).beta_plus == 1.5   # given betas win
    with pytest.warns(UntunedBetasWarning):
        assert Steerer(lm, artifact.selection).beta_plus == 2.0                  # untuned: 2 and 0


def test_tune_never_chooses_a_setting_that_degenerates_more_than_original_plus_the_margin(lm, data, monkeypatch):
    """Issue 38: the most accurate setting repeats itself on every row while Original never
    does: it is recorded (degeneration 100, not eligible) and the best eligible one is chosen;
    where every setting exceeds the margin, the least degenerate ones compete."""
    import juice.workflow as workflow
    from juice.eval.runner import ItemResult

    def fake(lm, rows, steerings, **kwargs):
        out = []
        for i, row in enumerate(rows):
            for label in steerings:
                bp = None if label == "original" else float(label.split(":")[1])
                text = " paris paris paris paris paris" if bp == 5.0 else " paris is the capital"
                right = bp == 5.0 or (bp == 2.0 and i % 2 == 0)
                out.append(ItemResult(row.conflict_type, str(i), row.conflict_type, label, text, right, False,
                                      0.5 + (bp or 0) / 100, 0.1))
        return out

    monkeypatch.setattr(workflow, "evaluate_rows", fake)
    artifact = identify(lm, data, k=2)
    chosen = tune(lm, artifact, data, methods=["juice"], beta_plus_grid=(0.0, 2.0, 5.0), beta_minus_grid=(0.0,))
    c = chosen["juice"]
    assert (c.beta_plus, c.original_degeneration, c.degeneration) == (2.0, 0.0, 0.0)
    five = next(g for g in c.grid if g["beta_plus"] == 5.0)
    assert five["accuracy"] == 100.0 and five["degeneration"] == 100.0 and not five["eligible"]
    assert artifact.tuned["juice"]["degeneration_margin"] == 10.0
    chosen = tune(lm, artifact, data, methods=["juice"], beta_plus_grid=(5.0,), beta_minus_grid=(0.0,))
    assert chosen["juice"].beta_plus == 5.0   # nothing else to choose: the least degenerate


def test_ph3_k_is_tuned_on_knockout_scores(lm, data):
    artifact = identify(lm, data, k=2)
    chosen = tune(lm, artifact, data, methods=["ph3"], ks=(1, 3))
    scores = ph3_knockout_scores(lm, load_rows(data), "parametric")
    k = chosen["ph3"].k
    assert k in (1, 3) and chosen["ph3"].pruned == [str(h) for h in heads_to_prune(scores, "parametric", k)]
    methods, settings = evaluation_methods(lm, artifact, ["ph3"])
    assert settings["ph3"]["k"] == k
    with pytest.raises(ValueError, match="other"):
        ph3_knockout_scores(lm, [ConflictRow("a is", "paris")], "parametric")


def test_evaluation_methods_refuse_what_they_cannot_run(lm):
    with pytest.raises(ValueError, match="unknown method"):
        evaluation_methods(lm, None, ["juice2"])
    with pytest.raises(ValueError, match="heads file"):
        evaluation_methods(lm, None, ["juice"])
    artifact = identify(lm, [ConflictRow("the capital of france is", "paris")], k=1)
    with pytest.raises(ValueError, match="juice tune --methods ph3"):
        evaluation_methods(lm, artifact, ["ph3"])
    _, settings = evaluation_methods(lm, artifact, ["juice"], beta_minus=-1)
    assert settings["juice"] == {"beta_plus": 2.0, "beta_minus": -1, "source": "given"}


def test_evaluate_file_table_has_n_and_the_mean_over_labels(lm, data):
    artifact = identify(lm, data, k=2)
    report = evaluate_file(lm, artifact, data, ["original", "prompt", "juice"], resamples=1000)
    assert report.methods == ["original", "prompt", "juice"]   # by key; the files title them
    cells = report.table.cells["juice"]
    assert cells["clean"]["all"].n == 2 and cells["Average"]["all"].n == 4
    assert cells["Average"]["all"].mean == pytest.approx((cells["clean"]["all"].mean
                                                          + cells["substitution"]["all"].mean) / 2)
    assert "juice - original" in report.table.differences
    assert report.settings["juice"]["source"] == "default"
    payload = report.to_json()
    assert len(payload["results"]) == 12 and payload["data"]["direction"] == "parametric"
    # the degeneration table: the share of each method's outputs that repeat themselves, with n
    from juice.eval.degeneration import is_degenerate

    for m in report.methods:
        cell = report.degeneration.cells[m]["Average"]["all"]
        per_label = [[is_degenerate(r.output) for r in report.results if r.method == m and r.domain == g]
                     for g in ("clean", "substitution")]
        assert cell.n == 4 and cell.mean == pytest.approx(sum(sum(v) / len(v) for v in per_label) / 2)
    assert payload["degeneration"]["cells"].keys() == {"Original", "Prompt", "JuICE"}   # titled
    assert payload["methods"] == ["Original", "Prompt", "JuICE"] and "JuICE" in payload["settings"]
    assert {r["method"] for r in payload["results"]} == {"Original", "Prompt", "JuICE"}
    assert all(math.isfinite(r["p_context"]) for r in payload["results"])   # every row has `other`


def test_tune_and_evaluate_from_the_command_line(lm, data, tmp_path, capsys):
    import juice.apps.cli as cli

    folder = tmp_path / "model"
    lm.model.save_pretrained(folder)
    lm.tokenizer.save_pretrained(folder)
    heads = tmp_path / "heads.json"
    assert cli.main(["identify", "--model", str(folder), "--data", str(data), "--out", str(heads), "--k", "2"]) == 0
    assert cli.main(["tune", "--model", str(folder), "--heads", str(heads), "--data", str(data)]) == 0
    assert set(load_heads(heads).tuned) == {"juice", "june", "data"}
    out = tmp_path / "eval"
    assert cli.main(["evaluate", "--model", str(folder), "--heads", str(heads), "--data", str(data),
                     "--methods", "original,juice,june", "--out", str(out), "--limit", "3"]) == 0
    saved = json.loads((out / "evaluation.json").read_text())
    assert saved["settings"]["JuICE"]["source"] == "tuned"
    assert saved["data"]["rows"] == 3 and saved["data"]["first_rows_of"] == 4 and len(saved["results"]) == 9
    assert "| Original |" in (out / "evaluation.md").read_text()
    capsys.readouterr()
    assert cli.main(["evaluate", "--model", str(folder), "--data", str(data), "--methods", "juice"]) == 2
    assert "needs a heads file" in capsys.readouterr().err
