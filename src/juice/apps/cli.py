"""The `juice` command line: parses, calls the library, prints."""

from __future__ import annotations

import json
import math
import time
from pathlib import Path
from typing import Optional

import typer

from juice.apps.progress import make_console, progress_bars
from juice.models import DEFAULT_MODEL

app = typer.Typer(add_completion=False, help="Steer a language model toward its parametric memory or its context (JuICE).")
console = make_console(width=200)

CONTEXT_LIMIT = 40
"""`juice evaluate --contexts`'s default items per source (about 15 minutes on 2 cores for NQ-Swap and
every method on the embedded model); `--full` evaluates every item."""


def _add_analyze() -> None:
    from juice.apps.analyze import analyze_app

    app.add_typer(analyze_app, name="analyze", help="The paper's analyses: knockout (Fig. 3), superposition, "
                  "interventions (Table 3, Fig. 6), robustness (Fig. 5), paraphrase (App. D), norm; all.")


_add_analyze()


def _progress():
    return progress_bars(console)


BETA_MINUS_GRID_HELP = ("tuning grid of beta-, comma-separated (default the paper's 0,-1,-2,-3; the authors' "
                        "contextual script: 0,-1,-2,-3,-4,-5)")


def _grid(text: Optional[str], option: str) -> Optional[tuple[float, ...]]:
    """A comma-separated grid of finite numbers, or None for the default; a usage error otherwise."""
    if text is None:
        return None
    try:
        values = tuple(float(v) for v in text.split(",") if v.strip())
    except ValueError:
        values = ()
    if not values or not all(math.isfinite(v) for v in values):
        raise typer.BadParameter(f"{option} must be comma-separated finite numbers, e.g. 0,-1,-2, not {text!r}")
    return values


