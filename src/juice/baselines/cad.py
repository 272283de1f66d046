"""CAD, context-aware decoding (Shi et al. 2023, "Trusting Your Evidence: Hallucinate Less with
Context-aware Decoding", Eq. 2; paper Sec. 4.2 baseline, alpha = 1), and AdaCAD (Wang et al.,
NAACL 2025, "AdaCAD: Adaptively Decoding to Balance Conflicts between Contextual and Parametric
Knowledge", arXiv 2409.07394): their math and their decoding policy (:class:`CadPolicy`) for the
engine's one decoding loop (:func:`juice.engine.generate`).

At every step the next token is the argmax of

    (1 + alpha) * logits(y | context, question, y<t) - alpha * logits(y | question, y<t)

(greedy). CAD fixes alpha; AdaCAD sets it per row and per step to

    alpha_t = JSD(p(. | context, question, y<t) || p(. | question, y<t))

(:func:`jsd_alpha`). :class:`CadPolicy` takes either a number or such a rule (any callable from
the two branches' logits to one weight per row), so CAD and AdaCAD are one policy of the engine
that also decodes Original, JuNE and JuICE: a stream
`Stream(i, contrast=Contrast(j, CadPolicy(alpha)))` decodes `prompts[i]` (context and question)
against `prompts[j]` (the question alone) and may share a batch, and its prompt's prefill, with
streams of any other method. :func:`cad_generate` and :func:`cad_continuation_logprobs` are thin
wrappers that build such streams.

AdaCAD, points decided here and their sources (the paper's method section, Sec. 2, and the
authors' `group_decode_fileio_adacad.py`, functions `get_jsd` and `decode`):

- The contrast is applied to raw logits, as in CAD: the paper's formula is over logits, and the
  authors' code multiplies each branch's raw `logits[:, -1]` by 1 + alpha and -alpha and sums.
- The two distributions are the softmax of each branch's raw logits (temperature 1, full
  vocabulary, before any filtering), as the code's `get_jsd` does.
- The divergence is in bits (log base 2), so alpha lies in [0, 1], the range the paper states
  for its JSD, and is 0 when the branches agree. The authors' code computes it with
  `F.kl_div`, in nats, i.e. ln 2 = 0.69 times the paper's value; that variant is
  `functools.partial(jsd_alpha, base=math.e)` (docs/protocol.md: the paper's text wins, the code's
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
strips only a BOS token and so leaves the context in (docs/protocol.md, CAD). Each branch is a row of
the engine's batch with its own KV cache rows (the question row left-padded to the batch's
width, like any shorter prompt), and both are fed the chosen token.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import torch
from torch import Tensor

from juice.engine import Contrast, Generation, Stream
from juice.engine.backend import Engine, engine_or_default
from juice.engine.likelihood import continuation_ids
from juice.models import LoadedModel
from juice.progress import OnProgress

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


@dataclass(frozen=True)
class CadPolicy:
    """CAD's decoding rule, as a :data:`juice.engine.ContrastRule` for a stream's
    :class:`~juice.engine.Contrast`: the with-context logits contrasted with the question-only
    logits by :func:`contrast` at `alpha` (Eq. 2). AdaCAD of one prompt beside its Original run:

    ```python
    generate(lm, [prompt, question], [Stream(0), Stream(0, contrast=Contrast(1, CadPolicy(jsd_alpha)))])
    ```

    Attributes:
        alpha: CAD's weight (0 is plain greedy decoding of the prompt), or an :data:`AlphaRule`
            giving one weight per row and step from the two branches' logits (:func:`jsd_alpha`:
            AdaCAD). Policies with equal alphas are applied in one call.
    """

    alpha: float | AlphaRule = ALPHA

    def __call__(self, with_context: Tensor, without_context: Tensor) -> Tensor:
        """`[rows, vocab]` contrasted logits of `[rows, vocab]` with- and without-context logits.

        Raises:
            ValueError: an alpha rule gave other than one weight per row.
        """
        if not callable(self.alpha):
            return contrast(with_context, without_context, self.alpha)
        weight = torch.as_tensor(self.alpha(with_context, without_context), device=with_context.device)
        if weight.shape != with_context.shape[:1]:
            raise ValueError(f"an alpha rule must give one weight per row {tuple(with_context.shape[:1])}, "
                             f"got shape {tuple(weight.shape)}")
        return contrast(with_context, without_context, weight)


def contrast_generate(
    lm: LoadedModel,
    prompts: Sequence[str],
    questions: Sequence[str],
    max_new_tokens: int,
    rule: "Callable[[Tensor, Tensor], Tensor]",
    *,
    probe_tokens: Tensor | None = None,
    max_rows: int | str = 64,
    on_progress: OnProgress | None = None,
    forced_tokens: Tensor | None = None,
    engine: Engine | None = None,
) -> Generation:
    """Greedy decoding of every (prompt, question) pair as one contrastive stream each, its
    tokens chosen by `rule` from the two branches' logits (a :data:`juice.engine.ContrastRule`:
    :class:`CadPolicy`, :class:`juice.baselines.ckplug.CkPlugPolicy`); :func:`cad_generate`'s
    arguments otherwise, each distinct text prefilled once.

    Raises:
        as :func:`cad_generate`.
    """
    if len(prompts) != len(questions):
        raise ValueError("one question per prompt")
    texts = list(dict.fromkeys([*prompts, *questions]))   # each distinct text once: shared prefills
    index = {t: i for i, t in enumerate(texts)}
    streams = [Stream(index[p], contrast=Contrast(index[q], rule)) for p, q in zip(prompts, questions)]
    return engine_or_default(engine).generate(lm, texts, streams, max_new_tokens, probe_tokens=probe_tokens,
                                              max_rows=max_rows, on_progress=on_progress, forced_tokens=forced_tokens)


def cad_generate(
    lm: LoadedModel,
    prompts: Sequence[str],
    questions: Sequence[str],
    max_new_tokens: int = 10,
    alpha: float | AlphaRule = ALPHA,
    *,
    probe_tokens: Tensor | None = None,
    max_rows: int | str = 64,
    on_progress: OnProgress | None = None,
    forced_tokens: Tensor | None = None,
    engine: Engine | None = None,
) -> Generation:
    """Greedy context-aware decoding of every (prompt, question) pair: one contrastive stream each
    (:class:`CadPolicy`) of :func:`juice.engine.generate`, batched, with its chunking, KV cache
    options (the model's default) and runtime guard. Each distinct text is prefilled once.

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
        engine: what decodes (:mod:`juice.engine.backend`; None: juice's own engine; vLLM's hands
            contrastive streams back to it).

    Returns:
        :class:`~juice.engine.Generation`, one entry per prompt.

    Raises:
        PromptTooLongError: a prompt does not fit the context window with the new tokens.
        ValueError: lengths differ or max_new_tokens < 1.
        juice.engine.guard.BatchingMismatchError: batched decoding is not exact on this backend (the first
            padded chunk is checked against one-at-a-time decoding, as in :func:`juice.engine.generate`).
    """
    return contrast_generate(lm, prompts, questions, max_new_tokens, CadPolicy(alpha), probe_tokens=probe_tokens,
                             max_rows=max_rows, on_progress=on_progress, forced_tokens=forced_tokens, engine=engine)


def cad_continuation_logprobs(
    lm: LoadedModel, prompts: Sequence[str], questions: Sequence[str], continuations: Sequence[str],
    alpha: float | AlphaRule = ALPHA,
) -> Tensor:
    """Sum of log-probabilities of each continuation under CAD's (or AdaCAD's) adjusted distribution
    (teacher forcing; softmax of the contrasted logits at every continuation token, alpha of a
    rule recomputed at each): :func:`cad_generate` with the continuations as `forced_tokens`.
    The uncached reference is :func:`juice.reference.cad_continuation_logprobs_naive`.

    Returns:
        `[len(prompts)]` float64 log-probabilities (nats).

    Raises:
        EmptyAnswerError: a continuation tokenizes to nothing.
        ValueError: lengths differ.
    """
    conts = [continuation_ids(lm.tokenizer, p, c)[1] for p, c in zip(prompts, continuations, strict=True)]
    if len(questions) != len(prompts):
        raise ValueError("one question per prompt")
    if not conts:
        return torch.zeros(0, dtype=torch.float64)
    width = max(map(len, conts))
    forced = torch.full((len(conts), width), lm.tokenizer.pad_token_id or 0, dtype=torch.long)
    for i, c in enumerate(conts):
        forced[i, : len(c)] = torch.tensor(c)
    lps = cad_generate(lm, prompts, questions, width, alpha, forced_tokens=forced).forced_logprobs
    return torch.stack([lp[: len(c)].sum() for lp, c in zip(lps, conts)])
