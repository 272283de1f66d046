"""Leaks of the when-to-steer study's pre-registered analysis (:mod:`juice.when_to_steer.preregistered`),
guarded on synthetic outcomes whose verdicts and signals the test chooses, so that each leak
changes the answer: auto's gate reading an item's gold context type instead of its signal, the
best static method chosen on the items it is scored on, and auto's fit seeing those items. None of
these tests reads a committed record: a record regenerated with a leak would still fail them."""

from __future__ import annotations

from dataclasses import replace

from helpers.outcomes import synthetic

RELEVANT = ("gold", "conflicting")


def _plan(designs, procedures):
    from juice.when_to_steer.preregistered import Plan

    return Plan(procedures=procedures, designs=designs, resamples=1000)


def _estimate(analysis, dataset, design):
    (e,) = [e for e in analysis["estimates"] if e["dataset"] == dataset and e["design"] == design]
    return e


def _flat_signal(o):
    """`o` with one JSD for every passage: a single bin, so only the gate and the picks matter."""
    return replace(o, signal=[0.5 if p else 0.0 for p in o.passage])


def _gated(sources, misleading):
    """JuICE is right on relevant passages (gold, conflicting), the question alone on misleading
    ones (irrelevant, distractor) and without a passage, where Original is right too. The lexical
    share is 1.0 on relevant passages and 0.2 on misleading ones, the other way round in the
    sources `misleading`: a gate fitted on one kind of source is wrong on the other, where the
    gold context type would still be right."""
    from juice.when_to_steer.signals import RELEVANCE

    def right(m, s, q, t):
        if t in RELEVANT:
            return m == "juice-ctx"
        return m in ("Question-only", "original") if t == "none" else m == "Question-only"

    o = _flat_signal(synthetic(sources=sources, questions=6, right=right))
    share = [(0.2 if t in RELEVANT else 1.0) if s in misleading else (1.0 if t in RELEVANT else 0.2)
             for s, t in zip(o.source, o.context_type)]
    return replace(o, gates={RELEVANCE: share})


def test_a_gate_fitted_on_one_source_follows_its_signal_on_a_source_where_the_signal_misleads():
    """Leak (a), leaving one source out: the held-out routing must read the gate's signal, not
    the gold context type. Each source's gate is perfect on its own items and wrong on the other's
    (1.0 on relevant passages in one, on misleading ones in the other): held out, auto is right
    only without a passage (20) against the question alone's 60. A gate reading the gold type
    would route source b perfectly (difference 0)."""
    from juice.when_to_steer.preregistered import analyze
    from juice.when_to_steer.signals import RELEVANCE

    out = analyze({"x": _gated(("a", "b"), misleading=("b",))},
                  _plan(("leave one source out",), {"auto": (RELEVANCE,)}))
    e = _estimate(out, "x", "leave one source out")
    assert e["best_static"] == ["Question-only", "Question-only"]
    assert (e["auto"], e["best_static_mean"], e["difference"]) == (20.0, 60.0, -40.0)


def test_a_gate_fitted_on_one_dataset_follows_its_signal_on_a_dataset_where_the_signal_misleads():
    """Leak (a), across datasets: the gate fitted on `fits` (lexical share high on relevant
    passages) is applied to `misleads` (high on misleading ones) by its signal: every passage goes
    the wrong way and auto scores 20 against the question alone's 60, both ways. A gate reading
    the gold context type would route `fits -> misleads` perfectly (100, difference +40)."""
    from juice.when_to_steer.preregistered import analyze
    from juice.when_to_steer.signals import RELEVANCE

    datasets = {"fits": _gated(("a",), misleading=()), "misleads": _gated(("b",), misleading=("b",))}
    out = analyze(datasets, _plan(("across datasets",), {"auto": (RELEVANCE,)}))
    for pair in ("fits -> misleads", "misleads -> fits"):
        e = _estimate(out, pair, "across datasets")
        assert e["best_static"] == "Question-only", pair
        assert (e["auto"], e["best_static_mean"], e["difference"]) == (20.0, 60.0, -40.0), pair


def test_the_routed_gate_reads_the_gate_signal_not_the_context_type():
    """Leak (a), at the routing itself (:func:`juice.when_to_steer.preregistered.routed`): a gate
    below 0.6 sends a passage to the question alone; where the lexical share is high on misleading
    passages and low on relevant ones, every passage is routed by it, so none is right."""
    from juice.when_to_steer.auto import AutoPolicy
    from juice.when_to_steer.preregistered import routed, with_candidates
    from juice.when_to_steer.signals import RELEVANCE

    o = with_candidates(_gated(("b",), misleading=("b",)))
    policy = AutoPolicy((), ("juice",), {"juice": (1.0, -1.0)}, relevance=0.6, irrelevant="question", gate=RELEVANCE)
    got = routed(o, policy)["use"]
    assert got == [t == "none" for t in o.context_type]


