"""The main job: the paper's Table 1 (parametric direction) on one model, by the paper's protocol
(`../shared/PROTOCOL.md`), end to end.

Stages (each written atomically to `<out>/state/` under a key derived from everything it
depends on, and reused when re-run, so an interrupted run resumes where it stopped):

1. data: every domain (the six built-in ones, or the paper's folder layout via `data`) gives a
   development pool and a test split (reported unfiltered, paper Table 1). The pool is
   *filtered* for the loaded model: its clean prompts are decoded greedily, in the pool's seeded
   order, until enough items are answered correctly; from those known items come, in order, D
   (|D| = 4, World Capital only), the domain's own validation split and (World Capital) PH3-l's
   development set. Every item's answer is the alias the model prefers (:mod:`juice.aliases`).
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

The contextual direction (Table 2) is :mod:`juice.experiments.table2`.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import Any

import torch

from juice.aliases import prefer_aliases
from juice.baselines.ph3 import (
    PRUNE_K,
    ConflictPrompt,
    Ph3Scores,
    heads_to_prune,
    logit_difference_effects,
    path_patching_effects,
    ph3_patching_prompts,
    pruning,
)
from juice.data.paraconflict import DOMAINS, build_domain
from juice.data.records import CONFLICT_TYPES, ConflictExample
from juice.data.splits import DomainPool, Splits, load_paper_domains, split_test
from juice.eval.metrics import is_correct
from juice.eval.report import difference_markdown, interval_markdown, table1_columns
from juice.eval.runner import ItemResult, Method, evaluate, results_from_json, results_to_json, summary
from juice.eval.tables import IntervalTable, interval_table
from juice.eval.tuning import BETA_MINUS_GRID, BETA_PLUS_GRID, tune_per_domain
from juice.interventions import HeadSelection
from juice.stage1 import ALPHAS_NEGATIVE, ALPHAS_POSITIVE, attribution_scores, hybrid_scores, make_artifact, score_heads, scoring_prompts, select_heads
from juice.interventions import Head
from juice.io import StageFiles, UnitCheckpoint, settings_key, write_json_atomic
from juice.models import DEFAULT_MODEL, LoadedModel, load_model
from juice.steering import Steering, steering_coefficients
from juice.tokens import answer_first_token

HEAD_DOMAIN = "world_capital"
METHOD_NAMES = {"original": "Original", "june": "JuNE", "juice": "JuICE"}
TABLE1_METHODS = ("Original", "Prompt", "PH3-l", "PH3-s", "JuNE", "JuICE")
PH3_KNOCKOUT = "PH3-l (knock-out)"
PH3_CONFLICT_TYPES = ("substitution", "coherent")
SCORING_LABELS = {
    "exact": "exact Stage 1 (paper Alg. 2)",
    "hybrid": "APPROXIMATE Stage 1: attribution shortlist + exact re-score (not the paper's)",
    "attribution": "APPROXIMATE Stage 1: attribution patching only (not the paper's)",
}
FILTER_CHUNK = 24

Progress = Callable[[str, int], Callable[[int], None]]
"""(description, total) -> advance(n): how the pipeline reports progress (e.g. rich bars)."""


def no_progress(description: str, total: int) -> Callable[[int], None]:
    """The `progress` callback that shows nothing: given a task's description and its number of
    steps, returns the function called with each step count done."""
    return lambda n: None


@dataclass
class StageRun:
    """What every stage of a run shares: the model, the configuration, the stage files under
    `<out>/state/`, the progress callback, and the notes the report will carry (stages append).
    """

    lm: LoadedModel
    cfg: "ReproduceConfig"
    state: StageFiles
    progress: Progress = no_progress
    notes: list[str] = field(default_factory=list)


DEFAULT_TEST_ITEMS = {"parametric": 30, "contextual": 20}
"""Test items per domain / dataset by default: as many as fit 20 minutes on 2 CPU cores (README)."""


@dataclass
class ReproduceConfig:
    """Settings of `juice reproduce` (both directions). The defaults run the paper's protocol
    (exact Stage 1, per-domain tuning) sized to fit 20 minutes per direction on 2 CPU cores with
    Gemma 3 270M (README, "Wall time"); `juice reproduce --full` uses every item."""

    model: str = DEFAULT_MODEL
    out_dir: Path = Path("juice-output")
    limit: int | None | str = "default"  # test items per domain (dataset); None = all; "default" =
                                         # DEFAULT_TEST_ITEMS of the direction
    validation_size: int | None = 4     # known validation items per domain; None = all
    head_set_size: int = 4
    k: int = 5
    scoring: str = "exact"              # exact (the paper) | attribution | hybrid (approximations)
    shortlist: int = 12                 # heads per sign re-scored exactly (hybrid)
    alphas_positive: tuple[float, ...] = ALPHAS_POSITIVE
    alphas_negative: tuple[float, ...] = ALPHAS_NEGATIVE
    seed: int = 0
    data: Path | None = None            # the paper's ParaConflict layout (one folder per domain)
    domains: tuple[str, ...] = tuple(DOMAINS)
    filter: bool = True                 # filter D / validation / PH3-l items for the model
    max_rows: int | str = 128           # rows per batched forward, or "auto" (a share of free memory)
    device: str = "auto"                # auto | cpu | cuda | mps (ignored with device_map)
    device_map: str | None = None       # e.g. "auto": shard over GPUs with accelerate
    dtype: str = "float32"              # float32 | bfloat16 | float16
    baselines: bool = True              # Prompt and PH3 rows (and CAD, AdaCAD in the contextual direction)
    ph3_knockout: bool = False          # also PH3-l with the knock-out scorer, a row of its own
    ph3_dev_size: int | None = 12       # PH3-l development items (the paper: 200); None = all
    data_root: Path | None = None       # contextual: folder with memotrap/ and nqswap/
    validation_per_dataset: int | None = 5  # contextual: validation items per dataset
    bootstrap_resamples: int = 2000

    def test_limit(self, direction: str) -> int | None:
        """Test items per domain (parametric) or dataset (contextual); None = all.

        Raises:
            ValueError: `limit` is negative or a string other than "default".
        """
        if self.limit == "default":
            return DEFAULT_TEST_ITEMS[direction]
        if self.limit is not None and (not isinstance(self.limit, int) or self.limit < 0):
            raise ValueError(f"limit must be a non-negative number of items, None or 'default', not {self.limit!r}")
        return self.limit


@dataclass
class ReproduceResult:
    """What :func:`reproduce` (and :func:`juice.experiments.table2.reproduce_contextual`)
    return; `results.json` holds the same, plus every item's outputs."""

    config: ReproduceConfig
    model: dict[str, Any]
    selection: HeadSelection
    choices: dict[str, dict[str, Any]]          # domain -> betas, PH3 k and pruned heads, provenance
    table: IntervalTable                        # unfiltered test split
    table_known: IntervalTable | None           # test items the model knows (parametric)
    summary: dict[str, dict[str, float]]
    timings: dict[str, float]
    splits: dict[str, dict[str, int]]
    domains: list[str]
    titles: dict[str, str]
    notes: list[str] = field(default_factory=list)
    methods: tuple[str, ...] = TABLE1_METHODS
    likelihood: IntervalTable | None = None     # contextual: MemoTrap by likelihood comparison
    head_domain: str = "world_capital"          # whose D the heads come from


