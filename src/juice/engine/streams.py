"""What the engine decodes: a :class:`Stream` (a prompt under a steering or a contrast policy,
greedy or sampled), its result (:class:`Generation`), and how a batch of streams becomes rows
and a :class:`~juice.interventions.RowPlan` (:func:`row_layout`, the one place that does it).

Rows (paper Stage 2): an Original stream decodes one unmodified row; a JuNE stream one row whose
heads are scaled (Alg. 4); a JuICE stream two, an unmodified copy (run 1) and the steered row
that adds beta times the copy's head outputs (run 2, Alg. 1), both fed the steered row's tokens;
a contrastive stream (CAD, AdaCAD) two unmodified rows, its question's and its prompt's, both fed
the token chosen from their contrasted logits; a stream with a :class:`Choice` (juice's `auto`,
:mod:`juice.when_to_steer.auto`) is prefilled with its prompt's and its question's unmodified rows and one row
per candidate steering, picks a candidate from the first step's two unmodified distributions,
and decodes from then on exactly as that candidate's stream (its other rows leave the batch).
"""

from __future__ import annotations

from collections.abc import Callable, Hashable, Sequence
from dataclasses import dataclass, replace
from typing import Any, Protocol, runtime_checkable

import torch
from torch import Tensor

from juice.architectures import HeadGeometry
from juice.interventions import RowPlan
from juice.engine.sampling import Sampling
from juice.steering import ORIGINAL, Steering

ContrastRule = Callable[[Tensor, Tensor], Tensor]
"""(`[rows, vocab]` logits of the prompt's rows, `[rows, vocab]` logits of the question's rows)
-> `[rows, vocab]` logits to choose the next tokens from; row `r` of the result may depend on row
`r` of the inputs only."""


@runtime_checkable
class StatefulContrastRule(Protocol):
    """A contrast rule that remembers, per stream, what it decided at earlier steps (GRD's gate,
    :class:`juice.baselines.grd.GrdPolicy`): the engine keeps one state per stream, None before
    the stream's first step, and passes it back at the next.

    `step(prompt logits, question logits, states)` takes `[rows, vocab]` logits and one state per
    row, and returns (`[rows, vocab]` logits to choose the next tokens from, the rows' new
    states); row `r` of the result may depend on row `r` of the inputs and state `r` only.
    """

    def step(self, with_context: Tensor, without_context: Tensor, states: list[Any]
             ) -> tuple[Tensor, list[Any]]: ...


@dataclass(frozen=True)
class Contrast:
    """A contrastive decoding policy of a :class:`Stream`: the stream decodes two unmodified rows
    side by side, its prompt and `prompts[question]`, each with its KV cache rows, both fed the
    chosen token, which is chosen from `rule(prompt logits, question logits)`.

    CAD and AdaCAD (:class:`juice.baselines.cad.CadPolicy`, Shi et al. 2023, Eq. 2; Wang et al.
    2025) are such rules. Streams with equal rules are combined in one call per step.

    Attributes:
        question: index of the second prompt (CAD: the question without its context).
        rule: a :data:`ContrastRule`, or a :class:`StatefulContrastRule` (hashable: the streams
            are grouped by it).
    """

    question: int
    rule: "ContrastRule | StatefulContrastRule"


@dataclass(frozen=True)
class QuestionAlone:
    """A :class:`Choice`'s candidate that ignores the passage: the stream decodes its question
    alone (`prompts[choice.question]`) with the unmodified model, from the question's row that
    the choice's prefill already holds; exactly as an Original stream on the question (its
    repetition penalty reads the question's tokens)."""


QUESTION_ALONE = QuestionAlone()
"""The one :class:`QuestionAlone` candidate."""


@dataclass(frozen=True)
class Instructed:
    """A :class:`Choice`'s candidate that decodes the request's instructed prompt
    (`prompts[choice.instructed]`: the Prompt baseline's instruction before the prompt, paper
    App. D.1) with the unmodified model, from that prompt's row, which the choice's prefill
    holds beside the prompt's and the question's; exactly as an Original stream on the
    instructed prompt (its repetition penalty reads the instructed prompt's tokens). The
    instructed prompt's text is the caller's (its form depends on the data,
    :func:`juice.baselines.prompt.instructed_context_item`), as the question's is."""


INSTRUCTED = Instructed()
"""The one :class:`Instructed` candidate."""


ChoiceRule = Callable[[Tensor, Tensor], Tensor]
"""(`[rows, vocab]` first-step logits of the prompts' unmodified rows, `[rows, vocab]` those of
their questions' rows) -> `[rows]` long: per row, the index of the candidate to decode with; row
`r` of the result may depend on row `r` of the inputs only."""


