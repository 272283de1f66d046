"""TriState-Bench on one model (issue 90, item 3): every method's exact match per state
(correction, resistance, agreement), with n (distinct facts), 95% intervals, juice's first-words
rule and degeneration beside it, and the verdict (the best method per state, the methods within
its interval, each method against GRD).

:func:`juice.pipeline.tristate.run_benchmark` with the labels of the model's own GAPS screening
(`--screening`, the record of benchmarks/tristate_screening.py): the facts split by a seeded hash
of their id into a validation third and a test two thirds, `auto` tuned on the validation facts'
items, every method, auto included, scored on the test facts only (no method sees a test fact
before it is scored). Heads: the model's shipped heads files (both directions: JuNE and JuICE
"-mem" and "-ctx"), or `--heads`. Every stage is saved under `--out` as it ends: a killed run
resumes where it stopped. The record holds each method's per-fact exact match (a 0/1 string in
the state's fact order), so the intervals and the verdict can be recomputed from it.

Run:
    python benchmarks/tristate_measurement.py --model gemma-3-270m --data ../shared/data/tristate \
        --screening benchmarks/results/tristate-screening-gemma-3-270m.json --out tristate-measure \
        --record benchmarks/results/tristate-gemma-3-270m.json
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _common import git_state  # noqa: E402


def main() -> None:
    from juice.pipeline.tristate import DEFAULT_METHODS, VALIDATION_SHARE

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="gemma-3-270m")
    parser.add_argument("--data", type=Path, required=True, help="TriState-Bench's data/TriState/ folder")
    parser.add_argument("--screening", type=Path, required=True, help="the model's screening record")
    parser.add_argument("--heads", type=Path, action="append", default=[], help="heads files (default: shipped)")
    parser.add_argument("--methods", default=",".join(DEFAULT_METHODS))
    parser.add_argument("--no-auto", action="store_true", help="leave auto out (no validation tuning)")
    parser.add_argument("--validation-share", type=float, default=VALIDATION_SHARE)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--chunk", type=int, default=50)
    parser.add_argument("--limit", type=int, default=0, help="the first N facts of each state and half (a smoke run)")
    parser.add_argument("--out", type=Path, default=Path("tristate-measure"))
    parser.add_argument("--threads", type=int, default=0)
    parser.add_argument("--record", type=Path, default=None)
    args = parser.parse_args()
    source = git_state()

    import torch

    from juice.data.tristate import load_tristate
    from juice.io import write_json_atomic
    from juice.models import load_model
    from juice.pipeline.tristate import run_benchmark
    from juice.stage1 import load_heads
    from juice.stage1.shipped import shipped_heads

    if args.threads:
        torch.set_num_threads(args.threads)
    screening = json.loads(args.screening.read_text(encoding="utf-8"))
    lm = load_model(args.model, device="cpu")
    if screening["fingerprint"] != json.loads(json.dumps(lm.fingerprint(), default=str)):
        raise SystemExit(f"{args.screening} screened another model ({screening['model']})")
    artifacts = ([load_heads(p, lm) for p in args.heads] if args.heads
                 else [shipped_heads(lm, d) for d in ("parametric", "contextual")])
    heads = [{"direction": str(a.direction), "positive": a.to_json()["positive_heads"],
              "negative": a.to_json()["negative_heads"], "tuned": a.to_json()["tuned"]} for a in artifacts]
    started = time.perf_counter()
    result = run_benchmark(lm, load_tristate(args.data), artifacts, args.out,
                           names=[m.strip() for m in args.methods.split(",") if m.strip()], auto=not args.no_auto,
                           priors={fid: r["prior"] for fid, r in screening["labels"].items()},
                           share=args.validation_share, seed=args.seed, limit=args.limit or None, chunk=args.chunk)
    table = {s: {m: {k: v for k, v in row.items() if k not in ("em_by_fact", "facts")}
                 | {"em_by_fact": "".join(map(str, row["em_by_fact"]))} for m, row in rows.items()}
             for s, rows in result["table"].items()}
    record = {"command": "python " + " ".join(sys.argv), **source, "date": time.strftime("%Y-%m-%d"),
              "model": lm.name, "fingerprint": lm.fingerprint(), "screening": str(args.screening),
              "screening_counts": screening["counts"], "heads": heads,
              "split": {"validation_share": args.validation_share, "seed": args.seed},
              "seconds": round(time.perf_counter() - started),
              **{k: result[k] for k in ("states", "auto", "verdict", "facts")}, "table": table}
    print(json.dumps({"states": record["states"], "best": record["verdict"]["best"]}, indent=1), flush=True)
    if args.record:
        write_json_atomic(args.record, record)
        print(f"wrote {args.record}")


if __name__ == "__main__":
    main()
