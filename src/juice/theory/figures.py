"""One matplotlib figure per result of `juice.theory.experiments`."""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402


def construction_figure(result: dict[str, Any], path: Path) -> None:
    fig, ax = plt.subplots(figsize=(4, 3))
    ax.bar(["factual recall", "induction"], [result["factual_recall_accuracy"], result["induction_accuracy"]],
           color=["tab:blue", "tab:orange"])
    ax.set_ylim(0, 1.05)
    ax.set_ylabel("accuracy")
    ax.set_title("Prop. 5.1: the constructed transformer")
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def learning_figure(result: dict[str, Any], path: Path) -> None:
    lin = result["linear_second_layer"]
    fig, axes = plt.subplots(1, 2, figsize=(9, 3.2))
    axes[0].plot(range(0, lin["steps"], 10)[: len(lin["losses"])], lin["losses"])
    axes[0].set_xlabel("gradient step")
    axes[0].set_ylabel("cross-entropy")
    axes[0].set_title("Prop. 5.2: GD from zero (2nd layer)")
    names, values = [], []
    for matrix in ("W_OV", "W_KQ"):
        for name, v in lin["projections"][matrix].items():
            if "max" in name:
                continue
            names.append(f"{matrix}: {name}")
            values.append(v)
    axes[1].barh(names, values, color=["tab:green" if "other" not in n else "tab:gray" for n in names])
    axes[1].set_xlabel("projection (mean u^T W v)")
    axes[1].tick_params(axis="y", labelsize=7)
    axes[1].set_title("learned terms vs the rest")
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def conflict_figure(result: dict[str, Any], path: Path) -> None:
    grid = result["grid"]
    n = len(grid)
    share = [[0.0] * n for _ in range(n)]
    for c in result["cells"]:
        share[grid.index(c["C2"])][grid.index(c["C1"])] = c["factual"]
    fig, ax = plt.subplots(figsize=(4.6, 3.8))
    im = ax.imshow(share, origin="lower", extent=(grid[0] - 0.5, grid[-1] + 0.5, grid[0] - 0.5, grid[-1] + 0.5),
                   cmap="coolwarm_r", vmin=0, vmax=1)
    shift = math.log(result["C3"] / result["C4"])
    ax.plot(grid, [c + shift for c in grid], "k--", label="exp(C1) C3 = exp(C2) C4")
    ax.set_xlim(grid[0] - 0.5, grid[-1] + 0.5)
    ax.set_ylim(grid[0] - 0.5, grid[-1] + 0.5)
    ax.set_xlabel("C1 (induction attention)")
    ax.set_ylabel("C2 (subject attention)")
    ax.set_title("Cor. 5.3: share of factual answers")
    ax.legend(loc="lower right", fontsize=7)
    fig.colorbar(im, ax=ax)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def juice_figure(result: dict[str, Any], path: Path) -> None:
    rows = result["conflict_only"]["factual_accuracy"]
    betas = list(rows)
    fig, ax = plt.subplots(figsize=(5, 3.2))
    width = 0.38
    xs = range(len(betas))
    ax.bar([x - width / 2 for x in xs], [rows[b]["one_run"] for b in betas], width, label="JuNE / PH3 (one run)")
    ax.bar([x + width / 2 for x in xs], [rows[b]["two_runs"] for b in betas], width, label="JuICE (two runs)")
    ax.axhline(result["original_factual"], color="k", ls=":", label="original")
    ax.set_xticks(list(xs), [f"beta={b}" for b in betas])
    ax.set_ylim(0, 1.05)
    ax.set_ylabel("factual answers on conflicts")
    ax.set_title("Prop. 5.4: heads " + ", ".join(result["conflict_only"]["negative_heads"]))
    ax.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
