"""What the engine decodes: a :class:`Stream` (a prompt under a steering or a contrast policy,
greedy or sampled), its result (:class:`Generation`), and how a batch of streams becomes rows
and a :class:`~juice.interventions.RowPlan` (:func:`row_layout`, the one place that does it).

Rows (paper Stage 2): an Original stream decodes one unmodified row; a JuNE stream one row whose
heads are scaled (Alg. 4); a JuICE stream two, an unmodified copy (run 1) and the steered row
that adds beta times the copy's head outputs (run 2, Alg. 1), both fed the steered row's tokens;
a contrastive stream (CAD, AdaCAD) two unmodified rows, its question's and its prompt's, both fed
the token chosen from their contrasted logits.
"""

from __future__ import annotations

from collections.abc import Callable, Hashable, Sequence
from dataclasses import dataclass

import torch
from torch import Tensor

from juice.architectures import HeadGeometry
from juice.interventions import RowPlan
from juice.sampling import Sampling
from juice.steering import ORIGINAL, Steering

ContrastRule = Callable[[Tensor, Tensor], Tensor]
"""(`[rows, vocab]` logits of the prompt's rows, `[rows, vocab]` logits of the question's rows)
-> `[rows, vocab]` logits to choose the next tokens from; row `r` of the result may depend on row
`r` of the inputs only."""


@dataclass(frozen=True)
class Contrast:
    """A contrastive decoding policy of a :class:`Stream`: the stream decodes two unmodified rows
    side by side, its prompt and `prompts[question]`, each with its KV cache rows, both fed the
    chosen token, which is chosen from `rule(prompt logits, question logits)`.

    CAD and AdaCAD (:class:`juice.baselines.cad.CadPolicy`, Shi et al. 2023, Eq. 2; Wang et al.
    2025) are such rules. Streams with equal rules are combined in one call per step.

    Attributes:
        question: index of the second prompt (CAD: the question without its context).
        rule: a :data:`ContrastRule` (hashable: the streams are grouped by it).
    """

    question: int
    rule: ContrastRule


@dataclass(frozen=True)
class Stream:
    """One generation request: the prompt at index `prompt`, decoded under `steering`, or with a
    `contrast` policy (CAD, AdaCAD), greedily or with `sampling`.

    `repetition_penalty` is Hugging Face's (CTRL, Keskar et al. 2019): before choosing, the logit
    of every token already in the sequence (prompt, BOS included, and new tokens) is divided by
    it if positive and multiplied by it if negative; 1 leaves the logits alone. Under a contrast,
    sampling, the penalty and the probabilities returned apply to the contrasted logits (the
    penalty's sequence is the stream's prompt and its new tokens).

    Raises:
        ValueError: repetition_penalty <= 0, or a contrast with a steering (CAD decodes the
            unmodified model).
    """

    prompt: int
    steering: Steering = ORIGINAL
    sampling: Sampling | None = None
    repetition_penalty: float = 1.0
    contrast: Contrast | None = None

    def __post_init__(self) -> None:
        if not self.repetition_penalty > 0:
            raise ValueError(f"repetition_penalty must be > 0, got {self.repetition_penalty}")
        if self.contrast is not None and self.steering.method != "original":
            raise ValueError("a contrastive stream (CAD, AdaCAD) decodes the unmodified model; "
                             f"it takes no {self.steering.method} steering")

    @property
    def rows(self) -> int:
        """Decoding rows the stream owns: two for JuICE (clean copy, steered row) and for a
        contrast (question row, prompt row), else one."""
        return 2 if self.steering.method == "juice" or self.contrast is not None else 1


@dataclass
class Generation:
    """Greedy continuations, one per stream.

    Attributes:
        tokens: `[n_streams, max_new_tokens]` new token ids.
        texts: the decoded continuations.
        first_probs: `[n_streams, k]` probabilities, at the first step, of the `k` probe tokens
            given per stream (e.g. the parametric and the context answer's first token), or None.
        forced_logprobs: `[n_streams, max_new_tokens]` log-probabilities (nats) of the forced
            tokens (teacher forcing), or None.
    """

    tokens: Tensor
    texts: list[str]
    first_probs: Tensor | None
    forced_logprobs: Tensor | None = None


def join_layer(coefficients: Tensor) -> int:
    """The first layer a steering's `[n_layers, n_heads]` coefficients touch (the last layer
    for all zeros: such a row equals its clean row throughout)."""
    active = torch.nonzero(coefficients.ne(0).any(-1)).flatten()
    return int(active[0]) if active.numel() else coefficients.shape[0] - 1