@dataclass(frozen=True)
class Choice:
    """A per-request choice of steering (juice's `auto`, :mod:`juice.when_to_steer.auto`): at the first step the
    stream's prompt and `prompts[question]` are prefilled unmodified, `rule` reads their two
    next-token distributions and picks one of `candidates`; the first token and every later one
    are then decoded exactly as a stream with that steering (`Stream(prompt, candidates[c])`):
    only the prefill costs more (one question row and one row per steered candidate, each joining
    at the first layer it steers).

    Attributes:
        question: index of the question without its context.
        candidates: what to choose from: steerings (one site; Original, JuNE or JuICE),
            contrasts (CAD, AdaCAD: a :class:`Contrast` whose `question` is ignored, the
            choice's is used), :data:`QUESTION_ALONE` (the question without the passage),
            whose rows the prefill already holds, or :data:`INSTRUCTED` (the instructed
            prompt, `instructed`).
        rule: a :data:`ChoiceRule` (hashable: streams are grouped by it).
        instructed: index of the instructed prompt (:data:`INSTRUCTED`'s), or None where no
            candidate is :data:`INSTRUCTED`.
        gate: optional, called at :meth:`~juice.engine.DecodingSession.add` with the request's
            prompt and question token ids (BOS included) when it has a passage: a candidate
            index to decode with, decided from the request's tokens before any forward (e.g.
            :class:`juice.when_to_steer.signals.RelevanceGate`: a passage that shares too few of the question's
            words goes to the question alone), or None to let `rule` choose. Hashable.
        without_passage: the candidate (index) a request without a passage decodes with. That a
            request has no passage is read from its structure, never from the rule's signal:
            its prompt's token ids equal its question's (the prompt *is* the question; a caller
            says "no context" by giving the prompt as its own question). The rule is not called
            for such a request: a floating-point signal computed from two rows at different
            places in a batch agrees with the exact 0 only to about 1e-8 in fp32, and how
            closely depends on the processor's kernels.

    Raises:
        ValueError: no candidate, steerings at two sites, or `without_passage` outside the
            candidates.
    """

    question: int
    candidates: tuple["Steering | Contrast | QuestionAlone | Instructed", ...]
    rule: ChoiceRule
    without_passage: int = 0
    gate: "Callable[[Sequence[int], Sequence[int]], int | None] | None" = None
    instructed: int | None = None

    @property
    def needs_instruction(self) -> bool:
        """One of its candidates is :data:`INSTRUCTED` (its stream needs the instructed prompt)."""
        return any(isinstance(c, Instructed) for c in self.candidates)

    def __post_init__(self) -> None:
        if not self.candidates:
            raise ValueError("a choice needs at least one candidate steering")
        if not 0 <= self.without_passage < len(self.candidates):
            raise ValueError(f"without_passage {self.without_passage} is not one of the {len(self.candidates)} candidates")
        if len({c.site for c in self.candidates if isinstance(c, Steering) and c.steers}) > 1:
            raise ValueError("a choice's candidate steerings must share a site")


