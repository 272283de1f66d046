"""The main job's stage times: `juice reproduce` with its defaults (the README's main command) on
the embedded Gemma 3 270M, the model already converted, in a fresh output folder (no stage read
from a saved state). Prints each stage's wall time, their sum against the 1,200 s target (issue
23: 20 minutes of stages on 2 CPU cores), and, with --reference, whether every table cell,
choice and item verdict equals an earlier run's results.json (juice.pipeline.compare).

Run: python benchmarks/bench_main_job.py [--out DIR] [--reference OLD/results.json]
Not a test: it takes about 20 minutes on 2 cores. Run it with nothing else on the machine.
"""

from __future__ import annotations

import argparse
import os
import tempfile
import time
from pathlib import Path

import torch

from juice.experiments.table1 import reproduce
from juice.models import load_model
from juice.pipeline.compare import compare_files
from juice.pipeline.run import ReproduceConfig

TARGET_S = 1200.0


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=None, help="output folder (default: a new temporary one)")
    parser.add_argument("--reference", type=Path, default=None, help="an earlier run's results.json")
    args = parser.parse_args()
    out = args.out or Path(tempfile.mkdtemp(prefix="juice-main-job-"))
    if (out / "state").exists():
        raise SystemExit(f"{out} holds a saved state: the stages would be read, not run; give a new folder")
    cfg = ReproduceConfig(out_dir=out)
    t = time.perf_counter()
    lm = load_model(cfg.model)   # converted once, on first use; not a stage
    load_s = time.perf_counter() - t
    result = reproduce(cfg, lm=lm)
    print(f"machine: {os.cpu_count()} CPU cores, torch {torch.__version__} ({torch.get_num_threads()} threads)")
    print(f"model load: {load_s:.0f} s (not counted)")
    stages = {k: v for k, v in result.timings.items() if k != "load_model"}
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


if __name__ == "__main__":
    main()
