"""The paraphrase table (paper App. D, "robustness against paraphrased prompts"): Original, JuNE
and JuICE on prompts drawn from paraphrased templates, per domain and conflict type.

Paper App. D: "we curate multiple prompt templates for each conflict type. During evaluation, a
prompt template is randomly sampled to generate the desired prompt", with "the exact same
intervention procedure". Here:

- templates: :mod:`juice.data.paraphrases` (five clean stems, five substitution forms and five
  coherent passages per domain, written for this project), one drawn per item and conflict type
  with the seed (:func:`juice.data.paraphrases.template_choice`);
- heads and betas: Table 1's, from Table 1's protocol (:mod:`juice.experiments.table1`) on the *default*
  templates: filtered development pools, exact Stage 1 on World Capital's D (|D| = 4, K = 5),
  (beta+, beta-) tuned per domain on its own validation split over {0..5} x {0, -1, -2, -3}. The
  stages are cached under `<out>/state/` (Stage 1's per-prompt scores in `units.json`, shared
  with `juice reproduce` and `juice analyze robustness` in the same folder);
- items: each domain's unfiltered test split (Table 1's view), the first `test_items` of it, and
  the same table restricted to the items the model knows (Original correct on the *default*
  clean prompt);
- statistics: every cell's n and 95% bootstrap interval, paired differences over the same items
  (:func:`juice.eval.tables.interval_table`).

Sizes: default 10 test items per domain and 4 validation items (minutes on 2 CPU cores);
`--full` every test item; `--quick` World Capital alone, |D| = 1, a 2 x 2 beta grid, 3 items.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any


from juice.analysis.common import (
    AnalysisOptions,
    Progress,
    no_progress,
    write_outputs,
)
from juice.data.paraconflict import DOMAINS
from juice.data.paraphrases import paraphrase_example
from juice.data.records import CONFLICT_TYPES
from juice.data.splits import Splits
from juice.eval.runner import ItemResult, evaluate, keyed, results_from_json, results_to_json, titled
from juice.eval.tables import IntervalTable, interval_table
from juice.eval.tuning import BETA_MINUS_GRID, BETA_PLUS_GRID, tune_per_domain
from juice.pipeline.domains import prepare_domains
from juice.pipeline.run import ReproduceConfig, StageRun, run_key_base
from juice.pipeline.stages import heads_stage
from juice.interventions import HeadSelection
from juice.io import StageFiles, settings_key
from juice.methods import REGISTRY, STEERINGS, TUNED_STEERINGS, UNSTEERED, MethodInputs, build, row_title
from juice.models import LoadedModel
from juice.steering import Steering

QUICK_BETAS = ((0.0, 2.0), (0.0, -1.0))
"""`--quick`'s tuning grid (beta+ values, beta- values)."""


@dataclass
class BenchmarkSetup:
    """Table 1's stages on one model: splits, heads and per-domain betas (the pre-norm variant).

    Attributes:
        config: the :class:`juice.pipeline.run.ReproduceConfig` behind the stages.
        splits: domain -> D (World Capital), validation, test.
        titles: domain -> its title.
        selection: the heads (exact Stage 1 on World Capital's D).
        betas: domain -> method ("juice", "june") -> (beta+, beta-), chosen on that domain's own
            validation split (a domain without known validation items takes World Capital's).
        grid: (beta+ values, beta- values) tuned over.
        state: the stage files under `<out>/state/`.
        key_heads: the Stage 1 stage key (other stages add to it).
        notes: provenance notes (e.g. betas borrowed from World Capital).
    """

    config: ReproduceConfig
    splits: dict[str, Splits]
    titles: dict[str, str]
    selection: HeadSelection
    betas: dict[str, dict[str, tuple[float, float]]]
    grid: tuple[tuple[float, ...], tuple[float, ...]]
    state: StageFiles
    key_heads: str
    notes: list[str] = field(default_factory=list)


