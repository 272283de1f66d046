"""The answer alias the model itself prefers (docs/protocol.md, "Answer alias": the rule of the
paper's released code for the Stage-1 target and for answer probabilities).

With one accepted answer, that one. With several: decode the clean prompt greedily (10 new
tokens), keep the first 5 words; if exactly one accepted answer occurs in them, that one; if
several, the longest of them; if none, the one whose first token is most probable at the last
prompt position. "Occurs" is the exact-match test of :func:`juice.text.contains_answer`
(normalized, on word boundaries; our choice, the same as the metric).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import replace

import torch

from juice.data.records import ConflictExample
from juice.engine import Stream
from juice.engine.backend import Engine, engine_or_default
from juice.models import LoadedModel
from juice.text import contains_answer, first_words
from juice.tokens import answer_first_token

N_WORDS = 5


def preferred_alias(output: str, answers: Sequence[str], first_token_probs: Sequence[float] | None = None) -> str:
    """The alias of `answers` the model prefers, given its greedy clean-prompt `output`.

    Args:
        output: the greedy continuation of the clean prompt (10 new tokens).
        answers: the accepted answers, canonical first.
        first_token_probs: probability of each answer's first token at the last prompt position;
            needed only when several answers are accepted and none occurs in the output.

    Raises:
        ValueError: no answers, or the probabilities are needed and missing or of another length.
    """
    if not answers:
        raise ValueError("no accepted answers")
    if len(answers) == 1:
        return answers[0]
    words = first_words(output, N_WORDS)
    found = [a for a in answers if contains_answer(words, [a])]
    if found:
        return max(found, key=len)  # one: that one; several: the longest (the first of equals)
    if first_token_probs is None or len(first_token_probs) != len(answers):
        raise ValueError("no accepted answer occurs in the output: the first-token probabilities of every "
                         f"answer are needed ({len(answers)} answers)")
    best = max(range(len(answers)), key=lambda i: first_token_probs[i])
    return answers[best]


def with_answer_first(example: ConflictExample, alias: str) -> ConflictExample:
    """`example` with `alias` moved to the front of its accepted answers (so `example.answer`,
    the Stage-1 target and the reported probabilities use it).

    Raises:
        ValueError: `alias` is not an accepted answer of `example`.
    """
    if alias not in example.answers:
        raise ValueError(f"{example.domain}/{example.subject}: {alias!r} is not an accepted answer")
    return replace(example, answers=(alias, *(a for a in example.answers if a != alias)))


def prefer_aliases(
    lm: LoadedModel, examples: Sequence[ConflictExample], outputs: Sequence[str], *, max_rows: int | str = 64,
    engine: Engine | None = None,
) -> list[ConflictExample]:
    """Every example with the model's preferred alias first (:func:`preferred_alias`).

    Args:
        outputs: the greedy clean-prompt continuation of each example (10 new tokens).
        engine: what computes the probabilities (:mod:`juice.engine.backend`; None: juice's own).

    Returns:
        The examples in the same order; first-token probabilities are computed (one batched
        forward) only for those with several aliases and none in the output.
    """
    if len(outputs) != len(examples):
        raise ValueError(f"{len(outputs)} outputs for {len(examples)} examples")
    need = [i for i, (ex, out) in enumerate(zip(examples, outputs))
            if len(ex.answers) > 1 and not contains_answer(first_words(out, N_WORDS), ex.answers)]
    probs: dict[int, list[float]] = {}
    if need:
        prompts = [examples[i].prompts["clean"] for i in need]
        tokens = [[answer_first_token(lm.tokenizer, p, a) for a in examples[i].answers]
                  for i, p in zip(need, prompts)]
        width = max(map(len, tokens))
        padded = torch.tensor([t + [t[0]] * (width - len(t)) for t in tokens])
        gen = engine_or_default(engine).generate(lm, prompts, [Stream(j) for j in range(len(need))], 1,
                                                 probe_tokens=padded, max_rows=max_rows)
        probs = {i: gen.first_probs[j, : len(tokens[j])].tolist() for j, i in enumerate(need)}
    return [with_answer_first(ex, preferred_alias(out, ex.answers, probs.get(i)))
            for i, (ex, out) in enumerate(zip(examples, outputs))]
