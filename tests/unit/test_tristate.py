"""TriState-Bench as juice data (:mod:`juice.data.tristate`): the pool and its passages, the
benchmark's prompts and metric, and the GAPS rule, held to the published files: the rule must
give every published vote, question verdict and fact label of the screened model from its own
recorded responses."""

from __future__ import annotations

import json
from collections import Counter

import pytest
from conftest import SHARED

from juice.data.metrics import METRICS
from juice.data.tristate import (STATES, build_states, context_items, context_prompt, gaps_label, load_tristate,
                                 published_screening, question_prompt, question_verdict, questions_to_ask,
                                 state_files, vote)
from juice.text import first_line_contains, first_line_match, squad_normalize

FOLDER = SHARED / "data" / "tristate"
needs_data = pytest.mark.skipif(not FOLDER.is_dir(), reason="needs ../shared/data/tristate (TriState-Bench's files)")


@pytest.fixture(scope="module")
def facts():
    return load_tristate(FOLDER)


@pytest.fixture(scope="module")
def screening():
    return published_screening(FOLDER)


@needs_data
def test_the_pool_holds_every_fact_once_with_the_passages_the_files_give(facts):
    assert len(facts) == len({f.fact_id for f in facts}) == 3791
    assert Counter(f.answer_type for f in facts) == {"person": 1485, "location": 1088, "scientific_term": 1218}
    assert all(f.answer in f.aliases and len(f.questions) == 3 for f in facts)
    # the passages the published files hold: every fact with a wrong passage has a right one
    assert (sum(bool(f.right_passage) for f in facts), sum(bool(f.wrong_passage) for f in facts)) == (1683, 696)
    assert all(f.right_passage for f in facts if f.wrong_passage)
    assert all(q.endswith("?") for f in facts for q in f.questions)
    # every passage states its answer (the benchmark's own normalization)
    with_right = [f for f in facts if f.right_passage]
    with_wrong = [f for f in facts if f.wrong_passage]
    assert with_right and with_wrong
    assert all(vote(f.right_passage, f.aliases) for f in with_right)
    assert all(vote(f.wrong_passage, [f.wrong_answer]) and f.wrong_answer not in f.aliases for f in with_wrong)


@needs_data
def test_the_prompts_are_the_published_files_prompts_for_every_input(facts):
    by_id = {f.fact_id: f for f in facts}
    seen = 0
    for model, files in state_files(FOLDER).items():
        for state, path in files.items():
            for line in map(json.loads, path.read_text(encoding="utf-8").splitlines()):
                fact = by_id[line["fact_id"]]
                assert line["gold_answers"] == list(fact.aliases)
                if line["assigned_process"] == 1:
                    assert line["context_string"] == question_prompt(fact.questions[0])
                else:
                    passage = fact.wrong_passage if state == "resistance" else fact.right_passage
                    assert line["context_string"] == context_prompt(passage, fact.questions[0]), (model, state)
                seen += 1
    assert seen == 8 * 3 * 800


@needs_data
def test_gaps_gives_the_published_votes_verdicts_and_labels_from_the_recorded_responses(facts, screening):
    """Every recorded response's vote, every question's verdict (asked while
    :func:`questions_to_ask` says so) and every fact's label equal the published screening's."""
    votes = labels = 0
    for fact in facts:
        record = screening[fact.fact_id]
        verdicts = []
        for q, responses in enumerate(record["responses"]):
            if not questions_to_ask(verdicts):
                assert record["verdicts"][q] == "skipped" and not responses
                continue
            mine = [vote(r, fact.aliases) for r in responses]
            assert mine == record["votes"][q], (fact.fact_id, q)
            votes += len(mine)
            for k in range(1, len(mine)):   # no verdict before the last response: it stopped there
                assert question_verdict(mine[:k]) is None, (fact.fact_id, q, k)
            verdicts.append(question_verdict(mine))
            assert verdicts[-1] == record["verdicts"][q], (fact.fact_id, q)
        assert gaps_label(verdicts) == record["prior"], fact.fact_id
        labels += 1
    assert (votes, labels) == (103348, 3791)


