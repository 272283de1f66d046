"""Stage 1: head identification, and the heads file that carries its selection (paper Sec. 3.2; App. E, Alg. 2 "Record Head Score", Alg. 3
"Filter Inconsistent Head").

Each head is scaled alone, `H <- H + alpha * H`, for every alpha in alpha+ and alpha-; its score
for a conflict type is the change in the softmax probability, at the last position, of the
target answer's first token, summed over the head identification set D. Heads whose score is
negative for any conflict type are dropped; the top K by summed score are kept, one set for
positive and one for negative scaling.

Exact scoring is batched (:mod:`juice.sweeps`): one forward per prompt (or per chunk of `max_rows` rows) holds every
(head, alpha) intervention as a batch row. Row 0 is the clean model. The batch *grows* layer by
layer: the rows that intervene at layer l are appended at layer l's input as copies of the clean
residual stream, since every layer below l is identical for them. Logits are computed at the
last position only.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
from torch import Tensor

from juice.data.records import CONFLICT_TYPES, CONTEXT_TYPE, ConflictExample, ContextualExample, Direction
from juice.interventions import Head, check_heads, projection_input_hooks
from juice.io import UnitCheckpoint, write_json_atomic
from juice.models import LoadedModel
from juice.sweeps import intervention_probs
from juice.tokens import answer_first_token, encode


@dataclass(frozen=True)
class HeadSelection:
    """Heads to steer: `positive` get beta+, `negative` get beta- (paper Alg. 1 output)."""

    positive: tuple[Head, ...]
    negative: tuple[Head, ...]


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
    naive: bool = False,
    heads: Sequence[Head] | None = None,
    on_prompt: Callable[[int], None] | None = None,
    checkpoint: UnitCheckpoint | None = None,
) -> HeadScores:
    """Paper Alg. 2 ("Record Head Score") for every head, batched.

    Args:
        prompts: D's prompts, each with its target token and conflict type.
        max_rows: most intervention rows per forward.
        naive: use the one-intervention-per-forward reference (benchmarks).
        heads: score only these heads (the rest get score 0 and `scored` False); all by default.
        on_prompt: called with the index of each prompt when scored (progress bars).
        checkpoint: per-prompt results are read from and written to it (resumable sweep).
    """
    g = lm.heads.geometry
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
    for i, sp in enumerate(prompts):
        unit = UnitCheckpoint.unit_id("exact", sp, interventions) if checkpoint else ""
        done = checkpoint.get(unit) if checkpoint else None
        if done is not None:
            p0, p = done["clean"], torch.tensor(done["probs"], dtype=torch.float64)
        elif naive:
            from juice.reference import (
                intervention_probs_naive,  # the reference (benchmarks); it imports this module's neighbours
            )
            p0, p = intervention_probs_naive(lm, sp.prompt, sp.target_token, interventions)
        else:
            p0, p = intervention_probs(lm, sp.prompt, sp.target_token, interventions, max_rows=max_rows)
        if checkpoint and done is None:
            checkpoint.put(unit, {"clean": p0, "probs": p.double().tolist()})
        scores[types.index(sp.conflict_type), layer_idx, head_idx] += (p.double() - p0).view(len(heads), len(alphas))
        clean[sp.conflict_type].append(p0)
        if on_prompt:
            on_prompt(i)
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


# ---------------------------------------------------------------- the heads file


class HeadsFileMismatchError(ValueError):
    """A heads file made for another model."""


@dataclass
class HeadsArtifact:
    """What Stage 1 saves: the selection and everything needed to judge and reproduce it."""

    model: dict[str, Any]
    direction: str
    k: int
    alphas_positive: list[float]
    alphas_negative: list[float]
    selection: HeadSelection
    head_set: list[dict] = field(default_factory=list)
    scores: dict[str, Any] = field(default_factory=dict)
    data: dict[str, Any] = field(default_factory=dict)   # where D came from (file, digest, rows)
    tuned: dict[str, Any] = field(default_factory=dict)  # `juice tune`: method -> chosen setting, and "data"

    def to_json(self) -> dict[str, Any]:
        return {
            "format": "juice-heads/1",
            "model": self.model,
            "direction": self.direction,
            "k": self.k,
            "alphas_positive": self.alphas_positive,
            "alphas_negative": self.alphas_negative,
            "positive_heads": [str(h) for h in self.selection.positive],
            "negative_heads": [str(h) for h in self.selection.negative],
            "head_set": self.head_set,
            "scores": self.scores,
            "data": self.data,
            **({"tuned": self.tuned} if self.tuned else {}),
        }


def make_artifact(
    lm: LoadedModel, scores: HeadScores, selection: HeadSelection, k: int, direction: str,
    head_set: Sequence[ConflictExample] | Sequence[ContextualExample],
) -> HeadsArtifact:
    """Bundle a selection with the model fingerprint, D, the alphas and the per-type scores."""
    per_head = {}
    g = lm.heads.geometry
    for sign in "+-":
        pt = scores.per_type(sign)
        per_head[sign] = {
            str(Head(l, h)): {t: round(float(pt[j, l, h]), 6) for j, t in enumerate(scores.conflict_types)}
            for l in range(g.n_layers) for h in range(g.n_heads)
        }
    return HeadsArtifact(
        model=lm.fingerprint(),
        direction=direction,
        k=k,
        alphas_positive=list(scores.alphas[: scores.n_positive]),
        alphas_negative=list(scores.alphas[scores.n_positive:]),
        selection=selection,
        head_set=[ex.to_json() for ex in head_set],
        scores={
            "positive": per_head["+"],
            "negative": per_head["-"],
            "clean_probs": {t: scores.clean_probs[j].tolist() for j, t in enumerate(scores.conflict_types)},
        },
    )


def save_heads(artifact: HeadsArtifact, path: str | Path) -> None:
    """Save a heads artifact as JSON (atomically)."""
    write_json_atomic(path, artifact.to_json())


_FINGERPRINT_KEYS = ("model_type", "n_layers", "n_heads", "head_dim", "vocab_size", "weights_sha256_16")


def load_heads(path: str | Path, lm: LoadedModel | None = None) -> HeadsArtifact:
    """Read a heads file; with `lm`, check that it was made for this model.

    Raises:
        HeadsFileMismatchError: the file's model fingerprint differs from `lm`'s.
        ValueError: not a juice heads file (not JSON, another format, a missing field, a head
            name that does not parse); with `lm`, a head outside the model.
    """
    try:
        data = json.loads(Path(path).read_text(encoding="utf-8"))
    except (json.JSONDecodeError, RecursionError) as err:
        raise ValueError(f"{path} is not a juice heads file: not JSON ({type(err).__name__})") from None
    except UnicodeDecodeError:
        raise ValueError(f"{path} is not a juice heads file: not UTF-8 text") from None
    if not isinstance(data, dict) or data.get("format") != "juice-heads/1":
        raise ValueError(f"{path} is not a juice heads file (no 'format': 'juice-heads/1')")
    if not isinstance(data.get("model"), dict):
        raise ValueError(f"{path}: a juice heads file without its model fingerprint")
    if lm is not None:
        mine = lm.fingerprint()
        theirs = data["model"]
        diff = [k for k in _FINGERPRINT_KEYS if mine.get(k) != theirs.get(k)]
        if diff:
            raise HeadsFileMismatchError(
                f"{path} was made for model {theirs.get('name')!r} ({', '.join(f'{k}={theirs.get(k)}' for k in diff)}); "
                f"this model is {mine['name']!r} ({', '.join(f'{k}={mine.get(k)}' for k in diff)})"
            )
    try:
        direction = Direction.parse(data.get("direction", ""))
    except ValueError as err:
        raise ValueError(f"{path}: {err}") from None
    try:
        selection = HeadSelection(
            tuple(Head.parse(h) for h in data["positive_heads"]), tuple(Head.parse(h) for h in data["negative_heads"])
        )
        artifact = HeadsArtifact(
            data["model"], direction, data["k"], data["alphas_positive"], data["alphas_negative"],
            selection, data.get("head_set", []), data.get("scores", {}), data.get("data", {}),
            data.get("tuned", {}),
        )
    except KeyError as missing:
        raise ValueError(f"{path}: a juice heads file without the field {missing}") from None
    except (TypeError, AttributeError, ValueError):
        raise ValueError(f"{path}: heads must be lists of names like 'L6H3'") from None
    if not isinstance(artifact.tuned, dict):
        raise ValueError(f"{path}: 'tuned' must be an object (method -> setting)")
    if lm is not None:
        try:
            check_heads(list(selection.positive) + list(selection.negative), lm.heads.geometry)
        except IndexError as err:
            raise ValueError(f"{path}: {err}") from None
    return artifact


# ---------------------------------------------------------------- attribution prefilter


def head_attributions(lm: LoadedModel, prompt: str, target_token: int) -> Tensor:
    """First-order effect of scaling each head: `<H, d p / d H>` summed over positions.

    Attribution patching (Nanda 2023; AtP, Kramar et al. 2024): scaling head h by alpha changes
    the target probability by about `alpha * A[h]`. One forward and one backward per prompt.

    Returns:
        `[n_layers, n_heads]` attributions A.
    """
    g = lm.heads.geometry
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
    on_prompt: Callable[[int], None] | None = None,
    checkpoint: UnitCheckpoint | None = None,
) -> HeadScores:
    """Linear estimate of :func:`score_heads`: score(h, alpha) ~= alpha * A[h], summed over D.
    With `checkpoint`, per-prompt attributions are saved and reused (resumable)."""
    g = lm.heads.geometry
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
        if on_prompt:
            on_prompt(i)
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
    on_prompt: Callable[[int], None] | None = None,
    checkpoint: UnitCheckpoint | None = None,
) -> HeadScores:
    """Attribution shortlist, then exact scores: the `m` best heads for alpha+ scored exactly with
    alpha+ only, and the `m` best for alpha- with alpha- only. Unscored heads are marked in
    `scored` and never selected."""
    approx = attribution_scores(lm, prompts, alphas_positive, alphas_negative, on_prompt=on_prompt,
                                checkpoint=checkpoint)
    plus = score_heads(lm, prompts, alphas_positive, (), heads=shortlist(approx, m, "+"), max_rows=max_rows,
                       on_prompt=on_prompt, checkpoint=checkpoint)
    minus = score_heads(lm, prompts, (), alphas_negative, heads=shortlist(approx, m, "-"), max_rows=max_rows,
                        on_prompt=on_prompt, checkpoint=checkpoint)
    return HeadScores(
        torch.cat([plus.scores, minus.scores], dim=-1), (*plus.alphas, *minus.alphas), len(plus.alphas),
        plus.conflict_types, plus.clean_probs, torch.stack([plus.scored[0], minus.scored[1]]),
    )