@app.command()
def reproduce(
    direction: str = typer.Option("parametric", help="parametric (Table 1) | contextual (Table 2)"),
    model: str = typer.Option(DEFAULT_MODEL, help="embedded alias, .gguf file, model directory or hub id"),
    out: Path = typer.Option(Path("juice-output"), help="output directory (JSON, Markdown tables, PNG, heads file)"),
    limit: Optional[int] = typer.Option(None, help="test items per domain (default 30) / dataset (default 20)"),
    validation_size: int = typer.Option(4, help="parametric: known validation items per domain"),
    validation_per_dataset: int = typer.Option(5, help="contextual: validation items per dataset"),
    k: int = typer.Option(5, help="heads per sign (K)"),
    scoring: str = typer.Option("exact", help="Stage 1 scoring: exact (the paper's Alg. 2, default) | hybrid "
                                              "(APPROXIMATION: attribution shortlist + exact re-score) | "
                                              "attribution (APPROXIMATION: attribution patching only)"),
    shortlist: int = typer.Option(12, help="hybrid: heads per sign re-scored exactly"),
    ph3_dev_size: int = typer.Option(12, help="PH3-l development items the model knows (the paper: 200)"),
    ph3_knockout: bool = typer.Option(False, help="also a PH3-l row scored by knock-out instead of path patching"),
    baselines: bool = typer.Option(True, help="add the Prompt, PH3 (and CAD, AdaCAD) rows"),
    filter_items: bool = typer.Option(True, "--filter/--no-filter",
                                      help="filter D, validation and PH3-l items to those the model knows "
                                           "(--no-filter trusts --data's splits as they are)"),
    max_prompt_tokens: int = typer.Option(256, help="contextual: drop longer prompts (NQ-Swap tables)"),
    full: bool = typer.Option(False, "--full", help="everything: all test items; every known item for validation "
                                                   "(World Capital: half of them, the other half, up to 200, PH3-l's) "
                                                   "or 50 per dataset (contextual); no prompt-length cap"),
    data: Optional[Path] = typer.Option(None, exists=True, help="parametric: the paper's ParaConflict files (the authors' "
                                                   "dataset/factual as it is, a folder with one sub-folder of split files "
                                                   "per domain, or one domain folder)"),
    data_root: Optional[Path] = typer.Option(None, exists=True, file_okay=False, help="contextual: folder with memotrap/ and nqswap/ "
                                                        "(default $JUICE_DATA or ../shared/data)"),
    seed: int = typer.Option(0),
    max_rows: str = typer.Option("128", help='most rows per batched forward, or "auto" (a quarter of free memory)'),
    device: str = typer.Option("auto", help="auto (a GPU when there is one) | cpu | cuda | cuda:N | mps"),
    device_map: Optional[str] = typer.Option(None, help='e.g. "auto" to shard the model over GPUs (accelerate)'),
    dtype: str = typer.Option("float32", help="float32 | bfloat16 | float16"),
    beta_minus_grid: Optional[str] = typer.Option(None, help=BETA_MINUS_GRID_HELP),
    degeneration_margin: Optional[float] = typer.Option(
        None, help="NOT the paper's protocol (accuracy only): tuning refuses settings whose share of "
                          "degenerate validation outputs exceeds Original's by more than this many points "
                          "(juice tune's rule; 10 there)"),
):
    """Run the paper's Table 1 (parametric) or Table 2 (contextual) protocol and print the tables.

    Example: juice reproduce; juice reproduce --direction contextual; juice reproduce --full
    """
    from juice.apps.terminal import interval_rich
    from juice.eval.report import table1_columns, table2_columns
    from juice.pipeline.run import ReproduceConfig, scoring_title
    from juice.experiments.table1 import reproduce as run_parametric
    from juice.experiments.table2 import reproduce_contextual

    if direction not in ("parametric", "contextual"):
        raise typer.BadParameter("direction must be parametric or contextual")
    if scoring not in ("exact", "hybrid", "attribution"):
        raise typer.BadParameter("scoring must be exact, hybrid or attribution")
    grid = _grid(beta_minus_grid, "--beta-minus-grid")
    if degeneration_margin is not None and not (math.isfinite(degeneration_margin) and degeneration_margin >= 0):
        raise typer.BadParameter("--degeneration-margin must be a number of percentage points >= 0")
    cfg = ReproduceConfig(
        model=model, out_dir=out, validation_size=None if full else validation_size,
        limit=None if full else limit if limit is not None else "default",
        k=k, scoring=scoring, shortlist=shortlist, seed=seed, data=data, filter=filter_items,
        max_rows=max_rows if max_rows == "auto" else int(max_rows), device=device,
        device_map=device_map, dtype=dtype, baselines=baselines, ph3_dev_size=200 if full else ph3_dev_size,
        ph3_knockout=ph3_knockout, data_root=data_root,
        validation_per_dataset=max(50, validation_per_dataset) if full else validation_per_dataset,
        **({"beta_minus_grid": grid} if grid else {}), degeneration_margin=degeneration_margin,
    )
    start = time.perf_counter()
    with _progress() as task:
        if direction == "parametric":
            result = run_parametric(cfg, progress=task)
        else:
            result = reproduce_contextual(cfg, progress=task, max_prompt_tokens=None if full else max_prompt_tokens)
    name = result.model["name"]
    heads_note = scoring_title(cfg)
    methods = list(result.methods)
    if direction == "parametric":
        cols, headers = table1_columns(result.domains, result.titles, short=True)
        caption = "accuracy %, ± half-width of the 95% bootstrap interval; 1 clean, 2 substitution, 3 coherent"
        console.print(interval_rich(result.table, methods, cols, headers, caption=caption,
                                    title=f"Table 1 layout, unfiltered test split: {name} ({heads_note})"))
        console.print(interval_rich(result.table_known, methods, cols, headers, caption=caption,
                                    title=f"Test items the model knows: {name}"))
        files = ("results.json", "table.md", "table.png", "table_known.png", "table_correct_not_degenerate.png",
                 "table_degeneration.png", "heads.json")
    else:
        cols, headers = table2_columns(result.domains, result.titles)
        console.print(interval_rich(result.table, methods, cols, headers,
                                    title=f"Table 2 layout: {name} (accuracy % of the contextual answer; {heads_note})"))
        if result.likelihood:
            mt = [d for d in result.domains if d in result.likelihood.cells.get(methods[0], {})]
            lcols, lheaders = table2_columns(mt, result.titles)
            console.print(interval_rich(result.likelihood, methods, lcols, lheaders,
                                        title="MemoTrap, likelihood comparison (%)"))
        files = ("results_contextual.json", "table2.md", "table2.png", "table2_correct_not_degenerate.png",
                 "table2_degeneration.png", "heads_contextual.json")
    if result.degeneration:
        average = [(c, h) for c, h in zip(cols, headers) if c[0] == "Average"]
        console.print(interval_rich(result.degeneration, methods, [c for c, _ in average], [h for _, h in average],
                                    title="degenerate outputs, % of the average over domains (lower is better; "
                                          "juice's measure)", bold=False))
    if result.correct_not_degenerate:
        average = [(c, h) for c, h in zip(cols, headers) if c[0] == "Average"]
        console.print(interval_rich(result.correct_not_degenerate, methods, [c for c, _ in average],
                                    [h for _, h in average],
                                    title="correct and not degenerate, % of the average over domains (juice's "
                                          "second score)"))
    console.print(f"heads +: {', '.join(map(str, result.selection.positive))}   "
                  f"heads -: {', '.join(map(str, result.selection.negative))}")
    for d, c in result.choices.items():
        chosen = "" if c["chosen_on"] == d else f" (from {c['chosen_on']})"
        console.print(f"{result.titles.get(d, d)}{chosen}: " + ", ".join(
            f"{m} beta+={b['beta_plus']:g} beta-={b['beta_minus']:g}" for m, b in c["betas"].items())
            + "".join(f", {n} k={p['k']} ({', '.join(p['pruned']) or 'none'})" for n, p in c["prune"].items()))
    console.print("time: " + ", ".join(f"{k} {v:.0f}s" for k, v in result.timings.items())
                  + f", total {time.perf_counter() - start:.0f}s")
    for note in result.notes:
        console.print(f"[yellow]note:[/yellow] {note}")
    console.print("wrote " + ", ".join(str(out / f) for f in files))


