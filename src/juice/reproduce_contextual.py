"""The contextual direction end to end: the paper's Table 2 on one model (Sec. 4.2).

Stages (written atomically to `<out>/state/` and resumed like :mod:`juice.reproduce`):

1. data: MemoTrap's four subtasks and NQ-Swap from `data_root`; prompts longer than
   `max_prompt_tokens` are dropped first (the default keeps a 2-core run within minutes: some
   NQ-Swap passages are whole tables of 1,000+ tokens; `--full` keeps all); seeded splits per
   dataset (:func:`juice.data.contextual.contextual_splits`).
2. heads: Stage 1 on Proverb Ending's D, target = the contextual answer's first token; reused for
   all five datasets (as in the paper).
3. betas: one beta+ x beta- grid per method on the pooled validation items of all five datasets
   (accuracy averaged over datasets).
4. PH3-l (Proverb Ending development set) and PH3-s (D): memory heads pruned, k tuned on the
   pooled validation.
5. evaluation: Original, Prompt, CAD, PH3-l, PH3-s, JuNE, JuICE on every test split; MemoTrap
   also by likelihood comparison.
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

from juice.baselines.cad import ALPHA
from juice.data.contextual import (
    CONTEXTUAL_DATASETS,
    CONTEXTUAL_TITLES,
    HEAD_DATASET,
    ContextualSplits,
    contextual_splits,
    load_contextual,
)
from juice.evaluation import (
    Method,
    accuracy_table,
    evaluate_contextual,
    likelihood_table,
    results_from_json,
    results_to_json,
    summary,
)
from juice.models import LoadedModel
from juice.report import contextual_markdown
from juice.reproduce import (
    Progress,
    ReproduceConfig,
    ReproduceResult,
    heads_stage,
    no_progress,
    ph3_methods,
    selection_to_json,
    settings_key,
    start_run,
    steered_methods,
)
from juice.scoring import write_json_atomic
from juice.tokens import token_ids
from juice.tuning import tune_betas

TABLE2_METHODS = ("Original", "Prompt", "CAD", "PH3-l", "PH3-s", "JuNE", "JuICE")
DEFAULT_DATA_ROOT = Path("../shared/data")


def resolve_data_root(cfg: ReproduceConfig) -> Path:
    """`cfg.data_root`, else `$JUICE_DATA`, else `../shared/data`.

    Raises:
        FileNotFoundError: the folder does not hold `memotrap/` and `nqswap/`.
    """
    import os

    root = Path(cfg.data_root or os.environ.get("JUICE_DATA") or DEFAULT_DATA_ROOT)
    if not (root / "memotrap").is_dir() or not (root / "nqswap").is_dir():
        raise FileNotFoundError(
            f"no MemoTrap/NQ-Swap data under {root}: pass --data-root (a folder with memotrap/*.csv and "
            f"nqswap/nqswap.jsonl) or set JUICE_DATA")
    return root


def prepare_contextual(lm: LoadedModel, cfg: ReproduceConfig, max_prompt_tokens: int | None) -> tuple[
        dict[str, ContextualSplits], dict[str, int]]:
    """Seeded splits of the five datasets, prompts longer than `max_prompt_tokens` dropped first.

    Returns:
        (dataset -> splits, dataset -> number of prompts dropped for length).
    """
    root = resolve_data_root(cfg)
    out, dropped = {}, {}
    for name in CONTEXTUAL_DATASETS:
        examples = load_contextual(name, root)
        if max_prompt_tokens is not None:
            kept = [ex for ex in examples if len(token_ids(lm.tokenizer, ex.prompt)) <= max_prompt_tokens]
            dropped[name] = len(examples) - len(kept)
            examples = kept
        out[name] = contextual_splits(
            examples, head_set_size=cfg.head_set_size, validation_size=cfg.validation_per_dataset,
            ph3_dev_size=cfg.ph3_dev_size if name == HEAD_DATASET else 0, limit=cfg.limit, seed=cfg.seed)
    return out, dropped


def reproduce_contextual(
    cfg: ReproduceConfig, progress: Progress = no_progress, lm: LoadedModel | None = None,
    max_prompt_tokens: int | None = 256,
) -> ReproduceResult:
    """Run the contextual pipeline (module docstring) and write `results_contextual.json`,
    `table2.md` and `heads_contextual.json` to `cfg.out_dir`.

    Raises:
        FileNotFoundError: the contextual data are not found (see :func:`resolve_data_root`).
    """
    notes: list[str] = []
    out = Path(cfg.out_dir)
    lm, state, timings = start_run(cfg, lm)
    fingerprint = lm.fingerprint()

    t = time.perf_counter()
    splits, dropped = prepare_contextual(lm, cfg, max_prompt_tokens)
    head = splits[HEAD_DATASET]
    validation = [ex for s in splits.values() for ex in s.validation]
    base = dict(model=fingerprint, seed=cfg.seed, direction="contextual", max_prompt_tokens=max_prompt_tokens,
                head=[ex.uid for ex in head.head_set], validation=[(ex.dataset, ex.uid) for ex in validation])
    if any(dropped.values()):
        notes.append("prompts longer than %d tokens dropped before splitting: %s" % (
            max_prompt_tokens, ", ".join(f"{CONTEXTUAL_TITLES[d]} {n}" for d, n in dropped.items() if n)))
    timings["data"] = time.perf_counter() - t

    t = time.perf_counter()
    key_heads = settings_key({**base, **{f: getattr(cfg, f) for f in (
        "k", "scoring", "shortlist", "alphas_positive", "alphas_negative")}})
    selection, saved = heads_stage(lm, cfg, state, "heads_contextual", key_heads, head.head_set, "contextual",
                                   progress, notes)
    write_json_atomic(out / "heads_contextual.json", saved)
    timings["stage1_heads"] = time.perf_counter() - t

    t = time.perf_counter()
    key_betas = settings_key({"heads": key_heads})
    betas = state.load("betas_contextual", key_betas)
    if betas is None:
        advance = progress("beta grid on validation (all five datasets)", len(validation) * 2 * 6 * 4)
        best, grid = tune_betas(lm, validation, selection, direction="contextual", max_rows=cfg.max_rows,
                                on_progress=advance)
        betas = {m: {"beta_plus": g.beta_plus, "beta_minus": g.beta_minus, "accuracy": g.accuracy,
                     "per_dataset": list(g.per_type)} for m, g in best.items()}
        state.save("betas_contextual", key_betas, betas)
    timings["beta_tuning"] = time.perf_counter() - t

    methods: dict[str, Method] = {"Original": Method()}
    baselines: dict[str, Any] = {}
    if cfg.baselines:
        t = time.perf_counter()
        methods["Prompt"] = Method(instructed=True)
        methods["CAD"] = Method(cad_alpha=ALPHA)
        ph3_rows, baselines = ph3_methods(
            lm, cfg, state, head.ph3_dev, head.head_set, validation, "contextual",
            lambda dev_set: settings_key({**base, "dev": [ex.uid for ex in dev_set]}), progress, notes)
        methods.update(ph3_rows)
        baselines["CAD"] = {"alpha": ALPHA}
        timings["ph3"] = time.perf_counter() - t
    methods.update(steered_methods(lm, selection, betas))

    t = time.perf_counter()
    all_results = []
    for name, sp in splits.items():
        key_eval = settings_key({"betas": key_betas, "best": betas, "test": [ex.uid for ex in sp.test],
                         "methods": list(methods), "baselines": baselines})
        rows = state.load(f"eval_contextual_{name}", key_eval)
        if rows is None:
            advance = progress(f"evaluate {CONTEXTUAL_TITLES[name]}", len(sp.test) * len(methods))
            results = evaluate_contextual(lm, sp.test, methods, max_rows=cfg.max_rows, on_progress=advance)
            rows = results_to_json(results)
            state.save(f"eval_contextual_{name}", key_eval, rows)
        all_results += results_from_json(rows)
    timings["evaluation"] = time.perf_counter() - t

    result = ReproduceResult(
        config=cfg, model=fingerprint, selection=selection,
        betas={m: {"beta_plus": v["beta_plus"], "beta_minus": v["beta_minus"]} for m, v in betas.items()},
        table=accuracy_table(all_results), summary=summary(all_results), timings=timings,
        splits={d: {"head_set": len(s.head_set), "validation": len(s.validation), "ph3_dev": len(s.ph3_dev),
                    "test": len(s.test)} for d, s in splits.items()},
        domains=list(splits), titles=dict(CONTEXTUAL_TITLES), notes=notes, methods=tuple(methods),
        baselines=baselines, likelihood=likelihood_table(all_results),
    )
    _write(result, all_results, out)
    return result


def _write(result: ReproduceResult, results, out: Path) -> None:
    from dataclasses import asdict

    write_json_atomic(out / "results_contextual.json", {
        "config": asdict(result.config), "model": result.model, "heads": selection_to_json(result.selection),
        "betas": result.betas, "baselines": result.baselines, "table": result.table,
        "likelihood": result.likelihood, "summary": result.summary, "timings_s": result.timings,
        "splits": result.splits, "notes": result.notes, "items": results_to_json(results),
    })
    md = contextual_markdown(result.table, result.likelihood, list(result.methods), result.domains, result.titles)
    (out / "table2.md").write_text(f"# Table 2 layout: {result.model['name']}\n\n{md}", encoding="utf-8")
