"""`juice identify`: Stage 1 only, a heads file from your examples or World Capital's D."""

from __future__ import annotations

from pathlib import Path
from typing import Optional

import typer

from juice.apps.commands.common import (ENGINE_HELP, VLLM_ARG_HELP, console, engine_for, load_for,
                                       progress)
from juice.models import DEFAULT_MODEL


def identify(
    model: str = typer.Option(DEFAULT_MODEL),
    out: Path = typer.Option(Path("heads.json"), help="where to write the heads file"),
    k: int = typer.Option(5),
    scoring: str = typer.Option("exact", "--scoring", help=(
        "Stage 1 scoring: exact (the paper's Alg. 2) | hybrid | attribution (approximations); as `juice reproduce "
        "--scoring`")),
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
    engine: str = typer.Option("juice", help=ENGINE_HELP),
    vllm_arg: list[str] = typer.Option([], help=VLLM_ARG_HELP),
):
    """Stage 1 only: identify the heads on your examples (--data FILE) or on World Capital's D
    (filtered for the model: only D's items need be known), and write a heads JSON file that
    records its data.

    Examples:

        juice identify --out heads.json
        juice identify --data my_conflicts.jsonl --direction contextual \\
            --out heads.json
    """
    from juice.data.paraconflict import DOMAINS
    from juice.io import StageFiles
    from juice.pipeline.domains import domain_sources
    from juice.pipeline.run import ReproduceConfig
    from juice.pipeline.stages import identify_on_domain
    from juice.stage1 import save_heads
    from juice.userdata import load_rows

    try:
        cfg = ReproduceConfig(model=model, k=k, scoring=scoring, shortlist=shortlist, head_set_size=head_set_size,
                              seed=seed, data=data, domains=(domain,), validation_size=0, baselines=False,
                              limit=0, device=device, engine=engine, vllm_args=tuple(vllm_arg))
    except ValueError as err:
        raise typer.BadParameter(str(err)) from None
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
        lm = load_for(cfg.engine_class, model, device)
        with engine_for(cfg.engine_class, model, out.parent / ".juice-vllm", vllm_arg) as runner, progress() as task:
            runner.check(lm)
            artifact = identify_rows(lm, data, direction=direction, k=k, scoring=scoring, shortlist=shortlist,
                                     progress=task, engine=runner)
        selection = artifact.selection
    else:
        domain_sources(cfg)   # bad data fails before the model loads
        lm = load_for(cfg.engine_class, model, device)
        with engine_for(cfg.engine_class, model, out.parent / ".juice-vllm", vllm_arg) as runner, progress() as task:
            runner.check(lm)
            artifact = identify_on_domain(lm, cfg, StageFiles(out.parent / ".juice-state"), task, engine=runner,
                                          command="identify")
        selection = artifact.selection
    save_heads(artifact, out)
    console.print(f"positive: {', '.join(map(str, selection.positive))}")
    console.print(f"negative: {', '.join(map(str, selection.negative))}")
    console.print(f"wrote {out}")
