"""The paper's metrics: exact match in the first words (Table 1), MemoTrap's continuation match and
NQ-Swap's substring match (Table 2).

Parametric direction (paper Sec. 4, Table 1): the first 5 words of the output are correct if any
accepted answer occurs in them after normalization (lower case, accents folded, punctuation and
articles removed), matched on word boundaries.

Contextual direction (paper Sec. 4.2, Table 2; the target is the contextual answer):

- MemoTrap: correct if the first words of the output equal the words of the
  instruction-following continuation (lower case, punctuation stripped from the ends of each word).
- NQ-Swap: correct if a normalized substituted answer is a substring of the normalized output.
"""

from __future__ import annotations

import string
from collections.abc import Sequence
from dataclasses import dataclass

from juice.data.context_types import OBJECTIVES, ContextItem
from juice.data.records import ContextualExample
from juice.text import contains_answer, first_words, normalize_answer

N_WORDS = 5


@dataclass(frozen=True)
class Metric:
    """One metric's facts, read by every evaluation that decodes for it (juice's tables, the
    context-type evaluation and the lm-evaluation-harness tasks `juice tasks` writes, so their
    scores stay equal).

    Attributes:
        name: the metric's name in records (`ContextualExample.metric`, `ContextItem.metric`).
        new_tokens: greedy new tokens decoded before scoring (the paper's: 20 for NQ-Swap,
            10 otherwise; Sec. 4, App. D).
        source: where it comes from.
    """

    name: str
    new_tokens: int
    source: str


METRICS: dict[str, Metric] = {m.name: m for m in (
    Metric("first_words", 10, "exact match in the first 5 words (paper Sec. 4, Table 1; ParaConflict, your rows)"),
    Metric("memotrap", 10, "MemoTrap's continuation match (paper Sec. 4.2, Table 2)"),
    Metric("nqswap", 20, "NQ-Swap's substring match (paper Sec. 4.2, Table 2)"),
)}
"""Every metric, by name: the one place its new-token budget lives."""


def new_tokens(metric: str) -> int:
    """The new-token budget of `metric` (:data:`METRICS`).

    Raises:
        ValueError: an unknown metric.
    """
    if metric not in METRICS:
        raise ValueError(f"unknown metric {metric!r}; one of {', '.join(METRICS)}")
    return METRICS[metric].new_tokens


def is_correct(output: str, answers: Sequence[str], n_words: int = N_WORDS) -> bool:
    """The paper's exact match: an accepted answer occurs in the first `n_words` words."""
    return contains_answer(first_words(output, n_words), answers)


def _words(text: str) -> list[str]:
    strip = string.punctuation + "‘’“”–—"
    return [w for w in (word.strip(strip).lower() for word in text.split()) if w]


def memotrap_match(output: str, continuation: str) -> bool:
    """MemoTrap exact match: the output's first words equal the continuation's words (lower case,
    punctuation stripped from both ends of each word).

    >>> memotrap_match(" heavy. Absence makes", " heavy.")
    True
    >>> memotrap_match(" fonder.", " heavy.")
    False
    """
    target = _words(continuation)
    return bool(target) and _words(output)[: len(target)] == target


def nqswap_match(output: str, answers: Sequence[str]) -> bool:
    """NQ-Swap: some normalized answer is a substring of the normalized output (an answer that
    normalizes to nothing never matches)."""
    norm = normalize_answer(output)
    return any((a := normalize_answer(answer)) and a in norm for answer in answers)


def contextual_correct(example: ContextualExample, output: str, answers: Sequence[str]) -> bool:
    """Whether `output` gives one of `answers` under the example's metric."""
    if example.metric == "memotrap":
        return any(memotrap_match(output, a) for a in answers)
    return nqswap_match(output, answers)


def context_match(item: ContextItem, output: str, answers: Sequence[str]) -> bool:
    """Whether `output` gives one of `answers` under the item's metric: exact match in the first 5
    words for ParaConflict (the paper's); for NQ-Swap items a normalized answer found in the
    normalized output **on word boundaries** (juice's evaluation, not Table 2's substring match: a
    passage answering "24" must not score as the true answer "2").

    >>> from juice.data.context_types import ContextItem
    >>> item = ContextItem("nqswap", "0", "irrelevant", "Context: ...", "Question: ...", ("2",), ("24",), "nqswap")
    >>> context_match(item, " 24 of them", ["2"]), nqswap_match(" 24 of them", ["2"])
    (False, True)
    """
    return is_correct(output, answers) if item.metric == "first_words" else contains_answer(output, answers)


def context_verdicts(item: ContextItem, output: str) -> dict[str, bool | None]:
    """An output's verdicts on a context-type item (:mod:`juice.data.context_types`): one per
    objective (:data:`juice.data.context_types.OBJECTIVES`: `use_relevant`, `trust_memory`), and
    `follows_context`, whether it gives the passage's answer (None without a passage; False for a
    passage that states no answer)."""
    out: dict[str, bool | None] = {o: context_match(item, output, item.target(o)) for o in OBJECTIVES}
    out["follows_context"] = (None if item.context_type == "none" else
                              bool(item.context_answers) and context_match(item, output, item.context_answers))
    return out
