"""The context-type evaluation (:mod:`juice.when_to_steer.evaluation`, issue 35): every method's verdicts on
gold, conflicting, irrelevant and no-context items equal a naive one-prompt-at-a-time
evaluation on a tiny model, and the tables hold both objectives and the follow rate."""

from __future__ import annotations

import pytest

from juice.baselines.cad import CadPolicy, cad_generate, jsd_alpha
from juice.baselines.prompt import instructed_context_item
from juice.data.context_types import CONTEXT_TYPES, nqswap_context_items, paraconflict_context_items
from juice.data.paraconflict import build_domain
from juice.engine import greedy_generate
from juice.data.metrics import new_tokens
from juice.when_to_steer.evaluation import context_type_means, context_type_tables, evaluate_context_types
from juice.eval.verdicts import context_verdicts
from juice.recipe import Method
from juice.interventions import Head, HeadSelection
from juice.steering import ORIGINAL, JuICE, JuNE
from helpers.context_rows import ROWS

SEL = HeadSelection((Head(1, 2),), (Head(0, 1),))


def _items():
    return (paraconflict_context_items(build_domain("world_capital")[:3]).items
            + nqswap_context_items(ROWS[:3]).items)


def _methods(lm):
    return {"Original": Method(), "Prompt-c": Method(instructed=True, instruction="contextual"),
            "Prompt-p": Method(instructed=True, instruction="parametric"), "CAD": Method(contrast=CadPolicy(1.0)),
            "AdaCAD": Method(contrast=CadPolicy(jsd_alpha)), "JuNE": Method(JuNE(lm, SEL, 2.0, -1.0)),
            "JuICE": Method(JuICE(lm, SEL, 3.0, -1.0))}


def _naive(lm, item, method) -> str:
    """One prompt at a time, to the end of its new tokens, with no stop rule."""
    n = new_tokens(item.metric)
    if method.contrast is not None:
        return cad_generate(lm, [item.prompt], [item.question], n, method.contrast.alpha).texts[0]
    prompt = item.prompt if not method.instructed else instructed_context_item(
        item, method.instruction, lm.model.config.model_type)
    return greedy_generate(lm, [prompt], n, method.steering, stop_at_eos=True).texts[0]


def test_verdicts_equal_one_prompt_at_a_time(tiny_llama):
    items, methods = _items(), _methods(tiny_llama)
    results = evaluate_context_types(tiny_llama, items, methods)
    assert len(results) == len(items) * len(methods)
    by = {(r.domain, r.item, r.conflict_type, r.method): r for r in results}
    assert len(by) == len(results)
    for item in items:
        rid = f"{item.uid}/{item.variant}" if item.variant else item.uid
        for name, method in methods.items():
            r = by[item.source, rid, item.context_type, name]
            v = context_verdicts(item, _naive(tiny_llama, item, method))
            assert (r.correct, r.follows_parametric, r.follows_context) == (
                v["use_relevant"], v["trust_memory"], bool(v["follows_context"])), (item, name, r.output)


def test_tables_hold_both_objectives_and_the_follow_rate(tiny_llama):
    items = _items()
    methods = {"original": ORIGINAL, "juice": JuICE(tiny_llama, SEL, 3.0, -1.0)}
    tables = context_type_tables(evaluate_context_types(tiny_llama, items, methods), list(methods),
                                 resamples=1000)
    assert set(tables) == {"use_relevant", "trust_memory", "follows_context", "use_relevant_not_degenerate",
                            "degenerate"}
    use = tables["use_relevant"]
    assert set(use.cells["juice"]) == {"world_capital", "nqswap", "Average"}
    assert set(use.cells["juice"]["Average"]) == set(CONTEXT_TYPES)
    assert use.cells["original"]["world_capital"]["conflicting"].n == 6   # 3 items x 2 prompts
    assert "none" not in tables["follows_context"].cells["original"]["Average"]
    assert "juice - original" in use.differences
    means = context_type_means(use)
    assert set(means["juice"]) == {*CONTEXT_TYPES, "mean"}
    assert means["juice"]["mean"] == pytest.approx(sum(means["juice"][t] for t in CONTEXT_TYPES) / 4)


@pytest.mark.parametrize("direction", ["parametric", "contextual"])
def test_prompt_reads_no_context_type(direction):
    """Issue 44: a deployed system does not know whether a passage conflicts, nor how: every
    prompt with a passage gets the same instruction text before it (substitution and coherent
    alike); a prompt without one is told nothing about a passage it does not have (parametric)."""
    examples = build_domain("world_capital")[:4]
    built = paraconflict_context_items(examples).items + nqswap_context_items(ROWS).items
    heads = set()
    for item in built:
        text = instructed_context_item(item, direction)
        assert text.endswith(item.prompt)
        if item.prompt != item.question or direction == "contextual":
            heads.add((item.metric, text[: -len(item.prompt)]))
        else:
            assert text == item.prompt
    assert len({h for m, h in heads if m == "first_words"}) == 1 and len({h for m, h in heads if m == "nqswap"}) == 1
    sub, coh = (next(i for i in built if i.variant == v) for v in ("substitution", "coherent"))
    assert (instructed_context_item(sub, direction)[: -len(sub.prompt)]
            == instructed_context_item(coh, direction)[: -len(coh.prompt)])


