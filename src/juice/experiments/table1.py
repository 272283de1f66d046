"""The main job: Table 1 (the paper's Table 3) (parametric direction) on one model, by the paper's protocol
(`../shared/docs/protocol.md`), end to end.

Stages (each written atomically to `<out>/state/` under a key derived from everything it
depends on, and reused when re-run, so an interrupted run resumes where it stopped):

1. data: every domain (the six built-in ones, or the paper's folder layout via `data`) gives a
   development pool and a test split (reported unfiltered, paper Table 1). The pool is
   *filtered* for the loaded model: its clean prompts are decoded greedily, in the pool's seeded
   order, until enough items are answered correctly; from those known items come, in order, D
   (|D| = 4, World Capital only), the domain's own validation split and (World Capital) PH3-l's
   development set. With the authors' files D comes from the head-finding file and each
   domain's validation split from its own `filtered_validation.json`
   (:mod:`juice.pipeline.domains`). Every item's answer is the alias the model prefers
   (:mod:`juice.aliases`); results.json lists each split's item ids (`splits.<domain>.<split>_ids`).
2. heads: Stage 1 on World Capital's D only (the transfer setting), exact by default.
3. PH3 (Jin et al. 2024): path-patching head scores on PH3-l's development set and on D (PH3-s).
4. tuning, per domain on that domain's own validation split: JuICE's and JuNE's (beta+, beta-)
   and PH3's k (:func:`juice.eval.tuning.tune_per_domain`). A domain with no known validation item
   takes World Capital's choice (noted in the results).
5. evaluation: Original, Prompt, PH3-l, PH3-s, JuNE and JuICE on every domain's test split x 3
   conflict types; tables with n and 95% bootstrap intervals, paired differences, on the
   unfiltered test split and on its items the model knows (Original correct on the clean prompt).

Deviations from the paper, all stated in the README: one generation length (10 new tokens) for
every method (the authors' code gives JuICE 15); default sizes (test items, validation items,
PH3-l development items) are small to fit a 2-core CPU; `--full` uses every item.

The stages are :mod:`juice.pipeline` (shared with the contextual direction, Table 2:
:mod:`juice.experiments.table2`); this module sequences them and writes the reports.
"""

from __future__ import annotations

import time
from dataclasses import asdict
from pathlib import Path

from juice.data.records import CONFLICT_TYPES
from juice.engine.backend import Engine
from juice.eval.degeneration import correct_not_degenerate
from juice.eval.report import degeneration_markdown, difference_markdown, interval_markdown, table1_columns
from juice.eval.runner import evaluate, results_to_json, summary, titled
from juice.eval.tables import interval_table
from juice.io import write_json_atomic
from juice.methods import REGISTRY, UNSTEERED
from juice.models import LoadedModel
from juice.pipeline.domains import HEAD_DOMAIN, domain_sources, prepare_domains
from juice.pipeline.run import (
    ReproduceConfig,
    ReproduceResult,
    run_key_base,
    scoring_title,
    selection_to_json,
    start_run,
    tuning_label,
)
from juice.pipeline.stages import (domain_methods, evaluate_test_splits, ph3_scoring, protocol_stages, stage1_key,
                                   titled_result)
from juice.progress import Progress, no_progress


def reproduce(cfg: ReproduceConfig, progress: Progress = no_progress, lm: LoadedModel | None = None,
              engine: Engine | None = None) -> ReproduceResult:
    """Run the whole pipeline (module docstring) and write `results.json`, `table.md`,
    `table.png`, `table_known.png` and `heads.json` to `cfg.out_dir`. `engine` runs the stages
    (:mod:`juice.engine.backend`; None: juice's own; `cfg.engine` must name it: `juice reproduce
    --engine vllm` passes :class:`juice.vllm.engine.VllmEngine`).

    Raises:
        ValueError: too few known items for D and validation in the head domain; bad settings.
        FileNotFoundError: `cfg.data` is not a ParaConflict folder (raised before the model loads,
            as is a ValueError for a malformed data file).
    """
    out = Path(cfg.out_dir)
    domain_sources(cfg)   # bad data fails here, in one line, before the model loads
    run, timings = start_run(cfg, lm, progress, engine)
    lm, notes = run.lm, run.notes
    # each stage's key adds the content of the items it reads, so sizes and folders need not be in it:
    # a larger --limit re-runs only the filter and the evaluation, not Stage 1, PH3 or the tuning
    base = run_key_base(lm, cfg)

    t = time.perf_counter()
    splits, titles, head_domain, counts = prepare_domains(run, base)
    dev = splits[head_domain]
    if head_domain != HEAD_DOMAIN:
        notes.append(f"no {titles.get(HEAD_DOMAIN, HEAD_DOMAIN)} domain: D and PH3-l's items come from "
                     f"{titles.get(head_domain, head_domain)}")
    timings["data_and_filter"] = time.perf_counter() - t

    key_heads = stage1_key(base, cfg, head_set=[ex.to_json() for ex in dev.head_set])
    selection, ph3, choices, key_tuning = protocol_stages(run, base, key_heads, splits, head_domain, "parametric",
                                                          out / "heads.json", timings)
    all_results, methods_order = evaluate_test_splits(
        run, splits, lambda d: domain_methods(lm, selection, choices[d], cfg.baselines, list(ph3), "table1"),
        choices, key_tuning, "eval_{}", titles, len(CONFLICT_TYPES), evaluate, timings,
        key_extra=lambda sp: {"items": [ex.uid for ex in sp.test]})

    known = {r.item_key for r in all_results
             if r.method == UNSTEERED and r.conflict_type == "clean" and r.correct}
    boot = dict(resamples=cfg.bootstrap_resamples, seed=cfg.seed)
    result = ReproduceResult(
        config=cfg, model=lm.fingerprint(), selection=selection, choices=choices,
        table=interval_table(all_results, methods_order, **boot),
        table_known=interval_table(all_results, methods_order, keep=lambda r: r.item_key in known, **boot),
        degeneration=interval_table(all_results, methods_order, value=lambda r: r.degenerate, **boot),
        correct_not_degenerate=interval_table(all_results, methods_order, value=correct_not_degenerate, **boot),
        summary=summary(all_results), timings=timings,
        splits={d: {"head_set": len(s.head_set), "validation": len(s.validation), "ph3_dev": len(s.ph3_dev),
                    "test": len(s.test), "test_known": sum((d, ex.uid) in known for ex in s.test),
                    **{f"pool_{k}": v for k, v in counts[d].items()},
                    **{f"{part}_ids": [ex.uid for ex in getattr(s, part)]
                       for part in ("head_set", "validation", "ph3_dev", "test")}} for d, s in splits.items()},
        domains=list(splits), titles=titles, notes=notes, methods=tuple(methods_order), head_domain=head_domain,
        engines=run.engine_record(),
    )
    write_outputs(result, all_results, out)
    return result


