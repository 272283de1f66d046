"""The first-step signals of when to steer: what `auto` (:mod:`juice.when_to_steer.auto`) reads
from a request before it chooses, and what the study measures as classifiers.

- :data:`SIGNAL`: AdaCAD's (Wang et al., NAACL 2025) Jensen-Shannon divergence, in bits, between
  the model's next-token distribution with the passage and with the question alone, at the first
  step, from the unmodified model (:func:`juice.baselines.cad.jsd_alpha`): the policy's bins.
- :data:`GATE_SIGNALS`: the relevance gate's signals, each higher for a passage the model should
  read: the share of the question's words the passage holds (:func:`passage_relevance`, read
  from the request's tokens before any forward), CK-PLUG's confidence gain (Bi et al., ICLR 2026)
  and CoCoA's contextual peakedness (Khandelwal et al., EMNLP 2025), the last two read from the
  same first step as the JSD (:func:`gate_signal`).

A request without a passage (its prompt is its question: the same token ids, :func:`has_passage`)
has no signal: every one is 0 for it, by its structure, not computed.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import torch
from torch import Tensor

from juice.baselines.cad import jsd_alpha
from juice.baselines.ckplug import confidence_gain
from juice.engine import forward_last
from juice.models import LoadedModel
from juice.tokens import pad_left, token_ids

SIGNAL = "jsd_bits"
"""The policy's signal: first-step JSD (bits) between the with-context and question-only distributions."""


RELEVANCE = "question_words_in_passage"
"""The gate's lexical signal: the share of the question's content words that the passage holds."""

MIN_WORD = 4
"""A content word: letters only, at least this long."""

SCAFFOLD_WORDS = frozenset({"context", "question", "answer"})
"""The words of the prompt formats juice builds (NQ-Swap's and your rows' `Context: ...\nQuestion:
...\nAnswer:`, :mod:`juice.data.nqswap`): never one of the question's own words, so never counted."""

_WORD = re.compile(r"[^\W\d_]+")

CONFIDENCE_GAIN = "confidence_gain"
"""A model-based gate signal: CK-PLUG's confidence gain (Bi et al., ICLR 2026), the entropy the
passage removes from the first step's next-token distribution, `H(question alone) - H(with the
passage)` in nats over CK-PLUG's plausible tokens (:func:`juice.baselines.ckplug.confidence_gain`;
CoCoA's entropy gap, Khandelwal et al., EMNLP 2025, is the same difference without the filter)."""

CONTEXT_PEAKEDNESS = "context_peakedness"
"""A model-based gate signal: CoCoA's contextual peakedness (Khandelwal et al., EMNLP 2025), the
margin between the two most probable next tokens with the passage (a probability in [0, 1])."""

GATE_SIGNALS = (RELEVANCE, CONFIDENCE_GAIN, CONTEXT_PEAKEDNESS)
"""The relevance gate's signals, each higher for a passage the model should read: the lexical one
(:func:`passage_relevance`, read from the request's words) and two model-based ones (read from the
first step's two distributions of the unmodified model). The fit tries each; ties go to the first."""


def content_words(text: str) -> set[str]:
    """The distinct content words of `text`: runs of letters (any script), lower-cased, at least
    :data:`MIN_WORD` long, wherever they stand (the first word of a text counts as any other), the
    prompt formats' :data:`SCAFFOLD_WORDS` left out.

    >>> sorted(content_words("Question: Michael Jordan plays which sport?\\nAnswer:"))
    ['jordan', 'michael', 'plays', 'sport', 'which']
    """
    return {w for w in (m.group(0).lower() for m in _WORD.finditer(text))
            if len(w) >= MIN_WORD and w not in SCAFFOLD_WORDS}


def passage_of(prompt: str, question: str) -> str:
    """The passage of a prompt: the prompt without its question, which ends it in every format
    juice builds; else the prompt without the longest ending it shares with the question."""
    if prompt.endswith(question):
        return prompt[: len(prompt) - len(question)]
    k = 0
    while k < min(len(prompt), len(question)) and prompt[-1 - k] == question[-1 - k]:
        k += 1
    return prompt[: len(prompt) - k]


def passage_relevance(prompt: str, question: str) -> float:
    """The share (in [0, 1]) of the question's distinct content words (:func:`content_words`)
    that occur among the passage's (:func:`passage_of`). 1.0 where the question has no content
    word (nothing to judge by). Read from the texts, so a word counts the same at the start of a
    text as after a space (a tokenizer gives "Michael" and " Michael" different tokens).

    A lexical relevance score, as a retriever's: a passage about another subject shares few of
    the question's words (juice's signal, :class:`RelevanceGate`).

    >>> passage_relevance("Paris is the capital of France. The capital of France is", "The capital of France is")
    1.0
    >>> passage_relevance("Berlin is the capital of Germany. The capital of France is", "The capital of France is")
    0.5
    """
    asked = content_words(question)
    return len(asked & content_words(passage_of(prompt, question))) / len(asked) if asked else 1.0


