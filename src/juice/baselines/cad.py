"""CAD, context-aware decoding (Shi et al. 2023, "Trusting Your Evidence: Hallucinate Less with
Context-aware Decoding", Eq. 2; paper Sec. 4.2 baseline, alpha = 1), and AdaCAD (Wang et al.,
NAACL 2025, "AdaCAD: Adaptively Decoding to Balance Conflicts between Contextual and Parametric
Knowledge", arXiv 2409.07394), one batched decoding engine for both.

At every step the next token is the argmax of

    (1 + alpha) * logits(y | context, question, y<t) - alpha * logits(y | question, y<t)

(greedy). CAD fixes alpha; AdaCAD sets it per row and per step to

    alpha_t = JSD(p(. | context, question, y<t) || p(. | question, y<t))

(:func:`jsd_alpha`). :func:`cad_generate` takes either a number or such a rule (any callable
from the two branches' logits to one weight per row), so AdaCAD is a decoding policy of the same
engine, not a second loop.

AdaCAD, points decided here and their sources (the paper's method section, Sec. 2, and the
authors' `group_decode_fileio_adacad.py`, functions `get_jsd` and `decode`):

- The contrast is applied to raw logits, as in CAD: the paper's formula is over logits, and the
  authors' code multiplies each branch's raw `logits[:, -1]` by 1 + alpha and -alpha and sums.
- The two distributions are the softmax of each branch's raw logits (temperature 1, full
  vocabulary, before any filtering), as the code's `get_jsd` does.
- The divergence is in bits (log base 2), so alpha lies in [0, 1], the range the paper states
  for its JSD, and is 0 when the branches agree. The authors' code computes it with
  `F.kl_div`, in nats, i.e. ln 2 = 0.69 times the paper's value; that variant is
  `functools.partial(jsd_alpha, base=math.e)` (PROTOCOL.md: the paper's text wins, the code's
  variant is an option).
- alpha is recomputed at every step, the first included, and for every row on its own (the
  authors decode one instance at a time); no offset (their `--offset` defaults to 0).
- Greedy decoding (their QA runs use top-p 0, i.e. the argmax); a fixed number of new tokens
  (no stop at end of sequence), like every method here.
- Teacher forcing (`forced_tokens`, MemoTrap's likelihood comparison): at each continuation
  token alpha is the JSD of the two branches after the forced prefix, and the token's
  log-probability is taken under the softmax of the contrasted logits.

The second branch really holds no context: it is the question part of the prompt, tokenized on
its own (see :attr:`juice.data.records.ContextualExample.question`); the JuICE authors' CAD code
strips only a BOS token and so leaves the context in (PROTOCOL.md, CAD). The two branches keep
two KV caches (two batches of rows, one per branch) and both are fed the chosen token.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence

import torch
from torch import Tensor

from juice.budget import resolve_max_rows
from juice.decoding import Generation, decode_chunks, forward_last, length_buckets
from juice.likelihood import continuation_ids, sequence_logits
from juice.sampling import pick_token
from juice.models import LoadedModel
from juice.tokens import context_length, pad_left, token_ids

ALPHA = 1.0

AlphaRule = Callable[[Tensor, Tensor], Tensor]
"""(with-context logits `[rows, vocab]`, without-context logits `[rows, vocab]`) -> alpha `[rows]`."""


def contrast(with_context: Tensor, without_context: Tensor, alpha: float | Tensor = ALPHA) -> Tensor:
    """CAD's adjusted logits `(1 + alpha) * with_context - alpha * without_context` (Eq. 2).

    Args:
        with_context, without_context: `[rows, vocab]` logits.
        alpha: a number, or `[rows]` (one weight per row, AdaCAD).
    """
    if isinstance(alpha, Tensor):
        alpha = alpha.to(with_context.dtype)[:, None]
    return (1 + alpha) * with_context - alpha * without_context


def jsd_alpha(with_context: Tensor, without_context: Tensor, base: float = 2.0) -> Tensor:
    """AdaCAD's alpha: the Jensen-Shannon divergence between the two branches' next-token
    distributions (softmax of the logits, temperature 1), per row.

    JSD(p || q) = (KL(p || m) + KL(q || m)) / 2 with m = (p + q) / 2; tokens of zero probability
    contribute 0.

    Args:
        with_context, without_context: `[rows, vocab]` logits.
        base: of the logarithm; 2 (bits, the paper's [0, 1] range) or `math.e` (nats, the
            authors' code).

    Returns:
        `[rows]` float32, in [0, 1] in bits ([0, ln 2] in nats).
    """
    lp = with_context.float().log_softmax(-1)
    lq = without_context.float().log_softmax(-1)
    lm = torch.logaddexp(lp, lq) - math.log(2.0)   # log of the mixture (p + q) / 2

    def kl_to_mixture(log_x: Tensor) -> Tensor:
        x = log_x.exp()
        return torch.where(x > 0, x * (log_x - lm), torch.zeros_like(x)).sum(-1)

    jsd = 0.5 * (kl_to_mixture(lp) + kl_to_mixture(lq)) / math.log(base)
    return jsd.clamp(0.0, math.log(2.0) / math.log(base))


@torch.inference_mode()
def cad_generate(
    lm: LoadedModel,
    prompts: Sequence[str],
    questions: Sequence[str],
    max_new_tokens: int = 10,
    alpha: float | AlphaRule = ALPHA,
    *,
    probe_tokens: Tensor | None = None,
    max_rows: int | str = 64,
    on_chunk: Callable[[int], None] | None = None,
    forced_tokens: Tensor | None = None,
) -> Generation:
    """Greedy context-aware decoding, batched, with one KV cache per branch.

    Args:
        prompts: full prompts (context and question).
        questions: the same prompts without the context, one per prompt.
        alpha: CAD's weight (0 is plain greedy decoding of `prompts`), or a rule that gives one
            weight per row and step from the two branches' logits (:func:`jsd_alpha`: AdaCAD).
        probe_tokens: `[n, k]` token ids whose first-step probabilities (under the adjusted
            logits) to return.
        max_rows: most rows per batch (each item takes two, one per branch), or "auto".
        forced_tokens: `[n, max_new_tokens]` tokens to feed instead of the greedy choice; their
            log-probabilities under the contrasted distribution are returned (teacher forcing).

    Returns:
        :class:`~juice.decoding.Generation`, one entry per prompt.

    Raises:
        PromptTooLongError: a prompt does not fit the context window with the new tokens.
        ValueError: lengths differ or max_new_tokens < 1.
        juice.guard.BatchingMismatchError: batched decoding is not exact on this backend (the first
            padded chunk is checked against one-at-a-time decoding, as in :func:`juice.decoding.generate`).
    """
    if len(prompts) != len(questions):
        raise ValueError("one question per prompt")
    if max_new_tokens < 1:
        raise ValueError(f"max_new_tokens must be at least 1, got {max_new_tokens}")
    limit = context_length(lm.model)
    room = None if limit is None else limit - max_new_tokens
    ids_c = [token_ids(lm.tokenizer, p) for p in prompts]
    ids_q = [token_ids(lm.tokenizer, q) for q in questions]
    max_rows = resolve_max_rows(max_rows, lm, max(map(len, ids_c), default=1) + max_new_tokens)
    n = len(prompts)
    lengths = [len(i) for i in ids_c]
    # each item takes two rows, one per branch

    def run(chunk: list[int]):
        return _cad_chunk(lm, [ids_c[i] for i in chunk], [ids_q[i] for i in chunk], max_new_tokens, alpha,
                          None if probe_tokens is None else probe_tokens[chunk], room,
                          None if forced_tokens is None else forced_tokens[chunk])

    chunks = length_buckets(sorted(range(n), key=lengths.__getitem__), lengths, [2] * n, max_rows)
    return decode_chunks(lm, n, max_new_tokens, chunks, run, lambda i: (len(ids_c[i]), len(ids_q[i])), probe_tokens,
                         forced_tokens is not None, on_chunk=on_chunk)


def _cad_chunk(lm, ids_c, ids_q, max_new_tokens, alpha, probes, room, forced=None):
    device = lm.device
    branches = []
    for ids in (ids_c, ids_q):
        b = pad_left(ids, lm.tokenizer.pad_token_id, room).to(device)
        hidden, cache = forward_last(lm, b.input_ids, b.attention_mask, b.position_ids)
        branches.append([b.attention_mask, b.position_ids[:, -1:], cache, hidden])
    logits = _contrasted(lm.logits(branches[0][3]).float(), lm.logits(branches[1][3]).float(), alpha)
    probs = None if probes is None else logits.softmax(-1).gather(1, probes.to(device)).cpu()
    lps: list[Tensor] = []
    token = pick_token(logits, forced, 0, lps)
    new = [token]
    for _ in range(max_new_tokens - 1):
        outs = []
        for br in branches:
            mask, pos, cache, _ = br
            br[0] = mask = torch.cat([mask, mask.new_ones(mask.shape[0], 1)], dim=1)
            br[1] = pos = pos + 1
            hidden, br[2] = forward_last(lm, token[:, None], mask, pos, past=cache)
            outs.append(lm.logits(hidden).float())
        token = pick_token(_contrasted(outs[0], outs[1], alpha), forced, len(new), lps)
        new.append(token)
    return torch.stack(new, 1).cpu(), probs, torch.stack(lps, 1) if lps else None


def _contrasted(with_context: Tensor, without_context: Tensor, alpha: float | AlphaRule) -> Tensor:
    if not callable(alpha):
        return contrast(with_context, without_context, alpha)
    weight = torch.as_tensor(alpha(with_context, without_context), device=with_context.device)
    if weight.shape != with_context.shape[:1]:
        raise ValueError(f"an alpha rule must give one weight per row {tuple(with_context.shape[:1])}, "
                         f"got shape {tuple(weight.shape)}")
    return contrast(with_context, without_context, weight)


def cad_continuation_logprobs(
    lm: LoadedModel, prompts: Sequence[str], questions: Sequence[str], continuations: Sequence[str],
    alpha: float | AlphaRule = ALPHA,
) -> Tensor:
    """Sum of log-probabilities of each continuation under CAD's (or AdaCAD's) adjusted distribution
    (teacher forcing; softmax of the contrasted logits at every continuation token). A reference,
    one item at a time; :func:`cad_generate` with `forced_tokens` does the same in batches.

    Returns:
        `[len(prompts)]` float64 log-probabilities (nats).
    """
    out = torch.zeros(len(prompts), dtype=torch.float64)
    for i, (p, q, c) in enumerate(zip(prompts, questions, continuations, strict=True)):
        base_c, cont = continuation_ids(lm.tokenizer, p, c)
        base_q = token_ids(lm.tokenizer, q)
        lc, lq = (sequence_logits(lm, [base + cont], [len(cont)])[0] for base in (base_c, base_q))
        target = torch.tensor(cont, device=lc.device)
        out[i] = float(_contrasted(lc, lq, alpha).log_softmax(-1).gather(1, target[:, None]).sum())
    return out

