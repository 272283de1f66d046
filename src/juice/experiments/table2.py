"""The contextual direction end to end: Table 2 (the paper's Table 4) on one model (Sec. 4.2).

Stages (the shared stages of :mod:`juice.pipeline`, written atomically to `<out>/state/` and resumed):

1. data: MemoTrap's four subtasks and NQ-Swap from `data_root`; prompts longer than
   `max_prompt_tokens` are dropped first (the default keeps a 2-core run within minutes: some
   NQ-Swap passages are whole tables of 1,000+ tokens; `--full` keeps all); seeded splits per
   dataset (:func:`juice.data.contextual.contextual_splits`).
2. heads: Stage 1 on Proverb Ending's D, target = the contextual answer's first token; reused for
   all five datasets (as in the paper).
3. PH3-l (Proverb Ending development set) and PH3-s (D): memory heads by path patching.
4. tuning per dataset on its own validation split (docs/protocol.md, "Contextual direction"): JuICE's
   and JuNE's (beta+, beta-) and PH3's k.
5. evaluation: Original, Prompt, CAD, AdaCAD, PH3-l, PH3-s, JuNE, JuICE on every test split;
   MemoTrap also by likelihood comparison; every cell with n and a 95% bootstrap interval.
6. when to steer (juice's addition, issue 35): NQ-Swap's test questions with a gold, a
   conflicting, an irrelevant and no context (:mod:`juice.data.context_types`; passages from the
   rows within `max_prompt_tokens`), every method with NQ-Swap's tuned settings, under both
   objectives (:mod:`juice.when_to_steer.evaluation`): what tuning on conflicting items costs elsewhere.
7. the when-to-steer study, on the datasets of `cfg.contexts` (`juice reproduce --direction
   contextual --contexts nqswap,paraconflict`): validation and test split by question, the best
   static method and `auto` chosen on validation, everything compared on test, with Table 2's
   heads and NQ-Swap's betas (:func:`when_to_steer_stage`, :mod:`juice.when_to_steer.study`).
"""

from __future__ import annotations

import json
import time
from collections.abc import Mapping
from dataclasses import asdict, replace
from pathlib import Path
from typing import Any

from juice.data.contextual import (DATASETS, HEAD_DATASET, STUDY_DATASET, ContextualSplits, contextual_splits,
                                   dataset_titles, load_contextual, missing_folders)
from juice.engine.backend import Engine
from juice.eval.degeneration import correct_not_degenerate
from juice.eval.report import degeneration_markdown, difference_markdown, interval_markdown, table2_columns
from juice.when_to_steer.evaluation import context_type_tables, evaluate_context_types
from juice.eval.runner import evaluate_contextual, results_to_json, summary, titled
from juice.recipe import Method
from juice.eval.tables import interval_table
from juice.io import settings_key
from juice.pipeline.run import (
    ReproduceConfig,
    ReproduceResult,
    StageRun,
    run_key_base,
    scoring_title,
    selection_to_json,
    start_run,
    study_sizes,
    tuning_label,
)
from juice.pipeline.stages import (domain_methods, evaluate_test_splits, evaluation_stage, ph3_scoring, protocol_stages,
                                   stage1_key, titled_choice, titled_result)
from juice.progress import Progress, no_progress
from juice.io import write_json_atomic
from juice.methods import FOCUS, STEERINGS, UNSTEERED, row_title
from juice.models import LoadedModel
from juice.tokens import token_ids

DEFAULT_DATA_ROOT = Path("../shared/data")


def resolve_data_root(cfg: ReproduceConfig) -> Path:
    """`cfg.data_root`, else `$JUICE_DATA`, else `../shared/data`.

    Raises:
        FileNotFoundError: the folder does not hold every dataset's folder (:data:`juice.data.contextual.DATASETS`).
    """
    import os

    root = Path(cfg.data_root or os.environ.get("JUICE_DATA") or DEFAULT_DATA_ROOT)
    missing = missing_folders(root)
    if missing:
        raise FileNotFoundError(
            f"no contextual data under {root} (no {', '.join(m + '/' for m in missing)}): pass --data-root (a folder "
            f"holding {' and '.join(f + '/' for f in dict.fromkeys(d.folder for d in DATASETS.values()))}) or set "
            "JUICE_DATA")
    return root


