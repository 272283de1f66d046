"""The batched, cached decoding engine: JuICE's dual run and JuNE's single run (paper Stage 2),
and contrastive decoding (CAD, AdaCAD: a stream's :class:`Contrast` policy, whose CAD math lives
in :mod:`juice.baselines.cad`), greedy or sampled generation and teacher forcing, all in one loop.
What a steering *is* lives in :mod:`juice.steering`.

JuICE (paper Alg. 1, Stage 2): run 1 is the unmodified model; run 2 adds beta+ (resp. beta-)
times run 1's outputs of the positive (negative) heads to the same heads. JuNE (Alg. 4) scales
the heads' live outputs in one run: `H <- H + beta * H`. CAD (Shi et al. 2023, Eq. 2) chooses
from a combination of the logits of two unmodified runs, one on the prompt with its context and
one on the question alone.

Generation is cached and batched. Each request is a *stream*: a prompt and a steering method, or
a prompt and a contrast policy. All streams of a chunk share one batch and one KV cache:

- prefill: one clean (unmodified) row per prompt, plus one row per JuNE or JuICE stream; a JuICE
  row adds beta times its prompt's clean row (:class:`~juice.interventions.RowPlan`), so the clean
  prefill is computed once however many methods and betas a prompt is steered with; a steered row
  whose prompt has a clean row joins the batch at the first layer it steers, as a copy of that
  row (below it the two are the same computation; :func:`juice.sweeps.grow_rows`, Stage 1's growing batch);
  a CAD stream's question is one more prompt with its clean row (its context row is its prompt's);
- decoding: the cache is re-indexed so that every stream owns its rows; a JuICE stream owns a
  copy of the clean row plus its steered row, and both are fed the steered row's new token, so
  the clean run sees exactly the sequence the steered run produced (as a naive re-run would); a
  CAD stream owns a copy of its prompt's clean row and of its question's, both fed the token
  chosen from their contrasted logits.

Logits are computed only at the last position and only for the rows whose tokens are read.
"""

from __future__ import annotations

import weakref
from collections.abc import Callable, Iterable, Iterator, Sequence
from contextlib import AbstractContextManager
from dataclasses import dataclass
from typing import Any

import torch
from torch import Tensor

