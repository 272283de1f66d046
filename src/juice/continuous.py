"""Continuous batching (iteration-level scheduling, Orca; vLLM's continuous batching): a
decoding session whose streams join and leave the running batch between steps.

:func:`juice.decoding.generate` decodes a fixed set of streams to the end. A server cannot wait
for that: a short request beside a long one would be answered only when the long one finishes.
A :class:`DecodingSession` keeps one batch and one KV cache alive across calls of
:meth:`~DecodingSession.step`; each step

1. drops the streams cancelled since the last step (their rows leave the cache);
2. decodes one token for every running stream (one forward of one token per row);
3. prefills the streams added since the last step (in one forward of their own, left-padded among
   themselves) and picks their first token;
4. retires the streams that finished (EOS, `max_new_tokens`, or a caller's `stop` predicate) and
   merges the new ones' cache rows into the running cache: the shorter cache is left-padded to
   the longer one's length with masked positions, exactly as :func:`juice.tokens.pad_left`
   pads a batch's prompts; columns that every remaining row masks are trimmed.

Rows and steerings are those of :func:`juice.decoding.generate` (see its module docstring): an
Original stream owns one unmodified row, a JuNE stream one scaled row, a JuICE stream two rows,
an unmodified copy (run 1) and the steered row adding beta times the copy's head outputs
(run 2, paper Alg. 1), both fed the steered row's tokens. A stream's tokens are those it gets
from :func:`~juice.decoding.generate` alone (greedy and seeded sampling, repetition penalty
included; tested on tiny models of every sliding-window kind), because batch rows never
interact and masked positions add nothing.

Deviations from :func:`~juice.decoding.generate`: a JuICE stream prefills its own clean row
(streams are not grouped by prompt, since they arrive one by one); contrastive streams (CAD,
AdaCAD), teacher forcing, the static KV cache and `torch.compile` are not supported (the
server does not serve them); and the runtime batching guard (:mod:`juice.guard`) is not run,
since tokens are handed out as they come, so the session, like streaming, needs an exact backend
(the CPU, or one the guard verified earlier in the process).
"""

from __future__ import annotations

from collections.abc import Callable, Hashable, Sequence
from dataclasses import dataclass, field

import torch
from torch import Tensor

from juice.decoding import Stream, forward_last, plan_applier
from juice.interventions import RowPlan
from juice.models import LoadedModel
from juice.sampling import penalize_repetition, pick_token
from juice.tokens import pad_left


@dataclass
class _Live:
    """A stream in the session."""

    key: Hashable
    ids: list[int]
    stream: Stream
    max_new_tokens: int
    stop: Callable[[list[int]], bool] | None
    tokens: list[int] = field(default_factory=list)
    sampler: tuple | None = None
    seen: Tensor | None = None          # [vocab] bool: tokens in the sequence (repetition penalty)
    position: int = 0                   # position id of the last token fed
    logprobs: int | None = None         # return the token's log-probability and this many top ones

    @property
    def rows(self) -> int:
        return self.stream.rows


@dataclass(frozen=True)
class StepToken:
    """One stream's token of one step.

    Attributes:
        key: the stream's key (given to :meth:`DecodingSession.add`).
        token: the new token id.
        finished: None while the stream runs; else why it left the batch: "eos" (the tokenizer's
            EOS, which is the token), "length" (`max_new_tokens` reached) or "stop" (the `stop`
            predicate held).
        logprob: the token's log-probability (nats) under the stream's steered model, before
            the repetition penalty and the sampling settings (vLLM's "raw" log-probabilities),
            if the stream asked for log-probabilities; else None.
        top: the `logprobs` most probable (token id, log-probability) pairs of that
            distribution, most probable first (empty for `logprobs` = 0), or None.
    """

    key: Hashable
    token: int
    finished: str | None
    logprob: float | None = None
    top: tuple[tuple[int, float], ...] | None = None


def _layers(cache) -> list:
    layers = getattr(cache, "layers", None)
    if layers is None:
        raise TypeError(f"continuous batching needs a transformers Cache with layers, got {type(cache).__name__}")
    return layers


def _stored(layer, length: int) -> int:
    """Positions a layer keeps of `length` cached ones (a sliding-window layer its last W - 1)."""
    window = getattr(layer, "sliding_window", None)
    return length if window is None else min(length, window - 1)


def _pad_cache(cache, length: int, to: int) -> None:
    """Left-pad every layer of `cache` (holding `length` positions) to `to` positions with zeros
    (the attention mask hides them)."""
    if to == length:
        return
    for layer in _layers(cache):
        if not getattr(layer, "is_initialized", False):
            continue
        extra = _stored(layer, to) - _stored(layer, length)
        if extra:
            pad = layer.keys.new_zeros(*layer.keys.shape[:2], extra, layer.keys.shape[-1])
            layer.keys = torch.cat([pad, layer.keys], dim=-2)
            pad = layer.values.new_zeros(*layer.values.shape[:2], extra, layer.values.shape[-1])
            layer.values = torch.cat([pad, layer.values], dim=-2)
        if hasattr(layer, "cumulative_length"):
            layer.cumulative_length = to