def prepare_contextual(lm: LoadedModel, cfg: ReproduceConfig, max_prompt_tokens: int | None) -> tuple[
        dict[str, ContextualSplits], dict[str, int]]:
    """Seeded splits of the five datasets, prompts longer than `max_prompt_tokens` dropped first.

    Returns:
        (dataset -> splits, dataset -> number of prompts dropped for length).
    """
    root = resolve_data_root(cfg)
    out, dropped = {}, {}
    for name in DATASETS:
        examples = load_contextual(name, root)
        if max_prompt_tokens is not None:
            kept = [ex for ex in examples if len(token_ids(lm.tokenizer, ex.prompt)) <= max_prompt_tokens]
            dropped[name] = len(examples) - len(kept)
            examples = kept
        out[name] = contextual_splits(
            examples, head_set_size=cfg.head_set_size, validation_size=cfg.validation_per_dataset,
            ph3_dev_size=cfg.ph3_dev_size if name == HEAD_DATASET else 0, limit=cfg.test_limit("contextual"), seed=cfg.seed)
    return out, dropped


def reproduce_contextual(
    cfg: ReproduceConfig, progress: Progress = no_progress, lm: LoadedModel | None = None,
    max_prompt_tokens: int | None = 256, engine: Engine | None = None,
) -> ReproduceResult:
    """Run the contextual pipeline (module docstring) and write `results_contextual.json`,
    `table2.md`, `table2.png` and `heads_contextual.json` to `cfg.out_dir`. `engine` runs the
    stages (:mod:`juice.engine.backend`; None: juice's own; `cfg.engine` must name it).

    Raises:
        FileNotFoundError: the contextual data are not found (see :func:`resolve_data_root`).
        ValueError: a data file does not parse (MemoTrapFormatError, or a malformed NQ-Swap row);
            raised before the model loads.
    """
    out = Path(cfg.out_dir)
    root = resolve_data_root(cfg)
    for name in DATASETS:   # bad data fails here, in one line, before the model loads
        load_contextual(name, root)
    run, timings = start_run(cfg, lm, progress, engine)
    lm, notes = run.lm, run.notes

    t = time.perf_counter()
    splits, dropped = prepare_contextual(lm, cfg, max_prompt_tokens)
    head = splits[HEAD_DATASET]
    base = run_key_base(lm, cfg, direction="contextual", max_prompt_tokens=max_prompt_tokens,
                        head=[ex.to_json() for ex in head.head_set])
    if any(dropped.values()):
        notes.append("prompts longer than %d tokens dropped before splitting: %s" % (
            max_prompt_tokens, ", ".join(f"{DATASETS[d].title} {n}" for d, n in dropped.items() if n)))
    timings["data"] = time.perf_counter() - t

    key_heads = stage1_key(base, cfg)
    selection, ph3, choices, key_tuning = protocol_stages(run, base, key_heads, splits, HEAD_DATASET, "contextual",
                                                          out / "heads_contextual.json", timings)

    def methods_of(name: str) -> dict[str, Method]:   # Original, Prompt, CAD, AdaCAD, PH3, JuNE, JuICE
        return domain_methods(lm, selection, choices[name], cfg.baselines, list(ph3), "table2")

    all_results, order = evaluate_test_splits(
        run, splits, methods_of, choices, key_tuning, "eval_contextual_{}", dataset_titles(), 1,
        evaluate_contextual, timings)

    boot = dict(resamples=cfg.bootstrap_resamples, seed=cfg.seed)
    contexts = None
    study = DATASETS[STUDY_DATASET]
    if STUDY_DATASET in splits and splits[STUDY_DATASET].test:
        t = time.perf_counter()
        study_rows = methods_of(STUDY_DATASET)
        study_methods = {m: study_rows[m] for m in order if m in study_rows}
        fits = None if max_prompt_tokens is None else (
            lambda prompt: len(token_ids(lm.tokenizer, prompt)) <= max_prompt_tokens)
        items = study.context_items(root / study.folder, cfg.seed, [ex.uid for ex in splits[STUDY_DATASET].test], fits)
        key_ctx = settings_key({"tuning": key_tuning, "choice": titled_choice(choices[STUDY_DATASET]),
                                "methods": [row_title(m) for m in study_methods],
                                "items": [asdict(i) for i in items], "stage": "contexts/2"})
        ctx_results = evaluation_stage(
            run, f"contexts_{STUDY_DATASET}", key_ctx, f"when to steer: {study.title} x its context types",
            len(items) * len(study_methods),
            lambda advance, checkpoint: evaluate_context_types(lm, items, study_methods, max_rows=cfg.max_rows, on_progress=advance,
                                                   engine=run.engine))
        run.ran("contexts")
        contexts = context_type_tables(ctx_results, list(study_methods), focus=FOCUS, baseline=UNSTEERED, **boot)
        timings["contexts"] = time.perf_counter() - t
    studies = when_to_steer_stage(run, choices, root, timings)
    by_likelihood = [replace(r, correct=r.likelihood_correct) for r in all_results if r.likelihood_correct is not None]
    result = ReproduceResult(
        config=cfg, model=lm.fingerprint(), selection=selection, choices=choices,
        table=interval_table(all_results, order, **boot), table_known=None,
        summary=summary(all_results), timings=timings,
        splits={d: {"head_set": len(s.head_set), "validation": len(s.validation), "ph3_dev": len(s.ph3_dev),
                    "test": len(s.test), **{f"{part}_ids": [ex.uid for ex in getattr(s, part)]
                                            for part in ("head_set", "validation", "ph3_dev", "test")}}
                for d, s in splits.items()},
        domains=list(splits), titles=dataset_titles(), notes=notes, methods=tuple(order),
        likelihood=interval_table(by_likelihood, order, **boot) if by_likelihood else None,
        degeneration=interval_table(all_results, order, value=lambda r: r.degenerate, **boot),
        correct_not_degenerate=interval_table(all_results, order, value=correct_not_degenerate, **boot),
        contexts=contexts, studies=studies, engines=run.engine_record(),
    )
    _write(result, all_results, out)
    return result


