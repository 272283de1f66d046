"""Evaluation: the paper's exact match, answer probabilities, and Table 1.

Exact match (paper Sec. 4): greedy decoding of 10 new tokens; the first 5 words are correct if
any accepted answer occurs in them after normalization (lower case, accents folded, punctuation
and articles removed), matched on word boundaries. Also recorded per item: the first-step
probability of the parametric and of the context answer's first token, and whether the output
follows the context answer instead.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Callable, Mapping, Sequence
from dataclasses import asdict, dataclass

import torch

from juice.data.records import CONFLICT_TYPES, ConflictExample
from juice.models import LoadedModel
from juice.steering import Steering, Stream, generate
from juice.text import contains_answer, first_words
from juice.tokens import answer_first_token

MAX_NEW_TOKENS = 10
N_WORDS = 5


@dataclass(frozen=True)
class ItemResult:
    """One (example, conflict type, method) evaluation."""

    domain: str
    subject: str
    conflict_type: str
    method: str
    output: str
    correct: bool
    follows_context: bool
    p_parametric: float
    p_context: float


def is_correct(output: str, answers: Sequence[str], n_words: int = N_WORDS) -> bool:
    """The paper's exact match: an accepted answer occurs in the first `n_words` words."""
    return contains_answer(first_words(output, n_words), answers)


def evaluate(
    lm: LoadedModel,
    examples: Sequence[ConflictExample],
    methods: Mapping[str, Steering],
    conflict_types: Sequence[str] = CONFLICT_TYPES,
    *,
    max_new_tokens: int = MAX_NEW_TOKENS,
    max_rows: int = 64,
    on_progress: Callable[[int], None] | None = None,
) -> list[ItemResult]:
    """Generate for every example x conflict type x method in shared batches and score them.

    All methods of one prompt share its clean prefill (see :mod:`juice.steering`).

    Args:
        methods: name -> steering; names label the results (e.g. "Original", "JuICE").
        on_progress: called with the number of (prompt, method) streams finished.

    Raises:
        EmptyAnswerError: an answer tokenizes to nothing.
    """
    prompts, meta, streams, probes = [], [], [], []
    names = list(methods)
    for ex in examples:
        for t in conflict_types:
            prompt = ex.prompts[t]
            ids = [answer_first_token(lm.tokenizer, prompt, ex.answer),
                   answer_first_token(lm.tokenizer, prompt, ex.context_answer)]
            prompts.append(prompt)
            for name in names:
                streams.append(Stream(len(prompts) - 1, methods[name]))
                meta.append((ex, t, name))
                probes.append(ids)
    if not streams:
        return []
    gen = generate(lm, prompts, streams, max_new_tokens, probe_tokens=torch.tensor(probes),
                   max_rows=max_rows, on_chunk=on_progress)
    results = []
    for (ex, t, name), text, probs in zip(meta, gen.texts, gen.first_probs):
        results.append(ItemResult(
            domain=ex.domain, subject=ex.subject, conflict_type=t, method=name, output=text,
            correct=is_correct(text, ex.answers),
            follows_context=is_correct(text, [ex.context_answer]),
            p_parametric=float(probs[0]), p_context=float(probs[1]),
        ))
    return results


def accuracy_table(results: Sequence[ItemResult]) -> dict[str, dict[str, dict[str, float]]]:
    """method -> domain -> conflict type -> accuracy in percent (exact match)."""
    groups: dict[tuple, list[bool]] = defaultdict(list)
    for r in results:
        groups[(r.method, r.domain, r.conflict_type)].append(r.correct)
    table: dict[str, dict[str, dict[str, float]]] = defaultdict(lambda: defaultdict(dict))
    for (m, d, t), values in groups.items():
        table[m][d][t] = 100.0 * sum(values) / len(values)
    return {m: dict(v) for m, v in table.items()}


def summary(results: Sequence[ItemResult]) -> dict[str, dict[str, float]]:
    """method -> mean accuracy, follows-context rate and answer probabilities (over all items)."""
    by_method: dict[str, list[ItemResult]] = defaultdict(list)
    for r in results:
        by_method[r.method].append(r)
    out = {}
    for m, rs in by_method.items():
        n = len(rs)
        out[m] = {
            "n": n,
            "accuracy": 100.0 * sum(r.correct for r in rs) / n,
            "follows_context": 100.0 * sum(r.follows_context for r in rs) / n,
            "p_parametric": sum(r.p_parametric for r in rs) / n,
            "p_context": sum(r.p_context for r in rs) / n,
        }
    return out


def results_to_json(results: Sequence[ItemResult]) -> list[dict]:
    return [asdict(r) for r in results]


def results_from_json(rows: Sequence[dict]) -> list[ItemResult]:
    return [ItemResult(**r) for r in rows]
