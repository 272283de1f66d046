"""`juice analyze ...`: the paper's mechanistic studies and robustness sweeps as typer commands.

Every module in ANALYSES has `register(app)` (its command) and `run_<module>(lm, options,
progress)` (the library function); `juice analyze all` runs them in this order on one loaded model
and writes `<out>/report.md` linking every table and figure.
"""

from __future__ import annotations

import importlib
import time
from pathlib import Path
from typing import Any

import typer

from juice.analysis.common import (
    DEFAULT_OUT,
    DeviceOption,
    FullOption,
    MaxRowsOption,
    ModelOption,
    OutOption,
    QuickOption,
    SeedOption,
    cli_options,
    load_for,
    progress_bars,
)
from juice.models import DEFAULT_MODEL

ANALYSES: tuple[tuple[str, str], ...] = (
    ("knockout", "knockout"),               # Fig. 3
    ("superposition", "superposition"),     # the superposition table
    ("multiple", "interventions"),          # Table 3 and Fig. 6
    ("robustness", "robustness"),           # Fig. 5
    ("paraphrase", "paraphrase"),           # App. D paraphrase table
    ("norm", "norm"),                       # beyond the paper: steering after the attention output norm
)
"""(module under juice.analysis, command name), in the order `all` runs them."""

analyze_app = typer.Typer(add_completion=False, no_args_is_help=True,
                          help="The paper's mechanistic studies (Fig. 3, the superposition table, Table 3 / Fig. 6) "
                               "and robustness sweeps; each writes JSON, a Markdown table and a PNG into --out.")


def analysis_modules() -> list[tuple[str, Any]]:
    """(module name, imported module) for every module of ANALYSES, in order."""
    return [(name, importlib.import_module(f"juice.analysis.{name}")) for name, _ in ANALYSES]


_MODULES = analysis_modules()
for _name, _module in _MODULES:
    _module.register(analyze_app)


def report_markdown(results: list[tuple[str, str, Any]], options: Any, model_name: str, total_s: float) -> str:
    """`report.md`: one section per analysis with its wall time, its files linked and its figure shown."""
    lines = [f"# juice analyze all: {model_name}\n",
             f"Mode: {options.mode}; seed {options.seed}; total {total_s:.0f} s (model loading excluded).\n"]
    for name, command, result in results:
        lines.append(f"## {result.title}\n")
        lines.append(f"`juice analyze {command}` ({result.wall_s:.0f} s): "
                     + ", ".join(f"[{p.name}]({p.name})" for p in result.files) + "\n")
        lines += [f"![{p.stem}]({p.name})\n" for p in result.files if p.suffix == ".png"]
    return "\n".join(lines)


@analyze_app.command("all")
def run_all(model: ModelOption = DEFAULT_MODEL, out: OutOption = DEFAULT_OUT, quick: QuickOption = False,
            full: FullOption = False, seed: SeedOption = 0, device: DeviceOption = "auto",
            max_rows: MaxRowsOption = "auto") -> None:
    """Run every analysis in order on one loaded model and write <out>/report.md."""
    from rich.console import Console

    console = Console(width=200)
    options = cli_options(model, out, quick, full, seed, device, max_rows)
    lm = load_for(options)
    commands = dict(ANALYSES)
    results = []
    start = time.perf_counter()
    with progress_bars() as task:
        for name, module in _MODULES:
            result = getattr(module, f"run_{name}")(lm, options, task)
            results.append((name, commands[name], result))
            console.print(f"[bold]{result.title}[/bold]: {result.wall_s:.0f} s, wrote "
                          + ", ".join(map(str, result.files)))
    path = Path(options.out) / "report.md"
    path.write_text(report_markdown(results, options, lm.name, time.perf_counter() - start), encoding="utf-8")
    console.print(f"wrote {path}")


__all__ = ["ANALYSES", "analysis_modules", "analyze_app", "report_markdown", "run_all"]