@app.command()
def identify(
    model: str = typer.Option(DEFAULT_MODEL),
    out: Path = typer.Option(Path("heads.json"), help="where to write the heads file"),
    k: int = typer.Option(5),
    scoring: str = typer.Option("exact", "--method", help="exact (the paper) | attribution | hybrid (approximations)"),
    shortlist: int = typer.Option(12),
    head_set_size: int = typer.Option(4),
    seed: int = typer.Option(0),
    domain: str = typer.Option("world_capital", help=(
        "without --data: the built-in domain whose known items give D (world_capital, the paper's; athlete_sport, "
        "book_author, official_language, company_headquarter, company_founder)")),
    data: Optional[Path] = typer.Option(None, exists=True, help=(
        "your examples (a JSONL/CSV file with prompt, target, optional other and conflict_type; a ParaConflict "
        "JSON file; an NQ-Swap JSONL; a MemoTrap CSV): every row is scored; or the paper's ParaConflict folder "
        "layout (World Capital's head-finding file gives D, filtered for the model)")),
    direction: str = typer.Option("parametric", help="with a data file: parametric | contextual (which answer the "
                                                     "ParaConflict, NQ-Swap and MemoTrap rows promote)"),
    device: str = typer.Option("auto", help="auto | cpu | cuda | cuda:N | mps"),
):
    """Stage 1 only: identify the heads on your examples (--data FILE) or on World Capital's D
    (filtered for the model: only D's items need be known), and write a heads JSON file that
    records its data.

    Example: juice identify --data my_conflicts.jsonl --direction contextual --out heads.json
    """
    from juice.data.paraconflict import DOMAINS
    from juice.io import StageFiles
    from juice.pipeline.domains import domain_sources
    from juice.pipeline.run import ReproduceConfig
    from juice.pipeline.stages import identify_on_domain
    from juice.stage1 import save_heads
    from juice.models import load_model
    from juice.userdata import load_rows

    cfg = ReproduceConfig(model=model, k=k, scoring=scoring, shortlist=shortlist, head_set_size=head_set_size,
                          seed=seed, data=data, domains=(domain,), validation_size=0, baselines=False,
                          limit=0, device=device)
    if data is None and domain not in DOMAINS:
        raise typer.BadParameter(f"unknown domain {domain!r}; one of {', '.join(DOMAINS)}", param_hint="--domain")
    if (data is None or data.is_dir()) and direction.strip().lower() not in ("parametric", "memory"):
        raise typer.BadParameter("without a data file, identify scores a ParaConflict domain's D for the parametric "
                                 "direction; for the contextual direction give --data (an NQ-Swap JSONL, a MemoTrap "
                                 "CSV, or your rows)", param_hint="--direction")
    if data is not None and data.is_file():   # the user's own rows: all of them are D
        from juice.workflow import identify as identify_rows
        from juice.workflow import parse_direction

        load_rows(data, parse_direction(direction))   # bad data fails before the model loads
        lm = load_model(model, device=device)
        with _progress() as task:
            artifact = identify_rows(lm, data, direction=direction, k=k, scoring=scoring, shortlist=shortlist,
                                     progress=task)
        selection = artifact.selection
    else:
        domain_sources(cfg)   # bad data fails before the model loads
        lm = load_model(model, device=device)
        with _progress() as task:
            artifact = identify_on_domain(lm, cfg, StageFiles(out.parent / ".juice-state"), task, command="identify")
        selection = artifact.selection
    save_heads(artifact, out)
    console.print(f"positive: {', '.join(map(str, selection.positive))}")
    console.print(f"negative: {', '.join(map(str, selection.negative))}")
    console.print(f"wrote {out}")


@app.command()
def tune(
    heads: Path = typer.Option(..., exists=True, dir_okay=False, help="the heads file to tune (rewritten in place)"),
    data: Path = typer.Option(..., exists=True, dir_okay=False, help=(
        "validation rows: JSONL/CSV (prompt, target, optional other, conflict_type, aliases, question), "
        "ParaConflict JSON, NQ-Swap JSONL or MemoTrap CSV")),
    methods: str = typer.Option("juice,june", help=(
        "comma-separated: juice, june, ph3 (PH3's k; needs rows with other), auto (the per-request policy, "
        "on the four context types of --data: NQ-Swap JSONL or ParaConflict JSON; after juice's betas)")),
    limit: Optional[int] = typer.Option(None, min=1, help="use the first N rows only (auto: N items per source)"),
    split: Optional[str] = typer.Option(None, help=(
        "auto: tune on the questions of this half only, validation or test (by question, seeded: "
        "juice.data.context_types.split_of); default every question of --data")),
    model: str = typer.Option(DEFAULT_MODEL),
    device: str = typer.Option("auto", help="auto | cpu | cuda | cuda:N | mps"),
    beta_minus_grid: Optional[str] = typer.Option(None, help=BETA_MINUS_GRID_HELP),
):
    """Choose (beta+, beta-) for JuICE and JuNE (and PH3's k) on validation rows, and write them
    into the heads file with the grid's accuracies: a tuned heads file alone is enough to steer
    (`juice.Steerer`) and to serve (`juice serve`).

    With auto (juice's per-request policy, :mod:`juice.auto`): the JuICE/JuNE betas are tuned
    first (if asked), then the policy on gold, conflicting, irrelevant and no-context items
    built from --data's validation rows.

    Example: juice tune --heads heads.json --data validation.jsonl --methods juice,june,ph3

    Example: juice tune --heads heads_contextual.json --data nqswap_validation.jsonl --methods juice,auto
    """
    from juice.stage1 import load_heads, save_heads
    from juice.models import load_model
    from juice.userdata import load_rows
    from juice.workflow import check_tune_methods
    from juice.workflow import tune as tune_rows

    grid = _grid(beta_minus_grid, "--beta-minus-grid")
    artifact = load_heads(heads)          # malformed input fails before the model loads
    names = [m.strip().lower() for m in methods.split(",") if m.strip()]
    if "auto" in names:
        from juice.when_to_steer import context_items

        try:
            items, where = context_items(data, limit=limit, split=split)
        except (ValueError, FileNotFoundError) as err:
            raise typer.BadParameter(str(err), param_hint="--split" if "--split" in str(err) else "--data") from None
    grid_names = [m for m in names if m != "auto"]
    if grid_names or not names:
        load_rows(data, artifact.direction)
        check_tune_methods(grid_names)
    lm = load_model(model, device=device)
    artifact = load_heads(heads, lm)
    chosen = {}
    with _progress() as task:
        if grid_names:
            chosen = tune_rows(lm, artifact, data, methods=grid_names, limit=limit, progress=task,
                               **({"beta_minus_grid": grid} if grid else {}))
        if "auto" in names:
            from juice.auto import candidate_betas, tune_auto

            n, k = len(items.items), len(candidate_betas(artifact.tuned)) + 2   # + Original and AdaCAD
            advance = task(f"auto: {k} candidates x {n} items", k * n)
            fit = tune_auto(lm, artifact, items, where=where, on_progress=advance)
    save_heads(artifact, heads)
    if "auto" in names:
        p = fit.policy
        bins = (("" if p.relevance is None else f"passage with < {p.relevance:.3g} of the question's words: "
                 f"{p.irrelevant} | ") + " | ".join(f"{'' if i == 0 else f'JSD >= {p.thresholds[i - 1]:.3g}: '}{name}"
                                                    for i, name in enumerate(p.picks)))
        console.print(f"auto: {bins}; validation mean {fit.mean:.1f}% (use relevant context, {n} items; "
                      + ", ".join(f"{c} alone {v:.1f}%" for c, v in fit.static.items()) + ")")
    for name, setting in chosen.items():
        what = (f"k = {setting.k} ({', '.join(setting.pruned) or 'none'})" if setting.k is not None
                else f"beta+ {setting.beta_plus:g}, beta- {setting.beta_minus:g}")
        console.print(f"{name}: {what}, accuracy {setting.accuracy:.1f}% on {artifact.tuned.provenance['rows']} rows")
    console.print(f"wrote {heads}")


