"""`juice sweep`: the pipeline over models x directions as Ray tasks, one table over their domains
and methods (:mod:`juice.experiments.sweep`)."""

from __future__ import annotations

from pathlib import Path
from typing import Optional

import typer

from juice.apps.commands.common import console


def sweep(
    file: Path = typer.Argument(..., exists=True, dir_okay=False, help="the sweep file (TOML: [grid], [settings], "
                                                                        "[ray]; docs/reproducing.md, \"Sweeps\")"),
    out: Path = typer.Option(Path("juice-sweep"), help="the sweep's folder: jobs/<model>-<direction>/, sweep.json, "
                                                       "sweep.md"),
    address: Optional[str] = typer.Option(None, help="a Ray cluster's address (\"auto\": the one on this machine); "
                                                     "default: a local Ray for this run"),
):
    """Run `juice reproduce` for every model x direction of a sweep file as Ray tasks, resume the
    finished ones, and print one table (exact match with 95% intervals and n per domain and
    method). Exit status 1 if a job failed (the others are kept; run again to resume).

    Examples:

        juice sweep sweep.toml --out juice-sweep
        juice sweep sweep.toml --address auto
    """
    from juice.experiments.sweep import load_sweep, run_sweep, sweep_markdown

    spec = load_sweep(file)
    result = run_sweep(spec, out, address=address, log=lambda line: console.print(f"[dim]{line}[/dim]"))
    console.print(sweep_markdown(result.rows, spec.methods), markup=False)
    console.print(f"{len(result.ran)} jobs ran, {len(result.resumed)} read as finished, {len(result.failed)} failed, "
                  f"in {result.seconds:.0f} s; {out / 'sweep.md'}, {out / 'sweep.json'}")
    if result.failed:
        raise typer.Exit(1)


__all__ = ["sweep"]