# ---------------------------------------------------------------- 1. data


def domain_sources(cfg: ReproduceConfig) -> tuple[dict[str, DomainPool], dict[str, str]]:
    """Every domain's development pool and test split (cut to `cfg.test_limit`), and its title.

    Built-in domains: half of the items (seeded) are the test split, the rest the pool in seeded
    order. With `cfg.data`: the paper's layout (:func:`juice.data.splits.load_paper_domains`).
    """
    if cfg.data is not None:
        sources = load_paper_domains(cfg.data, cfg.head_set_size)
        titles = {d: DOMAINS[d].title if d in DOMAINS else d.replace("_", " ").title() for d in sources}
    else:
        sources = {}
        for domain in cfg.domains:
            pool, test = split_test(build_domain(domain, cfg.seed), cfg.seed)
            sources[domain] = DomainPool(tuple(pool), tuple(test))
        titles = {d: DOMAINS[d].title for d in sources}
    limit = cfg.test_limit("parametric")
    return {d: replace(s, test=s.test if limit is None else s.test[:limit]) for d, s in sources.items()}, titles


def clean_outputs(lm: LoadedModel, examples: Sequence[ConflictExample], max_rows: int | str,
                  on_progress: Callable[[int], None] | None = None) -> list[str]:
    """The unmodified model's greedy continuation (10 new tokens) of each clean prompt."""
    results = evaluate(lm, examples, {"Original": Steering()}, ("clean",), max_rows=max_rows, on_progress=on_progress)
    return [r.output for r in results]


