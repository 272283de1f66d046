"""The decoding loop, written once: a :class:`DecodingSession` owns a batch and its KV cache, and
decodes every stream in it one token per step, while streams join and leave between steps
(iteration-level scheduling, Orca; vLLM's continuous batching).

Each :meth:`~DecodingSession.step`

1. drops the streams cancelled since the last step (their rows leave the cache);
2. decodes one token for every running stream (one forward of one token per row);
3. prefills the streams added since the last step, in one forward of their own, left-padded
   among themselves, in the shared layout of :func:`juice.engine.streams.row_layout`: one clean
   row per distinct prompt, then the steered rows, each joining at the first layer it steers
   (the growing prefill), so a prompt's clean prefill is computed once however many steerings,
   JuICE's run 1 and contrastive streams use it; then it picks their first tokens and re-lays
   their cache rows so that every stream owns its rows (a JuICE stream [clean copy, steered],
   a contrastive stream [question copy, prompt copy]; a stream with a
   :class:`~juice.engine.streams.Choice` makes its choice here and keeps the chosen candidate's
   rows only, decoding from then on as that candidate's stream; one without a passage, its
   prompt's ids equal to its question's, was given its `without_passage` candidate when added);
4. retires the streams that finished (EOS, `max_new_tokens`, or a caller's `stop` predicate) and
   merges the new ones' cache rows into the running cache: the shorter cache is left-padded to
   the longer one's length with masked positions, exactly as :func:`juice.tokens.pad_left` pads
   a batch's prompts; columns that every remaining row masks are trimmed.

Token choice (:meth:`DecodingSession._choose`, the one place it happens) reads each stream's
logits row (a contrastive stream's: its rule applied to its prompt's and its question's rows; a
choosing stream's: its chosen candidate's row, the choice made from its prompt's and its
question's unmodified rows),
applies the repetition penalty, records first-step probe probabilities, and takes the forced
token (teacher forcing, with its log-probability), a sampled one or the greedy one.

With `static=True` the cache is a :class:`transformers.StaticCache` sized for the longest prompt
and `max_new_tokens`, fed a full-length mask, so every step has the same shapes (CUDA graphs,
`torch.compile`, `compiled=True`): all streams are added before the first step, and a stream that
finishes keeps its rows (held, its later tokens dropped) until every stream has finished.

A stream's tokens are those it gets alone (batch rows never interact and masked positions add
nothing; tested on tiny models of every architecture, for every steering, joining mid-flight,
greedy and seeded sampling, contrasts, teacher forcing and the static cache). The runtime
batching guard (:mod:`juice.engine.guard`) is the batch driver's (:func:`juice.engine.generate`): a
session that hands out tokens as they come needs an exact backend (the CPU, or one the guard
verified earlier in the process).
"""

from __future__ import annotations

from collections.abc import Callable, Hashable, Sequence
from typing import Any
from contextlib import AbstractContextManager
from dataclasses import dataclass, field, replace

import torch
from torch import Tensor

from juice.architectures import ModelHeads
import juice.engine.forward as fwd
from juice.engine.streams import (ChoiceRule, ContrastRule, Instructed, QuestionAlone, RowLayout, StatefulContrastRule,
                                  Stream, row_layout)
from juice.interventions import RowPlan, planned_rows
from juice.models import LoadedModel
from juice.engine.sampling import penalize_repetition, pick_token
from juice.readout import grow_rows
from juice.tokens import pad_left


@dataclass
class _Live:
    """A stream in the session."""

    key: Hashable
    ids: list[int]
    stream: Stream
    max_new_tokens: int
    stop: Callable[[list[int]], bool] | None
    prompt_key: Hashable
    question_ids: list[int] | None = None
    question_key: Hashable | None = None
    forced: list[int] | None = None
    probes: list[int] | None = None
    logprobs: int | None = None         # return the token's log-probability and this many top ones
    prompt_logprobs: int | None = None  # at the first token, the prompt's log-probabilities and this many top ones
    tokens: list[int] = field(default_factory=list)
    sampler: tuple | None = None
    seen: Tensor | None = None          # [vocab] bool: tokens in the sequence (repetition penalty)
    finished: bool = False              # held in a static batch after its end
    preset: int | None = None           # a choice made from the request's structure (no passage)
    instructed_ids: list[int] | None = None   # a choice's instructed prompt (Instructed candidate)
    instructed_key: Hashable | None = None
    contrast_state: Any = None          # a stateful contrast rule's state (GRD's gate), None before its first step

    @property
    def rows(self) -> int:
        return self.stream.rows


