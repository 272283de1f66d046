"""The stages both tables share, each cached in the run's state: Stage 1 (heads), PH3's head
scores, the per-domain (per-dataset) tuning of the betas and of PH3's k, and the evaluation of
one domain; :func:`ph3_and_tuning` runs PH3 then the tuning with their timings for either
direction.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import asdict, replace
from pathlib import Path
from typing import Any

import torch

from juice.baselines.ph3 import (
    PRUNE_K,
    ConflictPrompt,
    Ph3Scores,
    heads_to_prune,
    logit_difference_effects,
    path_patching_effects,
    ph3_patching_prompts,
)
from juice.data.records import CONFLICT_TYPES, ConflictExample
from juice.engine.backend import JUICE_ENGINE, Engine, engine_or_default, stage_key
from juice.eval.runner import ItemResult, keyed, method_engine, results_from_json, results_to_json, titled
from juice.recipe import Method
from juice.eval.tuning import BETA_MINUS_GRID, BETA_PLUS_GRID, tune_per_domain
from juice.interventions import Head, HeadSelection
from juice.io import StageFiles, UnitCheckpoint, settings_key, write_json_atomic
from juice.models import LoadedModel
from juice.methods import MethodInputs, Row, build, row_key, row_title, table_methods
from juice.pipeline.run import SCORING_LABELS, ReproduceConfig, ReproduceResult, StageRun
from juice.progress import OnProgress, Progress, no_progress
from juice.stage1 import (
    HeadsArtifact,
    attribution_scores,
    hybrid_scores,
    make_artifact,
    score_heads,
    scoring_prompts,
    select_heads,
)
from juice.tokens import answer_first_token


PH3_KNOCKOUT = Row("ph3", "l-knockout").key
"""The row of PH3-l scored by knock-out instead of path patching (`ph3_knockout`)."""
PH3_ROWS = (Row("ph3", "l").key, Row("ph3", "s").key, PH3_KNOCKOUT)
"""PH3's rows in the tables (their keys, :class:`juice.methods.Row`): k chosen on the large
development set (PH3-l), on D (PH3-s), and PH3-l scored by knock-out."""
PH3_CONFLICT_TYPES = ("substitution", "coherent")
"""The conflict types whose prompts PH3's knock-out scorer reads."""


def identify_heads(
    lm: LoadedModel, cfg: ReproduceConfig, head_set: Sequence, progress: Progress,
    direction: str = "parametric", checkpoint: UnitCheckpoint | None = None, engine: Engine | None = None,
):
    """Stage 1 with the configured scoring method. Returns (scores, selection).

    With `checkpoint`, each prompt's scores are saved as soon as they are computed, so an
    interrupted Stage 1 resumes at the next prompt. `engine` computes the exact scores
    (:meth:`juice.engine.backend.Engine.intervention_probs`; None: juice's own engine).
    """
    return score_prompts(lm, cfg, scoring_prompts(lm, head_set, direction), progress, checkpoint, engine)