@dataclass(frozen=True)
class RowLayout:
    """Streams laid out as batch rows (:func:`row_layout`).

    Attributes:
        prompts: per row, the key of the prompt whose tokens it holds.
        plan: the rows' :class:`~juice.interventions.RowPlan` (`[rows, n_layers, n_heads]`).
        out_row: per stream, the row whose logits choose its token.
        question_row: per stream, its question's row (a contrastive stream), else -1.
        owned: per stream, the rows it owns while decoding, in order (:attr:`Stream.rows` of them:
            [clean, steered] for JuICE, [question, prompt] for a contrast); in a shared layout,
            the rows of the prefill whose cache its decoding rows copy.
        join: per row, the layer at which it joins the batch (0: from the embeddings on).
        copies: per row, the row it copies below its join layer (itself where it joins at 0).
    """

    prompts: list[Hashable]
    plan: RowPlan
    out_row: list[int]
    question_row: list[int]
    owned: list[list[int]]
    join: list[int]
    copies: list[int]


def row_layout(geometry: HeadGeometry, streams: Sequence[Stream], prompt_keys: Sequence[Hashable],
               question_keys: Sequence[Hashable | None], *, share: bool, grow: bool = False) -> RowLayout:
    """Streams as batch rows and their RowPlan: the one function that does it (module docstring).

    Args:
        geometry: the model's heads.
        streams: the streams, in order.
        prompt_keys, question_keys: per stream, the key of its prompt and of its contrast's
            question (None without one); streams with equal keys have equal tokens.
        share: the prefill's layout: one clean row per distinct prompt that an Original, JuICE
            or contrastive stream needs (a question too), in sorted key order, then one row per
            JuNE or JuICE stream (a JuICE row adds its prompt's clean row), so a prompt's clean
            prefill is computed once however many steerings it is decoded with. Else the
            decoding layout: each stream owns its rows, in stream order.
        grow: (with `share`) a steered row whose prompt has a clean row joins the batch at the
            first layer it steers, as a copy of that row (below it the two are the same
            computation; :func:`juice.sweeps.grow_rows`); rows are ordered by the layer they join.

    Returns:
        the :class:`RowLayout`.
    """
    zero = torch.zeros(geometry.n_layers, geometry.n_heads)
    prompts: list[Hashable] = []
    scale: list[Tensor] = []
    add: list[Tensor] = []
    source: list[int] = []
    join: list[int] = []
    copies: list[int] = []

    def row(key: Hashable, scale_row: Tensor = zero, add_row: Tensor = zero, src: int = -1, at: int = 0,
            copy: int | None = None) -> int:
        prompts.append(key)
        scale.append(scale_row)
        add.append(add_row)
        source.append(src)
        join.append(at)
        copies.append(len(copies) if copy is None else copy)
        return len(prompts) - 1

    out_row, question_row, owned = [], [], []
    if not share:
        for s, p, q in zip(streams, prompt_keys, question_keys):
            m = s.steering.method
            if m == "juice":
                clean = row(p)
                rows = [clean, row(p, add_row=s.steering.coefficients, src=clean)]
            elif s.contrast is not None:
                rows = [row(q), row(p)]
            else:
                rows = [row(p, scale_row=s.steering.coefficients if m == "june" else zero)]
            owned.append(rows)
            out_row.append(rows[-1])
            question_row.append(rows[0] if s.contrast is not None else -1)
        return RowLayout(prompts, _plan(scale, add, source), out_row, question_row, owned, join, copies)

    needed = {p for s, p in zip(streams, prompt_keys) if s.steering.method in ("original", "juice")}
    needed |= {q for s, q in zip(streams, question_keys) if s.contrast is not None}
    clean_row = {p: row(p) for p in sorted(needed)}
    steered = [k for k, s in enumerate(streams) if s.steering.method != "original"]
    joins = {k: join_layer(streams[k].steering.coefficients) if grow and prompt_keys[k] in clean_row else 0
             for k in steered}
    own_row: dict[int, int] = {}
    for k in sorted(steered, key=lambda k: joins[k]):   # stable: rows in the order they join
        s, p = streams[k], prompt_keys[k]
        juice = s.steering.method == "juice"
        own_row[k] = row(p, s.steering.coefficients if not juice else zero, s.steering.coefficients if juice else zero,
                         clean_row[p] if juice else -1, joins[k], clean_row[p] if joins[k] else None)
    for k, (s, p, q) in enumerate(zip(streams, prompt_keys, question_keys)):
        m = s.steering.method
        if m == "juice":
            rows = [clean_row[p], own_row[k]]
        elif s.contrast is not None:
            rows = [clean_row[q], clean_row[p]]
        else:
            rows = [clean_row[p] if m == "original" else own_row[k]]
        owned.append(rows)
        out_row.append(rows[-1])
        question_row.append(rows[0] if s.contrast is not None else -1)
    return RowLayout(prompts, _plan(scale, add, source), out_row, question_row, owned, join, copies)


def _plan(scale: list[Tensor], add: list[Tensor], source: list[int]) -> RowPlan:
    return RowPlan(torch.stack(scale), torch.stack(add), torch.tensor(source, dtype=torch.long))


__all__ = ["Contrast", "ContrastRule", "Generation", "RowLayout", "Stream", "join_layer", "row_layout"]