from juice.architectures import HeadGeometry, ModelHeads
from juice.budget import resolve_max_rows
from juice.guard import check_batch, needs_check
from juice.interventions import RowPlan, planned_rows
from juice.models import LoadedModel
from juice.post_norm import post_norm_rows
from juice.sampling import Sampling, penalize_repetition, pick_token
from juice.steering import ORIGINAL, Steering
from juice.sweeps import grow_rows
from juice.tokens import context_length, pad_left, token_ids


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
        contrast (prompt row, question row), else one."""
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


def forward_last(lm: LoadedModel, input_ids: Tensor, mask: Tensor, positions: Tensor, past=None):
    """One cached forward of the base model (no LM head).

    Args:
        input_ids, mask, positions: `[batch, seq]` (left padded; see :class:`juice.tokens.Batch`).
        past: the KV cache of the previous steps, or None.

    Returns:
        (`[batch, hidden]` last-position hidden state, the updated KV cache).
    """
    out = lm.model.base_model(
        input_ids=input_ids, attention_mask=mask, position_ids=positions, past_key_values=past, use_cache=True
    )
    return out.last_hidden_state[:, -1], out.past_key_values


_COMPILED: "weakref.WeakKeyDictionary[torch.nn.Module, Callable]" = weakref.WeakKeyDictionary()


def compiled_forward(lm: LoadedModel) -> Callable:
    """:func:`forward_last` through `torch.compile`, one compiled function per model (kept while
    the model lives): mode "reduce-overhead" (CUDA graphs) on CUDA, the default mode elsewhere.
    The head hooks of :func:`juice.interventions.planned_rows` are traced with it. For the
    fixed-shape steps of the static KV cache (:func:`generate`, `compile_step`). Shapes are left
    to torch's automatic dynamic: Gemma 3's static sliding-window cache layers keep their length
    as a Python int, which would otherwise recompile every step; with it the second step
    recompiles once with that length symbolic (measured on tiny Gemma 3: 1 recompile in 12 steps).
    Its calls run with dynamo's guards on module hooks (`skip_nnmodule_hook_guards=False`; torch
    skips them by default), else a step traced without head hooks (a chunk of Original or CAD
    streams) would be reused, silently, for later chunks of steered rows."""
    fn = _COMPILED.get(lm.model)
    if fn is None:
        mode = "reduce-overhead" if lm.device.type == "cuda" else "default"
        compiled = torch.compile(forward_last, mode=mode, dynamic=None)

        def fn(*args, **kwargs):
            with torch._dynamo.config.patch(skip_nnmodule_hook_guards=False):
                return compiled(*args, **kwargs)

        _COMPILED[lm.model] = fn
    return fn


def _zero_plan_row(geometry: HeadGeometry) -> Tensor:
    return torch.zeros(geometry.n_layers, geometry.n_heads)


def _join_layer(coefficients: Tensor) -> int:
    """The first layer a steering's `[n_layers, n_heads]` coefficients touch (the last layer
    for all zeros: such a row equals its clean row throughout)."""
    active = torch.nonzero(coefficients.ne(0).any(-1)).flatten()
    return int(active[0]) if active.numel() else coefficients.shape[0] - 1


KV_CACHES: tuple[str, ...] = ("dynamic", "static")

PAD_SLACK = 1.3
"""A chunk's longest prompt is at most this factor (+8 tokens) longer than its shortest one:
left padding is computed like real tokens, so mixing 10- and 90-token prompts wastes prefill."""


def length_buckets(
    order: Sequence[int], lengths: Sequence[int], rows: Sequence[int], max_rows: int
) -> Iterator[list[int]]:
    """Consecutive groups of `order` (items sorted by length): a group is cut before it would
    hold more than `max_rows` rows (item i takes `rows[i]`) or before an item longer than
    PAD_SLACK x its first item (+8 tokens), since left padding costs like real tokens."""
    chunk: list[int] = []
    used = 0
    for i in order:
        if chunk and (used + rows[i] > max_rows or lengths[i] > PAD_SLACK * lengths[chunk[0]] + 8):
            yield chunk
            chunk, used = [], 0
        chunk.append(i)
        used += rows[i]
    if chunk:
        yield chunk


def _chunks(streams: Sequence[Stream], lengths: Sequence[int], max_rows: int) -> Iterator[list[int]]:
    """Stream indices grouped by prompt, prompts ordered by token length (little padding), cut so
    no chunk decodes more than `max_rows` rows (a JuICE or contrastive stream takes two)."""
    order = sorted(range(len(streams)), key=lambda i: (lengths[streams[i].prompt], streams[i].prompt))
    return length_buckets(order, [lengths[s.prompt] for s in streams], [s.rows for s in streams], max_rows)


@torch.inference_mode()
def generate(
    lm: LoadedModel,
    prompts: Sequence[str],
    streams: Sequence[Stream],
    max_new_tokens: int = 10,
    *,
    probe_tokens: Tensor | None = None,
    max_rows: int | str = 64,
    on_chunk: Callable[[int], None] | None = None,
    on_token: Callable[[list[int], Tensor], None] | None = None,
    forced_tokens: Tensor | None = None,
    stop_at_eos: bool = False,
    kv_cache: str | None = None,
    compile_step: bool | None = None,
    apply_plan: Callable[[ModelHeads, RowPlan], AbstractContextManager] | None = None,
    stop_text: Callable[[str], bool] | None = None,
) -> Generation:
    """Greedy or sampled decoding of many (prompt, steering or contrast) streams, batched and cached.

    Paper Alg. 1 (JuICE) and Alg. 4 (JuNE); "original" is the unmodified model; CAD and AdaCAD
    are streams with a :class:`Contrast` (:mod:`juice.baselines.cad`). Per new token a chunk
    costs one forward of one token per row; the clean prefill of a prompt is shared by all its
    streams (and by the contrastive streams whose question it is). See the module docstring for
    the layout.

    Args:
        lm: the model.
        prompts: prompt strings (BOS is added).
        streams: what to generate; `Stream(i, steering)` decodes `prompts[i]` under `steering`,
            greedily, or with `Stream(i, steering, Sampling(...))` by sampling;
            `Stream(i, contrast=Contrast(j, rule))` decodes `prompts[i]` against `prompts[j]`.
        max_new_tokens: tokens to generate per stream.
        probe_tokens: `[n_streams, k]` token ids whose first-step probabilities to return.
        max_rows: most decoding rows per batch (a JuICE or contrastive stream takes two), or
            "auto" (sized for the longest prompt, :func:`juice.budget.auto_max_rows`).
        on_chunk: called with the number of streams finished after each batch (progress bars).
        on_token: called after every decoding step with the indices (into `streams`) of the
            batch's streams and their new tokens `[len(indices)]` (streaming); with it, no
            batch is re-decoded by the guard after tokens were handed out, so it needs an
            exact backend (the CPU, or one the guard verified earlier in the process).
        forced_tokens: `[n_streams, max_new_tokens]` token ids to feed instead of the greedy
            choice (teacher forcing: scores given continuations under every steering, sharing
            each prompt's prefill like generation does); their log-probabilities are returned.
        stop_at_eos: stop a batch once each of its streams has produced the tokenizer's EOS
            (Hugging Face's default); a stream's tokens after its EOS are EOS, so its text ends
            at its EOS. Evaluation (:func:`juice.eval.runner.decode_requests`), :class:`juice.Steerer`
            and the server turn it on; off, exactly `max_new_tokens` steps are decoded and the
            text keeps what follows an EOS.
        kv_cache: "dynamic" (Hugging Face's DynamicCache, growing by one position per step; the
            default), "static" (a StaticCache sized prompt + `max_new_tokens`, written in
            place, with a full-length attention mask: every decoding step has the same shapes,
            which CUDA graphs and `torch.compile(mode="reduce-overhead")` need). Both give the
            same tokens (tested on every tiny architecture); the static cache's speed on a GPU
            is unmeasured (README, issue 14); None: the model's default (`lm.kv_cache`, set by
            `$JUICE_KV_CACHE`).
        compile_step: run the decoding step through `torch.compile` (mode "reduce-overhead", i.e.
            CUDA graphs, on CUDA; the default mode elsewhere); needs `kv_cache="static"`. The first
            call per model compiles (about 30 s for a tiny model on 2 CPU cores); the tokens equal
            the uncompiled ones (tested on the CPU). Its GPU speed is unmeasured. None: the
            model's default (`lm.compile_step`, `$JUICE_COMPILE_STEP=1`).
        apply_plan: how the per-row steering (a :class:`~juice.interventions.RowPlan`) is applied;
            None: by the steerings' site (:attr:`juice.steering.Steering.site`),
            :func:`juice.interventions.planned_rows` at the output projection's input (the
            paper's) or :func:`juice.post_norm.post_norm_rows` after the attention output norm.
            The steered streams of one call share one site.
        stop_text: stop a stream once the text of its new tokens satisfies it (checked after
            every step): its rows leave the batch, the others go on, and its text is what was
            decoded up to there (its later tokens read as EOS with `stop_at_eos`, else as the
            pad token). For a metric that reads only a prefix of the text, e.g. exact match's
            first five words (:func:`juice.eval.metrics.first_words_final`). Greedy decoding
            only: not with sampling, a repetition penalty, a contrast, `forced_tokens` or
            `on_token`. With the static cache a stopped stream keeps its rows (fixed shapes) and
            its later tokens are dropped: the same tokens, without the saving.

    Returns:
        Generation with one entry per stream, in the order of `streams`.

    The first padded chunk on a device / attention backend not yet verified in this process is
    checked against one-at-a-time decoding of its most padded rows (:mod:`juice.guard`).

    Raises:
        PromptTooLongError: a prompt does not fit the context window with the new tokens.
        ValueError: max_new_tokens < 1; `stop_text` with what it does not support, or with a
            tokenizer that has neither EOS (with `stop_at_eos`) nor a pad token.
        juice.guard.BatchingMismatchError: batched decoding is not exact here, even with eager
            attention.
    """
    if max_new_tokens < 1:
        raise ValueError(f"max_new_tokens must be at least 1, got {max_new_tokens}")
    kv_cache = lm.kv_cache if kv_cache is None else kv_cache
    compile_step = lm.compile_step if compile_step is None else compile_step
    if kv_cache not in KV_CACHES:
        raise ValueError(f"kv_cache must be one of {', '.join(KV_CACHES)}, not {kv_cache!r}")
    if compile_step and kv_cache != "static":
        raise ValueError('compile_step needs kv_cache="static" (fixed shapes per step)')
    if stop_text is not None:
        unsupported = [name for name, used in [
            ("sampling", any(st.sampling is not None for st in streams)),
            ("a repetition penalty", any(st.repetition_penalty != 1 for st in streams)),
            ("a contrast", any(st.contrast is not None for st in streams)),
            ("forced_tokens", forced_tokens is not None), ("on_token", on_token is not None)] if used]
        if unsupported:
            raise ValueError(f"stop_text works with greedy decoding only, not with {unsupported[0]}")
        if (lm.tokenizer.eos_token_id if stop_at_eos else lm.tokenizer.pad_token_id) is None:
            raise ValueError("stop_text needs the tokenizer's EOS (stop_at_eos) or pad token to fill stopped rows")
    limit = context_length(lm.model)
    n = len(streams)
    if forced_tokens is not None and forced_tokens.shape != (n, max_new_tokens):
        raise ValueError(f"forced_tokens must be [n_streams, max_new_tokens] = {(n, max_new_tokens)}")
    ids = [token_ids(lm.tokenizer, p) for p in prompts]
    max_rows = resolve_max_rows(max_rows, lm, max(map(len, ids), default=1) + max_new_tokens)

    def prompts_of(stream: Stream) -> tuple[int, ...]:   # its prompt, and its contrast's question
        return (stream.prompt,) if stream.contrast is None else (stream.prompt, stream.contrast.question)

    def run(chunk: list[int]):
        chunk_prompts = sorted({p for i in chunk for p in prompts_of(streams[i])})
        batch = pad_left([ids[p] for p in chunk_prompts], lm.tokenizer.pad_token_id,
                         None if limit is None else limit - max_new_tokens)
        probes = None if probe_tokens is None else probe_tokens[chunk]
        forced = None if forced_tokens is None else forced_tokens[chunk]
        step = None if on_token is None else (lambda t, chunk=chunk: on_token(list(chunk), t.cpu()))
        contrasts = [None if (c := streams[i].contrast) is None else Contrast(chunk_prompts.index(c.question), c.rule)
                     for i in chunk]
        return _generate_chunk(lm, batch, [chunk_prompts.index(streams[i].prompt) for i in chunk],
                               [streams[i].steering for i in chunk], max_new_tokens, probes, forced,
                               [streams[i].sampling for i in chunk], step,
                               [streams[i].repetition_penalty for i in chunk],
                               lm.tokenizer.eos_token_id if stop_at_eos and forced is None else None,
                               static=kv_cache == "static", compiled=compile_step, apply_plan=apply_plan,
                               contrasts=contrasts, stop_text=stop_text)

    if apply_plan is None:
        apply_plan = plan_applier(s.steering for s in streams)
    return decode_chunks(lm, n, max_new_tokens, _chunks(streams, [len(i) for i in ids], max_rows), run,
                         lambda i: tuple(len(ids[p]) for p in prompts_of(streams[i])), probe_tokens,
                         forced_tokens is not None, check=on_token is None, on_chunk=on_chunk,
                         eos=lm.tokenizer.eos_token_id if stop_at_eos and forced_tokens is None else None)


def plan_applier(steerings: Iterable[Steering]) -> Callable[[ModelHeads, RowPlan], AbstractContextManager]:
    """How the row plans of these steerings are applied: at their common site
    (:data:`juice.steering.SITES`); Original steerings have none.

    Raises:
        ValueError: the steerings act at different sites (decode each site in its own call).
    """
    sites = {s.site for s in steerings if s.method != "original"}
    if len(sites) > 1:
        raise ValueError(f"the steered streams of one call must share a site, got {sorted(sites)}")
    return post_norm_rows if sites == {"post_norm"} else planned_rows


def decode_chunks(
    lm: LoadedModel, n: int, max_new_tokens: int, chunks: Iterable[list[int]],
    run: Callable[[list[int]], tuple[Tensor, Tensor | None, Tensor | None]], length_of: Callable[[int], Any],
    probe_tokens: Tensor | None = None, forced: bool = False, *, check: bool = True,
    on_chunk: Callable[[int], None] | None = None, eos: int | None = None,
) -> Generation:
    """The scaffolding of :func:`generate`: decode each chunk of the `n` streams with `run`, let
    the runtime guard check it against one-at-a-time decoding where needed (:mod:`juice.guard`;
    `check=False` when tokens were already handed out), and scatter the chunks' results back into
    the streams' order.

    Args:
        chunks: lists of stream indices.
        run: a chunk's stream indices -> (`[len(chunk), max_new_tokens]` tokens, `[len(chunk), k]`
            first-step probe probabilities or None, `[len(chunk), max_new_tokens]` forced
            log-probabilities or None).
        length_of: a stream's prompt length(s) (a tuple for a contrastive stream's prompt and
            question), which the guard uses to pick the most padded rows.
        probe_tokens: `[n, k]` (only its shape is used here), or None.
        forced: whether `run` returns forced log-probabilities.
        eos: each stream's text ends before its first `eos` token (None: every token is decoded,
            special tokens skipped).

    Returns:
        :class:`Generation` with one entry per stream.
    """
    tokens = torch.zeros(n, max_new_tokens, dtype=torch.long)
    first_probs = None if probe_tokens is None else torch.zeros(probe_tokens.shape, dtype=torch.float32)
    forced_lp = torch.zeros(n, max_new_tokens, dtype=torch.float64) if forced else None
    for chunk in chunks:
        result = [run(chunk)]
        if check and needs_check(lm):   # the runtime guard (juice.guard): batched = one at a time

            def redo(chunk=chunk, result=result) -> tuple:
                result[0] = run(chunk)
                return result[0]

            check_batch(lm, [length_of(i) for i in chunk], result[0], lambda r, chunk=chunk: run([chunk[r]]), redo)
        out_tokens, out_probs, out_lp = result[0]
        tokens[chunk] = out_tokens
        if first_probs is not None:
            first_probs[chunk] = out_probs
        if forced_lp is not None:
            forced_lp[chunk] = out_lp
        if on_chunk:
            on_chunk(len(chunk))
    rows = [r[: r.index(eos)] if eos in r else r for r in tokens.tolist()] if eos is not None else tokens
    texts = lm.tokenizer.batch_decode(rows, skip_special_tokens=True)
    return Generation(tokens, texts, first_probs, forced_lp)


def _generate_chunk(
    lm: LoadedModel, batch: Any, prompt_of: list[int], steerings: list[Steering], max_new_tokens: int,
    probes: Tensor | None, forced: Tensor | None = None, samplings: Sequence[Sampling | None] | None = None,
    on_step: Callable[[Tensor], None] | None = None, penalties: Sequence[float] | None = None,
    eos: int | None = None, static: bool = False, compiled: bool = False,
    apply_plan: Callable[[ModelHeads, RowPlan], AbstractContextManager] = planned_rows,
    contrasts: Sequence[Contrast | None] | None = None,
    stop_text: Callable[[str], bool] | None = None,
) -> tuple[Tensor, Tensor | None, Tensor | None]:
    """Decode one chunk of streams: the dual run of JuICE (paper Alg. 1), JuNE (Alg. 4), CAD's
    two runs (Shi et al. 2023, Eq. 2) and the unmodified model side by side in one batch, with
    one KV cache.

    Prefill: one clean row per prompt that an Original, JuICE or contrastive stream needs (a
    contrastive stream's question included), then one row per JuNE or JuICE stream; a
    :class:`juice.interventions.RowPlan` scales a JuNE row's heads and adds beta times the clean
    row's head outputs to a JuICE row (the clean row *is* run 1, the JuICE row run 2). Decoding:
    every stream owns its rows (a JuICE stream two: its own copy of the clean row, fed the
    stream's tokens, and the steered row; a contrastive stream two unmodified rows: its copies
    of its prompt's and its question's clean rows, both fed the stream's tokens), the cache rows
    are reordered once, and each step is one forward of one token per row. A contrastive
    stream's logits are its rule applied to its two rows' logits (:class:`Contrast`), before the
    repetition penalty, the probes and the token choice.

    Args:
        batch: the chunk's distinct prompts, left-padded (`input_ids`, `attention_mask`,
            `position_ids`, each `[n_prompts, seq]`).
        prompt_of: per stream, its prompt's row in `batch`.
        steerings: per stream, its steering (coefficients `[n_layers, n_heads]`).
        probes: `[n_streams, k]` token ids whose first-step probabilities to return, or None.
        forced: `[n_streams, max_new_tokens]` tokens to feed (teacher forcing), or None.
        samplings: per stream, its :class:`Sampling` or None (greedy).
        on_step: called with each step's `[n_streams]` new tokens.
        penalties: per stream, its repetition penalty (1: none).
        eos: stop once every stream has produced this token; later tokens read as `eos`.
        static: keep the KV cache in a :class:`transformers.StaticCache` of `seq + max_new_tokens`
            positions and feed a full-length mask, so every decoding step has the same shapes
            (see :func:`generate`'s `kv_cache`).
        compiled: decode through :func:`compiled_forward` (needs `static`).
        apply_plan: applies a row plan to the heads (see :func:`generate`).
        contrasts: per stream, its :class:`Contrast` with `question` its question's row in
            `batch`, or None; None: no contrastive stream.
        stop_text: a stream leaves the batch (its cache rows dropped, the rest go on) after the
            step at which the text of its new tokens satisfies it, or at its EOS; its later
            tokens read as `eos` (the pad token without one). With `static` its rows stay (the
            shapes are fixed) and only its later tokens are dropped. Greedy, untaught decoding
            only (see :func:`generate`).

    Returns:
        (`[n_streams, max_new_tokens]` tokens on the CPU, `[n_streams, k]` first-step probe
        probabilities or None, `[n_streams, max_new_tokens]` forced log-probabilities (nats) or None).
    """
    geometry = lm.heads.geometry
    device = lm.device
    zero = _zero_plan_row(geometry)

    contrasts = [None] * len(prompt_of) if contrasts is None else list(contrasts)
    # Prefill layout: a clean row for each prompt that an original, JuICE or contrastive stream
    # needs (a question too), then one row per JuNE or JuICE stream (a JuICE row adds its prompt's
    # clean row, see RowPlan).
    clean_prompts = sorted({p for p, s in zip(prompt_of, steerings) if s.method in ("original", "juice")}
                           | {c.question for c in contrasts if c is not None})
    clean_row = {p: r for r, p in enumerate(clean_prompts)}
    rows_src = list(clean_prompts)
    scale, add, source = [zero] * len(rows_src), [zero] * len(rows_src), [-1] * len(rows_src)
    # A steered row whose prompt has a clean row joins the prefill at the first layer it steers
    # (below it, it *is* the clean row): the growing prefill, as Stage 1's sweep grows its batch.
    grow = not static and apply_plan is planned_rows
    steered = [k for k, s in enumerate(steerings) if s.method != "original"]
    joins = {k: _join_layer(steerings[k].coefficients) if grow and prompt_of[k] in clean_row else 0
             for k in steered}
    out_row = [clean_row[p] if s.method == "original" else -1 for p, s in zip(prompt_of, steerings)]
    for k in sorted(steered, key=lambda k: joins[k]):   # stable: rows in the order they join
        p, s = prompt_of[k], steerings[k]
        out_row[k] = len(rows_src)
        rows_src.append(p)
        scale.append(s.coefficients if s.method == "june" else zero)
        add.append(s.coefficients if s.method == "juice" else zero)
        source.append(clean_row[p] if s.method == "juice" else -1)
    row_join = [0] * len(clean_prompts) + sorted(joins.values())
    plan = RowPlan(torch.stack(scale), torch.stack(add), torch.tensor(source))
    first = sum(j == 0 for j in row_join)   # rows in the batch from the embeddings on
    index = torch.tensor(rows_src[:first])
    ids, mask, positions = (t[index].to(device) for t in (batch.input_ids, batch.attention_mask, batch.position_ids))
    cache = None
    if static:   # written in place; the slots not yet written are hidden by the causal mask
        from transformers import StaticCache

        cache = StaticCache(config=lm.model.config, max_cache_len=ids.shape[1] + max_new_tokens)
    joining = [clean_row[rows_src[r]] for r in range(first, len(rows_src))]
    with apply_plan(lm.heads, plan), grow_rows(lm.heads, first, joining, row_join[first:]):
        hidden, cache = forward_last(lm, ids, mask, positions, past=cache)
    for j in range(row_join[-1]):   # below its join layer a row holds its clean row's cache
        cache.layers[j].reorder_cache(torch.tensor(
            [r if row_join[r] <= j else clean_row[rows_src[r]] for r in range(len(rows_src))], device=device))
    mask = torch.cat([mask, mask[torch.tensor(joining, device=device)]]) if joining else mask
    positions = torch.cat([positions, positions[torch.tensor(joining, device=device)]]) if joining else positions
    # The contrastive streams, grouped by rule: (rule, their indices among the streams `[m]`).
    by_rule: dict[ContrastRule, list[int]] = {}
    for k, c in enumerate(contrasts):
        if c is not None:
            by_rule.setdefault(c.rule, []).append(k)
    groups = [(rule, torch.tensor(ks, device=device)) for rule, ks in by_rule.items()]

    def contrasted(logits: Tensor, hidden: Tensor, question_rows: Tensor) -> Tensor:
        """The streams' `[n_streams, vocab]` logits, each contrastive stream's replaced by its rule
        applied to them and to the logits of its question's row (`question_rows`: `[n_streams]`
        rows of `hidden`, `[rows, hidden]`)."""
        for rule, ks in groups:
            logits[ks] = rule(logits[ks], lm.logits(hidden[question_rows[ks]]).float())
        return logits

    question_rows = torch.tensor([-1 if c is None else clean_row[c.question] for c in contrasts], device=device)
    logits = lm.logits(hidden[torch.tensor(out_row, device=device)]).float()
    logits = contrasted(logits, hidden, question_rows)
    penalty = None if penalties is None or all(x == 1 for x in penalties) else torch.tensor(penalties)
    seen = None
    if penalty is not None:   # [streams, vocab]: the tokens of each stream's prompt (padding excluded)
        seen = torch.zeros(len(prompt_of), logits.shape[-1], dtype=torch.bool, device=device)
        real = batch.attention_mask[torch.tensor(prompt_of)].bool()
        stream = torch.arange(len(prompt_of))[:, None].expand_as(real)
        seen[stream[real].to(device), batch.input_ids[torch.tensor(prompt_of)][real].to(device)] = True
        logits = penalize_repetition(logits, seen, penalty)
    first_probs = None
    if probes is not None:
        first_probs = logits.softmax(-1).gather(1, probes.to(device)).cpu()
    lps: list[Tensor] = []
    samplers = None if samplings is None else [
        None if sm is None else (sm, torch.Generator().manual_seed(sm.seed)) for sm in samplings]
    token = pick_token(logits, forced, 0, lps, samplers)
    n = len(prompt_of)
    fill = eos if eos is not None else lm.tokenizer.pad_token_id
    out_tokens = torch.full((n, max_new_tokens), -1 if fill is None else fill, dtype=torch.long)
    alive = list(range(n))   # the streams still in the batch (all, unless `stop_text` drops some)
    held: dict[int, int] = {}   # static cache: stream -> the step its stop rule held at (it stays in the batch)
    steps = 0

    def record(token: Tensor) -> None:
        nonlocal steps
        out_tokens[alive, steps] = token.cpu()
        steps += 1

    record(token)
    done = None if eos is None else token == eos
    if on_step:
        on_step(token)

    def finish() -> tuple:
        out = out_tokens
        for k, at in held.items():   # a held stream's tokens after its stop are dropped, as a leaving one's
            out[k, at:] = fill
        if eos is not None:   # EOS-padded: after a stream's first EOS, and for the steps not run
            out = out.masked_fill(out.eq(-1), eos)
            after = (out == eos).long().cumsum(1) > 0
            out = out.masked_fill(after, eos)
        return out, first_probs, torch.stack(lps, 1) if lps else None

    def stopped() -> list[int]:
        """Positions in `alive` of the streams that stop now (the stop rule or their EOS), held
        ones included; with `static`, the new ones are held (they stay in the batch) and the
        caller sees no stream leave unless all stop."""
        ended = [False] * len(alive) if done is None else done.tolist()
        open_ = [k for k in range(len(alive)) if alive[k] not in held and not ended[k]]
        texts = lm.tokenizer.batch_decode(out_tokens[[alive[k] for k in open_], :steps].tolist(),
                                          skip_special_tokens=True)
        now = {k for k, t in zip(open_, texts) if stop_text(t)}
        out = [k for k in range(len(alive)) if k in now or ended[k] or alive[k] in held]
        if static and len(out) < len(alive):
            held.update({alive[k]: steps for k in now})
            return []
        return out

    if max_new_tokens == 1 or (done is not None and bool(done.all())):
        return finish()
    leaving = stopped() if stop_text is not None else []
    if len(leaving) == len(alive):
        return finish()

    # Decoding layout: every stream owns its rows; a JuICE stream owns [clean copy, steered row], a
    # contrastive stream [question row copy, prompt row copy].
    select, d_scale, d_add, d_source, d_out, d_question, feed_stream = [], [], [], [], [], [], []

    def own(row: int, k: int, scale_row: Tensor, add_row: Tensor, src: int) -> None:
        select.append(row)
        d_scale.append(scale_row)
        d_add.append(add_row)
        d_source.append(src)
        feed_stream.append(k)

    for k, (p, s, c) in enumerate(zip(prompt_of, steerings, contrasts)):
        if s.method == "juice":
            own(clean_row[p], k, zero, zero, -1)
            own(out_row[k], k, zero, s.coefficients, len(select) - 1)
        elif c is not None:
            own(clean_row[c.question], k, zero, zero, -1)
            own(out_row[k], k, zero, zero, -1)
        else:
            own(out_row[k], k, s.coefficients if s.method == "june" else zero, zero, -1)
        d_out.append(len(select) - 1)
        d_question.append(-1 if c is None else len(select) - 2)
    select_t = torch.tensor(select, device=device)
    cache.reorder_cache(select_t)
    mask, positions = mask[select_t], positions[select_t][:, -1:]
    if static:   # one full-length mask for every step: fixed shapes
        mask = torch.cat([mask, mask.new_ones(mask.shape[0], max_new_tokens)], dim=1)
    d_scale_t, d_add_t, d_source_t = torch.stack(d_scale), torch.stack(d_add), torch.tensor(d_source)
    out_t, feed_t = torch.tensor(d_out, device=device), torch.tensor(feed_stream, device=device)
    question_rows = torch.tensor(d_question, device=device)
    step = compiled_forward(lm) if compiled else forward_last
    while True:
        if leaving:   # drop the leaving streams' rows from the cache, the plan and the indices
            gone = set(leaving)
            keep = [k for k in range(len(alive)) if k not in gone]
            rows = [r for r, k in enumerate(feed_t.tolist()) if k not in gone]
            new_row = {r: i for i, r in enumerate(rows)}
            new_stream = {k: i for i, k in enumerate(keep)}
            rows_t = torch.tensor(rows, device=device)
            cache.reorder_cache(rows_t)
            mask, positions = mask[rows_t], positions[rows_t]
            d_scale_t, d_add_t = d_scale_t[rows_t.cpu()], d_add_t[rows_t.cpu()]
            d_source_t = torch.tensor([-1 if s < 0 else new_row[s] for s in d_source_t[rows_t.cpu()].tolist()])
            feed_t = torch.tensor([new_stream[k] for k in feed_t[rows_t].tolist()], device=device)
            out_t = torch.tensor([new_row[r] for r in out_t[torch.tensor(keep, device=device)].tolist()], device=device)
            keep_t = torch.tensor(keep, device=device)
            token = token[keep_t]
            done = None if done is None else done[keep_t]
            alive = [alive[k] for k in keep]
            leaving = []
        with apply_plan(lm.heads, RowPlan(d_scale_t, d_add_t, d_source_t)):
            while steps < max_new_tokens:
                if not static:
                    mask = torch.cat([mask, mask.new_ones(mask.shape[0], 1)], dim=1)
                positions = positions + 1
                hidden, cache = step(lm, token[feed_t][:, None], mask, positions, past=cache)
                logits = lm.logits(hidden[out_t]).float()
                logits = contrasted(logits, hidden, question_rows)
                if seen is not None:
                    seen[torch.arange(len(prompt_of), device=device), token.to(device)] = True
                    logits = penalize_repetition(logits, seen, penalty)
                token = pick_token(logits, forced, steps, lps, samplers)
                record(token)
                if on_step:
                    on_step(token)
                if done is not None:
                    done = done | (token == eos)
                    if bool(done.all()):
                        return finish()
                if stop_text is not None and steps < max_new_tokens:
                    leaving = stopped()
                    if len(leaving) == len(alive):
                        return finish()
                    if leaving:
                        break
        if not leaving:
            return finish()


def greedy_generate(
    lm: LoadedModel,
    prompts: Sequence[str],
    max_new_tokens: int = 10,
    steering: Steering = ORIGINAL,
    **kwargs,
) -> Generation:
    """Greedy continuations of `prompts`, all under one `steering` (see :func:`generate`)."""
    return generate(lm, prompts, [Stream(i, steering) for i in range(len(prompts))], max_new_tokens, **kwargs)


