"""Batched decoding, a driver of the one decoding loop (:class:`juice.engine.session.DecodingSession`):
JuICE's dual run and JuNE's single run (paper Stage 2), contrastive decoding (CAD, AdaCAD: a
stream's :class:`~juice.engine.streams.Contrast` policy, whose CAD math lives in
:mod:`juice.baselines.cad`), greedy or sampled generation and teacher forcing, over many streams.
What a steering *is* lives in :mod:`juice.steering`.

JuICE (paper Alg. 1, Stage 2): run 1 is the unmodified model; run 2 adds beta+ (resp. beta-)
times run 1's outputs of the positive (negative) heads to the same heads. JuNE (Alg. 4) scales
the heads' live outputs in one run: `H <- H + beta * H`. CAD (Shi et al. 2023, Eq. 2) chooses
from a combination of the logits of two unmodified runs, one on the prompt with its context and
one on the question alone.

:func:`generate` sorts the streams by prompt length, cuts them into chunks of at most `max_rows`
rows with little padding, and decodes each chunk in one session: the chunk's streams are
prefilled together (one clean row per prompt, shared by every steering of it, JuICE's run 1 and
the contrastive streams whose question it is; steered rows join at their first steered layer)
and decoded one token per row per step, each stream leaving at its end. The runtime guard
(:mod:`juice.engine.guard`) checks a chunk against one-at-a-time decoding where the backend is not yet
verified. Logits are computed only at the last position and only for the rows whose tokens are read.

KV caches: "dynamic" is Hugging Face's DynamicCache, growing by one position per step; "static" a
StaticCache sized prompt + `max_new_tokens`, written in place, with a full-length attention mask,
so that every decoding step has the same shapes, which CUDA graphs and
`torch.compile(mode="reduce-overhead")` need. Both give the same tokens (tested on every tiny
architecture); the static cache's speed on a GPU is unmeasured (README). `compile_step` runs the
decoding step through `torch.compile` (mode "reduce-overhead", i.e. CUDA graphs, on CUDA; the
default mode elsewhere): the first call per model compiles (about 30 s for a tiny model on 2 CPU
cores), the tokens equal the uncompiled ones (tested on the CPU), its GPU speed is unmeasured.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator, Sequence
from contextlib import AbstractContextManager
from dataclasses import replace
from functools import partial
from typing import Any

import torch
from torch import Tensor

from juice.architectures import ModelHeads
from juice.budget import resolve_max_rows
from juice.engine.forward import plan_applier
from juice.engine.session import DecodingSession
from juice.engine.streams import Choice, Contrast, Generation, Stream
from juice.engine.guard import check_batch, needs_check
from juice.interventions import RowPlan
from juice.io import UnitCheckpoint
from juice.models import LoadedModel
from juice.engine.sampling import Sampling
from juice.steering import ORIGINAL, Steering
from juice.tokens import PromptTooLongError, context_length, token_ids
from juice.progress import OnProgress


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


COMPILE_ON_CPU_FROM = (2, 13)
"""The first torch release whose Inductor compiles the decoding step on the CPU: 2.11.0's C++
code generation emits an undeclared index variable for it (`CppCompileError`, found by
scripts/gpu-rehearse.sh); 2.13.0 passes the tests; 2.12 was not tried. On CUDA, Inductor writes
Triton instead."""


def _torch_release() -> tuple[int, int]:
    """torch's (major, minor) release, e.g. (2, 11) for "2.11.0+cu130"."""
    major, minor = torch.__version__.split("+")[0].split(".")[:2]
    return int(major), int(minor)