@dataclass(frozen=True)
class StepToken:
    """One stream's token of one step.

    Attributes:
        key: the stream's key (given to :meth:`DecodingSession.add`).
        token: the new token id.
        finished: None while the stream runs; else why it left the batch: "eos" (the session's
            EOS, which is the token), "length" (`max_new_tokens` reached) or "stop" (the `stop`
            predicate held).
        logprob: the token's log-probability (nats) under the stream's steered model, before
            the repetition penalty and the sampling settings (vLLM's "raw" log-probabilities),
            if the stream asked for log-probabilities; else None.
        top: the `logprobs` most probable (token id, log-probability) pairs of that
            distribution, most probable first (empty for `logprobs` = 0), or None.
        probes: at a stream's first token, the probabilities `[k]` of its probe tokens (after
            the repetition penalty and any contrast), if it gave probes; else None.
        forced_logprob: the log-probability (nats, float64 precision) of a forced token, else None.
        choice: at the first token of a stream with a :class:`~juice.engine.streams.Choice`,
            the index of the candidate it chose (its rule's pick, or the choice's
            `without_passage` for a request whose prompt is its question); else None.
        prompt_logprobs: at the first token of a stream added with `prompt_logprobs`, for its
            prompt's tokens 1 .. T-1: (the token's log-probability in nats under the stream's
            steered model, teacher-forced, from the prefill itself; the `prompt_logprobs` most
            probable (token id, log-probability) pairs at its position); else None.
    """

    key: Hashable
    token: int
    finished: str | None
    logprob: float | None = None
    top: tuple[tuple[int, float], ...] | None = None
    probes: Tensor | None = None
    forced_logprob: float | None = None
    choice: int | None = None
    prompt_logprobs: tuple[tuple[float, tuple[tuple[int, float], ...]], ...] | None = None