@app.command()
def evaluate(
    data: Optional[Path] = typer.Option(None, exists=True, help=(
        "test rows (the formats of `juice tune --data`); with --contexts: an NQ-Swap file or folder, your own "
        "JSONL/CSV rows (question, context, answer, optional context_answer), a ParaConflict JSON file or the "
        "authors' folder of domains (absent: the built-in domains)")),
    heads: list[Path] = typer.Option([], exists=True, dir_okay=False, help=(
        "a heads file (needed for juice, june, ph3); with --contexts one per direction (repeat)")),
    methods: Optional[str] = typer.Option(None, help=(
        "comma-separated: original, prompt, juice, june, cad, adacad (rows need question), ph3 (after `juice tune "
        "--methods ph3`), auto (with --contexts, after `juice tune --methods auto`); default original,prompt,juice,"
        "june (with --contexts: original,prompt,cad,adacad,june,juice, and ph3 and auto where a heads file holds "
        "them)")),
    direction: Optional[str] = typer.Option(None, help="parametric | contextual (default: the heads file's)"),
    beta_plus: Optional[float] = typer.Option(None, help="override the heads file's tuned beta+"),
    beta_minus: Optional[float] = typer.Option(None, help="override the heads file's tuned beta-"),
    limit: Optional[int] = typer.Option(None, min=1, help="evaluate the first N rows (with --contexts: items per "
                                                           f"source, default {CONTEXT_LIMIT}) only"),
    full: bool = typer.Option(False, "--full", help="with --contexts: every item and every prompt length"),
    max_prompt_tokens: int = typer.Option(256, help="with --contexts: drop items whose prompts are longer "
                                                    "(NQ-Swap's table passages), unless --full"),
    contexts: Optional[str] = typer.Option(None, help=(
        "when to steer: evaluate on the same questions with these contexts, comma-separated from gold, conflicting, "
        "irrelevant, none (README \"When to steer\")")),
    domain: Optional[str] = typer.Option(None, help="with --contexts: one built-in or authors' domain"),
    split: Optional[str] = typer.Option(None, help=(
        "with --contexts: the questions of one half, validation or test (by question, seeded: "
        "juice.data.context_types.split_of); default every question")),
    validation: Optional[Path] = typer.Option(None, exists=True, dir_okay=False, help=(
        "with --contexts: a validation run's contexts.json (--split validation): the best static method is "
        "chosen there and every method compared with it")),
    study: bool = typer.Option(False, "--study", help=(
        "with --contexts and one heads file: the whole study: split the questions, choose the best static "
        "method and fit auto on validation, evaluate every method and auto on test (--limit: test questions "
        "per source; cached in --out/cache, resumable)")),
    validation_limit: Optional[int] = typer.Option(None, min=1, help="with --study: validation questions per source "
                                                                      "(default: as --limit)"),
    out: Path = typer.Option(Path("juice-evaluation"), help="folder for evaluation.json and evaluation.md "
                                                            "(with --contexts: contexts.json, .md, .png)"),
    model: str = typer.Option(DEFAULT_MODEL),
    device: str = typer.Option("auto", help="auto | cpu | cuda | cuda:N | mps"),
):
    """Evaluate methods on your test rows: exact match per conflict-type label and their mean,
    with n and 95% bootstrap intervals, and paired differences; printed and saved. With
    --contexts: every method on gold, conflicting, irrelevant and no context, under both
    objectives (use relevant context, trust memory) and the rate of answers that follow the passage.

    Example: juice evaluate --heads heads.json --data test.jsonl --methods original,prompt,juice,june,cad

    Example: juice evaluate --contexts gold,conflicting,irrelevant,none --data nqswap/ --heads heads_contextual.json

    With --contexts the default is the first 40 items per source whose prompts hold at most
    --max-prompt-tokens tokens (about 15 minutes on 2 cores); --full runs them all.
    """
    if contexts is not None and study:
        _study(data, heads, methods, domain, None if full else (limit or CONTEXT_LIMIT),
               None if full else (validation_limit or limit or CONTEXT_LIMIT), out, model, device,
               None if full else max_prompt_tokens)
        return
    if study:
        raise typer.BadParameter("--study is for the context-type evaluation: add --contexts", param_hint="--study")
    if contexts is not None:
        _evaluate_contexts(data, heads, methods, contexts, domain, None if full else (limit or CONTEXT_LIMIT),
                           out, model, device, None if full else max_prompt_tokens, split, validation)
        return
    from juice.apps.terminal import interval_rich
    from juice.eval.report import degeneration_markdown, difference_markdown, interval_markdown
    from juice.stage1 import load_heads
    from juice.io import write_json_atomic
    from juice.models import load_model
    from juice.userdata import load_rows
    from juice.workflow import check_methods, evaluate_file, parse_direction

    if data is None or data.is_dir():
        raise typer.BadParameter("give a file of test rows (a folder is for --contexts)", param_hint="--data")
    if len(heads) > 1:
        raise typer.BadParameter("one heads file (two, one per direction, with --contexts)", param_hint="--heads")
    names = [m.strip().lower() for m in (methods or "original,prompt,juice,june").split(",") if m.strip()]
    artifact = load_heads(heads[0]) if heads else None   # malformed input fails before the model loads
    chosen = parse_direction(direction or (artifact.direction if artifact else "parametric"))
    load_rows(data, chosen)
    check_methods(names, artifact)
    lm = load_model(model, device=device)
    artifact = load_heads(heads[0], lm) if heads else None
    with _progress() as task:
        report = evaluate_file(lm, artifact, data, names, direction=chosen, beta_plus=beta_plus,
                               beta_minus=beta_minus, limit=limit, progress=task)
    columns = report.columns()
    headers = [c for c, _ in columns]
    console.print(interval_rich(report.table, report.methods, columns, headers,
                                title=f"{data.name}: exact match, % (95% interval half-width)"))
    console.print(interval_rich(report.degeneration, report.methods, columns, headers,
                                title="degenerate outputs, % (lower is better; juice's measure)", bold=False))
    console.print(interval_rich(report.correct_not_degenerate, report.methods, columns, headers,
                                title="correct and not degenerate, % (juice's second score)"))
    for name, setting in report.settings.items():
        console.print(f"{name}: " + ", ".join(f"{k} {v}" for k, v in setting.items()))
    out.mkdir(parents=True, exist_ok=True)
    write_json_atomic(out / "evaluation.json", report.to_json())
    (out / "evaluation.md").write_text(
        f"# {data.name} ({chosen} direction)\n\nExact match, % (95% bootstrap interval half-width); "
        f"bold: interval wholly above the runner-up's.\n\n" + interval_markdown(report.table, report.methods, columns, headers)
        + "\nPaired differences, percentage points [95% interval]:\n\n" + difference_markdown(report.table, columns, headers)
        + "\n".join(degeneration_markdown(report.degeneration, report.correct_not_degenerate, report.methods, columns,
                                           headers, columns, headers)), encoding="utf-8")
    console.print(f"wrote {out / 'evaluation.json'}, {out / 'evaluation.md'}")


