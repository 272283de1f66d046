"""Beyond the paper: JuICE and JuNE applied after the attention block's output norm.

JuICE (paper Alg. 1) and JuNE (Alg. 4) act on a head's output, its slice of the input to the
attention output projection. On architectures that normalize the attention block's output
before the residual add (Gemma 2 and 3: `post_attention_layernorm`; OLMo 2 too), the steered
heads' change then passes through that norm, `post_norm(y) = w * y / rms(y)`, which rescales the
whole block's output by the new `rms(y)`: part of the intervention is undone (scaling one head up
also shrinks every head's contribution, itself included).

**Definition (the post-norm variant).** Let `y = o_proj(H)` be a row's attention output before
the norm (`[batch, seq, hidden]`) and `g(y) = w_eff / sqrt(mean(y^2) + eps)` the norm's gain
(`[batch, seq, hidden]`, with `w_eff` the norm's effective weight, `1 + weight` on Gemma). The
*contribution of head h to the residual stream* is

    c_h = g(y) * (W_h H_h)        ([batch, seq, hidden]; W_h: the head's columns of o_proj)

so that `sum_h c_h = post_norm(y)` exactly (Gemma's o_proj has no bias; a bias is never part of
a head's contribution). The post-norm variant leaves `y` and the norm alone and adds to the
block's output:

- JuNE (post-norm): `post_norm(y) + sum_h beta_h * c_h`, with `c_h` from the same (live) row;
- JuICE (post-norm): `post_norm(y) + sum_h beta_h * c_h^clean`, with `c_h^clean` from the
  unmodified first run (its own `y` and gain), as Alg. 1 adds run 1's outputs.

With every beta 0 both equal the unmodified model. On an architecture without an output norm the
gain is 1, `c_h = W_h H_h`, and by linearity of the output projection the post-norm variant
*equals* the paper's (pre-norm) one: there it is an exact reformulation (tested on Llama).

`juice analyze norm` reports both variants side by side on the parametric benchmark (the six
domains, Table 1's protocol: filtered development pools, exact Stage 1 on World Capital's D,
(beta+, beta-) tuned per domain on its own validation split, *separately for each variant* over
the same grid), with paired bootstrap intervals of post-norm minus pre-norm, and a mechanistic
readout: how much of a pre-norm intervention survives the norm (`attenuation`).
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
from torch import Tensor, nn

from juice.analysis.common import (
    AnalysisOptions,
    Progress,
    no_progress,
    write_outputs,
)
from juice.architectures import ModelHeads
from juice.data.records import CONFLICT_TYPES, ConflictExample
from juice.decoding import Generation, Stream, generate
from juice.eval.metrics import is_correct
from juice.eval.runner import ItemResult, evaluate, results_from_json, results_to_json
from juice.interventions import RowPlan, projection_input_hooks
from juice.models import LoadedModel
from juice.steering import Steering, steering_coefficients
from juice.tokens import answer_first_token, encode

POST_NORMS: dict[str, str] = {
    "gemma2": "post_attention_layernorm",
    "gemma3_text": "post_attention_layernorm",
    "olmo2": "post_attention_layernorm",
}
"""model_type -> the decoder layer's module that normalizes the attention output before the
residual add. Elsewhere the attention block's contribution is the output projection's output."""


def post_norm_modules(heads: ModelHeads) -> list[nn.Module] | None:
    """Each layer's attention output norm, or None when the architecture has none."""
    path = POST_NORMS.get(heads.model.config.model_type)
    if path is None:
        return None
    return [getattr(layer, path) for layer in heads.layers]


def _norm_eps(norm: nn.Module) -> float:
    for name in ("eps", "variance_epsilon"):
        if isinstance(getattr(norm, name, None), float):
            return float(getattr(norm, name))
    raise ValueError(f"{type(norm).__name__}: not an RMS norm with an eps (the post-norm variant needs one)")


