"""GAPS re-screening of TriState-Bench's facts for one model (issue 90, item 1): every fact that a
state can use (those with a passage in the published files) labelled by the model's own answers
(:func:`juice.pipeline.tristate.screen`), the label counts in the published `summary.json`'s shape,
and how many facts land in each state (:func:`juice.data.tristate.build_states`).

The facts with both passages (those every state can use: 696) are screened first, then those
with the right passage only (correction's other candidates), each group in the pool's order.
Facts are screened in chunks of `--chunk`, each chunk's rounds checkpointed under `--out`: a
killed run resumes at its next round, and the labels do not depend on the chunking (each
sample's seed is its fact's, paraphrase's and rank's). The record holds every fact's label and
votes (not the responses' texts), the counts and the provenance.

Run:
    python benchmarks/tristate_screening.py --model gemma-3-270m --data ../shared/data/tristate \
        --out tristate-gemma --record benchmarks/results/tristate-screening-gemma-3-270m.json
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _common import git_state  # noqa: E402


LABELS = {"P_right": "right", "P_wrong": "wrong", "P_uncertain": "uncertain"}
STATES = {"correction": "correction (passage right, prior wrong)", "resistance": "resistance (passage wrong, prior right)",
          "agreement": "agreement (passage right, prior right)"}


def screening_markdown(record: dict) -> str:
    """The record's label counts and state sizes as docs/tristate.md shows them (two tables)."""
    counts, total = record["counts"], record["counts"]["total"]
    lines = ["| the model's prior (GAPS label) | facts | share |", "|---|---|---|"]
    lines += [f"| {label} | {counts[key]} | {100 * counts[key] / total:.1f}% |" for key, label in LABELS.items()]
    lines += [f"| screened | {total} | 100% |", "", "| state | facts |", "|---|---|"]
    lines += [f"| {title} | {record['states'][state]} |" for state, title in STATES.items()]
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="gemma-3-270m")
    parser.add_argument("--data", type=Path, required=True, help="TriState-Bench's data/TriState/ folder")
    parser.add_argument("--out", type=Path, default=Path("tristate-screening"))
    parser.add_argument("--chunk", type=int, default=200, help="facts per checkpointed chunk")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--max-rows", default="64")
    parser.add_argument("--threads", type=int, default=0, help="torch threads (0: torch's default)")
    parser.add_argument("--limit", type=int, default=0, help="the first N facts only (696: those with both passages)")
    parser.add_argument("--record", type=Path, default=None)
    args = parser.parse_args()
    source = git_state()

    import torch

    from juice.data.tristate import build_states, load_tristate
    from juice.io import write_json_atomic
    from juice.models import load_model
    from juice.pipeline.tristate import screen, screening_counts

    if args.threads:
        torch.set_num_threads(args.threads)
    pool = [f for f in load_tristate(args.data) if f.right_passage is not None]
    # the facts every state can use (both passages) first: `--limit 696` screens exactly those
    facts = sorted(pool, key=lambda f: f.wrong_passage is None)[:args.limit or None]
    lm = load_model(args.model, device="cpu")
    max_rows = args.max_rows if args.max_rows == "auto" else int(args.max_rows)
    args.out.mkdir(parents=True, exist_ok=True)
    started = time.perf_counter()
    records: dict[str, dict] = {}
    for start in range(0, len(facts), args.chunk):
        chunk = facts[start:start + args.chunk]
        records.update(screen(lm, chunk, seed=args.seed, max_rows=max_rows,
                              checkpoint=args.out / f"chunk-{start // args.chunk:03d}.json"))
        print(f"[{time.perf_counter() - started:7.0f} s] {len(records)}/{len(facts)} facts screened", flush=True)
    states = build_states(facts, {fid: r["prior"] for fid, r in records.items()})
    record = {"command": "python " + " ".join(sys.argv), **source, "date": time.strftime("%Y-%m-%d"),
              "model": lm.name, "fingerprint": lm.fingerprint(), "seconds": round(time.perf_counter() - started),
              "settings": {"seed": args.seed, "temperature": 1.0, "top_p": 1.0, "max_new_tokens": 32, "samples": 9,
                           "prompt": "the benchmark's question-only prompt, raw text with BOS"},
              "facts_screened": len(facts), "counts": screening_counts(records, facts),
              "states": {s: len(items) for s, items in states.items()},
              "labels": {fid: {"prior": r["prior"], "verdicts": r["verdicts"], "votes": r["votes"]}
                         for fid, r in records.items()}}
    print({k: record[k] for k in ("counts", "states")}, flush=True)
    if args.record:
        write_json_atomic(args.record, record)
        print(f"wrote {args.record}")


if __name__ == "__main__":
    main()
