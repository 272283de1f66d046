"""juice's copy of the model on `--engine vllm`: what `load_model(..., defer=True)` holds before a
stage needs the weights, against loading them (issue 75). Each load runs in a fresh process of
this Python; prints its wall time and its resident memory above the process's own before the
load, and the ratios, for the embedded Gemma 3 270M (already converted) at float32 on the CPU.

Run: python benchmarks/bench_deferred_load.py [--model MODEL] [--record FILE]
(--record: the compact record docs/reproducing.md quotes, with the command and the commit.)
"""

from __future__ import annotations

import argparse
import json
import shlex
import subprocess
import sys
import time
from pathlib import Path

from _common import git_state

CHILD = """
import json, os, sys, time
import psutil
from juice.models import load_model
process = psutil.Process(os.getpid())
before = process.memory_info().rss
start = time.perf_counter()
lm = load_model(sys.argv[1], device="cpu", defer=sys.argv[2] == "defer")
seconds = time.perf_counter() - start
print(json.dumps({"seconds": seconds, "mib": (process.memory_info().rss - before) / 2 ** 20,
                  "kind": type(lm).__name__, "loaded": lm.loaded}))
"""


def load(model: str, mode: str) -> dict:
    out = subprocess.run([sys.executable, "-c", CHILD, model, mode], capture_output=True, text=True, check=True)
    return json.loads(out.stdout.strip().splitlines()[-1])


def record_markdown(record: dict) -> str:
    """The sentence of docs/reproducing.md that quotes a record (a test keeps them equal)."""
    d, e = record["deferred"], record["loaded"]
    return (f"On {record['model']} ({record['device']}), juice's process holds {d['mib']:,.0f} MiB above its start "
            f"with the deferred copy against {e['mib']:,.0f} MiB with the weights loaded "
            f"({record['ratios']['mib']:.2f}x), ready in {d['seconds']:.1f} s against {e['seconds']:.1f} s "
            f"(`{record['command']}`, commit {record['commit'][:12]}); the weights then load in the stage "
            "that needs them.")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", default="gemma-3-270m")
    parser.add_argument("--record", type=Path, default=None, help="write the compact record here")
    args = parser.parse_args()
    source = git_state()
    load(args.model, "eager")   # the conversion cached and the files in the page cache for both
    found = {mode: load(args.model, mode) for mode in ("defer", "eager")}
    for mode, m in found.items():
        print(f"{mode:6s} {m['kind']:14s} weights loaded: {m['loaded']!s:5s} {m['seconds']:6.2f} s "
              f"{m['mib']:7.0f} MiB above the start")
    ratios = {"seconds": found["defer"]["seconds"] / found["eager"]["seconds"],
              "mib": found["defer"]["mib"] / found["eager"]["mib"]}
    print(f"deferred / loaded: time {ratios['seconds']:.2f}x, memory {ratios['mib']:.2f}x")
    if args.record is not None:
        record = {"command": shlex.join(["python", "benchmarks/bench_deferred_load.py", *sys.argv[1:]]), **source,
                  "date": time.strftime("%Y-%m-%d"), "model": args.model, "device": "cpu, float32",
                  "deferred": {k: round(v, 2) if isinstance(v, float) else v for k, v in found["defer"].items()},
                  "loaded": {k: round(v, 2) if isinstance(v, float) else v for k, v in found["eager"].items()},
                  "ratios": {k: round(v, 2) for k, v in ratios.items()}}
        args.record.write_text(json.dumps(record, indent=1) + "\n", encoding="utf-8")
        print(record_markdown(record))


if __name__ == "__main__":
    main()