STUDY_MAX_PROMPT_TOKENS = 256
"""The when-to-steer study keeps NQ-Swap prompts of at most this many tokens (docs/when-to-steer.md)."""


def table2_heads(heads: Mapping[str, Any], betas: Mapping[str, Mapping[str, float]], source: str) -> dict[str, Any]:
    """A heads file's JSON (`heads_contextual.json`) with NQ-Swap's tuned JuICE and JuNE betas of
    Table 2 (`choices[STUDY_DATASET]["betas"]`) as its tuned settings: the steerings the when-to-steer
    study runs (the contextual protocol tunes no betas on ParaConflict; docs/when-to-steer.md)."""
    tuned = {m: {"beta_plus": betas[m]["beta_plus"], "beta_minus": betas[m]["beta_minus"]} for m in STEERINGS}
    return {**heads, "tuned": {**tuned, "data": {"from": f"{source}: NQ-Swap's tuned betas (Table 2)"}}}


def when_to_steer_stage(run: StageRun, choices: Mapping[str, Any], root: Path,
                        timings: dict[str, float]) -> dict[str, dict[str, Any]]:
    """The when-to-steer study (:func:`juice.when_to_steer.study.run_study`) on each of `cfg.contexts`,
    with Table 2's heads and NQ-Swap's tuned betas (:func:`table2_heads`), sized by
    `cfg.study_size` (:func:`juice.pipeline.run.study_sizes`), in `<out>/when-to-steer-<dataset>/`
    (resumable: decoding is cached per chunk there); NQ-Swap from `root`, ParaConflict from
    `cfg.data` or the six built-in domains.

    Returns:
        dataset -> :meth:`juice.when_to_steer.study.Study.headline` and the study's Markdown file.
    """
    from juice.when_to_steer.study import run_study
    from juice.stage1 import load_heads
    from juice.when_to_steer.contexts import prompt_fits

    cfg, lm, out = run.cfg, run.lm, Path(run.cfg.out_dir)
    if not cfg.contexts:
        return {}
    run.ran("when to steer study", "auto decides per request from a second, question-only sequence, which a "
                                   "vLLM request cannot carry")
    if STUDY_DATASET not in choices:
        run.notes.append(f"when to steer: {DATASETS[STUDY_DATASET].title} is not in this run, so there are no "
                         "Table 2 betas to study with")
        return {}
    heads = table2_heads(json.loads((out / "heads_contextual.json").read_text(encoding="utf-8")),
                         choices[STUDY_DATASET]["betas"], str(out / "results_contextual.json"))
    studies = {}
    for dataset in cfg.contexts:
        t = time.perf_counter()
        folder = out / f"when-to-steer-{dataset}"
        write_json_atomic(folder / "heads_table2.json", heads)
        validation, test = study_sizes()[dataset][cfg.study_size]
        entry = DATASETS.get(dataset)   # a contextual dataset from the data root, else ParaConflict
        source, keep = ((root / entry.folder, prompt_fits(lm.tokenizer, STUDY_MAX_PROMPT_TOKENS)) if entry is not None
                        else (cfg.data, None))
        study = run_study(lm, load_heads(folder / "heads_table2.json", lm), source, out=folder,
                          validation_limit=validation, test_limit=test, keep=keep, seed=cfg.seed, max_rows=cfg.max_rows,
                          resamples=cfg.bootstrap_resamples, progress=run.progress)
        studies[dataset] = {**study.headline(), "study": str(folder / "study.md")}
        timings[f"when_to_steer_{dataset}"] = time.perf_counter() - t
    return studies


