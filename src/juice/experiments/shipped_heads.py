"""Make the shipped heads files (:mod:`juice.stage1.shipped`) from the main job's output folder.

    juice reproduce --model smollm2-135m --out runs/smollm2-135m
    juice reproduce --model smollm2-135m --direction contextual --out runs/smollm2-135m
    python -m juice.experiments.shipped_heads runs/smollm2-135m smollm2-135m

(`scripts/ship-heads.sh` runs these for both embedded models.) The parametric file is
`heads.json` with World Capital's tuned JuICE and JuNE betas (`results.json`, Table 1: the domain
of D); the contextual file is `heads_contextual.json` with NQ-Swap's (`results_contextual.json`,
Table 2; the betas :func:`juice.experiments.table2.table2_heads` gives the when-to-steer study).
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

from juice.data.contextual import STUDY_DATASET
from juice.data.records import Direction
from juice.io import write_json_atomic
from juice.methods import STEERINGS
from juice.stage1.shipped import shipped_path

TUNED_ON = {Direction.PARAMETRIC: ("heads.json", "results.json", "world_capital", ""),
            Direction.CONTEXTUAL: ("heads_contextual.json", "results_contextual.json", STUDY_DATASET,
                                   " --direction contextual")}
"""Per direction: the run's heads file, its results file, the split whose tuned betas ship, the
command's direction flag."""


def commit_of(root: Path) -> str:
    """The checkout's commit (short), with "+changes" when its tracked files differ from it."""
    try:
        head = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=root, capture_output=True, text=True,
                              check=True).stdout.strip()
        dirty = subprocess.run(["git", "status", "--porcelain", "--untracked-files=no"], cwd=root,
                               capture_output=True, text=True, check=True).stdout.strip()
    except (OSError, subprocess.CalledProcessError):
        return "unknown"
    return head + ("+changes" if dirty else "")


def shipped_heads_json(out: Path, model: str, direction: str | Direction, commit: str) -> dict[str, Any]:
    """The shipped heads file for `direction`, from a `juice reproduce` output folder `out`.

    Args:
        out: the folder both `juice reproduce` runs wrote (heads and results files).
        model: the embedded alias the runs used (checked against the results' config).
        commit: the code's commit, recorded in the provenance.

    Raises:
        FileNotFoundError: a heads or results file is missing.
        ValueError: the run was of another model or lacks the tuning split's betas.
    """
    direction = Direction.parse(direction)
    heads_name, results_name, split, flag = TUNED_ON[direction]
    heads = json.loads((out / heads_name).read_text(encoding="utf-8"))
    results = json.loads((out / results_name).read_text(encoding="utf-8"))
    if results["config"]["model"] != model:
        raise ValueError(f"{out / results_name} is a run of {results['config']['model']!r}, not {model!r}")
    choice = results["choices"].get(split)
    if not choice or not all(m in choice.get("betas", {}) for m in STEERINGS):
        raise ValueError(f"{out / results_name}: no tuned betas for {split}")
    keep = ("beta_plus", "beta_minus", "accuracy", "degeneration")
    grid = results["protocol"]["beta_grid"]   # the range a request's betas are compared with (juice.tuned)
    span = {key: [min(grid[key]), max(grid[key])] for key in ("beta_plus", "beta_minus")}
    tuned = {m: {**{k: choice["betas"][m][k] for k in keep}, "beta_range": span} for m in STEERINGS}
    first = heads["head_set"][0]
    head_domain = first.get("dataset") or first.get("domain")   # D's split (World Capital, MemoTrap's proverbs)
    provenance = {
        "command": f"juice reproduce --model {model}{flag}",
        "commit": commit,
        "tuned_on": {"split": split, "validation_items": choice["n_validation"],
                     "validation_ids": results["splits"][split]["validation_ids"],
                     "metric": "exact match (the protocol's)"},
        "head_set": {"from": results["protocol"]["heads_from"],
                     "ids": results["splits"][head_domain]["head_set_ids"]},
        "scoring": results["protocol"]["scoring_label"],
        "seed": results["config"]["seed"],
    }
    return {**heads, "tuned": {**tuned, "data": {"from": f"{results_name}: {split}'s tuned betas"}},
            "provenance": provenance}


def main(argv: list[str]) -> None:
    """`python -m juice.experiments.shipped_heads OUT MODEL`: write both directions' files into the package."""
    out, model = Path(argv[0]), argv[1]
    commit = commit_of(Path(__file__).resolve().parents[3])
    for direction in Direction:
        path = shipped_path(model, direction)
        write_json_atomic(path, shipped_heads_json(out, model, direction, commit))
        print(f"wrote {path}")


if __name__ == "__main__":
    main(sys.argv[1:])
