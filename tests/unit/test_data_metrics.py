"""The metric table (:mod:`juice.data.metrics`; issue 64): every reader asks it, so a contextual
dataset with a metric of its own is one entry there (this test adds one) plus its data module."""

from __future__ import annotations

import pytest

from juice.baselines.prompt import CONTEXTUAL_COMPLETION, CONTEXTUAL_NQSWAP, contextual_prompt, instructed_context_item
from juice.data import metrics
from juice.data.context_types import ContextItem
from juice.data.metrics import CONTEXT_ITEM, CONTEXTUAL, METRICS, Metric, metric_named, metrics_for, new_tokens
from juice.data.records import ContextualExample
from juice.eval.verdicts import context_match, contextual_correct


def _example(metric: str) -> ContextualExample:
    return ContextualExample("recipes", "0", "Use salt. The secret is", "The secret is", (" salt",), (" love",),
                             "completion", metric)


def test_the_papers_metrics_hold_their_budgets_records_and_prompt_forms():
    assert [(m.name, m.new_tokens) for m in METRICS.values()] == [("first_words", 10), ("memotrap", 10), ("nqswap", 20),
                                                                   ("tristate", 32)]   # TriState-Bench's budget
    assert metrics_for(CONTEXTUAL) == ("memotrap", "nqswap")
    assert metrics_for(CONTEXT_ITEM) == ("first_words", "nqswap", "tristate")
    assert [n for n, m in METRICS.items() if m.likelihood] == ["memotrap"]   # Table 2's likelihood comparison
    assert [n for n, m in METRICS.items() if m.prompt_form == "question"] == ["nqswap", "tristate"]
    assert METRICS["nqswap"].match(" 24 of them", ["2"]) and not METRICS["nqswap"].context_match(" 24 of them", ["2"])


def test_a_record_naming_another_records_metric_is_refused_with_the_list():
    with pytest.raises(ValueError, match="recipes/0: unknown metric 'first_words'; one of memotrap, nqswap"):
        _example("first_words")
    with pytest.raises(ValueError, match="unknown metric 'memotrap'; one of first_words, nqswap, tristate"):
        ContextItem("memotrap", "0", "none", "Q", "Q", ("a",), metric="memotrap")
    with pytest.raises(ValueError, match="unknown metric 'bleu'"):
        new_tokens("bleu")


def test_a_new_metric_is_one_entry(monkeypatch):
    """A metric of its own for a new contextual dataset: the records accept it, the evaluations
    score and budget by it, the Prompt baseline picks its form from it, and the grouping the
    evaluations decode by (`metrics_for`) includes it."""
    keyword = Metric("keyword", 7, "a test's metric: the answer anywhere in the output",
                     lambda output, answers: any(a.strip() in output for a in answers),
                     frozenset({CONTEXTUAL, CONTEXT_ITEM}),
                     context_match=lambda output, answers: any(a.strip() in output for a in answers))
    monkeypatch.setitem(metrics.METRICS, "keyword", keyword)
    example = _example("keyword")
    assert new_tokens("keyword") == 7 and metric_named("keyword", CONTEXTUAL) is keyword
    assert "keyword" in metrics_for(CONTEXTUAL) and "keyword" in metrics_for(CONTEXT_ITEM)
    assert contextual_correct(example, " it is salt, of course", example.context_answers)
    assert not contextual_correct(example, " it is love", example.context_answers)
    item = ContextItem("recipes", "0", "gold", "Use salt. The secret is", "The secret is", ("love",), ("salt",),
                       metric="keyword")
    assert context_match(item, "mostly salt", ["salt"])
    assert contextual_prompt(example).startswith(CONTEXTUAL_COMPLETION)   # the completion form: its prompt_form
    monkeypatch.setitem(metrics.METRICS, "keyword", Metric(**{**keyword.__dict__, "prompt_form": "question"}))
    assert instructed_context_item(item, "contextual").startswith(CONTEXTUAL_NQSWAP)