def identify_on_domain(lm: LoadedModel, cfg: ReproduceConfig, state: StageFiles, progress: Progress = no_progress,
                       engine: Engine | None = None, checkpoint: UnitCheckpoint | None = None,
                       **key: Any) -> HeadsArtifact:
    """`juice identify` without a data file: Stage 1 (paper Alg. 2-3) on the D of `cfg`'s head
    domain (World Capital unless `cfg.domains` names another built-in domain, or `cfg.data`'s
    head-finding file), filtered for `lm`. Only D's items need be known (no validation split).

    Args:
        cfg: the settings (`k`, `scoring`, `head_set_size`, `seed`, `data`, `domains`);
            `validation_size`, `baselines` and `limit` are ignored (0, off, 0).
        state: where the filter's stage files go (keyed on the model, the data and the seed).
        engine: what decodes and scores (:mod:`juice.engine.backend`; None: juice's own engine).
        checkpoint: where each prompt's scores are saved as soon as they are computed (a killed
            Stage 1 resumes at its next prompt); None: not saved.
        key: more of the stage keys' common part (e.g. the command).

    Returns:
        the heads artifact, its `data` naming the folder, the domain and |D|.

    Raises:
        ValueError: fewer known items than |D| (the message names the options).
    """
    from dataclasses import replace

    from juice.pipeline.domains import prepare_domains
    from juice.pipeline.run import run_key_base

    cfg = replace(cfg, validation_size=0, baselines=False, limit=0)
    base = run_key_base(lm, cfg, data=str(cfg.data), head_set_size=cfg.head_set_size, **key)
    splits, _, head_domain, _ = prepare_domains(StageRun(lm, cfg, state, progress, engine=engine_or_default(engine)),
                                                base)
    head_set = splits[head_domain].head_set
    scores, selection = identify_heads(lm, cfg, head_set, progress, checkpoint=checkpoint, engine=engine)
    artifact = make_artifact(lm, scores, selection, cfg.k, "parametric", head_set)
    artifact.data = {"folder": str(cfg.data) if cfg.data else "built-in", "domain": head_domain, "rows": len(head_set)}
    return artifact


def score_prompts(lm: LoadedModel, cfg: ReproduceConfig, prompts: Sequence, progress: Progress = no_progress,
                  checkpoint: UnitCheckpoint | None = None, engine: Engine | None = None):
    """Stage 1 (cfg.scoring: exact, attribution or hybrid) on ready scoring prompts, then Alg. 3's
    selection of cfg.k heads per sign. Returns (scores, selection). Exact scores come from
    `engine` (None: juice's own); the approximations (gradients) from juice's engine always.

    Raises:
        ValueError: an unknown scoring method.
    """
    if cfg.scoring == "attribution":
        advance = progress("stage 1: attribution (approximate)", len(prompts))
        scores = attribution_scores(lm, prompts, cfg.alphas_positive, cfg.alphas_negative,
                                    on_progress=advance, checkpoint=checkpoint)
    elif cfg.scoring == "hybrid":
        advance = progress("stage 1: attribution, then exact scores of the shortlist (approximate)", 3 * len(prompts))
        scores = hybrid_scores(lm, prompts, cfg.shortlist, cfg.alphas_positive, cfg.alphas_negative,
                               max_rows=_scoring_rows(cfg), on_progress=advance, checkpoint=checkpoint)
    elif cfg.scoring == "exact":
        advance = progress("stage 1: exact head scores", len(prompts))
        engine = engine_or_default(engine)
        scores = score_heads(lm, prompts, cfg.alphas_positive, cfg.alphas_negative, max_rows=_scoring_rows(cfg),
                             on_progress=advance, checkpoint=checkpoint, probs_many=engine.intervention_probs_many,
                             prompts_per_call=engine.prompts_per_call)
    else:
        raise ValueError(f"scoring must be exact, attribution or hybrid, not {cfg.scoring!r}")
    return scores, select_heads(scores, cfg.k)


def _scoring_rows(cfg: ReproduceConfig) -> int | str:
    """Scoring rows carry no KV cache and read one position: twice the decoding rows."""
    return cfg.max_rows if cfg.max_rows == "auto" else 2 * int(cfg.max_rows)


