"""What the `juice` commands share: the console, progress bars, option parsing, defaults."""

from __future__ import annotations

import math
from contextlib import contextmanager
from typing import Optional

import typer

from juice.apps.progress import make_console, progress_bars

console = make_console(width=200)

CONTEXT_LIMIT = 40
"""`juice evaluate --contexts`'s default items per source (about 15 minutes on 2 cores for NQ-Swap and
every method on the embedded model); `--full` evaluates every item."""

BETA_MINUS_GRID_HELP = ("tuning grid of beta-, comma-separated (default the paper's 0,-1,-2,-3; the authors' "
                        "contextual script: 0,-1,-2,-3,-4,-5)")


ENGINE_HELP = ("what runs the stages: juice (this process) | vllm (vLLM's OpenAI server with juice's plugin, "
               "started from vLLM's environment; docs/reproducing.md, \"On vLLM\")")
STAGE1_ENGINE_HELP = ("--engine vllm: juice runs exact Stage 1 on juice's own engine, whose growing batch runs "
                      "the layers below a scaled head once (results.json records where each stage ran)")
VLLM_OFFLINE_HELP = ("--engine vllm: no server; vLLM's offline LLM with juice's plugin in one process of vLLM's "
                     "Python, asked in one LLM.generate call per batch (docs/reproducing.md, \"On vLLM\")")
VLLM_ARG_HELP = ("--engine vllm: one more argument for vLLM's server (repeat), e.g. "
                 "--vllm-arg=--tensor-parallel-size=2, --vllm-arg=--data-parallel-size=2, "
                 "--vllm-arg=--distributed-executor-backend=ray")


def engine_kind(name: str):
    """The class of the engine `--engine` names (:func:`juice.engines.engine_class`): the one
    place a command reads the name; a usage error for an unknown one."""
    from juice.engines import engine_class

    try:
        return engine_class(name)
    except ValueError as err:
        raise typer.BadParameter(str(err), param_hint="--engine") from None


def load_for(kind, model: str, device: str):
    """juice's copy of the model for a command on engine `kind`: on its device
    (`kind.model_device`), deferred where the engine decodes elsewhere (loaded only by a step on
    juice's engine: `load_model(defer=True)`)."""
    from juice.models import load_model

    return load_model(model, device=kind.model_device(device), defer=not kind.in_process)


@contextmanager
def engine_for(kind, model: str, workdir, vllm_args, offline: bool = False):
    """The engine a command runs on (`kind.open`), closed (its vLLM server stopped) on exit; a
    usage error for a bad combination."""
    try:
        engine = kind.open(model, workdir, list(vllm_args),
                           log=lambda line: console.print(f"[dim]{line}[/dim]"), offline=offline)
    except ValueError as err:
        raise typer.BadParameter(str(err), param_hint="--engine") from None
    try:
        yield engine
    finally:
        close = getattr(engine, "close", None)
        if close is not None:
            close()


def progress():
    """Rich progress bars on the console (:func:`juice.apps.progress.progress_bars`)."""
    return progress_bars(console)


def parse_grid(text: Optional[str], option: str) -> Optional[tuple[float, ...]]:
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


__all__ = ["BETA_MINUS_GRID_HELP", "CONTEXT_LIMIT", "ENGINE_HELP", "STAGE1_ENGINE_HELP", "VLLM_ARG_HELP",
           "VLLM_OFFLINE_HELP", "console",
           "engine_for", "engine_kind", "load_for",
           "parse_grid", "progress"]
