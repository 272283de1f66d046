"""The `juice` command line: parses, calls the library, prints."""

from __future__ import annotations

import time
from contextlib import contextmanager
from pathlib import Path
from typing import Optional

import typer
from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

from juice.models import DEFAULT_MODEL

app = typer.Typer(add_completion=False, help="Steer a language model toward its parametric memory or its context (JuICE).")
console = Console(width=200)


@contextmanager
def _progress():
    with Progress(TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn(),
                  console=console, transient=False) as bars:
        def task(description: str, total: int):
            tid = bars.add_task(description, total=total)
            return lambda n: bars.advance(tid, n)

        yield task


@app.command()
def reproduce(
    direction: str = typer.Option("parametric", help="parametric (Table 1) | contextual (Table 2)"),
    model: str = typer.Option(DEFAULT_MODEL, help="embedded alias, .gguf file, model directory or hub id"),
    out: Path = typer.Option(Path("juice-output"), help="output directory (JSON, Markdown table, heads file)"),
    limit: int = typer.Option(10, help="test items per domain / dataset"),
    validation_size: int = typer.Option(6, help="parametric: validation items for the beta grid"),
    validation_per_dataset: int = typer.Option(3, help="contextual: validation items per dataset"),
    k: int = typer.Option(5, help="heads per sign (K)"),
    scoring: str = typer.Option("hybrid", help="Stage 1 scoring: exact | attribution | hybrid"),
    shortlist: int = typer.Option(12, help="hybrid: heads per sign re-scored exactly"),
    ph3_dev_size: int = typer.Option(12, help="PH3-l development items (the paper: 200)"),
    baselines: bool = typer.Option(True, help="add the Prompt, PH3 (and CAD) rows"),
    max_prompt_tokens: int = typer.Option(256, help="contextual: drop longer prompts (NQ-Swap tables)"),
    full: bool = typer.Option(False, "--full", help="everything: all test items, all (parametric) or 50 per "
                                                   "dataset (contextual) validation items, exact Stage 1, "
                                                   "PH3-l on 200 items, no prompt-length cap"),
    data: Optional[Path] = typer.Option(None, help="parametric: a ParaConflict folder with the paper's JSON splits"),
    data_root: Optional[Path] = typer.Option(None, help="contextual: folder with memotrap/ and nqswap/ "
                                                        "(default $JUICE_DATA or ../shared/data)"),
    seed: int = typer.Option(0),
    max_rows: str = typer.Option("128", help='most rows per batched forward, or "auto" (a quarter of free memory)'),
    device_map: Optional[str] = typer.Option(None, help='e.g. "auto" to shard the model over GPUs (accelerate)'),
    dtype: str = typer.Option("float32", help="float32 | bfloat16 | float16"),
):
    """Run the paper's Table 1 (parametric) or Table 2 (contextual) pipeline and print the table."""
    from juice.report import contextual_rich, rich_table
    from juice.reproduce import ReproduceConfig
    from juice.reproduce import reproduce as run_parametric
    from juice.reproduce_contextual import reproduce_contextual

    if direction not in ("parametric", "contextual"):
        raise typer.BadParameter("direction must be parametric or contextual")
    cfg = ReproduceConfig(
        model=model, out_dir=out, limit=None if full else limit, validation_size=None if full else validation_size,
        k=k, scoring="exact" if full else scoring, shortlist=shortlist, seed=seed, data=data,
        max_rows=max_rows if max_rows == "auto" else int(max_rows),
        device_map=device_map, dtype=dtype, baselines=baselines, ph3_dev_size=200 if full else ph3_dev_size,
        data_root=data_root, validation_per_dataset=max(50, validation_per_dataset) if full else validation_per_dataset,
    )
    start = time.perf_counter()
    with _progress() as task:
        if direction == "parametric":
            result = run_parametric(cfg, progress=task)
        else:
            result = reproduce_contextual(cfg, progress=task, max_prompt_tokens=None if full else max_prompt_tokens)
    name = result.model["name"]
    if direction == "parametric":
        console.print(rich_table(result.table, list(result.methods), result.domains, result.titles,
                                 title=f"Table 1 layout: {name} (accuracy %, 1 clean, 2 substitution, 3 coherent)"))
        files = ("results.json", "table.md", "heads.json")
    else:
        console.print(contextual_rich(result.table, list(result.methods), result.domains, result.titles,
                                      title=f"Table 2 layout: {name} (accuracy %, contextual answer)"))
        console.print(contextual_rich(result.table, list(result.methods), result.domains, result.titles,
                                      title="MemoTrap, likelihood comparison (%)", likelihood=result.likelihood))
        files = ("results_contextual.json", "table2.md", "heads_contextual.json")
    console.print(f"heads +: {', '.join(map(str, result.selection.positive))}   "
                  f"heads -: {', '.join(map(str, result.selection.negative))}")
    console.print("betas: " + ", ".join(f"{m}: beta+={v['beta_plus']:g} beta-={v['beta_minus']:g}"
                                        for m, v in result.betas.items()))
    for m, info in result.baselines.items():
        if "k" in info:
            console.print(f"{m}: pruned k={info['k']} ({', '.join(info['pruned']) or 'none'}), "
                          f"development items {info['n_dev_items']}")
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
    scoring: str = typer.Option("exact", "--method", help="exact | attribution | hybrid"),
    shortlist: int = typer.Option(12),
    head_set_size: int = typer.Option(4),
    seed: int = typer.Option(0),
    data: Optional[Path] = typer.Option(None, help="a ParaConflict folder; its head_finding_set is D"),
):
    """Stage 1 only: identify the heads on World Capital's D and write a heads JSON file."""
    from juice.models import load_model
    from juice.reproduce import ReproduceConfig, StageFiles, identify_heads, prepare_splits
    from juice.scoring import make_artifact, save_heads

    cfg = ReproduceConfig(model=model, k=k, scoring=scoring, shortlist=shortlist, head_set_size=head_set_size,
                          seed=seed, data=data, domains=("world_capital",))
    lm = load_model(model)
    with _progress() as task:
        splits, _, _ = prepare_splits(lm, cfg, StageFiles(out.parent / ".juice-state"), "identify", task)
        head_set = next(iter(splits.values())).head_set
        scores, selection = identify_heads(lm, cfg, head_set, task)
    save_heads(make_artifact(lm, scores, selection, k, "parametric", head_set), out)
    console.print(f"positive: {', '.join(map(str, selection.positive))}")
    console.print(f"negative: {', '.join(map(str, selection.negative))}")
    console.print(f"wrote {out}")


