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
    words = "paris tokyo rome berlin madrid lisbon vienna oslo".split()
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
