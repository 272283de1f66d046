"""JuICE's dual run inside vLLM, before and after run 1 moved into run 2's matrix products (issue 93):
the committed record and its table, from two runs of `bench_vllm_modes.py`, with the cap each
design allows from the weights each layer reads and the work each row does.

    python benchmarks/bench_vllm_modes.py --configs stock-compiled plugin-compiled --batches 1 8 32 \\
        --repeats 3 --out AFTER.json            # at the new commit; BEFORE.json at the old one
    python benchmarks/vllm_dual_run.py --before BEFORE.json [BEFORE2.json] --before-commit SHA \\
        --after AFTER.json [AFTER2.json] --after-commit SHA --bench-command "COMMAND" ["COMMAND2"] \\
        --record benchmarks/results/vllm-dual-run-gemma-3-270m.json

Each side is run by each command once (the plugin runs from the side's commit); the engine
processes of one run vary by several percent from another's, so take two runs a side, the
configurations in opposite orders.

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
import statistics
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


def build(before: list[dict], after: list[dict], commits: dict, commands: list[str]) -> dict:
    """The record: each side's runs of the benchmark (tokens/s per batch and mix), and each ratio to
    stock vLLM compiled, measured within each run (stock and the plugin in the same run), then the
    median over a side's runs (with two, their mean), each run's ratio kept."""
    sides = {"before": [_rows(r) for r in before], "after": [_rows(r) for r in after]}
    ratios = []
    for batch in sorted(sides["after"][0], key=int):
        for mix in MIXES:
            entry = {"batch": int(batch), "mix": mix}
            for side, runs in sides.items():
                per_run = [(rows[batch][mix]["tok_s"], rows[batch]["stock"]["tok_s"]) for rows in runs
                           if mix in rows.get(batch, {}) and "stock" in rows.get(batch, {})]
                if per_run:
                    entry[f"{side}_runs"] = [round(t / s, 3) for t, s in per_run]
                    entry[side] = round(statistics.median(entry[f"{side}_runs"]), 3)
                    entry[f"{side}_ms_per_token"] = round(statistics.median(1000 * int(batch) / t
                                                                            for t, _ in per_run), 1)
            ratios.append(entry)
    return {"commands": commands, "commits": commits, "date": date.today().isoformat(), "model": after[0]["model"],
            "tokens": after[0]["tokens"], "cpu_count": after[0]["cpu_count"], "caps": caps(after[0]["model"]),
            "measured": sides, "ratios": ratios}


def _cell(ratio: dict, side: str) -> str:
    """'0.83x (70.2; runs 0.81, 0.85)': the side's median ratio, its time per output token (ms),
    and each run's ratio."""
    if side not in ratio:
        return ""
    runs = ", ".join(f"{v:.2f}" for v in ratio[f"{side}_runs"])
    return f"{ratio[side]:.2f}x ({ratio[f'{side}_ms_per_token']:.1f}; runs {runs})"


def markdown(record: dict) -> str:
    """The record's table: each mix against stock vLLM compiled, before and after, with the
    time per output token (ms, the step's wall time per request)."""
    from vllm_targets import verdict

    lines = ["| batch | requests | before: x stock (ms/token; each run) | after: x stock (ms/token; each run) "
             "| target (after) |",
             "|---|---|---|---|---|"]
    for r in record["ratios"]:
        if "after" not in r:
            continue
        cells = [_cell(r, side) for side in ("before", "after")]
        mark = verdict(f"{r['mix']} / stock", r["batch"], r["after"])
        lines.append(f"| {r['batch']} | {MIXES[r['mix']]} | {cells[0]} | {cells[1]} | {mark} |")
    after = record["measured"]["after"]
    stock = [f"{b}: " + " / ".join(f"{run[b]['stock']['tok_s']:.1f}" for run in after)
             for b in sorted(after[0], key=int)]
    lines.append("")
    lines.append(f"Stock vLLM compiled, tokens/s in the after runs (batch: tok/s per run): {', '.join(stock)}.")
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--before", type=Path, nargs="+", required=True, help="bench_vllm_modes.py reports")
    parser.add_argument("--before-commit", required=True)
    parser.add_argument("--after", type=Path, nargs="+", required=True, help="bench_vllm_modes.py reports")
    parser.add_argument("--after-commit", required=True)
    parser.add_argument("--bench-command", nargs="+", required=True,
                        help="the bench_vllm_modes.py commands, one per run (each side ran each once)")
    parser.add_argument("--record", type=Path, required=True)
    args = parser.parse_args()
    dirty = bool(subprocess.run(["git", "status", "--porcelain", "--untracked-files=no"], capture_output=True,
                                text=True, cwd=HERE.parent).stdout.strip())
    record = build([json.loads(f.read_text()) for f in args.before], [json.loads(f.read_text()) for f in args.after],
                   {"before": args.before_commit, "after": args.after_commit, "dirty_when_recorded": dirty},
                   args.bench_command)
    partial = args.record.with_name(f".{args.record.name}.{os.getpid()}.partial")
    partial.write_text(json.dumps(record, indent=1) + "\n", encoding="utf-8")
    os.replace(partial, args.record)
    print(markdown(record))
    print(json.dumps(record["caps"], indent=1))


if __name__ == "__main__":
    main()