def heads_stage(
    run: StageRun, stage: str, key: str, head_set: Sequence, direction: str,
) -> tuple[HeadSelection, dict[str, Any]]:
    """Stage 1 on `head_set`, read from the stage file `stage` when its settings `key` match
    (per-prompt results resume from `units.json`). Notes a selection smaller than K.

    Returns:
        (selection, the heads artifact as JSON, with the scoring method and its label).
    """
    lm, cfg, state = run.lm, run.cfg, run.state
    engine = run.engine
    if cfg.scoring != "exact":
        run.ran("stage 1", "attribution patching needs gradients, which vLLM does not give")
    elif cfg.stage1_in_process:
        run.ran("stage 1", "--stage1-engine juice: its growing batch runs the layers below a scaled head once")
        engine = JUICE_ENGINE
    else:
        run.ran("stage 1")
    saved = state.load(stage, key)
    if saved is None:
        scores, selection = identify_heads(lm, cfg, head_set, run.progress, direction=direction,
                                           checkpoint=units(run), engine=engine)
        saved = make_artifact(lm, scores, selection, cfg.k, direction, head_set).to_json()
        saved["scoring"] = cfg.scoring
        saved["scoring_label"] = SCORING_LABELS[cfg.scoring]
        state.save(stage, key, saved)
    selection = HeadSelection(tuple(map(Head.parse, saved["positive_heads"])),
                              tuple(map(Head.parse, saved["negative_heads"])))
    if len(selection.positive) < cfg.k or len(selection.negative) < cfg.k:
        run.notes.append(f"only {len(selection.positive)} positive / {len(selection.negative)} negative heads "
                     f"passed the consistency filter (K = {cfg.k})")
    return selection, saved


def ph3_prompts(lm: LoadedModel, examples: Sequence) -> list[ConflictPrompt]:
    """The knock-out scorer's development prompts: ParaConflict items give their substitution and
    coherent prompts, contextual items their prompt; each with the parametric and the context
    answer's first token."""
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


def ph3_scores_stage(
    run: StageRun, name: str, dev_set: Sequence, key: str, knockout: bool = False, direction: str = "parametric",
) -> Ph3Scores:
    """PH3's head scores on one development set: path patching (Jin et al. 2024; the default) or
    the knock-out scorer (`knockout`); cached in the state, per-prompt results resumable."""
    title = row_title(name)
    stem = title.lower().replace("-", "_").replace(" ", "_").replace("(", "").replace(")", "")
    stage = f"ph3_{direction}_{stem}"   # both directions may share an output folder
    lm, cfg, state, progress = run.lm, run.cfg, run.state, run.progress
    if knockout:
        run.ran(name)
    else:
        run.ran(name, "path patching replaces a head's output with its output on another prompt, which a vLLM "
                      "request cannot ask for")
    saved = state.load(stage, key)
    if saved is None:
        checkpoint = units(run)
        if knockout:
            prompts = ph3_prompts(lm, dev_set)
            advance = progress(f"{title}: knock out each head on {len(prompts)} development prompts", len(prompts))
            scores = logit_difference_effects(lm, prompts, max_rows=_scoring_rows(cfg),
                                              on_progress=advance, checkpoint=checkpoint, engine=run.engine)
        else:
            prompts = ph3_patching_prompts(lm, dev_set)
            advance = progress(f"{title}: path patching on {len(prompts)} development prompts", len(prompts))
            scores = path_patching_effects(lm, prompts, max_rows=_scoring_rows(cfg),
                                           on_progress=advance, checkpoint=checkpoint)
        saved = {"effects": scores.effects.tolist(), "clean_ld": scores.clean_ld.tolist(),
                 "n_dev_items": len(dev_set), "n_dev_prompts": len(prompts)}
        state.save(stage, key, saved)
    return Ph3Scores(torch.tensor(saved["effects"]), torch.tensor(saved["clean_ld"]))


def ph3_stage(
    run: StageRun, large_dev: Sequence, small_dev: Sequence, key_of: Callable[[Sequence], str],
    direction: str = "parametric",
) -> dict[str, Ph3Scores]:
    """PH3-l (on `large_dev`), PH3-s (on `small_dev`, the set D) and, with `cfg.ph3_knockout`,
    PH3-l with the knock-out scorer; an empty development set skips its row with a note.

    Returns:
        row name -> head scores.
    """
    variants = [(PH3_ROWS[0], large_dev, False), (PH3_ROWS[1], small_dev, False)]
    if run.cfg.ph3_knockout:
        variants.append((PH3_KNOCKOUT, large_dev, True))
    out = {}
    for name, dev_set, knockout in variants:
        if not dev_set:
            run.notes.append(f"{row_title(name)} skipped: no development items outside D and validation")
            continue
        out[name] = ph3_scores_stage(run, name, dev_set, key_of(dev_set), knockout, direction)
    return out


