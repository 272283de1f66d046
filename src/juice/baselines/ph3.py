"""PH3, "Pruning Head via PatH PatcHing" (Jin et al. 2024, "Cutting Off the Head Ends the
Conflict: A Mechanism for Interpreting and Mitigating Knowledge Conflicts in Language Models",
arXiv 2402.18154, ACL Findings 2024; the JuICE paper's baseline, Sec. 4.1).

What PH3 is (its abstract): some attention heads of the later layers have opposite effects under
a knowledge conflict: *memory heads* recall the answer from the model's internal memory, *context
heads* retrieve the answer the external context asserts. PH3 locates both kinds by path patching
and prunes (zero-ablates, at every position, no parameter update) the top-k heads of the kind that
opposes the wanted answer: context heads to make the model follow its memory, memory heads to
make it follow the context. k is tuned on validation from :data:`PRUNE_K` (docs/protocol.md).

Path patching (Wang et al. 2023, "Interpretability in the Wild", Sec. 3.1 and App. B; the method
PH3 is named after). The model runs on the *original* input x_org; the output of one *sender*
head is replaced by its output on a *counterfactual* input x_cf; every other attention head is
frozen at its value on x_org, while MLPs and norms are recomputed, so the replacement reaches the
*receiver*, here the logits, only along the sender's paths: directly and through the MLPs. The
effect of head h on one prompt is the change of the logit difference at the last position,

    LD = logit(parametric answer) - logit(context answer),
    effect(h) = LD(x_org, h patched from x_cf) - LD(x_org),

averaged over the development prompts (:func:`path_patching_effects`). A memory head pushes the
parametric answer on x_org and not on x_cf: patching it lowers LD (effect < 0). A context head
pushes the context answer: patching it raises LD (effect > 0). :class:`Ph3Scores` ranks by these
signs and :func:`heads_to_prune` takes the opposing kind.

Points decided here:

- *Source.* The text of PH3's method section could not be retrieved where this was written (the
  stored copies of arXiv 2402.18154 yield its abstract only; its code, github.com/jinzhuoran/
  MConflict, is not in the index). Path patching follows Wang et al. (above); what PH3's own
  sections specify beyond its abstract (the counterfactual, the normalization of the metric) is
  decided here and listed below. Re-check against the paper when it can be read.
- *Original input*: a prompt with the conflicting context: ParaConflict's substitution and
  coherent prompts (its clean prompt has no conflict), a contextual item's prompt.
- *Counterfactual input*: the prompt of *another development item* of the same kind (same domain
  and conflict type; same contextual dataset): same template, every entity the answer depends
  on (the subject, hence the parametric answer, and the context answer) changed, the analogue
  of Wang et al.'s p_ABC. Of the candidates, only this one moves both kinds of head: with the
  same query *without* the context a memory head recalls the same answer as on x_org (effect
  ~ 0, memory heads would not be found); with the same query under *another* context a memory
  head is unchanged too. Partner: the next item in the given order (a rotation within the
  group), preferring one whose answers' first tokens differ from this prompt's; if the group
  holds one item, another group of the same kind; if the whole set holds one item, its
  context-free query (ParaConflict's clean prompt, the contextual item's question), marked
  `counterfactual_kind="no_context"`: context heads are still found, memory heads barely show.
  ParaConflict's coherent prompts draw their paragraph template per item, so a coherent partner
  may read differently around the same entities.
- *Position, and prompts of different lengths*: the sender is patched at the last position only,
  and LD is read there. This is exact, not an approximation: with every other head frozen at
  every position nothing moves information between positions, so the sender's outputs at earlier
  positions cannot reach the last position's logits. The two prompts may therefore differ in
  length.
- *Cost*: for the same reason the patched forward needs the last token alone: one batched
  forward of one token (its position id the prompt's last), every head's output supplied by
  hooks at the output projection's input, one row per sender, appended at the sender's layer (the
  growing batch of :mod:`juice.stage1.scoring`), plus one capturing forward on each of the two prompts.
  The test compares it with a full-sequence hooked forward per head.
- *Paths*: to the logits directly and through the MLPs (Wang et al.'s path "h -> logits"); all
  norms are recomputed, the final one included, none is frozen at its x_org scale. Gemma 2/3 and
  OLMo 2 normalize the attention output (`post_attention_layernorm`) before the residual add: that
  norm, like the MLPs, is recomputed on the layer's patched attention output, so patching one head
  also rescales the frozen heads' sum of its layer, as it does in the model. A direct-path-only
  variant (MLPs frozen) is not offered.
- *Metric*: the answers' first tokens stand for the answers (as in JuICE's Stage 1); the change
  of LD is in logits, not divided by the original LD (its sign varies across prompts under
  conflict); prompts are averaged with equal weight.
- *Which heads are pruned*: all heads are scored; the top-k of the opposing kind with an effect
  of that sign (fewer if fewer have it), k tuned on validation.

The knock-out scorer (:func:`logit_difference_effects`: zero-ablate each head alone at every
position, the effect on LD along every path) is kept as a separate, clearly named option
("PH3 (knock-out)"; the pipeline's row "PH3-l (knock-out)"), never as PH3 itself.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import torch
from torch import Tensor

from juice.budget import resolve_max_rows
from juice.data.records import ConflictExample, ContextualExample, Direction
from juice.interventions import Head, check_heads, projection_input_hooks
from juice.io import UnitCheckpoint
from juice.models import LoadedModel
from juice.engine.backend import Engine, engine_or_default
from juice.readout import grow_batch
from juice.tokens import answer_first_token, encode
from juice.progress import OnProgress

PRUNE_K: tuple[int, ...] = (1, 3, 5, 7, 9, 15)


@dataclass(frozen=True)
class ConflictPrompt:
    """A prompt with the first tokens of its parametric and its context answer."""

    prompt: str
    parametric_token: int
    context_token: int


@dataclass
class Ph3Scores:
    """Per-head effect on the logit difference, of path patching or of knock-out.

    Attributes:
        effects: `[n_layers, n_heads]`, mean over prompts of LD(head patched or zeroed) -
            LD(original), in logits.
        clean_ld: `[n_prompts]` the unmodified model's LD on the original prompts.
    """

    effects: Tensor
    clean_ld: Tensor

    def ranked(self, kind: str) -> tuple[Head, ...]:
        """Memory heads (`kind="memory"`, effect < 0, most negative first) or context heads
        (`kind="context"`, effect > 0, largest first)."""
        sign = -1.0 if kind == "memory" else 1.0
        if kind not in ("memory", "context"):
            raise ValueError(f"kind must be 'memory' or 'context', not {kind!r}")
        flat = (sign * self.effects).flatten()
        n_heads = self.effects.shape[1]
        order = flat.argsort(descending=True)
        return tuple(Head(int(i) // n_heads, int(i) % n_heads) for i in order if flat[i] > 0)


def logit_difference_effects(
    lm: LoadedModel,
    prompts: Sequence[ConflictPrompt],
    *,
    max_rows: int | str = 256,
    on_progress: OnProgress | None = None,
    checkpoint: UnitCheckpoint | None = None,
    engine: Engine | None = None,
) -> Ph3Scores:
    """Zero-ablate every head alone on every prompt and record the change of LD (module docstring).

    Cost: one batched forward per prompt holding `n_layers * n_heads` ablation rows (the
    growing batch of :func:`juice.readout.intervention_readout`). With `checkpoint`, each
    prompt's result is saved as soon as it is computed (an interrupted sweep resumes). `engine`
    computes the logit differences (:meth:`juice.engine.backend.Engine.intervention_logit_differences`;
    None: juice's own engine).

    Raises:
        ValueError: no prompts.
    """
    if not prompts:
        raise ValueError("PH3 needs at least one development prompt")
    g = lm.geometry
    interventions = [(Head(l, h), -1.0) for l in range(g.n_layers) for h in range(g.n_heads)]
    engine = engine_or_default(engine)

    def measure(cp: ConflictPrompt) -> tuple[float, Tensor]:
        return engine.intervention_logit_differences(lm, cp.prompt, (cp.parametric_token, cp.context_token),
                                                     interventions, max_rows)

    return _mean_effects(lm, prompts, "ph3", measure, checkpoint, on_progress)


def _mean_effects(lm: LoadedModel, prompts: Sequence, unit_kind: str, measure: Callable[[Any], tuple[float, Tensor]],
                  checkpoint: UnitCheckpoint | None, on_progress: OnProgress | None) -> Ph3Scores:
    """Both PH3 scorers' loop: per prompt, `measure(prompt)` -> (clean LD, `[n_layers * n_heads]`
    LD with each head intervened), saved per prompt under `unit_kind` in `checkpoint` (a
    resumed run reads it back); the mean effect LD - LD_clean over prompts."""
    g = lm.geometry
    total = torch.zeros(g.n_layers * g.n_heads, dtype=torch.float64)
    clean_ld = []
    for i, prompt in enumerate(prompts):
        unit = UnitCheckpoint.unit_id(unit_kind, prompt, g) if checkpoint else ""
        done = checkpoint.get(unit) if checkpoint else None
        if done is None:
            ld0, ld = measure(prompt)
            done = {"clean_ld": ld0, "ld": ld.tolist()}
            if checkpoint:
                checkpoint.put(unit, done)
        total += torch.tensor(done["ld"], dtype=torch.float64) - done["clean_ld"]
        clean_ld.append(done["clean_ld"])
        if on_progress:
            on_progress(1)
    return Ph3Scores((total / len(prompts)).view(g.n_layers, g.n_heads), torch.tensor(clean_ld))


OTHER_ITEM = "other_item"
NO_CONTEXT = "no_context"


@dataclass(frozen=True)
class PatchingPrompt:
    """One path-patching unit (module docstring).

    Attributes:
        prompt: the original input x_org, with the conflicting context.
        counterfactual: x_cf, whose sender outputs are patched in: another item's prompt of the
            same kind (`counterfactual_kind="other_item"`), or this item's context-free query
            (`"no_context"`, only for a one-item set). May differ from `prompt` in length.
        parametric_token: the parametric answer's first token after `prompt`.
        context_token: the context answer's first token after `prompt`.
        counterfactual_kind: :data:`OTHER_ITEM` or :data:`NO_CONTEXT`.
    """

    prompt: str
    counterfactual: str
    parametric_token: int
    context_token: int
    counterfactual_kind: str = OTHER_ITEM


PATCHED_CONFLICT_TYPES = ("substitution", "coherent")


@dataclass(frozen=True)
class _Unit:
    group: tuple            # same template: domain and conflict type, or contextual dataset
    kind: tuple             # fallback pool: conflict type, or "contextual"
    prompt: str
    no_context: str
    parametric_token: int
    context_token: int


def _partner(units: Sequence[_Unit], i: int) -> int | None:
    """Index of the counterfactual item for unit i (module docstring), or None if none exists."""
    me = units[i]
    rotation = [(i + s) % len(units) for s in range(1, len(units))]
    same_group = [j for j in rotation if units[j].group == me.group]
    same_kind = [j for j in rotation if units[j].kind == me.kind and units[j].group != me.group]
    mine = {me.parametric_token, me.context_token}
    for candidates in (same_group, same_kind):
        if candidates:
            distinct = [j for j in candidates if not mine & {units[j].parametric_token, units[j].context_token}]
            return (distinct or candidates)[0]
    return None


def ph3_patching_prompts(
    lm: LoadedModel, examples: Sequence[ConflictExample | ContextualExample]
) -> list[PatchingPrompt]:
    """The development prompts of path patching (module docstring): a ParaConflict item gives its
    substitution and coherent prompts, a contextual item its prompt; each prompt's counterfactual
    is the prompt of the same kind of another item in `examples` (next in order, preferring
    different answer first tokens), or, in a one-item set, its own context-free query.

    Raises:
        EmptyAnswerError: an answer tokenizes to nothing.
    """
    tok = lm.tokenizer
    units: list[_Unit] = []
    for ex in examples:
        if isinstance(ex, ConflictExample):
            for t in PATCHED_CONFLICT_TYPES:
                p = ex.prompts[t]
                units.append(_Unit(("paraconflict", ex.domain, t), ("paraconflict", t), p, ex.prompts["clean"],
                                   answer_first_token(tok, p, ex.answer),
                                   answer_first_token(tok, p, ex.context_answer)))
        else:
            units.append(_Unit(("contextual", ex.dataset), ("contextual",), ex.prompt, ex.question,
                               answer_first_token(tok, ex.prompt, ex.parametric_answer),
                               answer_first_token(tok, ex.prompt, ex.context_answer)))
    out = []
    for i, u in enumerate(units):
        j = _partner(units, i)
        cf, kind = (u.no_context, NO_CONTEXT) if j is None else (units[j].prompt, OTHER_ITEM)
        out.append(PatchingPrompt(u.prompt, cf, u.parametric_token, u.context_token, kind))
    return out


@torch.inference_mode()
def _last_position_heads(lm: LoadedModel, prompt: str) -> tuple[dict[int, Tensor], Tensor]:
    """Every layer's head outputs at the last position of `prompt` (layer -> `[n_heads,
    head_dim]`, on that layer's device) and the prompt's token ids `[seq]`."""
    g = lm.geometry
    ids = encode(lm.tokenizer, [prompt]).input_ids.to(lm.device)
    store: dict[int, Tensor] = {}

    def keep(layer: int, x: Tensor) -> Tensor:
        store[layer] = x[0, -1].detach().view(g.n_heads, g.head_dim).clone()
        return x

    with projection_input_hooks(lm.heads, {l: keep for l in range(g.n_layers)}):
        lm.model.base_model(input_ids=ids, use_cache=False)
    return store, ids[0]


@torch.inference_mode()
def path_patching_ld(
    lm: LoadedModel, pp: PatchingPrompt, heads: Sequence[Head], max_rows: int | str = 256
) -> tuple[float, Tensor]:
    """LD on the original prompt, and LD with each of `heads` path-patched from the counterfactual
    (module docstring), batched.

    Every head of every row is frozen at its output on the original prompt's last position, except
    the row's sender, which takes its output on the counterfactual's last position. Since nothing
    then moves between positions, the forward runs on the last token alone (position id of the
    prompt's last token): one row per head, appended at the head's layer (the layers below are
    identical for it), in chunks of `max_rows` rows.

    Returns:
        (original LD, `[len(heads)]` patched LDs), logits; the original LD is the same forward's
        unpatched row.

    Raises:
        IndexError: a head is out of range.
    """
    g = lm.geometry
    check_heads(list(heads), g)
    original, ids = _last_position_heads(lm, pp.prompt)
    counterfactual, _ = _last_position_heads(lm, pp.counterfactual)
    last = ids[-1:].view(1, 1)
    position = torch.tensor([[ids.shape[0] - 1]], device=ids.device)
    max_rows = resolve_max_rows(max_rows, lm, 1)
    pair = torch.tensor([pp.parametric_token, pp.context_token], device=lm.device)
    order = sorted(range(len(heads)), key=lambda i: heads[i])
    values = torch.zeros(len(heads), dtype=torch.float64)
    clean = 0.0
    for start in range(0, max(len(order), 1), max_rows):
        chunk = order[start:start + max_rows]
        senders: dict[int, list[int]] = {}
        for i in chunk:
            senders.setdefault(heads[i].layer, []).append(heads[i].head)

        def freeze_and_patch(layer: int, x: Tensor) -> Tensor:
            rows = x.shape[0]
            h = original[layer].to(x.device, x.dtype).expand(rows, g.n_heads, g.head_dim).clone()
            mine = senders.get(layer)
            if mine:   # this layer's senders are its last len(mine) rows, in sorted order
                r = torch.arange(rows - len(mine), rows, device=x.device)
                s = torch.tensor(mine, device=x.device)
                h[r, s] = counterfactual[layer].to(x.device, x.dtype)[s]
            return h.reshape(x.shape)

        with grow_batch(lm.heads, {l: len(v) for l, v in senders.items()}), \
                projection_input_hooks(lm.heads, {l: freeze_and_patch for l in range(g.n_layers)}):
            out = lm.model.base_model(input_ids=last, position_ids=position, use_cache=False)
        hidden = out.last_hidden_state[:, -1]
        logits = lm.logits(hidden).float()[:, pair.to(hidden.device)]
        ld = (logits[:, 0] - logits[:, 1]).double().cpu()
        clean = float(ld[0])
        values[chunk] = ld[1:]   # rows were appended layer by layer in the chunk's (sorted) order
    return clean, values


def path_patching_effects(
    lm: LoadedModel,
    prompts: Sequence[PatchingPrompt],
    *,
    max_rows: int | str = 256,
    on_progress: OnProgress | None = None,
    checkpoint: UnitCheckpoint | None = None,
) -> Ph3Scores:
    """PH3's head scores: the mean over `prompts` of LD(head path-patched) - LD(original), for
    every head (module docstring). Memory heads come out negative, context heads positive.

    Cost per prompt: two forwards that record the heads' last-position outputs, and one batched
    one-token forward of `n_layers * n_heads` rows (chunks of `max_rows`). With `checkpoint`, each
    prompt's result is saved as soon as it is computed (an interrupted sweep resumes).

    Returns:
        :class:`Ph3Scores`: effects `[n_layers, n_heads]` (logits), the original LD per prompt.

    Raises:
        ValueError: no prompts.
    """
    if not prompts:
        raise ValueError("PH3 needs at least one development prompt")
    g = lm.geometry
    heads = [Head(l, h) for l in range(g.n_layers) for h in range(g.n_heads)]
    return _mean_effects(lm, prompts, "ph3-path", lambda pp: path_patching_ld(lm, pp, heads, max_rows),
                         checkpoint, on_progress)


def heads_to_prune(scores: Ph3Scores, direction: str, k: int) -> tuple[Head, ...]:
    """The top-k heads that oppose `direction`: context heads for "parametric", memory heads for
    "contextual" (fewer if fewer have an effect of that sign).

    Raises:
        ValueError: unknown direction or k < 0.
    """
    direction = Direction.parse(direction)
    if k < 0:
        raise ValueError(f"k must be >= 0, got {k}")
    return scores.ranked("context" if direction == "parametric" else "memory")[:k]

