"""The main job: the paper's Table 1 (parametric direction) on one model, end to end.

Stages (each written atomically to `<out>/state/` and reused when re-run with the same settings,
so an interrupted run resumes where it stopped):

1. data: build the six domains, carve each test split (model-independent, reported unfiltered);
   filter World Capital's development pool to the items the model answers on the clean prompt;
   draw D (|D| = 4) and the validation split from it; the rest of the pool (unfiltered) is PH3-l's
   development set.
2. heads: Stage 1 on World Capital's D only (exact, attribution or hybrid scoring).
3. betas: grid search of beta+ x beta- for JuICE and for JuNE on World Capital validation.
4. PH3 (Jin et al. 2024): head effects on the development set (PH3-l) and on D (PH3-s); the
   number of pruned context heads tuned on validation.
5. evaluation: Original, Prompt, PH3-l, PH3-s, JuNE and JuICE on every domain's test split x 3
   conflict types.

The contextual direction (Table 2) is :mod:`juice.reproduce_contextual`.
"""

from __future__ import annotations

import hashlib
import json
import time
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import torch

from juice.baselines.ph3 import (
    PRUNE_K,
    ConflictPrompt,
    Ph3Scores,
    heads_to_prune,
    logit_difference_effects,
    pruning,
)
from juice.data.paraconflict import DOMAINS, build_domain
from juice.data.records import CONFLICT_TYPES, ConflictExample
from juice.data.splits import Splits, filtered_splits, load_paper_splits, split_test
from juice.evaluation import (
    Method,
    accuracy_table,
    evaluate,
    results_from_json,
    results_to_json,
    summary,
)
from juice.interventions import Head
from juice.models import DEFAULT_MODEL, LoadedModel, load_model
from juice.report import markdown_table
from juice.scoring import (
    ALPHAS_NEGATIVE,
    ALPHAS_POSITIVE,
    UnitCheckpoint,
    attribution_scores,
    hybrid_scores,
    make_artifact,
    score_heads,
    scoring_prompts,
    select_heads,
    write_json_atomic,
)
from juice.steering import HeadSelection, Steering, steering_coefficients
from juice.tokens import answer_first_token
from juice.tuning import tune_betas, tune_prune_k

HEAD_DOMAIN = "world_capital"
METHOD_NAMES = {"original": "Original", "june": "JuNE", "juice": "JuICE"}
TABLE1_METHODS = ("Original", "Prompt", "PH3-l", "PH3-s", "JuNE", "JuICE")
PH3_CONFLICT_TYPES = ("substitution", "coherent")

Progress = Callable[[str, int], Callable[[int], None]]
"""(description, total) -> advance(n): how the pipeline reports progress (e.g. rich bars)."""


def no_progress(description: str, total: int) -> Callable[[int], None]:
    return lambda n: None


@dataclass
class ReproduceConfig:
    """Settings of `juice reproduce` (both directions). Defaults fit under 20 minutes per
    direction on 2 CPU cores with Gemma 3 270M (measured 18 min 50 s parametric)."""

    model: str = DEFAULT_MODEL
    out_dir: Path = Path("juice-output")
    limit: int | None = 10              # test items per domain; None = all
    validation_size: int | None = 6     # validation items; None = all filtered
    head_set_size: int = 4
    k: int = 5
    scoring: str = "hybrid"             # exact | attribution | hybrid
    shortlist: int = 12                 # heads per sign re-scored exactly (hybrid)
    alphas_positive: tuple[float, ...] = ALPHAS_POSITIVE
    alphas_negative: tuple[float, ...] = ALPHAS_NEGATIVE
    seed: int = 0
    data: Path | None = None            # a ParaConflict folder (the paper's JSON splits) instead
    domains: tuple[str, ...] = tuple(DOMAINS)
    max_rows: int | str = 128          # rows per batched forward, or "auto" (a share of free memory)
    device_map: str | None = None       # e.g. "auto": shard over GPUs with accelerate
    dtype: str = "float32"              # float32 | bfloat16 | float16
    baselines: bool = True              # Prompt and PH3 rows (and CAD in the contextual direction)
    ph3_dev_size: int | None = 12       # PH3-l development items (the paper: 200); None = all
    data_root: Path | None = None       # contextual: folder with memotrap/ and nqswap/
    validation_per_dataset: int | None = 3  # contextual: validation items per dataset


