"""GAPS re-screening on a model (:mod:`juice.pipeline.tristate`): the rule applied to the model's
own greedy and sampled answers, each sample's seed its own, a killed screening resumed."""

from __future__ import annotations

import pytest
from conftest import build_tiny

from juice.data.tristate import TriStateFact, gaps_label, question_verdict, vote
from juice.engine import Stream, generate
from juice.engine.sampling import Sampling
from juice.pipeline.tristate import sample_seed, screen, screening_counts
from juice.steering import ORIGINAL


def _facts(lm, n: int = 4) -> list[TriStateFact]:
    """Facts whose answers are what the tiny model says greedily to the first paraphrase (so
    that some votes are right) or words it never says."""
    words = "paris tokyo rome berlin madrid lisbon vienna oslo prague dublin athens cairo lima quito seoul delhi".split()
    facts = []
    for i in range(n):
        questions = tuple(f"w{i} {w} the capital of city is ?" for w in words[i:i + 3])
        facts.append(TriStateFact(f"person_{i}", "person", "x", ("x",), questions))
    greedy = generate(lm, [f"Answer the following question: \nQuestion: {f.questions[0]} ?\nAnswer:" for f in facts],
                      [Stream(i, ORIGINAL) for i in range(n)], 4, stop_at_eos=True).texts
    return [TriStateFact(f.fact_id, f.answer_type, text.split()[0] if i % 2 == 0 and text.split() else "zzz",
                         (text.split()[0] if i % 2 == 0 and text.split() else "zzz",), f.questions)
            for i, (f, text) in enumerate(zip(facts, greedy))]


@pytest.fixture(scope="module")
def tiny():
    return build_tiny("llama")


def test_screening_applies_the_rule_to_the_models_own_greedy_and_sampled_answers(tiny):
    facts = _facts(tiny)
    records = screen(tiny, facts, seed=3, max_new_tokens=4)
    assert set(records) == {f.fact_id for f in facts}
    for f in facts:
        r = records[f.fact_id]
        for q, responses in enumerate(r["responses"]):
            if q >= len(r["verdicts"]):
                assert responses == []   # not asked
                continue
            assert r["votes"][q] == [vote(t, f.aliases) for t in responses]
            assert question_verdict(r["votes"][q]) == r["verdicts"][q]
            assert all(question_verdict(r["votes"][q][:k]) is None for k in range(1, len(responses)))
            prompt = f"Answer the following question: \nQuestion: {f.questions[q]} ?\nAnswer:"
            greedy = generate(tiny, [prompt], [Stream(0, ORIGINAL)], 4, stop_at_eos=True).texts[0]
            assert responses[0] == greedy   # the anchor is the greedy answer
            if len(responses) > 1:   # a sample is the stream of its own seed, decoded alone
                alone = generate(tiny, [prompt], [Stream(0, ORIGINAL, Sampling(1.0, 0, 1.0, sample_seed(3, f.fact_id, q, 1)))],
                                 4, stop_at_eos=True).texts[0]
                assert responses[1] == alone
        assert r["prior"] == gaps_label(r["verdicts"])
    assert any(records[f.fact_id]["votes"][0][0] for f in facts)   # the greedy-anchored facts vote right
    counts = screening_counts(records, facts)
    assert counts["total"] == 4 == counts["P_right"] + counts["P_wrong"] + counts["P_uncertain"]


def test_labels_do_not_depend_on_the_facts_screened_beside_them_and_a_screening_resumes(tiny, tmp_path):
    facts = _facts(tiny)
    together = screen(tiny, facts, seed=1, max_new_tokens=4, checkpoint=tmp_path / "gaps.json")
    alone = screen(tiny, facts[1:2], seed=1, max_new_tokens=4)
    assert alone[facts[1].fact_id] == together[facts[1].fact_id]

    import juice.pipeline.tristate as module

    def refuse(*args, **kwargs):
        raise AssertionError("a saved round was decoded again")

    original, module._round = module._round, refuse
    try:
        assert screen(tiny, facts, seed=1, max_new_tokens=4, checkpoint=tmp_path / "gaps.json") == together
    finally:
        module._round = original