def _study(data: Optional[Path], heads: list[Path], methods: Optional[str], domain: Optional[str],
           test_limit: Optional[int], validation_limit: Optional[int], out: Path, model: str, device: str,
           max_prompt_tokens: Optional[int]) -> None:
    """`juice evaluate --contexts --study` (:mod:`juice.context_study`)."""
    from juice.context_study import run_study
    from juice.models import load_model
    from juice.stage1 import load_heads
    from juice.when_to_steer import MEAN, context_items, prompt_fits

    if len(heads) != 1:
        raise typer.BadParameter("--study takes one heads file", param_hint="--heads")
    try:   # bad input fails before the model loads
        context_items(data, domain=domain, limit=1, split="test")
    except (ValueError, FileNotFoundError) as err:
        raise typer.BadParameter(str(err), param_hint="--data") from None
    names = [m.strip().lower() for m in (methods or "original,prompt,cad,adacad,june,juice,auto").split(",") if m.strip()]
    load_heads(heads[0])
    lm = load_model(model, device=device)
    artifact = load_heads(heads[0], lm)
    try:
        with _progress() as task:
            result = run_study(lm, artifact, data, out=out, names=[n for n in names if n != "auto"],
                               auto="auto" in names, validation_limit=validation_limit, test_limit=test_limit,
                               keep=None if max_prompt_tokens is None else prompt_fits(lm.tokenizer, max_prompt_tokens),
                               domain=domain, progress=task)
    except ValueError as err:
        raise typer.BadParameter(str(err), param_hint="--methods") from None
    boot = result.test.summary["use_relevant"]
    console.print(f"best static method on validation: {result.test.best_static}")
    console.print("test, use relevant context, mean over context types (by question): " + "; ".join(
        f"{m} {boot.cells[m][MEAN].format()}" for m in result.test.methods if m in boot.cells))
    console.print(f"wrote {out / 'study.md'}, {out / 'study.json'}, {out / 'validation'}, {out / 'test'}")


