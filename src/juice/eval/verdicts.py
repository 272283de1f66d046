"""The metrics applied to records: whether an output gives a record's answers under its metric
(:func:`contextual_correct`, Table 2), a context-type item's (:func:`context_match`) and its
verdicts (:func:`context_verdicts`). The metrics themselves, their budgets and match rules, are
one table, :data:`juice.data.metrics.METRICS`; its names are re-exported here.
"""

from __future__ import annotations

from collections.abc import Sequence

from juice.data.context_types import OBJECTIVES, ContextItem
from juice.data.metrics import METRICS
from juice.data.records import ContextualExample


def contextual_correct(example: ContextualExample, output: str, answers: Sequence[str]) -> bool:
    """Whether `output` gives one of `answers` under the example's metric."""
    return METRICS[example.metric].match(output, answers)


def context_match(item: ContextItem, output: str, answers: Sequence[str]) -> bool:
    """Whether `output` gives one of `answers` under the item's metric: exact match in the first 5
    words for ParaConflict (the paper's); for NQ-Swap items a normalized answer found in the
    normalized output **on word boundaries** (juice's evaluation, not Table 2's substring match: a
    passage answering "24" must not score as the true answer "2").

    >>> from juice.data.context_types import ContextItem
    >>> from juice.data.metrics import nqswap_match
    >>> item = ContextItem("nqswap", "0", "irrelevant", "Context: ...", "Question: ...", ("2",), ("24",), "nqswap")
    >>> context_match(item, " 24 of them", ["2"]), nqswap_match(" 24 of them", ["2"])
    (False, True)
    """
    return METRICS[item.metric].context_match(output, answers)


def context_verdicts(item: ContextItem, output: str) -> dict[str, bool | None]:
    """An output's verdicts on a context-type item (:mod:`juice.data.context_types`): one per
    objective (:data:`juice.data.context_types.OBJECTIVES`: `use_relevant`, `trust_memory`), and
    `follows_context`, whether it gives the passage's answer (None without a passage; False for a
    passage that states no answer)."""
    out: dict[str, bool | None] = {o: context_match(item, output, item.target(o)) for o in OBJECTIVES}
    out["follows_context"] = (None if item.context_type == "none" else
                              bool(item.context_answers) and context_match(item, output, item.context_answers))
    return out


__all__ = ["context_match", "context_verdicts", "contextual_correct"]
