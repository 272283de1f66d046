"""`juice generate`: the Original, JuNE and JuICE continuations of one prompt."""

from __future__ import annotations

from pathlib import Path
from typing import Optional

import typer

from juice.apps.commands.common import console
from juice.models import DEFAULT_MODEL


def generate(
    prompt: str = typer.Argument(..., help="the prompt to continue"),
    heads: Optional[Path] = typer.Option(None, exists=True, dir_okay=False,
                                         help="a heads file from `juice identify` or `juice reproduce` (default: "
                                              "the heads juice ships for an embedded model, toward --direction)"),
    direction: str = typer.Option("parametric", help="without --heads: parametric (toward memory) | contextual "
                                                     "(toward the context)"),
    beta_plus: Optional[float] = typer.Option(None, help="default: the heads file's tuned betas for each method, "
                                              "else juice.steering.DEFAULT_BETAS (with a warning)"),
    beta_minus: Optional[float] = typer.Option(None),
    model: str = typer.Option(DEFAULT_MODEL),
    max_new_tokens: int = typer.Option(10),
):
    """Print the original, JuNE and JuICE continuations of a prompt.

    Examples:

        juice generate "The capital of France is Rome. The capital of France is"
        juice generate --heads heads.json --beta-plus 2 --beta-minus -1 \\
            "The capital of France is Rome. The capital of France is"
    """
    from juice.data.records import Direction
    from juice.engine import Stream
    from juice.engine import generate as run
    from juice.methods import REGISTRY, STEERINGS, MethodInputs, build
    from juice.models import load_model
    from juice.stage1 import load_heads
    from juice.stage1.shipped import describe, how_to_make, shipped_files

    try:
        wanted = Direction.parse(direction)
    except ValueError as err:
        raise typer.BadParameter(str(err), param_hint="--direction") from None
    if heads is not None:
        load_heads(heads)   # a malformed file fails before the model loads
    lm = load_model(model)
    if heads is None:   # the shipped file, found once by the model's fingerprint
        heads = shipped_files(lm).get(wanted)
        if heads is None:
            raise typer.BadParameter(how_to_make(lm.name, wanted), param_hint="--heads")
        console.print(describe(heads), highlight=False, markup=False)
    artifact = load_heads(heads, lm)
    inputs = MethodInputs(lm, artifact.selection, artifact.tuned, beta_plus, beta_minus)
    shown = ("original", *STEERINGS)
    streams = [Stream(0, build(name, inputs).method.steering) for name in shown]
    gen = run(lm, [prompt], streams, max_new_tokens)
    for name, text in zip(shown, gen.texts):
        console.print(f"[bold]{REGISTRY[name].title:>8}[/bold]: {prompt}[cyan]{text}[/cyan]")