def study_line(dataset: str, headline: Mapping[str, Any]) -> str:
    """One line for a study (:func:`when_to_steer_stage`): auto and the oracle against the best
    static method chosen on validation, on the test questions."""
    best = headline["best_static"]
    parts = [f"- {dataset}: {headline['questions']} test questions; best static method on validation {best}"]
    for key, value in headline.items():
        if " - " in key and key.endswith(f" - {best}"):
            parts.append(f"{key} {value[0]:+.1f} [{value[1]:+.1f}, {value[2]:+.1f}]")
    parts += [f"cross-validation ({k}): {'qualified' if v['qualified'] else 'not qualified'}, {v['difference'][0]:+.1f}"
              for k, v in headline.get("cross_validation", {}).items()]
    return "; ".join(parts) + f" ({headline['study']})"


def _write(result: ReproduceResult, results, out: Path) -> None:
    """`results_contextual.json`, `table2.md` and the PNGs, rows named by title (:func:`titled_result`)."""
    from juice.plots import have_matplotlib, interval_bar_chart

    result = titled_result(result)
    write_json_atomic(out / "results_contextual.json", {
        "config": asdict(result.config), "model": result.model, "heads": selection_to_json(result.selection),
        "protocol": {"scoring": result.config.scoring, "scoring_label": scoring_title(result.config),
                     "tuning": tuning_label(result.config, "dataset"),
                     "ph3_scoring": ph3_scoring(result.choices),
                     "beta_grid": {"beta_plus": list(result.config.beta_plus_grid),
                                   "beta_minus": list(result.config.beta_minus_grid)},
                     "heads_from": "proverb_ending D", "engine": result.engines},
        "choices": result.choices, "table": result.table.to_json(), "accuracy": result.table.means(),
        "likelihood": result.likelihood.to_json() if result.likelihood else None,
        "degeneration": result.degeneration.to_json() if result.degeneration else None,
        "correct_not_degenerate": result.correct_not_degenerate.to_json() if result.correct_not_degenerate else None,
        "contexts": {k: t.to_json() for k, t in result.contexts.items()} if result.contexts else None,
        "when_to_steer": result.studies or None,
        "summary": result.summary, "timings_s": result.timings,
        "splits": result.splits, "notes": result.notes, "items": results_to_json(titled(results)),
    })
    methods = list(result.methods)
    cols, headers = table2_columns(result.domains, result.titles)
    betas = "; ".join(f"{result.titles.get(d, d)}: " + ", ".join(
        f"{m} ({b['beta_plus']:g}, {b['beta_minus']:g})" for m, b in c["betas"].items())
        + "".join(f", {n} k={p['k']}" for n, p in c["prune"].items()) for d, c in result.choices.items())
    text = [f"# Table 2 layout: {result.model['name']}\n",
            f"Heads: {scoring_title(result.config)} on Proverb Ending's D; + "
            f"{', '.join(map(str, result.selection.positive))}; - {', '.join(map(str, result.selection.negative))}. "
            f"Per-dataset (beta+, beta-) and PH3 k: {betas}.\n",
            interval_markdown(result.table, methods, cols, headers),
            "\nAccuracy (%) of the contextual answer, ± the half-width of the 95% bootstrap interval; bold only "
            "where the best interval excludes the runner-up's.\n"]
    if result.likelihood:
        mt = [d for d in result.domains if d in result.likelihood.cells.get(methods[0], {})]
        lcols, lheaders = table2_columns(mt, result.titles)
        text += ["## MemoTrap, likelihood comparison (%)\n", interval_markdown(result.likelihood, methods, lcols, lheaders)]
    avg = [(c, h) for c, h in zip(cols, headers) if c[0] == "Average"]
    text += ["\n## Paired differences (percentage points, 95% paired bootstrap interval; * excludes 0)\n",
             difference_markdown(result.table, [c for c, _ in avg], [h for _, h in avg])]
    text += degeneration_markdown(result.degeneration, result.correct_not_degenerate, methods, cols, headers,
                                  [c for c, _ in avg], [h for _, h in avg])
    if result.contexts:
        from juice.data.context_types import CONTEXT_TYPES
        from juice.when_to_steer.evaluation import LOWER_IS_BETTER
        from juice.when_to_steer.contexts import TITLES

        text.append("\n## When to steer: NQ-Swap's test questions with a gold, conflicting, irrelevant or no context\n")
        for name, table in result.contexts.items():
            ccols = [("Average", g) for g in CONTEXT_TYPES if g != "none" or name != "follows_context"]
            text += [f"### {TITLES[name]}\n", interval_markdown(table, methods, ccols, [g for _, g in ccols],
                                                                 bold=name not in ("follows_context", *LOWER_IS_BETTER))]
    if result.studies:
        text.append("\n## When to steer, the study (validation and test split by question; docs/when-to-steer.md)\n")
        text += [study_line(d, h) for d, h in result.studies.items()]
    (out / "table2.md").write_text("\n".join(text), encoding="utf-8")
    for name, table, what in (("table2.png", result.table, "contextual answer accuracy"),
                              ("table2_correct_not_degenerate.png", result.correct_not_degenerate,
                               "correct and not degenerate"),
                              ("table2_degeneration.png", result.degeneration, "degenerate outputs (lower is better)")):
        if table is None or not have_matplotlib():   # the plots extra
            continue
        cells = {m: {result.titles.get(d, d): table.cells[m][d]["context"] for d in [*result.domains, "Average"]
                     if "context" in table.cells[m].get(d, {})} for m in methods}
        interval_bar_chart(cells, out / name, title=f"{result.model['name']}: {what}")