class DecodingSession:
    """A batch whose streams join and leave between steps (module docstring). Not thread-safe:
    one thread adds, cancels and steps.

    Args:
        lm: the model.
        eos: token id that ends a stream ("eos"); default the tokenizer's; None: none.
        static: the static KV cache (module docstring).
        compiled: decode through :func:`juice.engine.forward.compiled_forward` (needs `static`).
        apply_plan: how a row plan is applied; None: at the steerings' site
            (:func:`juice.engine.forward.plan_applier`).

    Raises:
        ValueError: `compiled` without `static`; (from :meth:`add`) a steered stream at another
            site than the running ones, a contrastive stream without its question, forced tokens
            fewer than `max_new_tokens`, max_new_tokens < 1, an empty prompt, a key already in
            use, or a stream added to a static session that has started.
    """

    def __init__(self, lm: LoadedModel, *, eos: int | None | str = "tokenizer", static: bool = False,
                 compiled: bool = False,
                 apply_plan: Callable[[ModelHeads, RowPlan], AbstractContextManager] | None = None):
        if compiled and not static:
            raise ValueError('compiled decoding needs the static cache (fixed shapes per step)')
        self.lm = lm
        self.eos = lm.tokenizer.eos_token_id if eos == "tokenizer" else eos
        self.static, self.compiled, self.apply_plan = static, compiled, apply_plan
        self.pending: list[_Live] = []
        self.running: list[_Live] = []          # in row order
        self._cache = None
        self._mask: Tensor | None = None        # [rows, positions] 1 for a real position
        self._positions: Tensor | None = None   # [rows] position id of the last token fed
        self._rows: RowLayout | None = None     # the running rows' layout and plan (None: rebuild)
        self._cancelled: set[Hashable] = set()
        self._site: str | None = None
        self._started = False
        self.steps = 0

    # -- the caller's side ------------------------------------------------------------------

    def add(self, key: Hashable, prompt_ids: Sequence[int], stream: Stream, max_new_tokens: int,
            stop: Callable[[list[int]], bool] | None = None, logprobs: int | None = None, *,
            prompt_key: Hashable | None = None, question_ids: Sequence[int] | None = None,
            question_key: Hashable | None = None, forced: Sequence[int] | None = None,
            probes: Sequence[int] | None = None, prompt_logprobs: int | None = None,
            instructed_ids: Sequence[int] | None = None, instructed_key: Hashable | None = None) -> None:
        """Queue a stream; it is prefilled at the next :meth:`step`.

        Args:
            key: the stream's name in :class:`StepToken` and :meth:`cancel`.
            prompt_ids: the prompt's token ids, BOS included (:func:`juice.tokens.token_ids`).
            stream: its steering or contrast, sampling and repetition penalty (`stream.prompt`
                and the contrast's `question` index are unused).
            max_new_tokens: tokens to generate at most.
            stop: called with the stream's new tokens after each step; True ends it ("stop").
            logprobs: return each token's log-probability and the `logprobs` most probable
                tokens' (:class:`StepToken`); None: none.
            prompt_key, question_key: names of the prompt's and the question's tokens: streams
                prefilled together whose keys are equal share a clean row (default: the ids).
                The keys of one prefill must be mutually comparable (sorted).
            question_ids: a contrastive or choosing stream's question's token ids, BOS included.
            instructed_ids, instructed_key: a choosing stream's instructed prompt's token ids
                (BOS included) and key, where a candidate is
                :data:`~juice.engine.streams.INSTRUCTED` (else unused).
            forced: `max_new_tokens` token ids to feed instead of choosing (teacher forcing;
                their log-probabilities are returned).
            probes: token ids whose probabilities at the first step to return.
            prompt_logprobs: return, with the first token, the prompt's teacher-forced
                log-probabilities and the `prompt_logprobs` most probable tokens' at each
                position (:class:`StepToken`), read from the prefill's own forward; None: none.
                Not with a choice of steerings (chosen after the prompt).
        """
        if max_new_tokens < 1:
            raise ValueError(f"max_new_tokens must be at least 1, got {max_new_tokens}")
        if not prompt_ids:
            raise ValueError("empty prompt")
        if self.static and self._started:
            raise ValueError("a static session takes its streams before its first step")
        if stream.contrast is not None and not question_ids:
            raise ValueError("a contrastive stream (CAD, AdaCAD) needs its question's token ids")
        if stream.choice is not None and not question_ids:
            raise ValueError("a stream with a choice of steerings (auto) needs its question's token ids")
        if stream.choice is not None and stream.choice.needs_instruction and not instructed_ids:
            raise ValueError("a stream whose choice may decode the instructed prompt (auto with Prompt) "
                             "needs that prompt's token ids")
        if prompt_logprobs is not None and stream.choice is not None:
            raise ValueError("prompt log-probabilities need the steering before the prompt; a choice is made after it")
        if forced is not None and len(forced) < max_new_tokens:
            raise ValueError(f"forced tokens: {len(forced)} for {max_new_tokens} new tokens")
        for steering in stream.steerings:
            if not steering.steers:
                continue
            if self._site not in (None, steering.site):
                raise ValueError(f"this session steers at {self._site}, not {steering.site}")
            self._site = steering.site
        if any(s.key == key for s in self.pending + self.running):
            raise ValueError(f"a stream named {key!r} is already in the session")
        preset = None
        if stream.choice is not None and list(question_ids) == list(prompt_ids):
            # no passage, by the request's structure (Choice.without_passage): decided here,
            # before any forward, so no floating-point signal can send it to a steered bin
            preset = stream.choice.without_passage
        elif stream.choice is not None and stream.choice.gate is not None:
            preset = stream.choice.gate(prompt_ids, question_ids)   # from the request's tokens
        if preset is not None:
            if isinstance(stream.choice.candidates[preset], QuestionAlone):   # decode the question
                prompt_ids, prompt_key = list(question_ids), question_key
            elif isinstance(stream.choice.candidates[preset], Instructed):   # decode the instructed prompt
                prompt_ids, prompt_key = list(instructed_ids), instructed_key
            stream = stream.chosen(preset)
        sm = stream.sampling
        question = None if question_ids is None or stream.question is None else list(question_ids)
        self.pending.append(_Live(
            key, list(prompt_ids), stream, max_new_tokens, stop,
            tuple(prompt_ids) if prompt_key is None else prompt_key, question,
            None if question is None else (tuple(question) if question_key is None else question_key),
            None if forced is None else list(forced), None if probes is None else list(probes), logprobs,
            prompt_logprobs=prompt_logprobs,
            sampler=None if sm is None else (sm, torch.Generator().manual_seed(sm.seed)), preset=preset,
            instructed_ids=None if stream.choice is None or not stream.choice.needs_instruction
            else list(instructed_ids),
            instructed_key=None if stream.choice is None or not stream.choice.needs_instruction
            else (tuple(instructed_ids) if instructed_key is None else instructed_key)))

    def cancel(self, key: Hashable) -> None:
        """Drop the stream at the next step (its rows leave the batch before any forward)."""
        self._cancelled.add(key)

    @property
    def rows(self) -> int:
        """Rows of the running batch (a JuICE or contrastive stream holds two)."""
        return sum(s.rows for s in self.running)

    @property
    def idle(self) -> bool:
        return not self.pending and not self.running

    @torch.inference_mode()
    def step(self, max_rows: int | None = None) -> list[StepToken]:
        """One decoding step (module docstring): a token for every running stream and for the
        added streams that fit (`max_rows`: the most rows the batch may hold; the others wait
        for a later step, in order; a stream that alone exceeds it still runs when the batch is
        empty).

        Returns:
            the step's tokens, running streams first, then the new ones.
        """
        self._drop_cancelled()
        out: list[StepToken] = []
        if self.running:
            out += self._decode()
        admitted: list[_Live] = []
        used = self.rows
        while self.pending and (max_rows is None or used + self.pending[0].rows <= max_rows or not used):
            admitted.append(self.pending.pop(0))
            used += admitted[-1].rows
        if admitted:
            self._started = True
            out += self._prefill(admitted)
        self._retire({t.key for t in out if t.finished})
        if not self.running and not self.pending:
            self._site = None
        self.steps += 1
        return out

    # -- the batch --------------------------------------------------------------------------

    def _applier(self, streams: list[_Live]) -> Callable[[ModelHeads, RowPlan], AbstractContextManager]:
        return self.apply_plan or fwd.plan_applier(t for s in streams for t in s.stream.steerings)

    def _choose(self, streams: list[_Live], hidden: Tensor, out_rows: list[int], question_rows: list[int],
                options: list[list[list[int]] | None] | None = None) -> tuple[list[StepToken], list[int | None]]:
        """Pick each stream's token from `[rows, hidden]` last hidden states (`out_rows`: each
        stream's logits row; `question_rows`: a contrastive or choosing stream's question row,
        else -1; `options`: a choosing stream's rows per candidate, else None); record it. The
        one place tokens are chosen (module docstring).

        Returns:
            the step's tokens, and per stream the candidate its choice picked (None without one).
        """
        device = self.lm.device
        logits = self.lm.logits(hidden[torch.tensor(out_rows, device=device)]).float()
        picked: list[int | None] = [None] * len(streams)
        by_choice: dict[ChoiceRule, list[int]] = {}
        for r, s in enumerate(streams):
            if s.stream.choice is not None:
                by_choice.setdefault(s.stream.choice.rule, []).append(r)
        for rule, rs in by_choice.items():   # choose from the unmodified rows, then read the chosen row
            question = self.lm.logits(hidden[torch.tensor([question_rows[r] for r in rs], device=device)]).float()
            index = rule(logits[torch.tensor(rs, device=device)], question).tolist()
            for r, c in zip(rs, index):
                picked[r] = int(c)
                live = streams[r]
                alone = live.stream.choice.candidates[int(c)]
                if isinstance(alone, (QuestionAlone, Instructed)) and live.seen is not None:
                    live.seen = torch.zeros_like(live.seen)   # the penalty reads the decoded prompt's tokens
                    read = live.question_ids if isinstance(alone, QuestionAlone) else live.instructed_ids
                    live.seen[torch.tensor(read, device=device)] = True
                live.stream = live.stream.chosen(int(c))   # a contrast is applied below
            rows = torch.tensor([options[r][c][-1] for r, c in zip(rs, index)], device=device)
            logits[torch.tensor(rs, device=device)] = self.lm.logits(hidden[rows]).float()
        by_rule: dict[ContrastRule, list[int]] = {}
        for r, s in enumerate(streams):
            if s.stream.contrast is not None:
                by_rule.setdefault(s.stream.contrast.rule, []).append(r)
        for rule, rs in by_rule.items():
            ks = torch.tensor(rs, device=device)
            question = self.lm.logits(hidden[torch.tensor([question_rows[r] for r in rs], device=device)]).float()
            if isinstance(rule, StatefulContrastRule):   # GRD: one state per stream, carried across steps
                logits[ks], states = rule.step(logits[ks], question, [streams[r].contrast_state for r in rs])
                for r, state in zip(rs, states):
                    streams[r].contrast_state = state
            else:
                logits[ks] = rule(logits[ks], question)
        wanted = [r for r, s in enumerate(streams) if s.logprobs is not None and not s.finished]
        raw = logits[wanted].log_softmax(-1) if wanted else None   # [len(wanted), vocab]
        if any(s.seen is not None for s in streams):
            vocab = logits.shape[-1]
            seen = torch.stack([s.seen if s.seen is not None else torch.zeros(vocab, dtype=torch.bool, device=device)
                                for s in streams])
            penalty = torch.tensor([s.stream.repetition_penalty for s in streams])
            logits = penalize_repetition(logits, seen, penalty)
        probed = [r for r, s in enumerate(streams) if s.probes is not None and not s.tokens and not s.finished]
        probe_probs: dict[int, Tensor] = {}
        if probed:
            probs = logits[probed].softmax(-1)
            for j, r in enumerate(probed):
                probe_probs[r] = probs[j].gather(0, torch.tensor(streams[r].probes, device=device)).cpu()
        forced = [None if s.forced is None or s.finished else s.forced[len(s.tokens)] for s in streams]
        samplers = [None if s.finished else s.sampler for s in streams]
        token_t, forced_lp = pick_token(logits, forced, samplers)
        token = token_t.tolist()
        lps: dict[int, tuple[float, tuple]] = {}
        if wanted:
            chosen = raw.gather(1, torch.tensor([token[r] for r in wanted], device=device)[:, None])[:, 0].tolist()
            most = max(streams[r].logprobs for r in wanted)
            top_v, top_i = raw.topk(most, dim=-1) if most else (raw[:, :0], raw[:, :0].long())
            for j, r in enumerate(wanted):
                k = streams[r].logprobs
                lps[r] = (chosen[j], tuple(zip(top_i[j, :k].tolist(), top_v[j, :k].tolist())))
        out = []
        for r, (s, t) in enumerate(zip(streams, token)):
            if s.finished:   # held in a static batch: fed its last token, nothing recorded
                continue
            s.tokens.append(t)
            if s.seen is not None:
                s.seen[t] = True
            reason = ("eos" if self.eos is not None and t == self.eos else
                      "stop" if s.stop is not None and s.stop(s.tokens) else
                      "length" if len(s.tokens) >= s.max_new_tokens else None)
            lp, top = lps.get(r, (None, None))
            out.append(StepToken(s.key, t, reason, lp, top, probe_probs.get(r),
                                 None if forced_lp is None or forced[r] is None else float(forced_lp[r]),
                                 picked[r] if picked[r] is not None else s.preset if len(s.tokens) == 1 else None))
        return out, picked

    def _decode(self) -> list[StepToken]:
        device = self.lm.device
        feed = torch.tensor([s.tokens[-1] for s in self.running for _ in range(s.rows)], device=device)[:, None]
        self._positions = self._positions + 1
        if not self.static:
            self._mask = torch.cat([self._mask, self._mask.new_ones(self._mask.shape[0], 1)], dim=1)
        if self._rows is None:   # rebuilt only when streams joined or left
            streams = self.running
            self._rows = row_layout(self.lm.geometry, [s.stream for s in streams],
                                    [s.prompt_key for s in streams], [s.question_key for s in streams], share=False)
        step = fwd.compiled_forward(self.lm) if self.compiled else fwd.forward_last
        with self._applier(self.running)(self.lm.heads, self._rows.plan):
            hidden, self._cache = step(self.lm, feed, self._mask, self._positions[:, None], past=self._cache)
        return self._choose(self.running, hidden, self._rows.out_row, self._rows.question_row)[0]

    def _prefill(self, streams: list[_Live]) -> list[StepToken]:
        device = self.lm.device
        applier = self._applier(streams)
        grow = not self.static and applier is planned_rows
        layout = row_layout(self.lm.geometry, [s.stream for s in streams], [s.prompt_key for s in streams],
                            [s.question_key for s in streams], share=True, grow=grow,
                            instructed_keys=[s.instructed_key for s in streams])
        ids_of = ({s.prompt_key: s.ids for s in streams}
                  | {s.question_key: s.question_ids for s in streams if s.question_ids is not None}
                  | {s.instructed_key: s.instructed_ids for s in streams if s.instructed_ids is not None})
        first = sum(j == 0 for j in layout.join)   # rows from the embeddings on
        batch = pad_left([ids_of[k] for k in layout.prompts[:first]], self.lm.tokenizer.pad_token_id or 0)
        ids, mask, positions = (t.to(device) for t in (batch.input_ids, batch.attention_mask, batch.position_ids))
        cache = None
        if self.static:   # written in place; the slots not yet written are hidden by the causal mask
            from transformers import StaticCache

            cache = StaticCache(config=self.lm.config,
                                max_cache_len=ids.shape[1] + max(s.max_new_tokens for s in streams))
        joining = layout.copies[first:]
        echo = [k for k, s in enumerate(streams) if s.prompt_logprobs is not None]
        with applier(self.lm.heads, layout.plan), grow_rows(self.lm.heads, first, joining, layout.join[first:]):
            hidden, cache = fwd.forward_last(self.lm, ids, mask, positions, past=cache, every_position=bool(echo))
        if echo:   # [rows, width, hidden]: the echoed prompts' positions, then the last position as usual
            prompt_lps = {k: self._prompt_logprobs(streams[k], hidden[layout.out_row[k]]) for k in echo}
            hidden = hidden[:, -1]
        n_rows = len(layout.prompts)
        for j in range(max(layout.join)):   # below its join layer a row holds its clean row's cache
            cache.layers[j].reorder_cache(torch.tensor(
                [r if layout.join[r] <= j else layout.copies[r] for r in range(n_rows)], device=device))
        if joining:
            index = torch.tensor(joining, device=device)
            mask, positions = torch.cat([mask, mask[index]]), torch.cat([positions, positions[index]])
        for s in streams:
            if s.stream.repetition_penalty != 1:
                vocab = self.lm.model.get_output_embeddings().weight.shape[0]
                s.seen = torch.zeros(vocab, dtype=torch.bool, device=device)
                s.seen[torch.tensor(s.ids, device=device)] = True
        out, picked = self._choose(streams, hidden, layout.out_row, layout.question_row, layout.options)
        if echo:   # a prefill's streams have not finished, so out[k] is stream k's token
            out = [replace(t, prompt_logprobs=prompt_lps[k]) if k in prompt_lps else t for k, t in enumerate(out)]
        for k, (s, c) in enumerate(zip(streams, picked)):   # a choosing stream keeps its candidate's rows
            if c is not None:
                if s.stream.contrast is None:
                    s.question_ids, s.question_key = None, None
                s.instructed_ids, s.instructed_key = None, None
                layout.owned[k] = layout.options[k][c]
        select = torch.tensor([r for rows in layout.owned for r in rows], device=device)
        cache.reorder_cache(select)
        mask, positions = mask[select], positions[select][:, -1]
        if self.static:   # one full-length mask for every step: fixed shapes
            width = max(s.max_new_tokens for s in streams)
            mask = torch.cat([mask, mask.new_ones(mask.shape[0], width)], dim=1)
        self._merge(streams, cache, mask, positions)
        return out

    def _prompt_logprobs(self, live: _Live, hidden: Tensor) -> tuple:
        """:attr:`StepToken.prompt_logprobs` of one stream from its out row's `[width, hidden]`
        prefill hidden states (left padded: its T tokens are the last T positions)."""
        ids = live.ids
        if len(ids) < 2:
            return ()
        logprobs = self.lm.logits(hidden[hidden.shape[0] - len(ids): -1]).float().log_softmax(-1)   # [T-1, vocab]
        chosen = logprobs.gather(1, torch.tensor(ids[1:], device=logprobs.device)[:, None])[:, 0].tolist()
        k = live.prompt_logprobs
        if not k:
            return tuple((c, ()) for c in chosen)
        values, index = logprobs.topk(k, dim=-1)
        return tuple((c, tuple(zip(i, v))) for c, i, v in zip(chosen, index.tolist(), values.tolist()))

    def _merge(self, streams: list[_Live], cache, mask: Tensor, positions: Tensor) -> None:
        """Append the prefilled `streams` (their cache, `[rows, positions]` mask and `[rows]`
        positions) to the batch."""
        self._rows = None
        if not self.running:
            self.running, self._cache, self._mask, self._positions = list(streams), cache, mask, positions
            return
        have, new = self._mask.shape[1], mask.shape[1]
        length = max(have, new)
        fwd.pad_cache(self._cache, have, length)
        fwd.pad_cache(cache, new, length)
        self._mask = torch.cat([self._mask.new_zeros(self._mask.shape[0], length - have), self._mask], dim=1)
        mask = torch.cat([mask.new_zeros(mask.shape[0], length - new), mask], dim=1)
        fwd.concat_cache(self._cache, cache)
        self._mask = torch.cat([self._mask, mask], dim=0)
        self._positions = torch.cat([self._positions, positions])
        self.running += streams

    def _keep(self, keep: list[bool]) -> None:
        """Keep the running streams flagged True; drop the others' rows; trim the padding. A
        static batch keeps every row (fixed shapes): the others are held until all have ended."""
        if all(keep):
            return
        if self.static:
            for s, k in zip(self.running, keep):
                s.finished = s.finished or not k
            if all(s.finished for s in self.running):
                self.running, self._cache, self._mask, self._positions, self._rows = [], None, None, None, None
            return
        rows, at = [], 0
        for s, k in zip(self.running, keep):
            if k:
                rows += range(at, at + s.rows)
            at += s.rows
        self.running = [s for s, k in zip(self.running, keep) if k]
        self._rows = None
        if not self.running:
            self._cache = self._mask = self._positions = None
            return
        index = torch.tensor(rows, device=self._mask.device)
        self._cache.reorder_cache(index)
        self._mask, self._positions = self._mask[index], self._positions[index]
        drop = int(self._mask.any(0).long().argmax())   # leading columns every row masks
        if drop:
            fwd.trim_cache(self._cache, self._mask.shape[1], drop)
            self._mask = self._mask[:, drop:]

    def _retire(self, finished: set[Hashable]) -> None:
        if finished:
            self._keep([s.key not in finished for s in self.running])

    def _drop_cancelled(self) -> None:
        if not self._cancelled:
            return
        gone = self._cancelled
        self._cancelled = set()
        self.pending = [s for s in self.pending if s.key not in gone]
        self._keep([s.key not in gone for s in self.running])


__all__ = ["DecodingSession", "StepToken"]