def _decoding_options(lm: LoadedModel, max_new_tokens: int, kv_cache: str | None, compile_step: bool | None,
                      stop_text, stop_at_eos: bool, forced_tokens: Tensor | None) -> tuple[str, bool]:
    """:func:`generate`'s cache and compile options with the model's defaults filled in, checked
    with the options that constrain them (its Raises)."""
    if max_new_tokens < 1:
        raise ValueError(f"max_new_tokens must be at least 1, got {max_new_tokens}")
    kv_cache = lm.kv_cache if kv_cache is None else kv_cache
    compile_step = lm.compile_step if compile_step is None else compile_step
    if kv_cache not in KV_CACHES:
        raise ValueError(f"kv_cache must be one of {', '.join(KV_CACHES)}, not {kv_cache!r}")
    if compile_step and kv_cache != "static":
        raise ValueError('compile_step needs kv_cache="static" (fixed shapes per step)')
    if compile_step and lm.device.type == "cpu" and _torch_release() < COMPILE_ON_CPU_FROM:
        raise ValueError(f"compile_step on the CPU needs torch >= {'.'.join(map(str, COMPILE_ON_CPU_FROM))}: "
                         f"torch {torch.__version__}'s Inductor writes C++ for the step that does not compile "
                         "(seen with 2.11.0); decode uncompiled, or on a GPU")
    if stop_text is not None:
        if forced_tokens is not None:
            raise ValueError("stop_text does not apply to forced_tokens (teacher forcing feeds every token)")
        if (lm.tokenizer.eos_token_id if stop_at_eos else lm.tokenizer.pad_token_id) is None:
            raise ValueError("stop_text needs the tokenizer's EOS (stop_at_eos) or pad token to fill stopped rows")
    return kv_cache, bool(compile_step)