def norm_gain(norm: nn.Module, y: Tensor, weight_cache: dict[int, Tensor] | None = None) -> Tensor:
    """The per-coordinate gain `g(y)` of an RMS norm: `norm(y) = g(y) * y`.

    `w_eff` is read from the norm itself, `norm(ones) * sqrt(1 + eps)` (so both `weight` and
    Gemma's `1 + weight` work).

    Args:
        y: `[..., hidden]`, the norm's input.

    Returns:
        `[..., hidden]` float32 gain.
    """
    key = id(norm)
    if weight_cache is None or key not in weight_cache:
        eps = _norm_eps(norm)
        ones = torch.ones(1, y.shape[-1], device=y.device, dtype=y.dtype)
        w_eff = norm.forward(ones).float()[0] * math.sqrt(1 + eps)   # forward(): no hooks
        if weight_cache is not None:
            weight_cache[key] = w_eff
    else:
        w_eff = weight_cache[key]
    eps = _norm_eps(norm)
    return w_eff * torch.rsqrt(y.float().pow(2).mean(-1, keepdim=True) + eps)


def head_contributions(heads: ModelHeads, layer: int, h: Tensor, head_ids: Sequence[int]) -> Tensor:
    """`W_h H_h` for the listed heads of one layer: the output projection applied to one head's
    slice alone (no bias).

    Args:
        h: `[batch, seq, n_heads * head_dim]`, the output projection's input.

    Returns:
        `[batch, seq, len(head_ids), hidden]`.
    """
    d = heads.geometry.head_dim
    weight = heads.projections[layer].weight
    parts = []
    for head in head_ids:
        x = h[..., head * d:(head + 1) * d]
        if heads.adapter.weight_layout == "conv1d":
            parts.append(x @ weight[head * d:(head + 1) * d, :])
        else:
            parts.append(x @ weight[:, head * d:(head + 1) * d].T)
    return torch.stack(parts, dim=-2)


def _active(coefficients: Tensor, layer: int) -> list[int]:
    return [int(i) for i in coefficients[:, layer].ne(0).any(0).nonzero().flatten()]


@contextmanager
def post_norm_rows(heads: ModelHeads, plan: RowPlan) -> Iterator[None]:
    """Apply a :class:`juice.interventions.RowPlan` *after* the attention output norm (module
    docstring): row r's attention contribution to the residual stream becomes

        post_norm(y[r]) + sum_h scale[r, l, h] * c_h[r] + sum_h add[r, l, h] * c_h[source[r]].

    On an architecture without an output norm, the contribution is the output projection's
    output and the gain is 1. Registers a pre-hook on each active layer's output projection
    (saves its input) and a forward hook on the module whose output is added to the residual
    stream (the norm, or the projection); all removed on exit.

    Raises:
        ValueError: the norm's output is not `g(y) * y` (not an RMS norm; checked every forward).
    """
    scale, add = plan.scale.detach(), plan.add.detach()
    added_rows = torch.nonzero(plan.source >= 0).flatten()
    sources = plan.source[added_rows]
    norms = post_norm_modules(heads)
    layers = sorted({l for l in range(heads.geometry.n_layers) if _active(scale, l) or _active(add, l)})
    saved: dict[int, Tensor] = {}
    weights: dict[int, Tensor] = {}

    def save_input(layer: int, x: Tensor) -> Tensor:
        saved[layer] = x
        return x

    def make_hook(layer: int) -> Callable:
        head_ids = sorted(set(_active(scale, layer)) | set(_active(add, layer)))

        def hook(module: nn.Module, args: tuple, output: Tensor) -> Tensor:
            contributions = head_contributions(heads, layer, saved.pop(layer), head_ids).float()
            if norms is not None:
                y = args[0]
                gain = norm_gain(module, y, weights)
                if not torch.allclose(output.float(), gain * y.float(), rtol=1e-3, atol=1e-4 * float(output.detach().abs().max()) + 1e-6):
                    raise ValueError(f"{type(module).__name__} at layer {layer} is not an RMS norm of the form "
                                     "g(y) * y; the post-norm variant is not defined for it")
                contributions = contributions * gain[..., None, :]
            idx = torch.tensor(head_ids)
            s = scale[:, layer, idx].to(device=output.device, dtype=torch.float32)
            delta = torch.einsum("bshk,bh->bsk", contributions, s)
            if added_rows.numel():
                a = add[added_rows, layer][:, idx].to(device=output.device, dtype=torch.float32)
                rows = added_rows.to(output.device)
                delta[rows] += torch.einsum("bshk,bh->bsk", contributions[sources.to(output.device)], a)
            return (output.float() + delta).to(output.dtype)

        return hook

    handles = []
    try:
        with projection_input_hooks(heads, {layer: save_input for layer in layers}):
            for layer in layers:
                module = norms[layer] if norms is not None else heads.projections[layer]
                handles.append(module.register_forward_hook(make_hook(layer)))
            yield
    finally:
        for handle in handles:
            handle.remove()


