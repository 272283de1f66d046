"""Exact Stage 1: every head scored (paper Sec. 3.2; App. E, Alg. 2 "Record Head Score", Alg. 3
"Filter Inconsistent Head"), and the selection of the top K per sign.

Each head is scaled alone, `H <- H + alpha * H`, for every alpha in alpha+ and alpha-; its score
for a conflict type is the change in the softmax probability, at the last position, of the
target answer's first token, summed over the head identification set D. Heads whose score is
negative for any conflict type are dropped; the top K by summed score are kept, one set for
positive and one for negative scaling.

Exact scoring is batched (:mod:`juice.readout`): one forward per prompt (or per chunk of `max_rows` rows) holds every
(head, alpha) intervention as a batch row. Row 0 is the clean model. The batch *grows* layer by
layer: the rows that intervene at layer l are appended at layer l's input as copies of the clean
residual stream, since every layer below l is identical for them. Logits are computed at the
last position only.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

import torch
from torch import Tensor

from juice.data.records import CONFLICT_TYPES, CONTEXT_TYPE, ConflictExample, ContextualExample, Direction
from juice.interventions import Head, HeadSelection
from juice.io import UnitCheckpoint
from juice.models import LoadedModel
from juice.readout import intervention_probs
from juice.tokens import answer_first_token
from juice.progress import OnProgress

ProbsFn = Callable[..., "tuple[float, Tensor]"]
"""`(lm, prompt, target_token, interventions, max_rows=...) -> (p_clean, probs)`: :func:`score_heads`'s readout."""

ALPHAS_POSITIVE: tuple[float, ...] = (1.0, 3.0, 5.0, 10.0, 30.0)


ALPHAS_NEGATIVE: tuple[float, ...] = (-1.0, -2.0, -5.0)


@dataclass(frozen=True)
class ScoringPrompt:
    """One prompt of D under one conflict type, with the token whose probability is scored."""

    prompt: str
    target_token: int
    conflict_type: str


def scoring_prompts(
    lm: LoadedModel,
    examples: Sequence[ConflictExample] | Sequence[ContextualExample],
    direction: str = "parametric",
    conflict_types: Sequence[str] = CONFLICT_TYPES,
) -> list[ScoringPrompt]:
    """The prompts of D with their target tokens: the parametric answer's first token, or the
    context answer's for `direction="contextual"`. A :class:`ContextualExample` (MemoTrap,
    NQ-Swap) gives its one prompt, conflict type "context", target its contextual answer.

    Raises:
        EmptyAnswerError: an answer tokenizes to nothing.
        ValueError: unknown direction.
    """
    direction = Direction.parse(direction)
    out = []
    for ex in examples:
        if isinstance(ex, ContextualExample):
            # contextual datasets have one prompt; the target is always the contextual answer
            out.append(ScoringPrompt(ex.prompt, answer_first_token(lm.tokenizer, ex.prompt, ex.context_answer),
                                     CONTEXT_TYPE))
            continue
        answer = ex.answer if direction == "parametric" else ex.context_answer
        for t in conflict_types:
            out.append(ScoringPrompt(ex.prompts[t], answer_first_token(lm.tokenizer, ex.prompts[t], answer), t))
    return out


@dataclass
class HeadScores:
    """Stage 1 scores.

    Attributes:
        scores: `[n_types, n_layers, n_heads, n_alphas]`, summed over D: change in probability of
            the target's first token when the head is scaled by that alpha.
        alphas: the scales, alpha+ first then alpha-.
        n_positive: how many of `alphas` are alpha+.
        conflict_types: names of the first axis.
        clean_probs: `[n_types, |D|]` the unmodified model's target probabilities.
        scored: `[2, n_layers, n_heads]` bool, the heads scored with alpha+ (index 0) and with
            alpha- (index 1); all, unless shortlisted.
    """

    scores: Tensor
    alphas: tuple[float, ...]
    n_positive: int
    conflict_types: tuple[str, ...]
    clean_probs: Tensor
    scored: Tensor | None = None

    def per_type(self, sign: str) -> Tensor:
        """`[n_types, n_layers, n_heads]`: S+ (sign "+") or S- (sign "-"), summed over alphas."""
        part = self.scores[..., : self.n_positive] if sign == "+" else self.scores[..., self.n_positive:]
        return part.sum(-1)