@dataclass(frozen=True)
class Stream:
    """One generation request: the prompt at index `prompt`, decoded under `steering`, or with a
    `contrast` policy (CAD, AdaCAD), or a `choice` among steerings made at the first step
    (:class:`Choice`), greedily or with `sampling`.

    `repetition_penalty` is Hugging Face's (CTRL, Keskar et al. 2019): before choosing, the logit
    of every token already in the sequence (prompt, BOS included, and new tokens) is divided by
    it if positive and multiplied by it if negative; 1 leaves the logits alone. Under a contrast,
    sampling, the penalty and the probabilities returned apply to the contrasted logits (the
    penalty's sequence is the stream's prompt and its new tokens).

    Raises:
        ValueError: repetition_penalty <= 0, a contrast with a steering (CAD decodes the
            unmodified model), or a choice with a steering or a contrast.
    """

    prompt: int
    steering: Steering = ORIGINAL
    sampling: Sampling | None = None
    repetition_penalty: float = 1.0
    contrast: Contrast | None = None
    choice: Choice | None = None

    def __post_init__(self) -> None:
        if not self.repetition_penalty > 0:
            raise ValueError(f"repetition_penalty must be > 0, got {self.repetition_penalty}")
        if self.contrast is not None and self.steering.steers:
            raise ValueError("a contrastive stream (CAD, AdaCAD) decodes the unmodified model; "
                             f"it takes no {self.steering.kind} steering")
        if self.choice is not None and (self.contrast is not None or self.steering.steers):
            raise ValueError("a stream with a choice of steerings takes no steering and no contrast of its own")

    @property
    def rows(self) -> int:
        """Decoding rows the stream owns: two for JuICE (clean copy, steered row) and for a
        contrast (question row, prompt row), else one; with a choice, the most any candidate owns."""
        if self.choice is not None:
            return max(2 if isinstance(c, Contrast) or (isinstance(c, Steering) and c.dual_run) else 1
                       for c in self.choice.candidates)
        return 2 if self.steering.dual_run or self.contrast is not None else 1

    @property
    def question(self) -> int | None:
        """The index of its contrast's or its choice's question, else None."""
        policy = self.contrast or self.choice
        return None if policy is None else policy.question

    @property
    def instructed(self) -> int | None:
        """The index of its choice's instructed prompt (:data:`INSTRUCTED`), else None."""
        return None if self.choice is None or not self.choice.needs_instruction else self.choice.instructed

    @property
    def steerings(self) -> tuple[Steering, ...]:
        """Every steering the stream may decode with (its own, or its choice's candidates)."""
        if self.choice is not None:
            return tuple(c for c in self.choice.candidates if isinstance(c, Steering))
        return (self.steering,)

    def chosen(self, index: int) -> "Stream":
        """This stream decoded with its choice's candidate `index` (no choice left; a contrast
        candidate contrasts with the choice's question)."""
        c = self.choice.candidates[index]
        if isinstance(c, Contrast):
            return replace(self, contrast=Contrast(self.choice.question, c.rule), choice=None)
        if isinstance(c, (QuestionAlone, Instructed)):   # the session keeps that prompt's row
            return replace(self, steering=ORIGINAL, choice=None)
        return replace(self, steering=c, choice=None)


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
        question_row: per stream, its question's row (a contrastive stream, a choice), else -1.
        owned: per stream, the rows it owns while decoding, in order (:attr:`Stream.rows` of them:
            [clean, steered] for JuICE, [question, prompt] for a contrast); in a shared layout,
            the rows of the prefill whose cache its decoding rows copy ([] for a choice).
        options: per stream with a choice (shared layout only), per candidate the rows it would
            own (its `out_row` is the prompt's unmodified row, the choice's signal); else None.
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
    options: list[list[list[int]] | None] | None = None


def row_layout(geometry: HeadGeometry, streams: Sequence[Stream], prompt_keys: Sequence[Hashable],
               question_keys: Sequence[Hashable | None], *, share: bool, grow: bool = False,
               instructed_keys: Sequence[Hashable | None] | None = None) -> RowLayout:
    """Streams as batch rows and their RowPlan: the one function that does it (module docstring).

    Args:
        geometry: the model's heads.
        streams: the streams, in order.
        prompt_keys, question_keys: per stream, the key of its prompt and of its contrast's
            question (None without one); streams with equal keys have equal tokens.
        instructed_keys: per stream, the key of its choice's instructed prompt (None without
            one; :class:`Instructed`); None: no stream has one.
        share: the prefill's layout: one clean row per distinct prompt that an Original, JuICE,
            contrastive or choosing stream needs (a question too), in sorted key order, then one
            row per JuNE or JuICE stream and per steered candidate of a choice (a JuICE row adds
            its prompt's clean row), so a prompt's clean prefill is computed once however many
            steerings it is decoded with. Else the decoding layout: each stream owns its rows, in
            stream order (no stream may have a choice left: it is made at the prefill).
        grow: (with `share`) a steered row whose prompt has a clean row joins the batch at the
            first layer it steers, as a copy of that row (below it the two are the same
            computation; :func:`juice.readout.grow_rows`); rows are ordered by the layer they join.

    Returns:
        the :class:`RowLayout`.
    """
    rows = _Rows(geometry)
    if not share:
        return _decoding_layout(rows, streams, prompt_keys, question_keys)
    zero, row = rows.zero, rows.row
    out_row, question_row, owned = [], [], []
    needed = {p for s, p in zip(streams, prompt_keys) if s.steering.dual_run or not s.steering.steers}
    needed |= {q for s, q in zip(streams, question_keys) if s.contrast is not None or s.choice is not None}
    needed |= {p for s, p in zip(streams, prompt_keys) if s.choice is not None}
    instructed_keys = [None] * len(streams) if instructed_keys is None else list(instructed_keys)
    needed |= {i for s, i in zip(streams, instructed_keys) if s.choice is not None and s.choice.needs_instruction}
    clean_row = {p: row(p) for p in sorted(needed)}
    # (stream, candidate) for every steered row: a stream's own steering is candidate -1
    steered = [(k, c) for k, s in enumerate(streams)
               for c, st in (enumerate(s.choice.candidates) if s.choice is not None else [(-1, s.steering)])
               if isinstance(st, Steering) and st.steers]

    def steering_of(k: int, c: int) -> Steering:
        return streams[k].steering if c < 0 else streams[k].choice.candidates[c]

    joins = {kc: join_layer(steering_of(*kc).coefficients) if grow and prompt_keys[kc[0]] in clean_row else 0
             for kc in steered}
    own_row: dict[tuple[int, int], int] = {}
    for k, c in sorted(steered, key=lambda kc: joins[kc]):   # stable: rows in the order they join
        st, p = steering_of(k, c), prompt_keys[k]
        scale_row, add_row = st.scale_add(zero)
        own_row[k, c] = row(p, scale_row, add_row, clean_row[p] if st.dual_run else -1, joins[k, c],
                            clean_row[p] if joins[k, c] else None)

    def rows_of(k: int, c: int, st: "Steering | Contrast | QuestionAlone | Instructed") -> list[int]:
        p = prompt_keys[k]
        if isinstance(st, Contrast):   # a choice's contrast candidate: [question, prompt]
            return [clean_row[question_keys[k]], clean_row[p]]
        if isinstance(st, QuestionAlone):
            return [clean_row[question_keys[k]]]
        if isinstance(st, Instructed):
            return [clean_row[instructed_keys[k]]]
        return ([clean_row[p], own_row[k, c]] if st.dual_run else
                [clean_row[p]] if not st.steers else [own_row[k, c]])

    options: list[list[list[int]] | None] = []
    for k, (s, p, q) in enumerate(zip(streams, prompt_keys, question_keys)):
        if s.choice is not None:
            options.append([rows_of(k, c, st) for c, st in enumerate(s.choice.candidates)])
            owned.append([])
            out_row.append(clean_row[p])
            question_row.append(clean_row[q])
            continue
        options.append(None)
        own = [clean_row[q], clean_row[p]] if s.contrast is not None else rows_of(k, -1, s.steering)
        owned.append(own)
        out_row.append(own[-1])
        question_row.append(own[0] if s.contrast is not None else -1)
    return rows.layout(out_row, question_row, owned, options)