# ---------------------------------------------------------------- generation


def _zero(heads: ModelHeads) -> Tensor:
    g = heads.geometry
    return torch.zeros(g.n_layers, g.n_heads)


def generate_post_norm(lm: LoadedModel, prompts: Sequence[str], streams: Sequence[Stream], max_new_tokens: int = 10,
                       *, probe_tokens: Tensor | None = None, max_rows: int | str = 64,
                       on_chunk: Callable[[int], None] | None = None) -> Generation:
    """Greedy decoding of many (prompt, steering) streams with JuICE and JuNE applied after the
    attention output norm (module docstring): :func:`juice.decoding.generate` (batched,
    KV-cached, the same row layout) with :func:`post_norm_rows` in place of the head-output
    hooks; greedy only (a stream's `sampling` must be None).

    Args:
        probe_tokens: `[n_streams, k]` token ids whose first-step probabilities to return.
        max_rows: most decoding rows per batch (a JuICE stream takes two), or "auto".

    Returns:
        :class:`juice.decoding.Generation` (tokens `[n_streams, max_new_tokens]`, texts,
        first-step probabilities).

    Raises:
        ValueError: max_new_tokens < 1, or a stream asks for sampling.
        PromptTooLongError: a prompt does not fit the context window with the new tokens.
    """
    if any(s.sampling is not None for s in streams):
        raise ValueError("post-norm steering decodes greedily; sampling is not offered")
    return generate(lm, prompts, streams, max_new_tokens, probe_tokens=probe_tokens, max_rows=max_rows,
                    on_chunk=on_chunk, apply_plan=post_norm_rows)


@torch.inference_mode()
def greedy_generate_post_norm_naive(lm: LoadedModel, prompt: str, max_new_tokens: int, steering: Steering) -> Tensor:
    """Reference decoding for tests: every step re-runs the whole sequence with no cache; JuICE
    literally twice (run 1 unmodified, its contributions `c_h^clean` captured; run 2 adds them).

    Returns:
        `[max_new_tokens]` new token ids.
    """
    ids = encode(lm.tokenizer, [prompt]).input_ids.to(lm.device)
    zero = _zero(lm.heads)[None]
    for _ in range(max_new_tokens):
        if steering.method == "juice":
            captured = _capture_contributions(lm, ids, steering.coefficients)
            with _added_contributions(lm, captured, steering.coefficients):
                logits = lm.model(input_ids=ids, use_cache=False).logits[:, -1]
        else:
            scale = zero if steering.method == "original" else steering.coefficients[None]
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


