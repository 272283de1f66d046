"""The main job's stage times: `juice reproduce` with its defaults (the README's main command) on
the embedded Gemma 3 270M, the model already converted, in a fresh output folder (no stage read
from a saved state). Prints each stage's wall time, their sum against the 1,200 s target (20
minutes of stages on 2 CPU cores), and, with --reference, whether every table cell, choice and
item verdict equals an earlier run's results.json (juice.pipeline.compare).

With --engine vllm it runs the job twice in this one process, on juice's engine and on vLLM's
(`juice reproduce --engine vllm`, :class:`juice.vllm.engine.VllmEngine`; --vllm-arg passes on vLLM's
server arguments), and prints each stage's time on both side by side (vLLM's server starts, which
fall within its first stages, on their own line), the whole job's ratio against the goal (vLLM at
least 1.5x faster, under 600 s of stages), Stage 1's largest score difference (goal 1e-4), the
heads of both, and every table cell and item that differs, with both probabilities. With
--record FILE it writes that comparison as a compact JSON file (benchmarks/results/: the numbers
docs/reproducing.md quotes, with the command and commit).

Run: python benchmarks/bench_main_job.py [--out DIR] [--reference OLD/results.json]
     python benchmarks/bench_main_job.py --engine vllm [--vllm-arg=...] [--vllm-offline] [--out DIR] [--record FILE]
     python benchmarks/bench_main_job.py --engine vllm --from-runs DIR --record FILE   (no run: DIR's two)
Not a test: about 20 minutes per engine on 2 cores. Run it with nothing else on the machine.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time
from pathlib import Path

import torch

from _common import git_state
from juice.experiments.table1 import reproduce
from juice.models import load_model
from juice.pipeline.compare import ENGINE_RECORD, compare_files
from juice.pipeline.run import ReproduceConfig

TARGET_S = 1200.0
VLLM_GOAL = {"speed-up": 1.5, "stages_s": 600.0, "stage1_score_difference": 1e-4}
"""The vLLM engine's goals on this machine (docs/reproducing.md, "On vLLM")."""
P_TOLERANCE = 1e-4
"""A first-token probability may differ this much between the engines (their fp32 kernels round
differently); cells, choices, outputs and verdicts may not."""


def _run(out: Path, lm, engine: str, vllm_args: list[str], offline: bool = False) -> tuple[dict, list[float]]:
    cfg = ReproduceConfig(out_dir=out, engine=engine, vllm_args=tuple(vllm_args), vllm_offline=offline)
    if engine == "juice":
        result = reproduce(cfg, lm=lm)
        return {k: v for k, v in result.timings.items() if k != "load_model"}, []
    from juice.vllm.engine import VllmEngine

    with VllmEngine(cfg.model, out / "vllm", vllm_args, offline=offline) as runner:
        result = reproduce(cfg, lm=lm, engine=runner)
    return {k: v for k, v in result.timings.items() if k != "load_model"}, list(runner.starts)


def _scores(path: Path) -> dict[str, float]:
    scores = json.loads(path.read_text())["scores"]
    return {f"{sign} {head} {t}": v for sign in ("positive", "negative")
            for head, by_type in scores[sign].items() for t, v in by_type.items()}


def _items(path: Path) -> dict[tuple, dict]:
    return {(r["domain"], r["item"], r["conflict_type"], r["method"]): r
            for r in json.loads(path.read_text())["items"]}


def _average_cells(path: Path) -> dict[str, dict[str, float]]:
    cells = json.loads(path.read_text())["table"]["cells"]
    return {m: {t: round(100 * c["mean"], 1) for t, c in by_domain["Average"].items()} for m, by_domain in cells.items()}


