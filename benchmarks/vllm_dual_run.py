"""JuICE's dual run inside vLLM, before and after run 1 moved into run 2's matrix products (issue 93):
the committed record and its table, from two runs of `bench_vllm_modes.py`, with the cap each
design allows from the weights each layer reads and the work each row does.

    python benchmarks/bench_vllm_modes.py --configs stock-compiled plugin-compiled --batches 1 8 32 \\
        --repeats 3 --out AFTER.json            # at the new commit; BEFORE.json at the old one
    python benchmarks/vllm_dual_run.py --before BEFORE.json --before-commit SHA \\
        --after AFTER.json --after-commit SHA --record benchmarks/results/vllm-dual-run-gemma-3-270m.json

The caps (:func:`caps`) come from the served model's parameter counts and the heads the benchmark
serves (`bench_vllm.README_HEADS`), not from a measurement: every request JuICE, against the same
batch unsteered.

- run 1 separately (before): the dual-run layers (first to last layer the heads add to) run again
  for the JuICE rows, their weights read a second time: P / (P + P_dual) whether a step is bound by
  the bytes it reads or by its arithmetic, P being the parameters a step reads (the tied embedding
  read once, as the output layer);
- shadow rows (after): the weights are read once (1.0 when a step is bound by the bytes it reads,
  as at batch 1); each shadow row does a row's work in every layer but not in the output layer,
  P_row / (P_row + P_layers) when bound by arithmetic (P_row = P_layers + the output layer).
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
from datetime import date
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
MIXES = {"original": "no steering", "june": "JuNE", "juice": "JuICE, every request", "mixed": "JuICE, one in four"}


def caps(model: str = "gemma-3-270m") -> dict:
    """The dual run's caps (module docstring) for `model` serving `bench_vllm.README_HEADS`."""
    from bench_vllm import README_HEADS

    from juice.models import load_model

    lm = load_model(model, device="cpu")
    layers = lm.model.model.layers
    per_layer = [sum(p.numel() for p in layer.parameters()) for layer in layers]
    embedding = lm.model.get_input_embeddings().weight.numel()
    head = lm.model.get_output_embeddings().weight
    tied = head.data_ptr() == lm.model.get_input_embeddings().weight.data_ptr()
    output = head.numel()
    added = sorted({h.layer for h in (*README_HEADS.positive, *README_HEADS.negative)})
    dual = sum(per_layer[added[0]: added[-1] + 1])
    total = sum(per_layer) + output + (0 if tied else embedding)
    row = sum(per_layer) + output
    return {"params_per_step": total, "params_layers": sum(per_layer), "params_output_layer": output,
            "tied_embedding": tied, "dual_run_layers": [added[0], added[-1]], "params_dual_run": dual,
            "dual_share": round(dual / total, 3),
            "separate": round(total / (total + dual), 3),
            "shadow_bytes_bound": 1.0,
            "shadow_arithmetic_bound": round(row / (row + sum(per_layer)), 3)}


def _rows(modes: dict) -> dict:
    """{batch: {mix: {tok_s, runs}}} for stock (`stock`) and the plugin's mixes, from one
    bench_vllm_modes.py report."""
    out: dict = {}
    for name, key in (("stock-compiled", "stock"), ("plugin-compiled", None)):
        for row in modes["configs"][name]["rows"]:
            mix = key or row["mix"]
            if mix in ("stock", *MIXES):
                out.setdefault(str(row["batch"]), {})[mix] = {"tok_s": row["tok_per_s"], "runs": row["runs"]}
    return out


def build(before: dict, after: dict, commits: dict, command: str) -> dict:
    """The record: each side's tokens/s per batch and mix, and each ratio to stock vLLM compiled
    measured in the same run."""
    sides = {"before": _rows(before), "after": _rows(after)}
    ratios = []
    for batch in sorted(sides["after"], key=int):
        for mix in MIXES:
            entry = {"batch": int(batch), "mix": mix}
            for side, rows in sides.items():
                got = rows.get(batch, {})
                if mix in got and "stock" in got:
                    entry[side] = round(got[mix]["tok_s"] / got["stock"]["tok_s"], 3)
                    entry[f"{side}_ms_per_token"] = round(1000 * int(batch) / got[mix]["tok_s"], 1)
            ratios.append(entry)
    return {"command": command, "commits": commits, "date": date.today().isoformat(), "model": after["model"],
            "tokens": after["tokens"], "cpu_count": after["cpu_count"], "caps": caps(after["model"]),
            "measured": sides, "ratios": ratios}


def markdown(record: dict) -> str:
    """The record's table: each mix against stock vLLM compiled, before and after, with the
    time per output token (ms, the step's wall time per request)."""
    from vllm_targets import verdict

    lines = ["| batch | requests | before: x stock (ms/token) | after: x stock (ms/token) | target (after) |",
             "|---|---|---|---|---|"]
    for r in record["ratios"]:
        if "after" not in r:
            continue
        cells = [f"{r[s]:.2f}x ({r[f'{s}_ms_per_token']:.1f})" if s in r else "" for s in ("before", "after")]
        mark = verdict(f"{r['mix']} / stock", r["batch"], r["after"])
        lines.append(f"| {r['batch']} | {MIXES[r['mix']]} | {cells[0]} | {cells[1]} | {mark} |")
    stock = [f"{b}: {rows['stock']['tok_s']:.1f}" for b, rows in sorted(record["measured"]["after"].items(),
                                                                      key=lambda kv: int(kv[0]))]
    lines.append("")
    lines.append(f"Stock vLLM compiled, tokens/s in the after run (batch: tok/s): {', '.join(stock)}.")
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--before", type=Path, required=True)
    parser.add_argument("--before-commit", required=True)
    parser.add_argument("--after", type=Path, required=True)
    parser.add_argument("--after-commit", required=True)
    parser.add_argument("--bench-command", required=True, help="the bench_vllm_modes.py command both sides ran")
    parser.add_argument("--record", type=Path, required=True)
    args = parser.parse_args()
    dirty = bool(subprocess.run(["git", "status", "--porcelain", "--untracked-files=no"], capture_output=True,
                                text=True, cwd=HERE.parent).stdout.strip())
    record = build(json.loads(args.before.read_text()), json.loads(args.after.read_text()),
                   {"before": args.before_commit, "after": args.after_commit, "dirty_when_recorded": dirty},
                   args.bench_command)
    partial = args.record.with_name(f".{args.record.name}.{os.getpid()}.partial")
    partial.write_text(json.dumps(record, indent=1) + "\n", encoding="utf-8")
    os.replace(partial, args.record)
    print(markdown(record))
    print(json.dumps(record["caps"], indent=1))


if __name__ == "__main__":
    main()