@torch.inference_mode()
def generate(
    lm: LoadedModel,
    prompts: Sequence[str],
    streams: Sequence[Stream],
    max_new_tokens: int = 10,
    *,
    probe_tokens: Tensor | None = None,
    max_rows: int | str = 64,
    on_progress: OnProgress | None = None,
    on_token: Callable[[list[int], Tensor], None] | None = None,
    forced_tokens: Tensor | None = None,
    stop_at_eos: bool = False,
    kv_cache: str | None = None,
    compile_step: bool | None = None,
    apply_plan: Callable[[ModelHeads, RowPlan], AbstractContextManager] | None = None,
    stop_text: Callable[[str], bool] | None = None,
    checkpoint: UnitCheckpoint | None = None,
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
        on_progress: called with the number of streams finished after each batch (progress bars).
        on_token: called after every decoding step with the indices (into `streams`) of the
            streams that got a token and their new tokens `[len(indices)]` (streaming); with it, no
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
        kv_cache: "dynamic" (the default) or "static" (module docstring, "KV caches"); None:
            the model's default (`lm.kv_cache`, set by `$JUICE_KV_CACHE`).
        compile_step: run the decoding step through `torch.compile` (module docstring); needs
            `kv_cache="static"`. None: the model's default (`lm.compile_step`,
            `$JUICE_COMPILE_STEP=1`).
        apply_plan: how the per-row steering (a :class:`~juice.interventions.RowPlan`) is applied;
            None: by the steerings' site (:attr:`juice.steering.Steering.site`),
            :func:`juice.interventions.planned_rows` at the output projection's input (the
            paper's) or :func:`juice.post_norm.post_norm_rows` after the attention output norm.
            The steered streams of one call share one site.
        stop_text: stop a stream once the text of its new tokens satisfies it (checked after
            every step): its rows leave the batch, the others go on, and its text is what was
            decoded up to there (its later tokens read as EOS with `stop_at_eos`, else as the
            pad token). For a metric that reads only a prefix of the text, e.g. exact match's
            first five words (:func:`juice.text.first_words_final`). Any stream (sampled,
            penalized, contrastive; the session's stop rule), not with `forced_tokens`. With the static cache a stopped stream keeps its rows (fixed shapes) and
            its later tokens are dropped: the same tokens, without the saving.
        checkpoint: each chunk's result is put there once decoded, and a chunk already there is
            read instead of decoded (:func:`chunk_unit`), so a call killed midway and made again
            with the same arguments resumes with the same results. Its scope must pin what a
            chunk's unit id does not hash: the contrast rules' and choices' parameters and the
            model (a pipeline stage's key does). With `on_token` it is not read (tokens are
            handed out as they are decoded).

    Returns:
        Generation with one entry per stream, in the order of `streams`.

    The first padded chunk on a device / attention backend not yet verified in this process is
    checked against one-at-a-time decoding of its most padded rows (:mod:`juice.engine.guard`).

    Raises:
        PromptTooLongError: a prompt does not fit the context window with the new tokens.
        ValueError: max_new_tokens < 1; `stop_text` with `forced_tokens`, or with a
            tokenizer that has neither EOS (with `stop_at_eos`) nor a pad token; an unknown
            `kv_cache`; `compile_step` without the static cache, or on the CPU under torch < 2.13
            (:data:`COMPILE_ON_CPU_FROM`).
        juice.engine.guard.BatchingMismatchError: batched decoding is not exact here, even with eager
            attention.
    """
    kv_cache, compile_step = _decoding_options(lm, max_new_tokens, kv_cache, compile_step, stop_text, stop_at_eos,
                                               forced_tokens)
    n = len(streams)
    if forced_tokens is not None and forced_tokens.shape != (n, max_new_tokens):
        raise ValueError(f"forced_tokens must be [n_streams, max_new_tokens] = {(n, max_new_tokens)}")
    ids = [token_ids(lm.tokenizer, p) for p in prompts]
    limit = context_length(lm)
    if limit is not None and ids and max(map(len, ids)) > limit - max_new_tokens:
        raise PromptTooLongError(f"a prompt has {max(map(len, ids))} tokens; the model's context holds "
                                 f"{limit - max_new_tokens} with {max_new_tokens} new tokens")
    max_rows = resolve_max_rows(max_rows, lm, max(map(len, ids), default=1) + max_new_tokens)

    if apply_plan is None:
        apply_plan = plan_applier(t for s in streams for t in s.steerings)
    run = partial(_run_chunk, lm, ids, streams, max_new_tokens, probe_tokens, forced_tokens, on_token, stop_at_eos,
                  kv_cache == "static", compile_step, stop_text, apply_plan=apply_plan)
    unit_of = None
    if checkpoint is not None and on_token is None:
        def unit_of(chunk: list[int]) -> str:
            return chunk_unit(ids, streams, chunk, max_new_tokens, probe_tokens, forced_tokens, stop_at_eos,
                              stop_text is not None)
    return decode_chunks(lm, n, max_new_tokens, _chunks(streams, [len(i) for i in ids], max_rows), run,
                         lambda i: tuple(len(ids[p]) for p in _prompts_of(streams[i])), probe_tokens,
                         forced_tokens is not None, check=on_token is None, on_progress=on_progress,
                         eos=lm.tokenizer.eos_token_id if stop_at_eos and forced_tokens is None else None,
                         checkpoint=None if unit_of is None else (checkpoint, unit_of))


def chunk_unit(ids: Sequence[Sequence[int]], streams: Sequence[Stream], chunk: Sequence[int], max_new_tokens: int,
               probe_tokens: Tensor | None, forced_tokens: Tensor | None, stop_at_eos: bool, stop_text: bool) -> str:
    """The unit id of one chunk of a :func:`generate` call in its `checkpoint`
    (:meth:`juice.io.UnitCheckpoint.unit_id`): it hashes the call's size, the chunk's stream
    indices, each stream's prompt (and question) token ids, steering (:meth:`juice.steering.Steering.identity`),
    sampling, penalty and the kinds of its contrast and choice, the probe and forced tokens,
    `max_new_tokens` and the stop rules' presence. The contrast rules' and choices' parameters
    and the model are the checkpoint scope's to pin."""
    def stream(i: int) -> tuple:
        s = streams[i]
        return ([list(ids[p]) for p in _prompts_of(s)], s.steering.identity(), repr(s.sampling),
                s.repetition_penalty, None if s.contrast is None else type(s.contrast.rule).__name__,
                None if s.choice is None else type(s.choice.rule).__name__)

    rows = list(chunk)
    return UnitCheckpoint.unit_id(
        "chunk", len(streams), max_new_tokens, rows, [stream(i) for i in rows],
        None if probe_tokens is None else probe_tokens[rows].tolist(),
        None if forced_tokens is None else forced_tokens[rows].tolist(), stop_at_eos, stop_text)


def _prompts_of(stream: Stream) -> tuple[int, ...]:
    """A stream's prompt index, its contrast's or choice's question index, and its choice's
    instructed prompt's index (:data:`~juice.engine.streams.INSTRUCTED`)."""
    return (stream.prompt, *(i for i in (stream.question, stream.instructed) if i is not None))


def _run_chunk(lm: LoadedModel, ids: list[list[int]], streams: Sequence[Stream], max_new_tokens: int,
               probe_tokens: Tensor | None, forced_tokens: Tensor | None,
               on_token: Callable[[list[int], Tensor], None] | None, stop_at_eos: bool, static: bool,
               compiled: bool, stop_text: Callable[[str], bool] | None, chunk: list[int], *,
               apply_plan: Callable[[ModelHeads, RowPlan], AbstractContextManager]):
    """:func:`generate`'s streams `chunk` (indices into `streams`) decoded in one session: their
    prompts and questions renumbered within the chunk (:func:`_generate_chunk`'s result)."""
    chunk_prompts = sorted({p for i in chunk for p in _prompts_of(streams[i])})
    probes = None if probe_tokens is None else probe_tokens[chunk]
    forced = None if forced_tokens is None else forced_tokens[chunk]
    step = None if on_token is None else (lambda ks, t: on_token([chunk[k] for k in ks], t))
    contrasts = [None if (c := streams[i].contrast) is None else Contrast(chunk_prompts.index(c.question), c.rule)
                 for i in chunk]
    choices = [None if (c := streams[i].choice) is None else
               replace(c, question=chunk_prompts.index(c.question),
                       instructed=None if streams[i].instructed is None else chunk_prompts.index(c.instructed))
               for i in chunk]
    return _generate_chunk(lm, [ids[p] for p in chunk_prompts], [chunk_prompts.index(streams[i].prompt) for i in chunk],
                           [streams[i].steering for i in chunk], max_new_tokens, probes, forced,
                           [streams[i].sampling for i in chunk], step,
                           [streams[i].repetition_penalty for i in chunk],
                           lm.tokenizer.eos_token_id if stop_at_eos and forced is None else None,
                           static=static, compiled=compiled, apply_plan=apply_plan,
                           contrasts=contrasts, stop_text=stop_text,
                           choices=choices if any(c is not None for c in choices) else None)


def decode_chunks(
    lm: LoadedModel, n: int, max_new_tokens: int, chunks: Iterable[list[int]],
    run: Callable[[list[int]], tuple[Tensor, Tensor | None, Tensor | None]], length_of: Callable[[int], Any],
    probe_tokens: Tensor | None = None, forced: bool = False, *, check: bool = True,
    on_progress: OnProgress | None = None, eos: int | None = None,
    checkpoint: tuple[UnitCheckpoint, Callable[[list[int]], str]] | None = None,
) -> Generation:
    """The scaffolding of :func:`generate`: decode each chunk of the `n` streams with `run`, let
    the runtime guard check it against one-at-a-time decoding where needed (:mod:`juice.engine.guard`;
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
        checkpoint: (where each chunk's result is kept, a chunk -> its unit id): a chunk found
            there is read, not decoded (nor checked by the guard); one decoded is put there
            after the guard's check (:func:`generate`'s `checkpoint`).

    Returns:
        :class:`Generation` with one entry per stream.
    """
    tokens = torch.zeros(n, max_new_tokens, dtype=torch.long)
    first_probs = None if probe_tokens is None else torch.zeros(probe_tokens.shape, dtype=torch.float32)
    forced_lp = torch.zeros(n, max_new_tokens, dtype=torch.float64) if forced else None
    for chunk in chunks:
        unit = None if checkpoint is None else checkpoint[1](chunk)
        kept = None if unit is None else checkpoint[0].get(unit)
        if kept is not None:
            out_tokens, out_probs, out_lp = _unpacked(kept)
            _scatter(chunk, out_tokens, out_probs, out_lp, tokens, first_probs, forced_lp)
            if on_progress:
                on_progress(len(chunk))
            continue
        result = [run(chunk)]
        if check and needs_check(lm):   # the runtime guard (juice.engine.guard): batched = one at a time

            def redo(chunk=chunk, result=result) -> tuple:
                result[0] = run(chunk)
                return result[0]

            check_batch(lm, [length_of(i) for i in chunk], result[0], lambda r, chunk=chunk: run([chunk[r]]), redo)
        out_tokens, out_probs, out_lp = result[0]
        _scatter(chunk, out_tokens, out_probs, out_lp, tokens, first_probs, forced_lp)
        if unit is not None:
            checkpoint[0].put(unit, _packed(tokens[chunk], None if first_probs is None else first_probs[chunk],
                                            None if forced_lp is None else forced_lp[chunk]))
        if on_progress:
            on_progress(len(chunk))
    rows = [r[: r.index(eos)] if eos in r else r for r in tokens.tolist()] if eos is not None else tokens
    texts = lm.tokenizer.batch_decode(rows, skip_special_tokens=True)
    return Generation(tokens, texts, first_probs, forced_lp)


def _scatter(chunk: list[int], out_tokens: Tensor, out_probs: Tensor | None, out_lp: Tensor | None,
             tokens: Tensor, first_probs: Tensor | None, forced_lp: Tensor | None) -> None:
    """A chunk's results into the call's tensors, at the chunk's stream indices."""
    tokens[chunk] = out_tokens
    if first_probs is not None:
        first_probs[chunk] = out_probs
    if forced_lp is not None:
        forced_lp[chunk] = out_lp


def _packed(tokens: Tensor, probs: Tensor | None, lp: Tensor | None) -> dict[str, Any]:
    """A chunk's result as JSON: token ids, and the probabilities as the float64 values of their
    float32 (float64) entries, which JSON gives back exactly."""
    return {"tokens": tokens.tolist(), "probs": None if probs is None else probs.double().tolist(),
            "lp": None if lp is None else lp.tolist()}


def _unpacked(kept: dict[str, Any]) -> tuple[Tensor, Tensor | None, Tensor | None]:
    """:func:`_packed`'s inverse, bit for bit."""
    return (torch.tensor(kept["tokens"], dtype=torch.long),
            None if kept["probs"] is None else torch.tensor(kept["probs"], dtype=torch.float64).float(),
            None if kept["lp"] is None else torch.tensor(kept["lp"], dtype=torch.float64))


def _generate_chunk(
    lm: LoadedModel, prompts: list[list[int]], prompt_of: list[int], steerings: list[Steering], max_new_tokens: int,
    probes: Tensor | None, forced: Tensor | None = None, samplings: Sequence[Sampling | None] | None = None,
    on_step: Callable[[list[int], Tensor], None] | None = None, penalties: Sequence[float] | None = None,
    eos: int | None = None, static: bool = False, compiled: bool = False,
    apply_plan: Callable[[ModelHeads, RowPlan], AbstractContextManager] | None = None,
    contrasts: Sequence[Contrast | None] | None = None,
    stop_text: Callable[[str], bool] | None = None,
    choices: Sequence[Choice | None] | None = None,
) -> tuple[Tensor, Tensor | None, Tensor | None]:
    """Decode one chunk of streams in one :class:`~juice.engine.session.DecodingSession`, all
    admitted at the first step (one prefill).

    Args:
        prompts: the chunk's distinct prompts' token ids (BOS included).
        prompt_of: per stream, its prompt's index in `prompts`.
        steerings: per stream, its steering (coefficients `[n_layers, n_heads]`).
        probes: `[n_streams, k]` token ids whose first-step probabilities to return, or None.
        forced: `[n_streams, max_new_tokens]` tokens to feed (teacher forcing), or None.
        samplings: per stream, its :class:`Sampling` or None (greedy).
        on_step: called after each step with the streams (indices into the chunk) that got a
            token and their `[len(indices)]` tokens on the CPU.
        penalties: per stream, its repetition penalty (1: none).
        eos: a stream ends at this token; its later tokens read as `eos`.
        static, compiled, apply_plan: see :func:`generate` (`kv_cache`, `compile_step`, `apply_plan`).
        contrasts: per stream, its :class:`Contrast` with `question` its question's index in
            `prompts`, or None; None: no contrastive stream.
        stop_text: a stream ends after the step at which the text of its new tokens satisfies it;
            its later tokens read as `eos` (the pad token without one).
        choices: per stream, its :class:`Choice` (juice's `auto`) with `question` its question's
            index in `prompts` (and `instructed` its instructed prompt's, where a candidate is
            :data:`~juice.engine.streams.INSTRUCTED`; its steering is then Original), or None;
            None: no choosing stream.

    Returns:
        (`[n_streams, max_new_tokens]` tokens on the CPU, `[n_streams, k]` first-step probe
        probabilities or None, `[n_streams, max_new_tokens]` forced log-probabilities (nats) or None).
    """
    n = len(prompt_of)
    contrasts = [None] * n if contrasts is None else list(contrasts)
    choices = [None] * n if choices is None else list(choices)
    session = DecodingSession(lm, eos=eos, static=static, compiled=compiled, apply_plan=apply_plan)
    decode = lm.tokenizer.decode
    stop = None if stop_text is None else (lambda tokens: stop_text(decode(tokens, skip_special_tokens=True)))
    for k in range(n):
        stream = Stream(k, steerings[k], None if samplings is None else samplings[k],
                        1.0 if penalties is None else penalties[k], contrasts[k], choices[k])
        q, ins = stream.question, stream.instructed
        session.add(k, prompts[prompt_of[k]], stream, max_new_tokens, stop, prompt_key=prompt_of[k],
                    question_ids=None if q is None else prompts[q], question_key=q,
                    instructed_ids=None if ins is None else prompts[ins], instructed_key=ins,
                    forced=None if forced is None else forced[k].tolist(),
                    probes=None if probes is None else probes[k].tolist())
    fill = eos if eos is not None else lm.tokenizer.pad_token_id
    out_tokens = torch.full((n, max_new_tokens), -1 if fill is None else fill, dtype=torch.long)
    first_probs = None if probes is None else torch.zeros(probes.shape, dtype=torch.float32)
    lps = None if forced is None else torch.zeros(n, max_new_tokens, dtype=torch.float64)
    made = [0] * n
    while not session.idle:
        got = session.step()
        for t in got:
            out_tokens[t.key, made[t.key]] = t.token
            if t.probes is not None:
                first_probs[t.key] = t.probes
            if t.forced_logprob is not None:
                lps[t.key, made[t.key]] = t.forced_logprob
            made[t.key] += 1
        if on_step and got:
            on_step([t.key for t in got], torch.tensor([t.token for t in got]))
    return out_tokens, first_probs, lps


def greedy_generate(
    lm: LoadedModel,
    prompts: Sequence[str],
    max_new_tokens: int = 10,
    steering: Steering = ORIGINAL,
    **kwargs,
) -> Generation:
    """Greedy continuations of `prompts`, all under one `steering` (see :func:`generate`)."""
    return generate(lm, prompts, [Stream(i, steering) for i in range(len(prompts))], max_new_tokens, **kwargs)




__all__ = ["KV_CACHES", "PAD_SLACK", "decode_chunks", "generate", "greedy_generate", "length_buckets"]