@dataclass
class ReproduceResult:
    config: ReproduceConfig
    model: dict[str, Any]
    selection: HeadSelection
    betas: dict[str, dict[str, float]]
    table: dict[str, dict[str, dict[str, float]]]
    summary: dict[str, dict[str, float]]
    timings: dict[str, float]
    splits: dict[str, dict[str, int]]
    domains: list[str]
    titles: dict[str, str]
    notes: list[str] = field(default_factory=list)
    methods: tuple[str, ...] = TABLE1_METHODS
    baselines: dict[str, Any] = field(default_factory=dict)
    likelihood: dict[str, dict[str, float]] = field(default_factory=dict)


class StageFiles:
    """Stage files under `<out>/state/`, each tagged with the key of the settings it depends on."""

    def __init__(self, folder: Path):
        self.folder = folder

    def load(self, name: str, key: str) -> Any | None:
        path = self.folder / f"{name}.json"
        if not path.is_file():
            return None
        data = json.loads(path.read_text(encoding="utf-8"))
        return data["value"] if data.get("key") == key else None

    def save(self, name: str, key: str, value: Any) -> None:
        write_json_atomic(self.folder / f"{name}.json", {"key": key, "value": value})


def prepare_splits(
    lm: LoadedModel, cfg: ReproduceConfig, state: StageFiles, key: str, progress: Progress
) -> tuple[dict[str, Splits], dict[str, str], list[ConflictExample]]:
    """Splits of every domain; D and validation only for the head domain (filtered per model).

    Returns:
        (domain -> splits, domain -> title, the head domain's development items outside D and
        validation: PH3-l's development set, unfiltered).
    """
    if cfg.data is not None:
        paper = load_paper_splits(cfg.data)
        n_val = cfg.validation_size
        splits = Splits(paper.head_set, paper.validation[:n_val], paper.test[: cfg.limit])
        name = Path(cfg.data).name
        rest = list(paper.validation[n_val:]) if n_val is not None else []
        return {name: splits}, {name: name.replace("_", " ").title()}, rest
    out, titles, rest = {}, {}, []
    for domain in cfg.domains:
        pool, test = split_test(build_domain(domain, cfg.seed), cfg.seed)
        test = test[: cfg.limit] if cfg.limit else test
        titles[domain] = DOMAINS[domain].title
        if domain != HEAD_DOMAIN:
            out[domain] = Splits((), (), tuple(test))
            continue
        known = state.load("filter", key)
        if known is None:
            advance = progress(f"filter {domain} (clean prompts)", len(pool))
            results = evaluate(lm, pool, {"Original": Steering()}, ("clean",), max_rows=cfg.max_rows,
                               on_progress=advance)
            known = {r.subject: r.correct for r in results}
            state.save("filter", key, known)
        out[domain] = filtered_splits(
            pool, [known[ex.subject] for ex in pool], test, head_set_size=cfg.head_set_size,
            validation_size=cfg.validation_size, seed=cfg.seed,
        )
        used = {ex.subject for ex in (*out[domain].head_set, *out[domain].validation)}
        rest = [ex for ex in pool if ex.subject not in used]
    return out, titles, rest


def identify_heads(
    lm: LoadedModel, cfg: ReproduceConfig, head_set: Sequence[ConflictExample], progress: Progress,
    direction: str = "parametric", checkpoint: UnitCheckpoint | None = None,
):
    """Stage 1 with the configured scoring method. Returns (scores, selection).

    With `checkpoint`, each prompt's scores are saved as soon as they are computed, so an
    interrupted Stage 1 resumes at the next prompt.
    """
    prompts = scoring_prompts(lm, head_set, direction)
    if cfg.scoring == "attribution":
        advance = progress("stage 1: attribution", len(prompts))
        scores = attribution_scores(lm, prompts, cfg.alphas_positive, cfg.alphas_negative,
                                    on_prompt=lambda i: advance(1), checkpoint=checkpoint)
    elif cfg.scoring == "hybrid":
        advance = progress("stage 1: attribution, then exact scores of the shortlist", 3 * len(prompts))
        scores = hybrid_scores(lm, prompts, cfg.shortlist, cfg.alphas_positive, cfg.alphas_negative,
                               max_rows=_scoring_rows(cfg), on_prompt=lambda i: advance(1), checkpoint=checkpoint)
    elif cfg.scoring == "exact":
        advance = progress("stage 1: exact head scores", len(prompts))
        scores = score_heads(lm, prompts, cfg.alphas_positive, cfg.alphas_negative, max_rows=_scoring_rows(cfg),
                             on_prompt=lambda i: advance(1), checkpoint=checkpoint)
    else:
        raise ValueError(f"scoring must be exact, attribution or hybrid, not {cfg.scoring!r}")
    return scores, select_heads(scores, cfg.k)