def _evaluate_contexts(data: Optional[Path], heads: list[Path], methods: Optional[str], contexts: str, domain: Optional[str],
                       limit: Optional[int], out: Path, model: str, device: str,
                       max_prompt_tokens: Optional[int] = None, split: Optional[str] = None,
                       validation: Optional[Path] = None) -> None:
    """`juice evaluate --contexts` (:mod:`juice.when_to_steer`)."""
    from juice.apps.terminal import interval_rich
    from juice.io import write_json_atomic
    from juice.models import load_model
    from juice.plots import have_matplotlib
    from juice.stage1 import load_heads
    from juice.when_to_steer import TITLES, context_items, evaluate_contexts

    try:   # bad input fails before the model loads
        kinds = [c.strip().lower() for c in contexts.split(",") if c.strip()]
        items, where = context_items(data, domain=domain, limit=limit, contexts=kinds, split=split)
        chosen_on = None if validation is None else json.loads(validation.read_text(encoding="utf-8"))
    except (ValueError, FileNotFoundError) as err:
        hint = next((h for h in ("--contexts", "--split") if h in str(err)), "--data")
        raise typer.BadParameter(str(err), param_hint=hint) from None
    except json.JSONDecodeError as err:
        raise typer.BadParameter(f"{validation}: not JSON ({err.msg})", param_hint="--validation") from None
    files = [load_heads(path) for path in heads]
    if methods is None:   # every method; PH3 and auto where a heads file holds them tuned
        methods = ("original,prompt,cad,adacad" + (",ph3" if any(f.tuned.ph3 for f in files) else "")
                   + ",june,juice" + (",auto" if any(f.tuned.auto for f in files) else ""))
    names = [m.strip().lower() for m in methods.split(",") if m.strip()]
    lm = load_model(model, device=device)
    if max_prompt_tokens is not None:   # the first `limit` items whose prompts fit
        from juice.when_to_steer import prompt_fits

        items, where = context_items(data, domain=domain, limit=limit, contexts=kinds, split=split,
                                     keep=prompt_fits(lm.tokenizer, max_prompt_tokens))
        where["max_prompt_tokens"] = max_prompt_tokens
    artifacts = [load_heads(path, lm) for path in heads]
    try:
        with _progress() as task:
            report = evaluate_contexts(lm, artifacts, items, names, data=where, progress=task, validation=chosen_on)
    except ValueError as err:
        raise typer.BadParameter(str(err), param_hint="--validation" if "validation" in str(err) else "--methods") from None
    columns = report.columns()
    for name, table in report.tables.items():
        cols = [(c, g) for c, g in columns if name != "follows_context" or g != "none"]
        console.print(interval_rich(table, report.methods, cols, [g for _, g in cols],
                                    title=f"{TITLES[name]}, % (95% interval half-width)",
                                    bold=name not in ("follows_context", "degenerate")))
    from juice.when_to_steer import MEAN

    for name, boot in report.summary.items():
        console.print(f"{TITLES[name]}, mean over context types (by question): " + "; ".join(
            f"{m} {boot.cells[m][MEAN].format()}" for m in report.methods if m in boot.cells))
    console.print(f"items {where['counts']}, skipped {where['skipped']}"
                  + (f", {where['dropped']} dropped (prompts over {where['max_prompt_tokens']} tokens; --full keeps them)"
                     if where.get("dropped") else ""))
    out.mkdir(parents=True, exist_ok=True)
    write_json_atomic(out / "contexts.json", report.to_json())
    (out / "contexts.md").write_text(report.markdown(), encoding="utf-8")
    written = [out / "contexts.json", out / "contexts.md"]
    if have_matplotlib():
        written.append(report.figure(out / "contexts.png"))
    console.print("wrote " + ", ".join(map(str, written)))


@app.command()
def generate(
    prompt: str = typer.Argument(..., help="the prompt to continue"),
    heads: Path = typer.Option(..., exists=True, dir_okay=False,
                               help="a heads file from `juice identify` or `juice reproduce`"),
    beta_plus: Optional[float] = typer.Option(None, help="default: the heads file's tuned betas for each method, "
                                              "else juice.steering.DEFAULT_BETAS (with a warning)"),
    beta_minus: Optional[float] = typer.Option(None),
    model: str = typer.Option(DEFAULT_MODEL),
    max_new_tokens: int = typer.Option(10),
):
    """Print the original, JuNE and JuICE continuations of a prompt.

    Example: juice generate --heads heads.json --beta-plus 2 --beta-minus -1 "The capital of France is Rome. The capital of France is"
    """
    from juice.engine import Stream
    from juice.engine import generate as run
    from juice.methods import REGISTRY, MethodInputs, build
    from juice.stage1 import load_heads
    from juice.models import load_model

    load_heads(heads)   # a malformed file fails before the model loads
    lm = load_model(model)
    artifact = load_heads(heads, lm)
    inputs = MethodInputs(lm, artifact.selection, artifact.tuned, beta_plus, beta_minus)
    shown = ("original", "june", "juice")
    streams = [Stream(0, build(name, inputs).method.steering) for name in shown]
    gen = run(lm, [prompt], streams, max_new_tokens)
    for name, text in zip(shown, gen.texts):
        console.print(f"[bold]{REGISTRY[name].title:>8}[/bold]: {prompt}[cyan]{text}[/cyan]")