def evaluate_post_norm(lm: LoadedModel, examples: Sequence[ConflictExample], methods: dict[str, Steering],
                       conflict_types: Sequence[str] = CONFLICT_TYPES, *, max_new_tokens: int = 10,
                       max_rows: int | str = 64, on_progress: Callable[[int], None] | None = None) -> list[ItemResult]:
    """:func:`juice.eval.runner.evaluate` with the steerings applied after the attention output norm
    (exact match on the first 5 words of 10 greedy tokens; first-step answer probabilities)."""
    prompts: dict[str, int] = {}
    meta, streams, probes = [], [], []
    for ex in examples:
        for t in conflict_types:
            prompt = ex.prompts[t]
            for name, steering in methods.items():
                streams.append(Stream(prompts.setdefault(prompt, len(prompts)), steering))
                meta.append((ex, t, name))
                probes.append([answer_first_token(lm.tokenizer, prompt, ex.answer),
                               answer_first_token(lm.tokenizer, prompt, ex.context_answer)])
    if not streams:
        return []
    gen = generate_post_norm(lm, list(prompts), streams, max_new_tokens, probe_tokens=torch.tensor(probes),
                             max_rows=max_rows, on_chunk=on_progress)
    return [ItemResult(domain=ex.domain, subject=ex.subject, conflict_type=t, method=name, output=text,
                       correct=is_correct(text, ex.answers), follows_context=is_correct(text, [ex.context_answer]),
                       p_parametric=float(p[0]), p_context=float(p[1]), item=ex.uid)
            for (ex, t, name), text, p in zip(meta, gen.texts, gen.first_probs)]


# ---------------------------------------------------------------- mechanistic readout


@torch.inference_mode()
def attenuation(lm: LoadedModel, prompts: Sequence[str], heads: Sequence, beta: float) -> dict[str, float]:
    """How much of a pre-norm intervention reaches the residual stream: for each head h (at every
    position of every prompt), `|post_norm(y + beta W_h H_h) - post_norm(y)| / |beta c_h|`
    (Euclidean norms over the hidden dimension), averaged. 1 means the norm passes the
    intervention through unchanged (always so without an output norm); below 1, the norm's
    renormalization undoes part of it.

    Returns:
        head name (e.g. "L6H3") -> mean ratio.
    """
    norms = post_norm_modules(lm.heads)
    out: dict[str, float] = {}
    for head in heads:
        if norms is None:
            out[str(head)] = 1.0
            continue
        layer = head.layer
        ratios = []
        for prompt in prompts:
            ids = encode(lm.tokenizer, [prompt]).input_ids.to(lm.device)
            store: dict[str, Tensor] = {}
            with projection_input_hooks(lm.heads, {layer: lambda l, x: store.__setitem__("h", x) or x}):
                lm.model.base_model(input_ids=ids, use_cache=False)
            h = store["h"]
            y = lm.heads.projections[layer](h)
            wh = head_contributions(lm.heads, layer, h, [head.head])[..., 0, :]
            norm = norms[layer]
            moved = (norm(y + beta * wh) - norm(y)).float().norm(dim=-1)
            nominal = (beta * norm_gain(norm, y) * wh.float()).norm(dim=-1)
            ratios.append((moved / nominal.clamp_min(1e-12)).flatten())
        out[str(head)] = float(torch.cat(ratios).mean())
    return out


# ---------------------------------------------------------------- the study

VARIANTS = {"JuNE": "june", "JuNE (post-norm)": "june", "JuICE": "juice", "JuICE (post-norm)": "juice"}
METHOD_ORDER = ("Original", "JuNE", "JuNE (post-norm)", "JuICE", "JuICE (post-norm)")
ATTENUATION_BETAS = (1.0, 2.0, 5.0)