def filter_domain(
    run: StageRun, key: str, domain: str, source: DomainPool, need: int | None,
) -> tuple[list[ConflictExample], list[ConflictExample], dict[str, int]]:
    """The pool's items the model knows, in pool order, until `need` are found (None: all), and
    the test split; both with each item's preferred alias first.

    Known = the greedy clean-prompt output contains an accepted answer (exact match). Pool
    items are decoded in chunks of `FILTER_CHUNK` only until `need` are known. Without
    `cfg.filter`, every pool item counts as known, and the first `need` (the items D, validation
    and PH3-l are drawn from) are decoded for their preferred alias, which for an item the model
    does not know is the alias whose first token is most probable.

    Returns:
        (known pool items, test items, counts: pool, decoded, known).
    """
    lm, cfg, state, progress = run.lm, run.cfg, run.state, run.progress
    stage = f"filter_{domain}_{key}"   # one file per model, data and seed: several can share a folder
    saved = state.load(stage, key)
    if saved is None:
        test = list(source.test)
        advance = progress(f"{domain}: clean prompts of the test split (answer aliases)", len(test))
        saved = {"test_outputs": clean_outputs(lm, test, cfg.max_rows, advance) if test else [], "pool_outputs": []}
        if cfg.filter:
            advance = progress(f"{domain}: filter the development pool (clean prompts)", len(source.pool))
            outputs: list[str] = []
            known = 0
            while len(outputs) < len(source.pool) and (need is None or known < need):
                chunk = list(source.pool[len(outputs): len(outputs) + FILTER_CHUNK])
                new = clean_outputs(lm, chunk, cfg.max_rows, advance)
                known += sum(is_correct(o, ex.answers) for o, ex in zip(new, chunk))
                outputs += new
            saved["pool_outputs"] = outputs
        else:   # no filter: the items used (the first `need`) still get the preferred alias
            used = list(source.pool if need is None else source.pool[:need])
            advance = progress(f"{domain}: clean prompts of the development items (answer aliases)", len(used))
            outputs = clean_outputs(lm, used, cfg.max_rows, advance) if used else []
            used = prefer_aliases(lm, used, outputs, max_rows=cfg.max_rows) if used else []
            saved["pool_outputs"], saved["pool_answers"] = outputs, [list(ex.answers) for ex in used]
        test_items = prefer_aliases(lm, test, saved["test_outputs"], max_rows=cfg.max_rows) if test else []
        saved["test_answers"] = [list(ex.answers) for ex in test_items]
        state.save(stage, key, saved)
    test_items = [replace(ex, answers=tuple(a)) for ex, a in zip(source.test, saved["test_answers"])]
    if not cfg.filter:
        used = [replace(ex, answers=tuple(a)) for ex, a in zip(source.pool, saved["pool_answers"])]
        items = used + list(source.pool[len(used):])
        return items, test_items, {"pool": len(source.pool), "decoded": len(used), "known": len(items)}
    outputs = saved["pool_outputs"]
    decoded = list(source.pool[: len(outputs)])
    known = [(ex, o) for ex, o in zip(decoded, outputs) if is_correct(o, ex.answers)]
    # a known item's alias is found in its output: no probabilities needed
    known_items = prefer_aliases(lm, [ex for ex, _ in known], [o for _, o in known])
    return known_items, test_items, {"pool": len(source.pool), "decoded": len(outputs), "known": len(known_items)}


