"""The metrics, one table (:data:`METRICS`): each metric's name in the records, its new-token
budget, how it matches an output to answers, and the Prompt baseline's form for its items. Every
reader asks the table: the records check their metric's name against it (:mod:`juice.data.records`,
:mod:`juice.data.context_types`), the evaluations group and score by it (:mod:`juice.eval.runner`,
:mod:`juice.when_to_steer.evaluation`, :mod:`juice.eval.verdicts`), the Prompt baseline picks its instruction by
it (:mod:`juice.baselines.prompt`) and `juice tasks` writes the lm-evaluation-harness budgets from
it (:mod:`juice.eval.harness_tasks`). A contextual dataset with a metric of its own is one data
module plus one :class:`Metric` here.

The paper's metrics (Sec. 4, 4.2; App. D): exact match in the first 5 words (Table 1; ParaConflict,
your rows), MemoTrap's continuation match and NQ-Swap's substring match (Table 2).
Beyond the paper: TriState-Bench's exact match (Jiang et al. 2026), the output's first line equal to
an answer after SQuAD's normalization, with its 32-token budget (:mod:`juice.data.tristate`).

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
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from juice.text import contains_answer, first_line_match, first_words, normalize_answer

N_WORDS = 5
"""The words of an output the exact match reads (paper Sec. 4)."""


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


def _continuation_match(output: str, answers: Sequence[str]) -> bool:
    return any(memotrap_match(output, a) for a in answers)


CONTEXTUAL = "contextual"
"""The records of the contextual direction's table (:class:`juice.data.records.ContextualExample`)."""

CONTEXT_ITEM = "context_item"
"""The context-type items (:class:`juice.data.context_types.ContextItem`)."""


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
        match: `(output, answers) -> bool`, the table's rule (Table 1 or Table 2).
        records: the records that may name it (:data:`CONTEXTUAL`, :data:`CONTEXT_ITEM`).
        context_match: the context-type evaluation's rule, where :data:`CONTEXT_ITEM` records name
            it (NQ-Swap's: on word boundaries, :func:`juice.eval.verdicts.context_match`).
        prompt_form: the Prompt baseline's contextual instruction for its items: "question" (NQ-Swap's
            instruction over `Context: ...\nQuestion: ...\nAnswer:`) or "completion"
            (:mod:`juice.baselines.prompt`).
        likelihood: the contextual table also compares the likelihoods of its items' two
            continuations (MemoTrap's, paper Table 2).
        first_words_only: the match reads the first :data:`N_WORDS` words only, so decoding may
            stop once they are out (:func:`juice.eval.runner.exact_match_decided`).
    """

    name: str
    new_tokens: int
    source: str
    match: Callable[[str, Sequence[str]], bool]
    records: frozenset[str]
    context_match: Callable[[str, Sequence[str]], bool] | None = None
    prompt_form: str = "completion"
    likelihood: bool = False
    first_words_only: bool = False


METRICS: dict[str, Metric] = {m.name: m for m in (
    Metric("first_words", 10, "exact match in the first 5 words (paper Sec. 4, Table 1; ParaConflict, your rows)",
           is_correct, frozenset({CONTEXT_ITEM}), context_match=is_correct, first_words_only=True),
    Metric("memotrap", 10, "MemoTrap's continuation match (paper Sec. 4.2, Table 2)", _continuation_match,
           frozenset({CONTEXTUAL}), likelihood=True),
    Metric("nqswap", 20, "NQ-Swap's substring match (paper Sec. 4.2, Table 2)", nqswap_match,
           frozenset({CONTEXTUAL, CONTEXT_ITEM}), context_match=contains_answer, prompt_form="question"),
    Metric("tristate", 32, "TriState-Bench's exact match: the first line, SQuAD's normalization (Jiang et al. "
           "2026; juice.data.tristate)", first_line_match, frozenset({CONTEXT_ITEM}),
           context_match=first_line_match, prompt_form="question"),
)}
"""Every metric, by name, in table order: the one place its facts live."""


def new_tokens(metric: str) -> int:
    """The new-token budget of `metric` (:data:`METRICS`).

    Raises:
        ValueError: an unknown metric.
    """
    return metric_named(metric).new_tokens


def metric_named(name: str, record: str | None = None) -> Metric:
    """The metric `name`, checked against the records that may name it.

    Args:
        record: :data:`CONTEXTUAL` or :data:`CONTEXT_ITEM`: the metric must be one of theirs.

    Raises:
        ValueError: an unknown metric, or one `record` may not name (the message lists theirs).
    """
    allowed = metrics_for(record) if record is not None else tuple(METRICS)
    if name not in allowed:
        raise ValueError(f"unknown metric {name!r}; one of {', '.join(allowed)}")
    return METRICS[name]


def metrics_for(record: str) -> tuple[str, ...]:
    """The metrics :data:`CONTEXTUAL` or :data:`CONTEXT_ITEM` records may name, in table order."""
    return tuple(n for n, m in METRICS.items() if record in m.records)


__all__ = ["CONTEXTUAL", "CONTEXT_ITEM", "METRICS", "Metric", "N_WORDS", "is_correct", "memotrap_match", "metric_named",
           "metrics_for", "new_tokens", "nqswap_match"]