def tune_post_norm(lm: LoadedModel, validation: dict[str, list[ConflictExample]], selection,
                   grid: tuple[Sequence[float], Sequence[float]], max_rows: int | str = 64,
                   progress: Progress = no_progress) -> dict[str, dict[str, tuple[float, float]]]:
    """(beta+, beta-) of the post-norm JuICE and JuNE per domain on its own validation split, by
    the criterion of :func:`juice.eval.tuning.tune_per_domain` (mean accuracy over conflict types, ties:
    mean first-token probability of the answer, then grid order).

    Returns:
        domain -> method ("juice", "june") -> (beta+, beta-); domains without items left out.
    """
    from juice.eval.tuning import GridSetting, grid_points

    g = lm.heads.geometry
    settings = [GridSetting(m, bp, bm) for m in ("juice", "june") for bp in grid[0] for bm in grid[1]]
    steerings = {s.label: Steering(s.method, steering_coefficients(g, selection, s.beta_plus, s.beta_minus, s.method))
                 for s in settings}
    items = [ex for exs in validation.values() for ex in exs]
    advance = progress("tune post-norm JuICE and JuNE betas per domain", len(items) * 3 * len(steerings))
    results = evaluate_post_norm(lm, items, steerings, max_rows=max_rows, on_progress=advance) if items else []
    out = {}
    for domain, exs in validation.items():
        if exs:
            points = grid_points([r for r in results if r.domain == domain], CONFLICT_TYPES, settings=settings)
            out[domain] = {m: max((p for p in points if p.method == m), key=lambda p: p.key) for m in ("juice", "june")}
            out[domain] = {m: (p.beta_plus, p.beta_minus) for m, p in out[domain].items()}
    return out


@dataclass
class NormResult:
    """What :func:`run_norm` returns; `norm.json` holds the same plus every item.

    Attributes:
        post_norm: the model has an attention output norm (else both variants coincide).
        table: Original and both variants of JuNE and JuICE on every domain's test split.
        table_known: the same on the test items the model knows.
        betas: domain -> method name (e.g. "JuICE (post-norm)") -> (beta+, beta-).
        attenuation: beta -> head -> mean share of a pre-norm intervention that survives the norm.
    """

    title: str
    files: list[Path]
    wall_s: float
    post_norm: bool
    table: Any
    table_known: Any
    domains: list[str]
    titles: dict[str, str]
    selection: Any
    betas: dict[str, dict[str, tuple[float, float]]]
    attenuation: dict[str, dict[str, float]]
    mode: str
    notes: list[str] = field(default_factory=list)

    def to_json(self) -> dict[str, Any]:
        return {"title": self.title, "wall_s": self.wall_s, "mode": self.mode, "post_norm": self.post_norm,
                "table": self.table.to_json(), "table_known": self.table_known.to_json(),
                "accuracy": self.table.means(), "domains": self.domains, "titles": self.titles,
                "heads": {"positive": [str(h) for h in self.selection.positive],
                          "negative": [str(h) for h in self.selection.negative]},
                "betas": self.betas, "attenuation": self.attenuation, "notes": self.notes}