def _results(table):
    """ItemResults from (source, question, context type, method, correct) rows."""
    from juice.eval.runner import ItemResult

    return [ItemResult(domain=s, subject=q, conflict_type=t, method=m, output="", correct=c, follows_context=False,
                       p_parametric=0.0, p_context=0.0,
                       item=f"{q}/{k}") for k, (s, q, t, m, c) in enumerate(table)]


def _naive_mean(table, method, weights):
    """The mean over context types of the mean over sources of the accuracy over the drawn
    questions' items, by plain loops (weights: source -> question index -> times drawn)."""
    questions = {}
    for s, q, *_ in table:
        questions.setdefault(s, [])
        if q not in questions[s]:
            questions[s].append(q)
    per_type = []
    for t in [t for t in CONTEXT_TYPES if any(row[2] == t for row in table)]:
        accs = []
        for s in questions:
            num = den = 0.0
            for src, q, tt, m, c in table:
                if src == s and tt == t and m == method:
                    w = weights[s][questions[s].index(q)]
                    num, den = num + w * c, den + w
            if den:
                accs.append(num / den)
        per_type.append(sum(accs) / len(accs))
    return sum(per_type) / len(per_type)


def test_the_means_paired_interval_equals_a_naive_bootstrap():
    """Issue 44: the mean over context types and its paired interval against Original, whole
    questions resampled within their source, equal a plain-loop bootstrap with the same draws."""
    import random

    import numpy as np

    from juice.when_to_steer.evaluation import MEAN, question_bootstrap, question_draws

    rng = random.Random(0)
    table = []
    for s, nq in (("nqswap", 5), ("world_capital", 4)):
        for q in range(nq):
            for t in CONTEXT_TYPES:
                for _ in range(2 if (t == "conflicting" and s == "world_capital") else 1):
                    if t == "gold" and q == 0 and s == "world_capital":
                        continue   # a skipped gold item
                    for m in ("Original", "JuICE"):
                        table.append((s, f"q{q}", t, m, rng.random() < (0.4 if m == "Original" else 0.6)))
    results = _results(table)
    boot = question_bootstrap(results, ["Original", "JuICE"], [("JuICE", "Original")], resamples=1000, seed=7)
    ones = {"nqswap": [1] * 5, "world_capital": [1] * 4}
    assert boot.cells["JuICE"][MEAN].mean == pytest.approx(_naive_mean(table, "JuICE", ones))
    assert boot.cells["JuICE"][MEAN].n == 9 and boot.cells["Original"]["gold"].n == 8
    draws = question_draws({"nqswap": 5, "world_capital": 4}, 1000, 7)
    diffs, means = [], []
    for b in range(1000):
        w = {s: list(draws[s][b]) for s in draws}
        means.append(_naive_mean(table, "JuICE", w))
        diffs.append(means[-1] - _naive_mean(table, "Original", w))
    low, high = np.quantile(diffs, [0.025, 0.975])
    d = boot.differences["JuICE - Original"][MEAN]
    assert (d.low, d.high) == (pytest.approx(low), pytest.approx(high))
    assert d.mean == pytest.approx(_naive_mean(table, "JuICE", ones) - _naive_mean(table, "Original", ones))
    low, high = np.quantile(means, [0.025, 0.975])
    assert (boot.cells["JuICE"][MEAN].low, boot.cells["JuICE"][MEAN].high) == (pytest.approx(low), pytest.approx(high))
    assert boot.detectable["JuICE - Original"] == pytest.approx(2.801585 * np.std(diffs, ddof=1), rel=1e-6)


def test_question_only_equals_decoding_the_question_alone(tiny_llama):
    """"Question-only" is read from Original's none items, not decoded again: it equals the
    unmodified model's greedy output on each item's question, scored against that item."""
    from juice.when_to_steer.evaluation import QUESTION_ONLY, question_only_results

    items = _items()
    results = evaluate_context_types(tiny_llama, items, {"original": Method()})
    alone = question_only_results(items, results)
    assert len(alone) == len(items) and {r.method for r in alone} == {QUESTION_ONLY}
    for item, r in zip(items, alone):
        text = greedy_generate(tiny_llama, [item.question], new_tokens(item.metric), ORIGINAL, stop_at_eos=True).texts[0]
        v = context_verdicts(item, text)
        assert r.output.startswith(text) or text.startswith(r.output)   # the evaluation may stop after 5 words
        assert (r.correct, r.follows_parametric) == (v["use_relevant"], v["trust_memory"]), item