def benchmark_setup(lm: LoadedModel, options: AnalysisOptions, progress: Progress = no_progress, *,
                    test_items: int | None = 10) -> BenchmarkSetup:
    """Table 1's data, Stage 1 and per-domain tuning (:mod:`juice.pipeline`'s stages, cached in
    `<out>/state/`), sized by the options' mode (module docstring).

    Raises:
        ValueError: too few known World Capital items for D and validation.
    """
    quick = options.quick
    cfg = ReproduceConfig(model=options.model, out_dir=options.out, seed=options.seed,
                          limit=3 if quick else None if options.full else test_items,
                          validation_size=2 if quick else 4, head_set_size=1 if quick else 4,
                          baselines=False, max_rows=options.max_rows, device=options.device, filter=options.filter,
                          domains=("world_capital",) if quick else tuple(DOMAINS))
    state = StageFiles(options.out / "state")
    base = run_key_base(lm, cfg)
    run = StageRun(lm, cfg, state, progress)
    notes = run.notes
    splits, titles, head_domain, _ = prepare_domains(run, base)
    dev = splits[head_domain]
    key_heads = settings_key({**base, "head_set": [ex.to_json() for ex in dev.head_set], **{f: getattr(cfg, f) for f in (
        "k", "scoring", "shortlist", "alphas_positive", "alphas_negative")}})
    selection, _ = heads_stage(run, "heads", key_heads, dev.head_set, "parametric")
    grid = QUICK_BETAS if quick else (BETA_PLUS_GRID, BETA_MINUS_GRID)
    validation = {d: list(s.validation) for d, s in splits.items()}
    key = settings_key({"heads": key_heads, "grid": grid, "validation": {d: [ex.to_json() for ex in v]
                                                                          for d, v in validation.items()}})
    saved = state.load("analysis_tuning_prenorm", key)
    if saved is None:
        n = sum(map(len, validation.values())) * len(CONFLICT_TYPES) * 2 * len(grid[0]) * len(grid[1])
        choices = tune_per_domain(lm, validation, selection, beta_plus_grid=grid[0], beta_minus_grid=grid[1],
                                  max_rows=options.max_rows, on_progress=progress("tune JuICE and JuNE betas "
                                                                                  "per domain", n))
        saved = {d: {m: [g.beta_plus, g.beta_minus] for m, g in c.betas.items()} for d, c in choices.items()}
        state.save("analysis_tuning_prenorm", key, saved)
    betas = {}
    for d in splits:
        if d not in saved:
            notes.append(f"{titles[d]}: no validation item the model knows; betas from {titles[head_domain]}")
        betas[d] = {m: tuple(v) for m, v in saved.get(d, saved[head_domain]).items()}
    return BenchmarkSetup(cfg, splits, titles, selection, betas, grid, state, key_heads, notes)


def method_steerings(lm: LoadedModel, setup: BenchmarkSetup, domain: str) -> dict[str, Steering]:
    """Original, JuNE and JuICE with `domain`'s betas, by row key."""
    g = lm.geometry
    out = {UNSTEERED: Steering()}
    for m in STEERINGS:
        bp, bm = setup.betas[domain][m]
        out[m] = build(m, MethodInputs(g, setup.selection, beta_plus=bp, beta_minus=bm)).method.steering
    return out


@dataclass
class ParaphraseResult:
    """What :func:`run_paraphrase` returns; `paraphrase.json` holds the same plus every item.

    Attributes:
        table: Original, JuNE, JuICE on the paraphrased prompts of every domain's test split.
        table_known: the same on the test items the model knows.
        templates: domain -> conflict type -> how many items drew each template (counts).
        betas: domain -> method -> (beta+, beta-).
    """

    title: str
    files: list[Path]
    wall_s: float
    table: IntervalTable
    table_known: IntervalTable
    domains: list[str]
    titles: dict[str, str]
    selection: HeadSelection
    betas: dict[str, dict[str, tuple[float, float]]]
    templates: dict[str, dict[str, list[int]]]
    mode: str
    notes: list[str] = field(default_factory=list)

    def to_json(self) -> dict[str, Any]:
        """`paraphrase.json`'s fields, rows by title (:func:`juice.methods.row_title`)."""
        table = self.table.titled()
        return {"title": self.title, "wall_s": self.wall_s, "mode": self.mode, "table": table.to_json(),
                "table_known": self.table_known.titled().to_json(), "accuracy": table.means(), "domains": self.domains,
                "titles": self.titles, "heads": {"positive": [str(h) for h in self.selection.positive],
                                                 "negative": [str(h) for h in self.selection.negative]},
                "betas": self.betas, "templates": self.templates, "notes": self.notes}


METHODS = (UNSTEERED, *STEERINGS)
"""The table's rows, by key: Original, JuNE, JuICE."""