def tuning_stage(
    run: StageRun, key: str, validation: dict[str, Sequence], selection: HeadSelection, ph3: dict[str, Ph3Scores],
    direction: str, head_domain: str,
) -> dict[str, dict[str, Any]]:
    """Betas and PH3's k per domain on its own validation split (:func:`juice.eval.tuning.tune_per_domain`),
    cached in the state; a tuning killed midway resumes from its decoded chunks
    (:func:`chunk_checkpoint`). A domain without validation items takes `head_domain`'s choice.

    Returns:
        domain -> {"betas": method -> {beta_plus, beta_minus, accuracy, p_answer, per_type, degeneration},
        "prune": PH3 row key -> {k, accuracy, per_k, pruned}, "chosen_on": domain, "n_validation", "grid"}
        (the state holds PH3's rows by title, as results.json does: :func:`titled_choice`).
    """
    state = run.state
    run.ran("tuning")
    saved = state.load(f"tuning_{direction}", key)
    if saved is None:
        checkpoint = chunk_checkpoint(run, f"tuning_{direction}", key)
        per_item = len(CONFLICT_TYPES) if direction == "parametric" else 1
        cfg = run.cfg
        n_settings = 2 * len(cfg.beta_plus_grid) * len(cfg.beta_minus_grid) + len(ph3) * len(PRUNE_K)
        advance = run.progress("tuning on each domain's validation split",
                           sum(map(len, validation.values())) * per_item * n_settings)
        choices = tune_per_domain(run.lm, validation, selection, ph3, direction=direction,
                                  beta_plus_grid=cfg.beta_plus_grid, beta_minus_grid=cfg.beta_minus_grid,
                                  max_rows=run.cfg.max_rows, on_progress=advance,
                                  degeneration_margin=cfg.degeneration_margin, engine=run.engine,
                                  checkpoint=checkpoint)
        saved = {}
        for domain, c in choices.items():
            saved[domain] = {
                "betas": {m: {"beta_plus": g.beta_plus, "beta_minus": g.beta_minus, "accuracy": g.accuracy,
                              "p_answer": g.p_answer, "per_type": list(g.per_type), "degeneration": g.degeneration}
                          for m, g in c.betas.items()},
                "prune": {row_title(n): {"k": p.k, "accuracy": p.accuracy,
                                         "per_k": {str(k): v for k, v in p.per_k.items()}}
                          for n, p in c.prune.items()},
                "chosen_on": domain, "n_validation": c.n_validation,
                "grid": [{f: v for f, v in asdict(g).items() if f != "k"} for g in c.grid],   # beta points: no k
            }
        state.save(f"tuning_{direction}", key, saved)
        checkpoint.path.unlink(missing_ok=True)
    saved = {d: {**c, "prune": {row_key(n): p for n, p in c["prune"].items()}} for d, c in saved.items()}
    if head_domain not in saved:
        raise ValueError(f"no validation items in {head_domain}: nothing to tune the betas on")
    out = {}
    for domain in validation:
        if domain in saved:
            out[domain] = saved[domain]
        else:
            run.notes.append(f"{domain}: no validation item the model knows; betas and k from {head_domain}")
            out[domain] = {**saved[head_domain], "chosen_on": head_domain, "grid": []}
    for domain, choice in out.items():
        for name, p in choice["prune"].items():
            p["pruned"] = [str(h) for h in heads_to_prune(ph3[name], direction, p["k"])]
    return out


