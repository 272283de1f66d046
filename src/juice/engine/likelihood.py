"""Teacher forcing: the log-probabilities a (steered) model gives a continuation, in one batched
forward without a cache: the uncached reference (:mod:`juice.reference`) for the engine's forced
tokens, which the evaluation (MemoTrap's likelihood comparison) and the server's `echo`
(:attr:`juice.engine.StepToken.prompt_logprobs`) use. JuICE runs the clean and the steered row of
each sequence together.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
from torch import Tensor

from juice.engine.forward import plan_applier
from juice.engine.streams import Stream, row_layout
from juice.models import LoadedModel
from juice.steering import ORIGINAL, Steering
from juice.tokens import EmptyAnswerError, pad_left, token_ids


def continuation_ids(tokenizer, prompt: str, continuation: str) -> tuple[list[int], list[int]]:
    """(prompt ids with BOS, continuation ids as they follow the prompt).

    The continuation is taken from the tokenization of `prompt + continuation` where the prompt's
    tokens are a prefix of it, else tokenized alone.

    Raises:
        EmptyAnswerError: the continuation yields no token.
    """
    base = token_ids(tokenizer, prompt)
    full = token_ids(tokenizer, prompt + continuation)
    cont = full[len(base):] if full[: len(base)] == base else list(
        tokenizer(continuation, add_special_tokens=False)["input_ids"])
    if not cont:
        raise EmptyAnswerError(f"continuation {continuation!r} tokenizes to nothing")
    return base, cont


@torch.inference_mode()
def sequence_logits(
    lm: LoadedModel, sequences: Sequence[Sequence[int]], n_read: Sequence[int], steering: Steering = ORIGINAL,
) -> list[Tensor]:
    """Teacher-forced logits of the last `n_read[i]` next-token predictions of each sequence.

    For sequence i of length T, returns the logits at positions T - n_read[i] - 1 ... T - 2, i.e.
    the predictions of its last `n_read[i]` tokens. JuICE runs the clean row and the steered row
    of each sequence in one batch (the steered row adds beta times the clean row's head outputs,
    at every position); JuNE scales the heads; both at the steering's site. The rows are the
    decoding engine's (:func:`juice.engine.streams.row_layout`).

    Returns:
        one `[n_read[i], vocab]` float32 tensor per sequence.
    """
    batch = pad_left(sequences, lm.tokenizer.pad_token_id)
    n = len(sequences)
    layout = row_layout(lm.geometry, [Stream(i, steering) for i in range(n)], list(range(n)), [None] * n,
                        share=False)   # the engine's rows: JuICE's [clean, steered] per sequence
    index, out_rows = torch.tensor(layout.prompts), torch.tensor(layout.out_row)
    ids, mask, positions = (t[index].to(lm.device) for t in (batch.input_ids, batch.attention_mask, batch.position_ids))
    with plan_applier([steering])(lm.heads, layout.plan):
        hidden = lm.model.base_model(input_ids=ids, attention_mask=mask, position_ids=positions,
                                     use_cache=False).last_hidden_state
    width = ids.shape[1]
    out = []
    for i, row in enumerate(out_rows.tolist()):
        k = n_read[i]
        out.append(lm.logits(hidden[row, width - k - 1: width - 1]).float())
    return out


__all__ = ["continuation_ids", "sequence_logits"]