def write_outputs(result: ReproduceResult, results, out: Path) -> None:
    """`results.json` (settings, heads, per-domain betas and k, tables with intervals, timings,
    per-item outputs), `table.md` (both views and the paired differences) and `table.png`
    (without matplotlib, the `plots` extra, no PNG). Rows are named by their titles here
    (:func:`juice.methods.row_title`): the result holds their keys."""
    from juice.plots import have_matplotlib, interval_bar_chart

    result = titled_result(result)
    cfg = asdict(result.config)
    write_json_atomic(out / "results.json", {
        "config": cfg,
        "protocol": {"scoring": result.config.scoring, "scoring_label": scoring_title(result.config),
                     "tuning": tuning_label(result.config, "domain"),
                     "ph3_scoring": ph3_scoring(result.choices),
                     "beta_grid": {"beta_plus": list(result.config.beta_plus_grid),
                                   "beta_minus": list(result.config.beta_minus_grid)},
                     "heads_from": f"{result.head_domain} D", "engine": result.engines},
        "model": result.model,
        "heads": selection_to_json(result.selection),
        "choices": result.choices,
        "table": result.table.to_json(),
        "table_known": result.table_known.to_json() if result.table_known else None,
        "degeneration": result.degeneration.to_json() if result.degeneration else None,
        "correct_not_degenerate": result.correct_not_degenerate.to_json() if result.correct_not_degenerate else None,
        "accuracy": result.table.means(),
        "summary": result.summary,
        "timings_s": result.timings,
        "splits": result.splits,
        "notes": result.notes,
        "items": results_to_json(titled(results)),
    })
    methods = list(result.methods)
    cols, headers = table1_columns(result.domains, result.titles)
    avg_cols = [c for c in cols if c[0] == "Average"]
    avg_headers = [h for c, h in zip(cols, headers) if c[0] == "Average"]
    betas = "; ".join(f"{result.titles.get(d, d)}: " + ", ".join(
        f"{REGISTRY[m].title} ({b['beta_plus']:g}, {b['beta_minus']:g})" for m, b in c["betas"].items())
        + "".join(f", {n} k={p['k']}" for n, p in c["prune"].items()) for d, c in result.choices.items())
    text = [f"# Table 1 layout: {result.model['name']}\n",
            f"Heads: {scoring_title(result.config)} on {result.titles.get(result.head_domain, result.head_domain)}'s D; + {', '.join(map(str, result.selection.positive))}; "
            f"- {', '.join(map(str, result.selection.negative))}. Per-domain (beta+, beta-) and PH3 k: {betas}.\n",
            "## Unfiltered test split (Table 1, the paper's Table 3)\n", interval_markdown(result.table, methods, cols, headers),
            "\nAccuracy (%), exact match, ± the half-width of the 95% bootstrap interval "
            f"({result.config.bootstrap_resamples} resamples); bold only where the best interval excludes the "
            "runner-up's. Conflict types: 1 = clean, 2 = substitution, 3 = coherent.\n",
            "## Test items the model knows (Original correct on the clean prompt)\n",
            interval_markdown(result.table_known, methods, cols, headers) if result.table_known else "",
            "\n## Paired differences, unfiltered (percentage points, 95% paired bootstrap interval; * excludes 0)\n",
            difference_markdown(result.table, avg_cols, avg_headers)]
    if result.table_known:
        text += ["\n## Paired differences, known items\n", difference_markdown(result.table_known, avg_cols, avg_headers)]
    text += degeneration_markdown(result.degeneration, result.correct_not_degenerate, methods, cols, headers,
                                  avg_cols, avg_headers, ", unfiltered test split")
    (out / "table.md").write_text("\n".join(text), encoding="utf-8")
    for name, table, view in (("table.png", result.table, "unfiltered test split"),
                              ("table_known.png", result.table_known, "test items the model knows"),
                              ("table_correct_not_degenerate.png", result.correct_not_degenerate,
                               "correct and not degenerate, unfiltered test split"),
                              ("table_degeneration.png", result.degeneration,
                               "degenerate outputs (lower is better), unfiltered test split")):
        if table is not None and have_matplotlib():
            cells = {m: {t: table.cells[m]["Average"][t] for t in CONFLICT_TYPES if t in table.cells[m]["Average"]}
                     for m in methods}
            interval_bar_chart(cells, out / name, title=f"{result.model['name']}: average over domains, {view}")


__all__ = ["reproduce", "write_outputs"]
