"""APPROXIMATE Stage 1 (not the paper's): attribution patching, and the hybrid that re-scores an
attribution shortlist exactly. Labelled as approximations wherever their heads are reported.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
from torch import Tensor

from juice.interventions import Head, projection_input_hooks
from juice.io import UnitCheckpoint
from juice.models import LoadedModel
from juice.stage1.scoring import ALPHAS_NEGATIVE, ALPHAS_POSITIVE, HeadScores, ScoringPrompt, score_heads
from juice.tokens import encode
from juice.progress import OnProgress



def head_attributions(lm: LoadedModel, prompt: str, target_token: int) -> Tensor:
    """First-order effect of scaling each head: `<H, d p / d H>` summed over positions.

    Attribution patching (Nanda 2023; AtP, Kramar et al. 2024): scaling head h by alpha changes
    the target probability by about `alpha * A[h]`. One forward and one backward per prompt.

    Returns:
        `[n_layers, n_heads]` attributions A.
    """
    g = lm.geometry
    ids = encode(lm.tokenizer, [prompt]).input_ids.to(lm.device)
    saved: dict[int, Tensor] = {}

    def keep(layer: int, x: Tensor) -> Tensor:
        saved[layer] = x
        return x

    def grad_from_embeddings(module, args, output):
        return output.detach().requires_grad_(True)

    handle = lm.model.get_input_embeddings().register_forward_hook(grad_from_embeddings)
    try:
        with torch.enable_grad(), projection_input_hooks(lm.heads, {l: keep for l in range(g.n_layers)}):
            hidden = lm.model.base_model(input_ids=ids, use_cache=False).last_hidden_state[:, -1]
            p = lm.logits(hidden).float().softmax(-1)[0, target_token]
            layers = sorted(saved)
            grads = torch.autograd.grad(p, [saved[l] for l in layers])
    finally:
        handle.remove()
    out = torch.zeros(g.n_layers, g.n_heads)
    for l, grad in zip(layers, grads):
        h = saved[l].detach().view(*saved[l].shape[:-1], g.n_heads, -1)
        gh = grad.view_as(h)
        out[l] = (h * gh).sum(dim=(0, 1, 3)).float().cpu()
    return out


def attribution_scores(
    lm: LoadedModel,
    prompts: Sequence[ScoringPrompt],
    alphas_positive: Sequence[float] = ALPHAS_POSITIVE,
    alphas_negative: Sequence[float] = ALPHAS_NEGATIVE,
    on_progress: OnProgress | None = None,
    checkpoint: UnitCheckpoint | None = None,
) -> HeadScores:
    """Linear estimate of :func:`score_heads`: score(h, alpha) ~= alpha * A[h], summed over D.
    With `checkpoint`, per-prompt attributions are saved and reused (resumable)."""
    g = lm.geometry
    alphas = (*map(float, alphas_positive), *map(float, alphas_negative))
    types = tuple(dict.fromkeys(p.conflict_type for p in prompts))
    per_type = torch.zeros(len(types), g.n_layers, g.n_heads, dtype=torch.float64)
    for i, sp in enumerate(prompts):
        unit = UnitCheckpoint.unit_id("attribution", sp) if checkpoint else ""
        done = checkpoint.get(unit) if checkpoint else None
        if done is None:
            attribution = head_attributions(lm, sp.prompt, sp.target_token).double()
            if checkpoint:
                checkpoint.put(unit, attribution.tolist())
        else:
            attribution = torch.tensor(done, dtype=torch.float64)
        per_type[types.index(sp.conflict_type)] += attribution
        if on_progress:
            on_progress(1)
    scores = per_type[..., None] * torch.tensor(alphas, dtype=torch.float64)
    return HeadScores(scores, alphas, len(alphas_positive), types, torch.zeros(len(types), 0))


def shortlist(scores: HeadScores, m: int, sign: str) -> list[Head]:
    """The `m` most promising heads for one sign ("+" or "-"): heads consistent over conflict
    types by summed score, then the rest by their worst conflict type."""
    per_type = scores.per_type(sign)
    total, worst = per_type.sum(0), per_type.min(0).values
    consistent = per_type.ge(0).all(0)
    key = torch.where(consistent, total, worst - total.abs().max() - 1)
    idx = key.flatten().topk(min(m, key.numel())).indices
    n_heads = per_type.shape[-1]
    return sorted(Head(int(i) // n_heads, int(i) % n_heads) for i in idx)


def hybrid_scores(
    lm: LoadedModel,
    prompts: Sequence[ScoringPrompt],
    m: int,
    alphas_positive: Sequence[float] = ALPHAS_POSITIVE,
    alphas_negative: Sequence[float] = ALPHAS_NEGATIVE,
    *,
    max_rows: int | str = 256,
    on_progress: OnProgress | None = None,
    checkpoint: UnitCheckpoint | None = None,
) -> HeadScores:
    """Attribution shortlist, then exact scores: the `m` best heads for alpha+ scored exactly with
    alpha+ only, and the `m` best for alpha- with alpha- only. Unscored heads are marked in
    `scored` and never selected."""
    approx = attribution_scores(lm, prompts, alphas_positive, alphas_negative, on_progress=on_progress,
                                checkpoint=checkpoint)
    plus = score_heads(lm, prompts, alphas_positive, (), heads=shortlist(approx, m, "+"), max_rows=max_rows,
                       on_progress=on_progress, checkpoint=checkpoint)
    minus = score_heads(lm, prompts, (), alphas_negative, heads=shortlist(approx, m, "-"), max_rows=max_rows,
                        on_progress=on_progress, checkpoint=checkpoint)
    return HeadScores(
        torch.cat([plus.scores, minus.scores], dim=-1), (*plus.alphas, *minus.alphas), len(plus.alphas),
        plus.conflict_types, plus.clean_probs, torch.stack([plus.scored[0], minus.scored[1]]),
    )
