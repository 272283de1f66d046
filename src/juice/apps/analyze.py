"""`juice analyze ...`: the paper's mechanistic studies and robustness sweeps as typer commands.

Every study is a library function `juice.analysis.<module>.run_<module>(lm, options, progress,
**extra)`; `COMMANDS` lists them with their command name, help and the options of their own.
Each command takes the shared options (--model --out --quick --full --seed --device --max-rows),
loads the model, draws the progress bars, times the run and prints the files written.
`juice analyze all` runs them in this order on one loaded model and writes `<out>/report.md`
linking every table and figure.
"""

from __future__ import annotations

import importlib
import inspect
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Annotated, Any

import typer

from juice.analysis.common import DEFAULT_OUT, AnalysisOptions
from juice.progress import Progress
from juice.apps.help_format import MARKUP, HelpGroup, command_options
from juice.apps.progress import make_console, progress_bars
from juice.models import DEFAULT_MODEL, LoadedModel

ModelOption = Annotated[str, typer.Option(help="embedded alias, .gguf file, model directory or hub id")]
OutOption = Annotated[Path, typer.Option(help="output folder (JSON, Markdown, PNG; stage files in state/)")]
QuickOption = Annotated[bool, typer.Option("--quick", help="a small version for smoke tests (<= 3 min on 2 cores)")]
FullOption = Annotated[bool, typer.Option("--full", help="the paper's size: every item (slow on a CPU)")]
SeedOption = Annotated[int, typer.Option(help="data seed (World Capital split and order)")]
DeviceOption = Annotated[str, typer.Option(help="auto | cpu | cuda | cuda:N | mps")]
MaxRowsOption = Annotated[str, typer.Option(help='most rows per batched forward, or "auto"')]

TEST_ITEMS = ("test_items", int, 10, typer.Option(min=1, help="test items per domain (default mode)"))


def _split(value: str) -> str:
    if value not in ("known", "unfiltered"):
        raise typer.BadParameter("split must be known or unfiltered")
    return value


@dataclass(frozen=True)
class Command:
    """One `juice analyze` command.

    Attributes:
        module: the module under `juice.analysis` whose `run_<module>` it calls.
        name: the command's name.
        help: its help text (the figure or table it makes).
        extra: options of its own: (parameter name, type, default, typer.Option); their values
            reach `run_<module>` as keyword arguments.
        check: parameter name -> a function that returns the checked value or raises
            `typer.BadParameter`.
    """

    module: str
    name: str
    help: str
    extra: tuple[tuple[str, type, Any, Any], ...] = ()
    check: dict[str, Callable[[Any], Any]] = field(default_factory=dict)

    def runner(self) -> Callable[..., Any]:
        return getattr(importlib.import_module(f"juice.analysis.{self.module}"), f"run_{self.module}")


COMMANDS: tuple[Command, ...] = (
    Command("knockout", "knockout", "Fig. 3: knock out each layer, its attention and its MLP on filtered World Capital; "
            "mean change of the parametric answer's first-token probability per conflict type."),
    Command("superposition", "superposition", "The superposition table: top-4 heads by context gain under knock-out "
            "on substitution conflicts, and their effect on coherent conflicts."),
    Command("multiple", "interventions", "Table 3 and Fig. 6: the top-n individually helpful heads knocked out "
            "together, run once (JuNE-style) and run twice (JuICE-style), on held-out coherent conflicts."),
    Command("robustness", "robustness", "Fig. 5: JuICE and JuNE against |D|, K and (beta+, beta-) on World Capital "
            "(default: a reduced grid; --full: the paper's).",
            extra=(("split", str, "known", typer.Option(help="known (test items the model knows) | unfiltered")),),
            check={"split": _split}),
    Command("paraphrase", "paraphrase", "App. D paraphrase table: Original, JuNE and JuICE on paraphrased prompts, "
            "per domain and conflict type.", extra=(TEST_ITEMS,)),
    Command("norm", "norm", "Beyond the paper: JuICE and JuNE before vs after the attention output norm (Gemma 2/3), "
            "side by side.", extra=(TEST_ITEMS,)),
)
"""Every analysis, in the order `all` runs them."""


analyze_app = typer.Typer(add_completion=False, no_args_is_help=True, cls=HelpGroup, rich_markup_mode=MARKUP,
                          help="The paper's mechanistic studies (Fig. 3, the superposition table, Table 3 / Fig. 6) "
                               "and robustness sweeps; each writes JSON, a Markdown table and a PNG into --out."
                               "\n\nExamples:\n\n    juice analyze knockout --quick\n"
                               "    juice analyze all --out juice-analysis")


