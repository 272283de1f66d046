"""Tokenization the way every method here needs it: BOS kept, left padding, answer first tokens."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch
from torch import Tensor
from transformers import PreTrainedTokenizerBase


class EmptyAnswerError(ValueError):
    """An answer that is empty or tokenizes to nothing after the prompt."""


class PromptTooLongError(ValueError):
    """A prompt longer than the model's context window."""


@dataclass
class Batch:
    """Left-padded token ids with their mask and positions.

    Attributes:
        input_ids: `[batch, seq]`.
        attention_mask: `[batch, seq]`, 1 for real tokens, 0 for left padding.
        position_ids: `[batch, seq]`, `cumsum(mask) - 1` (0 on padding).
    """

    input_ids: Tensor
    attention_mask: Tensor
    position_ids: Tensor

    def to(self, device: torch.device) -> "Batch":
        return Batch(self.input_ids.to(device), self.attention_mask.to(device), self.position_ids.to(device))

    def repeat(self, times: int) -> "Batch":
        """The batch stacked `times` times along the batch dimension: `[times * batch, seq]`."""
        return Batch(*(t.repeat(times, 1) for t in (self.input_ids, self.attention_mask, self.position_ids)))


def token_ids(tokenizer: PreTrainedTokenizerBase, text: str) -> list[int]:
    """Token ids of `text` with the tokenizer's special tokens (BOS for Gemma, Llama)."""
    return list(tokenizer(text, add_special_tokens=True)["input_ids"])


def encode(
    tokenizer: PreTrainedTokenizerBase, prompts: Sequence[str], max_length: int | None = None
) -> Batch:
    """Tokenize `prompts` (with BOS) into one left-padded batch.

    Raises:
        PromptTooLongError: a prompt has more than `max_length` tokens.
    """
    ids = [token_ids(tokenizer, p) for p in prompts]
    return pad_left(ids, tokenizer.pad_token_id, max_length)


def pad_left(ids: Sequence[Sequence[int]], pad_id: int, max_length: int | None = None) -> Batch:
    """Left-pad token id lists into a :class:`Batch`.

    Raises:
        PromptTooLongError: a sequence is longer than `max_length`.
    """
    width = max(len(row) for row in ids)
    if max_length is not None and width > max_length:
        raise PromptTooLongError(f"a prompt has {width} tokens; the model's context holds {max_length}")
    input_ids = torch.full((len(ids), width), pad_id, dtype=torch.long)
    mask = torch.zeros((len(ids), width), dtype=torch.long)
    for i, row in enumerate(ids):
        if row:
            input_ids[i, width - len(row):] = torch.tensor(row, dtype=torch.long)
            mask[i, width - len(row):] = 1
    positions = (mask.cumsum(-1) - 1).clamp(min=0)
    return Batch(input_ids, mask, positions)


def answer_first_token(tokenizer: PreTrainedTokenizerBase, prompt: str, answer: str) -> int:
    """The first token of `answer` as it would follow `prompt` (with its leading space).

    Tokenizes `prompt` and `prompt + " " + answer` and takes the first token after the prompt's.
    If the tokenizer merges across the boundary, falls back to `" " + answer` alone.

    Raises:
        EmptyAnswerError: the answer is empty or yields no token.
    """
    if not answer.strip():
        raise EmptyAnswerError(f"empty answer for prompt {prompt[-60:]!r}")
    base = token_ids(tokenizer, prompt)
    full = token_ids(tokenizer, f"{prompt} {answer.strip()}")
    if len(full) > len(base) and full[: len(base)] == base:
        return full[len(base)]
    alone = list(tokenizer(" " + answer.strip(), add_special_tokens=False)["input_ids"])
    if not alone:
        raise EmptyAnswerError(f"answer {answer!r} tokenizes to nothing")
    return alone[0]


def context_length(model) -> int | None:
    """The model's maximum number of positions, if its config states one."""
    config = model.config.get_text_config()
    for name in ("max_position_embeddings", "n_positions", "max_sequence_length"):
        if value := getattr(config, name, None):
            return int(value)
    return None
