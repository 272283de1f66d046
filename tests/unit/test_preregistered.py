"""The pre-registered analysis (:mod:`juice.when_to_steer.preregistered`): the plan is fixed and
hashed, the best static method comes from training items only, every design and procedure is
reported."""

from __future__ import annotations

import pytest

from helpers.outcomes import synthetic


def test_the_plan_is_hashed_and_bounded():
    from juice.when_to_steer.preregistered import PLAN, Plan, analyze

    assert len(PLAN.digest()) == 64 and PLAN.digest() == Plan().digest()
    assert Plan(folds=4).digest() != PLAN.digest()
    with pytest.raises(ValueError, match="policies"):
        analyze({"x": synthetic()}, Plan(max_policies=3))


def test_the_best_static_method_is_chosen_on_the_training_items():
    """Training items favour Prompt-mem, held-out ones JuICE: the held-out comparison is against
    Prompt-mem (choosing on the held-out items would pick JuICE)."""
    from juice.when_to_steer.preregistered import best_static, fit_and_route

    def right(m, s, q, t):
        favoured = "prompt-mem" if q % 2 == 0 else "juice-ctx"
        return m == favoured

    o = synthetic(right=right)
    train, held = o.where(half="validation"), o.where(half="test")
    assert best_static(train) == "prompt-mem" and best_static(held) == "juice-ctx"
    auto, chosen, best = fit_and_route(train, held, ())
    assert chosen == "prompt-mem" and not any(best)
    assert auto == [bool(v) for v in held.verdicts["use"]["original"]]   # no candidate right on train: Original


def test_auto_routes_to_the_candidate_its_gate_picks():
    """JuICE is right on gold and conflicting, the question alone elsewhere: the fit learns the
    lexical gate (1 on relevant passages, 0.2 on the others) and is right everywhere held out."""
    from juice.when_to_steer.preregistered import fit_and_route

    def right(m, s, q, t):
        if t in ("gold", "conflicting"):
            return m in ("juice-ctx", "juice/2-ctx")
        return m in ("Question-only", "original") if t == "none" else m == "Question-only"

    o = synthetic(right=right)
    auto, chosen, best = fit_and_route(o.where(half="validation"), o.where(half="test"),
                                       ("question_words_in_passage",))
    assert all(auto) and chosen in ("juice-ctx", "Question-only") and not all(best)
    no_gate, _, _ = fit_and_route(o.where(half="validation"), o.where(half="test"), ())
    assert not all(no_gate)


def test_every_design_and_procedure_is_reported_with_its_interval():
    from juice.when_to_steer.preregistered import PLAN, analyze, estimate_markdown

    out = analyze({"one": synthetic(sources=("a",)), "two": synthetic(sources=("b", "c"), seed=1)})
    got = {(e["dataset"], e["design"], e["procedure"]) for e in out["estimates"]}
    for procedure in PLAN.procedures:
        for dataset in ("one", "two"):
            assert (dataset, "validation -> test", procedure) in got and (dataset, "5-fold by question", procedure) in got
        assert ("two", "leave one source out", procedure) in got and ("one", "leave one source out", procedure) not in got
        assert ("one -> two", "across datasets", procedure) in got and ("two -> one", "across datasets", procedure) in got
    for e in out["estimates"]:
        assert e["low"] <= e["difference"] <= e["high"] and e["questions"] > 0
        assert e["difference"] == pytest.approx(e["auto"] - e["best_static_mean"], abs=0.02)
    assert out["plan_sha256"] == PLAN.digest()
    assert "**auto**" in estimate_markdown(out)


def test_prompt_toward_memory_is_auto_s_candidate_where_the_study_decoded_it():
    """Issue 77, item 5: Prompt-mem, right on every item held out and on training, is the best
    static method; outcomes written before it was a candidate list it once the plan's candidates
    are read (with_candidates), and auto then picks it and ties it, where without it auto loses."""
    from juice.when_to_steer.preregistered import PLAN, fit, fit_and_route, with_candidates

    def right(m, s, q, t):
        return m == "prompt-mem" or (t == "none" and m in ("original", "Question-only"))

    o = synthetic(right=right)
    assert "prompt-mem" not in o.candidates and "prompt-mem" in PLAN.candidates
    listed = with_candidates(o)
    assert listed.candidates["prompt-mem"] == "prompt-mem" and set(o.candidates) < set(listed.candidates)
    assert with_candidates(listed) == listed
    without, chosen, best = fit_and_route(o.where(half="validation"), o.where(half="test"), ())
    assert chosen == "prompt-mem" and all(best) and not all(without)
    got, chosen, best = fit_and_route(listed.where(half="validation"), listed.where(half="test"), ())
    assert chosen == "prompt-mem" and all(got) == all(best) is True
    assert "prompt-mem" in fit(listed.where(half="validation"), ()).policy.picks
