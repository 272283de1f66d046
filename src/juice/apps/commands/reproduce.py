"""`juice reproduce`: Table 1 (parametric; the paper's Table 3) or Table 2 (contextual; the paper's Table 4) protocol, end to end."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Optional

import typer

from juice.apps.commands.common import (BETA_MINUS_GRID_HELP, ENGINE_HELP, STAGE1_ENGINE_HELP, VLLM_ARG_HELP,
                                        VLLM_OFFLINE_HELP, console, engine_for, parse_grid, progress)
from juice.models import DEFAULT_MODEL


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
    contexts: str = typer.Option("", help="contextual: after Table 2, the when-to-steer study on these datasets "
                                           "(nqswap, paraconflict; comma-separated): validation and test split by "
                                           "question, auto fitted on validation (docs/when-to-steer.md); --full: "
                                           "the published size"),
    degeneration_margin: Optional[float] = typer.Option(
        None, help="NOT the paper's protocol (accuracy only): tuning refuses settings whose share of "
                          "degenerate validation outputs exceeds Original's by more than this many points "
                          "(juice tune's rule; 10 there)"),
    engine: str = typer.Option("juice", help=ENGINE_HELP),
    vllm_arg: list[str] = typer.Option([], help=VLLM_ARG_HELP),
    stage1_engine: Optional[str] = typer.Option(None, help=STAGE1_ENGINE_HELP),
    vllm_offline: bool = typer.Option(False, "--vllm-offline", help=VLLM_OFFLINE_HELP),
):
    """Run the protocol of Table 1 (parametric; the paper's Table 3) or Table 2 (contextual; the paper's
    Table 4) and print the tables.

    Examples:

        juice reproduce
        juice reproduce --direction contextual
        juice reproduce --full
        juice reproduce --engine vllm --vllm-arg=--tensor-parallel-size=2
    """
    from juice.pipeline.run import ReproduceConfig
    from juice.experiments.table1 import reproduce as run_parametric
    from juice.experiments.table2 import reproduce_contextual

    if direction not in ("parametric", "contextual"):
        raise typer.BadParameter("direction must be parametric or contextual")
    if contexts.strip() and direction != "contextual":
        raise typer.BadParameter("--contexts runs after Table 2: use it with --direction contextual")
    grid = parse_grid(beta_minus_grid, "--beta-minus-grid")
    try:   # the settings check themselves (ReproduceConfig), for the CLI and the Python API alike
        cfg = ReproduceConfig(
            model=model, out_dir=out, validation_size=None if full else validation_size,
            limit=None if full else limit if limit is not None else "default",
            k=k, scoring=scoring, shortlist=shortlist, seed=seed, data=data, filter=filter_items,
            max_rows=max_rows if max_rows == "auto" else int(max_rows) if max_rows.isdigit() else max_rows,
            device=device, device_map=device_map, dtype=dtype, baselines=baselines,
            ph3_dev_size=200 if full else ph3_dev_size, ph3_knockout=ph3_knockout, data_root=data_root,
            validation_per_dataset=max(50, validation_per_dataset) if full else validation_per_dataset,
            **({"beta_minus_grid": grid} if grid else {}), degeneration_margin=degeneration_margin,
            contexts=tuple(c.strip().lower() for c in contexts.split(",") if c.strip()),
            study_size="published" if full else "default", engine=engine, vllm_args=tuple(vllm_arg),
            stage1_engine=stage1_engine, vllm_offline=vllm_offline,
        )
    except ValueError as err:
        raise typer.BadParameter(str(err)) from None
    start = time.perf_counter()
    with engine_for(cfg.engine_class, model, out / "vllm", vllm_arg, vllm_offline) as runner, progress() as task:
        if direction == "parametric":
            result = run_parametric(cfg, progress=task, engine=runner)
        else:
            result = reproduce_contextual(cfg, progress=task, max_prompt_tokens=None if full else max_prompt_tokens,
                                          engine=runner)
    _print_result(result, cfg, direction, out, time.perf_counter() - start)


def _print_result(result, cfg, direction: str, out: Path, seconds: float) -> None:
    """Print a reproduce run's tables, heads, choices, times and notes, and the files written."""
    from juice.apps.terminal import interval_rich
    from juice.eval.report import table1_columns, table2_columns
    from juice.pipeline.run import scoring_title
    from juice.pipeline.stages import titled_result

    result = titled_result(result)   # rows by title, as the files show them
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
    if getattr(result, "studies", None):
        from juice.experiments.table2 import study_line

        for dataset, headline in result.studies.items():
            console.print("when to steer " + study_line(dataset, headline).removeprefix("- "))
    console.print("time: " + ", ".join(f"{k} {v:.0f}s" for k, v in result.timings.items())
                  + f", total {seconds:.0f}s")
    for note in result.notes:
        console.print(f"[yellow]note:[/yellow] {note}")
    console.print("wrote " + ", ".join(str(out / f) for f in files))