def run_norm(lm: LoadedModel, options: AnalysisOptions, progress: Progress = no_progress, *,
             test_items: int | None = 10) -> NormResult:
    """Pre-norm (the paper's) and post-norm JuICE and JuNE side by side on the parametric benchmark
    (module docstring); writes `norm.json`, `.md`, `.png` to `options.out`.

    Args:
        test_items: test items per domain in the default mode (`--full`: all; `--quick`: 3).

    Raises:
        ValueError: too few known World Capital items for D and validation; an output norm that
            is not an RMS norm.
    """
    from juice.analysis.paraphrase import benchmark_setup
    from juice.eval.report import difference_markdown, interval_markdown, table1_columns
    from juice.eval.tables import interval_table
    from juice.io import settings_key

    start = time.perf_counter()
    setup = benchmark_setup(lm, options, progress, test_items=test_items)
    validation = {d: list(s.validation) for d, s in setup.splits.items()}
    key = settings_key({"heads": setup.key_heads, "grid": setup.grid,
                        "validation": {d: [ex.to_json() for ex in v] for d, v in validation.items()}})
    post = setup.state.load("analysis_tuning_postnorm", key)
    if post is None:
        post = tune_post_norm(lm, validation, setup.selection, setup.grid, options.max_rows, progress)
        setup.state.save("analysis_tuning_postnorm", key, {d: {m: list(v) for m, v in c.items()} for d, c in post.items()})
    head_domain = next(iter(setup.splits)) if "world_capital" not in setup.splits else "world_capital"
    g = lm.heads.geometry
    betas: dict[str, dict[str, tuple[float, float]]] = {}
    results: list[ItemResult] = []
    known: set[tuple[str, str]] = set()
    for domain, sp in setup.splits.items():
        chosen = post.get(domain, post[head_domain])
        betas[domain] = {"JuNE": setup.betas[domain]["june"], "JuICE": setup.betas[domain]["juice"],
                         "JuNE (post-norm)": tuple(chosen["june"]), "JuICE (post-norm)": tuple(chosen["juice"])}
        steer = {name: Steering(VARIANTS[name], steering_coefficients(g, setup.selection, *betas[domain][name],
                                                                      VARIANTS[name]))
                 for name in VARIANTS}
        key_eval = settings_key({"heads": setup.key_heads, "betas": betas[domain], "test": [ex.to_json() for ex in sp.test],
                                 "items": [ex.uid for ex in sp.test]})
        rows = setup.state.load(f"norm_{domain}", key_eval)
        if rows is None:
            test = list(sp.test)
            advance = progress(f"{setup.titles[domain]}: both variants", len(test) * 3 * len(METHOD_ORDER))
            pre = evaluate(lm, test, {"Original": Steering(), "JuNE": steer["JuNE"], "JuICE": steer["JuICE"]},
                           max_rows=options.max_rows, on_progress=advance)
            postr = evaluate_post_norm(lm, test, {n: steer[n] for n in ("JuNE (post-norm)", "JuICE (post-norm)")},
                                       max_rows=options.max_rows, on_progress=advance)
            rows = results_to_json([*pre, *postr])
            setup.state.save(f"norm_{domain}", key_eval, rows)
        res = results_from_json(rows)
        results += res
        known |= {r.item_key for r in res if r.method == "Original" and r.conflict_type == "clean" and r.correct}
    boot = dict(resamples=options.bootstrap_resamples, seed=options.seed)

    def table(keep=None):
        main = interval_table(results, METHOD_ORDER, keep=keep, focus="JuICE (post-norm)", **boot)
        june = interval_table(results, METHOD_ORDER, keep=keep, focus="JuNE (post-norm)", **boot)
        main.differences = {k: v for k, v in main.differences.items()
                            if k in ("JuICE (post-norm) - JuICE", "JuICE (post-norm) - Original", "JuICE - Original",
                                     "JuNE - Original")}
        main.differences["JuNE (post-norm) - JuNE"] = june.differences["JuNE (post-norm) - JuNE"]
        main.differences["JuNE (post-norm) - Original"] = june.differences["JuNE (post-norm) - Original"]
        return main

    t_all, t_known = table(), table(lambda r: r.item_key in known)
    prompts = [ex.prompts[t] for ex in setup.splits[head_domain].head_set for t in CONFLICT_TYPES]
    heads = [*setup.selection.positive, *setup.selection.negative]
    att = {f"{b:g}": attenuation(lm, prompts, heads, b) for b in ATTENUATION_BETAS}
    has_norm = post_norm_modules(lm.heads) is not None
    mode = {"quick": "quick: World Capital only, |D| = 1, 2 x 2 beta grid, 3 items", "full": "every test item",
            "default": f"reduced: {test_items} test items per domain"}[options.mode]
    result = NormResult(
        title=f"JuICE and JuNE before vs after the attention output norm ({mode})", files=[], wall_s=0.0,
        post_norm=has_norm, table=t_all, table_known=t_known, domains=list(setup.splits), titles=setup.titles,
        selection=setup.selection, betas=betas, attenuation=att, mode=options.mode, notes=setup.notes)
    cols, headers = table1_columns(result.domains, result.titles)
    avg = [(c, h) for c, h in zip(cols, headers) if c[0] == "Average"]
    arch = (f"{lm.model.config.model_type} normalizes each attention output (`{POST_NORMS[lm.model.config.model_type]}`)"
            if has_norm else f"{lm.model.config.model_type} has no attention output norm: the variants coincide")
    att_lines = [f"- beta = {b}: " + ", ".join(f"{h} {100 * v:.0f}%" for h, v in per.items()) for b, per in att.items()]
    md = [f"# {result.title}\n",
          f"Model {lm.name}; {arch}. Pre-norm = the paper's JuICE / JuNE (the output projection's input); "
          "post-norm = beta times the head's contribution to the residual stream, `g(y) * W_h H_h` with the norm's "
          "gain g from the unmodified attention output, added after the norm (JuICE: from the clean run; JuNE: "
          "live). Betas tuned per domain, separately for each variant, on the same validation split and grid.\n",
          "## Unfiltered test split\n", interval_markdown(t_all, list(METHOD_ORDER), cols, headers),
          "\nAccuracy (%), exact match, ± the half-width of the 95% bootstrap interval; 1 = clean, 2 = substitution, "
          "3 = coherent.\n",
          "## Test items the model knows\n", interval_markdown(t_known, list(METHOD_ORDER), cols, headers),
          "\n## Paired differences, unfiltered (percentage points; * excludes 0)\n",
          difference_markdown(t_all, [c for c, _ in avg], [h for _, h in avg]),
          "\n## Paired differences, known items\n",
          difference_markdown(t_known, [c for c, _ in avg], [h for _, h in avg]),
          "\n## How much of a pre-norm intervention survives the norm\n",
          "Mean over the positions of D's prompts of |post_norm(y + beta W_h H_h) - post_norm(y)| / |beta g(y) W_h H_h| "
          "(100% = passed through unchanged):\n", *att_lines, "",
          "## Betas (beta+, beta-)\n",
          "| Domain | " + " | ".join(VARIANTS) + " |", "|" + "---|" * (len(VARIANTS) + 1),
          *[f"| {setup.titles[d]} | " + " | ".join(f"({b[n][0]:g}, {b[n][1]:g})" for n in VARIANTS) + " |"
            for d, b in betas.items()], ""]
    md += [f"Note: {n}\n" for n in setup.notes]
    result.wall_s = time.perf_counter() - start
    md.append(f"Wall time {result.wall_s:.0f} s (model loading excluded).")
    result.files = write_outputs(options.out, "norm", {**result.to_json(), "model": lm.fingerprint(),
                                                       "options": options.to_json(), "items": results_to_json(results)},
                                 "\n".join(md), _norm_figure(result, lm.name))
    return result