def provenance(from_runs: Path | None = None, argv: list[str] | None = None) -> dict:
    """Where a record comes from, read when the command starts: the command as run, juice's commit
    and whether the tree had uncommitted changes, juice's, torch's and vLLM's versions, the device
    vLLM ran on, and the runs compared where `--from-runs` compared earlier runs without running."""
    import shlex

    import juice
    from juice.vllm.launch import find_vllm_python, vllm_platform

    python = find_vllm_python(required=False)
    platform = vllm_platform(python) if python else {"vllm": None, "device": None, "torch": None}
    args = sys.argv[1:] if argv is None else argv
    return {"command": shlex.join(["python", "benchmarks/bench_main_job.py", *args]),
            **git_state(),
            "juice": juice.__version__, "torch": torch.__version__, "vllm": platform["vllm"],
            "vllm_torch": platform["torch"], "vllm_device": platform["device"],
            "from_runs": None if from_runs is None else str(from_runs)}


def compare_engines(a: Path, b: Path, times: dict[str, dict], starts: list[float], vllm_args: list[str],
                    source: dict | None = None) -> dict:
    """The compact record of two engines' runs (module docstring); `source` is :func:`provenance`
    read when the command started (default: read now)."""
    ra, rb = json.loads((a / "results.json").read_text()), json.loads((b / "results.json").read_text())
    sa, sb = _scores(a / "heads.json"), _scores(b / "heads.json")
    ia, ib = _items(a / "results.json"), _items(b / "results.json")
    differing_items = [{"item": list(k), "juice": {f: ia[k][f] for f in ("output", "correct", "p_parametric")},
                        "vllm": {f: ib[k][f] for f in ("output", "correct", "p_parametric")}}
                       for k in ia if (ia[k]["output"], ia[k]["correct"]) != (ib[k]["output"], ib[k]["correct"])]
    cells = 0
    differing_cells = []
    for m, by_domain in ra["table"]["cells"].items():
        for d, by_type in by_domain.items():
            for t, c in by_type.items():
                cells += 1
                other = rb["table"]["cells"][m][d][t]
                if c["mean"] != other["mean"]:
                    differing_cells.append({"cell": [m, d, t], "juice": c["mean"], "vllm": other["mean"]})
    compared = compare_files(a / "results.json", b / "results.json", p_tolerance=P_TOLERANCE, skip=ENGINE_RECORD)
    total = {e: sum(t.values()) for e, t in times.items()}
    source = provenance() if source is None else source
    return {
        **source, "date": time.strftime("%Y-%m-%d"),
        "machine": f"{os.cpu_count()} CPU cores, torch {torch.__version__}",
        "model": ra["model"]["name"],
        "stages_s": {e: {k: round(v, 1) for k, v in t.items()} for e, t in times.items()},
        "total_s": {e: round(v, 1) for e, v in total.items()},
        "vllm_server_starts_s": [round(s, 1) for s in starts],
        "speed_up": round(total["juice"] / total["vllm"], 3),
        "goal": VLLM_GOAL,
        "stage1_max_score_difference": max(abs(sa[k] - sb[k]) for k in sa),
        "heads": {"juice": ra["heads"], "vllm": rb["heads"]},
        "same_heads": ra["heads"] == rb["heads"],
        "cells": cells, "differing_cells": differing_cells,
        "items": len(ia), "differing_items": differing_items,
        "max_p_difference": compared.max_p_difference,
        "other_differences": [d for d in compared.differences if "/items/" not in d and "/table/" not in d][:50],
        "table1_average": {"juice": _average_cells(a / "results.json"), "vllm": _average_cells(b / "results.json")},
        "protocol_engine": rb["protocol"]["engine"],
    }


STAGE_TITLES = {"data_and_filter": "data and filter (vLLM: its first start within)", "stage1_heads": "Stage 1",
                "ph3_heads": "PH3's heads (path patching: juice's engine in both)",
                "tuning": "tuning (vLLM: its second start within)", "evaluation": "evaluation"}