def test_a_models_states_decode_through_the_context_type_evaluation_scored_by_the_benchmarks_metric(tiny):
    """The states built from a screening run through juice's context-type evaluation (every
    method of the registry could): each state's outputs are scored on the true answer with the
    benchmark's first-line exact match, and agreement and correction items stay apart."""
    from juice.data.tristate import build_states, context_items
    from juice.steering import ORIGINAL, JuICE
    from juice.interventions import Head, HeadSelection
    from juice.text import first_line_match
    from juice.when_to_steer.evaluation import evaluate_context_types

    base = _facts(tiny)
    facts = [TriStateFact(f.fact_id, f.answer_type, f.answer, f.aliases, f.questions, f"w{i} passage {f.answer} .",
                          f"w{i} passage other .", "other") for i, f in enumerate(base)]
    priors = {facts[0].fact_id: "P_right", facts[1].fact_id: "P_wrong", facts[2].fact_id: "P_uncertain"}
    states = build_states(facts, priors)
    assert {s: [i.fact.fact_id for i in v] for s, v in states.items()} == {
        "correction": ["person_1"], "resistance": ["person_0"], "agreement": ["person_0"]}
    items = context_items(states).items
    methods = {"Original": ORIGINAL, "JuICE": JuICE(tiny, HeadSelection((Head(1, 2),), (Head(0, 1),)), 2.0, -1.0)}
    results = evaluate_context_types(tiny, items, methods)
    assert len(results) == len(items) * 2
    assert {r.item for r in results} == {"person_0/agreement", "person_0/resistance", "person_1/correction",
                                         "person_0", "person_1"}
    by_id = {f.fact_id: f for f in facts}
    for r in results:
        assert r.follows_parametric == first_line_match(r.output, by_id[r.subject].aliases)


def _states(tiny, n: int = 6):
    from juice.data.tristate import build_states

    base = _facts(tiny, n)
    facts = [TriStateFact(f.fact_id, f.answer_type, f.answer, f.aliases, f.questions, f"w{i} passage {f.answer} .",
                          f"w{i} passage other .", "other") for i, f in enumerate(base)]
    priors = {f.fact_id: ("P_right", "P_wrong")[i % 2] for i, f in enumerate(facts)}
    return build_states(facts, priors)


def test_the_measurement_runs_every_method_on_every_state_and_resumes_from_its_units(tiny, tmp_path, monkeypatch):
    """`measure` decodes each state's items with every named method (the none items with
    Original only, for Question-only), a killed measurement resumes from its saved units with
    nothing decoded again, and the results equal one run."""
    import juice.pipeline.tristate as tristate
    from juice.pipeline.tristate import measure

    states = _states(tiny)
    names = ["original", "cad", "grd", "cocoa"]
    items, results = measure(tiny, states, [], names, chunk=2, checkpoint=tmp_path / "units.json")
    stated = [i for i in items if i.context_type != "none"]
    assert len(stated) == 3 + 3 + 3
    methods = {"original", "cad", "grd", "cocoa", "Question-only"}   # row keys (titled in the record)
    assert {r.method for r in results} == methods
    for m in methods - {"Question-only"}:
        assert sorted(r.item for r in results if r.method == m and r.conflict_type != "none") == sorted(
            f"{i.uid}/{i.variant}" for i in stated)
    assert not any(r.conflict_type == "none" and r.method != "original" for r in results)
    calls = []
    real = tristate.evaluate_context_types
    monkeypatch.setattr(tristate, "evaluate_context_types", lambda *a, **k: calls.append(1) or real(*a, **k))
    again = measure(tiny, states, [], names, chunk=2, checkpoint=tmp_path / "units.json")[1]
    assert calls == [] and again == results


def test_the_state_table_scores_each_state_on_the_true_answer_with_intervals_and_a_verdict():
    """The table's exact match is the benchmark's (first line, SQuAD normalization, true answer
    in every state), beside juice's first-words rule; the verdict names each state's best
    method, the methods within its interval, and each method against GRD."""
    from juice.data.context_types import ContextItem
    from juice.eval.runner import ItemResult
    from juice.pipeline.tristate import state_table, titled_verdict, verdict

    items, results = [], []
    outputs = {"A": "Paris\nmore", "B": "It is Paris, yes", "grd": "Rome"}
    for k in range(40):
        for state, kind in (("correction", "gold"), ("resistance", "conflicting")):
            item = ContextItem("tristate/location", f"location_{k}", kind, "p", "q", ("Paris",), ("Paris",)
                               if kind == "gold" else ("Rome",), "tristate", state)
            items.append(item)
            for m, out in outputs.items():
                results.append(ItemResult(item.source, item.uid, kind, m, out if k % 4 else "Lyon", False, False,
                                          0.0, 0.0, False, item=f"{item.uid}/{state}"))
    table = state_table(items, results, resamples=1000)
    a, b = table["correction"]["A"], table["correction"]["B"]
    assert a["em"]["mean"] == 0.75 == a["first_words"]["mean"] and a["em"]["n"] == 40
    assert b["em"]["mean"] == 0.0 and b["first_words"]["mean"] == 0.75   # "It is Paris": not the first line
    assert table["resistance"]["grd"]["em"]["mean"] == 0.0
    v = verdict(table, resamples=1000)
    assert v["best"] == {"correction": "A", "resistance": "A"}
    assert v["within"]["correction"] == ["A"] and v["within_every_state"] == ["A"]
    assert v["versus"]["A - grd"]["correction"]["mean"] == 0.75
    assert titled_verdict(v)["versus"]["A - GRD"] == v["versus"]["A - grd"]   # the record's form