class _Rows:
    """A layout's rows as they are added (:func:`row_layout`): per row its prompt key, scale and
    add rows (`[n_layers, n_heads]`), clean source row, join layer and the row it copies."""

    def __init__(self, geometry: HeadGeometry):
        self.zero = torch.zeros(geometry.n_layers, geometry.n_heads)
        self.prompts: list[Hashable] = []
        self.scale: list[Tensor] = []
        self.add: list[Tensor] = []
        self.source: list[int] = []
        self.join: list[int] = []
        self.copies: list[int] = []

    def row(self, key: Hashable, scale_row: Tensor | None = None, add_row: Tensor | None = None, src: int = -1,
            at: int = 0, copy: int | None = None) -> int:
        """Add a row; returns its index."""
        self.prompts.append(key)
        self.scale.append(self.zero if scale_row is None else scale_row)
        self.add.append(self.zero if add_row is None else add_row)
        self.source.append(src)
        self.join.append(at)
        self.copies.append(len(self.copies) if copy is None else copy)
        return len(self.prompts) - 1

    def layout(self, out_row: list[int], question_row: list[int], owned: list[list[int]],
               options: list | None = None) -> RowLayout:
        plan = RowPlan(torch.stack(self.scale), torch.stack(self.add), torch.tensor(self.source, dtype=torch.long))
        return RowLayout(self.prompts, plan, out_row, question_row, owned, self.join, self.copies, options)


def _decoding_layout(rows: _Rows, streams: Sequence[Stream], prompt_keys: Sequence[Hashable],
                     question_keys: Sequence[Hashable | None]) -> RowLayout:
    """:func:`row_layout` without `share`: each stream owns its rows, in stream order."""
    out_row, question_row, owned = [], [], []
    for s, p, q in zip(streams, prompt_keys, question_keys):
        if s.choice is not None:
            raise ValueError("a choice of steerings is made at the prefill; decode the chosen stream")
        scale_row, add_row = s.steering.scale_add(rows.zero)
        if s.steering.dual_run:
            clean = rows.row(p)
            own = [clean, rows.row(p, add_row=add_row, src=clean)]
        elif s.contrast is not None:
            own = [rows.row(q), rows.row(p)]
        else:
            own = [rows.row(p, scale_row=scale_row)]
        owned.append(own)
        out_row.append(own[-1])
        question_row.append(own[0] if s.contrast is not None else -1)
    return rows.layout(out_row, question_row, owned)


__all__ = ["INSTRUCTED", "QUESTION_ALONE", "Choice", "ChoiceRule", "Contrast", "ContrastRule", "Generation", "Instructed", "QuestionAlone", "RowLayout",
           "StatefulContrastRule", "Stream", "join_layer", "row_layout"]