def _scoring_rows(cfg: ReproduceConfig) -> int | str:
    """Scoring rows carry no KV cache and read one position: twice the decoding rows."""
    return cfg.max_rows if cfg.max_rows == "auto" else 2 * int(cfg.max_rows)


def selection_to_json(sel: HeadSelection) -> dict:
    return {"positive": [str(h) for h in sel.positive], "negative": [str(h) for h in sel.negative]}


def reproduce(cfg: ReproduceConfig, progress: Progress = no_progress, lm: LoadedModel | None = None) -> ReproduceResult:
    """Run the whole pipeline (module docstring) and write `results.json`, `table.md` and
    `heads.json` to `cfg.out_dir`.

    Raises:
        ValueError: too few filtered items for D and validation; bad settings.
    """
    notes: list[str] = []
    out = Path(cfg.out_dir)
    lm, state, timings = start_run(cfg, lm)
    fingerprint = lm.fingerprint()
    base = dict(model=fingerprint, seed=cfg.seed, data=str(cfg.data), domains=cfg.domains)

    t = time.perf_counter()
    key_data = settings_key(base)
    splits, titles, ph3_pool = prepare_splits(lm, cfg, state, key_data, progress)
    head_domain = HEAD_DOMAIN if cfg.data is None else next(iter(splits))
    dev = splits[head_domain]
    timings["data_and_filter"] = time.perf_counter() - t

    t = time.perf_counter()
    key_heads = settings_key({**base, **{f: getattr(cfg, f) for f in (
        "head_set_size", "validation_size", "k", "scoring", "shortlist", "alphas_positive", "alphas_negative")}})
    selection, artifact_json = heads_stage(lm, cfg, state, "heads", key_heads, dev.head_set, "parametric",
                                           progress, notes)
    write_json_atomic(out / "heads.json", artifact_json)
    timings["stage1_heads"] = time.perf_counter() - t

    t = time.perf_counter()
    key_betas = settings_key({"heads": key_heads, "validation": [ex.subject for ex in dev.validation]})
    betas = state.load("betas", key_betas)
    if betas is None:
        n_grid = 2 * 6 * 4
        advance = progress("beta grid on validation", len(dev.validation) * len(CONFLICT_TYPES) * n_grid)
        best, grid = tune_betas(lm, dev.validation, selection, max_rows=cfg.max_rows, on_progress=advance)
        betas = {
            "best": {m: {"beta_plus": g.beta_plus, "beta_minus": g.beta_minus, "accuracy": g.accuracy,
                         "p_answer": g.p_answer, "per_type": list(g.per_type)} for m, g in best.items()},
            "grid": [asdict(g) for g in grid],
        }
        state.save("betas", key_betas, betas)
    timings["beta_tuning"] = time.perf_counter() - t

    methods: dict[str, Method] = {"Original": Method()}
    baselines: dict[str, Any] = {}
    if cfg.baselines:
        t = time.perf_counter()
        methods["Prompt"] = Method(instructed=True)
        ph3_dev = ph3_pool[: cfg.ph3_dev_size] if cfg.ph3_dev_size is not None else ph3_pool
        validation_ids = [ex.subject for ex in dev.validation]
        ph3_rows, baselines = ph3_methods(
            lm, cfg, state, ph3_dev, dev.head_set, dev.validation, "parametric",
            lambda dev_set: settings_key({"data": key_data, "dev": [ex.subject for ex in dev_set],
                                          "validation": validation_ids}), progress, notes)
        methods.update(ph3_rows)
        timings["ph3"] = time.perf_counter() - t
    methods.update(steered_methods(lm, selection, betas["best"]))

    t = time.perf_counter()
    all_results = []
    for domain, sp in splits.items():
        key_eval = settings_key({"betas": key_betas, "best": betas["best"], "test": [ex.subject for ex in sp.test],
                         "methods": list(methods), "baselines": baselines})
        rows = state.load(f"eval_{domain}", key_eval)
        if rows is None:
            advance = progress(f"evaluate {titles.get(domain, domain)}", len(sp.test) * len(CONFLICT_TYPES) * len(methods))
            results = evaluate(lm, sp.test, methods, max_rows=cfg.max_rows, on_progress=advance)
            rows = results_to_json(results)
            state.save(f"eval_{domain}", key_eval, rows)
        all_results += results_from_json(rows)
    timings["evaluation"] = time.perf_counter() - t

    domains = list(splits)
    result = ReproduceResult(
        config=cfg, model=fingerprint, selection=selection,
        betas={m: {"beta_plus": v["beta_plus"], "beta_minus": v["beta_minus"]} for m, v in betas["best"].items()},
        table=accuracy_table(all_results), summary=summary(all_results), timings=timings,
        splits={d: {"head_set": len(s.head_set), "validation": len(s.validation), "test": len(s.test)}
                for d, s in splits.items()},
        domains=domains, titles=titles, notes=notes, methods=tuple(methods), baselines=baselines,
    )
    write_outputs(result, all_results, out)
    return result