def test_the_benchmark_screens_tunes_auto_on_validation_facts_and_scores_the_test_facts_only(tiny, tmp_path,
                                                                                           monkeypatch):
    """`run_benchmark` end to end on the tiny model: the model is screened (no labels given),
    auto is tuned on the validation facts' items only and every method, auto included, is
    scored on the test facts only; a second run resumes every stage with nothing decoded again."""
    import dataclasses

    from helpers.auto import tiny_heads
    import juice.pipeline.tristate as tristate
    from juice.pipeline.tristate import fact_split, run_benchmark

    base = _facts(tiny, 12)
    facts = [TriStateFact(f.fact_id, f.answer_type, f.answer, f.aliases, f.questions, f"w{i} passage {f.answer} .",
                          f"w{i} passage other .", "other") for i, f in enumerate(base)]
    heads = dataclasses.replace(tiny_heads(tiny), direction="parametric")
    tuned_on = []
    real_tune = tristate.tune_auto
    monkeypatch.setattr(tristate, "tune_auto", lambda lm, a, items, **k: tuned_on.append(items) or real_tune(lm, a, items, **k))
    monkeypatch.setattr(tristate, "screen", lambda *a, **k: _screen_fast(*a, **k))
    result = run_benchmark(tiny, facts, [heads], tmp_path, names=("original", "grd"), share=0.5, resamples=1000)
    assert result["counts"]["total"] == 12
    test_facts = {f.fact_id for f in facts if fact_split(f.fact_id, 0.5) == "test"}
    assert 0 < len(test_facts) < 12
    assert {i.uid for i in tuned_on[0]} <= {f.fact_id for f in facts} - test_facts
    for state, rows in result["table"].items():
        assert set(rows) == {"Original", "GRD", "auto-mem", "Question-only"}
        assert set(result["facts"][state]) <= test_facts
    assert result["auto"] is not None
    monkeypatch.setattr(tristate, "evaluate_context_types", lambda *a, **k: pytest.fail("decoded again"))
    monkeypatch.setattr(tristate, "tune_auto", lambda *a, **k: pytest.fail("tuned again"))
    again = run_benchmark(tiny, facts, [dataclasses.replace(tiny_heads(tiny), direction="parametric")], tmp_path,
                          names=("original", "grd"), share=0.5, resamples=1000)
    assert again["table"] == result["table"] and again["auto"] == result["auto"]


def _screen_fast(lm, facts, **kwargs):
    """The screening with 2 new tokens (the tiny model's labels, quickly); checkpointed as asked."""
    return screen(lm, facts, **{**kwargs, "max_new_tokens": 2})


def test_juice_evaluate_runs_the_benchmark_from_its_folder_and_resumes(tmp_path):
    """`juice evaluate --data <TriState folder>` screens the model, scores the test facts and
    writes tristate.json and tristate.md; run again, it resumes with the same result; an unknown
    method is refused in one line before the model loads."""
    import json

    from typer.testing import CliRunner

    from helpers.auto import tiny_model_and_heads
    from helpers.tristate import write_tristate
    from juice.apps.cli import app

    folder, _ = tiny_model_and_heads(tmp_path)
    lm = build_tiny("llama")
    facts = [TriStateFact(f.fact_id, f.answer_type, f.answer, f.aliases, f.questions, f"w{i} passage {f.answer} .",
                          f"w{i} passage other .", "other") for i, f in enumerate(_facts(lm, 6))]
    data = write_tristate(tmp_path / "TriState", facts)
    args = ["evaluate", "--model", str(folder), "--device", "cpu", "--data", str(data), "--methods", "original,cad,grd",
            "--out", str(tmp_path / "out")]
    first = CliRunner().invoke(app, args)
    assert first.exit_code == 0, first.output
    result = json.loads((tmp_path / "out" / "tristate.json").read_text())
    assert result["counts"]["total"] == 6 and "best" in result["verdict"]
    assert "| method |" in (tmp_path / "out" / "tristate.md").read_text()
    again = CliRunner().invoke(app, args)
    assert again.exit_code == 0 and json.loads((tmp_path / "out" / "tristate.json").read_text()) == result
    bad = CliRunner().invoke(app, [*args[:-4], "--methods", "original,magic"])
    assert bad.exit_code == 2 and "unknown method 'magic'" in bad.output
