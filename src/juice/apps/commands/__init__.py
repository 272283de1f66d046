"""The `juice` commands, one module per command group; :mod:`juice.apps.cli` registers them in
this order (the order `juice --help` lists them)."""

from juice.apps.commands.catalog import models, tasks
from juice.apps.commands.evaluate import evaluate
from juice.apps.commands.generate import generate
from juice.apps.commands.identify import identify
from juice.apps.commands.reproduce import reproduce
from juice.apps.commands.serve import run_batch, serve
from juice.apps.commands.sweep import sweep
from juice.apps.commands.toy import toy
from juice.apps.commands.tune import tune

COMMANDS = (reproduce, sweep, identify, tune, evaluate, generate, serve, run_batch, toy, tasks, models)
"""The commands, in `juice --help`'s order."""

__all__ = ["COMMANDS"]