def score_heads(
    lm: LoadedModel,
    prompts: Sequence[ScoringPrompt],
    alphas_positive: Sequence[float] = ALPHAS_POSITIVE,
    alphas_negative: Sequence[float] = ALPHAS_NEGATIVE,
    *,
    max_rows: int | str = 256,
    probs: "ProbsFn | None" = None,
    heads: Sequence[Head] | None = None,
    on_progress: OnProgress | None = None,
    checkpoint: UnitCheckpoint | None = None,
    probs_many: Callable | None = None,
    prompts_per_call: int = 32,
) -> HeadScores:
    """Paper Alg. 2 ("Record Head Score") for every head, batched.

    Args:
        prompts: D's prompts, each with its target token and conflict type.
        max_rows: most intervention rows per forward.
        probs: how one prompt's interventions are read out: `(lm, prompt, target_token,
            [(head, alpha), ...], max_rows) -> (clean probability, [n_interventions] probabilities)`;
            default the batched growing sweep (:func:`juice.readout.intervention_probs`). The
            benchmarks and tests pass the naive one-forward-per-intervention reference
            (`juice.reference.intervention_probs_naive`).
        heads: score only these heads (the rest get score 0 and `scored` False); all by default.
        on_progress: called with the index of each prompt when scored (progress bars).
        checkpoint: per-prompt results are read from and written to it (resumable sweep).
        probs_many: instead of `probs`, read out up to `prompts_per_call` prompts in one call:
            `(lm, [(prompt, target_token), ...], [(head, alpha), ...], max_rows) -> [(clean
            probability, [n_interventions] probabilities), ...]`
            (:meth:`juice.engine.backend.Engine.intervention_probs_many`: an engine that serves
            requests asks each (head, alpha) of all those prompts at once). The same values.
    """
    g = lm.geometry
    alphas = (*map(float, alphas_positive), *map(float, alphas_negative))
    types = tuple(dict.fromkeys(p.conflict_type for p in prompts))
    if heads is None:
        heads = [Head(l, h) for l in range(g.n_layers) for h in range(g.n_heads)]
    heads = sorted(set(heads))
    interventions = [(head, a) for head in heads for a in alphas]
    layer_idx = torch.tensor([h.layer for h in heads])
    head_idx = torch.tensor([h.head for h in heads])
    scores = torch.zeros(len(types), g.n_layers, g.n_heads, len(alphas), dtype=torch.float64)
    scored = torch.zeros(2, g.n_layers, g.n_heads, dtype=torch.bool)
    scored[:, layer_idx, head_idx] = True
    clean: dict[str, list[float]] = {t: [] for t in types}
    units = [UnitCheckpoint.unit_id("exact", sp, interventions) if checkpoint else "" for sp in prompts]
    read: dict[int, tuple[float, Tensor]] = {}   # prompts read out ahead, by probs_many
    for i, sp in enumerate(prompts):
        done = checkpoint.get(units[i]) if checkpoint else None
        if done is not None:
            p0, p = done["clean"], torch.tensor(done["probs"], dtype=torch.float64)
        elif probs_many is not None:
            if i not in read:
                ahead = [j for j in range(i, len(prompts)) if not (checkpoint and checkpoint.get(units[j]))]
                ahead = ahead[:prompts_per_call]
                found = probs_many(lm, [(prompts[j].prompt, prompts[j].target_token) for j in ahead],
                                   interventions, max_rows)
                read.update(zip(ahead, found))
            p0, p = read.pop(i)
        else:
            p0, p = (probs or intervention_probs)(lm, sp.prompt, sp.target_token, interventions, max_rows=max_rows)
        if checkpoint and done is None:
            checkpoint.put(units[i], {"clean": p0, "probs": p.double().tolist()})
        scores[types.index(sp.conflict_type), layer_idx, head_idx] += (p.double() - p0).view(len(heads), len(alphas))
        clean[sp.conflict_type].append(p0)
        if on_progress:
            on_progress(1)
    return HeadScores(scores, alphas, len(alphas_positive), types, torch.tensor([clean[t] for t in types]), scored)


def select_heads(scores: HeadScores, k: int = 5) -> HeadSelection:
    """Paper Alg. 3 and the top-K of Alg. 1: drop heads with a negative score for any conflict
    type, keep the K with the largest score summed over types, for alpha+ and for alpha-.

    Fewer than K heads are returned where fewer pass the consistency filter.
    """

    def top(per_type: Tensor, sign: int) -> tuple[Head, ...]:
        consistent = per_type.ge(0).all(dim=0)
        if scores.scored is not None:
            consistent &= scores.scored[sign]
        total = per_type.sum(dim=0).masked_fill(~consistent, float("-inf"))
        flat = total.flatten()
        n = min(k, int(consistent.sum()))
        idx = flat.topk(n).indices if n else torch.empty(0, dtype=torch.long)
        n_heads = per_type.shape[-1]
        return tuple(Head(int(i) // n_heads, int(i) % n_heads) for i in idx)

    return HeadSelection(top(scores.per_type("+"), 0), top(scores.per_type("-"), 1))


