"""Stage 2: JuICE's dual run and JuNE's single run, for forward passes and greedy generation.

JuICE (paper Alg. 1, Stage 2): run 1 is the unmodified model; run 2 adds beta+ (resp. beta-)
times run 1's outputs of the positive (negative) heads to the same heads. JuNE (Alg. 4) scales
the heads' live outputs in one run: `H <- H + beta * H`.

Generation keeps both runs cached: the batch holds `[clean rows; steered rows]` and one KV cache
serves both halves; at every step both halves are fed the steered run's new token, so the clean
run sees exactly the sequence the steered run produced (as a naive re-run of both passes would).
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from contextlib import contextmanager, nullcontext
from dataclasses import dataclass
from typing import Literal

import torch
from torch import Tensor

from juice.architectures import HeadGeometry
from juice.interventions import (
    Head,
    added_to_heads,
    captured_heads,
    check_heads,
    dual_run_rows,
    scaled_heads,
)
from juice.models import LoadedModel
from juice.tokens import context_length, encode

Method = Literal["original", "june", "juice"]
METHODS: tuple[str, ...] = ("original", "june", "juice")


@dataclass(frozen=True)
class HeadSelection:
    """Heads to steer: `positive` get beta+, `negative` get beta- (paper Alg. 1 output)."""

    positive: tuple[Head, ...]
    negative: tuple[Head, ...]


def steering_coefficients(
    geometry: HeadGeometry, selection: HeadSelection, beta_plus: float, beta_minus: float
) -> Tensor:
    """`[n_layers, n_heads]`: beta+ on positive heads, beta- on negative heads, 0 elsewhere.

    A head in both sets gets both (Alg. 1 applies the two updates one after the other).

    Raises:
        IndexError: a head is out of range for `geometry`.
    """
    check_heads([*selection.positive, *selection.negative], geometry)
    coefficients = torch.zeros(geometry.n_layers, geometry.n_heads)
    for layer, head in selection.positive:
        coefficients[layer, head] += beta_plus
    for layer, head in selection.negative:
        coefficients[layer, head] += beta_minus
    return coefficients


@dataclass(frozen=True)
class Steering:
    """A steering method with its coefficients.

    Attributes:
        method: "original" (no change), "june" (single run) or "juice" (dual run).
        coefficients: `[n_layers, n_heads]` for all prompts or `[n_prompts, n_layers, n_heads]`
            per prompt (beta at the steered heads, 0 elsewhere). Ignored for "original".
    """

    method: Method = "original"
    coefficients: Tensor | None = None

    def __post_init__(self) -> None:
        if self.method not in METHODS:
            raise ValueError(f"unknown steering method {self.method!r}; choose from {METHODS}")
        if self.method != "original" and self.coefficients is None:
            raise ValueError(f"{self.method} needs coefficients")

    @property
    def rows_per_prompt(self) -> int:
        return 2 if self.method == "juice" else 1


ORIGINAL = Steering()


@contextmanager
def steered(lm: LoadedModel, steering: Steering) -> Iterator[None]:
    """Hooks for `steering` on a batch laid out as the method needs (`[clean; steered]` for JuICE)."""
    if steering.method == "juice":
        with dual_run_rows(lm.heads, steering.coefficients):
            yield
    elif steering.method == "june":
        with scaled_heads(lm.heads, steering.coefficients):
            yield
    else:
        yield


@dataclass
class Generation:
    """Greedy continuations of a batch of prompts.

    Attributes:
        tokens: `[n_prompts, max_new_tokens]` new token ids.
        texts: the decoded continuations.
        first_probs: `[n_prompts, V]` next-token probabilities at the last prompt position
            (the steered run's, for JuICE), or None if not requested.
    """

    tokens: Tensor
    texts: list[str]
    first_probs: Tensor | None


def _forward(lm: LoadedModel, input_ids: Tensor, mask: Tensor, positions: Tensor, past=None):
    return lm.model(
        input_ids=input_ids,
        attention_mask=mask,
        position_ids=positions,
        past_key_values=past,
        use_cache=True,
        logits_to_keep=1,
    )


@torch.inference_mode()
def greedy_generate(
    lm: LoadedModel,
    prompts: Sequence[str],
    max_new_tokens: int = 10,
    steering: Steering = ORIGINAL,
    *,
    keep_first_probs: bool = False,
) -> Generation:
    """Greedy decoding of `prompts` in one left-padded batch, with one KV cache.

    Per new token this costs one forward of one token per row; JuICE doubles the rows (its clean
    and steered runs share the batch), never the sequence. Paper Alg. 1 (JuICE), Alg. 4 (JuNE).

    Args:
        lm: the model.
        prompts: n prompt strings (BOS is added).
        max_new_tokens: number of tokens to generate (no early stop at EOS).
        steering: method and coefficients; per-prompt coefficients are `[n, n_layers, n_heads]`.
        keep_first_probs: also return the first step's next-token probabilities, `[n, V]`.

    Raises:
        PromptTooLongError: a prompt does not fit the context window with the new tokens.
    """
    limit = context_length(lm.model)
    batch = encode(lm.tokenizer, prompts, None if limit is None else limit - max_new_tokens).to(lm.device)
    n = len(prompts)
    rows = batch.repeat(steering.rows_per_prompt)
    mask, positions = rows.attention_mask, rows.position_ids
    new_tokens = []
    first_probs = None
    with steered(lm, steering):
        out = _forward(lm, rows.input_ids, mask, positions)
        for step in range(max_new_tokens):
            logits = out.logits[-n:, -1].float()
            if step == 0 and keep_first_probs:
                first_probs = logits.softmax(-1).cpu()
            token = logits.argmax(-1)
            new_tokens.append(token)
            if step == max_new_tokens - 1:
                break
            feed = token.repeat(steering.rows_per_prompt)[:, None]
            mask = torch.cat([mask, mask.new_ones(mask.shape[0], 1)], dim=1)
            positions = positions[:, -1:] + 1
            out = _forward(lm, feed, mask, positions, past=out.past_key_values)
    tokens = torch.stack(new_tokens, dim=1).cpu() if new_tokens else torch.empty(n, 0, dtype=torch.long)
    texts = lm.tokenizer.batch_decode(tokens, skip_special_tokens=True)
    return Generation(tokens, texts, first_probs)


@torch.inference_mode()
def last_position_probs(lm: LoadedModel, prompts: Sequence[str], steering: Steering = ORIGINAL) -> Tensor:
    """Next-token probabilities at the last prompt position under `steering`: `[n, V]`."""
    return greedy_generate(lm, prompts, 1, steering, keep_first_probs=True).first_probs


def _coefficients_for(steering: Steering, row: int) -> Tensor:
    c = steering.coefficients
    return c if c.dim() == 2 else c[row]


@torch.inference_mode()
def greedy_generate_naive(
    lm: LoadedModel, prompt: str, max_new_tokens: int = 10, steering: Steering = ORIGINAL, *, row: int = 0
) -> Tensor:
    """Reference decoding: every step re-runs the whole sequence, twice for JuICE, with no cache.

    JuICE here is the paper's Alg. 1 literally: run 1 saves the steered heads' outputs
    (`captured_heads`), run 2 adds beta times them (`added_to_heads`). For tests and benchmarks.

    Returns:
        `[max_new_tokens]` new token ids.
    """
    ids = encode(lm.tokenizer, [prompt]).input_ids.to(lm.device)
    coefficients = None if steering.method == "original" else _coefficients_for(steering, row)
    active = [] if coefficients is None else [int(i) for i in coefficients.ne(0).any(-1).nonzero().flatten()]
    for _ in range(max_new_tokens):
        if steering.method == "juice":
            with captured_heads(lm.heads, active) as saved:
                lm.model(input_ids=ids, use_cache=False)
            additions = {
                layer: coefficients[layer].to(saved[layer].device)[None, None, :, None] * saved[layer]
                for layer in active
            }
            context = added_to_heads(lm.heads, additions)
        elif steering.method == "june":
            context = scaled_heads(lm.heads, coefficients)
        else:
            context = nullcontext()
        with context:
            logits = lm.model(input_ids=ids, use_cache=False).logits[:, -1]
        ids = torch.cat([ids, logits.argmax(-1, keepdim=True)], dim=1)
    return ids[0, -max_new_tokens:].cpu()