@app.command()
def serve(
    model: str = typer.Option(DEFAULT_MODEL, help="embedded alias, .gguf file, model directory or hub id"),
    heads: list[Path] = typer.Option([], exists=True, dir_okay=False,
                                     help="a heads file (repeat: one per direction, e.g. parametric and contextual)"),
    host: str = typer.Option("127.0.0.1"),
    port: int = typer.Option(8000),
    device: str = typer.Option("auto", help="auto | cpu | cuda | cuda:N | mps"),
    max_rows: int = typer.Option(64, min=1, help="most rows decoding at once (a JuICE request holds two per choice)"),
    max_queued: int = typer.Option(256, min=1, help="most requests waiting to start; past it: HTTP 429"),
    max_n: int = typer.Option(16, min=1, help="most choices per prompt (n)"),
    max_prompts: int = typer.Option(64, min=1, help="most prompts in one completions request"),
    max_total_tokens: int = typer.Option(0, min=0, help="most prompt + max_tokens tokens (0: the model's context)"),
    request_timeout: float = typer.Option(600.0, min=0.0,
                                          help="seconds before a request ends with HTTP 504 (0: no limit)"),
    alias: list[str] = typer.Option([], help="NAME=SPEC: another model name whose requests get these juice "
                                             "options, e.g. gemma+juice=direction:contextual,method:juice,beta_plus:2 "
                                             "(repeat; for lm-evaluation-harness, whose request bodies are fixed)"),
    default: Optional[str] = typer.Option(None, help="SPEC (as --alias's): the juice options of a request that sends "
                                                     "none, e.g. method:juice,beta_plus:2 (unset: the heads file's "
                                                     "tuned steering, else Original)"),
    engine: str = typer.Option("juice", help="juice (this process's engine) | vllm (vLLM's OpenAI server with "
                                             "juice's plugin, run from vLLM's environment; README, \"Serving at "
                                             "scale with vLLM\")"),
    dual_run: bool = typer.Option(True, help="--engine vllm: hold JuICE's second KV cache (--no-dual-run: JuNE "
                                             "and pruning only, twice the KV capacity on the dual-run layers)"),
    vllm_arg: list[str] = typer.Option([], help="--engine vllm: one more argument for vLLM's server (repeat), "
                                                "e.g. --vllm-arg=--tensor-parallel-size=2"),
):
    """OpenAI-compatible server (/v1/models, /v1/completions, /v1/chat/completions, /health,
    /metrics) with per-request steering in the body's "juice" field (needs the server extra:
    FastAPI, uvicorn, prometheus-client). Requests join the running batch at the next decoding step.

    Example: juice serve --heads heads.json --heads heads_contextual.json --port 8000
    """
    if engine not in ("juice", "vllm"):
        raise typer.BadParameter(f"--engine must be juice or vllm, not {engine!r}", param_hint="--engine")
    if engine == "vllm":
        if alias:
            raise typer.BadParameter("--alias is for --engine juice (vLLM serves one model name; send the juice "
                                     "field, or vllm_xargs, per request)", param_hint="--alias")
        _serve_vllm(model, heads, host, port, max_total_tokens, dual_run, vllm_arg, default)
        return
    from juice.extras import require

    require("server", "juice serve")
    import uvicorn

    from juice.apps.openai_schema import ServerLimits
    from juice.apps.server import create_app, parse_alias, parse_spec
    from juice.models import load_model
    from juice.stage1 import load_heads

    try:
        aliases = dict(parse_alias(a) for a in alias)
    except ValueError as err:
        raise typer.BadParameter(str(err), param_hint="--alias") from None
    try:
        default_options = None if default is None else parse_spec(default)
    except ValueError as err:
        raise typer.BadParameter(str(err), param_hint="--default") from None
    limits = ServerLimits(max_n=max_n, max_prompts=max_prompts, max_rows=max_rows, max_queued=max_queued,
                          request_timeout_s=request_timeout or None, max_total_tokens=max_total_tokens or None)
    for path in heads:
        load_heads(path)   # malformed files fail before the model loads
    lm = load_model(model, device=device)
    try:
        app_ = create_app(lm, [load_heads(path, lm) for path in heads], limits=limits, aliases=aliases,
                          default=default_options)
    except ValueError as err:   # an alias or default the heads cannot honour
        raise typer.BadParameter(str(err), param_hint="--default" if str(err).startswith("--default")
                                 else "--alias") from None
    console.print(f"serving {lm.name}{''.join(f', {a}' for a in aliases)} on http://{host}:{port}/v1 with heads for "
                  f"{', '.join(sorted(str(load_heads(p).direction) for p in heads)) or 'no direction (Original only)'}")
    from juice.methods import TUNED_STEERINGS
    from juice.steering import DEFAULT_BETAS

    untuned = [str(p) for p in heads if not any(load_heads(p).tuned.betas(m) for m in TUNED_STEERINGS)]
    if untuned and default_options is None:
        console.print(f"[yellow]note:[/yellow] {', '.join(untuned)} holds no tuned betas (`juice tune`): a request "
                      "without a juice field gets Original there, and one asking for JuICE or JuNE without betas "
                      f"gets {DEFAULT_BETAS[0]:g} and {DEFAULT_BETAS[1]:g} with an X-Juice-Warning header")
    uvicorn.run(app_, host=host, port=port, log_level="info")


def _serve_vllm(model: str, heads: list[Path], host: str, port: int, max_total_tokens: int, dual_run: bool,
                extra: list[str], default: str | None = None) -> None:
    """`juice serve --engine vllm`: replace this process with vLLM's OpenAI server (:mod:`juice.vllm.launch`)."""
    import os

    import torch

    from juice.vllm.launch import (describe, find_vllm_python, folder_geometry, server_command, server_environment,
                                   served_folder)
    from juice.vllm.options import plugin_heads

    python = find_vllm_python()
    try:   # malformed heads files, two for one direction, or a default they cannot honour: one line
        plugin_heads(server_environment(heads, dual_run, default=default))
    except ValueError as err:
        raise typer.BadParameter(str(err), param_hint="--default" if "JUICE_VLLM_DEFAULT" in str(err)
                                 else "--heads") from None
    folder = served_folder(model)
    env = server_environment(heads, dual_run, geometry=folder_geometry(folder), default=default)
    if not torch.cuda.is_available() and not any(a.startswith("--gpu-memory-utilization") for a in extra):
        extra = ["--gpu-memory-utilization", "0.5", *extra]   # the CPU build reserves this share of memory
    command = server_command(python, folder, model, host=host, port=port, max_model_len=max_total_tokens or None,
                             extra=extra)
    console.print(f"starting vLLM with juice's plugin ({', '.join(sorted(plugin_heads(env).selections)) or 'no heads'}"
                  f"{', dual run' if dual_run and heads else ''}): {describe(command, env)}")
    os.execve(python, command, env)