def prepare_domains(
    run: StageRun, base: dict,
) -> tuple[dict[str, Splits], dict[str, str], str, dict[str, dict[str, int]]]:
    """Stage 1 of the module docstring for every domain.

    Returns:
        (domain -> splits with D (head domain only), validation, PH3-l development set (head
        domain only) and test; domain -> title; the head domain; domain -> filter counts).

    Raises:
        ValueError: the head domain has fewer known items than |D| + 1.
    """
    cfg = run.cfg
    sources, titles = domain_sources(cfg)
    head_domain = HEAD_DOMAIN if HEAD_DOMAIN in sources else next(iter(sources))
    splits, counts = {}, {}
    for domain, source in sources.items():
        is_head = domain == head_domain
        parts = [cfg.validation_size]
        if is_head:
            parts += [cfg.head_set_size, cfg.ph3_dev_size if cfg.baselines else 0]
        need = None if any(p is None for p in parts) else sum(parts)
        key = settings_key({**base, "stage": "filter", "domain": domain, "filter": cfg.filter, "need": need,
                            "pool": [ex.to_json() for ex in source.pool], "test": [ex.to_json() for ex in source.test]})
        known, test, counts[domain] = filter_domain(run, key, domain, source, need)
        head_set: list[ConflictExample] = []
        if is_head:
            if len(known) < cfg.head_set_size + 1:
                raise ValueError(
                    f"{titles[domain]}: only {len(known)} development items are answered correctly on the clean "
                    f"prompt; need at least {cfg.head_set_size + 1} for a head identification set of "
                    f"{cfg.head_set_size} and validation")
            head_set, known = known[: cfg.head_set_size], known[cfg.head_set_size:]
        if cfg.validation_size is not None:
            n_val = cfg.validation_size
        elif is_head and cfg.baselines:
            n_val = (len(known) + 1) // 2   # all items (--full): half for validation, the rest for PH3-l
        else:
            n_val = len(known)
        validation, rest = known[:n_val], known[n_val:]
        ph3_dev = (rest if cfg.ph3_dev_size is None else rest[: cfg.ph3_dev_size]) if is_head and cfg.baselines else []
        splits[domain] = Splits(tuple(head_set), tuple(validation), tuple(test), tuple(ph3_dev))
    return splits, titles, head_domain, counts


# ---------------------------------------------------------------- 2. heads


def identify_heads(
    lm: LoadedModel, cfg: ReproduceConfig, head_set: Sequence, progress: Progress,
    direction: str = "parametric", checkpoint: UnitCheckpoint | None = None,
):
    """Stage 1 with the configured scoring method. Returns (scores, selection).

    With `checkpoint`, each prompt's scores are saved as soon as they are computed, so an
    interrupted Stage 1 resumes at the next prompt.
    """
    return score_prompts(lm, cfg, scoring_prompts(lm, head_set, direction), progress, checkpoint)


def score_prompts(lm: LoadedModel, cfg: ReproduceConfig, prompts: Sequence, progress: Progress = no_progress,
                  checkpoint: UnitCheckpoint | None = None):
    """Stage 1 (cfg.scoring: exact, attribution or hybrid) on ready scoring prompts, then Alg. 3's
    selection of cfg.k heads per sign. Returns (scores, selection).

    Raises:
        ValueError: an unknown scoring method.
    """
    if cfg.scoring == "attribution":
        advance = progress("stage 1: attribution (approximate)", len(prompts))
        scores = attribution_scores(lm, prompts, cfg.alphas_positive, cfg.alphas_negative,
                                    on_prompt=lambda i: advance(1), checkpoint=checkpoint)
    elif cfg.scoring == "hybrid":
        advance = progress("stage 1: attribution, then exact scores of the shortlist (approximate)", 3 * len(prompts))
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
    """{"positive": ["L6H3", ...], "negative": [...]}: the heads, named from 0."""
    return {"positive": [str(h) for h in sel.positive], "negative": [str(h) for h in sel.negative]}


def heads_stage(
    run: StageRun, stage: str, key: str, head_set: Sequence, direction: str,
) -> tuple[HeadSelection, dict[str, Any]]:
    """Stage 1 on `head_set`, read from the stage file `stage` when its settings `key` match
    (per-prompt results resume from `units.json`). Notes a selection smaller than K.

    Returns:
        (selection, the heads artifact as JSON, with the scoring method and its label).
    """
    lm, cfg, state = run.lm, run.cfg, run.state
    saved = state.load(stage, key)
    if saved is None:
        scores, selection = identify_heads(lm, cfg, head_set, run.progress, direction=direction,
                                           checkpoint=UnitCheckpoint(state.folder / "units.json", lm.fingerprint()))
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


