"""`juice tune`: betas, PH3's k and auto's policy chosen on validation data, written into a heads file."""

from __future__ import annotations

from pathlib import Path
from typing import Optional

import typer

from juice.apps.commands.common import (BETA_MINUS_GRID_HELP, ENGINE_HELP, VLLM_ARG_HELP, console, engine_for,
                                       engine_kind, load_for, parse_grid, progress)
from juice.models import DEFAULT_MODEL


def tune(
    heads: Path = typer.Option(..., exists=True, dir_okay=False, help="the heads file to tune (rewritten in place)"),
    data: Path = typer.Option(..., exists=True, dir_okay=False, help=(
        "validation rows: JSONL/CSV (prompt, target, optional other, conflict_type, aliases, question), "
        "ParaConflict JSON, NQ-Swap JSONL or MemoTrap CSV")),
    methods: str = typer.Option("juice,june", help=(
        "comma-separated: juice, june, ph3 (PH3's k; needs rows with other), auto (the per-request policy, "
        "on the context types of --data: NQ-Swap JSONL or ParaConflict JSON; after juice's betas)")),
    limit: Optional[int] = typer.Option(None, min=1, help="use the first N rows only (auto: N items per source)"),
    split: Optional[str] = typer.Option(None, help=(
        "auto: tune on the questions of this half only, validation or test (by question, seeded: "
        "juice.data.context_types.split_of); default every question of --data")),
    model: str = typer.Option(DEFAULT_MODEL),
    device: str = typer.Option("auto", help="auto | cpu | cuda | cuda:N | mps"),
    beta_minus_grid: Optional[str] = typer.Option(None, help=BETA_MINUS_GRID_HELP),
    engine: str = typer.Option("juice", help=ENGINE_HELP + "; auto's policy is fitted on juice's engine"),
    vllm_arg: list[str] = typer.Option([], help=VLLM_ARG_HELP),
):
    """Choose (beta+, beta-) for JuICE and JuNE (and PH3's k) on validation rows, and write them
    into the heads file with the grid's accuracies: a tuned heads file alone is enough to steer
    (`juice.Steerer`) and to serve (`juice serve`).

    With auto (juice's per-request policy, docs/when-to-steer.md): the JuICE/JuNE betas are tuned
    first (if asked), then the policy on gold, conflicting, irrelevant and no-context items
    built from --data's validation rows.

    Examples:

        juice tune --heads heads.json --data validation.jsonl \\
            --methods juice,june,ph3
        juice tune --heads heads_contextual.json \\
            --data nqswap_validation.jsonl --methods juice,auto
    """
    from juice.methods import names as method_names
    from juice.stage1 import load_heads, save_heads
    from juice.userdata import load_rows
    from juice.workflow import check_tune_methods
    from juice.workflow import tune as tune_rows

    grid = parse_grid(beta_minus_grid, "--beta-minus-grid")
    artifact = load_heads(heads)          # malformed input fails before the model loads
    names = [m.strip().lower() for m in methods.split(",") if m.strip()]
    policies = [m for m in names if m in method_names(tuned="policy")]   # auto: fitted on context-type items
    if policies:
        from juice.when_to_steer.contexts import context_items

        try:
            items, where = context_items(data, limit=limit, split=split)
        except (ValueError, FileNotFoundError) as err:
            raise typer.BadParameter(str(err), param_hint="--split" if "--split" in str(err) else "--data") from None
    grid_names = [m for m in names if m not in policies]
    if grid_names or not names:
        load_rows(data, artifact.direction)
        check_tune_methods(grid_names)
    kind = engine_kind(engine)
    lm = load_for(kind, model, device)
    artifact = load_heads(heads, lm)
    chosen = {}
    with engine_for(kind, model, heads.parent / ".juice-vllm", vllm_arg) as runner, progress() as task:
        runner.check(lm)
        if grid_names:
            chosen = tune_rows(lm, artifact, data, methods=grid_names, limit=limit, progress=task, engine=runner,
                               **({"beta_minus_grid": grid} if grid else {}))
        if policies:
            from juice.when_to_steer.auto import candidate_betas
            from juice.when_to_steer.auto_tuning import tune_auto

            n, k = len(items.items), len(candidate_betas(artifact.tuned)) + 2   # + Original and AdaCAD
            advance = task(f"auto: {k} candidates x {n} items", k * n)
            fit = tune_auto(lm, artifact, items, where=where, on_progress=advance)
    save_heads(artifact, heads)
    if policies:
        console.print(f"auto: {fit.policy.describe()}; validation mean {fit.mean:.1f}% (use relevant context, {n} items; "
                      + ", ".join(f"{c} alone {v:.1f}%" for c, v in fit.static.items()) + ")")
    for name, setting in chosen.items():
        what = (f"k = {setting.k} ({', '.join(setting.pruned) or 'none'})" if setting.k is not None
                else f"beta+ {setting.beta_plus:g}, beta- {setting.beta_minus:g}")
        console.print(f"{name}: {what}, accuracy {setting.accuracy:.1f}% on {artifact.tuned.provenance['rows']} rows")
    console.print(f"wrote {heads}")