@app.command()
def toy(
    which: str = typer.Argument("all", help="all | construction | learning | conflict | juice"),
    out: Path = typer.Option(Path("juice-toy"), help="output directory (PNG figures, toy.json)"),
    seed: int = typer.Option(0),
):
    """The paper's Sec. 5 theory on a two-layer attention-only transformer.

    Example: juice toy juice --out juice-toy
    """
    from juice.extras import require

    require("plots", "juice toy (its figures)")

    from juice.theory import experiments as ex
    from juice.theory import figures as fig

    parts = {
        "construction": (ex.run_construction, fig.construction_figure),
        "learning": (ex.run_learning, fig.learning_figure),
        "conflict": (ex.run_conflict, fig.conflict_figure),
        "juice": (ex.run_juice_vs_june, fig.juice_figure),
    }
    if which != "all" and which not in parts:
        raise typer.BadParameter(f"choose all or one of {', '.join(parts)}")
    cfg = ex.ToyConfig(seed=seed)
    out.mkdir(parents=True, exist_ok=True)
    results = {}
    for name, (run, draw) in parts.items():
        if which not in ("all", name):
            continue
        start = time.perf_counter()
        results[name] = run(cfg)
        results[name]["seconds"] = time.perf_counter() - start
        draw(results[name], out / f"{name}.png")
        console.print(f"[bold]{name}[/bold] ({results[name]['seconds']:.0f}s): {ex.headline(name, results[name])}")
    from juice.io import write_json_atomic

    write_json_atomic(out / "toy.json", results)
    console.print(f"wrote {out / 'toy.json'} and {', '.join(f'{n}.png' for n in results)}")


@app.command()
def tasks(
    out: Path = typer.Option(Path("juice-tasks"), help="folder for the task YAMLs, their documents and utils.py"),
    data_root: Optional[Path] = typer.Option(None, exists=True, file_okay=False, help=(
        "folder with memotrap/*.csv and nqswap/nqswap.jsonl (default $JUICE_DATA); without it, only the built-in "
        "ParaConflict context tasks")),
    seed: int = typer.Option(0, help="pairing of the irrelevant passages"),
):
    """Write juice's evaluations as lm-evaluation-harness tasks: NQ-Swap and MemoTrap's four
    subtasks scored as the paper scores them, and the context-type evaluation (gold,
    conflicting, irrelevant, none), for `lm_eval --include_path OUT` with any model type.

    Example: juice tasks --out juice-tasks --data-root data/ && lm_eval --include_path juice-tasks --tasks juice_nqswap,juice_memotrap --model hf --model_args pretrained=...
    """
    from juice.eval.harness_tasks import write_tasks

    names = write_tasks(out, data_root, seed=seed)
    console.print(f"wrote {len(names)} tasks to {out}: " + ", ".join(names))
    console.print(f"run them: lm_eval --include_path {out} --tasks "
                  + ",".join(sorted({n if n == "juice_nqswap" else n.rsplit("_", 2)[0] if "contexts" in n
                                     else "juice_memotrap" for n in names})) + " --model ...")


@app.command()
def models():
    """List the supported architectures and the embedded model aliases.

    Example: juice models
    """
    from juice.architectures import adapter_for, supported_model_types
    from juice.models import EMBEDDED_MODELS

    console.print("[bold]embedded models[/bold] (no download):")
    for alias, (description, _) in EMBEDDED_MODELS.items():
        console.print(f"  {alias:<14} {description}" + ("  (default)" if alias == DEFAULT_MODEL else ""))
    console.print("[bold]architectures[/bold] (config.model_type -> layers / output projection):")
    for t in supported_model_types():
        a = adapter_for(t)
        console.print(f"  {t:<12} {a.layers}[i].{a.output_projection} ({a.weight_layout})")


RESUME = "interrupted: finished stages are saved; run the same command again to resume"


def _one_line(err: BaseException) -> str:
    text = str(err).strip() or type(err).__name__
    first = text.splitlines()[0]
    return first + (" (...)" if len(text.splitlines()) > 1 else "")


def main(argv: list[str] | None = None) -> int:
    """The `juice` entry point: bad input (a missing or malformed file, an unknown model, a heads
    file for another model, a prompt too long, a model that loaded wrong, ...) ends with one line
    on stderr and exit status 2, never a traceback; usage errors (a bad option value, a missing
    file option) print click's usage hint and one `Error:` line, status 2; Ctrl-C ends with 130
    (for `reproduce` and `identify` with a reminder that re-running resumes). `JUICE_DEBUG=1`
    shows the traceback instead. Other exceptions (bugs) keep their traceback.

    Returns:
        The exit status.
    """
    import os
    import sys

    from juice.extras import MissingExtraError
    from juice.guard import BatchingMismatchError
    from juice.selfcheck import ModelLoadError

    args = sys.argv[1:] if argv is None else list(argv)
    resumable = bool(args) and args[0] in ("reproduce", "identify")
    interrupted = RESUME if resumable else "interrupted"
    user_errors = (OSError, ValueError, ModelLoadError, BatchingMismatchError, MissingExtraError)
    try:
        command = typer.main.get_command(app)   # click's own call: no rich traceback for bad input
        result = command.main(args=args, prog_name="juice", standalone_mode=False)
        if result == 130:   # typer turns Ctrl-C into exit status 130
            print(interrupted, file=sys.stderr)
        return result if isinstance(result, int) else 0
    except typer.TyperException as usage:   # usage errors: a bad option value, a missing file option
        if hasattr(usage, "show"):
            usage.show()
        else:
            print(f"error: {_one_line(usage)}", file=sys.stderr)
        return 2
    except (KeyboardInterrupt, typer.Abort):
        print(interrupted, file=sys.stderr)
        return 130
    except user_errors as err:
        if os.environ.get("JUICE_DEBUG"):
            raise
        print(f"error: {_one_line(err)} (JUICE_DEBUG=1 shows the traceback)", file=sys.stderr)
        return 2


def run() -> None:
    """Console-script target: :func:`main` with the process's arguments and exit status."""
    raise SystemExit(main())


if __name__ == "__main__":
    run()
