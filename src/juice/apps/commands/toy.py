"""`juice toy`: the paper's Sec. 5 theory on a two-layer attention-only transformer."""

from __future__ import annotations

import time
from pathlib import Path

import typer

from juice.apps.commands.common import console


def toy(
    which: str = typer.Argument("all", help="all | construction | learning | conflict | juice"),
    out: Path = typer.Option(Path("juice-toy"), help="output directory (PNG figures, toy.json)"),
    seed: int = typer.Option(0),
):
    """The paper's Sec. 5 theory on a two-layer attention-only transformer.

    Examples:

        juice toy juice --out juice-toy
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
