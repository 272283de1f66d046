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

The site is part of a steering (`Steering(..., site="post_norm")`, :mod:`juice.post_norm`), so
the study decodes, evaluates and tunes both variants with the shared engine, runner and tuning
(:func:`juice.eval.runner.evaluate`, :func:`juice.eval.tuning.tune_per_domain` with
`site="post_norm"`).

`juice analyze norm` reports both variants side by side on the parametric benchmark (the six
domains, Table 1's protocol: filtered development pools, exact Stage 1 on World Capital's D,
(beta+, beta-) tuned per domain on its own validation split, *separately for each variant* over
the same grid), with paired bootstrap intervals of post-norm minus pre-norm, and a mechanistic
readout: how much of a pre-norm intervention survives the norm (`attenuation`).
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import torch
from torch import Tensor

from juice.analysis.common import AnalysisOptions, write_outputs
from juice.progress import Progress, no_progress
from juice.data.records import CONFLICT_TYPES
from juice.eval.runner import ItemResult, evaluate, keyed, results_from_json, results_to_json, titled
from juice.eval.tuning import tune_per_domain
from juice.interventions import projection_input_hooks
from juice.methods import STEERINGS, TUNED_STEERINGS, UNSTEERED, MethodInputs, Row, build, row_title
from juice.models import LoadedModel
from juice.post_norm import POST_NORMS, head_contributions, norm_gain, post_norm_modules
from juice.steering import Steering
from juice.tokens import encode


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

VARIANTS = {Row(m, variant).key: (m, site) for m in STEERINGS
            for variant, site in (("", "o_proj_input"), ("post-norm", "post_norm"))}
"""Table row key -> (method, intervention site :data:`juice.steering.SITES`): each head steering
(:data:`juice.methods.STEERINGS`: JuNE, JuICE) at the paper's site and after the output norm
("juice-post-norm", shown as "JuICE (post-norm)")."""
METHOD_ORDER = (UNSTEERED, *VARIANTS)
ATTENUATION_BETAS = (1.0, 2.0, 5.0)


@dataclass
class NormResult:
    """What :func:`run_norm` returns; `norm.json` holds the same plus every item.

    Attributes:
        post_norm: the model has an attention output norm (else both variants coincide).
        table: Original and both variants of JuNE and JuICE on every domain's test split.
        table_known: the same on the test items the model knows.
        betas: domain -> row key (e.g. "juice-post-norm") -> (beta+, beta-).
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
        """`norm.json`'s fields, rows by title (:func:`juice.methods.row_title`)."""
        table, known = self.table.titled(), self.table_known.titled()
        return {"title": self.title, "wall_s": self.wall_s, "mode": self.mode, "post_norm": self.post_norm,
                "table": table.to_json(), "table_known": known.to_json(),
                "accuracy": table.means(), "domains": self.domains, "titles": self.titles,
                "heads": {"positive": [str(h) for h in self.selection.positive],
                          "negative": [str(h) for h in self.selection.negative]},
                "betas": {d: _titled(b) for d, b in self.betas.items()}, "attenuation": self.attenuation,
                "notes": self.notes}