def engines_markdown(record: dict) -> str:
    """The record as docs/reproducing.md shows it ("On vLLM"; tests/unit/test_published_results.py
    keeps the page equal to benchmarks/results/main-job-engines.json)."""
    stages, total = record["stages_s"], record["total_s"]
    rows = ["| stage | juice's engine (s) | vLLM (s) |", "|---|---|---|"]
    rows += [f"| {STAGE_TITLES.get(k, k)} | {v:.0f} | {stages['vllm'][k]:.0f} |" for k, v in stages["juice"].items()]
    rows.append(f"| all stages | {total['juice']:.0f} | {total['vllm']:.0f} |")
    goal = record["goal"]
    met = record["speed_up"] >= goal["speed-up"] and total["vllm"] < goal["stages_s"]
    heads = record["heads"]["vllm"]
    engine = record.get("protocol_engine", {})
    offline = engine.get("transport") == "offline"
    asked = (f" It answered {engine['requests']:,} {'LLM.generate calls' if offline else 'HTTP requests'}."
             if "requests" in engine else "")
    made = (f"Run on vLLM {record['vllm']} (torch {record['vllm_torch']}, {record['vllm_device']}), juice "
            f"{record['juice']}, from a {'DIRTY' if record['dirty'] else 'clean'} tree"
            f"{'; compared from earlier runs' if record.get('from_runs') else ''}. ") if "dirty" in record else ""
    text = ["\n".join(rows), "",
            f"{made}vLLM's {'offline worker' if offline else 'server'} started in "
            f"{' s and '.join(f'{s:.0f}' for s in record['vllm_server_starts_s'])} s (within its stages).{asked} "
            f"juice's engine / vLLM: {record['speed_up']:.2f}x (the goal, vLLM at least "
            f"{goal['speed-up']:g}x faster and under {goal['stages_s']:.0f} s of stages: {'met' if met else 'missed'}). "
            f"Stage 1's largest score difference: {record['stage1_max_score_difference']:.1e} (goal "
            f"{goal['stage1_score_difference']:.0e}); the heads "
            f"{'the same, in the same order' if record['same_heads'] else 'DIFFER'}: + {', '.join(heads['positive'])}; "
            f"- {', '.join(heads['negative'])}. Table 1: {len(record['differing_cells'])} of {record['cells']} "
            f"cells and {len(record['differing_items'])} of {record['items']} item rows differ (output or verdict); "
            f"the largest first-token probability difference is {record['max_p_difference']:.1e}. Average over "
            "the six domains (exact match %), juice's engine / vLLM:", ""]
    average = record["table1_average"]
    types = list(next(iter(average["juice"].values())))
    table = ["| Method | " + " | ".join(types) + " |", "|---|" + "---|" * len(types)]
    table += [f"| {m} | " + " | ".join(f"{cells[t]:.1f} / {average['vllm'][m][t]:.1f}" for t in types) + " |"
              for m, cells in average["juice"].items()]
    return "\n".join(text + table) + "\n"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=None, help="output folder (default: a new temporary one)")
    parser.add_argument("--reference", type=Path, default=None, help="an earlier run's results.json")
    parser.add_argument("--engine", choices=("juice", "vllm"), default="juice",
                        help="vllm: run on both engines and compare them")
    parser.add_argument("--vllm-arg", action="append", default=[], help="one more argument for vLLM's server")
    parser.add_argument("--vllm-offline", action="store_true",
                        help="with --engine vllm: vLLM's offline LLM in a worker process, no server (juice.vllm.offline)")
    parser.add_argument("--record", type=Path, default=None, help="with --engine vllm: write the comparison here")
    parser.add_argument("--from-runs", type=Path, default=None,
                        help="with --engine vllm: compare the two runs an earlier --out DIR holds, without running")
    args = parser.parse_args()
    source = provenance(args.from_runs)   # read at the start: the commit the runs are of
    if args.from_runs is not None:
        runs = {e: json.loads((args.from_runs / e / "results.json").read_text()) for e in ("juice", "vllm")}
        times = {e: {k: v for k, v in r["timings_s"].items() if k != "load_model"} for e, r in runs.items()}
        record = compare_engines(args.from_runs / "juice", args.from_runs / "vllm", times,
                                 runs["vllm"]["protocol"]["engine"].get("server_starts_s", []),
                                 list(runs["vllm"]["config"]["vllm_args"]), source)
        print(engines_markdown(record))
        if args.record:
            args.record.write_text(json.dumps(record, indent=1) + "\n", encoding="utf-8")
            print(f"wrote {args.record}")
        return
    out = args.out or Path(tempfile.mkdtemp(prefix="juice-main-job-"))
    if (out / "state").exists() or (out / "juice" / "state").exists():
        raise SystemExit(f"{out} holds a saved state: the stages would be read, not run; give a new folder")
    t = time.perf_counter()
    lm = load_model(ReproduceConfig().model)   # converted once, on first use; not a stage
    load_s = time.perf_counter() - t
    print(f"machine: {os.cpu_count()} CPU cores, torch {torch.__version__} ({torch.get_num_threads()} threads)")
    print(f"model load: {load_s:.0f} s (not counted)")
    if args.engine == "juice":
        stages, _ = _run(out, lm, "juice", [])
        for name, seconds in stages.items():
            print(f"  {name:<16} {seconds:8.1f} s")
        total = sum(stages.values())
        print(f"stages: {total:.0f} s = {total / TARGET_S:.2f}x the {TARGET_S:.0f} s target "
              f"({'within' if total <= TARGET_S else 'over'})")
        print(f"results: {out / 'results.json'}")
        if args.reference:
            c = compare_files(args.reference, out / "results.json")
            print(f"against {args.reference}: {'every table cell, choice and verdict equal' if c.same else 'DIFFERENT'}"
                  f" ({c.compared} values; largest probability difference {c.max_p_difference:.1e}; "
                  f"{c.shortened_outputs} outputs end at their sixth word)")
            for line in c.differences[:20]:
                print(f"  {line}")
        return
    times, starts = {}, []
    for engine in ("juice", "vllm"):
        print(f"--- {engine} ---", flush=True)
        times[engine], mine = _run(out / engine, lm, engine, args.vllm_arg, args.vllm_offline and engine == "vllm")
        starts += mine
    record = compare_engines(out / "juice", out / "vllm", times, starts, args.vllm_arg, source)
    print(f"{'stage':<18}{'juice (s)':>10}{'vLLM (s)':>10}")
    for name in times["juice"]:
        print(f"{name:<18}{times['juice'][name]:10.1f}{times['vllm'].get(name, float('nan')):10.1f}")
    print(f"{'all stages':<18}{record['total_s']['juice']:10.1f}{record['total_s']['vllm']:10.1f}")
    print(f"vLLM server starts (within its stages): {', '.join(f'{s:.0f} s' for s in starts)}")
    print(f"juice / vLLM: {record['speed_up']:.2f}x (goal >= {VLLM_GOAL['speed-up']}x; vLLM's stages "
          f"{record['total_s']['vllm']:.0f} s, goal < {VLLM_GOAL['stages_s']:.0f} s)")
    print(f"Stage 1: largest score difference {record['stage1_max_score_difference']:.2e} (goal <= 1e-4); "
          f"heads {'the same, same order' if record['same_heads'] else 'DIFFERENT'}: {record['heads']['vllm']}")
    print(f"Table 1: {len(record['differing_cells'])} of {record['cells']} cells differ; "
          f"{len(record['differing_items'])} of {record['items']} items differ in output or verdict; "
          f"largest probability difference {record['max_p_difference']:.1e}")
    for d in record["differing_items"]:
        print(f"  {d['item']}: juice {d['juice']} | vLLM {d['vllm']}")
    for d in record["other_differences"]:
        print(f"  {d}")
    print(engines_markdown(record))
    if args.record:
        args.record.parent.mkdir(parents=True, exist_ok=True)
        args.record.write_text(json.dumps(record, indent=1) + "\n", encoding="utf-8")
        print(f"wrote {args.record}")
    print(f"runs: {out}", file=sys.stderr)


if __name__ == "__main__":
    main()
