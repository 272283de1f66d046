"""The naive implementations that tests and benchmarks compare the fast paths against.

Each re-runs whole sequences with no cache and one intervention per forward, exactly as the
paper's algorithms read: greedy decoding (:func:`greedy_generate_naive`, Alg. 1 and Alg. 4),
teacher-forced continuation log-probabilities (:func:`continuation_logprobs`), CAD and AdaCAD's
two-branch decoding and likelihoods (:func:`cad_generate_naive`,
:func:`cad_continuation_logprobs_naive`, Shi et al. 2023, Eq. 2) and Stage 1's intervention
probabilities (:func:`intervention_probs_naive`, Alg. 2), and decoding at the post-norm site
(:func:`greedy_generate_post_norm_naive`), and the mechanistic analyses' knock-outs and cumulative
steering (:func:`knockout_readout_naive`, :func:`cumulative_probs_naive`). Not for production runs.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager, nullcontext

import torch
from torch import Tensor

from juice.analysis.knockout import Component, knocked_out
from juice.baselines.cad import ALPHA, AlphaRule, CadPolicy
from juice.budget import resolve_max_rows
from juice.engine.likelihood import continuation_ids, sequence_logits
from juice.engine.streams import StatefulContrastRule
from juice.interventions import (
    Head,
    RowPlan,
    added_to_heads,
    captured_heads,
    head_coefficients,
    projection_input_hooks,
    scaled_heads,
)
from juice.models import LoadedModel
from juice.post_norm import head_contributions, norm_gain, post_norm_modules, post_norm_rows
from juice.steering import ORIGINAL, Steering
from juice.tokens import encode, token_ids


@torch.inference_mode()
def greedy_generate_naive(
    lm: LoadedModel, prompt: str, max_new_tokens: int = 10, steering: Steering = ORIGINAL
) -> Tensor:
    """Reference decoding: every step re-runs the whole sequence, twice for JuICE, with no cache.

    JuICE here is the paper's Alg. 1 literally: run 1 saves the steered heads' outputs
    (`captured_heads`), run 2 adds beta times them (`added_to_heads`). For tests and benchmarks.

    Returns:
        `[max_new_tokens]` new token ids.
    """
    ids = encode(lm.tokenizer, [prompt]).input_ids.to(lm.device)
    coefficients = steering.coefficients
    active = [] if coefficients is None else [int(i) for i in coefficients.ne(0).any(-1).nonzero().flatten()]
    for _ in range(max_new_tokens):
        if steering.dual_run:
            with captured_heads(lm.heads, active) as saved:
                lm.model(input_ids=ids, use_cache=False)
            additions = {
                layer: coefficients[layer].to(saved[layer].device)[None, None, :, None] * saved[layer]
                for layer in active
            }
            context = added_to_heads(lm.heads, additions)
        elif steering.steers:
            context = scaled_heads(lm.heads, coefficients)
        else:
            context = nullcontext()
        with context:
            logits = lm.model(input_ids=ids, use_cache=False).logits[:, -1]
        ids = torch.cat([ids, logits.argmax(-1, keepdim=True)], dim=1)
    return ids[0, -max_new_tokens:].cpu()


def continuation_logprobs(
    lm: LoadedModel, prompts: Sequence[str], continuations: Sequence[str], steering: Steering = ORIGINAL,
    *, max_rows: int | str = 32,
) -> Tensor:
    """Sum of log-probabilities of each continuation after its prompt, under `steering`
    (teacher forcing, one full forward per sequence). The reference for the forced decoding of
    :func:`generate` (`forced_tokens`), which the evaluation uses because it shares prefills.

    Returns:
        `[len(prompts)]` float64 log-probabilities (nats).

    Raises:
        EmptyAnswerError: a continuation tokenizes to nothing.
    """
    pairs = [continuation_ids(lm.tokenizer, p, c) for p, c in zip(prompts, continuations, strict=True)]
    out = torch.zeros(len(pairs), dtype=torch.float64)
    max_rows = resolve_max_rows(max_rows, lm, max((len(a) + len(b) for a, b in pairs), default=1))
    step = max(1, max_rows // (2 if steering.dual_run else 1))
    order = sorted(range(len(pairs)), key=lambda i: len(pairs[i][0]) + len(pairs[i][1]))
    for start in range(0, len(order), step):
        chunk = order[start:start + step]
        seqs = [pairs[i][0] + pairs[i][1] for i in chunk]
        logits = sequence_logits(lm, seqs, [len(pairs[i][1]) for i in chunk], steering)
        for i, lg in zip(chunk, logits):
            target = torch.tensor(pairs[i][1], device=lg.device)
            out[i] = float(lg.log_softmax(-1).gather(1, target[:, None]).sum())
    return out


@torch.inference_mode()
def cad_generate_naive(
    lm: LoadedModel, prompt: str, question: str, max_new_tokens: int = 10, alpha: float | AlphaRule = ALPHA,
) -> tuple[Tensor, Tensor]:
    """Reference CAD / AdaCAD decoding (:class:`juice.baselines.cad.CadPolicy`): every step
    re-runs both whole branches, `prompt` and `question` each followed by the tokens so far, with
    no cache, and takes the argmax of the contrasted last-position logits.

    Returns:
        (`[max_new_tokens]` new token ids, `[vocab]` float32 first-step probabilities under the
        contrasted logits), on the CPU.
    """
    return contrast_generate_naive(lm, prompt, question, max_new_tokens, CadPolicy(alpha))


@torch.inference_mode()
def contrast_generate_naive(lm: LoadedModel, prompt: str, question: str, max_new_tokens: int,
                            policy) -> tuple[Tensor, Tensor]:
    """:func:`cad_generate_naive` for any contrast rule (`policy`: with-context logits,
    question-only logits -> logits; e.g. :class:`juice.baselines.ckplug.CkPlugPolicy`; a
    :class:`juice.engine.StatefulContrastRule` gets its state back at each step)."""
    branches = [encode(lm.tokenizer, [text]).input_ids.to(lm.device) for text in (prompt, question)]
    new, first, states = [], None, [None]
    for _ in range(max_new_tokens):
        lc, lq = (lm.model(input_ids=ids, use_cache=False).logits[:, -1].float() for ids in branches)
        if isinstance(policy, StatefulContrastRule):
            adjusted, states = policy.step(lc, lq, states)
        else:
            adjusted = policy(lc, lq)
        if first is None:
            first = adjusted[0].softmax(-1).cpu()
        token = adjusted.argmax(-1, keepdim=True)
        new.append(int(token))
        branches = [torch.cat([ids, token], dim=1) for ids in branches]
    return torch.tensor(new), first


@torch.inference_mode()
def cad_continuation_logprobs_naive(
    lm: LoadedModel, prompts: Sequence[str], questions: Sequence[str], continuations: Sequence[str],
    alpha: float | AlphaRule = ALPHA,
) -> Tensor:
    """Reference for :func:`juice.baselines.cad.cad_continuation_logprobs`: per item, one full
    forward of each branch (prompt + continuation, question + continuation) with no cache, and the
    continuation's log-probabilities under the softmax of the contrasted logits at every
    continuation token (an alpha rule sees each position's two rows).

    Returns:
        `[len(prompts)]` float64 log-probabilities (nats).

    Raises:
        EmptyAnswerError: a continuation tokenizes to nothing.
    """
    policy = CadPolicy(alpha)
    out = torch.zeros(len(prompts), dtype=torch.float64)
    for i, (p, q, c) in enumerate(zip(prompts, questions, continuations, strict=True)):
        base_c, cont = continuation_ids(lm.tokenizer, p, c)
        base_q = token_ids(lm.tokenizer, q)
        lc, lq = (sequence_logits(lm, [base + cont], [len(cont)])[0] for base in (base_c, base_q))
        target = torch.tensor(cont, device=lc.device)
        out[i] = float(policy(lc, lq).log_softmax(-1).gather(1, target[:, None]).sum())
    return out


@torch.inference_mode()
def intervention_probs_naive(
    lm: LoadedModel, prompt: str, target_token: int, interventions: Sequence[tuple[Head, float]],
    max_rows: int | str | None = None,
) -> tuple[float, Tensor]:
    """Reference for :func:`intervention_probs`: one full forward per intervention, logits at
    every position (`max_rows` is ignored). For tests and benchmarks, as
    `score_heads(..., probs=intervention_probs_naive)`."""
    ids = encode(lm.tokenizer, [prompt]).input_ids.to(lm.device)
    clean = float(lm.model(input_ids=ids).logits[0, -1].float().softmax(-1)[target_token])
    probs = []
    for head, alpha in interventions:
        with scaled_heads(lm.heads, head_coefficients(lm.heads.geometry, {head: alpha})):
            probs.append(float(lm.model(input_ids=ids).logits[0, -1].float().softmax(-1)[target_token]))
    return clean, torch.tensor(probs)


@torch.inference_mode()
def greedy_generate_post_norm_naive(lm: LoadedModel, prompt: str, max_new_tokens: int, steering: Steering) -> Tensor:
    """Reference decoding at the post-norm site (:mod:`juice.post_norm`) for tests: every step
    re-runs the whole sequence with no cache; JuICE literally twice (run 1 unmodified, its contributions `c_h^clean` captured; run 2 adds them).

    Returns:
        `[max_new_tokens]` new token ids.
    """
    ids = encode(lm.tokenizer, [prompt]).input_ids.to(lm.device)
    zero = torch.zeros(1, lm.heads.geometry.n_layers, lm.heads.geometry.n_heads)
    for _ in range(max_new_tokens):
        if steering.dual_run:
            captured = _capture_contributions(lm, ids, steering.coefficients)
            with _added_contributions(lm, captured, steering.coefficients):
                logits = lm.model(input_ids=ids, use_cache=False).logits[:, -1]
        else:
            scale = zero if not steering.steers else steering.coefficients[None]
            with post_norm_rows(lm.heads, RowPlan(scale, zero, torch.tensor([-1]))):
                logits = lm.model(input_ids=ids, use_cache=False).logits[:, -1]
        ids = torch.cat([ids, logits.argmax(-1, keepdim=True)], dim=1)
    return ids[0, -max_new_tokens:].cpu()


def _capture_contributions(lm: LoadedModel, ids: Tensor, coefficients: Tensor) -> dict[int, Tensor]:
    """Run 1: layer -> `[1, seq, hidden]` sum of beta_h * c_h^clean over the steered heads."""
    out: dict[int, Tensor] = {}
    norms = post_norm_modules(lm.heads)
    layers = [l for l in range(lm.heads.geometry.n_layers) if coefficients[l].ne(0).any()]
    inputs: dict[int, Tensor] = {}
    handles = []

    def make(layer: int):
        def hook(module, args, output):
            heads = [int(i) for i in coefficients[layer].ne(0).nonzero().flatten()]
            c = head_contributions(lm.heads, layer, inputs[layer], heads).float()
            if norms is not None:
                c = c * norm_gain(module, args[0])[..., None, :]
            out[layer] = torch.einsum("bshk,h->bsk", c, coefficients[layer, heads].float().to(c.device))
            return output
        return hook

    with projection_input_hooks(lm.heads, {l: (lambda layer, x: inputs.__setitem__(layer, x) or x) for l in layers}):
        try:
            for l in layers:
                module = norms[l] if norms is not None else lm.heads.projections[l]
                handles.append(module.register_forward_hook(make(l)))
            lm.model(input_ids=ids, use_cache=False)
        finally:
            for h in handles:
                h.remove()
    return out


@contextmanager
def _added_contributions(lm: LoadedModel, captured: dict[int, Tensor], coefficients: Tensor) -> Iterator[None]:
    """Run 2: add the captured sums to each layer's attention contribution."""
    norms = post_norm_modules(lm.heads)
    handles = []
    try:
        for l, delta in captured.items():
            module = norms[l] if norms is not None else lm.heads.projections[l]
            handles.append(module.register_forward_hook(
                lambda m, a, o, d=delta: (o.float() + d.to(o.device)).to(o.dtype)))
        yield
    finally:
        for h in handles:
            h.remove()


@torch.inference_mode()
def knockout_readout_naive(
    lm: LoadedModel, prompt: str, components: Sequence[Component], readout: Callable[[Tensor], Tensor],
) -> tuple[Tensor, Tensor]:
    """Reference for :func:`juice.analysis.knockout.knockout_readout`: one full forward per
    knock-out (Fig. 3's component knock-outs)."""
    ids = encode(lm.tokenizer, [prompt]).input_ids.to(lm.device)
    clean = readout(lm.model(input_ids=ids).logits[:, -1].float())[0]
    out = []
    for c in components:
        with knocked_out(lm.heads, {c: lambda batch: slice(None)}):
            out.append(readout(lm.model(input_ids=ids).logits[:, -1].float())[0])
    return clean.cpu(), torch.stack(out).cpu()   # on the CPU, as knockout_readout's


@torch.inference_mode()
def cumulative_probs_naive(
    lm: LoadedModel, prompt: str, token: int, ranked: Sequence[Head], ns: Sequence[int], alpha: float = -1.0,
) -> tuple[float, Tensor, Tensor]:
    """Reference for :func:`juice.analysis.multiple.cumulative_probs`: separate forwards; run twice captures run 1's head
    outputs, then adds `alpha` times them in a second forward (Table 3's cumulative heads)."""
    g = lm.heads.geometry
    ids = encode(lm.tokenizer, [prompt]).input_ids.to(lm.device)
    layers = sorted({h.layer for h in ranked[: max(ns)]})

    def prob() -> float:
        return float(lm.model(input_ids=ids).logits[0, -1].float().softmax(-1)[token])

    with captured_heads(lm.heads, layers) as saved:
        clean = prob()
    once, twice = [], []
    for n in ns:
        coefficients = head_coefficients(g, {h: alpha for h in ranked[:n]})
        with scaled_heads(lm.heads, coefficients):
            once.append(prob())
        additions = {l: coefficients[l].to(saved[l].device)[None, None, :, None] * saved[l]
                     for l in layers if coefficients[l].any()}
        with added_to_heads(lm.heads, additions):
            twice.append(prob())
    return clean, torch.tensor(once), torch.tensor(twice)