@needs_data
def test_the_published_states_are_drawn_from_the_states_built_from_the_published_labels(facts, screening):
    """The screened model's 400 inputs per state are facts of the states :func:`build_states`
    makes from its labels, with the same passage (the wrong one in resistance)."""
    states = build_states(facts, {fid: r["prior"] for fid, r in screening.items()})
    files = state_files(FOLDER)["gemma-2-9b-instruct"]
    for state, items in states.items():
        mine = {item.fact.fact_id: item for item in items}
        published = [json.loads(t) for t in files[state].read_text(encoding="utf-8").splitlines()]
        published = [line for line in published if line["assigned_process"] == 0]
        assert len(published) == 400 and all(line["fact_id"] in mine for line in published), state
        assert all(mine[line["fact_id"]].context_prompt() == line["context_string"] for line in published)
    assert [i.fact for i in states["agreement"]] == [i.fact for i in states["resistance"]]
    assert set(STATES) == set(states)


def test_the_gaps_rule_stops_where_its_anchor_is_contradicted():
    assert question_verdict([True] + [False] * 3 + [True] * 6) == "matched"   # 7 of 10
    assert question_verdict([True] + [False] * 4) == "uncertain"
    assert question_verdict([False] + [True] + [False] * 8) == "missed"   # 1 of 10
    assert question_verdict([False, True, False, True]) == "uncertain"
    assert question_verdict([True] * 9) is None
    assert questions_to_ask([]) and questions_to_ask(["missed", "missed"])
    assert not questions_to_ask(["matched", "missed"]) and not questions_to_ask(["uncertain"])
    assert gaps_label(["matched", "matched"]) == "P_uncertain"   # a question not asked is not matched


def test_the_metric_reads_the_first_line_and_normalizes_as_squad():
    assert squad_normalize("  The Hague-Gaposchkin's!  ") == "haguegaposchkins"
    assert first_line_match(" Paris.\nThe capital of France.", ["Paris"])
    assert not first_line_match("It is Paris.", ["Paris"]) and first_line_contains("It is Paris.", ["Paris"])
    assert not first_line_contains("Lyon\nParis", ["Paris"])   # the first line only
    assert vote("Lyon\nParis", ["Paris"])   # screening reads the whole response
    assert vote("Parisian", ["Paris"])      # a substring, as the published votes count it
    assert METRICS["tristate"].match is first_line_match and METRICS["tristate"].new_tokens == 32


@needs_data
def test_a_models_states_become_context_items_scored_on_the_true_answer(facts, screening):
    """Agreement and correction are gold passages, resistance a conflicting one whose passage
    answer is the wrong one; under the trust-memory objective every state's target is the true
    answer, the benchmark's gold; one question-alone item per fact."""
    states = build_states(facts, {fid: r["prior"] for fid, r in screening.items()})
    items = context_items(states).items
    by_state = {s: [i for i in items if i.variant == s] for s in STATES}
    assert {s: len(v) for s, v in by_state.items()} == {s: len(v) for s, v in states.items()}
    assert {i.context_type for i in by_state["resistance"]} == {"conflicting"}
    assert {i.context_type for i in by_state["agreement"] + by_state["correction"]} == {"gold"}
    by_id = {f.fact_id: f for f in facts}
    for item in items:
        fact = by_id[item.uid]
        assert item.target("trust_memory") == fact.aliases and item.metric == "tristate"
        assert item.question == question_prompt(fact.questions[0])
        if item.variant == "resistance":
            assert item.context_answers == (fact.wrong_answer,) and item.prompt == context_prompt(
                fact.wrong_passage, fact.questions[0])
    none = [i for i in items if i.context_type == "none"]
    assert len(none) == len({i.uid for i in items}) and all(i.prompt == i.question for i in none)