def _trim_cache(cache, length: int, drop: int) -> None:
    """Drop the first `drop` of `length` positions of every layer (masked in every row)."""
    for layer in _layers(cache):
        if not getattr(layer, "is_initialized", False):
            continue
        cut = _stored(layer, length) - _stored(layer, length - drop)
        if cut:
            layer.keys, layer.values = layer.keys[:, :, cut:], layer.values[:, :, cut:]
        if hasattr(layer, "cumulative_length"):
            layer.cumulative_length = length - drop


def _concat_cache(cache, other) -> None:
    """Append `other`'s rows to `cache` (both hold the same number of positions)."""
    for layer, extra in zip(_layers(cache), _layers(other), strict=True):
        if getattr(layer, "is_initialized", False):
            layer.keys = torch.cat([layer.keys, extra.keys], dim=0)
            layer.values = torch.cat([layer.values, extra.values], dim=0)


class DecodingSession:
    """A batch whose streams join and leave between steps (module docstring). Not thread-safe:
    one thread adds, cancels and steps.

    Args:
        lm: the model.
        eos: token id that ends a stream ("eos"); default the tokenizer's; None: none.

    Raises:
        ValueError: (from :meth:`add`) a steered stream at another site than the running ones, a
            contrastive stream, max_new_tokens < 1, an empty prompt, or a key already in use.
    """

    def __init__(self, lm: LoadedModel, *, eos: int | None | str = "tokenizer"):
        self.lm = lm
        self.eos = lm.tokenizer.eos_token_id if eos == "tokenizer" else eos
        self.pending: list[_Live] = []
        self.running: list[_Live] = []          # in row order; a JuICE stream's rows are [clean, steered]
        self._cache = None
        self._mask: Tensor | None = None        # [rows, positions] 1 for a real position
        self._cancelled: set[Hashable] = set()
        self._site: str | None = None
        self.steps = 0

    # -- the caller's side ------------------------------------------------------------------

    def add(self, key: Hashable, prompt_ids: Sequence[int], stream: Stream, max_new_tokens: int,
            stop: Callable[[list[int]], bool] | None = None, logprobs: int | None = None) -> None:
        """Queue a stream; it is prefilled at the next :meth:`step`.

        Args:
            key: the stream's name in :class:`StepToken` and :meth:`cancel`.
            prompt_ids: the prompt's token ids, BOS included (:func:`juice.tokens.token_ids`).
            stream: its steering, sampling and repetition penalty (`stream.prompt` is unused).
            max_new_tokens: tokens to generate at most.
            stop: called with the stream's new tokens after each step; True ends it ("stop").
            logprobs: return each token's log-probability and the `logprobs` most probable
                tokens' (:class:`StepToken`); None: none.
        """
        if max_new_tokens < 1:
            raise ValueError(f"max_new_tokens must be at least 1, got {max_new_tokens}")
        if not prompt_ids:
            raise ValueError("empty prompt")
        if stream.contrast is not None:
            raise ValueError("continuous batching does not decode contrastive streams (CAD, AdaCAD)")
        if stream.steering.method != "original":
            if self._site not in (None, stream.steering.site):
                raise ValueError(f"this session steers at {self._site}, not {stream.steering.site}")
            self._site = stream.steering.site
        if any(s.key == key for s in self.pending + self.running):
            raise ValueError(f"a stream named {key!r} is already in the session")
        sm = stream.sampling
        sampler = None if sm is None else (sm, torch.Generator().manual_seed(sm.seed))
        self.pending.append(_Live(key, list(prompt_ids), stream, max_new_tokens, stop, sampler=sampler,
                                  logprobs=logprobs))

    def cancel(self, key: Hashable) -> None:
        """Drop the stream at the next step (its rows leave the batch before any forward)."""
        self._cancelled.add(key)

    @property
    def rows(self) -> int:
        """Rows of the running batch (a JuICE stream holds two)."""
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
            out += self._prefill(admitted)
        self._retire({t.key for t in out if t.finished})
        if not self.running and not self.pending:
            self._site = None
        self.steps += 1
        return out

    # -- the batch --------------------------------------------------------------------------

    def _apply(self, streams: list[_Live]):
        """The RowPlan of `streams` laid out as in the batch, and its applier."""
        geometry = self.lm.heads.geometry
        zero = torch.zeros(geometry.n_layers, geometry.n_heads)
        scale, add, source = [], [], []
        for s in streams:
            st = s.stream.steering
            if st.method == "juice":
                scale += [zero, zero]
                add += [zero, st.coefficients]
                source += [-1, len(source)]
            else:
                scale.append(st.coefficients if st.method == "june" else zero)
                add.append(zero)
                source.append(-1)
        plan = RowPlan(torch.stack(scale), torch.stack(add), torch.tensor(source))
        return plan_applier(s.stream.steering for s in streams)(self.lm.heads, plan)

    @staticmethod
    def _out_rows(streams: list[_Live]) -> list[int]:
        """Each stream's logits row (a JuICE stream's steered row, its second)."""
        rows, at = [], 0
        for s in streams:
            at += s.rows
            rows.append(at - 1)
        return rows

    def _choose(self, streams: list[_Live], hidden: Tensor) -> list[StepToken]:
        """Pick each stream's token from `[rows, hidden]` last hidden states; record it."""
        device = self.lm.device
        logits = self.lm.logits(hidden[torch.tensor(self._out_rows(streams), device=device)]).float()
        wanted = [r for r, s in enumerate(streams) if s.logprobs is not None]
        raw = logits[wanted].log_softmax(-1) if wanted else None   # [len(wanted), vocab]
        if any(s.seen is not None for s in streams):
            vocab = logits.shape[-1]
            seen = torch.stack([s.seen if s.seen is not None else torch.zeros(vocab, dtype=torch.bool, device=device)
                                for s in streams])
            penalty = torch.tensor([s.stream.repetition_penalty for s in streams])
            logits = penalize_repetition(logits, seen, penalty)
        samplers = [s.sampler for s in streams]
        token = pick_token(logits, None, 0, [], samplers if any(samplers) else None).tolist()
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
            s.tokens.append(t)
            if s.seen is not None:
                s.seen[t] = True
            reason = ("eos" if self.eos is not None and t == self.eos else
                      "stop" if s.stop is not None and s.stop(s.tokens) else
                      "length" if len(s.tokens) >= s.max_new_tokens else None)
            lp, top = lps.get(r, (None, None))
            out.append(StepToken(s.key, t, reason, lp, top))
        return out

    def _decode(self) -> list[StepToken]:
        device = self.lm.device
        feed = torch.tensor([s.tokens[-1] for s in self.running for _ in range(s.rows)], device=device)[:, None]
        for s in self.running:
            s.position += 1
        positions = torch.tensor([s.position for s in self.running for _ in range(s.rows)], device=device)[:, None]
        self._mask = torch.cat([self._mask, self._mask.new_ones(self._mask.shape[0], 1)], dim=1)
        with self._apply(self.running):
            hidden, self._cache = forward_last(self.lm, feed, self._mask, positions, past=self._cache)
        return self._choose(self.running, hidden)

    def _prefill(self, streams: list[_Live]) -> list[StepToken]:
        device = self.lm.device
        rows = [s.ids for s in streams for _ in range(s.rows)]
        batch = pad_left(rows, self.lm.tokenizer.pad_token_id or 0)
        ids, mask, positions = (t.to(device) for t in (batch.input_ids, batch.attention_mask, batch.position_ids))
        with self._apply(streams):
            hidden, cache = forward_last(self.lm, ids, mask, positions, past=None)
        for s in streams:
            s.position = len(s.ids) - 1
            if s.stream.repetition_penalty != 1:
                vocab = self.lm.model.get_output_embeddings().weight.shape[0]
                s.seen = torch.zeros(vocab, dtype=torch.bool, device=device)
                s.seen[torch.tensor(s.ids, device=device)] = True
        out = self._choose(streams, hidden)
        self._merge(streams, cache, mask)
        return out

    def _merge(self, streams: list[_Live], cache, mask: Tensor) -> None:
        """Append the prefilled `streams` (their cache and `[rows, positions]` mask) to the batch."""
        if not self.running:
            self.running, self._cache, self._mask = list(streams), cache, mask
            return
        have, new = self._mask.shape[1], mask.shape[1]
        length = max(have, new)
        _pad_cache(self._cache, have, length)
        _pad_cache(cache, new, length)
        self._mask = torch.cat([self._mask.new_zeros(self._mask.shape[0], length - have), self._mask], dim=1)
        mask = torch.cat([mask.new_zeros(mask.shape[0], length - new), mask], dim=1)
        _concat_cache(self._cache, cache)
        self._mask = torch.cat([self._mask, mask], dim=0)
        self.running += streams

    def _keep(self, keep: list[bool]) -> None:
        """Keep the running streams flagged True; drop the others' rows; trim the padding."""
        if all(keep):
            return
        rows, at = [], 0
        for s, k in zip(self.running, keep):
            if k:
                rows += range(at, at + s.rows)
            at += s.rows
        self.running = [s for s, k in zip(self.running, keep) if k]
        if not self.running:
            self._cache = self._mask = None
            return
        index = torch.tensor(rows, device=self._mask.device)
        for layer in _layers(self._cache):
            if getattr(layer, "is_initialized", False):
                layer.batch_select_indices(index)
        self._mask = self._mask[index]
        drop = int(self._mask.any(0).long().argmax())   # leading columns every row masks
        if drop:
            _trim_cache(self._cache, self._mask.shape[1], drop)
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