def start_run(cfg: ReproduceConfig, lm: LoadedModel | None) -> tuple[LoadedModel, StageFiles, dict[str, float]]:
    """The model (loaded unless given), the stage files under `<out>/state/` and the timings
    with the load time."""
    t = time.perf_counter()
    lm = lm or load_model(cfg.model, dtype=getattr(torch, cfg.dtype), device_map=cfg.device_map)
    return lm, StageFiles(Path(cfg.out_dir) / "state"), {"load_model": time.perf_counter() - t}


def heads_stage(
    lm: LoadedModel, cfg: ReproduceConfig, state: StageFiles, stage: str, key: str, head_set: Sequence,
    direction: str, progress: Progress, notes: list[str],
) -> tuple[HeadSelection, dict[str, Any]]:
    """Stage 1 on `head_set`, read from the stage file `stage` when its settings `key` match
    (per-prompt results resume from `units.json`). Notes a selection smaller than K.

    Returns:
        (selection, the heads artifact as JSON).
    """
    saved = state.load(stage, key)
    if saved is None:
        scores, selection = identify_heads(lm, cfg, head_set, progress, direction=direction,
                                           checkpoint=UnitCheckpoint(state.folder / "units.json", lm.fingerprint()))
        saved = make_artifact(lm, scores, selection, cfg.k, direction, head_set).to_json()
        saved["scoring"] = cfg.scoring
        state.save(stage, key, saved)
    selection = HeadSelection(tuple(map(Head.parse, saved["positive_heads"])),
                              tuple(map(Head.parse, saved["negative_heads"])))
    if len(selection.positive) < cfg.k or len(selection.negative) < cfg.k:
        notes.append(f"only {len(selection.positive)} positive / {len(selection.negative)} negative heads "
                     f"passed the consistency filter (K = {cfg.k})")
    return selection, saved


def steered_methods(lm: LoadedModel, selection: HeadSelection, best: dict[str, dict[str, float]]) -> dict[str, Method]:
    """JuNE and JuICE with their tuned betas (`best[method]["beta_plus"]`, `["beta_minus"]`)."""
    return {
        METHOD_NAMES[m]: Method(Steering(m, steering_coefficients(
            lm.heads.geometry, selection, best[m]["beta_plus"], best[m]["beta_minus"])))
        for m in ("june", "juice")
    }


def ph3_methods(
    lm: LoadedModel, cfg: ReproduceConfig, state: StageFiles, large_dev: Sequence, small_dev: Sequence,
    validation: Sequence, direction: str, key_of: Callable[[Sequence], str], progress: Progress,
    notes: list[str],
) -> tuple[dict[str, Method], dict[str, Any]]:
    """PH3-l (on `large_dev`) and PH3-s (on `small_dev`, the set D), each via :func:`ph3_stage`;
    an empty development set skips its row with a note.

    Returns:
        (name -> pruning method, name -> JSON record of k and pruned heads).
    """
    methods, records = {}, {}
    if not large_dev:
        notes.append("PH3-l skipped: no development items outside D and validation")
    for name, dev_set in (("PH3-l", large_dev), ("PH3-s", small_dev)):
        if not dev_set:
            continue
        steering, records[name] = ph3_stage(lm, cfg, state, name, dev_set, validation, direction, key_of(dev_set),
                                            progress)
        methods[name] = Method(steering)
    return methods, records