def run_paraphrase(lm: LoadedModel, options: AnalysisOptions, progress: Progress = no_progress, *,
                   test_items: int | None = 10) -> ParaphraseResult:
    """The paraphrase table (module docstring); writes `paraphrase.json`, `.md`, `.png`.

    Args:
        test_items: test items per domain in the default mode (`--full`: all; `--quick`: 3).

    Raises:
        ValueError: too few known World Capital items for D and validation.
    """
    from juice.eval.report import difference_markdown, interval_markdown, table1_columns

    start = time.perf_counter()
    setup = benchmark_setup(lm, options, progress, test_items=test_items)
    results: list[ItemResult] = []
    known: set[tuple[str, str]] = set()
    templates: dict[str, dict[str, list[int]]] = {}
    for domain, sp in setup.splits.items():
        drawn = [paraphrase_example(ex, options.seed) for ex in sp.test]
        items = [ex for ex, _ in drawn]
        templates[domain] = {t: [sum(c[t] == i for _, c in drawn) for i in range(5)] for t in CONFLICT_TYPES}
        methods = method_steerings(lm, setup, domain)
        key = settings_key({"heads": setup.key_heads, "betas": setup.betas[domain], "items": [ex.to_json() for ex in items],
                            "default": [ex.to_json() for ex in sp.test], "ids": [ex.uid for ex in sp.test]})
        rows = setup.state.load(f"paraphrase_{domain}", key)
        if rows is None:
            advance = progress(f"{setup.titles[domain]}: paraphrased prompts", len(items) * 3 * len(methods) + len(items))
            res = evaluate(lm, items, methods, max_rows=options.max_rows, on_progress=advance)
            # which items the model knows: Original on the default clean prompt (Table 1's known view)
            clean = evaluate(lm, list(sp.test), {UNSTEERED: Steering()}, ("clean",), max_rows=options.max_rows,
                             on_progress=advance)
            rows = {"results": results_to_json(titled(res)), "known": [r.item for r in clean if r.correct]}
            setup.state.save(f"paraphrase_{domain}", key, rows)
        results += keyed(results_from_json(rows["results"]))
        known |= {(domain, s) for s in rows["known"]}
    boot = dict(resamples=options.bootstrap_resamples, seed=options.seed)
    table = interval_table(results, METHODS, **boot)
    table_known = interval_table(results, METHODS, keep=lambda r: r.item_key in known, **boot)
    mode = {"quick": "quick: World Capital only, |D| = 1, 2 x 2 beta grid, 3 items", "full": "every test item",
            "default": f"reduced: {test_items} test items per domain"}[options.mode]
    result = ParaphraseResult(
        title=f"Paraphrase table (App. D): Original, JuNE and JuICE on paraphrased prompts ({mode})",
        files=[], wall_s=0.0, table=table, table_known=table_known, domains=list(setup.splits),
        titles=setup.titles, selection=setup.selection, betas=setup.betas, templates=templates, mode=options.mode,
        notes=setup.notes)
    cols, headers = table1_columns(result.domains, result.titles)
    avg = [(c, h) for c, h in zip(cols, headers) if c[0] == "Average"]
    betas = "; ".join(f"{setup.titles[d]}: " + ", ".join(f"{REGISTRY[m].title} {b[m]}" for m in TUNED_STEERINGS)
                      for d, b in setup.betas.items())
    shown = [row_title(m) for m in METHODS]
    md = [f"# {result.title}\n",
          f"Model {lm.name}. One paraphrased template drawn per item and conflict type (seed {options.seed}; "
          f"`juice.data.paraphrases`, five per type and domain). Heads (exact Stage 1 on World Capital's D, "
          f"default templates): + {', '.join(map(str, setup.selection.positive))}; - "
          f"{', '.join(map(str, setup.selection.negative))}. (beta+, beta-) per domain, tuned on its validation "
          f"split with the default templates: {betas}.\n",
          "## Unfiltered test split\n", interval_markdown(table.titled(), shown, cols, headers),
          "\nAccuracy (%), exact match, ± the half-width of the 95% bootstrap interval; 1 = clean, 2 = substitution, "
          "3 = coherent.\n",
          "## Test items the model knows (Original correct on the default clean prompt)\n",
          interval_markdown(table_known.titled(), shown, cols, headers),
          "\n## Paired differences, unfiltered (percentage points; * excludes 0)\n",
          difference_markdown(table.titled(), [c for c, _ in avg], [h for _, h in avg]),
          "\n## Paired differences, known items\n",
          difference_markdown(table_known.titled(), [c for c, _ in avg], [h for _, h in avg])]
    md += [f"Note: {n}\n" for n in setup.notes]
    result.wall_s = time.perf_counter() - start
    md.append(f"Wall time {result.wall_s:.0f} s (model loading excluded).")
    result.files = write_outputs(options.out, "paraphrase",
                                 {**result.to_json(), "model": lm.fingerprint(), "options": options.to_json(),
                                  "items": results_to_json(titled(results))},
                                 "\n".join(md), _figure(result, lm.name))
    return result


def _figure(result: ParaphraseResult, model_name: str):
    """Average accuracy per method and conflict type, both views, with 95% intervals."""
    from juice.plots import average_views_figure

    return average_views_figure((("unfiltered test split", result.table.titled()),
                                 ("test items the model knows", result.table_known.titled())),
                                [row_title(m) for m in METHODS], CONFLICT_TYPES, f"{model_name}: {result.title}")


__all__ = ["BenchmarkSetup", "ParaphraseResult", "benchmark_setup", "method_steerings", "run_paraphrase"]