def _shifted_best_static(q: int, m: str, favoured: int) -> bool:
    """Prompt-mem right on the first `favoured` questions, JuICE on the others (every context type);
    Original and the question alone right without a passage only."""
    if m in ("original", "Question-only"):
        return False
    return m == ("prompt-mem" if q < favoured else "juice-ctx")


def test_validation_to_test_scores_the_best_static_method_of_validation_on_test():
    """Leak (b), validation -> test: the best static method is chosen on validation items only.
    On validation (even questions) Prompt-mem is right on 4 of 6 questions and JuICE on 2; on test
    JuICE is right on all, so on all items JuICE (8 of 12) would be chosen (test mean 100,
    difference -80) where validation's choice, Prompt-mem, scores 0 on test."""
    from juice.when_to_steer.preregistered import analyze

    def right(m, s, q, t):
        if t == "none" and m in ("original", "Question-only"):
            return True
        return m == "juice-ctx" if q % 2 else _shifted_best_static(q, m, 8)

    o = _flat_signal(synthetic(sources=("a",), questions=12, right=right))
    out = analyze({"x": o}, _plan(("validation -> test",), {"auto, no gate": ()}))
    e = _estimate(out, "x", "validation -> test")
    assert e["best_static"] == "Prompt-mem"
    assert (e["auto"], e["best_static_mean"], e["difference"]) == (20.0, 0.0, 20.0)


def test_across_datasets_scores_the_best_static_method_of_the_fitting_dataset_on_the_other():
    """Leak (b), across datasets: the best static method is chosen on the fitting dataset's items
    only. Prompt-mem is right on 8 of `prompt`'s 12 questions and JuICE on 4; JuICE on every item
    of `juice`. On both datasets' items JuICE would be chosen (mean over sources 67 against 33:
    `juice`'s mean 100, difference -80) where `prompt`'s choice, Prompt-mem, scores 0 there."""
    from juice.when_to_steer.preregistered import analyze

    def prompt_right(m, s, q, t):
        return (t == "none" and m in ("original", "Question-only")) or _shifted_best_static(q, m, 8)

    def juice_right(m, s, q, t):
        return (t == "none" and m in ("original", "Question-only")) or m == "juice-ctx"

    datasets = {"prompt": _flat_signal(synthetic(sources=("p",), questions=12, right=prompt_right)),
                "juice": _flat_signal(synthetic(sources=("j",), questions=12, right=juice_right))}
    out = analyze(datasets, _plan(("across datasets",), {"auto, no gate": ()}))
    e = _estimate(out, "prompt -> juice", "across datasets")
    assert e["best_static"] == "Prompt-mem"
    assert (e["auto"], e["best_static_mean"], e["difference"]) == (20.0, 0.0, 20.0)


def test_validation_to_test_fits_auto_on_validation_items_only():
    """Leak (c), validation -> test: auto's fit sees validation items only. On validation JuICE is
    right on the passages of 4 of 6 questions and the question alone on 2; on test the question
    alone on all. Fitted on validation, auto picks JuICE and is right on test only without a
    passage (20, difference +20 over JuICE, the best static method of validation); a fit that saw
    the test items would pick the question alone (8 of 12) and score 100 (difference +100)."""
    from juice.when_to_steer.preregistered import analyze, fit, with_candidates

    def right(m, s, q, t):
        if t == "none":
            return m in ("original", "Question-only")
        if q % 2:   # test
            return m == "Question-only"
        return m == ("juice-ctx" if q < 8 else "Question-only")

    o = _flat_signal(synthetic(sources=("a",), questions=12, right=right))
    out = analyze({"x": o}, _plan(("validation -> test",), {"auto, no gate": ()}))
    e = _estimate(out, "x", "validation -> test")
    assert e["best_static"] == "JuICE-ctx"
    assert (e["auto"], e["best_static_mean"], e["difference"]) == (20.0, 0.0, 20.0)
    listed = with_candidates(o)
    assert fit(listed.where(half="validation"), ()).policy.picks == ("juice",)
    assert fit(listed, ()).policy.picks == ("question",)   # what a fit that saw the test items would pick
