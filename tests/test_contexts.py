"""The context-type evaluation (:mod:`juice.eval.contexts`, issue 35): every method's verdicts on
gold, conflicting, irrelevant and no-context items equal a naive one-prompt-at-a-time
evaluation on a tiny model, and the tables hold both objectives and the follow rate."""

from __future__ import annotations

import pytest

from juice.baselines.cad import cad_generate
from juice.baselines.prompt import instructed_context_item
from juice.data.context_types import CONTEXT_TYPES, nqswap_context_items, paraconflict_context_items
from juice.data.paraconflict import build_domain
from juice.engine import greedy_generate
from juice.eval.contexts import NEW_TOKENS, context_type_means, context_type_tables, evaluate_context_types
from juice.eval.metrics import context_verdicts
from juice.eval.runner import Method
from juice.interventions import Head, HeadSelection
from juice.steering import ORIGINAL, JuICE, JuNE
from test_context_types import ROWS

SEL = HeadSelection((Head(1, 2),), (Head(0, 1),))


def _items():
    return (paraconflict_context_items(build_domain("world_capital")[:3]).items
            + nqswap_context_items(ROWS[:3]).items)


def _methods(lm):
    return {"Original": Method(), "Prompt-c": Method(instructed=True, instruction="contextual"),
            "Prompt-p": Method(instructed=True, instruction="parametric"), "CAD": Method(cad_alpha=1.0),
            "AdaCAD": Method(adacad=True), "JuNE": Method(JuNE(lm, SEL, 2.0, -1.0)),
            "JuICE": Method(JuICE(lm, SEL, 3.0, -1.0))}


def _naive(lm, item, method) -> str:
    """One prompt at a time, to the end of its new tokens, with no stop rule."""
    n = NEW_TOKENS[item.metric]
    if method.contrastive is not None:
        return cad_generate(lm, [item.prompt], [item.question], n, method.contrastive).texts[0]
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
    methods = {"Original": ORIGINAL, "JuICE": JuICE(tiny_llama, SEL, 3.0, -1.0)}
    tables = context_type_tables(evaluate_context_types(tiny_llama, items, methods), list(methods),
                                 resamples=1000)
    assert set(tables) == {"use_relevant", "trust_memory", "follows_context", "use_relevant_not_degenerate",
                            "degenerate"}
    use = tables["use_relevant"]
    assert set(use.cells["JuICE"]) == {"world_capital", "nqswap", "Average"}
    assert set(use.cells["JuICE"]["Average"]) == set(CONTEXT_TYPES)
    assert use.cells["Original"]["world_capital"]["conflicting"].n == 6   # 3 items x 2 prompts
    assert "none" not in tables["follows_context"].cells["Original"]["Average"]
    assert "JuICE - Original" in use.differences
    means = context_type_means(use)
    assert set(means["JuICE"]) == {*CONTEXT_TYPES, "mean"}
    assert means["JuICE"]["mean"] == pytest.approx(sum(means["JuICE"][t] for t in CONTEXT_TYPES) / 4)