# ---------------------------------------------------------------- 3. PH3


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
    stem = name.lower().replace("-", "_").replace(" ", "_").replace("(", "").replace(")", "")
    stage = f"ph3_{direction}_{stem}"   # both directions may share an output folder
    lm, cfg, state, progress = run.lm, run.cfg, run.state, run.progress
    saved = state.load(stage, key)
    if saved is None:
        checkpoint = UnitCheckpoint(state.folder / "units.json", lm.fingerprint())
        if knockout:
            prompts = ph3_prompts(lm, dev_set)
            advance = progress(f"{name}: knock out each head on {len(prompts)} development prompts", len(prompts))
            scores = logit_difference_effects(lm, prompts, max_rows=_scoring_rows(cfg),
                                              on_prompt=lambda i: advance(1), checkpoint=checkpoint)
        else:
            prompts = ph3_patching_prompts(lm, dev_set)
            advance = progress(f"{name}: path patching on {len(prompts)} development prompts", len(prompts))
            scores = path_patching_effects(lm, prompts, max_rows=_scoring_rows(cfg),
                                           on_prompt=lambda i: advance(1), checkpoint=checkpoint)
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
    variants = [("PH3-l", large_dev, False), ("PH3-s", small_dev, False)]
    if run.cfg.ph3_knockout:
        variants.append((PH3_KNOCKOUT, large_dev, True))
    out = {}
    for name, dev_set, knockout in variants:
        if not dev_set:
            run.notes.append(f"{name} skipped: no development items outside D and validation")
            continue
        out[name] = ph3_scores_stage(run, name, dev_set, key_of(dev_set), knockout, direction)
    return out


# ---------------------------------------------------------------- 4. tuning


def tuning_stage(
    run: StageRun, key: str, validation: dict[str, Sequence], selection: HeadSelection, ph3: dict[str, Ph3Scores],
    direction: str, head_domain: str,
) -> dict[str, dict[str, Any]]:
    """Betas and PH3's k per domain on its own validation split (:func:`juice.eval.tuning.tune_per_domain`),
    cached in the state. A domain without validation items takes `head_domain`'s choice.

    Returns:
        domain -> {"betas": method -> {beta_plus, beta_minus, accuracy, p_answer, per_type},
        "prune": PH3 row -> {k, accuracy, per_k, pruned}, "chosen_on": domain, "n_validation", "grid"}.
    """
    state = run.state
    saved = state.load(f"tuning_{direction}", key)
    if saved is None:
        per_item = len(CONFLICT_TYPES) if direction == "parametric" else 1
        n_settings = 2 * len(BETA_PLUS_GRID) * len(BETA_MINUS_GRID) + len(ph3) * len(PRUNE_K)
        advance = run.progress("tuning on each domain's validation split",
                           sum(map(len, validation.values())) * per_item * n_settings)
        choices = tune_per_domain(run.lm, validation, selection, ph3, direction=direction,
                                  max_rows=run.cfg.max_rows, on_progress=advance)
        saved = {}
        for domain, c in choices.items():
            saved[domain] = {
                "betas": {m: {"beta_plus": g.beta_plus, "beta_minus": g.beta_minus, "accuracy": g.accuracy,
                              "p_answer": g.p_answer, "per_type": list(g.per_type)} for m, g in c.betas.items()},
                "prune": {n: {"k": p.k, "accuracy": p.accuracy, "per_k": {str(k): v for k, v in p.per_k.items()}}
                          for n, p in c.prune.items()},
                "chosen_on": domain, "n_validation": c.n_validation,
                "grid": [{f: v for f, v in asdict(g).items() if f != "k"} for g in c.grid],   # beta points: no k
            }
        state.save(f"tuning_{direction}", key, saved)
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
                   ph3_rows: Sequence[str], instructed: bool = True) -> dict[str, Method]:
    """The table's rows for one domain: Original, Prompt, the PH3 rows with the domain's k, and
    JuNE and JuICE with the domain's betas."""
    g = lm.heads.geometry
    methods: dict[str, Method] = {"Original": Method()}
    if baselines and instructed:
        methods["Prompt"] = Method(instructed=True)
    for name in ph3_rows:
        if name in choice["prune"]:
            methods[name] = Method(pruning(g, [Head.parse(h) for h in choice["prune"][name]["pruned"]]))
    for m in ("june", "juice"):
        b = choice["betas"][m]
        methods[METHOD_NAMES[m]] = Method(Steering(m, steering_coefficients(g, selection, b["beta_plus"],
                                                                            b["beta_minus"])))
    return methods


# ---------------------------------------------------------------- the pipeline


def evaluation_stage(
    run: StageRun, stage: str, key: str, description: str, total: int,
    evaluate_items: Callable[[Callable[[int], None]], list[ItemResult]],
) -> list[ItemResult]:
    """One domain's (dataset's) evaluation, read from the stage file `stage` when its settings
    `key` match, else `evaluate_items(advance)` (a progress bar of `total` steps) and saved."""
    rows = run.state.load(stage, key)
    if rows is None:
        rows = results_to_json(evaluate_items(run.progress(description, total)))
        run.state.save(stage, key, rows)
    return results_from_json(rows)


