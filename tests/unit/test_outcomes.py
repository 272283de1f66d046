"""A study's outcomes (:mod:`juice.when_to_steer.outcomes`): what the offline analyses read."""

from __future__ import annotations

from helpers.outcomes import synthetic


def test_outcomes_survive_json_and_select_by_half():
    from juice.when_to_steer.outcomes import Outcomes

    o = synthetic()
    again = Outcomes.from_json(o.to_json())
    assert again.verdicts == o.verdicts and again.half == o.half and again.betas == o.betas
    assert again.signal == [round(x, 7) for x in o.signal]
    test = o.where(half="test")
    assert set(test.half) == {"test"} and len(test) == len(o) // 2
    assert Outcomes.concatenate([o.where(half="validation"), test]).verdicts["use"]["Original"] == \
        [*o.where(half="validation").verdicts["use"]["Original"], *test.verdicts["use"]["Original"]]


def test_a_question_is_known_where_the_question_alone_states_the_true_answer():
    o = synthetic(right=lambda m, s, q, t: q % 3 == 0)
    known = o.known()
    assert known == [int(q) % 3 == 0 for q in o.question]
    assert any(known) and not all(known)