def domain_methods(lm: LoadedModel, selection: HeadSelection, choice: dict[str, Any], baselines: bool,
                   ph3_rows: Sequence[str], table: str, instructed: bool = True) -> dict[str, Method]:
    """The rows of `table` (:data:`juice.methods.TABLES`) for one domain, row key -> recipe, in the
    registry's order (:func:`juice.methods.table_methods`): Original; with `baselines`, each
    baseline (Prompt where `instructed`, the contrastive methods, any other entry of the table);
    PH3's rows `ph3_rows` that the domain's choice has a k for; the tuned steerings (JuNE, JuICE)
    with the domain's betas.

    Raises:
        KeyError: a tuned steering of the table without betas in `choice`.
    """
    g = lm.geometry
    methods: dict[str, Method] = {}
    for spec in table_methods(table):
        if spec.tuned == "k":   # PH3: a row per development set, with the domain's k
            for name in ph3_rows:
                if name in choice["prune"]:
                    pruned = [Head.parse(h) for h in choice["prune"][name]["pruned"]]
                    methods[name] = build(spec.name, MethodInputs(g, pruned=pruned)).method
        elif spec.tuned == "betas":
            b = choice["betas"][spec.name]
            methods[spec.name] = build(spec.name, MethodInputs(g, selection, beta_plus=b["beta_plus"],
                                                               beta_minus=b["beta_minus"])).method
        elif not spec.baseline or (baselines and (instructed or not spec.per_instruction)):
            methods[spec.name] = build(spec.name, MethodInputs(g)).method
    return methods


def evaluation_stage(
    run: StageRun, stage: str, key: str, description: str, total: int,
    evaluate_items: Callable[[OnProgress, UnitCheckpoint], list[ItemResult]],
) -> list[ItemResult]:
    """One domain's (dataset's) evaluation, read from the stage file `stage` when its settings
    `key` match, else `evaluate_items(advance, checkpoint)` (a progress bar of `total` steps, the
    stage's :func:`chunk_checkpoint`, which a killed evaluation resumes from) and saved, its rows
    by title (:func:`titled`; returned by key)."""
    rows = run.state.load(stage, key)
    if rows is None:
        checkpoint = chunk_checkpoint(run, stage, key)
        rows = results_to_json(titled(evaluate_items(run.progress(description, total), checkpoint)))
        run.state.save(stage, key, rows)
        checkpoint.path.unlink(missing_ok=True)
    return keyed(results_from_json(rows))


def titled_choice(choice: dict[str, Any]) -> dict[str, Any]:
    """A domain's choice (:func:`tuning_stage`) with PH3's rows by title, as results.json and the
    stage keys hold it."""
    return {**choice, "prune": {row_title(n): p for n, p in choice.get("prune", {}).items()}}


def titled_result(result: ReproduceResult) -> ReproduceResult:
    """`result` as the files show it: its tables, rows, PH3 choices, summary and row engines named
    by title (:func:`juice.methods.row_title`)."""
    table = lambda t: None if t is None else t.titled()   # noqa: E731
    engines = None if result.engines is None else {
        **result.engines, **{part: {row_title(k): v for k, v in result.engines.get(part, {}).items()}
                             for part in ("stages", "rows")}}
    return replace(result, table=table(result.table), table_known=table(result.table_known),
                   degeneration=table(result.degeneration), correct_not_degenerate=table(result.correct_not_degenerate),
                   likelihood=table(result.likelihood), methods=tuple(map(row_title, result.methods)),
                   choices={d: titled_choice(c) for d, c in result.choices.items()},
                   summary={row_title(m): v for m, v in result.summary.items()},
                   contexts=None if result.contexts is None else {k: t.titled() for k, t in result.contexts.items()},
                   engines=engines)


def chunk_checkpoint(run: StageRun, stage: str, key: str) -> UnitCheckpoint:
    """Where stage `stage` (settings `key`) keeps its decoded chunks while it runs
    (`<out>/state/<stage>.chunks.json`, :func:`juice.engine.generate`'s `checkpoint`): a run
    killed within the stage decodes only the chunks it had not finished, with the same results.
    Scoped to the stage, its key, the model and (where it is not juice's own) the engine; the
    stage deletes it once its result is saved."""
    return UnitCheckpoint(run.state.folder / f"{stage}.chunks.json",
                          {"stage": stage, "key": key, **run.lm.fingerprint(), **stage_key(run.engine)})