def start_run(cfg: ReproduceConfig, lm: LoadedModel | None, progress: Progress = no_progress,
              ) -> tuple[StageRun, dict[str, float]]:
    """The run's shared context (the model, loaded unless given; the stage files under
    `<out>/state/`) and the timings with the load time."""
    t = time.perf_counter()
    lm = lm or load_model(cfg.model, dtype=getattr(torch, cfg.dtype), device_map=cfg.device_map, device=cfg.device)
    return StageRun(lm, cfg, StageFiles(Path(cfg.out_dir) / "state"), progress), {"load_model": time.perf_counter() - t}


def run_key_base(lm: LoadedModel, cfg: ReproduceConfig, **extra: Any) -> dict[str, Any]:
    """What every stage key holds: the model (weights, tokenizer), the juice version, the seed."""
    from juice import __version__

    return {"model": lm.fingerprint(), "juice": __version__, "seed": cfg.seed, **extra}


def reproduce(cfg: ReproduceConfig, progress: Progress = no_progress, lm: LoadedModel | None = None) -> ReproduceResult:
    """Run the whole pipeline (module docstring) and write `results.json`, `table.md`,
    `table.png`, `table_known.png` and `heads.json` to `cfg.out_dir`.

    Raises:
        ValueError: too few known items for D and validation in the head domain; bad settings.
        FileNotFoundError: `cfg.data` is not a ParaConflict folder (raised before the model loads,
            as is a ValueError for a malformed data file).
    """
    if cfg.scoring not in SCORING_LABELS:
        raise ValueError(f"scoring must be exact, attribution or hybrid, not {cfg.scoring!r}")
    out = Path(cfg.out_dir)
    domain_sources(cfg)   # bad data fails here, in one line, before the model loads
    run, timings = start_run(cfg, lm, progress)
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

    t = time.perf_counter()
    key_heads = settings_key({**base, "head_set": [ex.to_json() for ex in dev.head_set], **{f: getattr(cfg, f) for f in (
        "k", "scoring", "shortlist", "alphas_positive", "alphas_negative")}})
    selection, artifact_json = heads_stage(run, "heads", key_heads, dev.head_set, "parametric")
    write_json_atomic(out / "heads.json", artifact_json)
    timings["stage1_heads"] = time.perf_counter() - t

    t = time.perf_counter()
    ph3: dict[str, Ph3Scores] = {}
    if cfg.baselines:
        ph3 = ph3_stage(run, dev.ph3_dev, dev.head_set, lambda d: settings_key({**base, "dev": [ex.to_json() for ex in d]}))
    timings["ph3_heads"] = time.perf_counter() - t

    t = time.perf_counter()
    validation = {d: list(s.validation) for d, s in splits.items()}
    key_tuning = settings_key({"heads": key_heads, "ph3": {n: s.effects.tolist() for n, s in ph3.items()},
                               "validation": {d: [ex.to_json() for ex in v] for d, v in validation.items()}})
    choices = tuning_stage(run, key_tuning, validation, selection, ph3, "parametric", head_domain)
    timings["tuning"] = time.perf_counter() - t

    t = time.perf_counter()
    all_results = []
    methods_order: list[str] = []
    for domain, sp in splits.items():
        methods = domain_methods(lm, selection, choices[domain], cfg.baselines, list(ph3))
        methods_order += [m for m in methods if m not in methods_order]
        key_eval = settings_key({"tuning": key_tuning, "choice": choices[domain], "methods": list(methods),
                                 "test": [ex.to_json() for ex in sp.test], "items": [ex.uid for ex in sp.test]})
        all_results += evaluation_stage(
            run, f"eval_{domain}", key_eval, f"evaluate {titles.get(domain, domain)}",
            len(sp.test) * len(CONFLICT_TYPES) * len(methods),
            lambda advance, sp=sp, methods=methods: evaluate(lm, sp.test, methods, max_rows=cfg.max_rows,
                                                             on_progress=advance))
    timings["evaluation"] = time.perf_counter() - t

    known = {r.item_key for r in all_results
             if r.method == "Original" and r.conflict_type == "clean" and r.correct}
    boot = dict(resamples=cfg.bootstrap_resamples, seed=cfg.seed)
    result = ReproduceResult(
        config=cfg, model=lm.fingerprint(), selection=selection, choices=choices,
        table=interval_table(all_results, methods_order, **boot),
        table_known=interval_table(all_results, methods_order, keep=lambda r: r.item_key in known, **boot),
        summary=summary(all_results), timings=timings,
        splits={d: {"head_set": len(s.head_set), "validation": len(s.validation), "ph3_dev": len(s.ph3_dev),
                    "test": len(s.test), "test_known": sum((d, ex.uid) in known for ex in s.test),
                    **{f"pool_{k}": v for k, v in counts[d].items()}} for d, s in splits.items()},
        domains=list(splits), titles=titles, notes=notes, methods=tuple(methods_order), head_domain=head_domain,
    )
    write_outputs(result, all_results, out)
    return result