def cli_options(model: str, out: Path, quick: bool, full: bool, seed: int, device: str, max_rows: str) -> AnalysisOptions:
    """:class:`AnalysisOptions` from the shared command-line options; bad values raise
    `typer.BadParameter` (one line)."""
    try:
        return AnalysisOptions(model=model, out=out, quick=quick, full=full, seed=seed, device=device,
                               max_rows=max_rows)
    except ValueError as err:
        raise typer.BadParameter(str(err)) from None


def load_for(options: AnalysisOptions) -> LoadedModel:
    """Load `options.model` on `options.device`."""
    from juice.models import load_model

    return load_model(options.model, device=options.device)


Runner = Callable[[LoadedModel, AnalysisOptions, Progress], Any]


def run_cli(name: str, run: Runner, options: AnalysisOptions, lm: LoadedModel | None = None) -> Any:
    """Load the model (unless given), run one analysis with progress bars, print its title, wall
    time and files. Returns the analysis result."""
    console = make_console(width=200)
    lm = lm or load_for(options)
    start = time.perf_counter()
    with progress_bars(console) as task:
        result = run(lm, options, task)
    console.print(f"[bold]{result.title}[/bold] ({name}, {time.perf_counter() - start:.0f} s)")
    for path in result.files:
        if path.suffix == ".md":
            console.print(path.read_text(encoding="utf-8"))
    console.print("wrote " + ", ".join(map(str, result.files)))
    return result


_SHARED = (
    ("model", ModelOption, DEFAULT_MODEL), ("out", OutOption, DEFAULT_OUT), ("quick", QuickOption, False),
    ("full", FullOption, False), ("seed", SeedOption, 0), ("device", DeviceOption, "auto"),
    ("max_rows", MaxRowsOption, "auto"),
)


def register_command(app: typer.Typer, command: Command) -> None:
    """Add `juice analyze <command.name>`: the shared options, then the command's own, calling
    its `run_<module>(lm, options, progress, **own)` through :func:`run_cli`."""

    def body(**values: Any) -> None:
        own = {p: command.check.get(p, lambda v: v)(values.pop(p)) for p, *_ in command.extra}
        options = cli_options(**values)
        run = command.runner()
        run_cli(command.name, lambda lm, o, p: run(lm, o, p, **own), options)

    params = [inspect.Parameter(n, inspect.Parameter.KEYWORD_ONLY, default=d, annotation=t) for n, t, d in _SHARED]
    params += [inspect.Parameter(n, inspect.Parameter.KEYWORD_ONLY, default=d, annotation=Annotated[t, opt])
               for n, t, d, opt in command.extra]
    body.__signature__ = inspect.Signature(params)
    body.__annotations__ = {p.name: p.annotation for p in params}
    body.__name__ = command.name
    text = f"{command.help}\n\nExamples:\n\n    juice analyze {command.name} --quick\n    juice analyze {command.name}"
    body.__doc__ = text
    app.command(command.name, help=text, **command_options(text))(body)


for _command in COMMANDS:
    register_command(analyze_app, _command)


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


def run_all(model: ModelOption = DEFAULT_MODEL, out: OutOption = DEFAULT_OUT, quick: QuickOption = False,
            full: FullOption = False, seed: SeedOption = 0, device: DeviceOption = "auto",
            max_rows: MaxRowsOption = "auto") -> None:
    """Run every analysis in order on one loaded model (their own options at their defaults) and
    write `<out>/report.md`.

    Examples:

        juice analyze all --quick --out juice-analysis
        juice analyze all --model smollm2-135m
    """
    console = make_console(width=200)
    options = cli_options(model, out, quick, full, seed, device, max_rows)
    lm = load_for(options)
    results = []
    start = time.perf_counter()
    with progress_bars(console) as task:
        for command in COMMANDS:
            result = command.runner()(lm, options, task)
            results.append((command.module, command.name, result))
            console.print(f"[bold]{result.title}[/bold]: {result.wall_s:.0f} s, wrote "
                          + ", ".join(map(str, result.files)))
    path = Path(options.out) / "report.md"
    path.write_text(report_markdown(results, options, lm.name, time.perf_counter() - start), encoding="utf-8")
    console.print(f"wrote {path}")


analyze_app.command("all", **command_options(run_all.__doc__))(run_all)


__all__ = ["COMMANDS", "Command", "analyze_app", "cli_options", "load_for", "register_command",
           "report_markdown", "run_all", "run_cli"]