def ph3_prompts(lm: LoadedModel, examples: Sequence) -> list[ConflictPrompt]:
    """PH3's development prompts: ParaConflict items give their substitution and coherent prompts,
    contextual items their prompt; each with the parametric and the context answer's first token."""
    out = []
    for ex in examples:
        if isinstance(ex, ConflictExample):
            for t in PH3_CONFLICT_TYPES:
                p = ex.prompts[t]
                out.append(ConflictPrompt(p, answer_first_token(lm.tokenizer, p, ex.answer),
                                          answer_first_token(lm.tokenizer, p, ex.context_answer)))
        else:
            out.append(ConflictPrompt(ex.prompt, answer_first_token(lm.tokenizer, ex.prompt, ex.parametric_answer),
                                      answer_first_token(lm.tokenizer, ex.prompt, ex.context_answer)))
    return out


def ph3_stage(
    lm: LoadedModel, cfg: ReproduceConfig, state: StageFiles, name: str, dev_set: Sequence, validation: Sequence,
    direction: str, key: str, progress: Progress,
) -> tuple[Steering, dict[str, Any]]:
    """PH3 for one development set: head effects (cached in the state), k tuned on `validation`.

    Returns:
        (the pruning steering, a JSON-able record: k, pruned heads, validation accuracy per k).
    """
    stem = name.lower().replace("-", "_")
    g = lm.heads.geometry
    saved = state.load(f"{stem}_{direction}", key)
    if saved is None:
        prompts = ph3_prompts(lm, dev_set)
        advance = progress(f"{name}: ablate each head on {len(prompts)} development prompts", len(prompts))
        scores = logit_difference_effects(lm, prompts, max_rows=_scoring_rows(cfg), on_prompt=lambda i: advance(1),
                                          checkpoint=UnitCheckpoint(state.folder / "units.json", lm.fingerprint()))
        per_item = len(CONFLICT_TYPES) if direction == "parametric" else 1
        advance = progress(f"{name}: k on validation", len(validation) * per_item * len(PRUNE_K))
        choice = tune_prune_k(lm, validation, scores, direction=direction, max_rows=cfg.max_rows,
                              on_progress=advance)
        saved = {"effects": scores.effects.tolist(), "clean_ld": scores.clean_ld.tolist(), "k": choice.k,
                 "validation_accuracy_by_k": {str(k): v for k, v in choice.per_k.items()},
                 "n_dev_items": len(dev_set), "n_dev_prompts": len(prompts)}
        state.save(f"{stem}_{direction}", key, saved)
    scores = Ph3Scores(torch.tensor(saved["effects"]), torch.tensor(saved["clean_ld"]))
    heads = heads_to_prune(scores, direction, saved["k"])
    info = {"k": saved["k"], "pruned": [str(h) for h in heads], "n_dev_items": saved["n_dev_items"],
            "validation_accuracy_by_k": saved["validation_accuracy_by_k"]}
    return pruning(g, heads), info


def settings_key(values: dict) -> str:
    return hashlib.sha256(json.dumps(values, default=str, sort_keys=True).encode()).hexdigest()[:16]


def write_outputs(result: ReproduceResult, results, out: Path) -> None:
    """`results.json` (settings, heads, betas, table, timings, per-item outputs) and `table.md`."""
    methods = list(result.methods)
    cfg = asdict(result.config)
    write_json_atomic(out / "results.json", {
        "config": cfg,
        "model": result.model,
        "heads": selection_to_json(result.selection),
        "betas": result.betas,
        "baselines": result.baselines,
        "table": result.table,
        "summary": result.summary,
        "timings_s": result.timings,
        "splits": result.splits,
        "notes": result.notes,
        "items": results_to_json(results),
    })
    md = markdown_table(result.table, methods, result.domains, result.titles)
    (out / "table.md").write_text(f"# Table 1 layout: {result.model['name']}\n\n{md}", encoding="utf-8")