def _post_norm_betas(lm: LoadedModel, setup, options: AnalysisOptions,
                     progress: Progress) -> dict[str, dict[str, tuple[float, float]]]:
    """Post-norm JuICE's and JuNE's betas tuned per domain on its validation split (the same grid
    as the pre-norm ones): domain -> method -> (beta+, beta-); cached in the run's state."""
    from juice.io import settings_key

    validation = {d: list(s.validation) for d, s in setup.splits.items()}
    key = settings_key({"heads": setup.key_heads, "grid": setup.grid,
                        "validation": {d: [ex.to_json() for ex in v] for d, v in validation.items()}})
    post = setup.state.load("analysis_tuning_postnorm", key)
    if post is None:
        n_items = sum(map(len, validation.values()))
        advance = progress("tune post-norm JuICE and JuNE betas per domain",
                           n_items * len(CONFLICT_TYPES) * 2 * len(setup.grid[0]) * len(setup.grid[1]))
        choices = tune_per_domain(lm, validation, setup.selection, beta_plus_grid=setup.grid[0],
                                  beta_minus_grid=setup.grid[1], max_rows=options.max_rows, on_progress=advance,
                                  site="post_norm")
        post = {d: {m: (c.betas[m].beta_plus, c.betas[m].beta_minus) for m in TUNED_STEERINGS}
                for d, c in choices.items()}
        setup.state.save("analysis_tuning_postnorm", key, {d: {m: list(v) for m, v in c.items()} for d, c in post.items()})
    return post


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
    from juice.eval.tables import interval_table
    from juice.io import settings_key

    start = time.perf_counter()
    setup = benchmark_setup(lm, options, progress, test_items=test_items)
    post = _post_norm_betas(lm, setup, options, progress)
    head_domain = next(iter(setup.splits)) if "world_capital" not in setup.splits else "world_capital"
    g = lm.geometry
    betas: dict[str, dict[str, tuple[float, float]]] = {}
    results: list[ItemResult] = []
    known: set[tuple[str, str]] = set()
    for domain, sp in setup.splits.items():
        chosen = post.get(domain, post[head_domain])
        betas[domain] = {name: setup.betas[domain][m] if site == "o_proj_input" else tuple(chosen[m])
                         for name, (m, site) in VARIANTS.items()}
        steer = {name: replace(build(method, MethodInputs(g, setup.selection, beta_plus=betas[domain][name][0],
                                                          beta_minus=betas[domain][name][1])).method.steering, site=site)
                 for name, (method, site) in VARIANTS.items()}
        key_eval = settings_key({"heads": setup.key_heads, "betas": _titled(betas[domain]),
                                 "test": [ex.to_json() for ex in sp.test],
                                 "items": [ex.uid for ex in sp.test]})
        rows = setup.state.load(f"norm_{domain}", key_eval)
        if rows is None:
            test = list(sp.test)
            advance = progress(f"{setup.titles[domain]}: both variants", len(test) * 3 * len(METHOD_ORDER))
            by_site = lambda where: {n: steer[n] for n, (_, site) in VARIANTS.items() if site == where}   # noqa: E731
            pre = evaluate(lm, test, {UNSTEERED: Steering(), **by_site("o_proj_input")}, max_rows=options.max_rows,
                           on_progress=advance)
            postr = evaluate(lm, test, by_site("post_norm"), max_rows=options.max_rows, on_progress=advance)
            rows = results_to_json(titled([*pre, *postr]))
            setup.state.save(f"norm_{domain}", key_eval, rows)
        res = keyed(results_from_json(rows))
        results += res
        known |= {r.item_key for r in res if r.method == UNSTEERED and r.conflict_type == "clean" and r.correct}
    boot = dict(resamples=options.bootstrap_resamples, seed=options.seed)

    juice, june = TUNED_STEERINGS   # JuICE, JuNE
    post_row = {m: Row(m, "post-norm").key for m in TUNED_STEERINGS}

    def table(keep=None):
        main = interval_table(results, METHOD_ORDER, keep=keep, focus=post_row[juice], **boot)
        other = interval_table(results, METHOD_ORDER, keep=keep, focus=post_row[june], **boot)
        main.differences = {k: v for k, v in main.differences.items()
                            if k in (f"{post_row[juice]} - {juice}", f"{post_row[juice]} - {UNSTEERED}", f"{juice} - {UNSTEERED}",
                                     f"{june} - {UNSTEERED}")}
        for k in (f"{post_row[june]} - {june}", f"{post_row[june]} - {UNSTEERED}"):
            main.differences[k] = other.differences[k]
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
    md = _norm_markdown(result, lm, setup.notes)
    result.wall_s = time.perf_counter() - start
    md.append(f"Wall time {result.wall_s:.0f} s (model loading excluded).")
    result.files = write_outputs(options.out, "norm", {**result.to_json(), "model": lm.fingerprint(),
                                                       "options": options.to_json(), "items": results_to_json(titled(results))},
                                 "\n".join(md), _norm_figure(result, lm.name))
    return result


