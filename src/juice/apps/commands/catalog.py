"""`juice tasks` (lm-evaluation-harness tasks) and `juice models` (what juice runs)."""

from __future__ import annotations

from pathlib import Path
from typing import Optional

import typer

from juice.apps.commands.common import console
from juice.models import DEFAULT_MODEL


def tasks(
    out: Path = typer.Option(Path("juice-tasks"), help="folder for the task YAMLs, their documents and utils.py"),
    data_root: Optional[Path] = typer.Option(None, exists=True, file_okay=False, help=(
        "folder with memotrap/*.csv and nqswap/nqswap.jsonl (default $JUICE_DATA); without it, only the built-in "
        "ParaConflict context tasks")),
    seed: int = typer.Option(0, help="pairing of the irrelevant passages"),
):
    """Write juice's evaluations as lm-evaluation-harness tasks: NQ-Swap and MemoTrap's four
    subtasks scored as the paper scores them, and the context-type evaluation (gold,
    conflicting, irrelevant, none), for `lm_eval --include_path OUT` with any model type.

    Examples:

        juice tasks --out juice-tasks --data-root data/
        lm_eval --include_path juice-tasks \\
            --tasks juice_nqswap,juice_memotrap --model hf \\
            --model_args pretrained=...
    """
    from juice.eval.harness_tasks import write_tasks

    names = write_tasks(out, data_root, seed=seed)
    console.print(f"wrote {len(names)} tasks to {out}: " + ", ".join(names))
    console.print(f"run them: lm_eval --include_path {out} --tasks "
                  + ",".join(sorted({n if n == "juice_nqswap" else n.rsplit("_", 2)[0] if "contexts" in n
                                     else "juice_memotrap" for n in names})) + " --model ...")


def models():
    """List the supported architectures and the embedded model aliases.

    Examples:

        juice models
    """
    from juice.architectures import adapter_for, supported_model_types
    from juice.models import EMBEDDED_MODELS

    console.print("[bold]embedded models[/bold] (from the package index, no hub download):")
    for alias, (description, _) in EMBEDDED_MODELS.items():
        width = max(len(a) for a in EMBEDDED_MODELS)
        console.print(f"  {alias:<{width}} {description}" + ("  (default)" if alias == DEFAULT_MODEL else ""))
    console.print("[bold]architectures[/bold] (config.model_type -> layers / output projection):")
    for t in supported_model_types():
        a = adapter_for(t)
        console.print(f"  {t:<12} {a.layers}[i].{a.output_projection} ({a.weight_layout})")