@dataclass(frozen=True, eq=False)
class RelevanceGate:
    """A :class:`juice.engine.Choice`'s gate: candidate `pick` for a request whose passage
    holds less than `threshold` of its question's words (:func:`passage_relevance` of the texts
    the tokenizer decodes from the request's token ids), else None."""

    threshold: float
    pick: int
    tokenizer: Any

    def __call__(self, prompt_ids: Sequence[int], question_ids: Sequence[int]) -> int | None:
        decode = self.tokenizer.decode
        share = passage_relevance(decode(list(prompt_ids), skip_special_tokens=True),
                                  decode(list(question_ids), skip_special_tokens=True))
        return self.pick if share < self.threshold else None


def relevance(lm: LoadedModel, prompts: Sequence[str], questions: Sequence[str]) -> list[float]:
    """Per request, :func:`passage_relevance` of its prompt and question texts as the gate reads
    them (decoded from their token ids), 1.0 without a passage."""

    gate = RelevanceGate(0.0, 0, lm.tokenizer)
    decode = gate.tokenizer.decode
    return [passage_relevance(decode(token_ids(lm.tokenizer, p), skip_special_tokens=True),
                              decode(token_ids(lm.tokenizer, q), skip_special_tokens=True))
            for p, q in zip(prompts, questions)]


def gate_signal(name: str, with_context: Tensor, question: Tensor) -> Tensor:
    """`[rows]` float: a model-based gate signal (:data:`CONFIDENCE_GAIN`, :data:`CONTEXT_PEAKEDNESS`)
    of `[rows, vocab]` first-step logits with the passage and of the question alone.

    Raises:
        ValueError: another name (the lexical signal is read from the texts: :func:`passage_relevance`).
    """

    if name == CONFIDENCE_GAIN:
        return confidence_gain(with_context, question)[0]
    if name == CONTEXT_PEAKEDNESS:
        top = with_context.float().softmax(-1).topk(2, dim=-1).values
        return top[..., 0] - top[..., 1]
    raise ValueError(f"auto: {name!r} is not a model-based gate signal ({', '.join(GATE_SIGNALS[1:])})")


def has_passage(lm: LoadedModel, prompts: Sequence[str], questions: Sequence[str]) -> list[bool]:
    """Per request, whether it has a passage: its prompt's token ids differ from its question's
    (the structure :class:`juice.engine.Choice` decides "no passage" by; module docstring).

    Raises:
        ValueError: `prompts` and `questions` of different lengths.
    """

    if len(prompts) != len(questions):
        raise ValueError("one question per prompt")
    return [token_ids(lm.tokenizer, p) != token_ids(lm.tokenizer, q) for p, q in zip(prompts, questions)]


def first_step_signal(lm: LoadedModel, prompts: Sequence[str], questions: Sequence[str], *, batch: int = 16) -> Tensor:
    """`[n]` first-step JSD (bits) between each prompt's and its question's next-token
    distributions under the unmodified model (the policy's signal), batched (left padding).

    A request without a passage (:func:`has_passage`) gets exactly 0, by its structure, and is
    not computed: the two rows of one text at different places in a padded batch agree only to
    about 1e-8 in fp32, processor-dependent. The others agree with one at a time to that order.

    Raises:
        ValueError: `prompts` and `questions` of different lengths.
    """
    return first_step_features(lm, prompts, questions, batch=batch)[SIGNAL]


@torch.inference_mode()
def first_step_features(lm: LoadedModel, prompts: Sequence[str], questions: Sequence[str], *, batch: int = 16
                        ) -> dict[str, Tensor]:
    """The first step's signals of each request from one batched pass: :data:`SIGNAL` (the bins'
    JSD, :func:`first_step_signal`) and the model-based gate signals (:func:`gate_signal`), each
    `[n]`, 0 for a request without a passage (not computed; never gated: module docstring).

    Raises:
        ValueError: `prompts` and `questions` of different lengths.
    """

    passage = has_passage(lm, prompts, questions)
    rows = [k for k, p in enumerate(passage) if p]
    texts = [prompts[k] for k in rows] + [questions[k] for k in rows]
    names = (SIGNAL, *GATE_SIGNALS[1:])
    out = {name: torch.zeros(len(prompts)) for name in names}
    if not texts:
        return out
    logits = []
    for at in range(0, len(texts), batch):
        ids = [token_ids(lm.tokenizer, t) for t in texts[at:at + batch]]
        b = pad_left(ids, lm.tokenizer.pad_token_id or 0)
        hidden, _ = forward_last(lm, b.input_ids.to(lm.device), b.attention_mask.to(lm.device),
                                 b.position_ids.to(lm.device))
        logits.append(lm.logits(hidden).float().cpu())
    both = torch.cat(logits)
    with_context, question, at = both[:len(rows)], both[len(rows):], torch.tensor(rows)
    out[SIGNAL][at] = jsd_alpha(with_context, question).to(torch.float32)
    for name in GATE_SIGNALS[1:]:
        out[name][at] = gate_signal(name, with_context, question).to(torch.float32)
    return out


__all__ = ["CONFIDENCE_GAIN", "CONTEXT_PEAKEDNESS", "GATE_SIGNALS", "MIN_WORD", "RELEVANCE", "RelevanceGate",
           "SCAFFOLD_WORDS", "SIGNAL", "content_words", "first_step_features", "first_step_signal", "gate_signal",
           "has_passage", "passage_of", "passage_relevance", "relevance"]