def _norm_markdown(result: NormResult, lm: LoadedModel, notes: list[str]) -> list[str]:
    """`norm.md`'s lines but the wall time: the tables, paired differences, attenuation and betas."""
    from juice.eval.report import difference_markdown, interval_markdown, table1_columns

    t_all, t_known, att = result.table.titled(), result.table_known.titled(), result.attenuation
    betas = {d: _titled(b) for d, b in result.betas.items()}
    order, variants = [row_title(m) for m in METHOD_ORDER], [row_title(m) for m in VARIANTS]
    cols, headers = table1_columns(result.domains, result.titles)
    avg = [(c, h) for c, h in zip(cols, headers) if c[0] == "Average"]
    arch = (f"{lm.config.model_type} normalizes each attention output (`{POST_NORMS[lm.config.model_type]}`)"
            if result.post_norm else f"{lm.config.model_type} has no attention output norm: the variants coincide")
    att_lines = [f"- beta = {b}: " + ", ".join(f"{h} {100 * v:.0f}%" for h, v in per.items()) for b, per in att.items()]
    md = [f"# {result.title}\n",
          f"Model {lm.name}; {arch}. Pre-norm = the paper's JuICE / JuNE (the output projection's input); "
          "post-norm = beta times the head's contribution to the residual stream, `g(y) * W_h H_h` with the norm's "
          "gain g from the unmodified attention output, added after the norm (JuICE: from the clean run; JuNE: "
          "live). Betas tuned per domain, separately for each variant, on the same validation split and grid.\n",
          "## Unfiltered test split\n", interval_markdown(t_all, order, cols, headers),
          "\nAccuracy (%), exact match, ± the half-width of the 95% bootstrap interval; 1 = clean, 2 = substitution, "
          "3 = coherent.\n",
          "## Test items the model knows\n", interval_markdown(t_known, order, cols, headers),
          "\n## Paired differences, unfiltered (percentage points; * excludes 0)\n",
          difference_markdown(t_all, [c for c, _ in avg], [h for _, h in avg]),
          "\n## Paired differences, known items\n",
          difference_markdown(t_known, [c for c, _ in avg], [h for _, h in avg]),
          "\n## How much of a pre-norm intervention survives the norm\n",
          "Mean over the positions of D's prompts of |post_norm(y + beta W_h H_h) - post_norm(y)| / |beta g(y) W_h H_h| "
          "(100% = passed through unchanged):\n", *att_lines, "",
          "## Betas (beta+, beta-)\n",
          "| Domain | " + " | ".join(variants) + " |", "|" + "---|" * (len(variants) + 1),
          *[f"| {result.titles[d]} | " + " | ".join(f"({b[n][0]:g}, {b[n][1]:g})" for n in variants) + " |"
            for d, b in betas.items()], ""]
    return md + [f"Note: {n}\n" for n in notes]


def _norm_figure(result: NormResult, model_name: str):
    """Average accuracy per method and conflict type (both views) with 95% intervals; the
    post-norm variants hatched."""
    from juice.plots import average_views_figure

    return average_views_figure((("unfiltered test split", result.table.titled()),
                                 ("test items the model knows", result.table_known.titled())),
                                [row_title(m) for m in METHOD_ORDER], CONFLICT_TYPES, f"{model_name}: {result.title}", figsize=(12, 4.4),
                                legend_size=7, hatch=lambda m: "//" if "post" in m else None)


def _titled(betas: dict[str, Any]) -> dict[str, Any]:
    """A domain's betas by row title, as `norm.json` and the stage key hold them."""
    return {row_title(n): b for n, b in betas.items()}


__all__ = ["METHOD_ORDER", "NormResult", "VARIANTS", "attenuation", "run_norm"]
