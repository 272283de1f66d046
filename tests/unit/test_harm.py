"""Do no harm (:mod:`juice.when_to_steer.harm`): the table's shares and verdicts, the risk-coverage
curve, from outcomes whose verdicts the test chooses."""

from __future__ import annotations

import math

import pytest

from helpers.outcomes import synthetic


def _rules(m, s, q, t):
    """Questions 0-5 of each source known closed-book. JuICE uses every passage, misleading ones too
    (copies them); Prompt-mem keeps known answers and never uses a passage; Original is right on
    relevant passages of even questions and keeps known answers."""
    known = q < 6
    if t == "none":
        return known
    if t in ("gold", "conflicting"):
        return m in ("juice-ctx", "juice/2-ctx") or (m == "original" and q % 2 == 0)
    return known and m in ("prompt-mem", "original", "Question-only")


def test_the_table_splits_outputs_by_whether_the_model_knows_the_answer():
    from juice.when_to_steer.harm import KEEPS, USES, harm_markdown, harm_table

    o = synthetic(right=_rules, questions=12)
    table = harm_table(o, ["original", "prompt-mem", "juice-ctx", "Question-only"], resamples=1000)
    rows, verdicts = table["rows"], table["verdicts"]
    assert table["known_questions"] == 12 and table["questions"] == 24
    assert rows["JuICE-ctx"][USES]["mean"] == 1.0 and rows["Prompt-mem"][USES]["mean"] == 0.0
    assert rows["JuICE-ctx"][KEEPS]["mean"] == 0.0 and rows["Prompt-mem"][KEEPS]["mean"] == 1.0
    assert rows["JuICE-ctx"]["irrelevant, known"]["copies"]["mean"] == 1.0
    assert rows["Prompt-mem"]["distractor, known"]["true"]["mean"] == 1.0
    assert rows["Prompt-mem"]["distractor, not known"]["copies"]["mean"] == 1.0   # the synthetic wrong answer copies
    assert rows["Prompt-mem"]["none, not known"]["neither"]["mean"] == 1.0
    assert verdicts["Prompt-mem"] == {"no measurable harm": True, "uses relevant passages": False}
    assert verdicts["JuICE-ctx"] == {"no measurable harm": False, "uses relevant passages": True}
    assert verdicts["Original"]["no measurable harm"] and verdicts["Original"]["uses relevant passages"]
    text = harm_markdown(table)
    assert "| JuICE-ctx | 100.0 [100.0, 100.0] | 0.0 [0.0, 0.0] | 100 / 0 / 0 | 100 / 0 / 0 | harms, uses relevant" in text


def test_risk_coverage_runs_from_every_passage_to_none():
    from juice.when_to_steer.harm import area_under, risk_coverage

    o = synthetic(right=_rules, questions=12)
    curve = risk_coverage(o, o.verdicts["use"]["juice-ctx"])
    assert curve[0]["coverage"] == 1.0 and curve[-1]["coverage"] == 0.0 and math.isnan(curve[-1]["risk"])
    covers = [p["coverage"] for p in curve]
    assert covers == sorted(covers, reverse=True)
    # the lexical gate (1 on relevant passages, 0.2 on the others) at a threshold between them:
    # JuICE answers exactly the relevant passages, and is right on all of them
    between = next(p for p in curve if 0.2 < p["threshold"] <= 1.0)
    assert between["coverage"] == pytest.approx(0.5) and between["risk"] == 0.0
    assert curve[0]["risk"] == pytest.approx(0.5)   # every passage: wrong on the misleading half
    assert area_under(curve) == pytest.approx((1.0 - 0.5) * (0.5 + 0.0) / 2)   # (0.5, 0) to (1, 0.5)


def test_auto_bins_route_each_item_to_its_candidate():
    from juice.when_to_steer.auto import AutoPolicy
    from juice.when_to_steer.harm import auto_bins

    o = synthetic(right=_rules)
    policy = AutoPolicy((0.5,), ("original", "juice"), {"juice": (1.0, -1.0)}, relevance=0.9)
    got = auto_bins(o, policy)
    for k, (x, has) in enumerate(zip(o.signal, o.passage)):
        name = "original" if not has or x < 0.5 else "juice-ctx"
        assert got[k] == o.verdicts["use"][name][k]


def test_the_risk_coverage_figure_is_written(tmp_path):
    pytest.importorskip("matplotlib", reason="the plots extra draws the figure")
    from juice.when_to_steer.harm import risk_coverage, risk_coverage_figure

    o = synthetic(right=_rules)
    curves = {"one": {m: risk_coverage(o, o.verdicts["use"][m]) for m in ("original", "juice-ctx")}}
    path = risk_coverage_figure(curves, tmp_path / "rc.png", "title")
    assert path.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_an_output_that_states_both_answers_counts_as_stating_the_true_one():
    """The three shares add to 100: an output with the true answer and the passage's is "true"."""
    from juice.when_to_steer.harm import harm_table

    o = synthetic(right=_rules, questions=12)
    o.verdicts["copies"]["original"] = [True] * len(o)   # every output also states the passage's answer
    rows = harm_table(o, ["original", "Question-only"], resamples=1000)["rows"]["Original"]   # by title
    for label, part in rows.items():
        if isinstance(part, dict) and "copies" in part:
            assert sum(part[k]["mean"] for k in ("copies", "true", "neither")) == pytest.approx(1.0)
    assert rows["irrelevant, known"]["true"]["mean"] == 1.0 and rows["irrelevant, known"]["copies"]["mean"] == 0.0