def units(run: StageRun) -> UnitCheckpoint:
    """The run's per-prompt checkpoint of its sweeps (`<out>/state/units.json`), scoped to the
    model and, where it is not juice's own, the engine."""
    scope = run.lm.fingerprint()
    return UnitCheckpoint(run.state.folder / "units.json", {**scope, **stage_key(run.engine)})


def ph3_scoring(choices: dict[str, dict[str, Any]]) -> dict[str, str]:
    """PH3 row -> how its heads were scored ("path patching", Jin et al. 2024, the default; or
    "knock-out"), for the rows in `choices` (results.json's "protocol")."""
    rows = dict.fromkeys(n for c in choices.values() for n in c.get("prune", {}))
    return {row_title(n): "knock-out" if row_key(n) == PH3_KNOCKOUT else "path patching" for n in rows}


STAGE1_SETTINGS = ("k", "scoring", "shortlist", "alphas_positive", "alphas_negative")
"""The settings Stage 1's result depends on besides the model and D (in its stage key)."""


def stage1_key(base: dict[str, Any], cfg: ReproduceConfig, **data: Any) -> str:
    """Stage 1's key: the run's common part (:func:`juice.pipeline.run.run_key_base`), what
    identifies D (`data`), and :data:`STAGE1_SETTINGS`."""
    return settings_key({**base, **data, **{f: getattr(cfg, f) for f in STAGE1_SETTINGS}})


def ph3_and_tuning(
    run: StageRun, base: dict[str, Any], key_heads: str, selection: HeadSelection, large_dev: Sequence,
    small_dev: Sequence, validation: dict[str, Sequence], direction: str, head_domain: str,
    timings: dict[str, float],
) -> tuple[dict[str, Ph3Scores], dict[str, dict[str, Any]], str]:
    """Stages 3 and 4 of either table: PH3's head scores (with `cfg.baselines`; PH3-l on
    `large_dev`, PH3-s on `small_dev`, the set D) then the tuning of every domain (dataset) on
    its own validation split; their wall times go into `timings` ("ph3_heads", "tuning").

    Returns:
        (PH3 row -> head scores, domain -> choice (:func:`tuning_stage`), the tuning's key).
    """
    t = time.perf_counter()
    ph3: dict[str, Ph3Scores] = {}
    if run.cfg.baselines:
        ph3 = ph3_stage(run, large_dev, small_dev, lambda d: settings_key({**base, "dev": [ex.to_json() for ex in d]}),
                        direction=direction)
    timings["ph3_heads"] = time.perf_counter() - t
    t = time.perf_counter()
    grids = (tuple(run.cfg.beta_plus_grid), tuple(run.cfg.beta_minus_grid))
    # the paper's grid is not in the key, so runs saved before the grid was a setting stay valid
    other_grid = {} if grids == (BETA_PLUS_GRID, BETA_MINUS_GRID) else {"grid": grids}
    if run.cfg.degeneration_margin is not None:   # juice's option; the paper's runs keep their keys
        other_grid["degeneration_margin"] = float(run.cfg.degeneration_margin)
    key_tuning = settings_key({"heads": key_heads, "ph3": {row_title(n): s.effects.tolist() for n, s in ph3.items()},
                               "validation": {d: [ex.to_json() for ex in v] for d, v in validation.items()},
                               **other_grid})
    choices = tuning_stage(run, key_tuning, validation, selection, ph3, direction, head_domain)
    timings["tuning"] = time.perf_counter() - t
    return ph3, choices, key_tuning


