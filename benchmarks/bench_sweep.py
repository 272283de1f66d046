"""`juice sweep` on the embedded Gemma 3 270M: one model, the parametric direction, two domains
(World Capital, Book Author) x two methods (Original, JuICE), the other settings `juice
reproduce`'s defaults (no baselines: the sweep names none), on a local Ray. Prints the job's time
and the table (exact match % with 95% intervals and n), then runs the same sweep again and prints
its time: the finished job is read, not run. With --record FILE it writes both as a compact JSON
file (benchmarks/results/sweep-embedded.json, which docs/reproducing.md quotes).

Run: python benchmarks/bench_sweep.py [--out DIR] [--record FILE]
Not a test: about 5 minutes on 2 cores. Run it with nothing else on the machine.
"""

from __future__ import annotations

import argparse
import json
import os
import shlex
import sys
import tempfile
import time
from pathlib import Path

from _common import git_state

SWEEP = """[grid]
models = ["gemma-3-270m"]
directions = ["parametric"]
domains = ["world_capital", "book_author"]
methods = ["Original", "JuICE"]
[ray]
cpus = 2
"""


def provenance(argv: list[str]) -> dict:
    """The command as run, the commit and whether the tree had uncommitted changes, read at start."""
    import torch

    import juice

    return {"command": shlex.join(["python", "benchmarks/bench_sweep.py", *argv]), **git_state(),
            "juice": juice.__version__,
            "torch": torch.__version__, "date": time.strftime("%Y-%m-%d"),
            "machine": f"{os.cpu_count()} CPU cores, torch {torch.__version__}"}


def sweep_record_markdown(record: dict) -> str:
    """The record as docs/reproducing.md quotes it ("Sweeps"; tests/unit/test_published_results.py)."""
    from juice.experiments.sweep import sweep_markdown

    return (sweep_markdown(record["rows"], record["methods"]) + "\n"
            f"The job ran in {record['job_s']:.0f} s ({record['first_s']:.0f} s with Ray's start); the same sweep "
            f"again took {record['again_s']:.0f} s and ran nothing ({record['again_resumed']} job read as finished).\n")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=None, help="the sweep's folder (default: a new temporary one)")
    parser.add_argument("--record", type=Path, default=None, help="write the compact record here")
    args = parser.parse_args()
    source = provenance(sys.argv[1:])
    from juice.experiments.sweep import load_sweep, run_sweep

    out = args.out or Path(tempfile.mkdtemp(prefix="juice-sweep-"))
    if (out / "jobs").exists():
        raise SystemExit(f"{out} holds jobs: they would be read, not run; give a new folder")
    out.mkdir(parents=True, exist_ok=True)
    (out / "sweep.toml").write_text(SWEEP, encoding="utf-8")
    sweep = load_sweep(out / "sweep.toml")
    started = time.perf_counter()
    first = run_sweep(sweep, out, log=print)
    first_s = time.perf_counter() - started
    started = time.perf_counter()
    again = run_sweep(sweep, out, log=print)
    again_s = time.perf_counter() - started
    job = json.loads((out / "sweep.json").read_text())["jobs"]["gemma-3-270m-parametric"]
    from juice.methods import row_title

    record = {**source, "sweep": SWEEP, "methods": [row_title(m) for m in sweep.methods], "rows": first.rows,
              "job_s": job["seconds"], "first_s": round(first_s, 1), "again_s": round(again_s, 1),
              "again_resumed": len(again.resumed), "again_ran": len(again.ran), "failed": first.failed,
              "heads": job["heads"]}
    print(sweep_record_markdown(record))
    if args.record:
        args.record.parent.mkdir(parents=True, exist_ok=True)
        args.record.write_text(json.dumps(record, indent=1) + "\n", encoding="utf-8")
        print(f"wrote {args.record}")


if __name__ == "__main__":
    main()