@app.command()
def generate(
    prompt: str = typer.Argument(..., help="the prompt to continue"),
    heads: Path = typer.Option(..., help="a heads file from `juice identify` or `juice reproduce`"),
    beta_plus: float = typer.Option(2.0),
    beta_minus: float = typer.Option(-1.0),
    model: str = typer.Option(DEFAULT_MODEL),
    max_new_tokens: int = typer.Option(10),
):
    """Print the original, JuNE and JuICE continuations of a prompt."""
    from juice.models import load_model
    from juice.scoring import load_heads
    from juice.steering import Steering, Stream, generate as run, steering_coefficients

    lm = load_model(model)
    artifact = load_heads(heads, lm)
    coeff = steering_coefficients(lm.heads.geometry, artifact.selection, beta_plus, beta_minus)
    streams = [Stream(0), Stream(0, Steering("june", coeff)), Stream(0, Steering("juice", coeff))]
    gen = run(lm, [prompt], streams, max_new_tokens)
    for name, text in zip(("original", "JuNE", "JuICE"), gen.texts):
        console.print(f"[bold]{name:>8}[/bold]: {prompt}[cyan]{text}[/cyan]")


@app.command()
def toy(
    which: str = typer.Argument("all", help="all | construction | learning | conflict | juice"),
    out: Path = typer.Option(Path("juice-toy"), help="output directory (PNG figures, toy.json)"),
    seed: int = typer.Option(0),
):
    """The paper's Sec. 5 theory on a two-layer attention-only transformer."""

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
    from juice.scoring import write_json_atomic

    write_json_atomic(out / "toy.json", results)
    console.print(f"wrote {out / 'toy.json'} and {', '.join(f'{n}.png' for n in results)}")


@app.command()
def models():
    """List the supported architectures and the embedded model aliases."""
    from juice.architectures import adapter_for, supported_model_types
    from juice.models import EMBEDDED_MODELS

    console.print("[bold]embedded models[/bold] (no download):")
    for alias, (description, _) in EMBEDDED_MODELS.items():
        console.print(f"  {alias:<14} {description}" + ("  (default)" if alias == DEFAULT_MODEL else ""))
    console.print("[bold]architectures[/bold] (config.model_type -> layers / output projection):")
    for t in supported_model_types():
        a = adapter_for(t)
        console.print(f"  {t:<12} {a.layers}[i].{a.output_projection} ({a.weight_layout})")


if __name__ == "__main__":
    app()