def scoring_title(cfg: ReproduceConfig) -> str:
    """The table title's note on how the heads were scored (approximations say so)."""
    return SCORING_LABELS[cfg.scoring]


def write_outputs(result: ReproduceResult, results, out: Path) -> None:
    """`results.json` (settings, heads, per-domain betas and k, tables with intervals, timings,
    per-item outputs), `table.md` (both views and the paired differences) and `table.png`
    (without matplotlib, the `plots` extra, no PNG)."""
    from juice.plots import have_matplotlib, interval_bar_chart

    cfg = asdict(result.config)
    write_json_atomic(out / "results.json", {
        "config": cfg,
        "protocol": {"scoring": result.config.scoring, "scoring_label": scoring_title(result.config),
                     "tuning": "per domain, on its own validation split", "heads_from": f"{result.head_domain} D"},
        "model": result.model,
        "heads": selection_to_json(result.selection),
        "choices": result.choices,
        "table": result.table.to_json(),
        "table_known": result.table_known.to_json() if result.table_known else None,
        "accuracy": result.table.means(),
        "summary": result.summary,
        "timings_s": result.timings,
        "splits": result.splits,
        "notes": result.notes,
        "items": results_to_json(results),
    })
    methods = list(result.methods)
    cols, headers = table1_columns(result.domains, result.titles)
    avg_cols = [c for c in cols if c[0] == "Average"]
    avg_headers = [h for c, h in zip(cols, headers) if c[0] == "Average"]
    betas = "; ".join(f"{result.titles.get(d, d)}: " + ", ".join(
        f"{METHOD_NAMES[m]} ({b['beta_plus']:g}, {b['beta_minus']:g})" for m, b in c["betas"].items())
        + "".join(f", {n} k={p['k']}" for n, p in c["prune"].items()) for d, c in result.choices.items())
    text = [f"# Table 1 layout: {result.model['name']}\n",
            f"Heads: {scoring_title(result.config)} on {result.titles.get(result.head_domain, result.head_domain)}'s D; + {', '.join(map(str, result.selection.positive))}; "
            f"- {', '.join(map(str, result.selection.negative))}. Per-domain (beta+, beta-) and PH3 k: {betas}.\n",
            "## Unfiltered test split (the paper's Table 1)\n", interval_markdown(result.table, methods, cols, headers),
            "\nAccuracy (%), exact match, ± the half-width of the 95% bootstrap interval "
            f"({result.config.bootstrap_resamples} resamples); bold only where the best interval excludes the "
            "runner-up's. Conflict types: 1 = clean, 2 = substitution, 3 = coherent.\n",
            "## Test items the model knows (Original correct on the clean prompt)\n",
            interval_markdown(result.table_known, methods, cols, headers) if result.table_known else "",
            "\n## Paired differences, unfiltered (percentage points, 95% paired bootstrap interval; * excludes 0)\n",
            difference_markdown(result.table, avg_cols, avg_headers)]
    if result.table_known:
        text += ["\n## Paired differences, known items\n", difference_markdown(result.table_known, avg_cols, avg_headers)]
    (out / "table.md").write_text("\n".join(text), encoding="utf-8")
    for name, table in (("table.png", result.table), ("table_known.png", result.table_known)):
        if table is not None and have_matplotlib():
            cells = {m: {t: table.cells[m]["Average"][t] for t in CONFLICT_TYPES if t in table.cells[m]["Average"]}
                     for m in methods}
            view = "unfiltered test split" if name == "table.png" else "test items the model knows"
            interval_bar_chart(cells, out / name, title=f"{result.model['name']}: average over domains, {view}")