def protocol_stages(
    run: StageRun, base: dict[str, Any], key_heads: str, splits: Mapping[str, Any], head_domain: str, direction: str,
    heads_file: Path, timings: dict[str, float],
) -> tuple[HeadSelection, dict[str, Ph3Scores], dict[str, dict[str, Any]], str]:
    """Stages 2 to 4 of either table, the paper's protocol before the test split: Stage 1 on the
    head domain's set D (:func:`heads_stage`, stage file `heads_file`'s stem), the heads file
    written to `heads_file`, then PH3's scores and every domain's tuning (:func:`ph3_and_tuning`);
    wall times into `timings` ("stage1_heads", "ph3_heads", "tuning").

    Args:
        splits: domain (dataset) -> its split, with `head_set`, `ph3_dev` and `validation`.

    Returns:
        (the selection, PH3 row -> head scores, domain -> choice, the tuning's key).
    """
    t = time.perf_counter()
    head = splits[head_domain]
    selection, saved = heads_stage(run, heads_file.stem, key_heads, head.head_set, direction)
    write_json_atomic(heads_file, saved)
    timings["stage1_heads"] = time.perf_counter() - t
    validation = {d: list(sp.validation) for d, sp in splits.items()}
    ph3, choices, key_tuning = ph3_and_tuning(run, base, key_heads, selection, head.ph3_dev, head.head_set,
                                              validation, direction, head_domain, timings)
    return selection, ph3, choices, key_tuning


def evaluate_test_splits(
    run: StageRun, splits: Mapping[str, Any], methods_of: Callable[[str], dict[str, Method]],
    choices: Mapping[str, dict[str, Any]], key_tuning: str, stage: str, titles: Mapping[str, str],
    units_per_item: int, evaluate_items: Callable[..., list[ItemResult]], timings: dict[str, float],
    key_extra: Callable[[Any], dict[str, Any]] = lambda split: {},
) -> tuple[list[ItemResult], list[str]]:
    """Stage 5 of either table: every domain's (dataset's) test split under its methods, one
    resumable :func:`evaluation_stage` per domain; wall time into `timings["evaluation"]`.

    A domain's stage key holds the tuning's key, its choice and its rows, both by title
    (:func:`titled_choice`, :func:`juice.methods.row_title`: keys do not depend on how rows are
    named in memory), its test items, and `key_extra(split)`.

    Args:
        methods_of: domain -> its rows (row key -> method).
        choices: domain -> its tuning choice (:func:`tuning_stage`).
        key_tuning: the tuning stage's key.
        stage: the stage file's name, `{}` standing for the domain.
        units_per_item: progress units per test item and method (its prompts).
        evaluate_items: :func:`juice.eval.runner.evaluate` or `evaluate_contextual`.

    Returns:
        (every item's results, the rows in table order; by key).
    """
    t = time.perf_counter()
    results: list[ItemResult] = []
    order: list[str] = []
    run.ran("evaluation")
    for domain, sp in splits.items():
        methods = methods_of(domain)
        order += [m for m in methods if m not in order]
        for name, method in methods.items():
            where = method_engine(method, run.engine)
            run.row_engines[name] = where
            if where != run.engine.name:
                note = f"{row_title(name)} ran on juice's engine: {where[len('juice ('):-1]}"
                if note not in run.notes:
                    run.notes.append(note)
        key = {"tuning": key_tuning, "choice": titled_choice(choices[domain]),
               "methods": [row_title(m) for m in methods], "test": [ex.to_json() for ex in sp.test], **key_extra(sp)}
        results += evaluation_stage(
            run, stage.format(domain), settings_key(key),
            f"evaluate {titles.get(domain, domain)}", len(sp.test) * units_per_item * len(methods),
            lambda advance, checkpoint, sp=sp, methods=methods: evaluate_items(
                run.lm, sp.test, methods, max_rows=run.cfg.max_rows, on_progress=advance, engine=run.engine,
                checkpoint=checkpoint))
    timings["evaluation"] = time.perf_counter() - t
    return results, order