def _norm_figure(result: NormResult, model_name: str):
    """Average accuracy per method and conflict type (both views) with 95% intervals."""
    from matplotlib.figure import Figure

    from juice.plots import interval_bars

    fig = Figure(figsize=(12, 4.4))
    axes = fig.subplots(1, 2)
    for ax, table, view in ((axes[0], result.table, "unfiltered test split"),
                            (axes[1], result.table_known, "test items the model knows")):
        interval_bars(ax, {m: table.cells[m]["Average"] for m in METHOD_ORDER}, CONFLICT_TYPES,
                      hatch=lambda m: "//" if "post" in m else None)   # post-norm variants hatched
        clean = table.cells.get("Original", {}).get("Average", {}).get("clean")
        n = clean.n if clean is not None else 0
        ax.set_ylim(0, 100)
        ax.set_ylabel("accuracy (%), mean over domains")
        ax.set_title(f"{view} (n = {n} per type)", fontsize=9)
        ax.legend(fontsize=7)
        ax.grid(axis="y", alpha=0.3)
    fig.suptitle(f"{model_name}: {result.title}\nerror bars: 95% bootstrap intervals", fontsize=9)
    fig.tight_layout()
    return fig


__all__ = ["NormResult", "POST_NORMS", "attenuation", "evaluate_post_norm", "generate_post_norm",
           "greedy_generate_post_norm_naive", "head_contributions", "norm_gain", "post_norm_modules",
           "post_norm_rows", "run_norm", "tune_post_norm"]
